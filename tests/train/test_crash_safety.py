"""Crash safety: SIGKILLed runs resume bit-identically; failed checkpoint writes lose nothing.

Kills inside a checkpoint write are made deterministic by the test hook
``ATTNLAB_TEST_KILL_DURING_SAVE="STAGE:N"`` (attnlab/train/checkpoint.py).
"""

from __future__ import annotations

import csv
import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import ROOT, interrupt_cli, run_cli, tiny_model, tiny_train
from safetensors.torch import load_file
from test_folder_safety import snapshot

from attnlab.errors import AttnlabError
from attnlab.train import checkpoint as ckpt

# block 32, 2 layers, width 32, dropout on so that the saved RNG state matters
RUN_ARGS = [
    "block_size=32", "n_layer=2", "n_head=4", "n_embd=32", "bias=false", "dropout=0.1",
    "max_iters=24", "batch_size=8", "eval_interval=8", "eval_iters=2", "log_interval=4",
    "ckpt_interval=3", "warmup_iters=2", "learning_rate=3e-3", "min_lr=3e-4",
    "device=cpu", "tensorboard=false",
]  # fmt: skip
# one thread everywhere: identical kernels in every process, and no oversubscription under -n 2
ENV = {"OMP_NUM_THREADS": "1"}


def train_cmd(data: Path, out: Path) -> list[str]:
    return ["train", "--data", str(data), "--out", str(out), *RUN_ARGS]


def saved_iter(folder: Path) -> int:
    return ckpt.read_trainer_state(folder)["state"]["iter"]


def metrics(run: Path) -> list[dict[str, str]]:
    with (run / "metrics.csv").open() as f:
        return list(csv.DictReader(f))


def untimed(row: dict[str, str]) -> dict[str, str]:
    """A metrics.csv row without the columns that measure time."""
    return {k: v for k, v in row.items() if k not in ("tokens_per_s", "step_ms", "elapsed_s")}


def leftovers(run: Path) -> list[str]:
    return sorted(p.name for p in run.iterdir() if ".tmp-" in p.name or p.name.endswith(ckpt.ASIDE))


