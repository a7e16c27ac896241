"""Nothing attnlab did not create is deleted or overwritten; replacements are swapped in whole."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
from test_bad_input import attnlab, error_line  # noqa: F401  (attnlab: a fixture)
from test_untrusted import model_dir  # noqa: F401  (a fixture)

from attnlab.errors import AttnlabError
from attnlab.fsutil import MANIFEST, replace_folder


def snapshot(root: Path) -> dict[str, str]:
    """Relative path -> sha256 of every file (and '<dir>' for folders) under ``root``."""
    if not root.exists() and not root.is_symlink():
        return {}
    if root.is_file():
        return {".": hashlib.sha256(root.read_bytes()).hexdigest()}
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        if p.is_file()
        else "<dir>"
        for p in sorted(root.rglob("*"))
    }


def _thesis(tmp_path: Path) -> Path:
    out = tmp_path / "project"
    out.mkdir()
    (out / "config.json").write_text("{}")
    (out / "thesis.tex").write_text("a month of work")
    return out


def test_replace_folder_writes_a_new_folder(tmp_path: Path):
    out = tmp_path / "new" / "out"
    with replace_folder(out, "thing") as tmp:
        (tmp / "a.txt").write_text("a")
    assert snapshot(out) == snapshot_of(
        {"a.txt": "a", **manifest("thing", **{"a.txt": "a"})}, tmp_path
    )
    assert sorted(p.name for p in out.parent.iterdir()) == ["out"]


def manifest(kind: str, **files: str) -> dict[str, str]:
    """The manifest replace_folder writes last: the folder's kind, entries and ``files``
    (name -> text) with each one's size and sha256."""
    listed = {
        name: {"bytes": len(text.encode()), "sha256": hashlib.sha256(text.encode()).hexdigest()}
        for name, text in files.items()
    }
    record = {"kind": kind, "entries": sorted(files), "files": listed}
    return {MANIFEST: json.dumps(record, indent=2)}


def snapshot_of(files: dict[str, str], tmp_path: Path) -> dict[str, str]:
    ref = tmp_path / "reference"
    ref.mkdir()
    for name, text in files.items():
        (ref / name).write_text(text)
    return snapshot(ref)


