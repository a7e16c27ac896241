"""Failures that were tracebacks become one line saying what to do: a full disk, a read-only
run, a name too long for the file system, leftover torchrun variables, a tiny temperature,
an ONNX graph that is not an attnlab export's.

Each case asserts the exit status, the exact one-line message (no traceback) and that the
disk is as it was (the before/after listing of test_folder_safety.snapshot).
"""

from __future__ import annotations

import os
import shutil
import socket
import types
from pathlib import Path

import pytest
from conftest import run_cli, tiny_model
from refusal_fixtures import (  # noqa: F401  (fixtures)
    corpus_fixture,
    data_fixture,
    freeze,
    full_disk_fixture,
    read_only_fixture,
)
from test_bad_input import TINY, attnlab, error_line  # noqa: F401  (attnlab: a fixture)
from test_folder_safety import snapshot
from test_untrusted import model_dir  # noqa: F401  (a fixture)

from attnlab.fsutil import MANIFEST


@pytest.mark.parametrize(
    "error",
    [OSError("720002 requested and 524288 written"),  # numpy's tofile: no errno
     RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")],
)  # fmt: skip
def test_a_write_failing_on_a_full_disk_says_so_whatever_it_raises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: Exception
):
    """What numpy's tofile and torch.save raise when the disk fills (neither says ENOSPC)
    was a traceback; on a file system with no space left it is the full-disk line."""
    from attnlab.errors import AttnlabError
    from attnlab.fsutil import replace_folder

    monkeypatch.setattr(shutil, "disk_usage", lambda path: types.SimpleNamespace(free=0))
    out = tmp_path / "out"
    with pytest.raises(AttnlabError) as err, replace_folder(out, "thing") as tmp:
        (tmp / "train.bin").write_bytes(b"partly")
        raise error
    assert str(err.value) == f"no space left on device while writing {out}; nothing was lost"
    assert list(tmp_path.iterdir()) == []


def test_a_failure_that_is_not_a_full_disk_keeps_its_traceback(tmp_path: Path):
    from attnlab.fsutil import replace_folder

    with pytest.raises(RuntimeError, match="a bug"), replace_folder(tmp_path / "out", "thing"):
        raise RuntimeError("a bug")
    assert list(tmp_path.iterdir()) == []


def test_prepare_and_export_onto_a_real_full_disk(
    corpus: Path, tmp_path: Path, full_disk: Path, tiny_data: Path
):
    """On a 1 MiB tmpfs: prepare (numpy's short write) and export (torch's C++ writer aborted
    the process, exit 134, leaving .OUT.tmp-PID) each say so in one line and leave nothing."""
    import torch

    from attnlab.data.prepare import load_dataset
    from attnlab.model import GPT
    from attnlab.train.checkpoint import save_checkpoint

    corpus.write_text("abcdefgh \n" * 80_000)  # 1.4 MB of uint16 tokens
    tok = load_dataset(tiny_data).tokenizer
    torch.manual_seed(0)
    model = save_checkpoint(
        tmp_path / "model", GPT(tiny_model(vocab_size=tok.vocab_size, n_embd=128)), tok
    )
    cases = [
        ("prepare", ["prepare", "--corpus", str(corpus)]),
        ("export", ["export", str(model), "--formats", "torchscript"]),
        ("export", ["export", str(model), "--formats", "bin"]),
    ]
    for command, argv in cases:
        out = full_disk / "out"
        p = run_cli(*argv, "--out", str(out))
        assert p.returncode == 2, p.stderr
        assert p.stderr.splitlines()[-1] == (
            f"attnlab {command}: error: no space left on device while writing {out}; nothing "
            "was lost"
        )
        assert "Traceback" not in p.stderr
        assert list(full_disk.iterdir()) == []


def test_train_without_data_on_a_full_attnlab_home(tmp_path: Path, full_disk: Path):
    """The shipped corpus is prepared into ATTNLAB_HOME on first use: a full one said
    "OSError: ... requested and ... written" and left its data/ folder behind."""
    home = full_disk / "home"
    p = run_cli("train", "--out", str(tmp_path / "run"), *TINY, env={"ATTNLAB_HOME": str(home)})
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.splitlines()[-1] == (
        f"attnlab train: error: no space left on device while writing "
        f"{home / 'data' / 'shakespeare_char'}; nothing was lost"
    )
    assert not (tmp_path / "run").exists()
    # nothing but the (empty) lock that prepares a shipped corpus once at a time
    assert [p for p in home.rglob("*") if p.is_file() and p.suffix != ".lock"] == []