def kill_when_logged(run: Path, it: int) -> int:
    """Resume ``run`` and SIGKILL it from outside once metrics.csv reaches iteration ``it``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), **ENV}
    proc = subprocess.Popen(
        [sys.executable, "-m", "attnlab", "train", "--resume", str(run)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        while proc.poll() is None:
            if any(int(r["iter"]) >= it for r in metrics(run)):
                proc.send_signal(signal.SIGKILL)
                break
            time.sleep(0.02)
        return proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_sigkill_at_several_points_then_resume_is_bit_identical(tiny_data: Path, tmp_path: Path):
    ref_dir, run = tmp_path / "ref", tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT), **ENV}
    # the uninterrupted reference runs alongside the interrupted chain
    reference = subprocess.Popen(
        [sys.executable, "-m", "attnlab", *train_cmd(tiny_data, ref_dir)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )

    # 1. killed while the 2nd checkpoint (latest at iter 6) is half written
    p = run_cli(*train_cmd(tiny_data, run), env={**ENV, ckpt.KILL_HOOK: "write:2"})
    assert p.returncode == -signal.SIGKILL
    assert saved_iter(run / "latest") == 3
    assert any(name.startswith(".latest.tmp-") for name in leftovers(run))

    # 2. resumed, then killed between the two renames of its 3rd save (latest at iter 9;
    #    its saves are latest@6, best@8, latest@9): only the aside copy of latest@6 exists
    p = run_cli("train", "--resume", str(run), env={**ENV, ckpt.KILL_HOOK: "swap:3"})
    assert p.returncode == -signal.SIGKILL
    assert not (run / "latest").exists()
    assert ckpt.checkpoint_dir(run / "latest") == run / f"latest{ckpt.ASIDE}"
    assert saved_iter(run / f"latest{ckpt.ASIDE}") == 6

    # 3. resumed from the aside copy, killed from outside at an arbitrary moment
    assert kill_when_logged(run, 16) in (-signal.SIGKILL, 0)

    # 4. resumed to the end
    p = run_cli("train", "--resume", str(run), env=ENV)
    assert p.returncode == 0, p.stderr
    assert reference.wait(timeout=300) == 0, reference.stderr.read()

    assert saved_iter(run / "latest") == 24
    assert leftovers(run) == []
    for name in ("latest", "best"):
        got, want = load_file(run / name / ckpt.WEIGHTS), load_file(ref_dir / name / ckpt.WEIGHTS)
        assert got.keys() == want.keys()
        for key in want:
            assert torch.equal(got[key], want[key]), f"{name}/{key} differs"
    # metrics.csv: rows after each resume point were dropped and logged again, once; every
    # column but the timings is identical (train_loss averages over windows that span resumes)
    got_rows, want_rows = metrics(run), metrics(ref_dir)
    assert list(got_rows[0]) == list(want_rows[0])
    assert [untimed(r) for r in got_rows] == [untimed(r) for r in want_rows]


def test_checkpoints_and_resumes_leave_the_logged_train_loss_alone(
    train_tiny, tiny_data: Path, tmp_path: Path
):
    """A checkpoint (every ckpt_interval, or the one an interrupt adds) cuts the loss window
    mid-row: the row's loss is the same float32 sum wherever the cuts fall."""
    from attnlab.train.trainer import Trainer

    recipe = {"max_iters": 20, "log_interval": 4}
    for name, interval in (("every-5", 5), ("every-3", 3)):
        train_tiny(tmp_path / name, ckpt_interval=interval, **recipe)
    cut = Trainer(
        tmp_path / "cut", tiny_model(), tiny_train(ckpt_interval=3, **recipe), tiny_data, quiet=True
    )
    update = cut._update

    def ctrl_c_at_iter_7() -> None:  # as the signal handler does, mid-row
        update()
        cut.stop_requested = signal.SIGINT if cut.state.iter == 6 else 0

    cut._update = ctrl_c_at_iter_7
    with pytest.raises(KeyboardInterrupt):
        cut.run()
    assert saved_iter(tmp_path / "cut" / "latest") == 7
    Trainer.resume(tmp_path / "cut", quiet=True).run()
    want = [untimed(r) for r in metrics(tmp_path / "every-5")]
    assert sum(bool(r["train_loss"]) for r in want) == 5  # iters 4, 8, 12, 16, 20
    for name in ("every-3", "cut"):
        assert [untimed(r) for r in metrics(tmp_path / name)] == want, name


def test_resume_before_the_first_checkpoint_says_so(tiny_data: Path, tmp_path: Path):
    from conftest import tiny_model, tiny_train

    from attnlab.train.trainer import Trainer

    run = tmp_path / "run"
    Trainer(run, tiny_model(), tiny_train(), tiny_data, quiet=True)  # killed before any save
    with pytest.raises(AttnlabError) as err:
        Trainer.resume(run)
    assert str(err.value) == f"cannot resume {run}: no complete checkpoint in latest/"


def _enospc(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _eacces(*args, **kwargs):
    raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))


def _tokenizers_enospc(*args, **kwargs):
    raise Exception("No space left on device (os error 28)")  # the tokenizers library's words


def _interrupt(*args, **kwargs):
    raise KeyboardInterrupt


def _interrupt_mid_swap(stage: str, save_number: int) -> None:
    if stage == "swap":  # latest/ has been renamed aside, the new one not yet into place
        raise KeyboardInterrupt


NO_SPACE = "no space left on device while writing {latest}; nothing was lost"
NOT_WRITTEN = "could not write checkpoint {latest} ({reason}); the previous checkpoint is intact"


