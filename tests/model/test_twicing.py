"""Twicing attention: (2A - A^2)V by hand, no new parameters, exact cached decoding."""

import math

import pytest
import torch
from conftest import tiny_model
from test_boosted import _assert_cache_exact

from attnlab.config import ModelConfig
from attnlab.model import GPT
from attnlab.model.attention import CausalSelfAttention, Context


@pytest.mark.parametrize("n_kv_head", [2, 1])
def test_twicing_equals_2a_minus_a_squared_times_v(n_kv_head: int) -> None:
    torch.manual_seed(0)
    cfg = ModelConfig(
        block_size=16,
        vocab_size=8,
        n_layer=1,
        n_head=2,
        n_kv_head=n_kv_head,
        n_embd=8,
        twicing=True,
    )
    attn = CausalSelfAttention(cfg).double().eval()
    for p in attn.parameters():
        torch.nn.init.normal_(p, std=0.5)
    x = torch.randn(2, 6, 8, dtype=torch.float64)
    q, k, v = attn.c_attn(x).split([8, 4 * n_kv_head, 4 * n_kv_head], dim=-1)
    q = q.view(2, 6, 2, 4).transpose(1, 2)
    # query head h reads kv head h // (n_head / n_kv_head)
    k, v = (
        z.view(2, 6, n_kv_head, 4).transpose(1, 2).repeat_interleave(2 // n_kv_head, 1)
        for z in (k, v)
    )
    scores = q @ k.transpose(-1, -2) / math.sqrt(4)
    a = scores.masked_fill(~torch.ones(6, 6, dtype=torch.bool).tril(), float("-inf")).softmax(-1)
    twiced = 2 * a - a @ a
    expected = attn.c_proj((twiced @ v).transpose(1, 2).reshape(2, 6, 8))
    capture: dict = {}
    assert torch.allclose(attn(x, Context(capture=capture)), expected, atol=1e-12)
    assert torch.allclose(capture["layer0.r0.weights"], twiced, atol=1e-12)
    assert torch.equal(twiced.triu(1), torch.zeros_like(twiced))  # causal A keeps (2A - A^2) causal


def test_twicing_adds_no_parameters() -> None:
    assert GPT(tiny_model(twicing=True)).get_num_params(False) == GPT(tiny_model()).get_num_params(
        False
    )


def test_cached_decoding_is_exact() -> None:
    torch.manual_seed(1)
    _assert_cache_exact(GPT(tiny_model(twicing=True)))


def test_cached_decoding_composed_with_value_gate_kvbias_gqa_rope() -> None:
    torch.manual_seed(2)
    _assert_cache_exact(
        GPT(tiny_model(twicing=True, value_gate=True, use_m_gate=True, n_kv_head=2, pos="rope"))
    )
