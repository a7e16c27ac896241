"""onnxruntime-genai and Optimum run attnlab's model.onnx: their greedy tokens are attnlab's.

onnxruntime-genai (the ``export`` extra) runs in this process on every export with a
``genai_config.json``. Optimum pins transformers below what the main environment has, so its
test (slow) runs in the interpreter ATTNLAB_OPTIMUM_PYTHON names: a venv with torch,
``optimum-onnx`` and ``transformers<4.58`` (see the README's "Shipping models").
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from test_export import ALL_MECHANISMS, CONFIGS
from test_hf_ecosystem import LLAMA, byte_tokenizer, char_tokenizer, fitted_model

from attnlab.export import export_model
from attnlab.export.onnx import GENAI_CONFIG

PROMPT = "The quick"
NEW_TOKENS = 8
# name -> (model overrides, tokenizer kind); genai runs the first three
EXPORTS = {
    "gpt2": ({}, "char"),
    "llama": (LLAMA, "bytebpe"),  # GQA: 2 kv heads of 4
    "kv-bias": (CONFIGS["kv-bias"], "char"),
    "twicing": (CONFIGS["twicing"], "char"),  # a third cache tensor a layer: no genai config
}
# Optimum: every mechanism, composed ones and GQA in remote code included
OPTIMUM = {
    **EXPORTS,
    **{name: (o, "char") for name, o in CONFIGS.items() if name not in EXPORTS},
    "all": (ALL_MECHANISMS, "char"),
}
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


@pytest.mark.parametrize("name", ["gpt2", "llama", "kv-bias"])
def test_onnxruntime_genai_greedy_equals_attnlab(onnx_exports, name: str) -> None:
    og = pytest.importorskip("onnxruntime_genai")
    _, tok, folder, greedy = onnx_exports[name]
    config = json.loads((folder / GENAI_CONFIG).read_text())
    assert (
        config["model"]["eos_token_id"]
        == json.loads((folder / "config.json").read_text())["eos_token_id"]
    )
    genai = og.Model(str(folder))
    params = og.GeneratorParams(genai)
    params.set_search_options(max_length=len(greedy), do_sample=False)
    generator = og.Generator(genai, params)
    generator.append_tokens(np.array(greedy[:-NEW_TOKENS], dtype=np.int32))
    while not generator.is_done():
        generator.generate_next_token()
    assert [int(t) for t in generator.get_sequence(0)] == greedy
    if tok.kind == "bytebpe":  # genai's own tokenizer reads the byte-level tokenizer.json
        text = "The quick, brown\nfox"
        genai_tok = og.Tokenizer(genai)
        assert [int(t) for t in genai_tok.encode(text)] == tok.encode(text)
        # (not the greedy ids: random weights pick bytes that are no UTF-8, each decoder its way)
        assert genai_tok.decode(np.array(tok.encode(text), dtype=np.int32)) == text


def test_no_genai_config_for_a_cache_genai_cannot_feed(onnx_exports) -> None:
    folder = onnx_exports["twicing"][2]
    assert (folder / "model.onnx").is_file() and not (folder / GENAI_CONFIG).exists()


@pytest.mark.slow
def test_optimum_greedy_equals_attnlab_for_every_mechanism(tmp_path: Path) -> None:
    python = os.environ.get("ATTNLAB_OPTIMUM_PYTHON")
    if not python:
        pytest.skip("ATTNLAB_OPTIMUM_PYTHON names no interpreter with optimum-onnx installed")
    made = export_onnx(tmp_path, OPTIMUM)
    job = {
        "folders": {name: str(m[2]) for name, m in made.items()},
        "prompt": PROMPT,
        "new": NEW_TOKENS,
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
