"""A study spec that would mean something else (a comparison listed twice, a variant named
like the wall-clock arm it generates) is refused in one line.

Each case asserts the exit status, the exact one-line message (no traceback) and that the
disk is as it was (the before/after listing of test_folder_safety.snapshot).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_bad_input import attnlab, error_line  # noqa: F401  (attnlab: a fixture)
from test_folder_safety import snapshot

STUDY = """
[variants.base]
preset = "shakespeare-char"
[variants.kv]
preset = "kv-bias-shakespeare-char"
[[comparisons]]
baseline = "base"
variant = "kv"
{more}
[scale.ci]
seeds = 1
"""


@pytest.mark.parametrize(
    ("more", "expected"),
    [('[[comparisons]]\nbaseline = "base"\nvariant = "kv"\n',
      "the comparison of 'kv' against baseline 'base' is listed twice (in either direction); "
      "keep one"),
     ('[[comparisons]]\nbaseline = "kv"\nvariant = "base"\n',  # the same test, reversed
      "the comparison of 'base' against baseline 'kv' is listed twice (in either direction); "
      "keep one"),
     ('wallclock = true\n[variants.base-wallclock]\npreset = "shakespeare-char"\n',
      "variant 'base-wallclock' has the name of the wall-clock arm generated for 'kv' against "
      "'base'; rename the variant")],
)  # fmt: skip
def test_a_study_spec_that_would_mean_something_else_is_refused(
    attnlab,  # noqa: F811
    tmp_path: Path,
    more: str,
    expected: str,
):
    spec = tmp_path / "spec.toml"
    spec.write_text(STUDY.format(more=more))
    before = snapshot(tmp_path)
    p = attnlab("study", str(spec), "--preset", "ci", "--out", str(tmp_path / "out"))
    assert error_line(p, "study") == f"{spec}: {expected}"
    assert snapshot(tmp_path) == before