def test_replace_folder_refuses_a_foreign_folder(tmp_path: Path):
    out = _thesis(tmp_path)
    before = snapshot(out)
    with pytest.raises(AttnlabError) as err, replace_folder(out, "thing", is_own=lambda p: False):
        raise AssertionError("never reached")
    assert str(err.value) == (
        f"{out} is not empty and is not a thing; pass --overwrite to replace it, "
        "or choose another --out"
    )
    assert snapshot(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["project"]


@pytest.mark.parametrize("fault", ["disk full", "interrupt", "bug"])
def test_a_failed_overwrite_leaves_the_old_folder_whole(tmp_path: Path, fault):
    out = _thesis(tmp_path)
    before = snapshot(out)
    errors = {
        "disk full": OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)),
        "interrupt": KeyboardInterrupt(),
        "bug": RuntimeError("bug"),
    }
    with (
        pytest.raises((AttnlabError, KeyboardInterrupt, RuntimeError)) as err,
        replace_folder(out, "thing", overwrite=True) as tmp,
    ):
        (tmp / "config.json").write_text('{"new": 1}')
        raise errors[fault]
    if fault == "disk full":
        assert str(err.value) == f"no space left on device while writing {out}; nothing was lost"
    assert snapshot(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["project"]


@pytest.mark.parametrize("fault", ["rename fails", "interrupt"])
def test_a_failed_swap_puts_the_old_folder_back(tmp_path: Path, monkeypatch, fault):
    """The old folder is already aside when the new one is renamed in: a failure there
    (a file system error, Ctrl-C) renames it back instead of leaving it under a hidden name."""
    out = _thesis(tmp_path)
    before = snapshot(out)
    real_replace = os.replace

    def failing_replace(src, dst):
        if Path(src).name.startswith(f".{out.name}.tmp-"):  # the new folder's rename into place
            raise KeyboardInterrupt if fault == "interrupt" else OSError(errno.EIO, "I/O error")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", failing_replace)
    with (
        pytest.raises((OSError, KeyboardInterrupt)),
        replace_folder(out, "thing", overwrite=True) as tmp,
    ):
        (tmp / "config.json").write_text('{"new": 1}')
    monkeypatch.undo()
    assert snapshot(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["project"]


_KILLED_MID_SWAP = """
import os, signal, sys
from pathlib import Path
from attnlab.fsutil import replace_folder
out = Path(sys.argv[1])
real_replace = os.replace
def replace(src, dst):
    if Path(src).name.startswith(f".{out.name}.tmp-"):  # the old folder is aside already
        os.kill(os.getpid(), signal.SIGKILL)
    real_replace(src, dst)
os.replace = replace
with replace_folder(out, "thing", overwrite=True) as tmp:
    (tmp / "config.json").write_text('{"new": 1}')
"""


def test_a_folder_a_killed_swap_left_aside_is_put_back(tmp_path: Path):
    """SIGKILL between swap_in's two renames left ``out`` missing and its only copy under a hidden
    name; the next command wrote a new folder beside it as if ``out`` had never existed."""
    import subprocess
    import sys

    out = _thesis(tmp_path)
    before = snapshot(out)
    killed = subprocess.run([sys.executable, "-c", _KILLED_MID_SWAP, str(out)], check=False)
    assert killed.returncode == -9 and not out.exists()  # the state the kill leaves
    with pytest.raises(AttnlabError) as err, replace_folder(out, "thing", is_own=lambda p: False):
        pass
    assert str(err.value) == (
        f"{out} is not empty and is not a thing; pass --overwrite to replace it, or choose "
        "another --out"
    )
    assert snapshot(out) == before
    assert not list(tmp_path.glob(".project.old-*"))  # its .tmp- goes with the next write


def test_a_dead_processs_aside_survives_a_swap_by_a_process_with_its_pid(tmp_path: Path):
    """The aside was ``.OUT.old-PID`` and every swap removed its own name at the end: a process
    given the PID of one killed mid-swap (PIDs repeat, in containers especially) deleted the
    only copy of that one's old folder."""
    aside = tmp_path / f".project.old-{os.getpid()}"  # what a killed holder of our PID left
    aside.mkdir()
    (aside / "thesis.tex").write_text("a month of work")
    before = snapshot(aside)
    with replace_folder(tmp_path / "project", "thing") as tmp:
        (tmp / "a.txt").write_text("a")
    assert snapshot(aside) == before


def test_overwrite_swaps_the_new_folder_in(tmp_path: Path):
    out = _thesis(tmp_path)
    with replace_folder(out, "thing", overwrite=True) as tmp:
        (tmp / "config.json").write_text('{"new": 1}')
    written = {"config.json": '{"new": 1}'}
    expected = {**written, **manifest("thing", **written)}
    assert snapshot(out) == snapshot_of(expected, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["project", "reference"]


def _a_file(tmp_path: Path) -> tuple[Path, str]:
    out = tmp_path / "notes.txt"
    out.write_text("notes")
    return out, f"{out} exists and is not a folder; choose another --out"


def _symlink_loop(tmp_path: Path) -> tuple[Path, str]:
    out = tmp_path / "loop"
    out.symlink_to(out)
    return out, f"{out}: Too many levels of symbolic links; choose another --out"


def _under_a_file(tmp_path: Path) -> tuple[Path, str]:
    (tmp_path / "notes.txt").write_text("notes")
    out = tmp_path / "notes.txt" / "out"
    return out, f"{out}: Not a directory; choose another --out"


@pytest.mark.parametrize("make", [_a_file, _symlink_loop, _under_a_file])
def test_an_out_that_cannot_be_a_folder_is_refused(tmp_path: Path, make):
    out, expected = make(tmp_path)
    before = snapshot(tmp_path)
    with pytest.raises(AttnlabError) as err, replace_folder(out, "thing", overwrite=True):
        raise AssertionError("never reached")
    assert str(err.value) == expected
    assert snapshot(tmp_path) == before


def test_a_second_trainer_on_a_run_folder_is_refused_naming_the_holder(tmp_path: Path):
    from attnlab.rundir import RunLock

    run = tmp_path / "run"
    with RunLock(run):
        with pytest.raises(AttnlabError) as err:
            RunLock(run).acquire()
        assert str(err.value) == (
            f"{run} is in use by another trainer (PID {os.getpid()}); "
            "wait for it to finish or stop it, or choose another folder"
        )
    with RunLock(run):  # released: the next one gets it
        pass


def _demo(out: Path, data: Path) -> list[str]:
    return ["demo", "--out", str(out), "max_iters=1", "eval_iters=1", "tensorboard=false"]


FOREIGN = [
    # (command line for out, what a refused command says)
    (_demo, "{out} is not empty and is not a demo run; pass --overwrite to replace it, "
     "or choose another --out"),
    (lambda out, data: ["demo", "--out", str(out), "n_layr=2"],
     "unknown config key 'n_layr'; did you mean 'n_layer'?"),
    (lambda out, data: ["demo", "--out", str(out), "--preset", "no-such"],
     "unknown preset 'no-such'"),
    (lambda out, data: ["train", "--data", str(data), "--out", str(out), "max_iters=1"],
     "{out} is not empty and is not a run folder; pass --overwrite to replace it, "
     "or choose another --out"),
    (lambda out, data: ["prepare", "--corpus", str(data / "train.bin"), "--out", str(out)],
     "{out} is not empty and is not a prepared data folder; pass --overwrite to replace it, "
     "or choose another --out"),
    (lambda out, data: ["import-nanogpt", "ckpt.pt", "--out", str(out)],
     "{out} is not empty; pass --overwrite to replace it, or choose another --out"),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "expected"), FOREIGN)
def test_commands_refuse_a_folder_they_did_not_write(
    attnlab,  # noqa: F811
    tiny_data: Path,
    tmp_path: Path,
    argv,
    expected,
):
    out = _thesis(tmp_path)
    before = snapshot(tmp_path)
    args = argv(out, tiny_data)
    p = attnlab(*args)
    assert error_line(p, args[0]).startswith(expected.format(out=out))
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("command", ["train", "demo", "prepare", "import-nanogpt"])
def test_an_out_that_is_a_file_is_refused(attnlab, tiny_data: Path, tmp_path: Path, command):  # noqa: F811
    out = tmp_path / "notes.txt"
    out.write_text("notes")
    args = {
        "train": ["train", "--data", str(tiny_data), "--out", str(out), "max_iters=1"],
        "demo": ["demo", "--out", str(out)],
        "prepare": ["prepare", "--corpus", str(out), "--out", str(out)],
        "import-nanogpt": ["import-nanogpt", "ckpt.pt", "--out", str(out)],
    }[command]
    p = attnlab(*args)
    assert error_line(p, command) == f"{out} exists and is not a folder; choose another --out"
    assert out.read_text() == "notes" and sorted(tmp_path.iterdir()) == [out]


def test_sft_refuses_a_folder_it_did_not_write(attnlab, model_dir: Path, tmp_path: Path):  # noqa: F811
    out = _thesis(tmp_path)
    before = snapshot(tmp_path)
    p = attnlab("sft", str(model_dir), "--out", str(out), "max_iters=1", "device=cpu")
    assert (
        error_line(p, "sft") == f"{out} is not empty and is not a run folder; choose another --out"
    )
    assert snapshot(tmp_path) == before


def test_a_trainer_made_in_code_refuses_a_folder_it_did_not_write(tiny_data: Path, tmp_path: Path):
    """Only the CLI checked: ``Trainer(folder, ...)`` on a folder with a metrics.csv of the
    user's deleted it when the run started."""
    from conftest import tiny_model, tiny_train

    from attnlab.train.trainer import Trainer

    out = _thesis(tmp_path)
    (out / "metrics.csv").write_text("step,loss\n1,0.5\n")
    before = snapshot(tmp_path)
    with pytest.raises(AttnlabError) as err:
        Trainer(out, tiny_model(), tiny_train(max_iters=1), tiny_data, quiet=True)
    assert str(err.value) == f"{out} is not empty and is not a run folder; choose another --out"
    assert snapshot(tmp_path) == before


def test_prepare_on_a_full_disk_keeps_the_previous_data(
    attnlab,  # noqa: F811
    tmp_path: Path,
    monkeypatch,
):
    from attnlab.data import prepare

    (tmp_path / "a.txt").write_text("to be or not to be\n" * 50)
    out = tmp_path / "data"
    assert (
        attnlab("prepare", "--corpus", str(tmp_path / "a.txt"), "--out", str(out)).returncode == 0
    )
    before = snapshot(tmp_path)

    class FillsUp(prepare.TokenWriter):
        def write(self, ids) -> None:
            if self.path.name == "val.bin":
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.path))
            super().write(ids)

    monkeypatch.setattr(prepare, "TokenWriter", FillsUp)
    p = attnlab(
        "prepare", "--corpus", str(tmp_path / "a.txt"), "--out", str(out), "--val-fraction", "0.2"
    )
    assert p.returncode == 2 and "Traceback" not in p.stderr  # progress lines, then the error
    assert p.stderr.splitlines()[-1] == (
        f"attnlab prepare: error: no space left on device while writing {out}; nothing was lost"
    )
    assert snapshot(tmp_path) == before


