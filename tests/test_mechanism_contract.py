"""The mechanism contract, checked for every registered mechanism and for all of them at once.

Each mechanism module declares a ``SPEC`` (attnlab.model.mechanisms.Mechanism); these tests hold
every SPEC to what it claims: its example config turns it (and only it) on, the config survives
a JSON round trip, its choices and rules refuse bad fields with one-line ConfigErrors, cached
decoding equals the full forward, the TorchScript and ONNX exports give PyTorch's logits,
torch.compile decodes without recompiling, a zero gate (where the mechanism has one) is exactly
plain attention, and the bench variants and parameter claims are true. The ONNX and compile
checks take tens of seconds a model, so they are marked slow. A toy
mechanism registered from one file (tests/toy_mechanism.py) passes the same checks.
"""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
import torch
import toy_mechanism
from conftest import tiny_model

from attnlab import GPT
from attnlab.config import CHOICES, MECHANISM_CHECKS, ModelConfig
from attnlab.errors import ConfigError
from attnlab.export.onnx import ONNX_FILE, OnnxLM, write_onnx
from attnlab.export.torchscript import write_torchscript
from attnlab.model import mechanisms
from attnlab.model.generation import compile_for_decoding
from attnlab.model.mechanisms import REGISTRY, Mechanism

ALL = "all"


def spec_of(name: str) -> Mechanism:
    return mechanisms.module(name).SPEC


def example(name: str) -> dict:
    """The mechanism's example fields; ALL composes every example (on RoPE with GQA)."""
    if name != ALL:
        return spec_of(name).example
    composed = {k: v for n in mechanisms.REGISTRY for k, v in spec_of(n).example.items()}
    return {**composed, "n_kv_head": 2, "pos": "rope"}


def expected_enabled(name: str) -> list[str]:
    return list(mechanisms.REGISTRY) if name == ALL else [name]


def base_of(name: str) -> ModelConfig:
    """The example config without the mechanism's own fields (the backbone it runs on)."""
    spec = spec_of(name)
    return tiny_model(**{k: v for k, v in spec.example.items() if k not in spec.fields})


@contextlib.contextmanager
def unregistered(name: str) -> Iterator[None]:
    """The registry without ``name``: what the backbone is without the mechanism at all."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(mechanisms, "REGISTRY", tuple(n for n in mechanisms.REGISTRY if n != name))
        yield


def build(config: ModelConfig, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(config).eval()


def check_config_round_trip(name: str) -> None:
    config = tiny_model(**example(name))
    again = ModelConfig.from_dict(json.loads(config.to_json()))
    assert again == config
    assert mechanisms.enabled(again) == expected_enabled(name)


def assert_cache_exact(model: GPT) -> None:
    """Greedy decoding with and without the KV cache agree, and prefill, one step and a chunk
    through the cache give the full forward's logits."""
    prompt = torch.randint(0, 96, (2, 5), generator=torch.Generator().manual_seed(1))
    cached = model.generate(prompt, 20, temperature=0.0, use_cache=True)
    full = model.generate(prompt, 20, temperature=0.0, use_cache=False)
    assert torch.equal(cached, full)
    cache = model.new_cache()
    steps = [
        model(full[:, :9], cache=cache, all_logits=True)[0],
        model(full[:, 9:10], cache=cache)[0],
        model(full[:, 10:16], cache=cache, all_logits=True)[0],
    ]
    torch.testing.assert_close(
        torch.cat(steps, dim=1), model(full[:, :16], all_logits=True)[0], rtol=1e-5, atol=1e-5
    )


def check_cached_decoding(name: str) -> None:
    assert_cache_exact(build(tiny_model(**example(name))))


def check_zero_gate(name: str) -> None:
    """With its zero-gate setting, a fresh model computes what plain attention computes."""
    zero = spec_of(name).zero_gate
    if zero is None:
        pytest.skip(f"{name} defines no zero gate")
    model = build(tiny_model(**spec_of(name).example, **zero))
    with unregistered(name):
        plain = build(base_of(name), seed=1)
    missing, unexpected = model.load_state_dict(plain.state_dict(), strict=False)
    assert not unexpected and missing  # only the mechanism's own parameters keep their init
    idx = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(model(idx, all_logits=True)[0], plain(idx, all_logits=True)[0])


