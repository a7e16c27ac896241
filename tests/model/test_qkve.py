"""QKVE backbone: parameter counts, value gate, GQA, RoPE, cached decoding, strict loading."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import tiny_model

from attnlab.config import ModelConfig
from attnlab.errors import AttnlabError
from attnlab.model import GPT
from attnlab.model.attention import Context
from attnlab.model.layers import Rotary, rotate
from attnlab.train.checkpoint import load_weights_strict

QKVE = dict(norm="rmsnorm", pos="rope", mlp="swiglu", d_ffn=48, ffn_sublayers=2, n_kv_head=2)


def test_qkve_61m_parameter_count_by_component() -> None:
    from attnlab.model.summary import parameter_counts

    cfg = ModelConfig.preset("qkve-61m")
    with torch.device("meta"):
        model = GPT(cfg)
    counts = parameter_counts(model)
    d, kv, ffn, layers, vocab = 384, 4 * 32, 512, 30, 32128
    attention = d * (d + 2 * kv) + d * d + d * kv  # fused QKV, output projection, W_E
    assert counts["embeddings"] == vocab * d  # tied: lm_head counted once
    assert counts["attn.W_E"] == layers * d * kv == 1_474_560
    assert counts["attention"] == layers * attention == 13_271_040
    # two SwiGLU sub-layers per block, gate and up projections fused
    assert counts["ffn"] == layers * 2 * (d * 2 * ffn + ffn * d) == 35_389_440
    assert counts["norms"] == (3 * layers + 1) * d  # three RMSNorms per block plus the final one
    assert counts["mechanisms"] == 0
    assert counts["total"] == model.get_num_params(non_embedding=False) == 61_032_576
    published = 61_030_016
    assert abs(counts["total"] - published) / published < 1e-4  # within 0.01 %
    assert model.flops_per_token() == 6 * 61_032_576 + 12 * layers * 12 * 32 * 512


def test_info_command_prints_counts_and_flops(capsys: pytest.CaptureFixture[str]) -> None:
    from attnlab.cli import main

    assert main(["info", "qkve-61m"]) == 0
    out = capsys.readouterr().out
    assert "61,032,576" in out and "1,474,560" in out and "436,974,336" in out
    assert "n_kv_head          4" in out
    assert main(["info", "no/such/run"]) == 2


def test_zero_value_gate_is_exact_pass_through() -> None:
    torch.manual_seed(0)
    vanilla = GPT(tiny_model(**QKVE)).eval()
    gated = GPT(tiny_model(**QKVE, value_gate=True, value_gate_init="zero")).eval()
    assert all(int(torch.count_nonzero(b.attn.W_E.weight)) == 0 for b in gated.transformer.h)
    result = gated.load_state_dict(vanilla.state_dict(), strict=False)
    assert sorted(result.missing_keys) == [f"transformer.h.{i}.attn.W_E.weight" for i in range(2)]
    assert result.unexpected_keys == []
    idx = torch.randint(0, 96, (2, 20))
    assert torch.equal(gated(idx, all_logits=True)[0], vanilla(idx, all_logits=True)[0])
    # a non-zero gate does change the output, so the comparison above can fail
    torch.nn.init.normal_(gated.transformer.h[0].attn.W_E.weight, std=0.5)
    assert not torch.allclose(gated(idx, all_logits=True)[0], vanilla(idx, all_logits=True)[0])


def test_value_gate_formula_by_hand_with_gqa() -> None:
    """One attention layer against V * (1 + tanh(x W_E)) and query head h reading kv head h // 2."""
    torch.manual_seed(1)
    cfg = tiny_model(n_kv_head=2, value_gate=True)  # learned positions: no rotation to redo
    attn = GPT(cfg).transformer.h[0].attn
    x = torch.randn(2, 7, cfg.n_embd)
    got = attn(x, Context())
    w_q, w_k, w_v = attn.c_attn.weight.split([32, 16, 16])
    q, k, v = x @ w_q.T, x @ w_k.T, x @ w_v.T
    v = v * (1 + torch.tanh(x @ attn.W_E.weight.T))
    heads = []
    for h in range(4):
        g = h // 2  # the kv head this query head reads
        qh, kh, vh = (
            q[..., h * 8 : (h + 1) * 8],
            k[..., g * 8 : (g + 1) * 8],
            v[..., g * 8 : (g + 1) * 8],
        )
        scores = qh @ kh.transpose(1, 2) / math.sqrt(8)
        scores = scores.masked_fill(torch.ones(7, 7).triu(1).bool(), float("-inf"))
        heads.append(scores.softmax(-1) @ vh)
    want = torch.cat(heads, dim=-1) @ attn.c_proj.weight.T
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_gqa_shapes_and_cache_holds_kv_heads() -> None:
    cfg = tiny_model(**QKVE, value_gate=True)
    model = GPT(cfg).eval()
    attn = model.transformer.h[0].attn
    assert cfg.kv_dim == 2 * 8
    assert attn.c_attn.weight.shape == (32 + 2 * 16, 32)
    assert attn.W_E.weight.shape == (16, 32)  # shaped like W_V
    cache = model.new_cache()
    model(torch.randint(0, 96, (3, 5)), cache=cache)
    assert cache.length == 5
    for layer in cache.layers:
        for slot in ("r0.k", "r0.v"):
            # block_size positions plus the spare slot LayerCache keeps for torch.compile
            shape = (3, cfg.n_kv_head, cfg.block_size + 1, cfg.head_dim)
            assert layer.buffers[slot].shape == shape
    with pytest.raises(ValueError, match="n_kv_head"):
        tiny_model(n_kv_head=3)


