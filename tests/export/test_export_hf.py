"""transformers loads every export where attnlab is not installed: same logits, same greedy tokens.

One subprocess (transformers imported once, attnlab blocked on sys.meta_path) loads every
folder the module fixture exports and saves what it computed; the tests compare it with attnlab.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from test_export import (
    ALL_MECHANISMS,
    COMPOSED,
    CONFIGS,
    chat_tokenizer,
    make_model,
    torch_logits,
)

from attnlab import from_pretrained
from attnlab.data.chat import format_chatml
from attnlab.export import export_model
from attnlab.export.hf import MODELING, embedded_sources

pytest.importorskip("transformers")

MODELS = {
    **CONFIGS,
    **ALL_MECHANISMS,
    "llama": dict(n_kv_head=2, pos="rope", norm="rmsnorm", mlp="swiglu"),
    "gpt2-tanh": dict(bias=True, mlp="gelu_tanh", tie_embeddings=False),
}
NATIVE = {"vanilla": "GPT2LMHeadModel", "gpt2-tanh": "GPT2LMHeadModel", "llama": "LlamaForCausalLM"}
PROMPT = [[3, 1, 4, 1, 5]]
OTHER = [9, 2, 6]  # a shorter prompt, left-padded with 0 beside PROMPT
NEW_TOKENS = 12
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
HF_SCRIPT = r"""
import importlib.abc, json, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "attnlab":
            raise ImportError("attnlab is blocked")
sys.meta_path.insert(0, Block())
try:
    import attnlab
    raise SystemExit("attnlab is importable")
except ImportError:
    pass
import numpy as np, torch
from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline
from transformers.utils import logging
logging.set_verbosity_warning()  # the fixture checks what transformers warns about
logging.disable_progress_bar()
job = json.loads(sys.argv[1])
x = torch.from_numpy(np.load(job["x"]))
results = {}
for name, folder in job["folders"].items():
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
    with torch.no_grad():
        np.save(f"{folder}/hf_logits.npy", model(x).logits.numpy())
    prompt = torch.tensor(job["prompt"])
    greedy = {}
    for use_cache in (True, False):
        out = model.generate(prompt, max_new_tokens=job["new"], do_sample=False, use_cache=use_cache)
        greedy[str(use_cache)] = out[0].tolist()
    # a left-padded batch of two prompts: each row as if alone
    padded = torch.tensor(job["padded"])
    out = model.generate(
        padded, attention_mask=(padded != 0).long(), max_new_tokens=job["new"], do_sample=False
    )
    greedy["padded"] = out.tolist()
    results[name] = {"class": type(model).__name__, "greedy": greedy}
