"""K/V-bias purpose state: fork fixtures, gradient structure, injection points, presets, caching."""

from __future__ import annotations

import csv
import json

import pytest
import torch
from conftest import FIXTURES, tiny_model

from attnlab.config import ModelConfig
from attnlab.model import GPT

INJECTIONS = ("kv", "output_mul", "mlp_input")


def load_fixture(name: str) -> tuple[ModelConfig, int, dict[str, torch.Tensor]]:
    from safetensors import safe_open
    from safetensors.torch import load_file

    path = str(FIXTURES / f"{name}.safetensors")
    with safe_open(path, "pt") as f:
        meta = f.metadata()
    tensors = load_file(path)
    return ModelConfig(**json.loads(meta["config"])), int(meta["seed"]), tensors


def seeded(config: ModelConfig, seed: int = 1337) -> GPT:
    torch.manual_seed(seed)
    return GPT(config)


def grads_after_backward(model: GPT, idx: torch.Tensor, targets: torch.Tensor):
    """(logits, loss, every gradient); a parameter autograd never reached (None) counts as zeros."""
    logits, loss = model(idx, targets)
    loss.backward()
    grads = {
        n: torch.zeros_like(p) if p.grad is None else p.grad for n, p in model.named_parameters()
    }
    return logits, loss, grads


@pytest.mark.parametrize("name", ["kvbias", "kvbias_detached"])
def test_matches_reference_fork(name: str) -> None:
    config, seed, ref = load_fixture(name)
    model = seeded(config, seed)
    sd = model.state_dict()
    ref_sd = {k.removeprefix("sd."): v for k, v in ref.items() if k.startswith("sd.")}
    assert sorted(sd) == sorted(ref_sd)
    for key, value in ref_sd.items():
        assert torch.equal(sd[key], value), key
    logits, loss, grads = grads_after_backward(model, ref["idx"], ref["targets"])
    # float32 kernels differ by ~1e-7 between the fixture's machine and others: see the lead's note
    close = dict(rtol=0, atol=5e-7)
    torch.testing.assert_close(logits, ref["logits"], **close)
    torch.testing.assert_close(loss.reshape(ref["loss"].shape), ref["loss"], **close)
    ref_grads = {k.removeprefix("grad."): v for k, v in ref.items() if k.startswith("grad.")}
    assert sorted(grads) == sorted(ref_grads)
    for key, value in ref_grads.items():
        torch.testing.assert_close(grads[key], value, **close, msg=key)


@pytest.mark.parametrize("name", ["kvbias", "kvbias_detached"])
def test_structurally_zero_gradients(name: str) -> None:
    """Block 0's W_kvm reads M = 0 and the last M is discarded; detached: no path into any W_gm."""
    config, seed, ref = load_fixture(name)
    _, _, grads = grads_after_backward(seeded(config, seed), ref["idx"], ref["targets"])
    last = config.n_layer - 1
    zero = ["transformer.h.0.attn.W_kvm.weight", f"transformer.h.{last}.W_gm.weight"]
    if config.m_gate_detached:
        zero += [f"transformer.h.{i}.W_gm.weight" for i in range(config.n_layer)]
    for key in zero:
        assert torch.equal(grads[key], torch.zeros_like(grads[key])), key
    # everything else learns (in particular the W_kvm that read a non-zero M)
    for key, g in grads.items():
        if key not in zero:
            assert g.abs().sum() > 0, key
    assert ref["grad.transformer.h.0.attn.W_kvm.weight"].abs().sum() == 0


def test_detached_differs_only_in_gradients() -> None:
    _, _, ref = load_fixture("kvbias")
    _, _, ref_det = load_fixture("kvbias_detached")
    assert torch.equal(ref["logits"], ref_det["logits"])
    assert not torch.equal(
        ref["grad.transformer.h.0.W_gm.weight"], ref_det["grad.transformer.h.0.W_gm.weight"]
    )


