"""llama.cpp's model file (GGUF) for the exports that are exactly GPT-2 or Llama.

``write_gguf`` writes the native export's weights (attnlab.model.hf_map) under llama.cpp's tensor
names (the ``gguf`` package's own map from Hugging Face names), with the metadata llama.cpp
reads: the architecture's sizes (context length included), and the tokenizer:

- ``bytebpe``: llama.cpp's ``gpt2`` tokenizer with GPT-2's pre-tokenizer and the merges;
- ``char``: llama.cpp's SentencePiece (``llama``) tokenizer with no merges, the space as ``▁`` and
  no space prefix: every character is one token, as in attnlab (it merges only into pieces the
  vocabulary holds, and a char vocabulary holds no two-character piece);
- word-level ``bpe`` is refused: no llama.cpp tokenizer joins its words back with attnlab's
  spacing.

Llama's q and k weights are permuted from Hugging Face's rotary layout (rotating the two halves
of a head) to llama.cpp's (rotating adjacent pairs), as llama.cpp's own converter does. A model
with a mechanism has no llama.cpp architecture and is refused in one line (``refusal``).

Precision: ``f32`` keeps every tensor as trained; ``f16`` and ``q8_0`` convert the matrices (norms
and biases stay f32, as llama.cpp's converter leaves them; a matrix whose rows are not whole
q8_0 blocks stays f16).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from attnlab.config import ModelConfig
from attnlab.errors import AttnlabError
from attnlab.export.hf import SPM_SPACE, ShippedTokenizer
from attnlab.model import hf_map, mechanisms

# export format -> (file, precision)
FORMATS = {
    "gguf": ("model.gguf", "f32"),
    "gguf-f16": ("model-f16.gguf", "f16"),
    "gguf-q8_0": ("model-q8_0.gguf", "q8_0"),
}
EXTRA = "gguf"  # pip install 'attnlab[gguf]'
# llama.cpp's name for the pre-tokenizer of GPT-2's byte-level BPE
GPT2_PRE = "gpt-2"


def refusal(config: ModelConfig, tokenizer: ShippedTokenizer | None) -> str | None:
    """Why llama.cpp cannot run this export as attnlab does (one line), None if it can."""
    kind = hf_map.native_kind(config)
    if kind is None:
        names = [s.label for s in mechanisms.specs() if s.enabled(config)]
        if names:
            what = f"the {', '.join(names)} mechanism{'s' if len(names) > 1 else ''}"
            return (
                f"GGUF: llama.cpp has no architecture for {what} (its gpt2 and llama graphs "
                "compute plain attention); export safetensors or onnx for this model"
            )
        return (
            f"GGUF: llama.cpp runs GPT-2's backbone (layernorm, learned positions, gelu) and "
            f"Llama's (rmsnorm, rope, swiglu), pre-norm with one FFN sub-layer; this model has "
            f"norm={config.norm}, pos={config.pos}, mlp={config.mlp}, "
            f"norm_placement={config.norm_placement}, ffn_sublayers={config.ffn_sublayers}"
        )
    if tokenizer is not None and tokenizer.kind == "bpe":
        return (
            "GGUF: llama.cpp has no tokenizer for word-level bpe (attnlab joins its words with "
            "its own spacing rules); prepare the data with --tokenizer bytebpe or char"
        )
    if tokenizer is not None and tokenizer.kind == "char" and SPM_SPACE in tokenizer.hf.get_vocab():
        return f"GGUF: the char vocabulary holds {SPM_SPACE!r}, which llama.cpp reads as a space"
    return None


def caveat(config: ModelConfig) -> str | None:
    """What llama.cpp computes a little differently from attnlab (a line for the log), if any."""
    if hf_map.native_kind(config) == "gpt2" and config.mlp == "gelu":
        return (
            "llama.cpp's gpt2 computes GELU with the tanh approximation, this model's is exact "
            "(mlp=gelu): its logits differ slightly there"
        )
    return None


def _gguf() -> Any:
    try:
        import gguf
    except ImportError:
        raise AttnlabError(
            f"--formats gguf needs the gguf package: pip install 'attnlab[{EXTRA}]'"
        ) from None
    return gguf


def permute_rotary(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Hugging Face's rotary layout of q or k rows (each head's two halves) -> llama.cpp's
    (adjacent pairs): row ``h*d + 2i + j`` takes row ``h*d + j*d/2 + i``."""
    rows = w.shape[0]
    return w.reshape(heads, 2, rows // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_tensors(
    sd: dict[str, torch.Tensor], config: ModelConfig, kind: str
) -> dict[str, torch.Tensor]:
    """llama.cpp's name -> tensor (torch's row-major layout) from a native export's state dict."""
    gguf = _gguf()
    arch = {"gpt2": gguf.MODEL_ARCH.GPT2, "llama": gguf.MODEL_ARCH.LLAMA}[kind]
    names = gguf.get_tensor_name_map(arch, config.n_layer)
    out = {}
    for key, value in sd.items():
        name = names.get_name(key, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise AttnlabError(f"GGUF: no llama.cpp tensor for {key}")
        if kind == "gpt2" and hf_map.is_conv1d(key):
            value = value.t()  # GPT-2's Conv1D stores [in, out]; llama.cpp reads nn.Linear's
        elif kind == "llama" and ".q_proj." in key:
            value = permute_rotary(value, config.n_head)
        elif kind == "llama" and ".k_proj." in key:
            value = permute_rotary(value, config.n_kv_head)
        out[name] = value.detach().float().contiguous()
    return out


def _vocab(tokenizer: ShippedTokenizer, rows: int, gguf: Any) -> tuple[list[str], list[int]]:
    """Every id's token and llama.cpp token type; ids past the tokenizer are unused rows."""
    types = gguf.TokenType
    by_id = {i: t for t, i in tokenizer.hf.get_vocab(with_added_tokens=True).items()}
    special = {
        i: t.content for i, t in tokenizer.hf.get_added_tokens_decoder().items() if t.special
    }
    unk = tokenizer.roles.get("unk_token")
    tokens, kinds = [], []
    for i in range(rows):
        token = by_id.get(i)
        if token is None:
            tokens.append(f"[PAD{i}]")
            kinds.append(types.UNUSED)
        elif token == unk:
            tokens.append(token)
            kinds.append(types.UNKNOWN)
        elif i in special:
            tokens.append(token)
            kinds.append(types.CONTROL)
        else:
            tokens.append(SPM_SPACE if tokenizer.kind == "char" and token == " " else token)
            kinds.append(types.NORMAL)
    return tokens, kinds


def _add_tokenizer(writer: Any, tokenizer: ShippedTokenizer, rows: int, gguf: Any) -> None:
    tokens, kinds = _vocab(tokenizer, rows, gguf)
    writer.add_token_list(tokens)
    writer.add_token_types(kinds)
    if tokenizer.kind == "bytebpe":
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre(GPT2_PRE)
        merges = json.loads(tokenizer.hf.to_str())["model"]["merges"]
        writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in merges])
    else:  # char: a merge-free SentencePiece vocabulary
        writer.add_tokenizer_model("llama")
        writer.add_token_scores([0.0] * rows)
        writer.add_add_space_prefix(False)
    ids = {role: tokenizer.hf.token_to_id(t) for role, t in tokenizer.roles.items()}
    setters: dict[str, Callable[[int], None]] = {
        "bos_token": writer.add_bos_token_id,
        "eos_token": writer.add_eos_token_id,
        "pad_token": writer.add_pad_token_id,
        "unk_token": writer.add_unk_token_id,
    }
    for role, i in ids.items():
        setters[role](i)
    writer.add_add_bos_token(False)  # attnlab's models train on no start token
    writer.add_add_eos_token(False)


