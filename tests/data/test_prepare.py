"""`prepare` / `load_dataset` through the Python API and the `attnlab prepare` CLI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from attnlab.data.prepare import default_data_dir, load_dataset, prepare
from attnlab.errors import AttnlabError

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def tiny_corpus(tmp_path) -> Path:
    folder = tmp_path / "corpus"
    folder.mkdir()
    for name in ("one", "two"):
        lines = (f"{name}: line {i}, to be or not to be\n" for i in range(20))
        (folder / f"{name}.txt").write_text("".join(lines))
    return folder


def cli(*args: str, home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "ATTNLAB_HOME": str(home), "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "attnlab", "prepare", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


@pytest.mark.parametrize("tokenizer", ["char", "bpe", "bytebpe"])
def test_prepare_and_load_tiny_corpus(tmp_path, tiny_corpus: Path, tokenizer: str) -> None:
    vocab_size = {"char": None, "bpe": 40, "bytebpe": 300}[tokenizer]
    out = prepare([str(tiny_corpus)], tokenizer, vocab_size, tmp_path / "data")
    assert sorted(p.name for p in out.iterdir()) == [
        ".attnlab-manifest.json",  # what prepare wrote (attnlab.fsutil)
        "meta.json",
        "tokenizer.json",
        "train.bin",
        "val.bin",
    ]
    ds = load_dataset(out)
    assert ds.meta["tokenizer"] == tokenizer and ds.meta["dtype"] == "uint16"
    assert ds.meta["vocab_size"] == ds.tokenizer.vocab_size
    assert len(ds.train) == ds.meta["train_tokens"] and len(ds.val) == ds.meta["val_tokens"]
    assert [d["title"] for d in ds.meta["provenance"]["documents"]] == ["one.txt", "two.txt"]
    val_text = ds.tokenizer.decode(np.asarray(ds.val).tolist())
    if tokenizer != "bpe":  # char and bytebpe are lossless
        assert (
            val_text
            == "one: line 18, to be or not to be\none: line 19, to be or not to be\n\n"
            + ("two: line 18, to be or not to be\ntwo: line 19, to be or not to be\n")
        )
    assert "line 18" in val_text and "line 17" not in val_text


def test_prepare_replaces_only_prepared_folders(tmp_path, tiny_corpus: Path) -> None:
    out = prepare([str(tiny_corpus)], out=tmp_path / "data")
    prepare([str(tiny_corpus)], out=out, val_fraction=0.2)  # replacing our own folder is fine
    assert json.loads((out / "meta.json").read_text())["provenance"]["val_fraction"] == 0.2
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no leftovers
    (tmp_path / "precious").mkdir()
    (tmp_path / "precious" / "notes.txt").write_text("keep me")
    with pytest.raises(AttnlabError, match="not a prepared data folder"):
        prepare([str(tiny_corpus)], out=tmp_path / "precious")
    assert (tmp_path / "precious" / "notes.txt").read_text() == "keep me"


def test_default_dirs_follow_attnlab_home(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("ATTNLAB_HOME", str(tmp_path))
    assert default_data_dir() == tmp_path / "data" / "shakespeare-char"
    assert default_data_dir("bpe") == tmp_path / "data" / "shakespeare-bpe16384"
    assert default_data_dir("bytebpe", 4096) == tmp_path / "data" / "shakespeare-bytebpe4096"
    with pytest.raises(AttnlabError, match="bpe tokenizers only"):
        default_data_dir("char", 100)
    with pytest.raises(AttnlabError, match="--out"):
        prepare(["some/folder"])


def test_load_dataset_default_prepares_the_embedded_corpus_once(
    monkeypatch, tmp_path, caplog
) -> None:
    monkeypatch.setenv("ATTNLAB_HOME", str(tmp_path))
    with caplog.at_level("INFO", logger="attnlab"):  # the library reports through logging
        ds = load_dataset()
    assert "preparing the shipped corpus 'shakespeare'" in caplog.text
    assert ds.dir == tmp_path / "data" / "shakespeare-char"
    assert ds.meta["provenance"]["name"] == "shakespeare" and ds.tokenizer.kind == "char"
    assert 0.09 < len(ds.val) / (len(ds.train) + len(ds.val)) < 0.11
    assert ds.tokenizer.decode(ds.train[:9].tolist()) == "ALL'S WEL"
    caplog.clear()
    with caplog.at_level("INFO", logger="attnlab"):
        load_dataset()
    assert caplog.text == ""  # second use loads what is there


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda d: (d / "val.bin").unlink(), r"val\.bin: token file not found"),
        (lambda d: (d / "meta.json").write_text("{"), r"meta\.json: unreadable"),
        (lambda d: (d / "tokenizer.json").unlink(), r"tokenizer\.json: tokenizer file not found"),
        (lambda d: (d / "train.bin").write_bytes(b"\xff\xff"), r"train\.bin: 1 tokens, meta"),
    ],
)
def test_load_dataset_names_missing_or_corrupt_files(
    tmp_path, tiny_corpus: Path, damage, message: str
) -> None:
    out = prepare([str(tiny_corpus)], out=tmp_path / "data")
    damage(out)
    with pytest.raises(AttnlabError, match=message):
        load_dataset(out)


def test_cli_prepare_prints_a_summary(tmp_path, tiny_corpus: Path) -> None:
    result = cli("--corpus", str(tiny_corpus), "--out", str(tmp_path / "d"), home=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "custom (2 documents)" in result.stdout and "char vocab" in result.stdout
    assert str(tmp_path / "d") in result.stdout
    assert (tmp_path / "d" / "meta.json").is_file()


def test_cli_offers_every_tokenizer() -> None:
    from attnlab.cli import build_parser
    from attnlab.data.prepare import TOKENIZERS

    parser = build_parser()
    for kind in TOKENIZERS:
        assert parser.parse_args(["prepare", "--tokenizer", kind]).tokenizer == kind
    with pytest.raises(SystemExit):
        parser.parse_args(["prepare", "--tokenizer", "wordpiece"])


@pytest.mark.parametrize(
    ("content", "message"),
    [(None, "no such file"), (b"", "empty corpus"), (b"\xff\xfe bad\n", "not UTF-8")],
)
def test_bad_corpus_is_one_line_error(tmp_path, content: bytes | None, message: str) -> None:
    path = tmp_path / "input.txt"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(AttnlabError, match=message):
        prepare([str(path)], out=tmp_path / "api")
    result = cli("--corpus", str(path), "--out", str(tmp_path / "d"), home=tmp_path)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert (
        result.stderr.count("\n") == 1 and str(path) in result.stderr and message in result.stderr
    )
    assert not (tmp_path / "d").exists() and not (tmp_path / "api").exists()


def _tree(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize("source", ["text", "shakespeare", "hf:no-such/dataset"])
def test_val_fraction_outside_0_1_is_refused_before_reading(
    tmp_path, tiny_corpus: Path, source: str
) -> None:
    # 0 wrote an empty val.bin: train refused it later and eval had nothing to score
    corpus = str(tiny_corpus) if source == "text" else source
    before = _tree(tmp_path)
    args = ("--corpus", corpus, "--out", str(tmp_path / "d"), "--val-fraction", "0")
    result = cli(*args, home=tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (
        "attnlab prepare: error: val_fraction must be in (0, 1): the share of each document "
        "held out for validation, got 0.0\n"
    )
    assert _tree(tmp_path) == before
    for fraction in (0.0, 1.0, -0.1, float("nan")):
        with pytest.raises(AttnlabError, match=rf"\(0, 1\).*, got {fraction}$"):
            prepare([corpus], out=tmp_path / "api", val_fraction=fraction)
        assert _tree(tmp_path) == before


def test_a_split_of_fewer_than_2_tokens_is_refused(tmp_path) -> None:
    # the held-out last line "x" is one whitespace-split word: a single bpe token
    corpus = tmp_path / "c.txt"
    corpus.write_text("to be or not to be that is the question\nwhether tis nobler\nx\n")
    before = _tree(tmp_path)
    with pytest.raises(AttnlabError) as err:
        prepare([str(corpus)], "bpe", 40, tmp_path / "d", val_fraction=0.01)
    assert str(err.value) == (
        f"{corpus}: the val split has 1 token(s), need at least 2; add text or raise --val-fraction"
    )
    assert _tree(tmp_path) == before
    prepare([str(corpus)], "char", None, tmp_path / "d", val_fraction=0.01)  # "x\n": 2 chars
    assert json.loads((tmp_path / "d" / "meta.json").read_text())["val_tokens"] == 2


def _no_network(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """No name resolves (as on a machine without network), and the libraries' retries do not
    wait between attempts; returns the list of waits they asked for."""
    import socket
    import time

    def unreachable(*args, **kwargs):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", unreachable)
    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)
    for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    return slept


def _hf_logs_to_stderr(monkeypatch: pytest.MonkeyPatch) -> None:
    """The libraries' own handlers, on this test's stderr: they keep the stream of the test that
    imported them first, which may since be closed."""
    import logging

    for name in ("datasets", "huggingface_hub"):
        handler = logging.StreamHandler(sys.stderr)
        monkeypatch.setattr(logging.getLogger(name), "handlers", [handler])


def test_hf_source_offline_is_one_line(
    tmp_path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("datasets")
    from attnlab.cli import main

    slept = _no_network(monkeypatch)
    _hf_logs_to_stderr(monkeypatch)
    source = "hf:attnlab-tests/no-such-dataset"  # never in a cache: the hub must be asked
    before = _tree(tmp_path)
    assert main(["prepare", "--corpus", source, "--out", str(tmp_path / "d")]) == 2
    out, err = capfd.readouterr()
    # online, the libraries log "... thrown while requesting HEAD ..." and "Retrying in 1s"
    assert out == "" and err.count("\n") == 1, err
    assert err == (
        f"attnlab prepare: error: {source}: cannot load from Hugging Face: huggingface.co does "
        "not resolve (no network?) and it is not in the local cache\n"
    )
    assert _tree(tmp_path) == before
    assert slept == []  # offline mode from the start: no retries to wait for
    import datasets
    from huggingface_hub import constants

    assert not datasets.config.HF_HUB_OFFLINE and not constants.HF_HUB_OFFLINE  # restored


def test_hf_source_online_keeps_the_libraries_log(
    tmp_path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    datasets = pytest.importorskip("datasets")
    import logging

    def loads_and_warns(name, config, split):
        logging.getLogger("datasets.load").warning("a warning from the library")
        return datasets.Dataset.from_dict({"text": ["first line", "second line", "third"]})

    monkeypatch.setattr(datasets, "load_dataset", loads_and_warns)
    _hf_logs_to_stderr(monkeypatch)
    prepare(["hf:some/dataset"], out=tmp_path / "d", val_fraction=0.3)
    assert capfd.readouterr().err == "a warning from the library\n"  # passed on once loaded
    ds = load_dataset(tmp_path / "d")
    assert ds.tokenizer.decode(ds.train.tolist()) == "first line\nsecond line\n"


@pytest.mark.parametrize(
    ("then", "expected"),
    [
        ({"train_tokens": 90, "val_tokens": 10, "val_sha256": "a"}, None),
        ({"train_tokens": 90, "val_tokens": 10, "val_sha256": "b"}, "its val tokens differ "
         "(another sha256, the same 90 train / 10 val tokens)"),  # said "90 then, 90 now"
        ({"train_tokens": 80, "val_tokens": 20}, "its train and val tokens differ: 80 train / 20 "
         "val then, 90 / 10 now"),
        ({"train_tokens": "x"}, "its train tokens differ"),  # a hand-edited record
        ({}, None),  # a run from before runs recorded their data
        ({"train_tokens": 90, "val_tokens": 10, "train_ids_sha256": "i"}, None),
        ({"train_tokens": 90, "val_tokens": 10, "train_ids_sha256": "j"}, "its train tokens "
         "differ (another sha256, the same 90 train / 10 val tokens)"),  # the same text, other ids
        ({"train_tokens": 90, "val_tokens": 10, "val_ids_sha256": "v"}, None),  # not recorded now
    ],
)  # fmt: skip
def test_fingerprint_change_says_which_split_changed(then: dict, expected: str | None) -> None:
    from attnlab.data.prepare import fingerprint_change

    now = {"train_tokens": 90, "val_tokens": 10, "train_sha256": "t", "val_sha256": "a"}
    now["train_ids_sha256"] = "i"
    assert fingerprint_change(then, now) == expected


def test_bpe_prepare_is_the_same_in_every_process(tmp_path: Path) -> None:
    """Two `prepare --tokenizer bpe` processes write byte-identical folders: the library's
    trainer alone numbered its "##" pieces in hash-map order, so every process broke ties
    between equally frequent merges its own way (other merges, other ids, the same text)."""
    import hashlib

    from attnlab.data.corpus import nanogpt_char_text

    corpus = tmp_path / "shk.txt"
    corpus.write_text(nanogpt_char_text()[:200_000], encoding="utf-8")
    folders = []
    for name in ("a", "b"):
        out = tmp_path / name
        done = cli("--corpus", str(corpus), "--tokenizer", "bpe", "--vocab-size", "400", "--out", str(out),
                   home=tmp_path / "home")  # fmt: skip
        assert done.returncode == 0, done.stderr
        folders.append({f.name: f.read_bytes() for f in sorted(out.iterdir())})
    assert folders[0] == folders[1]
    meta = json.loads(folders[0]["meta.json"])
    for split in ("train", "val"):  # the token files' own hashes, as meta.json records them
        assert meta[f"{split}_ids_sha256"] == hashlib.sha256(folders[0][f"{split}.bin"]).hexdigest()


def test_tokenizer_from_rebuilds_a_data_folders_bins_exactly(tmp_path: Path) -> None:
    """A folder prepared on another machine (its bins gone, its tokenizer.json kept) comes back
    byte for byte, and a new text can be encoded in a model's vocabulary."""
    from attnlab.data.corpus import nanogpt_char_text

    corpus = tmp_path / "shk.txt"
    corpus.write_text(nanogpt_char_text()[:100_000], encoding="utf-8")
    home = tmp_path / "home"
    made = cli("--corpus", str(corpus), "--tokenizer", "bpe", "--vocab-size", "300",
               "--out", str(tmp_path / "a"), home=home)  # fmt: skip
    assert made.returncode == 0, made.stderr
    again = cli("--corpus", str(corpus), "--tokenizer-from", str(tmp_path / "a"),
                "--out", str(tmp_path / "b"), home=home)  # fmt: skip
    assert again.returncode == 0, again.stderr
    for name in ("train.bin", "val.bin", "tokenizer.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    meta = json.loads((tmp_path / "b" / "meta.json").read_text())
    assert meta["tokenizer"] == "bpe" and meta["tokenizer_from"]["path"] == str(tmp_path / "a")
    assert "tokenizer_sample" not in meta


LEAVE_OUT = (
    "--tokenizer-from encodes with the given tokenizer: leave out --tokenizer, --vocab-size and "
    "--tokenizer-sample"
)


@pytest.mark.parametrize(
    ("extra", "expected"),
    [(["--tokenizer", "bpe"], LEAVE_OUT),
     (["--tokenizer", "char"], LEAVE_OUT),  # the default named: was taken for the default
     (["--tokenizer-sample", "10"], LEAVE_OUT),
     (["--no-out"], "--tokenizer-from needs an output folder (--out)"),
     (["--out-is-source"], "--out {tmp}/tok/d is the folder --tokenizer-from reads, which it "
      "would replace; name another folder"),
     (["--from", "missing"], "{tmp}/missing: tokenizer file not found; name a tokenizer.json, "
      "or a data, run or model folder that holds one"),
     (["--from", "wordlevel.json"], "{tmp}/wordlevel.json: a WordLevel tokenizer whose tokens "
      "are not all single characters: attnlab reads char (WordLevel of characters), bpe and "
      "byte-level bpe tokenizers")],
)  # fmt: skip
def test_tokenizer_from_refusals(tmp_path: Path, tiny_corpus: Path, extra, expected) -> None:
    import tokenizers
    from test_folder_safety import snapshot

    (tmp_path / "tok").mkdir()
    prepare([str(tiny_corpus)], out=tmp_path / "tok" / "d")
    words = tokenizers.Tokenizer(tokenizers.models.WordLevel({"ab": 0, "c": 1}, unk_token="c"))
    words.save(str(tmp_path / "wordlevel.json"))
    source = tmp_path / "tok" / "d"
    if "--from" in extra:
        source, extra = tmp_path / extra[1], []
    args = ["--corpus", str(tiny_corpus), "--tokenizer-from", str(source)]
    if extra == ["--no-out"]:
        extra = []
    elif extra == ["--out-is-source"]:
        args, extra = [*args, "--out", str(source)], []
    else:
        args += ["--out", str(tmp_path / "new")]
    before = snapshot(tmp_path)
    p = cli(*args, *extra, home=tmp_path / "home")
    assert p.returncode == 2 and p.stderr.splitlines() == [
        "attnlab prepare: error: " + expected.format(tmp=tmp_path)
    ]
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("tokenizer", ["char", "bpe"])
def test_tokenizer_from_refuses_text_the_tokenizer_cannot_encode(
    tmp_path: Path, tiny_corpus: Path, tokenizer: str
) -> None:
    """A char tokenizer has no id for a character it never saw, and a bpe encoded each as
    <unk>: a whole corpus of another alphabet became one id, accepted. One line, nothing
    written."""
    from test_folder_safety import snapshot

    vocab = {"bpe": 60}.get(tokenizer)
    prepare([str(tiny_corpus)], tokenizer, vocab, out=tmp_path / "d")
    other = tmp_path / "other.txt"
    other.write_text("zebra quiz\n" * 30)
    before = snapshot(tmp_path)
    p = cli("--corpus", str(other), "--tokenizer-from", str(tmp_path / "d"),
            "--out", str(tmp_path / "new"), home=tmp_path / "home")  # fmt: skip
    assert p.returncode == 2 and p.stderr.splitlines() == [
        f"attnlab prepare: error: 4 character(s) of {other} are not in --tokenizer-from's "
        "vocabulary: 'a', 'q', 'u', 'z'; leave out --tokenizer-from to learn this corpus's own"
    ]
    assert snapshot(tmp_path) == before


def test_tokenizer_from_a_run_folder_reads_its_checkpoints_tokenizer(
    tmp_path: Path, tiny_corpus: Path
) -> None:
    prepare([str(tiny_corpus)], out=tmp_path / "d")
    (tmp_path / "run" / "latest").mkdir(parents=True)
    shutil.copy(tmp_path / "d" / "tokenizer.json", tmp_path / "run" / "latest")
    p = cli("--corpus", str(tiny_corpus), "--tokenizer-from", str(tmp_path / "run"),
            "--out", str(tmp_path / "new"), home=tmp_path / "home")  # fmt: skip
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "new" / "train.bin").read_bytes() == (
        tmp_path / "d" / "train.bin"
    ).read_bytes()


