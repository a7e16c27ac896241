"""`torchrun -m attnlab train` on 2 CPU ranks (gloo) against one process with the same global batch."""

from __future__ import annotations

import contextlib
import csv
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import ROOT, run_cli, tiny_model, tiny_train

from attnlab.train import checkpoint as ckpt
from attnlab.train.trainer import Trainer

RECIPE = dict(max_iters=8, eval_interval=4, log_interval=1)  # log every step: compare every loss
COMPARED = ("train_loss", "val_loss", "grad_norm")


def overrides(*, model: dict | None = None, **train) -> list[str]:
    """tiny_model(**model) + tiny_train(**train) as `key=value` arguments (vocab comes from the
    data)."""
    model = {k: v for k, v in tiny_model(**model or {}).to_dict().items() if k != "vocab_size"}
    return [f"{k}={json.dumps(v)}" for k, v in {**model, **tiny_train(**train).to_dict()}.items()]


def torchrun(
    *args: str, nproc: int = 2, program: tuple[str, ...] = ("-m", "attnlab"), fails: bool = False
) -> str:
    """`torchrun --standalone` (a free port, so parallel tests don't collide) on CPU ranks;
    returns stderr (``fails``: the run must fail, not succeed)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        *program,
        *args,
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        out, err = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        # the ranks too, not just torchrun: each runs in a session of its own (killpg misses it),
        # and one left behind holds the pipes open, so the test itself would wait forever
        for pid in [*descendants(proc.pid), proc.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"torchrun timed out: {err[-3000:]}") from None
    assert (proc.returncode != 0) == fails, out[-3000:] + err[-3000:]
    return err


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def descendants(pid: int) -> list[int]:
    """The processes below ``pid``, from /proc (Linux; elsewhere none are found)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])  # after "(command)"
            children.setdefault(ppid, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    return found


def metrics(run_dir: Path) -> dict[int, dict[str, float]]:
    with (run_dir / "metrics.csv").open() as f:
        return {
            int(r["iter"]): {k: float(r[k]) for k in COMPARED if r[k]} for r in csv.DictReader(f)
        }


def assert_same_curves(a: Path, b: Path, iters: range) -> None:
    ma, mb = metrics(a), metrics(b)
    assert set(iters) <= set(ma) and set(iters) <= set(mb)
    for it in iters:
        assert ma[it].keys() == mb[it].keys(), it
        for key, value in ma[it].items():
            assert mb[it][key] == pytest.approx(value, rel=1e-4), f"iter {it} {key}"


def resume(run_dir: Path, max_iters: int) -> None:
    trainer = Trainer.resume(run_dir, {"max_iters": max_iters}, quiet=True)
    trainer.run()
    trainer.close()


def test_ddp_matches_one_process_and_resumes_in_one(
    tiny_data: Path, train_tiny, tmp_path: Path
) -> None:
    """2 ranks x 4 rows see the global batches of 1 process x 8 rows: same losses, same grad norms.

    The DDP run's checkpoint then continues in a single process exactly like the single run's.
    """
    single, ddp = tmp_path / "single", tmp_path / "ddp"
    train_tiny(single, **RECIPE)
    torchrun("train", "--data", str(tiny_data), "--out", str(ddp), *overrides(**RECIPE))
    assert len(metrics(ddp)) == RECIPE["max_iters"] + 1  # rank 0 alone writes the log
    assert_same_curves(single, ddp, range(RECIPE["max_iters"] + 1))
    for run in (single, ddp):
        resume(run, 12)
    assert_same_curves(single, ddp, range(9, 13))


def test_single_process_checkpoint_resumes_under_ddp(
    tiny_data: Path, train_tiny, tmp_path: Path
) -> None:
    """The reverse direction: a run started in one process continues on 2 ranks."""
    single, both = tmp_path / "single", tmp_path / "both"
    for run in (single, both):
        train_tiny(run, **RECIPE)
    resume(single, 12)
    torchrun("train", "--resume", str(both), "max_iters=12")
    assert_same_curves(single, both, range(13))


def test_fsdp_matches_one_process_and_checkpoints_cross_over(
    tiny_data: Path, train_tiny, tmp_path: Path
) -> None:
    """FSDP2 (fully_shard per block) on 2 gloo ranks: same curve; its checkpoint resumes in one
    process, and a one-process checkpoint resumes under FSDP (sharded optimizer state reloaded)."""
    single, fsdp, both = tmp_path / "single", tmp_path / "fsdp", tmp_path / "both"
    train_tiny(single, **RECIPE)
    train_tiny(both, **RECIPE)
    torchrun("train", "--data", str(tiny_data), "--out", str(fsdp), *overrides(**RECIPE, fsdp=True))
    assert_same_curves(single, fsdp, range(RECIPE["max_iters"] + 1))
    resume(single, 12)
    resume(fsdp, 12)
    assert_same_curves(single, fsdp, range(13))
    torchrun("train", "--resume", str(both), "max_iters=12", "fsdp=true")
    assert_same_curves(single, both, range(13))


def sharded_run(tiny_data: Path, out: Path) -> None:
    """2 FSDP ranks writing sharded checkpoints: every rank its shards, no model.safetensors."""
    args = overrides(**RECIPE, fsdp=True, sharded_checkpoints=True)
    torchrun("train", "--data", str(tiny_data), "--out", str(out), *args)
    latest = out / "latest"
    assert (latest / "shards" / ".metadata").is_file()
    assert not (latest / "model.safetensors").exists()


def test_sharded_checkpoints_export_and_resume_in_one_process(
    tiny_data: Path, train_tiny, tmp_path: Path
) -> None:
    """fsdp=true sharded_checkpoints=true: one process's curve; best/'s shards read as one
    state_dict equal to one process's best/, export to a model folder with its logits, and the
    run resumes in one process on one process's curve."""
    single, sharded = tmp_path / "single", tmp_path / "sharded"
    train_tiny(single, **RECIPE)
    sharded_run(tiny_data, sharded)
    assert_same_curves(single, sharded, range(RECIPE["max_iters"] + 1))
    got = ckpt.read_weights(sharded / "best")
    for key, value in ckpt.read_weights(single / "best").items():
        torch.testing.assert_close(got[key], value, rtol=1e-4, atol=1e-6, msg=key)
    export = tmp_path / "export"
    done = run_cli("export", str(sharded), "--out", str(export))  # best/, a sharded one too
    assert done.returncode == 0, done.stderr
    (exported, _), (reference, _) = ckpt.load_pretrained(export), ckpt.load_pretrained(single)
    idx = torch.randint(
        reference.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0)
    )
    with torch.no_grad():  # the export may add <unk> and special rows: compare the model's own
        want = reference(idx, all_logits=True)[0]
        torch.testing.assert_close(exported(idx, all_logits=True)[0][..., : want.shape[-1]], want)
    resume(single, 12)
    resume(sharded, 12)
    assert_same_curves(single, sharded, range(13))