def test_rope_scores_depend_on_relative_position_only() -> None:
    torch.manual_seed(2)
    rotary = Rotary(16, 64, 10000.0)
    q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)

    def at(x: torch.Tensor, position: int) -> torch.Tensor:
        return rotate(x, *rotary(position, 1))

    def score(i: int, j: int) -> torch.Tensor:
        return (at(q, i) * at(k, j)).sum()

    for i, j, s in [(5, 2, 7), (10, 10, 30), (3, 0, 50)]:
        torch.testing.assert_close(score(i, j), score(i + s, j + s), atol=1e-5, rtol=1e-5)
    assert not torch.allclose(score(5, 2), score(5, 3))  # but the offset itself matters
    torch.testing.assert_close(at(q, 0), q)  # position 0 is the identity


@pytest.mark.parametrize(
    "overrides",
    [
        dict(QKVE, value_gate=True),
        dict(QKVE, value_gate=True, use_m_gate=True),
        # qkve-small's shape (GQA 6/2, deep SwiGLU...) at a width and depth that decode instantly
        dict(
            ModelConfig.preset("qkve-small").to_dict(),
            vocab_size=96,
            n_layer=2,
            n_embd=48,
            d_ffn=64,
            block_size=16,
        ),
    ],
    ids=["tiny-qkve", "qkve+kvbias", "qkve-small-like"],
)
def test_cached_greedy_decoding_equals_recompute(overrides: dict) -> None:
    torch.manual_seed(3)
    model = GPT(tiny_model(**overrides)).eval()
    idx = torch.randint(0, 96, (2, 5))
    # 25 positions: past block_size 16 the window slides
    cached = model.generate(idx, 20, temperature=0.0, use_cache=True)
    full = model.generate(idx, 20, temperature=0.0, use_cache=False)
    assert torch.equal(cached, full)
    with torch.no_grad():  # and the logits themselves, token by token against one full pass
        cache = model.new_cache()
        steps = [model(full[:, :5], cache=cache)[0]] + [
            model(full[:, t : t + 1], cache=cache)[0] for t in range(5, 16)
        ]
        whole = model(full[:, :16], all_logits=True)[0]
    torch.testing.assert_close(torch.cat(steps, 1), whole[:, 4:], atol=1e-5, rtol=1e-5)


def test_strict_load_lists_missing_and_unexpected_keys() -> None:
    gated = GPT(tiny_model(**QKVE, value_gate=True))
    sd = GPT(tiny_model(**QKVE)).state_dict()
    sd["extra.weight"] = torch.zeros(1)
    sd["transformer.ln_f.weight"] = torch.ones(5)
    with pytest.raises(AttnlabError) as err:
        load_weights_strict(gated, sd, "foreign.safetensors")
    msg = str(err.value)
    assert msg.startswith("foreign.safetensors does not fit the model")
    assert "missing keys: transformer.h.0.attn.W_E.weight, transformer.h.1.attn.W_E.weight" in msg
    assert "unexpected keys: extra.weight" in msg
    assert "transformer.ln_f.weight (5,) vs (32,)" in msg
    assert "\n" not in msg
