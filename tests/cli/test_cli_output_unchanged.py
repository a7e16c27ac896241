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
    (re.compile(r"about .+? one after another"), "about T one after another"),  # s, min or h
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


@pytest.mark.slow
def test_quiet_silences_the_library_and_verbose_keeps_it(tmp_path: Path) -> None:
    golden = json.loads(GOLDEN.read_text())
    (tmp_path / "q").mkdir()
    (tmp_path / "v").mkdir()
    quiet = capture(tmp_path / "q", ("-q",))
    # the library's lines (prepare's stages, the training log) are gone; the command's own
    # output (prepare's summary, train's start lines and JSON summary) stays
    assert quiet["prepare"]["stderr"] == "" and golden["prepare"]["stderr"] != ""
    assert quiet["prepare"]["stdout"] == golden["prepare"]["stdout"]
    train = golden["train"]["stdout"]
    assert quiet["train"]["stdout"] == "".join(
        line for line in train.splitlines(keepends=True) if not line.startswith("iter ")
    )
    verbose = capture(tmp_path / "v", ("-v",))
    for name in ("prepare", "train", "resume", "info"):
        assert verbose[name] == golden[name], name


LIBRARY_RUN = """
import logging, sys
import attnlab
from attnlab.config import ModelConfig, TrainConfig
from attnlab.train.trainer import Trainer
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(name)s: %(message)s")
if sys.argv[2] == "silent":
    logging.getLogger("attnlab").setLevel(logging.WARNING)
model = ModelConfig(n_layer=1, n_head=2, n_embd=16, block_size=16)
train = TrainConfig(max_iters=2, eval_iters=1, batch_size=4, device="cpu", tensorboard=False,
                    log_interval=1)
trainer = Trainer(sys.argv[1] + "/" + sys.argv[2], model, train, sys.argv[1] + "/data")
trainer.run()
trainer.close()
"""


@pytest.mark.slow
def test_a_program_sets_the_level_of_a_training_run(tmp_path: Path) -> None:
    """`import logging, attnlab`: the training log is logging's, so the program that imports
    attnlab shows it at INFO and silences it with one setLevel."""
    import subprocess
    import sys

    from tests.conftest import ROOT

    (tmp_path / "corpus.txt").write_text("the quick brown fox jumps over the lazy dog.\n" * 300)
    assert run_cli("prepare", "--corpus", str(tmp_path / "corpus.txt"), "--out", str(tmp_path / "data")).returncode == 0  # fmt: skip
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    for mode in ("shown", "silent"):
        done = subprocess.run(
            [sys.executable, "-c", LIBRARY_RUN, str(tmp_path), mode],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        if mode == "shown":
            assert lines[0].startswith("attnlab.train.trainer: iter 0/2 | val_loss ")
            assert lines[-1].startswith("attnlab.train.trainer: iter 2/2 | train_loss ")
        else:
            assert done.stdout == "" and done.stderr == ""


def test_the_training_log_is_logging_records(
    tiny_data: Path, tmp_path: Path, caplog, capsys
) -> None:
    """In process: a trainer's rows are INFO records of attnlab.train.trainer, nothing is
    printed, and the attnlab logger's level silences them (and the bar)."""
    import logging

    from attnlab.train.trainer import Trainer
    from tests.conftest import tiny_model, tiny_train

    def train(name: str) -> None:
        trainer = Trainer(
            tmp_path / name, tiny_model(), tiny_train(max_iters=4, log_interval=2), tiny_data
        )
        trainer.run()
        trainer.close()

    with caplog.at_level(logging.INFO, logger="attnlab"):
        train("shown")
    rows = [r.getMessage() for r in caplog.records if r.name == "attnlab.train.trainer"]
    assert [row.split(" |")[0] for row in rows] == ["iter 0/4", "iter 2/4", "iter 4/4"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="attnlab"):
        train("silent")
    assert caplog.records == []
    assert capsys.readouterr() == ("", "")
