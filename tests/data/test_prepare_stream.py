"""The streaming `prepare`: the split rule and the ids of encoding each split whole, in tiny
pieces; the BPE sample, the recorded largest id, progress, and the input formats."""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import lzma
import random
import sys
from pathlib import Path

import numpy as np
import pytest

from attnlab.cli import reporting
from attnlab.data import prepare as prepare_module
from attnlab.data import tokenizer as tokenizer_module
from attnlab.data.corpus import (
    CorpusStream,
    embedded_documents,
    load_corpus,
    nanogpt_char_text,
    split_document,
)
from attnlab.data.prepare import load_dataset, prepare
from attnlab.data.tokenizer import StreamEncoder, Tokenizer
from attnlab.errors import AttnlabError
from attnlab.fsutil import MANIFEST

# multi-byte characters (2, 3 and 4 bytes), Windows and old Mac line endings, a BOM, blank lines
PIECES = ["to be ", "or not", "\n", "\r\n", "\r", "é", "€", "😀", "\n\n", "\t", " ", "\ufeff"]


def reference(texts: list[str], val_fraction: float) -> tuple[str, str]:
    """The documented rule on whole texts: normalise, drop blank documents, split each at the
    line boundary nearest to its last val_fraction, join the parts with a blank line between."""
    docs = []
    for text in texts:
        text = text.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
        if text.strip():
            docs.append(text.rstrip("\n") + "\n")
    parts = [split_document(doc, val_fraction) for doc in docs]
    return "\n".join(t for t, _ in parts), "\n".join(v for _, v in parts if v)


def random_texts(rng: random.Random) -> list[str]:
    texts = []
    for _ in range(rng.randint(1, 4)):
        n = rng.choice([0, 1, 3, 12, 60])  # empty documents too
        texts.append(("\ufeff" if rng.random() < 0.2 else "") + "".join(rng.choices(PIECES, k=n)))
    return texts


def write_folder(folder: Path, texts: list[str]) -> Path:
    folder.mkdir()
    for i, text in enumerate(texts):
        (folder / f"{i:02d}.txt").write_bytes(text.encode("utf-8"))
    return folder


def streamed(sources: list[str], val_fraction: float, chunk: int) -> tuple[str, str]:
    corpus = CorpusStream(sources, val_fraction, chunk)
    corpus.scan()
    texts: dict[str, list[str]] = {"train": [], "val": []}
    for split, text in corpus.split_pieces():
        texts[split].append(text)
    return "".join(texts["train"]), "".join(texts["val"])


def test_the_split_rule_holds_whatever_the_chunk_size(tmp_path) -> None:
    # chunks of 1 to 7 bytes cut inside multi-byte characters, "\r\n" pairs and documents
    rng = random.Random(0)
    for trial in range(120):
        texts, val_fraction = random_texts(rng), rng.choice([0.1, 0.3, 0.5, 0.9])
        folder = write_folder(tmp_path / f"t{trial}", texts)
        train, val = reference(texts, val_fraction)
        for chunk in (1, 2, 3, 5, 7, 1 << 20):
            if not (train + val).strip() or not val:  # the one-line errors, tested below
                with pytest.raises(AttnlabError, match=r"empty corpus|too little text"):
                    streamed([str(folder)], val_fraction, chunk)
                continue
            assert streamed([str(folder)], val_fraction, chunk) == (train, val), (texts, chunk)


def test_the_split_of_a_long_document_read_in_small_chunks(tmp_path) -> None:
    # one file of many lines: the cut is found while reading, far from the chunk boundaries
    text = "".join(f"line {i} {'é' * (i % 5)} {'😀' * (i % 3)}\n" for i in range(3000))
    (tmp_path / "one.txt").write_text(text, encoding="utf-8")
    for chunk in (13, 4096):
        assert streamed([str(tmp_path / "one.txt")], 0.1, chunk) == reference([text], 0.1)
    corpus = CorpusStream([str(tmp_path / "one.txt")], 0.1, 13)
    corpus.scan()
    train, val = reference([text], 0.1)
    assert (corpus.train_bytes, corpus.val_bytes) == (len(train.encode()), len(val.encode()))
    assert corpus.characters == "".join(sorted(set(text)))