@pytest.mark.parametrize("bias", [False, True])
def test_inference_skips_block0_kv_matmul(bias: bool) -> None:
    """Without autograd, block 0's W_kvm(0) (zero, or the bias) is not computed; the logits are
    bit-identical."""
    model = seeded(tiny_model(use_m_gate=True, bias=bias)).eval()
    idx = torch.randint(0, model.config.vocab_size, (2, 9))
    calls = []
    model.transformer.h[0].attn.W_kvm.register_forward_hook(lambda *_: calls.append(1))
    with_grad, _ = model(idx, all_logits=True)
    assert calls == [1]  # training keeps the matmul: AdamW decays its zero gradient
    with torch.inference_mode():
        without, _ = model(idx, all_logits=True)
    assert calls == [1]  # with a bias, W_kvm(0) is the bias: added without the matmul
    assert torch.equal(with_grad, without)


@pytest.mark.parametrize("bias", [False, True])
def test_module_names_and_shapes(bias: bool) -> None:
    config = tiny_model(use_m_gate=True, bias=bias)
    model = GPT(config)
    e = config.n_embd
    for i, block in enumerate(model.transformer.h):
        assert tuple(block.attn.W_kvm.weight.shape) == (2 * e, e)
        assert tuple(block.W_gm.weight.shape) == (2 * e, e)
        assert (block.attn.W_kvm.bias is not None) == bias and (block.W_gm.bias is not None) == bias
        names = {n for n, _ in model.named_parameters()}
        assert (
            f"transformer.h.{i}.attn.W_kvm.weight" in names
            and f"transformer.h.{i}.W_gm.weight" in names
        )
    # the failed injection points have no W_kvm; all keep the gate
    for inject in ("output_mul", "mlp_input"):
        other = GPT(tiny_model(use_m_gate=True, m_inject=inject, bias=bias))
        assert not hasattr(other.transformer.h[0].attn, "W_kvm")
        assert hasattr(other.transformer.h[0], "W_gm")


def logits_with_weights(
    config: ModelConfig, weights: dict[str, torch.Tensor], idx: torch.Tensor
) -> torch.Tensor:
    """Logits of a model built from ``config`` with the shared weights copied in (others seeded)."""
    model = seeded(config, 7).eval()
    own = model.state_dict()
    model.load_state_dict({k: v for k, v in weights.items() if k in own}, strict=False)
    with torch.no_grad():
        return model(idx, all_logits=True)[0]


def test_each_injection_point_changes_the_output() -> None:
    vanilla = seeded(tiny_model(vocab_size=65), 3)
    weights = vanilla.state_dict()
    idx = torch.randint(65, (2, 16), generator=torch.Generator().manual_seed(0))
    outs = {"vanilla": logits_with_weights(tiny_model(vocab_size=65), weights, idx)}
    for inject in INJECTIONS:
        outs[inject] = logits_with_weights(
            tiny_model(vocab_size=65, use_m_gate=True, m_inject=inject), weights, idx
        )
    names = list(outs)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            assert (outs[a] - outs[b]).abs().max() > 1e-4, (a, b)


def test_output_mul_silences_attention_at_block_0() -> None:
    """y * M with M = 0: a one-block model's attention contributes nothing (c_proj has no bias)."""
    config = tiny_model(vocab_size=65, n_layer=1)
    idx = torch.randint(65, (2, 16), generator=torch.Generator().manual_seed(1))
    weights = seeded(config, 5).state_dict()
    silenced = {
        **weights,
        "transformer.h.0.attn.c_proj.weight": torch.zeros_like(
            weights["transformer.h.0.attn.c_proj.weight"]
        ),
    }
    mul = logits_with_weights(
        tiny_model(vocab_size=65, n_layer=1, use_m_gate=True, m_inject="output_mul"), weights, idx
    )
    torch.testing.assert_close(mul, logits_with_weights(config, silenced, idx), rtol=0, atol=1e-6)