@pytest.mark.slow
def test_sharded_checkpoints_resume_on_more_ranks(
    tiny_data: Path, train_tiny, tmp_path: Path
) -> None:
    """A sharded checkpoint of 2 ranks resharded to 4 on load: one process's curve."""
    single, sharded = tmp_path / "single", tmp_path / "sharded"
    train_tiny(single, **RECIPE)
    sharded_run(tiny_data, sharded)
    resume(single, 12)
    torchrun("train", "--resume", str(sharded), "max_iters=12", nproc=4)
    assert_same_curves(single, sharded, range(13))


@pytest.mark.slow
def test_two_launchers_as_two_nodes_train_hsdp_on_one_processs_curve(
    tiny_data: Path, train_tiny, tmp_path: Path
) -> None:
    """Two torchrun launchers on loopback (c10d rendezvous), 2 ranks each, hsdp=true: a 2-D
    mesh (replicate over the nodes, shard within each) on one process's curve."""
    single, hsdp = tmp_path / "single", tmp_path / "hsdp"
    train_tiny(single, **RECIPE)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    args = overrides(**RECIPE, fsdp=True, hsdp=True, sharded_checkpoints=True)
    launcher = [
        sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc_per_node=2",
        "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}", "--rdzv-id=hsdp",
    ]  # fmt: skip
    program = ["-m", "attnlab", "train", "--data", str(tiny_data), "--out", str(hsdp), *args]
    nodes = [
        subprocess.Popen(
            [*launcher, f"--node-rank={node}", *program],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for node in (0, 1)
    ]
    said = ""
    for proc in nodes:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
        said += out
    assert "4 processes, HSDP (2 nodes x 2 shards)" in said
    assert_same_curves(single, hsdp, range(RECIPE["max_iters"] + 1))


# attnlab's CLI, with destroy_process_group refusing while a DDP wrapper is still alive
TEARDOWN_CHECKED = """
import gc, sys
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from attnlab.cli import main

destroy = dist.destroy_process_group

def checked(*args, **kwargs):
    if any(isinstance(o, DistributedDataParallel) for o in gc.get_objects()):
        raise SystemExit("a DDP wrapper outlives its process group")
    destroy(*args, **kwargs)

dist.destroy_process_group = checked
sys.exit(main(sys.argv[1:]))
"""


def test_the_ddp_wrapper_goes_before_its_process_group(tiny_data: Path, tmp_path: Path) -> None:
    """A finished torchrun run hung at exit about once in 30: DDP's reducer, freed after the
    process group was destroyed, was the group's last owner and destroyed it with the GIL held,
    joining gloo's worker thread while that thread waited for the GIL."""
    script = tmp_path / "teardown_checked.py"
    script.write_text(TEARDOWN_CHECKED)
    out = tmp_path / "run"
    recipe = dict(max_iters=2, eval_interval=2, log_interval=1)
    torchrun("train", "--data", str(tiny_data), "--out", str(out), *overrides(**recipe),
             program=(str(script),))  # fmt: skip
    assert len(metrics(out)) == 3


SLOW_CLOCK = """
import os, sys, time
from attnlab.cli import main
from attnlab.train import trainer
if os.environ["RANK"] == "1":  # this rank's clock runs ten times fast: it runs out of time first
    real, start = time.perf_counter, time.perf_counter()
    trainer.time = type("Clock", (), {"perf_counter": lambda: start + 10 * (real() - start)})
sys.exit(main(sys.argv[1:]))
"""


def test_ranks_out_of_time_stop_together(tiny_data: Path, tmp_path: Path) -> None:
    """Each rank summed its own step times, so under max_seconds one rank stopped and ran the
    final evaluation while the other began another step: gloo's "collective mismatch" crash
    every time (work since the last checkpoint lost), or a hang under NCCL."""
    script = tmp_path / "slow_clock.py"
    script.write_text(SLOW_CLOCK)
    out = tmp_path / "run"
    recipe = dict(max_iters=100_000, eval_interval=50, log_interval=1, max_seconds=2)
    torchrun("train", "--data", str(tiny_data), "--out", str(out), *overrides(**recipe),
             program=(str(script),))  # fmt: skip
    summary = json.loads((out / "summary.json").read_text())
    rows = metrics(out)
    assert summary["iters"] == max(rows) < 100_000 and "val_loss" in rows[max(rows)]


RECORD_MASKS = """
import hashlib, os, sys
import torch.nn.functional as F
from attnlab.cli import main
real = F.dropout
def recorded(x, p=0.5, training=True, inplace=False):
    y = real(x, p, training, inplace)
    if training and p > 0:
        with open(os.path.join(os.environ["MASKS"], f"masks-{os.environ['RANK']}.txt"), "a") as f:
            f.write(hashlib.sha1((y == 0).detach().cpu().numpy().tobytes()).hexdigest() + "\\n")
    return y
F.dropout = recorded
sys.exit(main(sys.argv[1:]))
"""


def test_each_rank_draws_its_own_dropout_masks_and_resumes_them(
    tiny_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every rank seeded the global generator alike, so each rank's shard of the batch got the
    same dropout masks as every other's: noise correlated across ranks, and a run that differs
    from one process without a word. A resumed rank also took rank 0's saved stream."""
    script = tmp_path / "record_masks.py"
    script.write_text(RECORD_MASKS)
    masks = tmp_path / "masks"
    masks.mkdir()
    monkeypatch.setenv("MASKS", str(masks))
    recipe = dict(RECIPE, lr_decay_iters=8, model={"dropout": 0.2})
    whole, split = tmp_path / "whole", tmp_path / "split"
    data = ("--data", str(tiny_data))
    torchrun("train", "--out", str(whole), *data, *overrides(**recipe), program=(str(script),))
    ranks = [(masks / f"masks-{r}.txt").read_text().split() for r in (0, 1)]
    assert len(ranks[0]) == len(ranks[1]) > 0
    assert not set(ranks[0]) & set(ranks[1])  # no mask of one rank is another's
    # stopped at 4 and resumed on 2 ranks: each rank goes on with its own stream
    torchrun("train", "--out", str(split), *data, *overrides(**{**recipe, "max_iters": 4}))
    torchrun("train", "--resume", str(split), "max_iters=8")
    assert_same_curves(whole, split, range(1, 9))


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (
            {"WORLD_SIZE": "2"},
            "WORLD_SIZE=2 is set but RANK, MASTER_ADDR and MASTER_PORT are not: start one "
            "process per rank with torchrun (see README), or unset WORLD_SIZE to train in one "
            "process",
        ),
        ({"WORLD_SIZE": "two"}, "torchrun's variables must be integers (WORLD_SIZE=two)"),
    ],
)
def test_a_stray_world_size_is_one_line(
    tiny_data: Path, tmp_path: Path, env: dict, expected: str
) -> None:
    """A WORLD_SIZE left in the shell (as a cluster job sets it) was KeyError: 'RANK'."""
    clean = {k: v for k, v in os.environ.items() if k not in ("RANK", "MASTER_ADDR", "MASTER_PORT")}
    proc = run_cli(
        "train", "--data", str(tiny_data), "--out", str(tmp_path / "run"), *overrides(**RECIPE),
        env={**clean, **env},
    )  # fmt: skip
    assert proc.returncode == 2 and proc.stderr.splitlines() == [
        f"attnlab train: error: {expected}"
    ]
    assert not (tmp_path / "run").exists()


