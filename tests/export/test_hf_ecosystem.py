"""Hugging Face tools on attnlab exports, where attnlab is not installed: complete tokenizers
(text keeps its spaces, real bos / eos / pad / unk), batched pipelines, hidden states, gradient
checkpointing, a sequence-classification head, generate that never draws an added row, and
generate past block_size.

One subprocess (transformers imported once, attnlab blocked on sys.meta_path) runs every check
on the folders the module fixture exports and saves what it got; the tests compare with attnlab.
ATTNLAB_HF_PYTHON names another interpreter for it (a venv with transformers 4.x, say).
"""

from __future__ import annotations

import json
import os
import string
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import tiny_model
from test_export import ALL_MECHANISMS, COMPOSED

from attnlab.data.tokenizer import Tokenizer
from attnlab.export import export_model
from attnlab.export.hf import ADDED_KEY, EOT
from attnlab.model.gpt import GPT

pytest.importorskip("transformers")

TEXT = "The quick brown fox, the lazy dog.\nThe end"
PROMPTS = ["The quick", "A"]  # a batch of two lengths: the pipeline pads one
NEW_TOKENS = 8
HF_PYTHON = os.environ.get("ATTNLAB_HF_PYTHON", sys.executable)
LLAMA = dict(n_kv_head=2, pos="rope", norm="rmsnorm", mlp="swiglu")
# name -> (model overrides, tokenizer kind); remote and gpt2 have no spare row, llama has;
# zero-rows-win is a GPT-2 whose every real logit is negative (negative_head)
EXPORTS = {
    "gpt2": ({}, "char"),
    "llama": (LLAMA, "bytebpe"),
    # remote code: each largest set of mechanisms that composes ("remote": the largest)
    **{
        "remote" if label == COMPOSED else f"remote-{label}": (fields, "char")
        for label, fields in ALL_MECHANISMS.items()
    },
    "zero-rows-win": ({"bias": True, "tie_embeddings": False}, "char"),
}
HF_SCRIPT = r"""
import importlib.abc, json, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "attnlab":
            raise ImportError("attnlab is blocked")
sys.meta_path.insert(0, Block())
import numpy as np, torch
import transformers
from transformers import (
    AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer, pipeline,
)
from transformers.utils import logging
logging.set_verbosity_error()
logging.disable_progress_bar()
job = json.loads(sys.argv[1])
results = {"version": transformers.__version__}
for name, folder in job["folders"].items():
    r = results[name] = {}
    tok = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    enc = tok(job["text"])
    r["keys"] = sorted(enc)
    r["ids"] = enc["input_ids"]
    r["decoded"] = tok.decode(enc["input_ids"], skip_special_tokens=True)
    r["unknown"] = tok("a\u20acb")["input_ids"]
    r["roles"] = {
        role: [getattr(tok, role + "_token"), getattr(tok, role + "_token_id")]
        for role in ("bos", "eos", "pad", "unk")
    }
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).eval()
    with torch.no_grad():
        out = model(**tok(job["text"], return_tensors="pt"), output_hidden_states=True)
    np.save(f"{folder}/hf_logits.npy", out.logits.numpy())
    hidden = out.hidden_states
    r["hidden"] = len(hidden)
    with torch.no_grad():
        head = model.get_output_embeddings()(hidden[-1])
    r["head_of_last_hidden"] = float((head - out.logits).abs().max())
    generator = pipeline("text-generation", model=folder, tokenizer=tok, trust_remote_code=True)
    outs = generator(job["prompts"], max_new_tokens=job["new"], do_sample=False, batch_size=2)
    r["pipeline"] = [o[0]["generated_text"] for o in outs]
    prompt = tok(job["prompts"][0], return_tensors="pt")
    torch.manual_seed(0)
    sampled = model.generate(**prompt, max_new_tokens=4 * job["new"], do_sample=True)
    r["sampled"] = sampled[0, prompt["input_ids"].size(1) :].tolist()
    try:  # past the context: one line, or what transformers' own model does
        model.generate(**prompt, max_new_tokens=model.config.max_position_embeddings)
        r["past_block"] = None
    except Exception as e:
        r["past_block"] = [type(e).__name__, str(e)]
    # a head on the last real token of a padded batch (the pipeline made the padding left)
    classifier = AutoModelForSequenceClassification.from_pretrained(
        folder, num_labels=3, trust_remote_code=True
    ).eval()
    batch = tok(job["prompts"], return_tensors="pt", padding=True)
    with torch.no_grad():
        scores = classifier(**batch).logits
        last = model(**batch, output_hidden_states=True).hidden_states[-1]
        weight = classifier.score.weight
    mask = batch["attention_mask"]
    at = (mask * torch.arange(mask.size(1))).argmax(-1)
    expected = last[torch.arange(len(at)), at] @ weight.T
    r["classifier"] = [type(classifier).__name__, float((scores - expected).abs().max())]
    try:
        import peft
    except ImportError:
        r["peft"] = None
    else:  # LoRA starts as the model itself; a step reaches only the adapters
        lora = peft.get_peft_model(
            model, peft.LoraConfig(r=4, target_modules="all-linear", task_type="CAUSAL_LM")
        )
        with torch.no_grad():
            same = float((lora(**batch).logits - model(**batch).logits).abs().max())
        lora.train()
        lora(**batch, labels=batch["input_ids"]).loss.backward()
        grads = {n for n, p in lora.named_parameters() if p.grad is not None and p.grad.any()}
        r["peft"] = [same, bool(grads), all("lora_" in n for n in grads)]
        model = lora.unload().eval().requires_grad_(True)  # the base as it was, unfrozen
    if not name.startswith("remote"):
        continue
    x = torch.tensor([r["ids"]])
    with torch.no_grad():
        kept = model(x, logits_to_keep=2).logits
    r["kept"] = float((kept - out.logits[:, -2:]).abs().max()) if kept.size(1) == 2 else None
    # gradient checkpointing: the same loss and gradients, the blocks run twice
    model.train()
    calls = []
    hook = model.transformer.h[0].attn.register_forward_hook(lambda *a: calls.append(1))
    grads = []
    for checkpointing in (False, True):
        if checkpointing:
            model.gradient_checkpointing_enable()
        model.zero_grad()
        model(x, labels=x).loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    hook.remove()
    r["checkpoint_calls"] = len(calls)
    r["checkpoint_grads"] = sorted(grads[0]) == sorted(grads[1]) and max(
        float((grads[0][n] - grads[1][n]).abs().max()) for n in grads[0]
    )
open(job["out"], "w").write(json.dumps(results))
"""