def test_load_corpus_is_the_stream_in_memory() -> None:
    corpus = load_corpus(val_fraction=0.2)
    texts = [text for _, text in embedded_documents()]
    assert (corpus.train_text, corpus.val_text) == reference(texts, 0.2)
    assert streamed(["shakespeare"], 0.2, 5000) == reference(texts, 0.2)
    nano = load_corpus(["shakespeare_char"])
    text = nanogpt_char_text()
    cut = int(len(text) * 0.9)
    assert (nano.train_text, nano.val_text) == (text[:cut], text[cut:])  # untouched, head/tail


@pytest.fixture
def tiny_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    """Encode in pieces of a few characters, two per batch: every cut rule is exercised."""
    monkeypatch.setattr(tokenizer_module, "PIECE_CHARS", 7)
    monkeypatch.setattr(tokenizer_module, "BATCH_PIECES", 2)


def mixed_corpus(folder: Path) -> list[str]:
    """Documents with multi-byte characters, runs of blank lines and spaces, an empty one."""
    rng = random.Random(1)
    words = ["to", "be", "or", "not", "café", "naïve", "€5", "😀", "it's", ",", "."]
    texts = []
    for n in (200, 0, 120, 80):
        lines = (
            " ".join(rng.choices(words, k=rng.randint(0, 9))) + rng.choice(["", " ", "  ", "\n"])
            for _ in range(n)
        )
        texts.append("\n".join(lines))
    write_folder(folder, texts)
    return texts


@pytest.mark.parametrize("tokenizer", ["char", "bpe", "bytebpe"])
def test_bins_are_the_ids_of_each_split_encoded_whole(
    tmp_path, tiny_pieces: None, tokenizer: str
) -> None:
    texts = mixed_corpus(tmp_path / "corpus")
    vocab = {"char": None, "bpe": 60, "bytebpe": 300}[tokenizer]
    out = prepare([str(tmp_path / "corpus")], tokenizer, vocab, tmp_path / "data", chunk=11)
    ds = load_dataset(out)
    train, val = reference(texts, 0.1)
    assert ds.train.tolist() == ds.tokenizer.encode(train)
    assert ds.val.tolist() == ds.tokenizer.encode(val)
    assert ds.meta["max_token_id"] == max(ds.train.max(), ds.val.max())
    assert [d["title"] for d in ds.meta["provenance"]["documents"]] == [
        "00.txt",
        "02.txt",
        "03.txt",
    ]
    if tokenizer == "char":  # nanoGPT's vocabulary: the sorted characters of both splits
        assert ds.tokenizer.decode(list(range(ds.tokenizer.vocab_size))) == "".join(
            sorted(set(train + val))
        )


def sample_lines(folder: Path, max_bytes: int, keepends: bool) -> list[str]:
    """The lines BPE learns on, as prepare draws them."""
    corpus = CorpusStream([str(folder)])
    corpus.scan()
    sample = prepare_module._Sample(corpus, max_bytes, keepends, lambda n: None)
    return [line for batch in sample for line in batch]


