"""attnlab <-> Hugging Face GPT-2 and Llama: configs and state_dicts, both ways, exactly.

A backbone with no mechanism is exactly one of two standard architectures:

- nanoGPT's (LayerNorm, learned positions, GELU MLP, Pre-LN) is ``GPT2LMHeadModel`` with
  ``activation_function="gelu"`` (exact; ``mlp="gelu_tanh"`` is GPT-2's own ``"gelu_new"``). GPT-2's linear layers are ``Conv1D`` (weights stored
  [in, out], the transpose of ``nn.Linear``) and always have biases: a ``bias=False`` model
  gets zero biases, which compute the same function, and ``attnlab_bias: false`` in config.json
  (which transformers keeps and ignores) so that reading it back drops them again;
- the modern one (RMSNorm, RoPE, SwiGLU, optional GQA, one FFN sub-layer) is
  ``LlamaForCausalLM``: the fused ``c_attn`` splits into q/k/v_proj and the fused SwiGLU
  ``c_fc`` into gate_proj and up_proj.

``config.json`` of an attnlab export with remote code is the ModelConfig plus the keys
transformers reads (``model_type="attnlab"`` ...); ``config_from_hf`` reads all three kinds.
"""

from __future__ import annotations

import json
from typing import Any

import torch

from attnlab.config import ModelConfig
from attnlab.errors import AttnlabError, ConfigError
from attnlab.model import mechanisms

KINDS = ("gpt2", "llama")
_GPT2_CONV1D = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
# transformers' activation names -> attnlab's mlp: exact GELU, or GPT-2's tanh approximation
_GPT2_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}
# config.json's record that a GPT-2 export's biases are zeros standing in for none (bias=False)
GPT2_BIAS = "attnlab_bias"
_LLAMA_BLOCK = {
    "ln_1.weight": "input_layernorm.weight",
    "ln_2.weight": "post_attention_layernorm.weight",
    "attn.c_proj": "self_attn.o_proj",
    "mlp.c_proj": "mlp.down_proj",
}


def native_kind(config: ModelConfig) -> str | None:
    """ "gpt2" or "llama" when ``config`` is exactly that architecture, else None."""
    if mechanisms.enabled(config):  # a mechanism has no standard architecture to map to
        return None
    if config.norm_placement != "pre" or config.ffn_sublayers != 1:
        return None
    parts = (config.norm, config.pos, config.mlp)
    gelu = config.mlp in ("gelu", "gelu_tanh")
    if parts[:2] == ("layernorm", "learned") and gelu and config.n_kv_head == config.n_head:
        return "gpt2"
    if parts == ("rmsnorm", "rope", "swiglu"):
        return "llama"
    return None


# --- configs ---------------------------------------------------------------------------------


def config_to_hf(config: ModelConfig, kind: str | None) -> dict[str, Any]:
    """config.json keys for ``kind`` ("gpt2", "llama", or None: attnlab's own with remote code)."""
    common = {"vocab_size": config.vocab_size, "tie_word_embeddings": config.tie_embeddings}
    if kind == "gpt2":
        return {
            "model_type": "gpt2",
            "architectures": ["GPT2LMHeadModel"],
            **common,
            "n_positions": config.block_size,
            "n_embd": config.n_embd,
            "n_layer": config.n_layer,
            "n_head": config.n_head,
            "n_inner": config.d_ffn,
            "activation_function": "gelu" if config.mlp == "gelu" else "gelu_new",
            "layer_norm_epsilon": config.norm_eps,
            "resid_pdrop": config.dropout,
            "embd_pdrop": config.dropout,
            "attn_pdrop": config.dropout,
            GPT2_BIAS: config.bias,
        }
    if kind == "llama":
        return {
            "model_type": "llama",
            "architectures": ["LlamaForCausalLM"],
            **common,
            "hidden_size": config.n_embd,
            "intermediate_size": config.d_ffn,
            "num_hidden_layers": config.n_layer,
            "num_attention_heads": config.n_head,
            "num_key_value_heads": config.n_kv_head,
            "head_dim": config.head_dim,
            "max_position_embeddings": config.block_size,
            "rms_norm_eps": config.norm_eps,
            "rope_theta": config.rope_theta,
            "attention_bias": config.bias,
            "mlp_bias": config.bias,
            "attention_dropout": config.dropout,
            "hidden_act": "silu",
        }
    return {**config.to_dict(), **common, "model_type": "attnlab"}