@pytest.mark.parametrize("inject", ["kv", "mlp_input"])
def test_zero_candidate_is_vanilla(inject: str) -> None:
    """With W_gm's candidate half and W_kvm at zero, M stays 0 and the model is vanilla."""
    config = tiny_model(vocab_size=65, use_m_gate=True, m_inject=inject)
    idx = torch.randint(65, (2, 16), generator=torch.Generator().manual_seed(2))
    weights = seeded(config, 9).state_dict()
    e = config.n_embd
    for i in range(config.n_layer):
        w = weights[f"transformer.h.{i}.W_gm.weight"].clone()
        w[e:] = 0  # tanh(0) = 0: the candidate
        weights[f"transformer.h.{i}.W_gm.weight"] = w
    vanilla = logits_with_weights(tiny_model(vocab_size=65), weights, idx)
    torch.testing.assert_close(
        logits_with_weights(config, weights, idx), vanilla, rtol=0, atol=1e-6
    )


def vanilla_params(n_layer: int, e: int, vocab: int, block: int) -> int:
    """nanoGPT without biases: tied wte, wpe, per block 2 LayerNorms + QKV/proj (4E^2) + MLP (8E^2), ln_f."""
    return vocab * e + block * e + n_layer * (12 * e * e + 2 * e) + e


@pytest.mark.parametrize(
    "preset, kv",
    [
        ("shakespeare-char", False),
        ("kv-bias-shakespeare-char", True),
        ("kv-bias-detached-shakespeare-char", True),
        ("shakespeare-char-112", False),
        ("shakespeare-char-7l", False),
        ("shakespeare-char-136", False),
    ],
)
def test_preset_parameter_counts(preset: str, kv: bool) -> None:
    config = ModelConfig.preset(preset, vocab_size=65)
    expected = vanilla_params(config.n_layer, config.n_embd, 65, config.block_size)
    if kv:  # W_kvm and W_gm, each E -> 2E without bias
        expected += config.n_layer * 4 * config.n_embd**2
    with torch.device("meta"):
        model = GPT(config)
    assert model.get_num_params(non_embedding=False) == expected


def test_parameter_matched_pair() -> None:
    """The seed's table: K/V-bias at 112 sits within 2 % of vanilla at 128, unlike the 112 control."""
    vanilla = vanilla_params(6, 128, 65, 128)
    kvbias = vanilla_params(6, 112, 65, 128) + 6 * 4 * 112**2
    assert (vanilla, kvbias) == (1_206_016, 1_227_296)
    assert abs(kvbias / vanilla - 1) < 0.02
    assert vanilla_params(6, 112, 65, 128) < 0.8 * vanilla


@pytest.mark.parametrize("inject", INJECTIONS)
def test_cached_generation_equals_recompute(inject: str) -> None:
    model = seeded(tiny_model(vocab_size=65, use_m_gate=True, m_inject=inject), 11).eval()
    prompt = torch.randint(65, (2, 5), generator=torch.Generator().manual_seed(4))
    # greedy across the block_size boundary (32): the cached phase and the sliding window
    cached = model.generate(prompt, 40, temperature=0.0, use_cache=True)
    full = model.generate(prompt, 40, temperature=0.0, use_cache=False)
    assert torch.equal(cached, full)
    # and the cached logits themselves match a full forward at every step
    cache = model.new_cache()
    with torch.no_grad():
        step = [model(prompt, cache=cache)[0]]
        for t in range(5, 20):
            step.append(model(cached[:, t : t + 1], cache=cache)[0])
        whole = model(cached[:, :20], all_logits=True)[0]
    torch.testing.assert_close(torch.cat(step, 1), whole[:, 4:], rtol=0, atol=1e-5)


def test_gate_stats_in_metrics_csv(tmp_path, train_tiny) -> None:
    train_tiny(tmp_path / "run", model={"use_m_gate": True}, max_iters=10, eval_interval=10)
    with (tmp_path / "run" / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    # the last block's gate is skipped: no later block reads its M
    assert not any(key.endswith("/layer1") for key in rows[0])
    for layer in (0,):
        means = [
            float(r[f"m_gate_mean/layer{layer}"]) for r in rows if r[f"m_gate_mean/layer{layer}"]
        ]
        stds = [float(r[f"m_gate_std/layer{layer}"]) for r in rows if r[f"m_gate_std/layer{layer}"]]
        assert len(means) == len(stds) == 2  # log_interval 5 over 10 iterations
        assert all(0.3 < m < 0.7 for m in means)  # sigmoid of a small init: near 0.5
        assert all(0 < s < 0.5 for s in stds)