@pytest.mark.parametrize(
    ("target", "fault", "expected"),
    [
        ("attnlab.train.checkpoint.write_bytes", _enospc, NO_SPACE),  # weights or trainer state
        ("pathlib.Path.write_text", _enospc, NO_SPACE),  # config.json
        ("attnlab.data.tokenizer.Tokenizer.save", _tokenizers_enospc, NO_SPACE),  # a traceback
        ("pathlib.Path.mkdir", _eacces, NOT_WRITTEN.replace("{reason}", "Permission denied")),
        ("attnlab.train.checkpoint.fsync_tree", _interrupt, None),  # Ctrl-C while writing
        ("attnlab.train.checkpoint._kill_hook", _interrupt_mid_swap, None),  # Ctrl-C mid-swap
    ],
)
def test_failed_checkpoint_write_keeps_the_previous_one(
    train_tiny, tmp_path, monkeypatch, target, fault, expected
):
    run = tmp_path / "run"
    trainer, _ = train_tiny(run, until=6, max_iters=12, ckpt_interval=3)
    before = {p.name: p.read_bytes() for p in (run / "latest").iterdir()}
    monkeypatch.setattr(target, fault)
    with pytest.raises(AttnlabError if expected else KeyboardInterrupt) as err:
        trainer.run()
    monkeypatch.undo()
    if expected:
        assert str(err.value) == expected.format(latest=run / "latest")
    assert {p.name: p.read_bytes() for p in (run / "latest").iterdir()} == before
    assert leftovers(run) == []
    model, _ = ckpt.load_pretrained(run / "latest")
    for key, value in load_file(run / "latest" / ckpt.WEIGHTS).items():
        assert torch.equal(model.state_dict()[key], value)
    assert saved_iter(run / "latest") == 6


def test_cli_reports_a_full_disk_in_one_line(tiny_data, tmp_path, monkeypatch, capsys):
    from attnlab.cli import main

    calls = []
    real = ckpt.write_model_folder

    def fills_up_on_second_save(*args, **kwargs):
        calls.append(1)
        return _enospc() if len(calls) == 2 else real(*args, **kwargs)

    monkeypatch.setattr(ckpt, "write_model_folder", fills_up_on_second_save)
    run = tmp_path / "run"
    assert main(train_cmd(tiny_data, run)) == 2
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == (
        f"attnlab train: error: no space left on device while writing {run / 'latest'}; "
        "nothing was lost"
    )
    assert saved_iter(run / "latest") == 3


def test_a_full_disk_under_overwrite_names_the_run_not_its_temp(
    tiny_data, tmp_path, monkeypatch, capsys
):
    from attnlab.cli import main

    run = tmp_path / "run"
    assert main(train_cmd(tiny_data, run)) == 0
    before = snapshot(run)
    monkeypatch.setattr(ckpt, "write_model_folder", _enospc)
    assert main([*train_cmd(tiny_data, run), "--overwrite"]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"attnlab train: error: no space left on device while writing {run / 'latest'}; "
        "nothing was lost"
    )  # was: ... while writing .run.tmp-PID/latest
    assert snapshot(run) == before and sorted(p.name for p in tmp_path.iterdir()) == ["run"]


def test_resume_drops_metrics_rows_after_the_checkpoint_and_a_torn_row(tmp_path: Path):
    from attnlab.rundir import RunDir
    from attnlab.train.metrics import MetricsLog

    (tmp_path / "metrics.csv").write_text(
        "iter,train_loss,val_loss\n0,,4.2\n5,4.1,\n10,4.0,3.9\n15,3.8,\n1"  # killed mid-append
    )
    MetricsLog(RunDir(tmp_path), tensorboard=False).truncate_after(10)
    assert (tmp_path / "metrics.csv").read_text().splitlines() == [
        "iter,train_loss,val_loss", "0,,4.2", "5,4.1,", "10,4.0,3.9"
    ]  # fmt: skip
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.csv"]


