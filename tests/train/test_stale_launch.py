"""Launch variables another job left behind: refused at once, never a wait or a silent resume."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest
from conftest import run_cli
from test_bad_input import error_line
from test_folder_safety import snapshot

from attnlab.errors import AttnlabError


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_stale_launch_variables_are_refused_at_once(tiny_data: Path, tmp_path: Path) -> None:
    """WORLD_SIZE, RANK, MASTER_ADDR and MASTER_PORT exported once, then a plain `attnlab train`:
    it waited for peers that never come; without torchrun's job id it says so at once."""
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHELASTIC_")}
    env.update(WORLD_SIZE="2", RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    before = snapshot(tmp_path)
    start = time.monotonic()
    p = run_cli(
        "train", "--data", str(tiny_data), "--out", str(tmp_path / "run"), "max_iters=1",
        "device=cpu", env=env, timeout=120,
    )  # fmt: skip
    assert time.monotonic() - start < 60  # not JOIN_TIMEOUT_S
    assert error_line(p, "train") == (
        f"WORLD_SIZE=2, RANK=0, MASTER_ADDR=127.0.0.1, MASTER_PORT={port} are set, but this "
        "process was not started by torchrun (no TORCHELASTIC_RUN_ID): start every rank with "
        "torchrun (see README), or unset WORLD_SIZE, RANK, MASTER_ADDR and MASTER_PORT to train "
        "in one process"
    )
    assert snapshot(tmp_path) == before


def test_a_reused_rdzv_id_never_resumes_another_jobs_finished_run(
    train_tiny, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second job with the first's --rdzv-id: its first attempt was refused over the run, its
    restart then resumed that finished run with exit 0 and never trained the new one."""
    from attnlab.commands.train import restarted_run

    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "fixed-id")
    run = tmp_path / "run"
    train_tiny(run, max_iters=2, eval_interval=2)  # the first job's, finished
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")  # the second job's restart
    before = snapshot(tmp_path)
    with pytest.raises(AttnlabError) as err:
        restarted_run(str(run))
    assert str(err.value) == (
        f"{run} holds a finished run of a torchrun job with this id (fixed-id); a restart "
        "continues only an unfinished one: choose another --out, or give each job its own "
        "--rdzv-id"
    )
    assert snapshot(tmp_path) == before