@pytest.mark.parametrize(
    ("folder", "extra", "shipped"),
    [("shakespeare_char", [], "shakespeare_char"),
     ("shakespeare-char", ["--val-fraction", "0.2"], "shakespeare"),
     ("shakespeare-bpe2048", ["--tokenizer", "bpe", "--vocab-size", "300"], "shakespeare (bpe, vocab 2048)")],
)  # fmt: skip
def test_prepare_refuses_other_data_in_a_shipped_corpuss_folder(
    tmp_path: Path, tiny_corpus: Path, folder: str, extra: list[str], shipped: str
) -> None:
    """Other text, another split or tokenizer written where a shipped corpus is kept was
    trained on by every preset and study as that corpus, without a word."""
    from test_folder_safety import snapshot

    home = tmp_path / "home"
    (home / "data").mkdir(parents=True)
    source = ["shakespeare"] if "--val-fraction" in extra else [str(tiny_corpus)]
    out = home / "data" / folder
    before = snapshot(tmp_path)
    p = cli("--corpus", *source, *extra, "--out", str(out), home=home)
    assert p.returncode == 2 and p.stderr.splitlines() == [
        f"attnlab prepare: error: --out {out} is where attnlab keeps the shipped corpus {shipped}, "
        "which presets and studies train on; name another folder"
    ]
    assert snapshot(tmp_path) == before


def test_a_shipped_corpuss_folder_holding_other_data_is_refused_when_loaded(
    tmp_path: Path, tiny_corpus: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One made so before prepare refused it (or copied there) is named, not trained on."""
    monkeypatch.setenv("ATTNLAB_HOME", str(tmp_path / "home"))
    folder = default_data_dir(corpus="shakespeare_char")
    prepare([str(tiny_corpus)], out=tmp_path / "mine")
    shutil.copytree(tmp_path / "mine", folder)
    meta = json.loads((folder / "meta.json").read_text())
    with pytest.raises(AttnlabError) as e:
        load_dataset(folder)
    assert str(e.value) == (
        f"{folder} is the folder of the shipped corpus shakespeare_char but holds "
        f"{meta['provenance']['name']} (char, vocab {meta['vocab_size']}, val fraction 0.1); "
        "move it away: the corpus is prepared there again on first use"
    )
    shutil.rmtree(folder)
    assert load_dataset(folder).meta["provenance"]["name"] == "shakespeare_char"  # made again