def test_a_second_trainer_on_a_run_is_refused_and_changes_nothing(train_tiny, tmp_path: Path):
    from test_folder_safety import snapshot

    from attnlab.train.trainer import Trainer

    run = tmp_path / "run"
    first, _ = train_tiny(run, until=5, max_iters=10, ckpt_interval=5)
    first.lock.acquire()  # as while it trains
    before = snapshot(run)
    with pytest.raises(AttnlabError) as err:
        Trainer.resume(run)
    assert str(err.value) == (
        f"{run} is in use by another trainer (PID {os.getpid()}); "
        "wait for it to finish or stop it, or choose another folder"
    )
    assert snapshot(run) == before
    first.close()
    assert Trainer.resume(run).state.iter == 5  # free again once the first has finished


def test_a_lock_held_by_an_overwrite_never_names_the_old_trainers_pid(tmp_path: Path):
    """--overwrite holds the old run's lock without writing to it: the refusal named the PID
    of the run's last trainer, long gone (one a user might kill once the PID is reused)."""
    from attnlab.rundir import RunLock

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    run = tmp_path / "run"
    run.mkdir()
    (run / ".attnlab.lock").write_text(f"{gone.pid}\n")
    with RunLock(run, record_pid=False), pytest.raises(AttnlabError) as err:
        RunLock(run).acquire()
    assert str(err.value) == (
        f"{run} is in use by another trainer; wait for it to finish or stop it, or choose "
        "another folder"
    )


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_saves_a_checkpoint_and_prints_the_resume_command(
    tiny_data: Path, tmp_path: Path, signum: int
):
    """SIGTERM (a scheduler's, `kill`'s) ended the run at once: no message, exit 143, and the
    work since the last checkpoint lost; it now stops like Ctrl-C."""
    run = tmp_path / "run"
    args = [a for a in RUN_ARGS if not a.startswith(("max_iters", "ckpt_interval"))]
    code, err = interrupt_cli(
        ["train", "--data", str(tiny_data), "--out", str(run), *args, "max_iters=100000",
         "ckpt_interval=100000"],
        lambda: (run / "metrics.csv").is_file() and len(metrics(run)) >= 3,
        signum,
        ENV,
    )  # fmt: skip
    assert code == 128 + signum, err
    it = saved_iter(run / "latest")
    assert it >= 8
    said = f"at iter {it}: saved {run / 'latest'}; continue with: attnlab train --resume {run}"
    if signum == signal.SIGINT:
        assert err.splitlines()[-2:] == [f"interrupted {said}", "interrupted"]
    else:
        assert err.splitlines()[-1:] == [f"terminated (SIGTERM) {said}"]
    assert leftovers(run) == []
    p = run_cli("train", "--resume", str(run), f"max_iters={it + 2}", env=ENV)
    assert p.returncode == 0, p.stderr
    assert saved_iter(run / "latest") == it + 2


STUDY_SPEC = """
name = "long"
description = "one variant that trains long enough to be interrupted"
[variants.base]
preset = "shakespeare-char"
[scale.ci]
seeds = 1
model = { n_layer = 1, n_head = 2, n_embd = 16, block_size = 16 }
train = { max_iters = 100000, eval_interval = 100000, eval_iters = 1, batch_size = 2, warmup_iters = 1, log_interval = 1, device = "cpu" }
"""


def test_an_interrupted_study_says_the_study_resumes_its_run(tiny_data: Path, tmp_path: Path):
    """Ctrl-C in a study said `continue with: attnlab train --resume RUN`, which finishes the
    run but leaves the study's results and report behind: the study's own command resumes it."""
    (tmp_path / "long.toml").write_text(STUDY_SPEC)
    out = tmp_path / "study"
    run = out / "runs" / "base" / "seed0"
    code, err = interrupt_cli(
        ["study", str(tmp_path / "long.toml"), "--out", str(out), "--data", str(tiny_data)],
        lambda: (run / "metrics.csv").is_file() and len(metrics(run)) >= 3,
        signal.SIGINT,
        ENV,
    )
    assert code == 130, err
    it = saved_iter(run / "latest")
    said = f"at iter {it}: saved {run / 'latest'}; the same `attnlab study` command resumes it"
    assert err.splitlines()[-2:] == [f"interrupted {said}", "interrupted"]