def check_spec(name: str) -> None:
    """The SPEC's claims: fields exist, the default config is off, bench variants turn it on,
    and it adds parameters exactly when it says so."""
    spec = spec_of(name)
    assert spec.name == name
    model_fields = {f.name for f in fields(ModelConfig)}
    assert set(spec.fields) <= model_fields and set(spec.switch) <= set(spec.fields)
    assert not spec.enabled(ModelConfig()) or spec.always_on
    # one name: every bench label is the mechanism's own, or it with an ablation's suffix
    assert all(label == spec.label or label.startswith(f"{spec.label}-") for label in spec.bench)
    for variant in spec.bench.values():
        assert spec.enabled(tiny_model(**variant))
    with unregistered(name):
        plain_params = GPT(base_of(name)).get_num_params()
    grows = GPT(tiny_model(**spec.example)).get_num_params() > plain_params
    assert grows == spec.adds_params


class Reads:
    """A config that records which fields are read."""

    def __init__(self, **values: Any) -> None:
        self._values, self.names = values, set()

    def __getattr__(self, name: str) -> Any:
        self.names.add(name)
        return self._values[name]


def refused(**overrides: Any) -> str:
    """The one-line message with which ModelConfig refuses ``overrides``."""
    with pytest.raises(ConfigError) as err:
        tiny_model(**overrides)
    assert len(str(err.value).splitlines()) == 1
    return str(err.value)


def check_validation(name: str) -> None:
    """The SPEC's choices and rules name its own fields (a rule may also read another
    mechanism's switch); a value outside a choice and each rule's example are refused on
    construction with their one-line messages; the example config is accepted."""
    spec = spec_of(name)
    tiny_model(**spec.example)
    assert set(spec.choices) <= set(spec.fields)
    for field, allowed in spec.choices.items():
        bad = f"not-a-{field}"
        assert refused(**spec.example, **{field: bad}) == (
            f"{field}={bad!r} is not allowed; choose one of {', '.join(map(repr, allowed))}"
        )
        for value in allowed:
            tiny_model(**{**spec.example, field: value})
    defaults = ModelConfig().to_dict()
    for rule in spec.rules:
        assert set(rule.reads) & set(spec.fields)
        assert set(rule.reads) <= set(spec.fields) | set(mechanisms.plain_fields())
        config = Reads(**{**defaults, **rule.example})
        assert rule.refuses(config) and config.names <= set(rule.reads)
        assert not rule.refuses(Reads(**defaults))
        values = {f: getattr(config, f) for f in rule.reads}
        assert refused(**rule.example) == rule.message.format(**values)


def lively(name: str) -> GPT:
    """The example model with every weight ~ N(0, 0.2): logits far from zero (a parity test on
    near-zero logits would prove little), and no mechanism left at its identity init."""
    model = build(tiny_model(**example(name)))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    return model


def parity_input() -> torch.Tensor:
    """[3, 13]: another shape than the [2, 8] the graphs are traced with."""
    return torch.randint(0, 96, (3, 13), generator=torch.Generator().manual_seed(5))


