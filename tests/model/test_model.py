"""Backbone behaviour: parameter counts, optimizer groups, sampling filters, KV-cached decoding."""

from __future__ import annotations

import pytest
import torch
from conftest import compatible_sets, tiny_model
from test_mechanism_contract import assert_cache_exact

from attnlab import GPT
from attnlab.errors import AttnlabError
from attnlab.model.generation import compile_for_decoding, filter_logits, sample_next, stream
from attnlab.model.mechanisms import HOOKS

# backbones; every mechanism, alone and all together, is in tests/model/test_mechanism_contract.py
CONFIGS = {
    "vanilla": {},
    "bias": {"bias": True},
    "gqa-rope-rms-swiglu": {
        "n_kv_head": 2,
        "pos": "rope",
        "norm": "rmsnorm",
        "mlp": "swiglu",
        "ffn_sublayers": 2,
    },
    "post-ln": {"norm_placement": "post"},
}
COMPOSED = compatible_sets()  # every registered mechanism at once (each set that composes)


def build(seed: int = 0, **overrides) -> GPT:
    torch.manual_seed(seed)
    return GPT(tiny_model(**overrides)).eval()


def test_parameter_count_matches_nanogpt_formula() -> None:
    v, e, t, n_layer = 96, 32, 32, 2
    per_layer = 2 * e + (e * 3 * e) + (e * e) + (e * 4 * e) + (4 * e * e)  # no bias
    expected = v * e + t * e + n_layer * per_layer + e
    model = build()
    assert model.get_num_params(non_embedding=False) == expected
    assert model.get_num_params() == expected - t * e


def test_optimizer_groups_decay_matrices_only() -> None:
    model = build(bias=True)
    opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.99), "cpu")
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decay["params"]) and all(
        p.dim() < 2 for p in no_decay["params"]
    )
    assert sum(p.numel() for g in opt.param_groups for p in g["params"]) == model.get_num_params(
        False
    )


@pytest.mark.parametrize("name", list(CONFIGS))
def test_cached_decoding_equals_full_recompute(name: str) -> None:
    assert_cache_exact(build(**CONFIGS[name]))


@pytest.mark.parametrize("name", ["vanilla", "gqa-rope-rms-swiglu"])
def test_decoding_honours_hooks_replaced_submodules_and_parametrized_weights(name: str) -> None:
    """The forwards read submodules and parameters from nn.Module's registries (see layers.py):
    a forward hook still fires, a reassigned submodule or parameter is the one used, and so is a
    weight that parametrize or the old weight_norm (a plain attribute a pre-hook recomputes) took
    out of the registry."""
    import warnings

    from torch.nn.utils import parametrize

    class Double(torch.nn.Module):
        def forward(self, w: torch.Tensor) -> torch.Tensor:
            return 2 * w

    model, reference = build(**CONFIGS[name]), build(**CONFIGS[name])
    block, ref_block = model.transformer.h[0], reference.transformer.h[0]
    calls = []
    block.attn.c_attn.register_forward_hook(lambda *_: calls.append(1))
    block.mlp = ref_block.mlp = build(seed=1, **CONFIGS[name]).transformer.h[1].mlp
    parametrize.register_parametrization(block.ln_2, "weight", Double())
    parametrize.register_parametrization(block.attn.c_proj, "weight", Double())
    last, ref_last = model.transformer.h[1], reference.transformer.h[1]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # deprecated, and still in use
        torch.nn.utils.weight_norm(last.attn.c_attn)
    last.mlp.c_proj.weight = torch.nn.Parameter(3 * last.mlp.c_proj.weight.detach())
    with torch.no_grad():
        ref_block.ln_2.weight.mul_(2)
        ref_block.attn.c_proj.weight.mul_(2)
        last.attn.c_attn.weight_g.mul_(5)
        ref_last.attn.c_attn.weight.copy_(
            torch._weight_norm(last.attn.c_attn.weight_v, last.attn.c_attn.weight_g, 0)
        )
        ref_last.mlp.c_proj.weight.mul_(3)
    idx = torch.zeros((1, 1), dtype=torch.long)
    tokens = model.generate(idx, 4, temperature=0.0)
    assert len(calls) == 4  # the prompt and three cached steps
    assert torch.equal(tokens, reference.generate(idx, 4, temperature=0.0))
    logits, _ = model(tokens, all_logits=True)
    assert torch.equal(logits, reference(tokens, all_logits=True)[0])