def test_train_overwrite_swaps_in_a_finished_run_only(
    attnlab,  # noqa: F811
    tiny_data: Path,
    tmp_path: Path,
):
    from test_bad_input import TINY

    run = tmp_path / "run"
    train = ["train", "--data", str(tiny_data), "--out", str(run), *TINY]
    assert attnlab(*train).returncode == 0
    (run / ".attnlab.lock").write_text(
        "12345\n"
    )  # as a finished trainer in another process left it
    before = snapshot(tmp_path)
    p = attnlab(*train, "seed=7")
    assert error_line(p, "train") == (
        f"{run} already holds a run; use --resume, --overwrite or another --out"
    )
    # a new run that fails (block_size beyond the data) leaves the old one whole
    p = attnlab(*train, "--overwrite", "block_size=100000")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert snapshot(tmp_path) == before
    p = attnlab(*train, "--overwrite", "seed=7")
    assert p.returncode == 0, p.stderr
    assert json.loads((run / "config.json").read_text())["train"]["seed"] == 7
    assert sorted(q.name for q in tmp_path.iterdir()) == ["run"]


def test_an_attnlab_home_that_is_a_file_is_named(attnlab, tmp_path: Path, monkeypatch):  # noqa: F811
    home = tmp_path / "home"
    home.write_text("not a folder")
    monkeypatch.setenv("ATTNLAB_HOME", str(home))
    p = attnlab("prepare")
    assert error_line(p, "prepare") == (
        f"{home / 'data' / 'shakespeare-char'}: Not a directory; choose another ATTNLAB_HOME"
    )
    assert home.read_text() == "not a folder"


