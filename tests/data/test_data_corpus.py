"""Corpus loading and the per-document train/val split."""

from __future__ import annotations

import sys

import pytest

from attnlab.data.corpus import embedded_documents, load_corpus, split_document
from attnlab.errors import AttnlabError


def test_embedded_corpus_is_the_complete_works_without_boilerplate() -> None:
    docs = embedded_documents()
    titles = [title for title, _ in docs]
    assert len(docs) == 42
    assert "HAMLET, PRINCE OF DENMARK" in titles
    assert len(set(titles)) == len(titles)
    for title, text in docs:
        assert text.endswith("\n") and "\r" not in text, title
        assert "gutenberg" not in text.lower(), title


def test_embedded_split_holds_out_tail_of_every_play() -> None:
    corpus = load_corpus()
    docs = embedded_documents()
    listing = corpus.provenance["documents"]
    assert [d["title"] for d in listing] == [t for t, _ in docs]
    for (title, text), entry in zip(docs, listing, strict=True):
        train, val = split_document(text, 0.1)
        assert train + val == text, title  # no overlap, nothing lost
        assert train.endswith("\n"), title  # cut at a line boundary
        assert val and val in corpus.val_text and train in corpus.train_text, title
        assert 0.07 < len(val) / len(text) < 0.13, title
        assert (entry["train_chars"], entry["val_chars"]) == (len(train), len(val))
    total = len(corpus.train_text) + len(corpus.val_text)
    assert 0.09 < len(corpus.val_text) / total < 0.11


def test_provenance_identifies_text_and_split() -> None:
    a, b = load_corpus(), load_corpus(["shakespeare"], val_fraction=0.2)
    assert a.provenance["name"] == "shakespeare"
    assert a.provenance["sha256"] == b.provenance["sha256"]  # same source text
    assert a.provenance["val_sha256"] != b.provenance["val_sha256"]  # different split
    assert len(b.val_text) > len(a.val_text)


def test_folder_of_files_one_document_each(tmp_path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.txt").write_text("".join(f"a line {i}\n" for i in range(10)))
    (tmp_path / "sub" / "b.txt").write_bytes(b"".join(b"b line %d\r\n" % i for i in range(10)))
    (tmp_path / "ignored.md").write_text("not a txt file\n")
    corpus = load_corpus([str(tmp_path)])
    assert corpus.val_text == "a line 9\n\nb line 9\n"
    assert corpus.train_text.startswith("a line 0\n") and "\r" not in corpus.train_text
    assert [d["title"] for d in corpus.provenance["documents"]] == ["a.txt", "sub/b.txt"]
    assert corpus.provenance["name"] == "custom"


def test_split_document_cuts_at_nearest_line_boundary() -> None:
    assert split_document("aaaa\nbbbb\n", 0.5) == ("aaaa\n", "bbbb\n")
    assert split_document("one long line without breaks", 0.1) == (
        "one long line without breaks",
        "",
    )
    assert split_document("x\ny\n", 0.0) == ("x\ny\n", "")


@pytest.mark.parametrize(
    ("content", "message"),
    [(None, "no such file"), (b"", "empty corpus"), (b"caf\xe9\n", "not UTF-8")],
)
def test_bad_sources_name_the_file(tmp_path, content: bytes | None, message: str) -> None:
    path = tmp_path / "corpus.txt"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(AttnlabError, match=message) as info:
        load_corpus([str(path)])
    assert str(path) in str(info.value)


def test_single_line_corpus_cannot_hold_out_validation(tmp_path) -> None:
    (tmp_path / "one.txt").write_text("just one line")
    with pytest.raises(AttnlabError, match="too little text"):
        load_corpus([str(tmp_path / "one.txt")])


def test_bad_val_fraction_and_hf_spec() -> None:
    for fraction in (0.0, 1.0):
        with pytest.raises(AttnlabError, match=r"val_fraction must be in \(0, 1\)"):
            load_corpus(val_fraction=fraction)
    with pytest.raises(AttnlabError, match="hf:NAME"):
        load_corpus(["hf:"])


def test_hf_source_without_datasets_package_is_a_clear_error(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` fail
    with pytest.raises(AttnlabError, match="optional `datasets` package"):
        load_corpus(["hf:karpathy/tiny_shakespeare"])
