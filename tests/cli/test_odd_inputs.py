"""Odd inputs of the data, tokenizer, fine-tuning, analysis and launch paths: a one-line
refusal naming what is wrong, or a line saying what was chosen; nothing on disk changed."""

from __future__ import annotations

import base64
import errno
import json
import shutil
from pathlib import Path

import pytest
from conftest import run_cli
from test_bad_input import error_line
from test_folder_safety import snapshot

from attnlab.data.chat import load_jsonl
from attnlab.errors import AttnlabError

TEXT = "the quick brown fox jumps over the lazy dog. " * 40


def _parquet(path: Path, **columns: list) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table(columns), path)


@pytest.mark.parametrize(
    ("values", "kind"), [([1, 2, 3], "int64"), ([["a"], ["b"], ["c"]], "list<element: string>")]
)
def test_a_parquet_text_column_of_non_strings_is_refused(tmp_path: Path, values, kind) -> None:
    """A TypeError deep in the tokenizer (integers, lists)."""
    _parquet(tmp_path / "t.parquet", text=values)
    before = snapshot(tmp_path)
    p = run_cli("prepare", "--corpus", str(tmp_path / "t.parquet"), "--out", str(tmp_path / "d"))
    assert error_line(p, "prepare") == (
        f"{tmp_path / 't.parquet'}: its text column holds {kind}, not strings"
    )
    assert snapshot(tmp_path) == before


def test_a_parquet_without_a_text_column_names_the_column_it_prepares(tmp_path: Path) -> None:
    """It prepared its first string column (a url) without a word."""
    _parquet(tmp_path / "t.parquet", id=[1, 2], url=["http://a", "http://b"], body=[TEXT, TEXT])
    p = run_cli("prepare", "--corpus", str(tmp_path / "t.parquet"), "--out", str(tmp_path / "d"))
    assert p.returncode == 0, p.stderr
    assert f"{tmp_path / 't.parquet'}: no column named text; preparing its column 'url'" in (
        p.stderr.splitlines()
    )


def test_a_tokenizer_json_that_panics_the_rust_library_is_one_line(
    tiny_data: Path, tmp_path: Path
) -> None:
    """A Precompiled normalizer with a crafted charsmap: pyo3's PanicException (a
    BaseException) and Rust's backtrace on stderr."""
    crafted = json.loads((tiny_data / "tokenizer.json").read_text())
    blob = base64.b64encode(b"\x06\x00\x00\x00ab").decode()
    crafted["normalizer"] = {"type": "Precompiled", "precompiled_charsmap": blob}
    (tmp_path / "tokenizer.json").write_text(json.dumps(crafted))
    (tmp_path / "c.txt").write_text(TEXT)
    before = snapshot(tmp_path)
    p = run_cli(
        "prepare", "--corpus", str(tmp_path / "c.txt"), "--tokenizer-from",
        str(tmp_path / "tokenizer.json"), "--out", str(tmp_path / "d"),
        env={"RUST_BACKTRACE": "1"},
    )  # fmt: skip
    assert error_line(p, "prepare") == (
        f'{tmp_path / "tokenizer.json"}: not a valid tokenizer.json (Precompiled: Error("Cannot '
        'parse precompiled_charsmap", line: 0, column: 0))'
    )
    assert snapshot(tmp_path) == before


