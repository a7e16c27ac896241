"""Nothing silent: a setting that would do nothing is refused, one that acts oddly is said,
and `info NAME` says when a folder NAME shadows the preset.

Each case asserts the exit status, the exact one-line message (no traceback) and that the
disk is as it was (the before/after listing of test_folder_safety.snapshot).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from test_bad_input import TINY, attnlab, error_line  # noqa: F401  (attnlab: a fixture)
from test_folder_safety import snapshot
from test_untrusted import model_dir  # noqa: F401  (a fixture)


@pytest.mark.parametrize(
    ("args", "expected"),
    [(["boost_gate=scalar"],
      "boost_gate='scalar' needs boost_rounds >= 2 (boost_rounds=1 has no correction to gate)"),
     (["boost_kv_source=input"],
      "boost_kv_source='input' needs boost_rounds >= 2 (boost_rounds=1 has no extra round to "
      "read K and V for)"),
     (["value_gate_init=zero"], "value_gate_init='zero' needs value_gate=True"),
     (["rope_theta=500000.0"],
      "rope_theta=500000.0 needs pos='rope' (pos='learned' rotates nothing)"),
     (["max_bad_steps=3"],
      "max_bad_steps=3 needs nan_policy='skip' (it counts skipped steps; nan_policy='stop' "
      "skips none)"),
     # a key given twice on one command line: the last one won without a word
     (["seed=3", "seed=4"], "seed is given twice (seed=3 and seed=4); keep one"),
     (["--eval-seed=3", "eval_seed=4"],
      "eval_seed is given twice (eval-seed=3 and eval_seed=4); keep one")],
)  # fmt: skip
def test_a_field_that_would_do_nothing_is_refused(
    attnlab,  # noqa: F811
    tiny_data: Path,
    tmp_path: Path,
    args,
    expected,
):
    before = snapshot(tmp_path)
    p = attnlab("train", "--data", str(tiny_data), "--out", str(tmp_path / "run"), *TINY, *args)
    assert error_line(p, "train") == expected
    assert snapshot(tmp_path) == before


def test_fields_that_act_together_are_accepted():
    from attnlab.config import ModelConfig, TrainConfig

    ModelConfig(boost_rounds=2, boost_gate="scalar", boost_kv_source="input")
    ModelConfig(value_gate=True, value_gate_init="zero")
    ModelConfig(pos="rope", rope_theta=5e5)
    TrainConfig(nan_policy="skip", max_bad_steps=3)


def test_preset_and_config_file_preset_must_agree(attnlab, tiny_data: Path, tmp_path: Path):  # noqa: F811
    config = tmp_path / "c.toml"
    config.write_text('preset = "tiny"\n')
    before = snapshot(tmp_path)
    p = attnlab("train", "--data", str(tiny_data), "--out", str(tmp_path / "run"), "--config",
                str(config), "--preset", "shakespeare-char", *TINY)  # fmt: skip
    assert error_line(p, "train") == (
        f"--preset shakespeare-char and config file {config}'s preset 'tiny' disagree; give one "
        "of them"
    )
    assert snapshot(tmp_path) == before


def test_the_same_preset_in_both_places_is_fine(tmp_path: Path):
    from attnlab.train.spec import resolve

    config = tmp_path / "c.toml"
    config.write_text('preset = "shakespeare-char"\n')
    assert resolve("shakespeare-char", config).preset == "shakespeare-char"


def test_a_warmup_longer_than_the_decay_is_said(attnlab, tiny_data: Path, tmp_path: Path):  # noqa: F811
    p = attnlab("train", "--data", str(tiny_data), "--out", str(tmp_path / "run"), *TINY,
                "warmup_iters=5")  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert p.stderr.splitlines()[0] == (
        "attnlab: warmup_iters=5 is not shorter than the decay (2 iterations): no cosine decay, "
        "and the learning rate never reaches learning_rate=0.001"
    )


def test_info_says_when_a_folder_shadows_a_preset(
    attnlab,  # noqa: F811
    model_dir: Path,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
):
    shutil.copytree(model_dir, tmp_path / "shakespeare-char")
    monkeypatch.chdir(tmp_path)
    p = attnlab("info", "shakespeare-char")
    assert p.returncode == 0
    assert p.stderr.splitlines() == [
        "attnlab info: shakespeare-char is a folder here and a preset; showing the folder (for "
        "the preset, run info where no folder has its name)"
    ]