def test_resume_with_tb_a_file_changes_nothing(attnlab, data: Path, tmp_path: Path):  # noqa: F811
    run = tmp_path / "run"
    with_tb = [a for a in TINY if a != "tensorboard=false"]
    assert attnlab("train", "--data", str(data), "--out", str(run), *with_tb).returncode == 0
    shutil.rmtree(run / "tb")
    (run / "tb").write_text("not a folder\n")
    before = snapshot(tmp_path)
    p = attnlab("train", "--resume", str(run), "max_iters=4")
    assert error_line(p, "train") == (
        f"cannot resume {run}: {run / 'tb'} is not a folder; move it away, or resume with "
        "tensorboard=false"
    )
    assert snapshot(tmp_path) == before  # config.json was rewritten before TensorBoard failed
    assert (
        attnlab("train", "--resume", str(run), "max_iters=4", "tensorboard=false").returncode == 0
    )


def test_resume_on_a_read_only_mount_gets_one_line(
    attnlab,  # noqa: F811
    data: Path,
    tmp_path: Path,
    read_only: Path,
):
    run = read_only / "run"
    assert attnlab("train", "--data", str(data), "--out", str(run), *TINY).returncode == 0
    freeze(read_only)
    before = snapshot(tmp_path)
    p = attnlab("train", "--resume", str(run), "max_iters=4")
    assert error_line(p, "train") == (
        f"cannot write {run} (Read-only file system), where a trainer writes; make it writable, "
        "or copy it somewhere that is and use the copy"
    )
    assert snapshot(tmp_path) == before


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_leftover_torchrun_variables_wait_a_bounded_time_and_say_for_what(
    attnlab,  # noqa: F811
    tiny_data: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
):
    from attnlab.train import distributed

    port = _free_port()
    for name, value in (("WORLD_SIZE", "2"), ("RANK", "0"), ("MASTER_ADDR", "127.0.0.1"),
                        ("MASTER_PORT", str(port))):  # fmt: skip
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(distributed, "JOIN_TIMEOUT_S", 1)
    before = snapshot(tmp_path)
    p = attnlab("train", "--data", str(tiny_data), "--out", str(tmp_path / "run"), *TINY)
    line = error_line(p, "train")
    start = (
        f"waited 1 s for the 2 ranks of WORLD_SIZE=2 to meet at MASTER_ADDR:MASTER_PORT "
        f"127.0.0.1:{port} (Timed out after "
    )
    end = (
        "waiting for clients. 1/2 clients joined.); start every rank with torchrun (see README), "
        "or unset WORLD_SIZE, RANK, MASTER_ADDR and MASTER_PORT to train in one process"
    )
    assert line.startswith(start) and line.endswith(end), line
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("command", ["train", "prepare"])
def test_a_name_longer_than_the_file_system_allows(
    attnlab,  # noqa: F811
    tiny_data: Path,
    corpus: Path,
    tmp_path: Path,
    command: str,
):
    out = tmp_path / ("r" * 300) / "run"
    limit = os.pathconf(tmp_path, "PC_NAME_MAX")
    argv = {
        "train": ["train", "--data", str(tiny_data), *TINY],
        "prepare": ["prepare", "--corpus", str(corpus)],
    }[command]
    before = snapshot(tmp_path)
    p = attnlab(*argv, "--out", str(out))
    assert error_line(p, command) == (
        f"--out {out}: a name of 300 bytes, more than the {limit} its file system allows; "
        "choose a shorter --out"
    )
    assert snapshot(tmp_path) == before


def test_a_tiny_temperature_samples_the_most_likely_tokens(attnlab, model_dir: Path):  # noqa: F811
    """1e-30 overflowed the logits: "probability tensor contains either inf, nan or < 0"."""
    args = ("sample", str(model_dir), "--prompt", "ROMEO", "--max-new-tokens", "12")
    tiny = attnlab(*args, "--temperature", "1e-30")
    assert tiny.returncode == 0, tiny.stderr
    assert tiny.stdout == attnlab(*args, "--temperature", "0").stdout


def test_sample_onnxruntime_refuses_a_graph_with_other_input_names(
    attnlab,  # noqa: F811
    model_dir: Path,  # noqa: F811
    tmp_path: Path,
):
    import onnx

    out = tmp_path / "exported"
    p = attnlab("export", str(model_dir), "--formats", "onnx", "--out", str(out))
    assert p.returncode == 0, p.stderr
    graph = onnx.load(str(out / "model.onnx"))
    for value in graph.graph.input:
        value.name = value.name.replace("position_ids", "pos")
    for node in graph.graph.node:
        node.input[:] = [name.replace("position_ids", "pos") for name in node.input]
    onnx.save(graph, str(out / "model.onnx"))
    (out / MANIFEST).unlink()  # with it, the changed graph is refused first (as a swapped file)
    before = snapshot(tmp_path)
    p = attnlab("sample", str(out), "--backend", "onnxruntime", "--prompt", "RO")
    message = error_line(p, "sample")
    assert message.startswith(f"{out / 'model.onnx'} takes the inputs attention_mask, input_ids, ")
    assert message.endswith(
        ", pos, not input_ids, attention_mask, position_ids and past_key_values.*: not a graph "
        "attnlab exported; export the model with `attnlab export`"
    )
    assert snapshot(tmp_path) == before