@pytest.mark.parametrize("tokenizer", ["bpe", "bytebpe"])
def test_a_corpus_smaller_than_the_sample_trains_bpe_as_before(tmp_path, tokenizer: str) -> None:
    texts = mixed_corpus(tmp_path / "corpus")
    train, _ = reference(texts, 0.1)
    out = prepare([str(tmp_path / "corpus")], tokenizer, 300, tmp_path / "data")
    meta = json.loads((out / "meta.json").read_text())
    assert meta["tokenizer_sample"] == {
        "max_bytes": prepare_module.DEFAULT_TOKENIZER_SAMPLE,
        "seed": prepare_module.SAMPLE_SEED,
        "bytes": len(train.encode()),
        "train_bytes": len(train.encode()),
    }
    keepends = tokenizer == "bytebpe"
    lines = sample_lines(tmp_path / "corpus", prepare_module.DEFAULT_TOKENIZER_SAMPLE, keepends)
    assert lines == train.splitlines(keepends=keepends)  # what training on the whole text reads
    if tokenizer == "bytebpe":  # (bpe's training numbers its "##" alphabet in hash order, so
        # two trainings on one text differ: the library's, at any size)
        whole = Tokenizer.train_byte_bpe(train, 300)
        assert (out / "tokenizer.json").read_text() == whole.hf.to_str(pretty=True)


@pytest.mark.parametrize("tokenizer", ["bpe", "bytebpe"])
def test_bpe_learns_on_a_bounded_seeded_sample(tmp_path, monkeypatch, tokenizer: str) -> None:
    monkeypatch.setattr(prepare_module, "SAMPLE_BLOCK", 200)
    texts = mixed_corpus(tmp_path / "corpus")
    out = prepare(
        [str(tmp_path / "corpus")], tokenizer, 300, tmp_path / "data", tokenizer_sample=2000
    )
    sample = json.loads((out / "meta.json").read_text())["tokenizer_sample"]
    # blocks of about 200 characters, spread evenly over the train text, until 2,000 bytes
    assert sample["max_bytes"] == 2000 and 1000 < sample["bytes"] < 2000 + 400
    assert sample["bytes"] < sample["train_bytes"] == len(reference(texts, 0.1)[0].encode())
    keepends = tokenizer == "bytebpe"
    lines = sample_lines(tmp_path / "corpus", 2000, keepends)
    assert lines == sample_lines(tmp_path / "corpus", 2000, keepends)  # seeded: the same lines
    assert sum(len(line.encode()) for line in lines) <= sample["bytes"]
    ds = load_dataset(out)
    if tokenizer == "bpe":  # unsampled lines' characters are in the vocabulary all the same
        assert ds.tokenizer.token_to_id("<unk>") not in set(ds.train.tolist())
    else:  # the same sample, the same tokenizer
        again = prepare(
            [str(tmp_path / "corpus")], tokenizer, 300, tmp_path / "again", tokenizer_sample=2000
        )
        assert (again / "tokenizer.json").read_text() == (out / "tokenizer.json").read_text()


def test_the_largest_id_is_checked_without_reading_the_tokens(tmp_path) -> None:
    mixed_corpus(tmp_path / "corpus")
    out = prepare([str(tmp_path / "corpus")], out=tmp_path / "data")
    meta = json.loads((out / "meta.json").read_text())
    (out / "meta.json").write_text(json.dumps({**meta, "max_token_id": meta["vocab_size"]}))
    with pytest.raises(AttnlabError, match=r"max_token_id \d+ does not fit the tokenizer's"):
        load_dataset(out)
    # a folder from before the record (and before manifests): every token is read, as then
    (out / MANIFEST).unlink()
    del meta["max_token_id"]
    (out / "meta.json").write_text(json.dumps(meta))
    ids = np.fromfile(out / "train.bin", dtype=np.uint16)
    assert load_dataset(out).train.tolist() == ids.tolist()
    ids[3] = 65535
    ids.tofile(out / "train.bin")
    with pytest.raises(AttnlabError, match=r"train\.bin: token id 65535 >= vocab size"):
        load_dataset(out)


def test_shakespeare_char_streams_to_nanogpts_bins(tmp_path, tiny_pieces: None) -> None:
    out = prepare(["shakespeare_char"], out=tmp_path / "data", chunk=50_000)
    ds = load_dataset(out)
    text = nanogpt_char_text()
    cut = int(len(text) * 0.9)
    assert ds.train.tolist() == ds.tokenizer.encode(text[:cut])
    assert ds.val.tolist() == ds.tokenizer.encode(text[cut:])