def char_tokenizer() -> Tokenizer:
    return Tokenizer.from_chars(sorted(string.ascii_letters + " \n.,"))


def byte_tokenizer() -> Tokenizer:
    return Tokenizer.train_byte_bpe((TEXT + " ") * 20, 300)


def fitted_model(tokenizer: Tokenizer, spare: int = 0, **overrides) -> GPT:
    """A tiny model with the tokenizer's rows plus ``spare``, weights large enough to matter."""
    torch.manual_seed(0)
    config = tiny_model(block_size=64, vocab_size=tokenizer.vocab_size + spare, **overrides)
    model = GPT(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    return model


def negative_head(model: GPT) -> None:
    """Make every real logit negative at every position: the final norm outputs its bias alone
    and the untied head points away from it. An added zero row (logit 0) would then win every
    greedy step and most samples."""
    with torch.no_grad():
        ln_f, head = model.transformer.ln_f, model.lm_head
        ln_f.weight.zero_()
        head.weight.copy_(-ln_f.bias + 0.02 * torch.randn_like(head.weight))


def run_transformers(python: str, folders: dict[str, Path], root: Path) -> dict:
    """What HF_SCRIPT computed under ``python`` for ``folders``."""
    job = {
        "folders": {name: str(folder) for name, folder in folders.items()},
        "text": TEXT,
        "prompts": PROMPTS,
        "new": NEW_TOKENS,
        "out": str(root / "results.json"),
    }
    proc = subprocess.run(
        [python, "-I", "-c", HF_SCRIPT, json.dumps(job)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=600,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((root / "results.json").read_text())


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict, Path]:
    """({name: (model, tokenizer)}, what transformers computed, root)."""
    root = tmp_path_factory.mktemp("hf_ecosystem")
    made = {}
    for name, (overrides, kind) in EXPORTS.items():
        tok = char_tokenizer() if kind == "char" else byte_tokenizer()
        # llama has a spare row: its one missing token takes it, no row is added
        model = fitted_model(tok, spare=int(name == "llama"), **overrides)
        if name == "zero-rows-win":
            negative_head(model)
        made[name] = (model, tok)
        export_model(model, tok, root / name, ["safetensors"])
    results = run_transformers(HF_PYTHON, {n: root / n for n in made}, root)
    return made, results, root


def greedy_text(model: GPT, tok: Tokenizer, prompt: str) -> str:
    ids = torch.tensor([tok.encode(prompt)])
    return tok.decode(model.generate(ids, NEW_TOKENS, temperature=0.0)[0].tolist())


@pytest.mark.parametrize("name", sorted(EXPORTS))
def test_tokenizer_text_round_trips_and_special_tokens_are_real(exports, name: str) -> None:
    made, results, root = exports
    model, tok = made[name]
    r = results[name]
    assert r["ids"] == tok.encode(TEXT)
    assert r["keys"] == ["attention_mask", "input_ids"]  # no token_type_ids on transformers 4
    assert r["decoded"] == TEXT  # spaces and newlines kept
    config = json.loads((root / name / "config.json").read_text())
    rows = config["vocab_size"]
    eos = r["roles"]["eos"][1]
    assert r["roles"]["bos"] == r["roles"]["eos"] == r["roles"]["pad"] == [EOT, eos]
    assert tok.vocab_size <= eos < rows  # its own row, never a foreign id
    assert config["bos_token_id"] == config["eos_token_id"] == config["pad_token_id"] == eos
    if tok.kind == "char":
        unk = r["roles"]["unk"]
        assert unk[0] == "<unk>" and tok.vocab_size <= unk[1] < rows
        assert r["unknown"] == [tok.encode("a")[0], unk[1], tok.encode("b")[0]]
        added = {EOT: tok.vocab_size, "<unk>": tok.vocab_size + 1}
    else:  # byte-level BPE knows every text; the end token took the model's spare row
        assert r["roles"]["unk"] == [None, None]
        assert tok.decode(r["unknown"]) == "a\u20acb"
        added = {}
    assert rows == max(model.config.vocab_size, tok.vocab_size + len(added))
    assert config.get(ADDED_KEY, {}) == added
    generation = json.loads((root / name / "generation_config.json").read_text())
    assert generation.get("suppress_tokens", []) == sorted(added.values())


@pytest.mark.parametrize("name", sorted(EXPORTS))
def test_tokenized_logits_equal_attnlab_and_added_rows_are_zero(exports, name: str) -> None:
    made, results, root = exports
    model, tok = made[name]
    with torch.no_grad():
        ref = model(torch.tensor([tok.encode(TEXT)]), all_logits=True)[0].numpy()
    logits = np.load(root / name / "hf_logits.npy")
    v = model.config.vocab_size
    np.testing.assert_allclose(logits[..., :v], ref, atol=1e-5, rtol=0)
    assert not logits[..., v:].any()  # the added rows: logit 0, every other logit unchanged
    assert results[name]["hidden"] == model.config.n_layer + 1
    assert results[name]["head_of_last_hidden"] == 0.0


@pytest.mark.parametrize("name", sorted(EXPORTS))
def test_batched_pipeline_text_equals_attnlab_greedy(exports, name: str) -> None:
    made, results, _ = exports
    model, tok = made[name]
    assert results[name]["pipeline"] == [greedy_text(model, tok, p) for p in PROMPTS]


@pytest.mark.parametrize("name", sorted(EXPORTS))
def test_sequence_classification_scores_the_last_real_token(exports, name: str) -> None:
    classes = {"gpt2": "GPT2", "llama": "Llama", "zero-rows-win": "GPT2"}  # else remote code
    cls, diff = exports[1][name]["classifier"]
    assert cls == f"{classes.get(name, 'Attnlab')}ForSequenceClassification"
    assert diff < 1e-5


@pytest.mark.parametrize("name", sorted(EXPORTS))
def test_generate_never_draws_an_added_row(exports, name: str) -> None:
    """generation_config.json's suppress_tokens: sampled tokens are real ones (greedy ones are
    attnlab's: test_batched_pipeline_text_equals_attnlab_greedy, zero-rows-win included)."""
    _, results, root = exports
    added = json.loads((root / name / "config.json").read_text()).get(ADDED_KEY, {})
    sampled = results[name]["sampled"]
    assert sampled and not set(sampled) & set(added.values())
    if name == "zero-rows-win":  # the added rows would have won every step
        assert added and len(sampled) == 4 * NEW_TOKENS


@pytest.mark.parametrize("backend", ["torch", "onnxruntime"])
def test_attnlab_sample_never_draws_an_added_row(
    exports, tmp_path: Path, capsys, backend: str
) -> None:
    """`attnlab sample` on the export: greedy text is the model's own, and sampling runs its full
    length (the added end token would have stopped it at once, <unk> printed itself)."""
    from attnlab.cli import main

    made, _, root = exports
    model, tok = made["zero-rows-win"]
    folder = root / "zero-rows-win"
    if backend == "onnxruntime":
        folder = tmp_path / "onnx"
        export_model(model, tok, folder, ["safetensors", "onnx"])
    args = ["sample", str(folder), "--backend", backend, "--prompt", PROMPTS[0], "--device", "cpu"]
    args += ["--max-new-tokens", str(4 * NEW_TOKENS)]
    assert main([*args, "--temperature", "0"]) == 0
    ids = torch.tensor([tok.encode(PROMPTS[0])])
    greedy = tok.decode(model.generate(ids, 4 * NEW_TOKENS, temperature=0.0)[0].tolist())
    assert capsys.readouterr().out == greedy + "\n"
    assert main([*args, "--temperature", "1", "--seed", "3"]) == 0
    text = capsys.readouterr().out
    assert len(text) == len(PROMPTS[0]) + 4 * NEW_TOKENS + 1 and "<" not in text


def test_remote_generate_past_block_size_is_one_line(exports) -> None:
    made, results, _ = exports
    block = made["remote"][0].config.block_size
    error, message = results["remote"]["past_block"]
    assert error == "ValueError" and "\n" not in message
    assert message == f"cannot forward {block + 1} positions, block_size is {block}"


# (zero-rows-win's final norm passes no gradient back: nothing before it can learn)
@pytest.mark.parametrize("name", ["gpt2", "llama", "remote"])
def test_peft_lora_trains_an_export(exports, name: str) -> None:
    r = exports[1][name]
    if r["peft"] is None:
        pytest.skip(f"peft is not installed where transformers runs ({HF_PYTHON})")
    same, trained, only_adapters = r["peft"]
    assert same == 0.0 and trained and only_adapters


def test_remote_gradient_checkpointing_recomputes_with_equal_gradients(exports) -> None:
    r = exports[1]["remote"]
    assert r["kept"] == 0.0  # logits_to_keep: the last positions' logits, as they are
    assert r["checkpoint_calls"] == 3  # once without, twice (forward and recompute) with it
    assert r["checkpoint_grads"] == 0.0


# --- lm-evaluation-harness --------------------------------------------------------------------

LMEVAL_DOCS = [
    {"context": "The quick", "continuation": " brown", "choices": ["brown", "lazy"], "label": 0},
    {"context": "A lazy dog", "continuation": ".", "choices": ["fox", "dog", "end"], "label": 2},
]
LMEVAL_TASKS = {
    "attnlab_ll": "output_type: loglikelihood\ndoc_to_target: '{{continuation}}'\n"
    "metric_list:\n  - metric: perplexity\n",
    "attnlab_mc": "output_type: multiple_choice\ndoc_to_choice: choices\ndoc_to_target: label\n"
    "metric_list:\n  - metric: acc\n",
    "attnlab_gen": "output_type: generate_until\ndoc_to_target: '{{continuation}}'\n"
    "generation_kwargs:\n  until: ['\\n']\n  max_gen_toks: 6\n  do_sample: false\n"
    "metric_list:\n  - metric: exact_match\n",
}


def write_lmeval_tasks(root: Path) -> Path:
    """Three tasks over one local JSONL: lm-eval reads them offline."""
    data = root / "docs.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in LMEVAL_DOCS))
    for task, body in LMEVAL_TASKS.items():
        (root / f"{task}.yaml").write_text(
            f"task: {task}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
            f"    test: {data}\ntest_split: test\ndoc_to_text: '{{{{context}}}}'\n{body}"
        )
    return root


def loglikelihood(model: GPT, tok: Tokenizer, context: str, continuation: str) -> float:
    """Sum of log p(continuation | context) over the export's rows, as lm-eval computes it."""
    ctx, cont = tok.encode(context), tok.encode(continuation)
    with torch.no_grad():
        logits = model(torch.tensor([ctx + cont]), all_logits=True)[0][0].double()
    logp = torch.log_softmax(logits, -1)[len(ctx) - 1 : -1]
    return float(logp[torch.arange(len(cont)), torch.tensor(cont)].sum())


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt2", "llama", "remote"])
def test_lm_eval_runs_an_export_out_of_the_box(exports, tmp_path: Path, name: str) -> None:
    python = os.environ.get("ATTNLAB_LMEVAL_PYTHON")
    if not python:
        pytest.skip("ATTNLAB_LMEVAL_PYTHON names no interpreter with lm-eval installed")
    from attnlab import from_pretrained

    root = exports[2]
    folder = root / name
    model, tok = from_pretrained(folder)  # the export's rows: lm-eval's softmax runs over them
    tasks = write_lmeval_tasks(tmp_path)
    out = tmp_path / "out"
    model_args = f"pretrained={folder},trust_remote_code=True"  # nothing else: out of the box
    args = ["--model", "hf", "--model_args", model_args, "--tasks", ",".join(LMEVAL_TASKS)]
    args += ["--include_path", str(tasks), "--device", "cpu", "--batch_size", "2"]
    proc = subprocess.run(
        [python, "-m", "lm_eval", *args, "--log_samples", "--output_path", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    samples = {
        path.name.split("_attnlab_")[1].split("_")[0]: [
            json.loads(line) for line in path.read_text().splitlines()
        ]
        for path in out.rglob("samples_attnlab_*.jsonl")
    }
    assert sorted(samples) == ["gen", "ll", "mc"]
    for s in samples["ll"]:
        doc = s["doc"]
        ll = float(s["resps"][0][0][0])
        assert ll == pytest.approx(
            loglikelihood(model, tok, doc["context"], doc["continuation"]), abs=1e-4
        )
    for s in samples["mc"]:
        doc = s["doc"]
        lls = [float(r[0][0]) for r in s["resps"]]
        ours = [loglikelihood(model, tok, doc["context"], " " + c) for c in doc["choices"]]
        assert lls == pytest.approx(ours, abs=1e-4)
        assert s["acc"] == float(int(np.argmax(ours)) == doc["label"])
    for s in samples["gen"]:
        doc = s["doc"]
        ids = torch.tensor([tok.encode(doc["context"])])
        text = tok.decode(model.generate(ids, 6, temperature=0.0)[0, ids.size(1) :].tolist())
        assert s["filtered_resps"][0] == text.split("\n")[0]
