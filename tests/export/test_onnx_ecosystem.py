"""onnxruntime-genai and Optimum run attnlab's exports: their greedy tokens are attnlab's.

onnxruntime-genai (the ``export`` extra) runs in this process: the default suite covers each
path an export takes (a plain cache, GQA, a cache packed into ``model-genai.onnx``, a char
tokenizer written for genai's tokenizer); every mechanism of the registry, alone and all
together, is slow. Optimum pins transformers below what the main environment has, so its test
(slow) runs in the interpreter ATTNLAB_OPTIMUM_PYTHON names: a venv with torch,
``optimum-onnx`` and ``transformers<4.58`` (see docs/shipping.md).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import tokenizers
import torch
from conftest import compatible_sets, mechanism_examples
from test_hf_ecosystem import LLAMA, TEXT, byte_tokenizer, char_tokenizer, fitted_model

from attnlab.data.tokenizer import UNK, Tokenizer
from attnlab.export import export_model
from attnlab.export.folder import GENAI_NO_TOKENIZER, GENAI_TOKENIZER_DIR
from attnlab.export.hf import ADDED_KEY
from attnlab.export.onnx import (
    GENAI_CONFIG,
    GENAI_ONNX_FILE,
    ONNX_FILE,
    PAST,
    cache_slots,
    plain_cache,
)

PROMPT = "The quick"
NEW_TOKENS = 8
# every registered mechanism alone (its SPEC's example) and all of them together, on GQA
MECHANISMS = {**mechanism_examples(), **compatible_sets()}
# name -> (model overrides, tokenizer kind): a plain cache, GQA, and a packed cache
EXPORTS = {
    "gpt2": ({}, "char"),
    "llama": (LLAMA, "bytebpe"),
    "twicing": ({"twicing": True}, "char"),
}
EVERY = {**EXPORTS, **{name: (o, "char") for name, o in MECHANISMS.items()}}
OPTIMUM_SCRIPT = r"""
import json, sys, warnings
warnings.simplefilter("ignore")
from optimum.onnxruntime import ORTModelForCausalLM
from transformers import AutoTokenizer
job = json.loads(sys.argv[1])
out = {}
for name, folder in job["folders"].items():
    tok = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    model = ORTModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
    ids = tok(job["prompt"], return_tensors="pt")
    tokens = model.generate(**ids, max_new_tokens=job["new"], do_sample=False)[0].tolist()
    out[name] = [tokens, tok.decode(tokens, skip_special_tokens=True)]
# Optimum's own export (what optimum-cli export onnx runs) of a native and a remote-code folder
from optimum.exporters.onnx import main_export
for name, (folder, into) in job["optimum_export"].items():
    try:
        main_export(folder, into, task="text-generation-with-past", trust_remote_code=True)
    except ValueError as e:
        out[name] = str(e).splitlines()[0]
        continue
    tok = AutoTokenizer.from_pretrained(into)
    model = ORTModelForCausalLM.from_pretrained(into)
    ids = tok(job["prompt"], return_tensors="pt")
    out[name] = model.generate(**ids, max_new_tokens=job["new"], do_sample=False)[0].tolist()