def test_a_full_disk_while_logging_says_so_and_keeps_the_checkpoint(
    train_tiny, tmp_path: Path, monkeypatch
):
    from attnlab.train.metrics import MetricsLog

    run = tmp_path / "run"
    trainer, _ = train_tiny(run, until=6, max_iters=12, ckpt_interval=3)
    monkeypatch.setattr(MetricsLog, "write", _enospc)  # the next row is iter 10's
    with pytest.raises(AttnlabError) as err:
        trainer.run()
    assert str(err.value) == f"no space left on device while writing {run}; nothing was lost"
    monkeypatch.undo()
    assert saved_iter(run / "latest") == 9  # written before the failed row, and complete
    assert leftovers(run) == []
    ckpt.load_pretrained(run / "latest")


def test_a_full_disk_as_a_resume_starts_says_so_and_leaves_no_temp_file(
    train_tiny, tmp_path: Path, monkeypatch
):
    """The resume's config.json rewrite, before training, met a full disk with a traceback
    and left .config.json.tmp behind; metrics.csv's rewrite left .metrics.csv.tmp."""
    from attnlab.train.trainer import Trainer

    run = tmp_path / "run"
    train_tiny(run, until=6, max_iters=12, ckpt_interval=3)
    before = snapshot(run)
    full = f"no space left on device while writing {run}; nothing was lost"
    with monkeypatch.context() as m:
        m.setattr("os.replace", _enospc)  # config.json's
        with pytest.raises(AttnlabError) as err:
            Trainer.resume(run, quiet=True)
    assert str(err.value) == full
    assert snapshot(run) == before
    trainer = Trainer.resume(run, quiet=True)
    before = snapshot(run)
    with monkeypatch.context() as m:
        m.setattr("pathlib.Path.replace", _enospc)  # metrics.csv's, as training starts
        with pytest.raises(AttnlabError) as err:
            trainer.run()
    assert str(err.value) == full
    assert snapshot(run) == before


def test_a_refused_resume_leaves_the_lock_file_as_it_was(train_tiny, tmp_path: Path):
    """The refusal was the only thing to write: the lock file got its PID."""
    from test_bad_input import error_line

    run = tmp_path / "run"
    train_tiny(run, until=6, max_iters=12, ckpt_interval=3)
    (run / ".attnlab.lock").write_text("1\n")  # the PID of the run's last trainer
    p = run_cli("train", "--resume", str(run), "batch_size=4", env=ENV)
    assert error_line(p, "train").startswith("cannot change on resume: batch_size=4")
    assert (run / ".attnlab.lock").read_text() == "1\n"
    p = run_cli("train", "--resume", str(run), "max_iters=3", env=ENV)  # refused under the lock
    assert p.returncode == 2 and (run / ".attnlab.lock").read_text() == "1\n"


def test_resume_hides_the_tensorboard_points_logged_after_the_checkpoint(
    tiny_data: Path, tmp_path: Path
):
    """metrics.csv dropped the rows a killed run logged after its checkpoint, but tb/ kept
    them: every step between the checkpoint and the kill showed twice."""
    import shutil

    from conftest import tiny_model, tiny_train
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from attnlab.train.trainer import Trainer

    run = tmp_path / "run"
    cfg = tiny_train(max_iters=10, eval_interval=5, log_interval=1, tensorboard=True)
    Trainer(run, tiny_model(), cfg, tiny_data, quiet=True).run(until=5)
    shutil.copytree(run / "latest", tmp_path / "at5")
    Trainer.resume(run, quiet=True).run()  # logs 6..10, then is "killed" back to iter 5
    shutil.rmtree(run / "latest")
    shutil.copytree(tmp_path / "at5", run / "latest")
    Trainer.resume(run, quiet=True).run()
    events = EventAccumulator(str(run / "tb"))
    events.Reload()
    steps = [e.step for e in events.Scalars("train_loss")]
    assert steps == list(range(1, 11))