def test_a_vocab_size_the_text_cannot_give_is_said(tmp_path: Path) -> None:
    (tmp_path / "c.txt").write_text("\n\n".join([TEXT] * 50))  # documents to split
    p = run_cli(
        "prepare", "--corpus", str(tmp_path / "c.txt"), "--tokenizer", "bpe", "--vocab-size",
        "50000", "--out", str(tmp_path / "d"),
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    vocab = json.loads((tmp_path / "d" / "meta.json").read_text())["vocab_size"]
    assert vocab < 50_000
    assert p.stderr.splitlines()[-1] == (
        f"attnlab prepare: --vocab-size 50,000 asked for, {vocab:,} learned: the text has no "
        "more pairs to merge (more text gives more)"
    )


def test_attnlab_home_naming_a_file_is_one_line(tmp_path: Path) -> None:
    """`train` without --data prepares the shipped corpus under ATTNLAB_HOME: a file there was
    a NotADirectoryError traceback. (A read-only mount fails the same mkdir; root writes one.)"""
    home = tmp_path / "home"
    home.write_text("not a folder")
    before = snapshot(tmp_path)
    p = run_cli(
        "train", "--out", str(tmp_path / "run"), "max_iters=1", env={"ATTNLAB_HOME": str(home)}
    )
    line = error_line(p, "train")
    assert line.startswith(f"cannot prepare the shipped corpus in {home / 'data'}")
    assert line.endswith(
        "(Not a directory): set ATTNLAB_HOME to a folder you can write, or pass --data"
    )
    assert snapshot(tmp_path) == before


def test_an_sft_record_with_a_pair_and_messages_is_refused(tmp_path: Path) -> None:
    """The prompt/response pair was dropped without a word."""
    path = tmp_path / "sft.jsonl"
    record = {
        "prompt": "hi",
        "response": "hello",
        "messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
    }
    path.write_text(json.dumps(record) + "\n")
    with pytest.raises(AttnlabError) as err:
        load_jsonl(path)
    assert str(err.value) == (
        f"{path}:1: holds both messages and prompt and response; give a record one or the other"
    )


def test_analyze_gates_out_inside_a_data_folder_is_refused(
    tiny_data: Path, train_tiny, tmp_path: Path
) -> None:
    """--out DATA/analysis wrote into a data folder (its next prepare deletes it)."""
    run, data = tmp_path / "run", tmp_path / "data"
    train_tiny(run, model={"use_m_gate": True}, max_iters=2, eval_interval=2)
    shutil.copytree(tiny_data, data)
    before = snapshot(tmp_path)
    p = run_cli("analyze", "gates", str(run), "--data", str(data), "--out", str(data / "analysis"))
    line = error_line(p, "analyze gates")
    assert line.startswith(f"--out {data / 'analysis'} is inside {data}, a ")
    assert snapshot(tmp_path) == before


def test_info_says_which_of_a_folder_and_a_preset_it_shows(train_tiny, tmp_path: Path) -> None:
    train_tiny(tmp_path / "shakespeare-char", max_iters=2, eval_interval=2)
    p = run_cli("info", "shakespeare-char", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stderr == (
        "attnlab info: shakespeare-char is a folder here and a preset; showing the folder (for "
        "the preset, run info where no folder has its name)\n"
    )


def test_an_overflowing_dist_timeout_is_refused_with_its_range(tiny_data: Path, tmp_path: Path):
    """1e300 s: an OverflowError per rank under torchrun."""
    before = snapshot(tmp_path)
    p = run_cli(
        "train", "--data", str(tiny_data), "--out", str(tmp_path / "r"), "dist_timeout=1e300"
    )
    assert error_line(p, "train").endswith(
        "dist_timeout=1e+300 must be at most 31,536,000 seconds (a year)"
    )
    assert snapshot(tmp_path) == before


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_a_full_disk_while_writing_shards_is_one_line(tmp_path: Path, monkeypatch) -> None:
    """Every rank's traceback ("No space left on device") under torchrun: one line each."""
    import torch
    import torch.distributed.checkpoint as dcp
    from conftest import tiny_model

    from attnlab.model import GPT
    from attnlab.train import fsdp

    def full(*args, **kwargs):
        raise dcp.api.CheckpointException(
            "save", {0: (OSError(errno.ENOSPC, "No space left on device"), None)}
        )

    monkeypatch.setattr(dcp, "save", full)
    model = GPT(tiny_model())
    with pytest.raises(AttnlabError) as err:
        fsdp.save_shards(model, torch.optim.AdamW(model.parameters()), tmp_path / "shards")
    assert str(err.value) == (
        f"no space left on device while writing {tmp_path / 'shards'}; nothing was lost"
    )
