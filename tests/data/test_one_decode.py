"""One decode: attnlab and every exported tokenizer.json decode every tokenizer kind alike.

For char, bpe and bytebpe, the same ids decode to the same text in attnlab, in `tokenizers` (the
export's tokenizer.json), in transformers' AutoTokenizer, in transformers' text-generation
pipeline (whose text is the prompt followed by the decode of the new ids), and in
onnxruntime-genai's tokenizer for the kinds it reads (char, bytebpe; it refuses bpe). Word-level
bpe decoded two ways before: ``'ROMEO: What say you'`` in attnlab, ``'ROMEO : What say you'``
from the tokenizer.json.
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

TEXT = (
    "ROMEO: What say you, my lord? I'll not (as it were) go; [aside] the king's men!\n"
    "JULIET: Nothing at all: don't ask, sweet Romeo. Café au lait.\n"
) * 20
PROMPTS = ["ROMEO: What say", "JULIET: (aside) I'll", "the king's"]


@pytest.fixture(scope="module", params=["char", "bpe", "bytebpe"])
def export(request, tmp_path_factory: pytest.TempPathFactory):
    """(attnlab tokenizer, model, export folder) of a tiny native GPT-2 with each kind."""
    from attnlab.config import ModelConfig
    from attnlab.data.tokenizer import Tokenizer
    from attnlab.export import export_model
    from attnlab.model import GPT

    kind = request.param
    tok = {
        "char": lambda: Tokenizer.train_char(TEXT),
        "bpe": lambda: Tokenizer.train_bpe(TEXT, 120),
        "bytebpe": lambda: Tokenizer.train_byte_bpe(TEXT, 320),
    }[kind]()
    torch.manual_seed(0)
    config = ModelConfig(block_size=64, vocab_size=tok.vocab_size, n_layer=1, n_head=2, n_embd=32)
    model = GPT(config).eval()
    folder = tmp_path_factory.mktemp(kind) / "export"
    export_model(model, tok, folder, ["safetensors"])
    return tok, model, folder


def id_sequences(tok) -> list[list[int]]:
    """Encodings of texts with every spacing rule at work, and random id sequences."""
    rng = random.Random(0)
    texts = [line for line in TEXT.splitlines() if line] + PROMPTS
    seqs = [tok.encode(t) for t in texts]
    seqs += [[rng.randrange(tok.vocab_size) for _ in range(rng.randint(1, 25))] for _ in range(50)]
    return seqs


def test_tokenizers_and_auto_tokenizer_decode_as_attnlab(export) -> None:
    import tokenizers

    tok, _, folder = export
    hf = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    auto = transformers.AutoTokenizer.from_pretrained(folder)
    for ids in id_sequences(tok):
        ours = tok.decode(ids)
        assert hf.decode(ids, skip_special_tokens=False) == ours, ids
        assert auto.decode(ids, skip_special_tokens=False) == ours, ids
    if tok.kind == "bpe":  # what the issue saw
        assert hf.decode(tok.encode("ROMEO: What say you")) == "ROMEO: What say you"


def test_pipeline_text_is_the_prompt_and_attnlabs_decode_of_the_new_ids(export) -> None:
    from attnlab.model.generation import generate

    tok, model, folder = export
    pipe = transformers.pipeline("text-generation", model=str(folder), device="cpu")
    for prompt in PROMPTS:
        ids = tok.encode(prompt)
        with torch.no_grad():
            new = generate(model, torch.tensor([ids]), 6, top_k=1)[0, len(ids) :].tolist()
        out = pipe(prompt, max_new_tokens=6, do_sample=False, return_tensors=True)
        assert out[0]["generated_token_ids"][len(ids) :] == new
        text = pipe(prompt, max_new_tokens=6, do_sample=False)[0]["generated_text"]
        assert text == prompt + tok.decode(new)


@pytest.mark.slow  # an ONNX export
def test_onnxruntime_genai_decodes_as_attnlab_where_it_reads_the_kind(
    export, tmp_path: Path
) -> None:
    """Texts' ids (genai stops at bytes that are no UTF-8, where the others write U+FFFD)."""
    og = pytest.importorskip("onnxruntime_genai")
    from attnlab.export import export_model

    tok, model, _ = export
    if tok.kind == "bpe":
        pytest.skip("genai reads no word-level bpe: refused (tests/test_onnx_ecosystem.py)")
    export_model(model, tok, tmp_path / "onnx", ["onnx"])
    genai = og.Tokenizer(og.Model(str(tmp_path / "onnx")))
    for text in [*TEXT.splitlines()[:2], *PROMPTS]:
        ids = tok.encode(text)
        assert genai.decode(np.array(ids, dtype=np.int32)) == tok.decode(ids) == text, ids


def test_an_older_bpe_tokenizer_json_decodes_as_before(tmp_path: Path) -> None:
    """A tokenizer.json an older attnlab wrote (WordPiece decoder with its cleanup) decodes
    with bpe's rules when attnlab loads it, so re-exporting an old run fixes its export."""
    from tokenizers import decoders

    from attnlab.data.tokenizer import Tokenizer

    tok = Tokenizer.train_bpe(TEXT, 120)
    tok.hf.decoder = decoders.WordPiece(prefix="##", cleanup=True)
    tok.save(tmp_path / "tokenizer.json")
    loaded = Tokenizer.load(tmp_path / "tokenizer.json")
    assert type(loaded.hf.decoder).__name__ == "Sequence"
    assert loaded.decode(loaded.encode("ROMEO: (aside) don't")) == "ROMEO: (aside) don't"
