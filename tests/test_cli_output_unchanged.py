"""The CLI's output is what it was before the library reported through `logging`.

tests/fixtures/cli_output.json holds what a few commands printed (stdout and stderr) when the
library still printed itself; timings, paths and throughputs are masked, everything else (the
lines, their order, the stream they go to, the losses) must match exactly. ``-q`` silences what
the library reports and ``-v`` keeps it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, run_cli

GOLDEN = FIXTURES / "cli_output.json"
TINY = ["n_layer=1", "n_head=2", "n_embd=16", "block_size=16", "batch_size=4", "eval_iters=1",
        "eval_interval=4", "log_interval=2", "warmup_iters=1", "device=cpu", "tensorboard=false"]  # fmt: skip
# what changes from one run or machine to the next
_VARYING = [
    (re.compile(r"(tokens_per_s|tok/s) [0-9.]+"), r"\1 N"),
    (re.compile(r"[0-9.]+ ?(s|ms|min|h|MB|GB|tokens/s|it/s)\b"), r"N \1"),
    (
        re.compile(r'"(train_seconds|sec_per_step|tokens_per_s|peak_memory_mb)": [0-9.e+-]+'),
        r'"\1": N',
    ),
    (re.compile(r"\d+ threads"), "N threads"),
]


def normalise(text: str, tmp: Path) -> str:
    text = text.replace(str(tmp), "TMP")
    for pattern, repl in _VARYING:
        text = pattern.sub(repl, text)
    return text


def commands(tmp: Path) -> dict[str, list[str]]:
    """name -> argv, run in order (train needs prepare's data, the resume its run)."""
    corpus = tmp / "corpus.txt"
    return {
        "prepare": ["prepare", "--corpus", str(corpus), "--out", str(tmp / "data")],
        "train": ["train", "--data", str(tmp / "data"), "--out", str(tmp / "run"), "max_iters=4", *TINY],
        "resume": ["train", "--resume", str(tmp / "run"), "max_iters=6"],
        "info": ["info", "shakespeare-char"],
        "plan": ["study", "kv-bias-4l", "--out", str(tmp / "study"), "--plan", "--seeds", "1"],
    }  # fmt: skip


def capture(tmp: Path, prefix: tuple[str, ...] = (), **env: str) -> dict[str, dict[str, str]]:
    """Each command's normalised stdout, stderr and exit code."""
    text = "".join(f"{w} the quick brown fox jumps over the lazy dog.\n" for w in range(400))
    (tmp / "corpus.txt").write_text(text)
    out = {}
    for name, argv in commands(tmp).items():
        if name == "plan" and prefix:
            continue  # times steps: slow, and it reports nothing through the library
        done = run_cli(*prefix, *argv, env={"COLUMNS": "100", **env})
        out[name] = {
            "rc": str(done.returncode),
            "stdout": normalise(done.stdout, tmp),
            "stderr": normalise(done.stderr, tmp),
        }
    return out


@pytest.mark.slow
def test_the_cli_prints_what_it_printed_before_logging(tmp_path: Path) -> None:
    golden = json.loads(GOLDEN.read_text())
    got = capture(tmp_path)
    for name, want in golden.items():
        assert got[name] == want, name


def test_quiet_silences_the_library_and_verbose_keeps_it(tmp_path: Path) -> None:
    golden = json.loads(GOLDEN.read_text())
    quiet = capture(tmp_path / "q" if (tmp_path / "q").mkdir() is None else tmp_path, ("-q",))
    # the library's lines (prepare's stages, the training log) are gone; the command's own
    # result (train's JSON summary) stays
    assert quiet["prepare"]["stderr"] == "" and golden["prepare"]["stderr"] != ""
    assert "iter 4/4" not in quiet["train"]["stdout"] and "iter 4/4" in golden["train"]["stdout"]
    assert '"iters": 4' in quiet["train"]["stdout"]
    verbose = capture(tmp_path / "v" if (tmp_path / "v").mkdir() is None else tmp_path, ("-v",))
    for name in ("prepare", "train", "resume", "info"):
        want = golden[name]
        assert verbose[name]["rc"] == want["rc"]
        assert verbose[name]["stdout"] == want["stdout"].replace(str(tmp_path), "TMP"), name
