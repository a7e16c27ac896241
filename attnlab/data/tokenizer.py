"""Character and BPE tokenizers, both stored as a Hugging Face ``tokenizer.json``.

- ``char``: one token per character (WordLevel model over single characters, each character
  isolated by the pre-tokenizer). ``train_char`` orders the vocabulary as ``sorted(set(text))``,
  the convention of nanoGPT's shakespeare_char, so ids line up with its ``meta.pkl``. Encoding
  runs as a numpy lookup (the corpus is millions of characters) and rejects unknown characters.
- ``bpe``: byte-pair encoding over words from the ``Whitespace`` pre-tokenizer (the
  gradient-boosted-attention paper's setup). Whitespace is not tokenized, so decoding joins
  words with single spaces (then drops the space before punctuation and around word-internal
  apostrophes); word-internal pieces carry a ``##`` prefix so the WordPiece decoder glues them
  back together. The whole decode is the tokenizer's own decoder (``bpe_decoder``), so every
  tool reading its tokenizer.json decodes as attnlab does. Unseen characters map to ``<unk>``. The same text learns the same merges and
  ids in every process (ties between equally frequent merges go by the sorted alphabet).
- ``bytebpe``: byte-level BPE (GPT-2's scheme): text is UTF-8 bytes, whitespace included, so
  ``decode(encode(text)) == text`` for any text (newlines, indentation, any script) and nothing
  is ever unknown. The one to use when the model's output is read as text (chat, verse).

Added special tokens (``add_special_tokens``) are matched before either model runs, so they
always encode as single tokens, and they are saved in ``tokenizer.json``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import string
import sys
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from itertools import chain
from pathlib import Path

import numpy as np
import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, trainers

from attnlab.errors import AttnlabError
from attnlab.rundir import BEST, LATEST

FILENAME = "tokenizer.json"
UNK = "<unk>"
SUBWORD_PREFIX = "##"
# WordLevel needs an unknown-token name; it is deliberately absent from the char vocabulary,
# so Hugging Face's own encoder fails loudly on unknown characters just as ours does.
_CHAR_UNK = "[UNK]"
_MAX_LISTED = 5


def listed(chars: Sequence[str]) -> str:
    """The first few of ``chars`` as reprs, for a message."""
    return ", ".join(map(repr, chars[:_MAX_LISTED])) + (", ..." if len(chars) > _MAX_LISTED else "")


IM_END = "<|im_end|>"  # ChatML's end of a turn: what sft teaches a model to emit when done
# the special tokens that end a text, first found wins: the end of a turn (a chat-tuned model),
# then GPT-2's document separator (an imported GPT-2 tokenizer)
END_TOKENS = (IM_END, "<|endoftext|>")
# The Whitespace pre-tokenizer drops spacing, so bpe decoding puts one space between words;
# these rules take it out again where English typography has none ("faults ," -> "faults,"):
# (pattern, replacement) on the joined text, in this order
_SPACING = (
    (r" (?=[.,;:!?\])])", ""),  # none before closing punctuation
    (r"(?<=[\[(]) ", ""),  # none after an opening bracket
    (r"(?<=\w) ' (?=\w)", "'"),  # none around a word-internal apostrophe
)


def bpe_decoder() -> decoders.Decoder:
    """bpe's decoder: WordPiece glues the ``##`` pieces and puts a space between words, Fuse
    joins the tokens into one text, and the spacing rules run on that text."""
    rules = [decoders.Replace(Regex(pattern), by) for pattern, by in _SPACING]
    glue = decoders.WordPiece(prefix=SUBWORD_PREFIX, cleanup=False)
    return decoders.Sequence([glue, decoders.Fuse(), *rules])


# where a text may be cut without changing its ids (Tokenizer.safe_cut): the pattern, and how
# many characters of it lie before the cut
_NEWLINE = re.compile("\n")
_SAFE_CUTS = {"bpe": (re.compile("[\n ]"), 1), "bytebpe": (re.compile(r"\S\n(?=\S)"), 2)}


def _codes(text: str) -> np.ndarray:
    """Unicode code points of ``text`` as a uint32 array (no per-character Python loop)."""
    return np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)


MAX_VOCAB = 2**32  # token ids are stored as uint32 at most


def _stand_ins(chars: Sequence[str]) -> dict[str, str]:
    """A private-use character for each of ``chars`` that is none of them, in their order."""
    taken = set(chars)
    free = (chr(c) for c in range(0xF0000, 0x10FFFE) if chr(c) not in taken)
    pairs = dict(zip(chars, free, strict=False))
    if len(pairs) < len(chars):
        raise AttnlabError(f"a BPE over {len(chars):,} distinct characters is not supported")
    return pairs


def check_bpe_vocab(kind: str, vocab_size: int) -> None:
    """Refuse a BPE vocabulary size the tokenizer cannot learn or the bins cannot store."""
    if kind == "bpe" and vocab_size < 2:
        raise AttnlabError(f"BPE vocab size must be at least 2, got {vocab_size}")
    if kind == "bytebpe" and vocab_size <= 256:
        raise AttnlabError(
            f"byte-level BPE vocab size must exceed its 256 byte tokens, got {vocab_size}"
        )
    if vocab_size > MAX_VOCAB:
        raise AttnlabError(f"BPE vocab size must be at most {MAX_VOCAB:,}, got {vocab_size:,}")


class _RustPanic(BaseException):
    """A Rust panic inside the tokenizers library (pyo3's PanicException, a BaseException: a
    crafted tokenizer.json panics where a malformed one raises), as an ordinary error."""


@contextlib.contextmanager
def _rust_panic_quiet() -> Iterator[None]:
    """Turn a panic of the block into _RustPanic, and keep the message and backtrace Rust
    prints for it off stderr (what else the block writes there is passed on)."""
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        panicked = False
        try:
            yield
        except BaseException as e:
            panicked = type(e).__name__ == "PanicException"
            if not panicked:
                raise
            raise _RustPanic(str(e)) from None
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            if not panicked:
                held.seek(0)
                sys.stderr.flush()
                os.write(2, held.read())


class Tokenizer:
    """A ``tokenizers.Tokenizer`` of kind ``"char"``, ``"bpe"`` or ``"bytebpe"``."""

    def __init__(self, hf: tokenizers.Tokenizer) -> None:
        model = type(hf.model).__name__
        kinds = {"WordLevel": "char", "BPE": "bpe"}
        if model not in kinds:
            raise AttnlabError(f"unsupported tokenizer model {model} (expected WordLevel or BPE)")
        self.hf = hf
        self.kind: str = kinds[model]
        if self.kind == "bpe" and type(hf.pre_tokenizer).__name__ == "ByteLevel":
            self.kind = "bytebpe"
        if self.kind == "bpe":  # one decode, also for a tokenizer.json an older attnlab wrote
            hf.decoder = bpe_decoder()
        self._refresh()

    def _refresh(self) -> None:
        """Rebuild the lookup tables that mirror ``hf`` (after construction or new specials)."""
        added = self.hf.get_added_tokens_decoder()
        self._specials = {tok.content: i for i, tok in added.items()}
        # Longest first so that a special token that prefixes another never shadows it.
        names = sorted(self._specials, key=len, reverse=True)
        self._special_re = re.compile("|".join(map(re.escape, names))) if names else None
        if self.kind == "char":
            # an export's unknown token sits in the vocabulary as a special token: skip it
            vocab = {
                t: i
                for t, i in self.hf.get_vocab(with_added_tokens=False).items()
                if t not in self._specials
            }
            if any(len(c) != 1 for c in vocab):
                raise AttnlabError(
                    "a WordLevel tokenizer whose tokens are not all single characters: attnlab "
                    "reads char (WordLevel of characters), bpe and byte-level bpe tokenizers"
                )
            codes = _codes("".join(vocab))
            # id by code point; the entry past the largest code is -1, where larger ones look up
            self._ids = np.full(int(codes.max(initial=0)) + 2, -1, dtype=np.int64)
            self._ids[codes] = list(vocab.values())

    @classmethod
    def from_chars(cls, chars: Sequence[str]) -> Tokenizer:
        """Char tokenizer whose id ``i`` is ``chars[i]`` (e.g. nanoGPT's ``meta.pkl`` itos)."""
        chars = list(chars)
        if not chars:
            raise AttnlabError("char tokenizer needs a non-empty vocabulary")
        if any(not isinstance(c, str) or len(c) != 1 for c in chars) or len(set(chars)) != len(
            chars
        ):
            raise AttnlabError("char vocabulary must be distinct single characters")
        # the tokenizers library takes only UTF-8: a lone surrogate was a TypeError deep inside it
        lone = next((c for c in chars if "\ud800" <= c <= "\udfff"), None)
        if lone is not None:
            code = f"U+{ord(lone):04X}"
            raise AttnlabError(
                f"char vocabulary holds {code}, a lone surrogate UTF-8 cannot encode"
            )
        hf = tokenizers.Tokenizer(
            models.WordLevel({c: i for i, c in enumerate(chars)}, unk_token=_CHAR_UNK)
        )
        hf.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
        hf.decoder = decoders.Fuse()
        return cls(hf)

    @classmethod
    def train_char(cls, text: str) -> Tokenizer:
        """Char tokenizer over ``sorted(set(text))``."""
        return cls.from_chars(sorted(set(text)))

    @classmethod
    def train_bpe(
        cls,
        text: str | Iterable[list[str]],
        vocab_size: int,
        *,
        alphabet: Iterable[str] | None = None,
        show_progress: bool = False,
    ) -> Tokenizer:
        """BPE of ``vocab_size`` tokens learned on ``text`` (or on batches of its lines).

        ``alphabet`` adds characters that must be in the vocabulary even if ``text`` lacks them
        (prepare passes the characters of the held-out text, which it must not learn merges on);
        given batches of lines, it must hold theirs too. ``show_progress``: the tokenizers
        library's own progress bars (on a terminal).
        """
        check_bpe_vocab("bpe", vocab_size)
        # Every character needs a word-initial token "c" and a continuation token "##c", or it
        # encodes as <unk> wherever it shows up in the other position than seen in training.
        # A doubled-character pseudo-word per character supplies both at negligible counts.
        chars = sorted(
            (set(text if isinstance(text, str) else ()) | set(alphabet or ()))
            - set(string.whitespace)
        )
        batches = [text.splitlines()] if isinstance(text, str) else text
        # The library's trainer numbers "##c" tokens in hash-map order, which changes from one
        # process to the next, and breaks ties between equally frequent merges by those numbers:
        # the same text gave other merges and ids each time. So it learns here on words whose
        # continuation characters are stand-in characters of its sorted base alphabet, which it
        # numbers in order, and the stand-ins become "##" pieces again afterwards.
        stand_in = _stand_ins(chars)
        marks = str.maketrans(stand_in)
        words = pre_tokenizers.Whitespace()

        def marked(batches: Iterable[list[str]]) -> Iterator[list[str]]:
            for lines in batches:
                for start in range(0, len(lines), 4096):  # a few MB of words at a time
                    found = words.pre_tokenize_str("\n".join(lines[start : start + 4096]))
                    yield [w[0] + w[1:].translate(marks) for w, _ in found]

        learner = tokenizers.Tokenizer(models.BPE(unk_token=UNK))
        learner.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size, special_tokens=[UNK], show_progress=show_progress
        )
        # lines in batches, not one text: the library counts words on every core
        pseudo = [c + stand_in[c] for c in chars]
        learner.train_from_iterator(chain(marked(batches), [pseudo]), trainer=trainer)
        learned = json.loads(learner.to_str())["model"]
        back = {v: k for k, v in stand_in.items()}

        def piece(token: str) -> str:
            plain = "".join(back.get(c, c) for c in token)
            return SUBWORD_PREFIX + plain if token[0] in back else plain

        vocab = {piece(t): i for t, i in learned["vocab"].items()}
        merges = [(piece(a), piece(b)) for a, b in learned["merges"]]
        hf = tokenizers.Tokenizer(
            models.BPE(vocab, merges, unk_token=UNK, continuing_subword_prefix=SUBWORD_PREFIX)
        )
        hf.add_special_tokens([AddedToken(UNK, special=True, normalized=False)])
        hf.pre_tokenizer = words
        return cls(hf)  # which sets bpe_decoder

    @classmethod
    def train_byte_bpe(
        cls, text: str | Iterable[list[str]], vocab_size: int, show_progress: bool = False
    ) -> Tokenizer:
        """Byte-level BPE of ``vocab_size`` tokens (the 256 byte tokens included) learned on
        ``text`` (or on batches of its lines, each line with its newline)."""
        check_bpe_vocab("bytebpe", vocab_size)
        alphabet = pre_tokenizers.ByteLevel.alphabet()
        hf = tokenizers.Tokenizer(models.BPE())
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        hf.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size, initial_alphabet=alphabet, show_progress=show_progress
        )
        # keepends: newlines are tokens here, and merges such as ".\n" are worth learning
        batches = [text.splitlines(keepends=True)] if isinstance(text, str) else text
        hf.train_from_iterator(batches, trainer=trainer)
        return cls(hf)

    @classmethod
    def load(cls, path: str | Path) -> Tokenizer:
        """Load ``tokenizer.json``, or the one inside the folder ``path`` (a run folder's is
        in its checkpoints: ``latest/``, else ``best/``)."""
        path = Path(path)
        file = path / FILENAME if path.is_dir() else path
        if path.is_dir() and not file.exists():
            held = (path / LATEST / FILENAME, path / BEST / FILENAME)
            file = next((f for f in held if f.is_file()), file)
        if not file.is_file():
            raise AttnlabError(
                f"{file}: tokenizer file not found; name a tokenizer.json, or a data, run or "
                "model folder that holds one"
            )
        try:
            with _rust_panic_quiet():
                hf = tokenizers.Tokenizer.from_file(str(file))
        except (Exception, _RustPanic) as e:  # the Rust error says what is wrong: its first line
            reason = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise AttnlabError(f"{file}: not a valid tokenizer.json ({reason})") from None
        try:
            return cls(hf)
        except AttnlabError as e:
            raise AttnlabError(f"{file}: {e}") from None

    def save(self, path: str | Path) -> None:
        """Write ``tokenizer.json`` to the file ``path``."""
        self.hf.save(str(path))

    @property
    def vocab_size(self) -> int:
        """Number of ids, special tokens included."""
        return self.hf.get_vocab_size(with_added_tokens=True)

    @property
    def eos_id(self) -> int | None:
        """Id of the token that ends a text (see END_TOKENS), None when the tokenizer has none."""
        return next((self._specials[t] for t in END_TOKENS if t in self._specials), None)

    def token_to_id(self, token: str) -> int | None:
        """Id of ``token`` (special tokens included), None if it is not in the vocabulary."""
        return self.hf.token_to_id(token)

    def add_special_tokens(self, tokens: list[str]) -> list[int]:
        """Add tokens that always encode as one id; returns their ids (existing ones kept)."""
        self.hf.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in tokens])
        self._refresh()
        return [self.hf.token_to_id(t) for t in tokens]

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``."""
        try:
            return self._encode(text)
        except UnicodeEncodeError as e:  # a lone surrogate: bytes a terminal could not decode
            raise AttnlabError(
                f"the text holds {text[e.start]!r} at position {e.start}, which is no character "
                "(undecodable bytes?)"
            ) from None

    def encode_plain(self, text: str) -> list[int]:
        """Token ids of ``text`` as plain text: where it spells a special token (ChatML's
        ``<|im_end|>`` quoted in data, or typed in a chat) that spelling is encoded as text,
        never as the token, so no text can forge the markup around it."""
        if self._special_re is None:
            return self.encode(text)
        ids: list[int] = []
        start = 0
        for match in self._special_re.finditer(text):
            spelled = match.group()
            # its first character alone, then the rest: neither piece is the special token
            ids += self.encode(text[start : match.start()]) + self.encode(spelled[0])
            ids += self.encode_plain(spelled[1:])
            start = match.end()
        return ids + self.encode(text[start:])

    def _encode(self, text: str) -> list[int]:
        if self.kind != "char":
            return self.hf.encode(text, add_special_tokens=False).ids
        if self._special_re is None:
            return self._encode_chars(text).tolist()
        ids: list[int] = []
        start = 0
        for match in self._special_re.finditer(text):
            ids += self._encode_chars(text[start : match.start()]).tolist()
            ids.append(self._specials[match.group()])
            start = match.end()
        return ids + self._encode_chars(text[start:]).tolist()

    def _char_ids(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """A char tokenizer's ids of ``text`` (-1 for a character it lacks) and the codes."""
        codes = _codes(text)
        return self._ids[np.minimum(codes, len(self._ids) - 1)], codes

    def _encode_chars(self, text: str) -> np.ndarray:
        ids, codes = self._char_ids(text)
        unknown = ids < 0
        if unknown.any():
            bad = sorted({chr(c) for c in codes[unknown]})
            raise AttnlabError(f"{len(bad)} character(s) not in the vocabulary: {listed(bad)}")
        return ids

    def missing(self, chars: Sequence[str]) -> list[str]:
        """The characters of ``chars`` this tokenizer cannot encode: a char tokenizer's absent
        ones; a bpe's that encode as <unk> alone or doubled (at a word's start, and inside one);
        none for byte-level BPE."""
        if self.kind == "char":
            ids, codes = self._char_ids("".join(chars))
            return [chr(c) for c in codes[ids < 0]]
        unk = self.hf.token_to_id(UNK)
        if unk is None:
            return []
        words = [c for c in chars if not c.isspace()]
        alone = self.hf.encode_batch(words, add_special_tokens=False)
        doubled = self.hf.encode_batch([c + c for c in words], add_special_tokens=False)
        return [c for c, a, b in zip(words, alone, doubled, strict=True) if unk in a.ids + b.ids]

    def encode_array(self, pieces: list[str]) -> np.ndarray:
        """Token ids of the concatenation of ``pieces``, which must be cut where ``safe_cut``
        cuts; the pieces are encoded side by side (the library's batch encode uses every core).
        """
        if self.kind == "char" and self._special_re is None:
            ids = [self._encode_chars(piece) for piece in pieces]
        elif self.kind == "char":
            ids = [np.asarray(self.encode(piece), dtype=np.int64) for piece in pieces]
        else:
            encodings = self.hf.encode_batch_fast(pieces, add_special_tokens=False)
            ids = [np.asarray(e.ids, dtype=np.int64) for e in encodings]
        return np.concatenate(ids) if ids else np.zeros(0, dtype=np.int64)

    def safe_cut(self, text: str, at: int) -> int | None:
        """The first position from ``at`` on (and before the end) where ``text`` can be cut
        without changing its ids: the pieces encode to the whole text's ids, one after the
        other. None: no such position yet (more text may bring one)."""
        if self.kind == "char" and self._special_re is None:  # one token per character
            return at if at < len(text) else None
        # bpe's words never span a space or newline, and neither do special tokens; byte-level
        # BPE keeps runs of whitespace together, so only a lone newline between text is safe
        rule, width = _SAFE_CUTS.get(self.kind, (_NEWLINE, 1))
        match = rule.search(text, max(at - width, 0))
        return match.end() if match and match.end() < len(text) else None

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` (special tokens included), as the tokenizer.json's own decoder gives it
        (for ``bpe``, words joined by single spaces but before punctuation: ``bpe_decoder``)."""
        ids = [int(i) for i in ids]
        if ids and not 0 <= min(ids) <= max(ids) < self.vocab_size:
            raise AttnlabError(f"token id out of range for vocab size {self.vocab_size}")
        return self.hf.decode(ids, skip_special_tokens=False)


PIECE_CHARS = 1 << 16  # characters per piece a batch encode gets
BATCH_PIECES = 64  # pieces per batch: a few per core on a big machine, a few MB of text


class StreamEncoder:
    """Token ids of a text fed to it piece by piece, equal to ``tokenizer.encode`` of the whole.

    The text is cut where ``Tokenizer.safe_cut`` allows, about every ``piece_chars`` characters
    (default PIECE_CHARS), and encoded ``batch_pieces`` (BATCH_PIECES) pieces at a time, so only about a batch of text is held (more
    only where a stretch of text has no safe cut: a line longer than a batch, for bpe). For the
    tokenizers ``Tokenizer.train_*`` make (no normalizer; a pre-tokenizer that safe_cut knows).
    """

    def __init__(
        self, tokenizer: Tokenizer, piece_chars: int | None = None, batch_pieces: int | None = None
    ) -> None:
        self.tokenizer = tokenizer
        self.piece_chars = piece_chars or PIECE_CHARS
        self.batch_pieces = batch_pieces or BATCH_PIECES
        self._rest = ""  # text not yet cut into a piece
        self._pieces: list[str] = []

    def feed(self, text: str) -> Iterator[np.ndarray]:
        """Append ``text``; yields the ids of every batch it completes."""
        rest, start = self._rest + text, 0
        while len(rest) - start > self.piece_chars:
            cut = self.tokenizer.safe_cut(rest, start + self.piece_chars)
            if cut is None:
                break
            self._pieces.append(rest[start:cut])
            start = cut
            if len(self._pieces) >= self.batch_pieces:
                yield self._encode()
        self._rest = rest[start:]

    def finish(self) -> Iterator[np.ndarray]:
        """The ids of what is left."""
        if self._rest:
            self._pieces.append(self._rest)
            self._rest = ""
        if self._pieces:
            yield self._encode()

    def _encode(self) -> np.ndarray:
        ids = self.tokenizer.encode_array(self._pieces)
        self._pieces = []
        return ids