def test_stream_encoder_matches_whole_encoding_fed_in_any_pieces() -> None:
    text = "".join(t for _, t in embedded_documents()[:2])[:40_000]
    rng = random.Random(2)
    for tok in (
        Tokenizer.train_char(text),
        Tokenizer.train_bpe(text, 200),
        Tokenizer.train_byte_bpe(text, 300),
    ):
        whole = tok.encode(text)
        encoder, ids, at = StreamEncoder(tok, piece_chars=50, batch_pieces=3), [], 0
        while at < len(text):
            step = rng.randint(1, 400)
            ids += [i for batch in encoder.feed(text[at : at + step]) for i in batch.tolist()]
            at += step
        ids += [i for batch in encoder.finish() for i in batch.tolist()]
        assert ids == whole, tok.kind


def terminal() -> contextlib.AbstractContextManager[None]:
    """What `attnlab prepare` writes: the library's records through the CLI's handler."""
    return reporting(argparse.Namespace(quiet=False, verbose=False))


def test_progress_lines_off_a_terminal_and_quiet_without(tmp_path, monkeypatch, capsys) -> None:
    mixed_corpus(tmp_path / "corpus")
    monkeypatch.setattr(prepare_module, "PROGRESS_EVERY_S", 0.0)  # a line at every piece
    prepare([str(tmp_path / "corpus")], out=tmp_path / "data", chunk=500)
    assert capsys.readouterr().err == ""  # progress=False
    with terminal():  # the lines are log records: the CLI's handler writes them
        prepare([str(tmp_path / "corpus")], out=tmp_path / "data", chunk=500, progress=True)
    err = capsys.readouterr().err.splitlines()
    encoding = [line for line in err if line.startswith("encoding (") and "MB/s" in line]
    assert encoding and all(line.endswith(" s left") and " of " in line for line in encoding)
    assert any(line.startswith("reading ") and "MB/s" in line for line in err)
    assert err[-1].startswith("encoding (") and err[-1].endswith(" s)")  # the finished stage


def test_a_terminal_gets_a_bar(tmp_path, monkeypatch, capsys) -> None:
    mixed_corpus(tmp_path / "corpus")
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    with terminal():
        prepare([str(tmp_path / "corpus")], out=tmp_path / "data", chunk=500, progress=True)
    err = capsys.readouterr().err
    assert "B/s" in err and "\r" in err  # tqdm's bar, drawn in place
    assert "encoding (" in err.splitlines()[-1]


def test_folder_trees_of_every_format(tmp_path) -> None:
    pytest.importorskip("pyarrow")
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [f"row {i} é😀" for i in range(30)]
    tree = tmp_path / "tree"
    (tree / "sub" / "deeper").mkdir(parents=True)
    (tree / "a.txt").write_text("\n".join(rows[:10]))
    (tree / "sub" / "b.txt.gz").write_bytes(gzip.compress("\r\n".join(rows[:10]).encode()))
    (tree / "sub" / "c.txt.xz").write_bytes(lzma.compress("\n".join(rows[10:]).encode()))
    records = "".join(json.dumps({"text": r, "id": i}) + "\n" for i, r in enumerate(rows))
    (tree / "sub" / "deeper" / "d.jsonl").write_text(records + "\n")  # a blank line is skipped
    (tree / "e.jsonl.gz").write_bytes(gzip.compress(records.encode()))
    pq.write_table(pa.table({"id": list(range(30)), "body": rows}), tree / "f.parquet")
    (tree / "notes.md").write_text("not read\n")
    texts = ["\n".join(rows[:10]), "\n".join(rows)]
    documents = [texts[0], texts[1], texts[1], texts[0], "\n".join(rows[10:]), texts[1]]
    expected = reference(documents, 0.2)
    assert streamed([str(tree)], 0.2, 7) == expected
    corpus = CorpusStream([str(tree)], 0.2)
    corpus.scan()
    assert [p.doc.title for p in corpus.parts] == [
        "a.txt",
        "e.jsonl.gz",
        "f.parquet",
        "sub/b.txt.gz",
        "sub/c.txt.xz",
        "sub/deeper/d.jsonl",
    ]