print(json.dumps(out))
"""


def export_onnx(root: Path, names: dict) -> dict:
    """name -> (model, tokenizer, folder, attnlab's greedy ids) for ``names``."""
    made = {}
    for name, (overrides, kind) in names.items():
        tok = char_tokenizer() if kind == "char" else byte_tokenizer()
        model = fitted_model(tok, **overrides)
        export_model(model, tok, root / name, ["safetensors", "onnx"])
        ids = torch.tensor([tok.encode(PROMPT)])
        greedy = model.generate(ids, NEW_TOKENS, temperature=0.0)[0].tolist()
        made[name] = (model, tok, root / name, greedy)
    return made


@pytest.fixture(scope="module")
def onnx_exports(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return export_onnx(tmp_path_factory.mktemp("onnx_ecosystem"), EXPORTS)


def genai_greedy(folder: Path, length: int) -> tuple[list[int], list[int], str]:
    """(prompt ids, greedy ids up to ``length``, their text) from onnxruntime-genai alone: its
    own tokenizer, graph and search."""
    og = pytest.importorskip("onnxruntime_genai")
    model = og.Model(str(folder))
    tok = og.Tokenizer(model)
    prompt = [int(t) for t in tok.encode(PROMPT)]
    tokens = genai_search(model, prompt, length)
    return prompt, tokens, tok.decode(np.array(tokens, dtype=np.int32))


def genai_search(model: object, prompt: list[int], length: int) -> list[int]:
    """onnxruntime-genai's greedy search from token ids, up to ``length`` tokens."""
    og = pytest.importorskip("onnxruntime_genai")
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=length, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(np.array(prompt, dtype=np.int32))
    while not generator.is_done():
        generator.generate_next_token()
    return [int(t) for t in generator.get_sequence(0)]


def check_genai(made: tuple) -> None:
    """genai's config, graph and greedy tokens (and, for char exports, text) are attnlab's."""
    model, tok, folder, greedy = made
    config = json.loads((folder / GENAI_CONFIG).read_text())
    hf_config = json.loads((folder / "config.json").read_text())
    assert config["model"]["eos_token_id"] == hf_config["eos_token_id"]
    packed = not plain_cache(cache_slots(model))
    assert config["model"]["decoder"]["filename"] == (GENAI_ONNX_FILE if packed else ONNX_FILE)
    assert (folder / GENAI_ONNX_FILE).is_file() == packed
    prompt, tokens, text = genai_greedy(folder, len(greedy))
    assert prompt == tok.encode(PROMPT)
    assert tokens == greedy
    if tok.kind == "char":  # (byte-level BPE: random weights pick bytes that are no UTF-8)
        assert text == tok.decode(greedy)


@pytest.mark.parametrize("name", sorted(EXPORTS))
def test_onnxruntime_genai_greedy_equals_attnlab(onnx_exports, name: str) -> None:
    check_genai(onnx_exports[name])


@pytest.mark.slow
def test_onnxruntime_genai_greedy_for_every_mechanism(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime_genai")
    for name, made in export_onnx(tmp_path, EVERY).items():
        try:
            check_genai(made)
        except AssertionError as e:
            raise AssertionError(f"{name}: {e}") from None


def test_genai_reads_the_char_tokenizer_as_transformers_does(onnx_exports) -> None:
    """Spaces, newlines, special tokens and an unknown ASCII character give transformers' ids;
    a character outside the vocabulary and outside ASCII is one <unk> per UTF-8 byte."""
    og = pytest.importorskip("onnxruntime_genai")
    _, tok, folder, _ = onnx_exports["gpt2"]
    config = json.loads((folder / GENAI_CONFIG).read_text())
    assert config["model"]["tokenizer_dir"] == GENAI_TOKENIZER_DIR
    hf = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    genai = og.Tokenizer(og.Model(str(folder)))
    for text in [" Two  spaces,\nnewlines\n\n", "a#b<|endoftext|>c<unk>", "x\r\ty"]:
        ids = hf.encode(text).ids
        assert [int(t) for t in genai.encode(text)] == ids, text
        assert genai.decode(np.array(ids, dtype=np.int32)) == hf.decode(ids), text
    unk, a, b = hf.token_to_id(UNK), *tok.encode("ab")
    assert [int(t) for t in genai.encode("a\u20acb")] == [a, unk, unk, unk, b]
    # byte-level BPE reads the export's own tokenizer.json
    llama = onnx_exports["llama"][2]
    assert "tokenizer_dir" not in json.loads((llama / GENAI_CONFIG).read_text())["model"]
    assert not (llama / GENAI_TOKENIZER_DIR).exists()


def test_genai_refuses_a_word_level_bpe_tokenizer_and_runs_its_ids(tmp_path: Path) -> None:
    """genai's tokenizer read the bpe export's tokenizer.json without a word: spaces became -1
    and decoding kept the ``##`` pieces. Its config now names a folder that is never written,
    so og.Tokenizer fails naming it; token ids in still give attnlab's greedy ids."""
    og = pytest.importorskip("onnxruntime_genai")
    tok = Tokenizer.train_bpe([(TEXT + " ") * 20], 300)
    model = fitted_model(tok)
    folder = tmp_path / "bpe"
    export_model(model, tok, folder, ["safetensors", "onnx"])
    config = json.loads((folder / GENAI_CONFIG).read_text())
    assert config["model"]["tokenizer_dir"] == GENAI_NO_TOKENIZER
    assert not (folder / GENAI_NO_TOKENIZER).exists()
    genai = og.Model(str(folder))
    with pytest.raises(RuntimeError, match=GENAI_NO_TOKENIZER):
        og.Tokenizer(genai)
    ids = tok.encode(PROMPT)
    greedy = model.generate(torch.tensor([ids]), NEW_TOKENS, temperature=0.0)[0].tolist()
    assert genai_search(genai, ids, len(greedy)) == greedy


def test_onnx_gives_the_added_rows_minus_infinity(onnx_exports) -> None:
    """No ONNX client samples an added row (genai has no suppress list); every other logit is
    PyTorch's, in the packed graph too."""
    import onnxruntime as ort

    model, tok, folder, _ = onnx_exports["twicing"]
    added = json.loads((folder / "config.json").read_text())[ADDED_KEY]
    v = model.config.vocab_size
    assert sorted(added.values()) == list(range(v, v + len(added)))
    ids = np.array([tok.encode(PROMPT)])
    with torch.no_grad():
        ref = model(torch.from_numpy(ids), all_logits=True)[0].numpy()
    feeds = {
        "input_ids": ids,
        "attention_mask": np.ones_like(ids),
        "position_ids": np.arange(ids.shape[1])[None],
    }
    for graph in (ONNX_FILE, GENAI_ONNX_FILE):
        session = ort.InferenceSession(str(folder / graph), providers=["CPUExecutionProvider"])
        past = {  # an empty cache: the packed graph's heads are fixed, model.onnx's at least some
            i.name: np.zeros((1, i.shape[1], 0, i.shape[3]), np.float32)
            if isinstance(i.shape[1], int)
            else np.zeros((1, model.config.n_head, 0, i.shape[3]), np.float32)
            for i in session.get_inputs()
            if i.name.startswith(PAST)
        }
        logits = session.run(["logits"], {**feeds, **past})[0]
        np.testing.assert_allclose(logits[..., :v], ref, atol=1e-4, rtol=0)
        assert np.isneginf(logits[..., v:]).all(), graph


@pytest.mark.slow
def test_optimum_greedy_equals_attnlab_for_every_mechanism(tmp_path: Path) -> None:
    python = os.environ.get("ATTNLAB_OPTIMUM_PYTHON")
    if not python:
        pytest.skip("ATTNLAB_OPTIMUM_PYTHON names no interpreter with optimum-onnx installed")
    made = export_onnx(tmp_path, EVERY)
    job = {
        "folders": {name: str(m[2]) for name, m in made.items()},
        "prompt": PROMPT,
        "new": NEW_TOKENS,
        "optimum_export": {
            f"{name} by optimum": [str(made[name][2]), str(tmp_path / f"{name}-optimum")]
            for name in ("gpt2", "llama", "twicing")
        },
    }
    proc = subprocess.run(
        [python, "-I", "-c", OPTIMUM_SCRIPT, json.dumps(job)],
        capture_output=True,
        text=True,
        timeout=900,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.splitlines()[-1])
    for name, (_, tok, _, greedy) in made.items():
        assert got[name] == [greedy, tok.decode(greedy)], name
    # native folders export through Optimum too; a remote-code one is refused (docs/shipping.md
    # says so: its own model.onnx is the route)
    assert got["gpt2 by optimum"] == made["gpt2"][3]
    assert got["llama by optimum"] == made["llama"][3]
    assert "custom or unsupported architecture" in got["twicing by optimum"]