@pytest.mark.parametrize("composed", list(COMPOSED))
def test_hook_tables_are_fixed_dicts(composed: str) -> None:
    """Reading a hook list must not add keys: torch.compile guards on the table's length."""
    model = build(**COMPOSED[composed])
    for owner in [*model.transformer.h, *(b.attn for b in model.transformer.h)]:
        assert type(owner.hooks) is dict and tuple(owner.hooks) == HOOKS
    model(torch.zeros(1, 4, dtype=torch.long))
    assert all(tuple(b.hooks) == HOOKS for b in model.transformer.h)


def test_compile_failure_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    model = build()

    def broken_compile(**kwargs) -> None:  # what a machine without a C++ compiler does
        def forward(*args, **kw):
            raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found\ntraceback...")

        model.forward = forward

    monkeypatch.setattr(model, "compile", broken_compile)
    with pytest.raises(AttnlabError) as err:
        compile_for_decoding(model)
    assert str(err.value) == (
        "torch.compile failed (RuntimeError: InvalidCxxCompiler: No working C++ compiler found);"
        " run without --compile"
    )


def test_generation_past_block_size_crops_like_nanogpt() -> None:
    model = build()
    prompt = torch.randint(0, 96, (1, 30), generator=torch.Generator().manual_seed(2))
    out = model.generate(prompt, 10, temperature=0.0)  # crosses block_size 32
    assert out.shape == (1, 40)
    idx = prompt
    for _ in range(10):  # nanoGPT's loop: crop the context, take the argmax
        logits, _ = model(idx[:, -32:])
        idx = torch.cat([idx, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out, idx)


def test_eos_stops_generation_and_pads_finished_rows() -> None:
    model = build()
    prompt = torch.zeros(1, 3, dtype=torch.long)
    first = model.generate(prompt, 1, temperature=0.0)[0, -1].item()
    out = model.generate(prompt, 10, temperature=0.0, eos_token_id=first)
    assert out.shape == (1, 4) and out[0, -1].item() == first


def test_top_k_and_top_p_filters_by_hand() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.2, 0.15, 0.1, 0.05]]))
    kept = torch.isfinite(filter_logits(logits, top_k=2))
    assert kept.tolist() == [[True, True, False, False, False]]
    kept = torch.isfinite(filter_logits(logits, top_p=0.6))  # 0.5 < 0.6 <= 0.7: two tokens
    assert kept.tolist() == [[True, True, False, False, False]]
    kept = torch.isfinite(filter_logits(logits, top_p=0.5))  # the first alone reaches 0.5
    assert kept.tolist() == [[True, False, False, False, False]]
    shuffled = logits[:, [3, 0, 4, 1, 2]]
    assert torch.isfinite(filter_logits(shuffled, top_p=0.6)).tolist() == [
        [False, True, False, True, False]
    ]


def test_temperature_zero_is_greedy_and_sampling_is_seeded() -> None:
    logits = torch.tensor([[0.1, 3.0, 0.2]])
    assert sample_next(logits, temperature=0.0).item() == 1
    draws = [
        sample_next(logits.repeat(64, 1), 1.0, generator=torch.Generator().manual_seed(7))
        for _ in range(2)
    ]
    assert torch.equal(draws[0], draws[1])
    assert set(
        sample_next(logits.repeat(256, 1), 5.0, top_k=2, generator=torch.Generator().manual_seed(0))
        .flatten()
        .tolist()
    ) == {1, 2}


def test_decoding_turns_onednn_off_per_forward_and_back_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """oneDNN's exact GELU cost several times PyTorch's own kernel on a decoding step's few
    values; stream turns oneDNN off around each forward only (the setting is global)."""
    if not torch.backends.mkldnn.is_available():
        pytest.skip("this torch has no oneDNN")
    model = build()
    seen = []
    forward = model.forward

    def recording(*args, **kwargs):
        seen.append(torch.backends.mkldnn.enabled)
        return forward(*args, **kwargs)

    monkeypatch.setattr(model, "forward", recording)
    for _ in stream(model, torch.zeros(1, 2, dtype=torch.long), 3, temperature=0.0):
        assert torch.backends.mkldnn.enabled  # the caller's code runs with it on
    assert seen == [False, False, False]  # the prompt, then two cached steps

    def failing(*args, **kwargs):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(model, "forward", failing)
    with pytest.raises(RuntimeError, match="out of memory"):
        next(stream(model, torch.zeros(1, 2, dtype=torch.long), 3))
    assert torch.backends.mkldnn.enabled
