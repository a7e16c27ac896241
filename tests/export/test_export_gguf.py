"""`attnlab export --formats gguf`: llama.cpp's file for the native GPT-2 and Llama exports, read
back with the gguf package's own reader: metadata, tokenizer, and every tensor equal to the
export's safetensors after the layout llama.cpp expects (GPT-2's Conv1D transposed back, Llama's
q/k rows in adjacent rotary pairs). Refusals: a mechanism, a backbone llama.cpp lacks, bpe."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")

TEXT = "ROMEO: What say you, my lord?\nJULIET: Nothing at all.\n" * 30
LLAMA = dict(norm="rmsnorm", pos="rope", mlp="swiglu", n_kv_head=2)


def tokenizer(kind: str):
    from attnlab.data.tokenizer import Tokenizer

    if kind == "bytebpe":
        return Tokenizer.train_byte_bpe(TEXT, 300)
    if kind == "bpe":
        return Tokenizer.train_bpe(TEXT, 60)
    return Tokenizer.train_char(TEXT)


def model(tok, **arch):
    from attnlab.config import ModelConfig
    from attnlab.model import GPT

    torch.manual_seed(0)
    config = dict(block_size=32, vocab_size=tok.vocab_size, n_layer=2, n_head=4, n_embd=64)
    return GPT(ModelConfig(**{**config, **arch}))


def exported(tmp: Path, kind: str, arch: dict, formats: str) -> Path:
    from attnlab.export import export_model, parse_formats

    tok = tokenizer(kind)
    out = tmp / "export"
    export_model(model(tok, **arch), tok, out, parse_formats(f"safetensors,{formats}"))
    return out


def fields(reader) -> dict:
    return {k: f.contents() for k, f in reader.fields.items()}


# llama.cpp's names of the HF tensors, per architecture: (whole-model, per-block)
GGUF_NAMES = {
    "gpt2": (
        {"transformer.wte": "token_embd", "transformer.wpe": "position_embd",
         "transformer.ln_f": "output_norm", "lm_head": "output"},
        {"ln_1": "attn_norm", "attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output",
         "ln_2": "ffn_norm", "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"},
    ),
    "llama": (
        {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"},
        {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
         "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
         "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
         "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"},
    ),
}  # fmt: skip
CONV1D = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")  # GPT-2's [in, out] weights


def expected(out: Path) -> dict[str, np.ndarray]:
    """The safetensors in llama.cpp's names and layouts, written out here by hand."""
    from safetensors.numpy import load_file

    config = json.loads((out / "config.json").read_text())
    top, block = GGUF_NAMES[config["model_type"]]
    heads = {
        "self_attn.q_proj": config.get("num_attention_heads"),
        "self_attn.k_proj": config.get("num_key_value_heads"),
    }
    want = {}
    for key, value in load_file(out / "model.safetensors").items():
        stem, part = key.rsplit(".", 1)
        if stem in top:
            want[f"{top[stem]}.{part}"] = value
            continue
        layer, rest = stem.split(".")[2], stem.split(".", 3)[3]
        if part == "weight" and rest in CONV1D:
            value = value.T
        if rest in heads:  # rows h*d + j*d/2 + i -> h*d + 2i + j
            n, d = heads[rest], value.shape[0] // heads[rest]
            order = [h * d + j * d // 2 + i for h in range(n) for i in range(d // 2) for j in range(2)]  # fmt: skip
            value = value[order]
        want[f"blk.{layer}.{block[rest]}.{part}"] = value
    return want


@pytest.mark.parametrize(
    ("kind", "arch"), [("bytebpe", LLAMA), ("bytebpe", {}), ("char", LLAMA), ("char", {})]
)
def test_gguf_reads_back_equal_to_the_safetensors(tmp_path: Path, kind: str, arch: dict) -> None:
    out = exported(tmp_path, kind, arch, "gguf")
    reader = gguf.GGUFReader(out / "model.gguf")
    got = {t.name: np.asarray(t.data) for t in reader.tensors}
    want = expected(out)
    assert sorted(got) == sorted(want)
    for name, value in want.items():
        assert got[name].dtype == np.float32 and np.array_equal(got[name], value), name
    meta = fields(reader)
    config = json.loads((out / "config.json").read_text())
    arch_name = config["model_type"]
    assert meta["general.architecture"] == arch_name
    assert meta[f"{arch_name}.context_length"] == 32
    assert meta[f"{arch_name}.block_count"] == 2 and meta[f"{arch_name}.embedding_length"] == 64
    assert meta["general.file_type"] == 0
    if arch_name == "llama":
        assert meta["llama.attention.head_count_kv"] == 2
        assert meta["llama.rope.dimension_count"] == 16
    # the tokenizer: every id's token, the specials' ids, merges for byte-level BPE
    hf = json.loads((out / "tokenizer.json").read_text())
    vocab = {**hf["model"]["vocab"], **{t["content"]: t["id"] for t in hf["added_tokens"]}}
    tokens = meta["tokenizer.ggml.tokens"]
    assert len(tokens) == config["vocab_size"]
    for token, i in vocab.items():
        assert tokens[i] == ("\u2581" if kind == "char" and token == " " else token)
    assert meta["tokenizer.ggml.eos_token_id"] == config["eos_token_id"]
    assert meta["tokenizer.ggml.add_bos_token"] is False
    if kind == "bytebpe":
        assert meta["tokenizer.ggml.model"] == "gpt2" and meta["tokenizer.ggml.pre"] == "gpt-2"
        merges = [" ".join(m) if isinstance(m, list) else m for m in hf["model"]["merges"]]
        assert meta["tokenizer.ggml.merges"] == merges
    else:  # merge-free SentencePiece: one character, one token
        assert meta["tokenizer.ggml.model"] == "llama"
        assert meta["tokenizer.ggml.add_space_prefix"] is False
        assert "tokenizer.ggml.merges" not in meta


def test_gguf_f16_and_q8_0_hold_the_weights_at_their_precision(tmp_path: Path) -> None:
    out = exported(tmp_path, "bytebpe", LLAMA, "gguf-f16,gguf-q8_0")
    want = expected(out)
    types = gguf.GGMLQuantizationType
    f16 = {t.name: t for t in gguf.GGUFReader(out / "model-f16.gguf").tensors}
    q8 = {t.name: t for t in gguf.GGUFReader(out / "model-q8_0.gguf").tensors}
    assert fields(gguf.GGUFReader(out / "model-q8_0.gguf"))["general.file_type"] == 7
    for name, value in want.items():
        if value.ndim == 1:  # norms and biases stay f32
            assert f16[name].tensor_type == q8[name].tensor_type == types.F32
            continue
        assert f16[name].tensor_type == types.F16
        assert np.array_equal(np.asarray(f16[name].data), value.astype(np.float16))
        assert q8[name].tensor_type == types.Q8_0  # 64-wide rows: whole blocks of 32
        assert np.array_equal(np.asarray(q8[name].data), gguf.quants.quantize(value, types.Q8_0))
        back = gguf.quants.dequantize(np.asarray(q8[name].data), types.Q8_0).reshape(value.shape)
        # q8_0: each block of 32 scaled by its largest magnitude / 127
        assert np.abs(back - value).max() <= np.abs(value).max() / 127


def test_export_all_writes_no_gguf(tmp_path: Path) -> None:
    from attnlab.export import parse_formats

    assert not any(f.startswith("gguf") for f in parse_formats("all"))
    assert parse_formats("all,gguf")[-1] == "gguf"


@pytest.mark.parametrize(
    ("kind", "arch", "why"),
    [
        (
            "bytebpe",
            {"use_m_gate": True},
            "llama.cpp has no architecture for the kv-bias mechanism",
        ),
        ("bytebpe", {"norm_placement": "post"}, "norm_placement=post"),
        ("bpe", LLAMA, "llama.cpp has no tokenizer for word-level bpe"),
    ],
)
def test_gguf_refuses_what_llama_cpp_cannot_run_in_one_line(
    tmp_path: Path, capsys, kind: str, arch: dict, why: str
) -> None:
    """Through the CLI: exit 2, one line saying why, no --out made."""
    from test_folder_safety import snapshot

    from attnlab.cli import main as cli_main
    from attnlab.train.checkpoint import save_checkpoint

    tok = tokenizer(kind)
    save_checkpoint(tmp_path / "ckpt", model(tok, **arch), tok)
    before = snapshot(tmp_path)
    argv = ["export", str(tmp_path / "ckpt"), "--formats", "gguf", "--out", str(tmp_path / "out")]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnlab export: error: GGUF: ") and err.count("\n") == 1, err
    assert why in err
    assert snapshot(tmp_path) == before