@pytest.mark.parametrize("command", ["prepare", "import-nanogpt"])
def test_an_out_holding_the_commands_own_input_is_refused_even_with_overwrite(
    attnlab,  # noqa: F811
    tmp_path: Path,
    command: str,
) -> None:
    """--overwrite replaced the folder whole, the input the command had just read with it."""
    out = tmp_path / "project"
    out.mkdir()
    source = out / ("corpus.txt" if command == "prepare" else "ckpt.pt")
    source.write_text("my only copy " * 1000)
    before = snapshot(tmp_path)
    args = ["--corpus", str(source)] if command == "prepare" else [str(source)]
    p = attnlab(command, *args, "--out", str(out), "--overwrite")
    assert error_line(p, command) == (
        f"--out {out} would replace the source {source}; choose another --out"
    )
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("case", ["out-is-data", "out-holds-data", "out-holds-config"])
def test_train_overwrite_never_deletes_its_own_inputs(
    attnlab,  # noqa: F811
    tiny_data: Path,
    tmp_path: Path,
    case: str,
) -> None:
    """`train --data D --out D --overwrite` replaced the prepared data with the run (and a
    parent of --data or of --config went with everything in it)."""
    import shutil

    from test_bad_input import TINY

    work = tmp_path / "work"
    data = work / "data"
    shutil.copytree(tiny_data, data)
    config = work / "cfg" / "run.toml"
    config.parent.mkdir()
    config.write_text("[train]\nmax_iters = 2\n")
    out, source = {
        "out-is-data": (data, data),
        "out-holds-data": (work, data),
        "out-holds-config": (config.parent, config),
    }[case]
    before = snapshot(tmp_path)
    p = attnlab("train", "--data", str(data), "--config", str(config), "--out", str(out),
                "--overwrite", *TINY)  # fmt: skip
    assert error_line(p, "train") == (
        f"--out {out} would replace the source {source}; choose another --out"
    )
    assert snapshot(tmp_path) == before