def _add_sizes(writer: Any, config: ModelConfig, kind: str, rows: int) -> None:
    writer.add_context_length(config.block_size)
    writer.add_embedding_length(config.n_embd)
    writer.add_block_count(config.n_layer)
    writer.add_feed_forward_length(config.d_ffn)
    writer.add_head_count(config.n_head)
    writer.add_vocab_size(rows)
    if kind == "gpt2":
        writer.add_layer_norm_eps(config.norm_eps)
        return
    writer.add_head_count_kv(config.n_kv_head)
    writer.add_layer_norm_rms_eps(config.norm_eps)
    writer.add_rope_freq_base(config.rope_theta)
    writer.add_rope_dimension_count(config.head_dim)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)


def _stored(value: torch.Tensor, precision: str, gguf: Any) -> tuple[np.ndarray, Any]:
    """(data, GGML type) of one tensor at ``precision``; vectors stay f32."""
    types = gguf.GGMLQuantizationType
    array = value.numpy()
    if precision == "f32" or array.ndim < 2:
        return array, types.F32
    block = gguf.GGML_QUANT_SIZES[types.Q8_0][0]
    if precision == "q8_0" and array.shape[-1] % block == 0:
        return gguf.quants.quantize(array, types.Q8_0), types.Q8_0
    return array.astype(np.float16), types.F16


def write_gguf(
    path: Path,
    config: ModelConfig,
    sd: dict[str, torch.Tensor],
    tokenizer: ShippedTokenizer | None,
    precision: str,
    name: str,
) -> None:
    """The GGUF file of a native export (``sd``: its safetensors' state dict), at ``precision``
    (f32, f16 or q8_0). Call ``refusal`` first."""
    gguf = _gguf()
    kind = hf_map.native_kind(config)
    assert kind is not None, "refusal() first"
    file_types = gguf.LlamaFileType
    file_type = {
        "f32": file_types.ALL_F32,
        "f16": file_types.MOSTLY_F16,
        "q8_0": file_types.MOSTLY_Q8_0,
    }[precision]
    writer = gguf.GGUFWriter(str(path), kind)
    writer.add_name(name)
    writer.add_file_type(file_type)
    _add_sizes(writer, config, kind, config.vocab_size)
    if tokenizer is not None:
        _add_tokenizer(writer, tokenizer, config.vocab_size, gguf)
    for tensor, value in gguf_tensors(sd, config, kind).items():
        data, ggml_type = _stored(value, precision, gguf)
        writer.add_tensor(tensor, data, raw_dtype=ggml_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
