"""llama.cpp itself runs attnlab's GGUF exports: it tokenizes the prompt to attnlab's ids and
generates attnlab's greedy tokens (a native Llama with byte-level BPE, a GPT-2 with a char
vocabulary), through llama-cpp-python built from source.

ATTNLAB_LLAMA_PYTHON names an interpreter that has llama_cpp (`make test-ecosystem` builds one
in .venv-llama); without it these tests skip.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow
LLAMA_PYTHON = os.environ.get("ATTNLAB_LLAMA_PYTHON")
if not LLAMA_PYTHON:
    pytest.skip("ATTNLAB_LLAMA_PYTHON names no interpreter with llama_cpp", allow_module_level=True)
pytest.importorskip("gguf")

TEXT = "ROMEO: What say you, my lord?\nJULIET: Nothing at all, good night.\n" * 20
PROMPT = "ROMEO: What"
NEW = 12
# what llama.cpp does with the file: its tokenization of the prompt, then greedy tokens
RUN_LLAMA = """
import json, sys
from llama_cpp import Llama
path, prompt, ids, n = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
llm = Llama(model_path=path, n_ctx=64, verbose=False, n_threads=1)
tokenized = llm.tokenize(prompt.encode(), add_bos=False, special=False)
out = []
for token in llm.generate(ids, top_k=1, temp=0.0, repeat_penalty=1.0):
    out.append(token)
    if len(out) == n:
        break
print(json.dumps({"tokenized": tokenized, "greedy": out}))
"""


def trained(kind: str, **arch):
    """A tiny model fitted to TEXT for a few hundred steps: its greedy tokens have clear margins."""
    from attnlab.config import ModelConfig
    from attnlab.data.tokenizer import Tokenizer
    from attnlab.model import GPT

    tok = Tokenizer.train_byte_bpe(TEXT, 300) if kind == "bytebpe" else Tokenizer.train_char(TEXT)
    torch.manual_seed(0)
    config = ModelConfig(
        block_size=32, vocab_size=tok.vocab_size, n_layer=2, n_head=4, n_embd=64, **arch
    )
    model = GPT(config)
    data = torch.tensor(tok.encode(TEXT))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    gen = torch.Generator().manual_seed(0)
    for _ in range(300):
        starts = torch.randint(0, len(data) - 33, (16,), generator=gen)
        x = torch.stack([data[s : s + 32] for s in starts])
        y = torch.stack([data[s + 1 : s + 33] for s in starts])
        _, loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model.eval(), tok


@pytest.mark.parametrize(
    ("kind", "arch", "fmt", "file"),
    [
        ("bytebpe", {"norm": "rmsnorm", "pos": "rope", "mlp": "swiglu", "n_kv_head": 2}, "gguf", "model.gguf"),
        ("char", {"mlp": "gelu_tanh"}, "gguf", "model.gguf"),
        ("bytebpe", {"norm": "rmsnorm", "pos": "rope", "mlp": "swiglu", "n_kv_head": 2}, "gguf-f16", "model-f16.gguf"),
    ],
)  # fmt: skip
def test_llama_cpp_generates_attnlabs_greedy_tokens(
    tmp_path: Path, kind: str, arch: dict, fmt: str, file: str
) -> None:
    from attnlab.export import export_model
    from attnlab.model.generation import generate

    model, tok = trained(kind, **arch)
    export_model(model, tok, tmp_path / "export", [fmt])
    ids = tok.encode(PROMPT)
    with torch.no_grad():
        ours = generate(model, torch.tensor([ids]), NEW, top_k=1)[0, len(ids) :].tolist()
    done = subprocess.run(
        [LLAMA_PYTHON, "-c", RUN_LLAMA, str(tmp_path / "export" / file), PROMPT, json.dumps(ids), str(NEW)],
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    assert theirs["tokenized"] == ids
    assert theirs["greedy"] == ours, (tok.decode(ours), tok.decode(theirs["greedy"]))