def test_a_saved_dataset_is_read_offline(tmp_path, monkeypatch) -> None:
    datasets = pytest.importorskip("datasets")
    import socket

    def unreachable(*args, **kwargs):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", unreachable)
    rows = [f"row {i}" for i in range(40)]
    ds = datasets.Dataset.from_dict({"id": list(range(40)), "text": rows})
    ds.save_to_disk(str(tmp_path / "saved"))
    datasets.DatasetDict({"train": ds}).save_to_disk(str(tmp_path / "saved_dict"))
    for folder in ("saved", "saved_dict"):
        assert streamed([str(tmp_path / folder)], 0.1, 16) == reference(["\n".join(rows)], 0.1)
    datasets.DatasetDict({"test": ds}).save_to_disk(str(tmp_path / "no_train"))
    with pytest.raises(AttnlabError, match="without a train split"):
        streamed([str(tmp_path / "no_train")], 0.1, 16)


def test_zstd_files_when_zstandard_is_installed(tmp_path) -> None:
    zstandard = pytest.importorskip("zstandard")
    text = "".join(f"line {i} é\n" for i in range(200))
    (tmp_path / "a.txt.zst").write_bytes(zstandard.ZstdCompressor().compress(text.encode()))
    records = "".join(json.dumps({"text": f"row {i}"}) + "\n" for i in range(50))
    (tmp_path / "b.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(records.encode()))
    rows = "\n".join(f"row {i}" for i in range(50))
    assert streamed([str(tmp_path)], 0.1, 9) == reference([text, rows], 0.1)


def _tree(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def _bad_zst(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path.write_bytes(b"\x28\xb5\x2f\xfd not really")
    monkeypatch.setitem(sys.modules, "zstandard", None)  # makes `import zstandard` fail


BAD_INPUTS = [
    ("c.jsonl", lambda p, m: p.write_text('{"text": "a"}\nnot json\n'), "{p}: line 2 is not JSON"),
    ("c.jsonl", lambda p, m: p.write_text('{"body": "a"}\n'), '{p}: line 1 has no "text" string'),
    ("c.txt.gz", lambda p, m: p.write_bytes(b"\x1f\x8b broken"), "{p}: cannot read ("),
    ("c.txt.gz", lambda p, m: p.write_bytes(b"\x1f\x8b\x08" + bytes(7) + b"bad data"), "{p}: cannot read ("),
    ("c.txt.xz", lambda p, m: p.write_bytes(b"not xz at all"), "{p}: cannot read ("),
    ("c.txt.zst", _bad_zst, "{p}: reading .zst files needs the zstandard package (pip install zstandard)"),
    ("c.txt", lambda p, m: p.write_bytes("ok é\n".encode() + b"\xff\n"), "{p}: not UTF-8 text (byte 0xff at offset 6)"),
    ("c.jsonl", lambda p, m: p.write_text('{"text": "\\ud800"}\n'), "c.jsonl: holds U+D800, a lone surrogate UTF-8 cannot encode"),
    ("empty", lambda p, m: p.mkdir(), "{p}: folder holds no .txt, .jsonl or .parquet files"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "make", "message"), BAD_INPUTS)
def test_bad_inputs_are_one_line_errors_and_write_nothing(
    tmp_path, monkeypatch, capfd, name: str, make, message: str
) -> None:
    from attnlab.cli import main

    path = tmp_path / name
    make(path, monkeypatch)
    before = _tree(tmp_path)
    assert main(["prepare", "--corpus", str(path), "--out", str(tmp_path / "d")]) == 2
    out, err = capfd.readouterr()
    assert out == "" and err.count("\n") == 1, err
    assert err.startswith(f"attnlab prepare: error: {message.format(p=path)}"), err
    assert _tree(tmp_path) == before


def test_a_parquet_file_without_a_text_column(tmp_path, capfd) -> None:
    pytest.importorskip("pyarrow")
    import pyarrow as pa
    import pyarrow.parquet as pq

    from attnlab.cli import main

    pq.write_table(pa.table({"id": [1, 2], "score": [0.5, 0.7]}), tmp_path / "t.parquet")
    before = _tree(tmp_path)
    assert (
        main(["prepare", "--corpus", str(tmp_path / "t.parquet"), "--out", str(tmp_path / "d")])
        == 2
    )
    assert capfd.readouterr().err == (
        f"attnlab prepare: error: {tmp_path / 't.parquet'}: no text column (columns: id, score)\n"
    )
    assert _tree(tmp_path) == before


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tokenizer-sample", "0", "--tokenizer", "bpe"], "--tokenizer-sample must be at least 1 byte, got 0"),
        (["--tokenizer-sample", "1000"], "--tokenizer-sample applies to the bpe tokenizers only"),
    ],
)  # fmt: skip
def test_a_bad_tokenizer_sample_is_refused_before_reading(tmp_path, capfd, args, message) -> None:
    from attnlab.cli import main

    mixed_corpus(tmp_path / "corpus")
    before = _tree(tmp_path)
    argv = ["prepare", "--corpus", str(tmp_path / "corpus"), "--out", str(tmp_path / "d"), *args]
    assert main(argv) == 2
    assert capfd.readouterr().err == f"attnlab prepare: error: {message}\n"
    assert _tree(tmp_path) == before


def test_bench_prepare_prints_a_row_per_size_and_tokenizer(tmp_path, capsys) -> None:
    from attnlab.cli import main

    argv = ["bench", "prepare", "--sizes", "0.05", "--tokenizers", "char,bytebpe"]
    assert main([*argv, "--vocab-size", "300", "--scratch", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-3].split()[:3] == ["corpus", "MB", "tokenizer"]
    assert [line.split()[1] for line in lines[-2:]] == ["char", "bytebpe"]
    assert all(line.endswith("x") for line in lines[-2:])  # prepare's time over the library's
    assert list(tmp_path.iterdir()) == []  # the generated corpus and data folders are gone


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--sizes", "50,x"], "--sizes must be positive MB, comma-separated (e.g. 50,200), got '50,x'"),
        (["--sizes", "0"], "--sizes must be positive MB, comma-separated (e.g. 50,200), got '0'"),
        (["--tokenizers", "char,wordpiece"], "--tokenizers: unknown wordpiece (expected some of char, bpe, bytebpe)"),
        (["--tokenizers", "bytebpe", "--vocab-size", "256"], "byte-level BPE vocab size must exceed its 256 byte tokens, got 256"),
    ],
)  # fmt: skip
def test_bench_prepare_refuses_bad_arguments_first(tmp_path, capfd, args, message) -> None:
    from attnlab.cli import main

    assert main(["bench", "prepare", *args, "--scratch", str(tmp_path)]) == 2
    assert capfd.readouterr() == ("", f"attnlab bench prepare: error: {message}\n")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("case", ["missing", "file"])
def test_bench_prepare_refuses_a_scratch_that_is_no_folder(tmp_path, capfd, case) -> None:
    """Both had been a traceback from tempfile."""
    from test_folder_safety import snapshot

    from attnlab.cli import main

    scratch = tmp_path / "scratch"
    if case == "file":
        scratch.write_text("my notes")
    before = snapshot(tmp_path)
    assert main(["bench", "prepare", "--quick", "--scratch", str(scratch)]) == 2
    what = {"missing": "does not exist", "file": "is not a folder"}[case]
    assert capfd.readouterr() == (
        "",
        f"attnlab bench prepare: error: --scratch {scratch} {what}; give an existing folder\n",
    )
    assert snapshot(tmp_path) == before
