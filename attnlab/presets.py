"""Named presets: an architecture plus the training recipe its source used.

Char-level presets leave ``vocab_size`` to the data (the trainer reads it from meta.json).
Each entry cites where its numbers come from (../shared/REFERENCE.md has the facts).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any

from attnlab.errors import AttnlabError


@dataclass(frozen=True)
class Preset:
    """A named architecture with its training recipe and the data it trains on by default."""

    description: str
    model: dict[str, Any]
    train: dict[str, Any] = field(default_factory=dict)
    # what `prepare` to run: corpus (a shipped one, default the embedded), tokenizer, vocab_size
    data: dict[str, Any] = field(default_factory=dict)


# nanoGPT's config/train_shakespeare_char.py
_NANOGPT_CHAR_TRAIN = dict(
    batch_size=64,
    learning_rate=1e-3,
    max_iters=5000,
    lr_decay_iters=5000,
    min_lr=1e-4,
    beta2=0.99,
    warmup_iters=100,
    eval_interval=250,
    eval_iters=200,
    log_interval=10,
    weight_decay=0.1,
)
# the kv-bias seed's recipe (shakespeare_char, 3000 iters, eval every 500 on 40 batches)
_KV_SEED_TRAIN = dict(
    batch_size=32,
    learning_rate=1e-3,
    min_lr=1e-4,
    warmup_iters=100,
    weight_decay=0.1,
    beta2=0.99,
    max_iters=3000,
    lr_decay_iters=3000,
    eval_interval=500,
    eval_iters=40,
    log_interval=50,
)
_KV_SEED_MODEL = dict(n_layer=6, n_head=4, n_embd=128, block_size=128, bias=False, dropout=0.0)
# the seed's data: nanoGPT's shakespeare_char, split as nanoGPT splits it (shipped)
_KV_SEED_DATA = dict(corpus="shakespeare_char")
# the gradient-boosted-attention paper's LM setup (Table 7): seq 256, d 256, 4 layers, BPE 16,384
_GBA_MODEL = dict(
    n_layer=4, n_head=4, n_embd=256, block_size=256, vocab_size=16384, bias=True, dropout=0.1
)
_GBA_TRAIN = dict(
    batch_size=32,
    learning_rate=3e-4,
    min_lr=0.0,
    warmup_iters=1500,
    weight_decay=0.01,
    beta2=0.999,
    grad_clip=1.0,
    max_iters=20000,
    eval_interval=1000,
    eval_iters=50,
    log_interval=50,
)
_GBA_DATA = dict(tokenizer="bpe", vocab_size=16384)
# the QKVE backbone scaled to a laptop, without its value gate (qkve-small adds it)
_QKVE_SMALL_MODEL = dict(
    n_layer=6,
    n_head=6,
    n_kv_head=2,
    n_embd=192,
    block_size=256,
    bias=False,
    norm="rmsnorm",
    pos="rope",
    mlp="swiglu",
    d_ffn=256,
    ffn_sublayers=2,
    dropout=0.0,
)

PRESETS: dict[str, Preset] = {
    "nanogpt-shakespeare-char": Preset(
        "nanoGPT's config/train_shakespeare_char.py (6x384, 6 heads, block 256, dropout 0.2)",
        dict(n_layer=6, n_head=6, n_embd=384, block_size=256, bias=False, dropout=0.2),
        _NANOGPT_CHAR_TRAIN,
    ),
    "shakespeare-char": Preset(
        "kv-bias seed's vanilla baseline: 6 layers, 4 heads, n_embd 128, block 128, no bias",
        _KV_SEED_MODEL,
        _KV_SEED_TRAIN,
        _KV_SEED_DATA,
    ),
    "kv-bias-shakespeare-char": Preset(
        "K/V-bias purpose state at n_embd 112: the parameter-matched partner of shakespeare-char",
        {**_KV_SEED_MODEL, "n_embd": 112, "use_m_gate": True},
        _KV_SEED_TRAIN,
        _KV_SEED_DATA,
    ),
    "kv-bias-detached-shakespeare-char": Preset(
        "the seed's critical ablation: K/V-bias with M detached (no cross-layer gradient)",
        {**_KV_SEED_MODEL, "n_embd": 112, "use_m_gate": True, "m_gate_detached": True},
        _KV_SEED_TRAIN,
        _KV_SEED_DATA,
    ),
    "shakespeare-char-112": Preset(
        "control: vanilla at n_embd 112 (same width as K/V-bias, fewer parameters)",
        {**_KV_SEED_MODEL, "n_embd": 112},
        _KV_SEED_TRAIN,
        _KV_SEED_DATA,
    ),
    "shakespeare-char-7l": Preset(
        "control: vanilla n_embd 128 with 7 layers (more depth instead of the mechanism)",
        {**_KV_SEED_MODEL, "n_layer": 7},
        _KV_SEED_TRAIN,
        _KV_SEED_DATA,
    ),
    "shakespeare-char-136": Preset(
        "control: vanilla at n_embd 136 (about 10 % more parameters than K/V-bias)",
        {**_KV_SEED_MODEL, "n_embd": 136},
        _KV_SEED_TRAIN,
        _KV_SEED_DATA,
    ),
    "qkve-61m": Preset(
        "QKVE-61M: value gate, 30 layers, d 384, GQA 12/4, RoPE, RMSNorm, deep SwiGLU (d_ffn 512), tied",
        dict(
            n_layer=30,
            n_head=12,
            n_kv_head=4,
            n_embd=384,
            block_size=512,
            vocab_size=32128,
            bias=False,
            norm="rmsnorm",
            pos="rope",
            mlp="swiglu",
            d_ffn=512,
            ffn_sublayers=2,
            value_gate=True,
            dropout=0.0,
        ),
        dict(
            batch_size=16,
            learning_rate=6e-4,
            min_lr=6e-5,
            warmup_iters=2000,
            beta2=0.95,
            weight_decay=0.1,
            max_iters=100000,
            eval_interval=1000,
            eval_iters=50,
        ),
        dict(tokenizer="bpe", vocab_size=32128),
    ),
    "qkve-small": Preset(
        "the QKVE backbone scaled to a laptop: 6 layers, d 192, GQA 6/2, RoPE, RMSNorm, deep SwiGLU",
        {**_QKVE_SMALL_MODEL, "value_gate": True},
        dict(_KV_SEED_TRAIN, batch_size=32),
    ),
    "gated-attn-qkve-small": Preset(
        "gated attention (Qiu et al. 2025) on qkve-small's backbone: the output gate in place of "
        "the value gate",
        {**_QKVE_SMALL_MODEL, "attn_output_gate": True},
        dict(_KV_SEED_TRAIN, batch_size=32),
    ),
    "gated-attn-shakespeare-char": Preset(
        "gated attention (Qiu et al. 2025) on the kv-bias seed's nanoGPT backbone: a sigmoid gate "
        "per head and channel before c_proj",
        {**_KV_SEED_MODEL, "attn_output_gate": True},
        _KV_SEED_TRAIN,
        _KV_SEED_DATA,
    ),
    "gba-lm-standard": Preset(
        "gradient-boosted-attention paper, standard Pre-LN transformer (7,419,392 parameters)",
        _GBA_MODEL,
        _GBA_TRAIN,
        _GBA_DATA,
    ),
    "gba-lm-boosted": Preset(
        "gradient-boosted attention, M=2 rounds, per-dimension linear gate (8,734,208 parameters)",
        {**_GBA_MODEL, "boost_rounds": 2, "boost_gate": "linear"},
        _GBA_TRAIN,
        _GBA_DATA,
    ),
    "gba-lm-fair": Preset(
        "parameter-fair standard baseline at d=288 (8,789,184 parameters)",
        {**_GBA_MODEL, "n_embd": 288},
        _GBA_TRAIN,
        _GBA_DATA,
    ),
    "gba-lm-twicing": Preset(
        "Twicing attention (2A - A^2)V, no new parameters (7,419,392 parameters)",
        {**_GBA_MODEL, "twicing": True},
        _GBA_TRAIN,
        _GBA_DATA,
    ),
}


# former names, still accepted (run folders and scripts name them) but not listed
RENAMED = {
    "kvbias-shakespeare-char": "kv-bias-shakespeare-char",
    "kvbias-detached-shakespeare-char": "kv-bias-detached-shakespeare-char",
}


def get_preset(name: str) -> Preset:
    """Look a preset up by name (or a former name); unknown names list the close ones."""
    try:
        return PRESETS[RENAMED.get(name, name)]
    except KeyError:
        close = difflib.get_close_matches(name, PRESETS, n=3)
        hint = (
            f" (did you mean {', '.join(close)}?)" if close else f" (known: {', '.join(PRESETS)})"
        )
        raise AttnlabError(f"unknown preset {name!r}{hint}") from None