_REQUIRED = object()
_KIND_NAMES = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}
# GPT-2 options that change its maths from attnlab's backbone, with the value attnlab computes
_GPT2_FIXED = {
    "scale_attn_weights": True,
    "scale_attn_by_inverse_layer_idx": False,
    "add_cross_attention": False,
}


class _Reader:
    """Typed reads of a config.json written by someone else: a value of the wrong type, or a
    missing one, is one line naming the key (``int("x")`` or ``data["hidden_size"]`` was a
    traceback, ``int(1.5)`` a silently different model)."""

    def __init__(self, data: dict[str, Any], source: str) -> None:
        self.data, self.source = data, source

    def value(self, *names: str, default: Any = _REQUIRED, kind: type = int) -> Any:
        """The first of ``names`` that is set (not null), checked to be a ``kind``."""
        name = next((n for n in names if self.data.get(n) is not None), None)
        if name is None:
            if default is _REQUIRED:
                raise AttnlabError(f"{self.source}: {names[0]} is missing")
            return default
        value = self.data[name]
        kinds = (int, float) if kind is float else (kind,)
        if isinstance(value, bool) != (kind is bool) or not isinstance(value, kinds):
            raise AttnlabError(f"{self.source}: {name} must be {_KIND_NAMES[kind]}, not {value!r}")
        return value

    def section(self, name: str) -> _Reader:
        """A nested object (rope_scaling, rope_parameters); null reads as empty."""
        value = self.data.get(name) or {}
        if not isinstance(value, dict):
            raise AttnlabError(f"{self.source}: {name} must be an object, not {value!r}")
        return _Reader(value, f"{self.source}: {name}")


def config_from_hf(data: dict[str, Any], source: str = "config.json") -> ModelConfig:
    """The ModelConfig of an HF config.json of model_type attnlab, gpt2 or llama."""
    try:
        return _config_from_hf(data, source)
    except ConfigError as e:  # a value ModelConfig refuses: name the file it came from
        raise AttnlabError(f"{source}: {e}") from None