chat = job["chat"]
tok = AutoTokenizer.from_pretrained(chat)
results["chat"] = {
    "template": tok.apply_chat_template(job["messages"], add_generation_prompt=True, tokenize=False),
    "roles": [tok.bos_token, tok.eos_token, tok.pad_token, tok.unk_token],
    "unknown": tok("ab\u20ac")["input_ids"],
}
generator = pipeline("text-generation", model=chat, trust_remote_code=True)
out = generator("To be", max_new_tokens=5, do_sample=False)
results["chat"]["pipeline"] = out[0]["generated_text"]
open(job["out"], "w").write(json.dumps(results))
"""


@pytest.fixture(scope="module")
def hf_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict, Path]:
    """(models, what transformers computed, root) for every MODELS export plus a chat export."""
    root = tmp_path_factory.mktemp("hf")
    models = {name: make_model(**overrides) for name, overrides in MODELS.items()}
    for name, model in models.items():
        export_model(model, None, root / name, ["safetensors"])
    models["chat"] = make_model(**ALL_MECHANISMS[COMPOSED])
    export_model(models["chat"], chat_tokenizer(), root / "chat", ["safetensors"])
    x = torch.randint(0, 64, (3, 17), generator=torch.Generator().manual_seed(5))
    np.save(root / "x.npy", x.numpy())
    job = {
        "x": str(root / "x.npy"),
        "folders": {name: str(root / name) for name in models if name != "chat"},
        "chat": str(root / "chat"),
        "prompt": PROMPT,
        "new": NEW_TOKENS,
        "padded": [[0] * (len(PROMPT[0]) - len(OTHER)) + OTHER, PROMPT[0]],
        "messages": MESSAGES,
        "out": str(root / "results.json"),
    }
    proc = subprocess.run(
        [sys.executable, "-I", "-c", HF_SCRIPT, json.dumps(job)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=600,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # a max_length in generation_config.json made every generate(max_new_tokens=...) warn
    assert "seem to have been set" not in proc.stderr, proc.stderr[-3000:]
    return models, json.loads((root / "results.json").read_text()), root


@pytest.mark.parametrize("name", sorted(MODELS))
def test_transformers_logits_equal_attnlab(hf_run, name: str) -> None:
    models, results, root = hf_run
    config = json.loads((root / name / "config.json").read_text())
    expected = NATIVE.get(name, "AttnlabForCausalLM")
    assert results[name]["class"] == config["architectures"][0] == expected
    if expected == "AttnlabForCausalLM":
        assert config["model_type"] == "attnlab" and "AutoModelForCausalLM" in config["auto_map"]
    x = torch.from_numpy(np.load(root / "x.npy"))
    ref = torch_logits(models[name], x)
    np.testing.assert_allclose(np.load(root / name / "hf_logits.npy"), ref, atol=1e-5, rtol=0)
    # attnlab reads the export back, whatever names transformers gave the weights
    np.testing.assert_array_equal(torch_logits(from_pretrained(root / name)[0], x), ref)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_transformers_greedy_generate_matches_attnlab(hf_run, name: str) -> None:
    models, results, _ = hf_run
    ref = models[name].generate(torch.tensor(PROMPT), NEW_TOKENS, temperature=0.0)[0].tolist()
    assert len(ref) == len(PROMPT[0]) + NEW_TOKENS  # no EOS in these exports: every step ran
    greedy = results[name]["greedy"]
    assert greedy["True"] == greedy["False"] == ref  # with and without the cache
    other = models[name].generate(torch.tensor([OTHER]), NEW_TOKENS, temperature=0.0)[0].tolist()
    pad = len(PROMPT[0]) - len(OTHER)
    assert greedy["padded"] == [[0] * pad + other, ref]


def test_transformers_tokenizer_chat_template_and_pipeline(hf_run) -> None:
    _, results, root = hf_run
    chat = results["chat"]
    assert chat["template"] == format_chatml(MESSAGES, add_generation_prompt=True)
    assert chat["roles"] == ["<|im_start|>", "<|im_end|>", "<|im_end|>", "<unk>"]
    unk = json.loads((root / "chat" / "tokenizer.json").read_text())["model"]["vocab"]["<unk>"]
    assert unk == 58  # the first id past the 58 of the tokenizer (the model has 64)
    tok = from_pretrained(root / "chat")[1]
    assert chat["unknown"] == [*tok.encode("ab"), unk]
    assert chat["pipeline"].startswith("To be") and len(chat["pipeline"]) > len("To be")


def test_remote_code_embeds_current_attnlab_source(hf_run) -> None:
    """The modeling file carries attnlab's model code verbatim: it cannot drift from it."""
    root = hf_run[2]
    tree = ast.parse((root / COMPOSED / MODELING).read_text())
    assigned = next(
        node.value
        for node in tree.body
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", "") == "SOURCES"
    )
    embedded = ast.literal_eval(assigned)
    assert embedded == embedded_sources()
    assert {"config.py", "model/gpt.py", "model/mechanisms/twicing.py"} <= set(embedded)
    imports = {
        n.names[0].name.split(".")[0]
        if isinstance(n, ast.Import)
        else (n.module or "").split(".")[0]
        for n in tree.body
        if isinstance(n, ast.Import | ast.ImportFrom) and not getattr(n, "level", 0)
    }
    assert imports <= {"__future__", "hashlib", "importlib", "re", "sys", "torch", "transformers"}
    # and the embedded modules need nothing beyond the standard library and torch
    for source in embedded.values():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.ImportFrom) and not node.level:
                top = (node.module or "").split(".")[0]
            elif isinstance(node, ast.Import):
                top = node.names[0].name.split(".")[0]
            else:
                continue
            assert top in sys.stdlib_module_names | {"torch", "attnlab"}, top