def full_logits(model: GPT, idx: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        logits = model(idx, all_logits=True)[0]
    assert logits.std() > 0.1
    return logits


def check_torchscript_parity(name: str) -> None:
    """The traced TorchScript archive gives PyTorch's logits."""
    model, idx = lively(name), parity_input()
    with tempfile.TemporaryDirectory() as tmp:
        write_torchscript(model, Path(tmp) / "model.pt")
        traced = torch.jit.load(str(Path(tmp) / "model.pt"))
    with torch.no_grad():
        got = traced(idx)
    torch.testing.assert_close(got, full_logits(model, idx), atol=1e-5, rtol=0)


def check_onnx_parity(name: str) -> None:
    """The ONNX graph in onnxruntime gives PyTorch's logits, in one call and through its cache."""
    pytest.importorskip("onnx", reason="ONNX export needs the onnx package")
    pytest.importorskip("onnxruntime", reason="ONNX parity runs the graph in onnxruntime")
    model, idx = lively(name), parity_input()
    ref = full_logits(model, idx)
    with tempfile.TemporaryDirectory() as tmp:
        write_onnx(model, Path(tmp) / ONNX_FILE)
        lm = OnnxLM(Path(tmp) / ONNX_FILE, model.config)
        cache = lm.new_cache()
        steps = [lm(idx[:, :9], cache=cache)[0], lm(idx[:, 9:10], cache=cache)[0]]
        steps.append(lm(idx[:, 10:], cache=cache)[0])
        whole = lm.logits(idx)
    torch.testing.assert_close(whole, ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(torch.cat(steps, dim=1), ref, atol=1e-5, rtol=0)


def check_no_recompiles(name: str) -> None:
    """Compiled decoding equals eager decoding, and after the warm-up nothing recompiles."""
    from torch._dynamo.utils import counters

    config = tiny_model(**example(name))
    eager, compiled = build(config), compile_for_decoding(build(config))
    graphs = counters["stats"]["unique_graphs"]
    prompt = torch.randint(0, 96, (1, 7), generator=torch.Generator().manual_seed(3))
    for use_cache in (True, False):
        out = compiled.generate(prompt, 40, temperature=0.0, use_cache=use_cache)  # past block 32
        assert torch.equal(out, eager.generate(prompt, 40, temperature=0.0, use_cache=use_cache))
    assert counters["stats"]["unique_graphs"] == graphs, "decoding recompiled after the warm-up"


CHECKS = [
    check_spec,
    check_config_round_trip,
    check_validation,
    check_cached_decoding,
    check_zero_gate,
    check_torchscript_parity,
    check_onnx_parity,
    check_no_recompiles,
]
SLOW = {check_onnx_parity, check_no_recompiles}
# the checks that also run on every mechanism at once
COMPOSABLE = [
    check_config_round_trip,
    check_cached_decoding,
    check_torchscript_parity,
    check_onnx_parity,
    check_no_recompiles,
]


def cases(checks: list) -> list:
    return [
        pytest.param(c, id=c.__name__, marks=[pytest.mark.slow] if c in SLOW else [])
        for c in checks
    ]


@pytest.mark.parametrize("check", cases(CHECKS))
@pytest.mark.parametrize("name", list(REGISTRY))
def test_every_mechanism(name: str, check) -> None:
    check(name)


@pytest.mark.parametrize("check", cases(COMPOSABLE))
def test_all_mechanisms_composed(check) -> None:
    check(ALL)


def test_fields_belong_to_one_mechanism() -> None:
    owned = [f for spec in mechanisms.specs() for f in spec.fields]
    assert len(owned) == len(set(owned))
    assert mechanisms.plain_fields() == {
        k: v for spec in mechanisms.specs() for k, v in spec.switch.items()
    }
    assert mechanisms.enabled(ModelConfig()) == []
    # a choice list lives in one place: the config's for the backbone, a SPEC's for its fields
    owned_choices = [f for spec in mechanisms.specs() for f in spec.choices]
    assert len(owned_choices) == len(set(owned_choices)) and not set(owned_choices) & set(CHOICES)


def test_the_model_refuses_a_config_made_before_the_registry(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A config built while no mechanism check was installed is checked when it becomes a model."""
    monkeypatch.setattr("attnlab.config.MECHANISM_CHECKS", [])
    config = tiny_model(m_inject="mlp_input")
    monkeypatch.undo()
    assert mechanisms.validate in MECHANISM_CHECKS
    with pytest.raises(ConfigError, match="m_inject='mlp_input' needs use_m_gate=True"):
        GPT(config)


def test_attention_passes_multiply() -> None:
    """Twicing runs two passes in each boosting round: the FLOP count's attention term is 2M."""
    assert mechanisms.attention_passes(ModelConfig()) == 1
    assert mechanisms.attention_passes(ModelConfig(boost_rounds=3, twicing=True)) == 6
    model = GPT(tiny_model(boost_rounds=3, twicing=True))
    cfg = model.config
    attention = 12 * cfg.n_layer * cfg.n_head * cfg.head_dim * cfg.block_size
    assert model.flops_per_token() == 6 * model.get_num_params() + 6 * attention


@pytest.fixture
def with_toy(monkeypatch: pytest.MonkeyPatch) -> None:
    """tests/toy_mechanism.py registered with one line."""
    monkeypatch.setitem(sys.modules, f"{mechanisms.__name__}.toy", toy_mechanism)
    monkeypatch.setattr(mechanisms, "REGISTRY", (*mechanisms.REGISTRY, "toy"))


@pytest.mark.parametrize("check", cases(CHECKS))
def test_a_toy_mechanism_from_one_file_passes(with_toy, check) -> None:
    check("toy")
    if check in COMPOSABLE:
        check(ALL)  # and composed with every real mechanism