def _config_from_hf(data: dict[str, Any], source: str) -> ModelConfig:
    kind = data.get("model_type")
    if kind == "attnlab":
        return ModelConfig.from_dict(
            {k: v for k, v in data.items() if k in ModelConfig.field_names()}
        )
    read = _Reader(data, source)
    tie = read.value("tie_word_embeddings", default=True, kind=bool)
    if kind == "gpt2":
        act = read.value("activation_function", default="gelu_new", kind=str)
        if act not in _GPT2_ACTIVATIONS:
            raise AttnlabError(
                f"{source}: activation_function {act!r}; attnlab's GPT-2 backbone has "
                f"{', '.join(map(repr, _GPT2_ACTIVATIONS))}"
            )
        for name, fixed in _GPT2_FIXED.items():
            if read.value(name, default=fixed, kind=bool) != fixed:
                raise AttnlabError(
                    f"{source}: {name}={json.dumps(not fixed)}; attnlab's GPT-2 backbone "
                    f"computes {name}={json.dumps(fixed)}"
                )
        n_embd = read.value("n_embd", default=768)
        positions = read.value("n_positions", default=1024)
        n_ctx = read.value("n_ctx", default=positions)  # older files' name for the context
        if n_ctx != positions:  # which one the model was trained for is unknown
            raise AttnlabError(
                f"{source}: n_ctx {n_ctx} and n_positions {positions} disagree; attnlab's GPT-2 "
                "backbone has one context length (set both to it)"
            )
        return ModelConfig(
            block_size=positions,
            vocab_size=read.value("vocab_size"),
            n_layer=read.value("n_layer", default=12),
            n_head=read.value("n_head", default=12),
            n_embd=n_embd,
            d_ffn=read.value("n_inner", default=4 * n_embd),
            norm_eps=float(read.value("layer_norm_epsilon", default=1e-5, kind=float)),
            mlp=_GPT2_ACTIVATIONS[act],
            bias=read.value(GPT2_BIAS, default=True, kind=bool),
            tie_embeddings=tie,
        )
    if kind == "llama":
        act = read.value("hidden_act", default="silu", kind=str)
        scaling, params = read.section("rope_scaling"), read.section("rope_parameters")
        rope_type = scaling.value("rope_type", "type", default=None, kind=str) or params.value(
            "rope_type", default="default", kind=str
        )
        # (what the file says, what attnlab's Llama backbone has): name only the mismatches
        wrong = [
            (f"{name} {value!r}", has)
            for name, value, fits, has in (
                ("hidden_act", act, "silu", "SwiGLU (silu)"),
                ("rope type", rope_type, "default", "plain RoPE"),
            )
            if value != fits
        ]
        if wrong:
            raise AttnlabError(
                f"{source}: {', '.join(says for says, _ in wrong)}; attnlab's Llama backbone "
                f"has {' and '.join(has for _, has in wrong)}"
            )
        n_embd, n_head = read.value("hidden_size"), read.value("num_attention_heads")
        if n_head <= 0 or read.value("head_dim", default=n_embd // n_head) * n_head != n_embd:
            raise AttnlabError(f"{source}: head_dim * num_attention_heads must equal hidden_size")
        bias = read.value("attention_bias", default=False, kind=bool)
        if read.value("mlp_bias", default=False, kind=bool) != bias:
            raise AttnlabError(f"{source}: attention_bias and mlp_bias must agree for attnlab")
        theta = read.value("rope_theta", default=None, kind=float)
        block = read.value("max_position_embeddings", default=2048)
        window = read.value("sliding_window", default=None)
        if (
            window is not None
            and window < block
            and read.value("use_sliding_window", default=True, kind=bool)
        ):  # it was dropped: each position then saw the whole context, another model
            raise AttnlabError(
                f"{source}: sliding_window {window} (of max_position_embeddings {block}); "
                "attnlab's Llama backbone attends to the whole context"
            )
        return ModelConfig(
            block_size=block,
            vocab_size=read.value("vocab_size"),
            n_layer=read.value("num_hidden_layers"),
            n_head=n_head,
            n_embd=n_embd,
            n_kv_head=read.value("num_key_value_heads", default=n_head),
            d_ffn=read.value("intermediate_size"),
            norm="rmsnorm",
            norm_eps=float(read.value("rms_norm_eps", default=1e-6, kind=float)),
            pos="rope",
            rope_theta=float(
                theta if theta is not None else params.value("rope_theta", default=1e4, kind=float)
            ),
            mlp="swiglu",
            bias=bias,
            tie_embeddings=tie,
        )
    raise AttnlabError(
        f"{source}: model_type {kind!r} is not supported; attnlab reads attnlab, gpt2 and llama"
    )


# --- state_dicts -----------------------------------------------------------------------------


def state_dict_to_hf(
    sd: dict[str, torch.Tensor], config: ModelConfig, kind: str | None
) -> dict[str, torch.Tensor]:
    """attnlab's state_dict (tied lm_head dropped) in ``kind``'s names and layouts."""
    if kind is None:
        return dict(sd)
    out: dict[str, torch.Tensor] = {}
    for key, value in sd.items():
        for new_key, new_value in _to_hf(key, value, config, kind):
            out[new_key] = new_value.contiguous()
    if kind == "gpt2":  # GPT-2 always has biases: zeros compute what bias=False computes
        for name in [k for k in out if k.endswith(".weight") and "wte" not in k and "wpe" not in k]:
            bias = name[: -len("weight")] + "bias"
            if bias not in out and not name.startswith("lm_head"):
                width = out[name].size(-1 if is_conv1d(name) else 0)
                out[bias] = torch.zeros(width, dtype=out[name].dtype)
    return out


def is_conv1d(name: str) -> bool:
    return any(f".{part}.weight" in name for part in _GPT2_CONV1D)


def _to_hf(key: str, value: torch.Tensor, config: ModelConfig, kind: str):
    if kind == "gpt2":
        yield key, (value.t() if is_conv1d(key) else value)
        return
    if key == "transformer.wte.weight":
        yield "model.embed_tokens.weight", value
    elif key == "transformer.ln_f.weight":
        yield "model.norm.weight", value
    elif key == "lm_head.weight":
        yield key, value
    else:
        _, _, layer, rest = key.split(".", 3)
        prefix = f"model.layers.{layer}."
        if rest.startswith("attn.c_attn."):
            suffix = rest.rsplit(".", 1)[1]
            sizes = [config.n_embd, config.kv_dim, config.kv_dim]
            for name, part in zip(("q", "k", "v"), value.split(sizes), strict=True):
                yield f"{prefix}self_attn.{name}_proj.{suffix}", part
        elif rest.startswith("mlp.c_fc."):
            suffix = rest.rsplit(".", 1)[1]
            gate, up = value.split(config.d_ffn)
            yield f"{prefix}mlp.gate_proj.{suffix}", gate
            yield f"{prefix}mlp.up_proj.{suffix}", up
        else:
            head = next(k for k in _LLAMA_BLOCK if rest.startswith(k))
            yield prefix + _LLAMA_BLOCK[head] + rest[len(head) :], value


def state_dict_from_hf(
    sd: dict[str, torch.Tensor], config: ModelConfig, kind: str, source: str = "config.json"
) -> dict[str, torch.Tensor]:
    """An HF GPT-2 / Llama state_dict in attnlab's names (the inverse of ``state_dict_to_hf``).

    A GPT-2 export of a ``bias=False`` model loses its zero biases again; one that is no longer
    zero (trained in transformers since) is refused rather than dropped.
    """
    if kind == "attnlab":
        return dict(sd)
    # constant buffers some versions saved: GPT-2's causal mask, Llama's RoPE frequencies
    derived = (".attn.bias", ".attn.masked_bias", "rotary_emb.inv_freq")
    sd = {k: v for k, v in sd.items() if not k.endswith(derived)}
    if kind == "gpt2":
        sd = {
            k if k.startswith(("transformer.", "lm_head.")) else f"transformer.{k}": v
            for k, v in sd.items()
        }
        if not config.bias:
            biases = [k for k in sd if k.endswith(".bias")]
            trained = [k for k in biases if sd[k].any()]
            if trained:
                raise AttnlabError(
                    f"{source}: {GPT2_BIAS} is false but {trained[0]} is not zero (trained since "
                    f"the export?); delete {GPT2_BIAS} from it to load the biases"
                )
            sd = {k: v for k, v in sd.items() if k not in biases}
        return {k: (v.t() if is_conv1d(k) else v).contiguous() for k, v in sd.items()}
    sd = {k if k.startswith(("model.", "lm_head.")) else f"model.{k}": v for k, v in sd.items()}
    out: dict[str, torch.Tensor] = {}
    inverse = {v: k for k, v in _LLAMA_BLOCK.items()}
    for key, value in sd.items():
        if key == "model.embed_tokens.weight":
            out["transformer.wte.weight"] = value
        elif key == "model.norm.weight":
            out["transformer.ln_f.weight"] = value
        elif key == "lm_head.weight":
            out[key] = value
        elif key.startswith("model.layers."):
            _, _, layer, rest = key.split(".", 3)
            prefix = f"transformer.h.{layer}."
            suffix = rest.rsplit(".", 1)[1]
            if rest.startswith("self_attn.q_proj."):
                parts = [sd[key.replace("q_proj", p)] for p in ("q_proj", "k_proj", "v_proj")]
                out[f"{prefix}attn.c_attn.{suffix}"] = torch.cat(parts)
            elif rest.startswith("mlp.gate_proj."):
                parts = [sd[key.replace("gate_proj", p)] for p in ("gate_proj", "up_proj")]
                out[f"{prefix}mlp.c_fc.{suffix}"] = torch.cat(parts)
            elif not rest.startswith(("self_attn.k_proj", "self_attn.v_proj", "mlp.up_proj")):
                head = next((v for v in inverse if rest.startswith(v)), None)
                if head is None:
                    raise AttnlabError(f"unexpected Llama weight {key}")
                out[prefix + inverse[head] + rest[len(head) :]] = value
        else:
            raise AttnlabError(f"unexpected Llama weight {key}")
    return out
