"""Gradient-boosted attention: parameter counts, closed forms, cached decoding, training."""

import math

import pytest
import torch
from conftest import tiny_model

from attnlab.config import ModelConfig
from attnlab.model import GPT
from attnlab.model.attention import CausalSelfAttention, Context
from attnlab.model.mechanisms.boost_gates import GATE_KINDS


@pytest.mark.parametrize(
    "preset, count",
    [
        ("gba-lm-standard", 7_419_392),
        ("gba-lm-boosted", 8_734_208),
        ("gba-lm-fair", 8_789_184),
        ("gba-lm-twicing", 7_419_392),
    ],
)
def test_paper_parameter_counts(preset: str, count: int) -> None:
    with torch.device("meta"):
        model = GPT(ModelConfig.preset(preset))
    assert model.get_num_params(non_embedding=False) == count


def test_boosted_adds_one_qkv_and_one_gate_per_layer() -> None:
    with torch.device("meta"):
        base = GPT(ModelConfig.preset("gba-lm-standard"))
        boosted = GPT(ModelConfig.preset("gba-lm-boosted"))
    extra = boosted.get_num_params(False) - base.get_num_params(False)
    assert extra == 4 * ((256 * 768 + 768) + (512 * 256 + 256))  # REFERENCE: +197,376 +131,328


def test_one_round_is_plain_attention_exactly() -> None:
    torch.manual_seed(0)
    plain = GPT(tiny_model())
    torch.manual_seed(0)
    # (a gate or K/V source beside boost_rounds=1 is refused: tests/cli/test_silent_acceptance.py)
    one = GPT(tiny_model(boost_rounds=1))
    assert plain.state_dict().keys() == one.state_dict().keys()
    assert all(
        torch.equal(a, b)
        for a, b in zip(plain.state_dict().values(), one.state_dict().values(), strict=True)
    )
    idx = torch.randint(0, 96, (2, 20))
    assert torch.equal(plain(idx, all_logits=True)[0], one(idx, all_logits=True)[0])


def _hand_attention(
    xq: torch.Tensor, xkv: torch.Tensor, proj: torch.nn.Linear, n_head: int
) -> torch.Tensor:
    """Causal multi-head softmax(QK^T/sqrt(d))V with an explicit T x T matrix, heads concatenated."""
    e = xq.size(-1)
    w, b = proj.weight, proj.bias
    q, k, v = (
        xq @ w[:e].T + b[:e],
        xkv @ w[e : 2 * e].T + b[e : 2 * e],
        xkv @ w[2 * e :].T + b[2 * e :],
    )
    bsz, t, d = xq.size(0), xq.size(1), e // n_head
    q, k, v = (z.view(bsz, t, n_head, d).transpose(1, 2) for z in (q, k, v))
    scores = q @ k.transpose(-1, -2) / math.sqrt(d)
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    a = scores.masked_fill(~causal, float("-inf")).softmax(-1)
    return (a @ v).transpose(1, 2).reshape(bsz, t, e)


@pytest.mark.parametrize("kv_source", ["residual", "input"])
@pytest.mark.parametrize("gate", ["none", "linear"])
def test_two_rounds_equal_the_closed_form(gate: str, kv_source: str) -> None:
    torch.manual_seed(1)
    cfg = ModelConfig(
        block_size=16,
        vocab_size=8,
        n_layer=1,
        n_head=2,
        n_embd=8,
        boost_rounds=2,
        boost_gate=gate,
        boost_kv_source=kv_source,
    )
    attn = CausalSelfAttention(cfg).double().eval()
    for p in attn.parameters():  # non-trivial biases too
        torch.nn.init.normal_(p, std=0.5)
    x = torch.randn(2, 7, 8, dtype=torch.float64)
    f0 = _hand_attention(x, x, attn.c_attn, 2)
    r = x - f0
    c = _hand_attention(r, r if kv_source == "residual" else x, attn.boost[0].c_attn, 2)
    g = 1.0
    if gate == "linear":
        lin = attn.boost[0].gate.proj
        g = torch.sigmoid(torch.cat([f0, c], -1) @ lin.weight.T + lin.bias)
    expected = attn.c_proj(f0 + g * c)
    assert torch.allclose(attn(x, Context()), expected, atol=1e-12)


