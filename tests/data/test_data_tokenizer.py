"""Char, BPE and byte-level BPE tokenizers: round trips, special tokens, persistence, errors."""

from __future__ import annotations

import re

import pytest
import tokenizers
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab.data.tokenizer import Tokenizer
from attnlab.errors import AttnlabError

TEXT = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n"
SPECIALS = ["<|im_start|>", "<|im_end|>"]
CHAR = Tokenizer.train_char(TEXT)
BPE = Tokenizer.train_bpe(TEXT * 5, 70)
BYTE_BPE = Tokenizer.train_byte_bpe(TEXT * 5, 300)


def make(kind: str) -> Tokenizer:
    """A fresh tokenizer of ``kind`` trained on TEXT."""
    if kind == "char":
        return Tokenizer.train_char(TEXT)
    if kind == "bpe":
        return Tokenizer.train_bpe(TEXT * 5, 80)
    return Tokenizer.train_byte_bpe(TEXT * 5, 300)


def test_char_vocab_is_sorted_set_like_nanogpt() -> None:
    chars = sorted(set(TEXT))
    assert CHAR.kind == "char" and CHAR.vocab_size == len(chars)
    assert CHAR.encode(TEXT) == [chars.index(c) for c in TEXT]
    assert CHAR.decode(CHAR.encode(TEXT)) == TEXT


@settings(max_examples=50, deadline=None)
@given(st.text(alphabet=sorted(set(TEXT))))
def test_char_round_trip_any_text_over_the_vocab(text: str) -> None:
    ids = CHAR.encode(text)
    assert len(ids) == len(text)
    assert CHAR.decode(ids) == text


def test_from_chars_keeps_the_given_order() -> None:
    tok = Tokenizer.from_chars(["z", "\n", "a", " "])
    assert tok.encode("a z\n") == [2, 3, 0, 1]
    assert tok.decode([0, 2]) == "za"


def test_char_out_of_vocab_lists_the_characters() -> None:
    with pytest.raises(AttnlabError, match=r"2 character\(s\).*'#'.*'é'"):
        CHAR.encode("Speak é # now")


def test_bad_char_vocabulary_and_ids() -> None:
    with pytest.raises(AttnlabError, match="distinct single characters"):
        Tokenizer.from_chars(["a", "a"])
    with pytest.raises(AttnlabError, match="out of range"):
        CHAR.decode([CHAR.vocab_size])


@pytest.mark.parametrize("kind", ["char", "bpe", "bytebpe"])
def test_special_tokens_encode_as_one_id_and_survive_save_load(tmp_path, kind: str) -> None:
    tok = make(kind)
    size = tok.vocab_size
    ids = tok.add_special_tokens(SPECIALS)
    assert ids == [size, size + 1] and tok.vocab_size == size + 2
    text = "<|im_start|>Speak, speak.<|im_end|>"
    encoded = tok.encode(text)
    assert encoded[0] == ids[0] and encoded[-1] == ids[1]
    assert ids[0] not in encoded[1:-1]

    path = tmp_path / "tokenizer.json"
    tok.save(path)
    loaded = Tokenizer.load(tmp_path)  # a folder works as well as the file
    assert loaded.kind == kind and loaded.vocab_size == tok.vocab_size
    assert loaded.encode(text) == encoded
    assert loaded.token_to_id("<|im_end|>") == ids[1]
    assert loaded.decode(encoded) == tok.decode(encoded)
    # The file is a plain Hugging Face tokenizer: the library alone encodes the same ids.
    assert tokenizers.Tokenizer.from_file(str(path)).encode(text).ids == encoded


def test_char_file_loaded_by_hf_matches_our_fast_encoder(tmp_path) -> None:
    CHAR.save(tmp_path / "tokenizer.json")
    hf = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert hf.encode(TEXT).ids == CHAR.encode(TEXT)
    assert hf.decode(CHAR.encode(TEXT)) == TEXT


def test_bpe_round_trip_is_readable_and_keeps_every_visible_character() -> None:
    tok = Tokenizer.train_bpe(TEXT * 5, 60, alphabet="8")
    assert tok.kind == "bpe" and tok.vocab_size == 60
    # "8" is absent from the text yet encodes both at the start and inside a word, as do
    # a character of the text seen only at word starts ("F").
    assert tok.token_to_id("<unk>") not in tok.encode("8 a8 aF Fa")
    ids = tok.encode(TEXT)
    assert len(ids) < len(TEXT)  # merges happened
    decoded = tok.decode(ids)
    assert decoded.startswith("First Citizen: Before we proceed any further, hear me speak.")
    assert re.sub(r"\s", "", decoded) == re.sub(r"\s", "", TEXT)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.sampled_from(["speak", "hear", "me", ",", ".", "All", "\n"]), max_size=20))
def test_bpe_round_trip_up_to_whitespace(words: list[str]) -> None:
    text = " ".join(words)
    decoded = BPE.decode(BPE.encode(text))
    assert re.sub(r"\s", "", decoded) == re.sub(r"\s", "", text)


def test_byte_bpe_is_lossless_and_learns_merges() -> None:
    assert BYTE_BPE.kind == "bytebpe" and BYTE_BPE.vocab_size == 300
    ids = BYTE_BPE.encode(TEXT)
    assert len(ids) < len(TEXT.encode()) / 2  # merges happened, newlines included
    assert BYTE_BPE.decode(ids) == TEXT
    with pytest.raises(AttnlabError, match="must exceed its 256 byte tokens"):
        Tokenizer.train_byte_bpe(TEXT, 256)


@settings(max_examples=50, deadline=None)
@given(st.text())  # any unicode, whitespace runs, characters never seen in training
def test_byte_bpe_round_trips_any_text(text: str) -> None:
    assert BYTE_BPE.decode(BYTE_BPE.encode(text)) == text


@pytest.mark.parametrize("content", [None, "{not json", '{"model": {"type": "Unigram"}}'])
def test_load_rejects_missing_or_invalid_files(tmp_path, content: str | None) -> None:
    path = tmp_path / "tokenizer.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(AttnlabError, match=re.escape(str(path))):
        Tokenizer.load(path)