def test_every_rank_stops_on_rank_0s_refusal(tiny_data: Path, train_tiny, tmp_path: Path) -> None:
    """Rank 0 alone checks --out and takes the run lock: it printed its one line and left, and
    rank 1 went on into DDP and died there with a traceback (connection closed by peer)."""
    run = tmp_path / "run"
    train_tiny(run, **RECIPE)
    err = torchrun("train", "--data", str(tiny_data), "--out", str(run), *overrides(**RECIPE),
                   fails=True)  # fmt: skip
    line = (
        f"attnlab train: error: {run} already holds a run; use --resume, --overwrite or "
        "another --out"
    )
    # rank 0's, and rank 1's unless torchrun stopped it first; print writes the line and its
    # newline apart, so another process's output may land between them: find the text
    assert line in err
    assert "DistributedDataParallel" not in err and "closed by peer" not in err


def test_ctrl_c_under_torchrun_saves_where_the_ranks_stopped(tiny_data: Path, tmp_path: Path):
    """The ranks ignored the SIGINT torchrun passes on: killed 30 s later, no checkpoint, the
    work since the last one lost. They now agree on a step, save there and say how to resume."""
    run = tmp_path / "run"
    recipe = dict(max_iters=100_000, eval_interval=100_000, log_interval=1)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "attnlab", "train", "--data", str(tiny_data), "--out", str(run),
           *overrides(**recipe)]  # fmt: skip
    proc = subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        while not (run / "metrics.csv").is_file() or len(metrics(run)) < 4:
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)  # as Ctrl-C in its terminal: torchrun passes it on
        _, err = proc.communicate(timeout=120)
    finally:
        for pid in [*descendants(proc.pid), proc.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    state = Trainer.resume(run, quiet=True)
    it = state.state.iter
    state.close()
    assert it >= 3
    said = f"interrupted at iter {it}: saved {run / 'latest'}; continue with: "
    # said once, by rank 0 (counted as text: see test_every_rank_stops_on_rank_0s_refusal)
    assert err.count("interrupted at iter") == 1
    assert f"{said}attnlab train --resume {run}" in err


@pytest.mark.parametrize(
    "fsdp", [pytest.param(False, id="ddp"), pytest.param(True, id="fsdp", marks=pytest.mark.slow)]
)
def test_kv_bias_under_torchrun_matches_one_process(
    tiny_data: Path, train_tiny, tmp_path: Path, fsdp: bool
) -> None:
    """`torchrun -m attnlab train ... use_m_gate=true` died at its second step: DDP waited for the
    last block's W_gm, whose M no block reads (under FSDP, AdamW decayed it instead)."""
    recipe = dict(max_iters=4, eval_interval=2, log_interval=1)
    single, ranks = tmp_path / "single", tmp_path / "ranks"
    train_tiny(single, model={"use_m_gate": True}, **recipe)
    torchrun("train", "--data", str(tiny_data), "--out", str(ranks),
             *overrides(model={"use_m_gate": True}, **recipe, fsdp=fsdp))  # fmt: skip
    assert_same_curves(single, ranks, range(5))


@pytest.mark.slow
def test_a_stopped_peer_ends_the_run_within_dist_timeout(tiny_data: Path, tmp_path: Path) -> None:
    """A SIGSTOPped rank left the other waiting with no output (torch's default: 30 minutes).
    Now rank 0 gives up after dist_timeout with one line, saves latest/ at the last finished
    step, and that checkpoint resumes in one process."""
    out = tmp_path / "run"
    recipe = dict(max_iters=100_000, eval_interval=20, log_interval=5, dist_timeout=5)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "attnlab", "train", "--data", str(tiny_data), "--out", str(out),
           *overrides(**recipe)]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 240
        while not (out / "latest").is_dir() and time.monotonic() < deadline:
            time.sleep(0.5)
        ranks = [
            p for p in descendants(proc.pid) if "attnlab" in Path(f"/proc/{p}/cmdline").read_text()
        ]
        rank1 = max(ranks)  # torchrun starts rank 0 first
        os.kill(rank1, signal.SIGSTOP)
        stopped = time.monotonic()
        _, err = proc.communicate(timeout=120)
    finally:
        for pid in [*descendants(proc.pid), proc.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    lines = [line for line in err.splitlines() if "no answer from a peer" in line]
    assert lines and "within dist_timeout=5 s" in lines[0], err[-3000:]
    assert "continue with: attnlab train --resume" in lines[0]
    assert time.monotonic() - stopped < 100  # torchrun's own grace (30 s) for the stopped rank
    saved = json.loads((out / "latest" / "train_config.json").read_text())
    assert saved["dist_timeout"] == 5
    resume(out, max(metrics(out)) + 3)  # the checkpoint is whole: one process continues it


KILL_RANK_1_ONCE = """
import os, sys, time
from attnlab.cli import main
from attnlab.train import trainer
save = trainer.Trainer.save
def save_then_die(self, name):
    save(self, name)
    first = os.environ["TORCHELASTIC_RESTART_COUNT"] == "0"
    if first and self.dist.rank == 1 and name == "latest" and self.state.iter >= 4:
        time.sleep(2)  # rank 0 finishes writing the checkpoint, then waits for this rank
        os._exit(3)  # a rank lost after a checkpoint, on the first attempt only
trainer.Trainer.save = save_then_die
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_max_restarts_resumes_the_run_from_its_checkpoint(
    tiny_data: Path, train_tiny, tmp_path: Path
) -> None:
    """`torchrun --max-restarts=1`: restarted workers were refused ('already holds a run'); now
    they resume the run their job started, and the curve is one process's."""
    script = tmp_path / "kill_once.py"
    script.write_text(KILL_RANK_1_ONCE)
    recipe = dict(max_iters=8, eval_interval=4, log_interval=1)
    single, ranks = tmp_path / "single", tmp_path / "ranks"
    train_tiny(single, **recipe)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "--max-restarts=1", str(script), "train", "--data", str(tiny_data), "--out",
           str(ranks), *overrides(**recipe)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "torchrun restart 1, resumed" in proc.stdout
    assert_same_curves(single, ranks, range(9))