def test_mlp_gate_reads_round0_entropy() -> None:
    torch.manual_seed(2)
    cfg = ModelConfig(
        block_size=16, vocab_size=8, n_layer=1, n_head=2, n_embd=8, boost_rounds=2, boost_gate="mlp"
    )
    attn = CausalSelfAttention(cfg).double().eval()
    assert attn.need_round0_weights
    x = torch.randn(1, 5, 8, dtype=torch.float64)
    capture: dict = {}
    attn(x, Context(capture=capture))
    w0 = capture["layer0.r0.weights"]  # [B, H, T, T]
    entropy = -(w0 * w0.clamp_min(1e-300).log()).sum(-1).mean(1)  # per token, mean over heads
    f0, c = capture["layer0.r0.out"], capture["layer0.r1.out"]
    f0, c = (z.transpose(1, 2).reshape(1, 5, 8) for z in (f0, c))
    expected_g = attn.boost[0].gate.net(torch.cat([f0, c, entropy[..., None]], -1)).sigmoid()
    assert torch.allclose(capture["layer0.r1.gate"], expected_g, atol=1e-12)
    assert torch.allclose(capture["layer0.F"], f0 + expected_g * c, atol=1e-12)


def test_mlp_gate_with_twicing_is_refused() -> None:
    with pytest.raises(ValueError, match="twicing"):
        GPT(tiny_model(boost_rounds=2, boost_gate="mlp", twicing=True))


def _assert_cache_exact(model: GPT) -> None:
    """Chunked KV-cached logits equal full recompute, and greedy decoding agrees."""
    model.eval()
    idx = torch.randint(0, 96, (2, 14), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full, _ = model(idx, all_logits=True)
        cache, pieces, start = model.new_cache(), [], 0
        for size in (5, 3, 1, 1, 4):  # a prompt, a multi-token chunk, single steps
            logits, _ = model(idx[:, start : start + size], cache=cache, all_logits=True)
            pieces.append(logits)
            start += size
    assert torch.allclose(torch.cat(pieces, 1), full, atol=1e-5)
    cached = model.generate(idx[:, :4], 8, temperature=0.0, use_cache=True)
    uncached = model.generate(idx[:, :4], 8, temperature=0.0, use_cache=False)
    assert torch.equal(cached, uncached)


@pytest.mark.parametrize("kv_source", ["residual", "input"])
@pytest.mark.parametrize("gate", GATE_KINDS)
def test_cached_decoding_is_exact(gate: str, kv_source: str) -> None:
    torch.manual_seed(4)
    _assert_cache_exact(GPT(tiny_model(boost_rounds=3, boost_gate=gate, boost_kv_source=kv_source)))


@pytest.mark.parametrize("kv_source", ["residual", "input"])
def test_cached_decoding_composed_with_value_gate_kvbias_gqa_rope(kv_source: str) -> None:
    torch.manual_seed(5)
    cfg = tiny_model(
        boost_rounds=2,
        boost_gate="mlp",
        boost_kv_source=kv_source,
        value_gate=True,
        use_m_gate=True,
        n_kv_head=2,
        pos="rope",
    )
    _assert_cache_exact(GPT(cfg))


def test_cached_decoding_composed_with_twicing() -> None:
    torch.manual_seed(6)
    _assert_cache_exact(
        GPT(tiny_model(boost_rounds=2, boost_gate="linear", twicing=True, n_kv_head=2))
    )


def test_post_ln_boosted_model_trains(tmp_path, train_tiny) -> None:
    trainer, summary = train_tiny(
        tmp_path / "run", model={"boost_rounds": 2, "norm_placement": "post"}
    )
    assert summary["final_val_loss"] < trainer.state.history[0]["val_loss"] - 0.3
    stats: dict = {}
    x, y = trainer.val_batches[0]
    trainer.model(x, y, stats=stats)
    for layer in range(2):
        mean, std = (
            stats[f"boost_gate_r1_mean/layer{layer}"],
            stats[f"boost_gate_r1_std/layer{layer}"],
        )
        assert 0.0 < float(mean) < 1.0 and float(std) > 0.0