def test_train_overwrite_refuses_a_run_another_trainer_holds(
    attnlab,  # noqa: F811
    tiny_data: Path,
    tmp_path: Path,
) -> None:
    """--overwrite swapped a folder away under a running trainer: the two runs' files mixed."""
    from test_bad_input import TINY

    from attnlab.rundir import RunLock

    run = tmp_path / "run"
    assert attnlab("train", "--data", str(tiny_data), "--out", str(run), *TINY).returncode == 0
    with RunLock(run):  # as a trainer resuming it would hold it
        before = snapshot(tmp_path)
        p = attnlab("train", "--data", str(tiny_data), "--out", str(run), "--overwrite", *TINY)
        assert error_line(p, "train") == (
            f"{run} is in use by another trainer (PID {os.getpid()}); wait for it to finish or "
            "stop it, or choose another folder"
        )
        assert snapshot(tmp_path) == before


def test_demo_overwrite_never_deletes_the_data_it_trains_on(
    attnlab,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from attnlab.data.prepare import default_data_dir

    monkeypatch.setenv("ATTNLAB_HOME", str(tmp_path / "home"))
    data = default_data_dir("char", corpus="shakespeare_char")  # the default preset's data
    data.mkdir(parents=True)
    (data / "meta.json").write_text("{}")
    before = snapshot(tmp_path)
    p = attnlab("demo", "--out", str(data.parent), "--overwrite")
    assert error_line(p, "demo") == (
        f"--out {data.parent} would replace the source {data}; choose another --out"
    )
    assert snapshot(tmp_path) == before


# a demo model small enough that training and sampling take moments
TINY_DEMO = ["max_iters=1", "eval_iters=1", "n_layer=1", "n_head=2", "n_embd=32", "block_size=32"]


@pytest.fixture(scope="module")
def previous_demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run folder as `attnlab demo` leaves it (TensorBoard on, so with its tb/ too)."""
    from attnlab.cli import main

    out = tmp_path_factory.mktemp("previous") / "demo"
    assert main(["demo", "--out", str(out), *TINY_DEMO]) == 0
    return out


@pytest.mark.parametrize("added", ["analysis/.attnlab-analysis", "README.md", "best/notes.txt"])
def test_demo_refuses_a_previous_demo_run_with_something_added(
    attnlab,  # noqa: F811
    previous_demo: Path,
    tmp_path: Path,
    added: str,
) -> None:
    """`attnlab analyze names runs/demo` writes runs/demo/analysis/ (the README's default), a user
    adds a README.md beside the run or notes to a checkpoint: the next demo deleted them all, as
    it looked only at its mark."""
    out = tmp_path / "demo"
    shutil.copytree(previous_demo, out)
    (out / added).parent.mkdir(exist_ok=True)
    (out / added).write_text("mine")
    before = snapshot(tmp_path)
    p = attnlab("demo", "--out", str(out), *TINY_DEMO)
    assert error_line(p, "demo") == (
        f"{out} is not empty and is not a demo run; pass --overwrite to replace it, "
        "or choose another --out"
    )
    assert snapshot(tmp_path) == before


def test_demo_replaces_a_previous_demo_run(
    attnlab,  # noqa: F811
    previous_demo: Path,
    tmp_path: Path,
) -> None:
    out = tmp_path / "demo"
    shutil.copytree(previous_demo, out)
    assert {".attnlab-demo", ".attnlab.lock", "latest", "best", "tb"} <= {
        p.name for p in out.iterdir()
    }
    p = attnlab("demo", "--out", str(out), *TINY_DEMO, "tensorboard=false")
    assert p.returncode == 0, p.stderr
    assert (out / ".attnlab-demo").is_file() and not (out / "tb").exists()  # replaced whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo"]
