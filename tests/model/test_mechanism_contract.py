"""The mechanism contract, checked over the registry: every mechanism alone, each of its
ablation variants, every pair that composes, and each largest set of them that composes.

Each mechanism module declares a ``SPEC`` (attnlab.model.mechanisms.Mechanism); these tests hold
every SPEC to what it claims: its example config turns it (and only it) on, every field it owns
has one line of help, the config survives a JSON round trip, its choices and rules refuse bad
fields with one-line ConfigErrors, cached decoding equals the full forward, a left-padded batch
gives each row its logits alone, the TorchScript and ONNX exports give PyTorch's logits,
transformers' remote code gives its logits and greedy tokens, torch.compile decodes without
recompiling, a zero gate (where the mechanism has one) is exactly plain attention, it trains
under bf16 autocast, its parameters are stored once, and the bench variants and parameter
claims are true.

The cases are derived from the SPECs, never listed: a mechanism alone (its example), its
ablation variants (each other field it owns at each value it may take: every choice, the other
truth value of a bool, and its bench variants), every pair of mechanisms that composes (every
other pair must be refused, naming both), and each largest set that composes (the registry
derives them: "all" while nothing refuses another).
The default suite runs every check on every mechanism alone (the ONNX, compile and transformers
checks are slow) and one representative variant and pair; the rest is marked slow.

Two toy mechanisms written as an author would (tests/toy_mechanism.py, a value scale with a
float32 parameter; tests/toy_core.py, an attention core with parameters on a depth schedule
that excludes twicing) pass the same checks, and
``test_the_readme_recipe_needs_no_fourth_place`` adds a mechanism to a copy of the package with
exactly the steps of docs/adding-a-mechanism.md and runs every listing and registry-derived test on it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import toy_core
import toy_mechanism
from conftest import COMPOSED_ON, ROOT, TINY, composed_label, register_toys, tiny_model

from attnlab import GPT
from attnlab.cli import main
from attnlab.commands.presets import MISSING_HELP
from attnlab.config import CHOICES, MECHANISM_CHECKS, ModelConfig
from attnlab.errors import ConfigError
from attnlab.export.onnx import ONNX_FILE, OnnxLM, write_onnx
from attnlab.export.torchscript import write_torchscript
from attnlab.model import mechanisms
from attnlab.model.generation import compile_for_decoding
from attnlab.model.mechanisms import REGISTRY, Mechanism

TOYS = (toy_mechanism, toy_core)


@dataclass(frozen=True)
class Case:
    """A config the contract runs: its id, its fields (beyond tiny_model's), what it turns on."""

    id: str
    fields: dict[str, Any]
    enabled: tuple[str, ...]


def spec_of(name: str) -> Mechanism:
    return mechanisms.module(name).SPEC


def alone(name: str) -> Case:
    """The mechanism's example."""
    return Case(name, spec_of(name).example, (name,))


def composed() -> list[Case]:
    """Each largest set of registered mechanisms that composes, their examples merged on RoPE
    with GQA ("all" while nothing refuses another)."""
    return [
        Case(composed_label(names), mechanisms.composition(names, **COMPOSED_ON), names)
        for names in mechanisms.compatible_sets(**{**TINY, **COMPOSED_ON})
    ]


def ablation_variants(name: str) -> list[Case]:
    """The example with each other field the mechanism owns at each value it may take besides
    the default (every choice, the other truth value of a bool), then any bench variant that
    is none of these."""
    spec, defaults = spec_of(name), ModelConfig().to_dict()
    found: dict[str, dict[str, Any]] = {}
    for field in spec.fields:
        default = defaults[field]
        values = spec.choices.get(field, (not default,) if isinstance(default, bool) else ())
        for value in values if field not in spec.switch else ():
            if value != default:
                found[f"{spec.label}[{field}={value}]"] = {**spec.example, field: value}
    for label, variant in spec.bench.items():
        if variant != spec.example and variant not in found.values():
            found[f"{spec.label}[{label}]"] = variant
    return [Case(label, variant, (name,)) for label, variant in found.items()]


def pair(a: str, b: str) -> Case:
    return Case(f"{a}+{b}", mechanisms.composition((a, b)), (a, b))


def pairs(composes: bool) -> list:
    """The pairs of registered mechanisms that compose (Cases), or those that do not (with why)."""
    found = mechanisms.pairs(**TINY)
    if composes:
        return [pair(a, b) for (a, b), why in found.items() if why is None]
    return [(a, b, why) for (a, b), why in found.items() if why is not None]


VARIANTS = [case for name in REGISTRY for case in ablation_variants(name)]
PAIRS = pairs(composes=True)


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


def check_config_round_trip(case: Case) -> None:
    config = tiny_model(**case.fields)
    again = ModelConfig.from_dict(json.loads(config.to_json()))
    assert again == config
    assert mechanisms.enabled(again) == [n for n in mechanisms.REGISTRY if n in case.enabled]


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


def check_cached_decoding(case: Case) -> None:
    assert_cache_exact(build(tiny_model(**case.fields)))


def check_left_padding(case: Case) -> None:
    """A left-padded batch (attention_mask, position_ids) gives each row the logits it has
    alone, in one forward and through a padded prefill and one cached step."""
    model = lively(case)
    gen = torch.Generator().manual_seed(3)
    short, long = (torch.randint(1, 96, (1, n), generator=gen) for n in (5, 9))
    pad = long.size(1) - short.size(1)
    ids = torch.cat([torch.cat([torch.zeros(1, pad, dtype=torch.long), short], 1), long])
    mask = torch.ones_like(ids)
    mask[0, :pad] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    nxt = torch.tensor([[7], [7]])
    with torch.no_grad():
        both = model(ids, all_logits=True, attention_mask=mask, position_ids=positions)[0]
        cache = model.new_cache()
        model(ids, cache=cache, attention_mask=mask, position_ids=positions)
        mask = torch.cat([mask, torch.ones_like(nxt)], 1)
        step = model(nxt, cache=cache, attention_mask=mask, position_ids=positions[:, -1:] + 1)[0]
        for row, x, keep in ((0, short, slice(pad, None)), (1, long, slice(None))):
            torch.testing.assert_close(both[row, keep], full_logits(model, x)[0], atol=1e-5, rtol=0)
            ref = full_logits(model, torch.cat([x, nxt[:1]], 1))[0, -1]
            torch.testing.assert_close(step[row, -1], ref, atol=1e-5, rtol=0)


def check_zero_gate(name: str) -> None:
    """With its zero-gate setting, a fresh model computes what plain attention computes."""
    zero = spec_of(name).zero_gate
    if zero is None:
        pytest.skip(f"{name} defines no zero gate")
    # merged: a zero gate may name a field the example sets too (its switch)
    model = build(tiny_model(**{**spec_of(name).example, **zero}))
    with unregistered(name):
        plain = build(base_of(name), seed=1)
    missing, unexpected = model.load_state_dict(plain.state_dict(), strict=False)
    assert not unexpected and missing  # only the mechanism's own parameters keep their init
    idx = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(model(idx, all_logits=True)[0], plain(idx, all_logits=True)[0])


def missing_help(spec: Mechanism) -> str | None:
    """Why the SPEC's help breaks the contract (a field without one line of help), or None."""
    for field in spec.fields:
        text = spec.help.get(field, "")
        if not text or "\n" in text:
            return (
                f"mechanism {spec.name!r}: field {field!r} needs one line of help in its "
                "SPEC's help (attnlab presets --fields prints it)"
            )
    extra = set(spec.help) - set(spec.fields)
    return (
        f"mechanism {spec.name!r}: help for fields it does not own: {sorted(extra)}"
        if extra
        else None
    )


def check_spec(name: str) -> None:
    """The SPEC's claims: fields exist and have help, the default config is off, bench variants
    turn it on, and it adds parameters exactly when it says so."""
    spec = spec_of(name)
    assert spec.name == name
    model_fields = {f.name for f in fields(ModelConfig)}
    assert set(spec.fields) <= model_fields and set(spec.switch) <= set(spec.fields)
    problem = missing_help(spec)
    assert problem is None, problem
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


def accepted(**fields: Any) -> ModelConfig:
    """The config of ``fields``; a refusal fails the contract with its message."""
    try:
        return tiny_model(**fields)
    except ConfigError as e:
        raise AssertionError(f"{fields} is refused: {e}") from None


def check_validation(name: str) -> None:
    """The SPEC's choices name its own fields and its rules read config fields (at least one
    of its own); a value outside a choice and each rule's example are refused on construction
    with their one-line messages; the example config is accepted, and the mechanisms it
    excludes are registered ones."""
    spec = spec_of(name)
    accepted(**spec.example)
    assert set(spec.excludes) <= set(REGISTRY) - {name}, f"{name}: excludes {spec.excludes}"
    assert set(spec.choices) <= set(spec.fields), f"{name}: choices of fields it does not own"
    for field, allowed in spec.choices.items():
        bad = f"not-a-{field}"
        assert refused(**{**spec.example, field: bad}) == (
            f"{field}={bad!r} is not allowed; choose one of {', '.join(map(repr, allowed))}"
        )
        for value in allowed:
            accepted(**{**spec.example, field: value})
    defaults = ModelConfig().to_dict()
    for rule in spec.rules:
        assert set(rule.reads) & set(spec.fields), f"{name}: a rule reads none of its fields"
        unknown = set(rule.reads) - set(defaults)
        assert not unknown, f"{name}: a rule reads {sorted(unknown)}, not config fields"
        config = Reads(**{**defaults, **rule.example})
        assert rule.refuses(config), f"{name}: a rule accepts its own example {rule.example}"
        assert config.names <= set(rule.reads), f"{name}: a rule reads {config.names} unnamed"
        assert not rule.refuses(Reads(**defaults)), f"{name}: a rule refuses the default config"
        values = {f: getattr(config, f) for f in rule.reads}
        assert refused(**rule.example) == rule.message.format(**values)


def lively(case: Case) -> GPT:
    """The case's model with every weight ~ N(0, 0.2): logits far from zero (a parity test on
    near-zero logits would prove little), and no mechanism left at its identity init."""
    model = build(tiny_model(**case.fields))
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


def check_torchscript_parity(case: Case) -> None:
    """The traced TorchScript archive gives PyTorch's logits."""
    model, idx = lively(case), parity_input()
    with tempfile.TemporaryDirectory() as tmp:
        write_torchscript(model, Path(tmp) / "model.pt")
        traced = torch.jit.load(str(Path(tmp) / "model.pt"))
    with torch.no_grad():
        got = traced(idx)
    torch.testing.assert_close(got, full_logits(model, idx), atol=1e-5, rtol=0)


def check_onnx_parity(case: Case) -> None:
    """The ONNX graph in onnxruntime gives PyTorch's logits, in one call and through its cache."""
    pytest.importorskip("onnx", reason="ONNX export needs the onnx package")
    pytest.importorskip("onnxruntime", reason="ONNX parity runs the graph in onnxruntime")
    model, idx = lively(case), parity_input()
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


def check_bf16_autocast(case: Case) -> None:
    """A forward and backward under CPU bf16 autocast: a loss near float32's, finite gradients
    (a hook returning another dtype than it was given broke the next mechanism here)."""
    config = tiny_model(**case.fields)
    idx = torch.randint(0, 96, (2, 17), generator=torch.Generator().manual_seed(4))
    x, y = idx[:, :-1].contiguous(), idx[:, 1:].contiguous()
    losses = []
    for dtype in (None, torch.bfloat16):
        model = build(config).train()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype is not None):
            _, loss = model(x, y)
        loss.backward()
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        assert grads and all(bool(torch.isfinite(g).all()) for g in grads), f"{case.id}: grads"
        losses.append(float(loss.detach()))
    assert losses[1] == pytest.approx(losses[0], rel=0.02), f"{case.id}: bf16 loss {losses}"


def check_parameters_once(case: Case) -> None:
    """Every tensor of the state_dict under one key (the tied embedding apart): a part stored
    under a second attribute is saved twice, and safetensors refuses shared tensors."""
    model = build(tiny_model(**case.fields))
    keys: dict[int, list[str]] = {}
    for key, tensor in model.state_dict().items():
        keys.setdefault(tensor.data_ptr(), []).append(key)
    shared = [k for k in keys.values() if len(k) > 1]
    tied = [["transformer.wte.weight", "lm_head.weight"]]
    assert shared == tied, f"{case.id}: one tensor under several keys: {shared}"


def check_no_recompiles(case: Case) -> None:
    """Compiled decoding equals eager decoding, and after the warm-up nothing recompiles."""
    from torch._dynamo.utils import counters

    config = tiny_model(**case.fields)
    eager, compiled = build(config), compile_for_decoding(build(config))
    graphs = counters["stats"]["unique_graphs"]
    prompt = torch.randint(0, 96, (1, 7), generator=torch.Generator().manual_seed(3))
    for use_cache in (True, False):
        out = compiled.generate(prompt, 40, temperature=0.0, use_cache=use_cache)  # past block 32
        assert torch.equal(out, eager.generate(prompt, 40, temperature=0.0, use_cache=use_cache))
    assert counters["stats"]["unique_graphs"] == graphs, "decoding recompiled after the warm-up"


# checks of one mechanism's SPEC, and checks of a config (every case runs those)
SPEC_CHECKS = [check_spec, check_validation, check_zero_gate]
COMPOSABLE = [
    check_config_round_trip,
    check_parameters_once,
    check_bf16_autocast,
    check_cached_decoding,
    check_left_padding,
    check_torchscript_parity,
    check_onnx_parity,
    check_no_recompiles,
]
SLOW = {check_onnx_parity, check_no_recompiles}
# milliseconds: on every variant and pair by default
CHEAP = {check_config_round_trip, check_parameters_once, check_bf16_autocast}
# what the default suite also runs on one representative variant and pair
REPRESENTATIVE = {check_cached_decoding, check_left_padding}


def cases(checks: list) -> list:
    return [
        pytest.param(c, id=c.__name__, marks=[pytest.mark.slow] if c in SLOW else [])
        for c in checks
    ]


def derived(found: list[Case]) -> list:
    """(case, check) for every case and composable check: slow but for the cheap checks, and
    the representative ones on the first case."""
    fast = [CHEAP | REPRESENTATIVE] + [CHEAP] * (len(found) - 1)
    return [
        pytest.param(
            case,
            check,
            id=f"{case.id}-{check.__name__}",
            marks=[] if check in quick else [pytest.mark.slow],
        )
        for case, quick in zip(found, fast, strict=True)
        for check in COMPOSABLE
    ]


def run_check(check, name: str) -> None:
    """A SPEC check on the mechanism, a config check on its example."""
    check(name) if check in SPEC_CHECKS else check(alone(name))


@pytest.mark.parametrize("check", cases(SPEC_CHECKS + COMPOSABLE))
@pytest.mark.parametrize("name", list(REGISTRY))
def test_every_mechanism(name: str, check) -> None:
    run_check(check, name)


@pytest.mark.parametrize(("case", "check"), derived(VARIANTS))
def test_every_ablation_variant(case: Case, check) -> None:
    check(case)


@pytest.mark.parametrize(("case", "check"), derived(PAIRS))
def test_every_pair(case: Case, check) -> None:
    check(case)


@pytest.mark.parametrize("case", composed(), ids=lambda c: c.id)
@pytest.mark.parametrize("check", cases(COMPOSABLE))
def test_all_mechanisms_composed(check, case: Case) -> None:
    check(case)


def assert_refused_pairs_named() -> None:
    """Every pair of registered mechanisms that does not compose is refused with a message
    naming both (by name, label or a field of theirs)."""
    for a, b, why in pairs(composes=False):
        for name in (a, b):
            spec = spec_of(name)
            assert any(word in why for word in (name, spec.label, *spec.fields)), (a, b, why)


def test_variants_cover_every_choice() -> None:
    """The derived variants reach every allowed value of every choice field, and every case's
    config is one the mechanisms accept (a refused pair would need a rule's example instead)."""
    reached = {(f, c.fields.get(f)) for c in VARIANTS for f in c.fields}
    for spec in mechanisms.specs():
        for field, allowed in spec.choices.items():
            default = getattr(ModelConfig(), field)
            assert {(field, v) for v in allowed if v != default} <= reached, field
    assert len(PAIRS) + len(pairs(composes=False)) == len(REGISTRY) * (len(REGISTRY) - 1) // 2
    assert_refused_pairs_named()


@pytest.mark.slow
def test_transformers_remote_code_over_the_registry(tmp_path: Path) -> None:
    """Every case exported with transformers remote code (attnlab not importable) gives
    attnlab's logits, and its greedy tokens with and without the cache and for a left-padded
    batch (transformers' own generate)."""
    pytest.importorskip("transformers")
    from test_export import chat_tokenizer
    from test_export_hf import HF_SCRIPT, MESSAGES, NEW_TOKENS, OTHER, PROMPT

    from attnlab.export import export_model

    found = [alone(n) for n in REGISTRY] + VARIANTS + PAIRS + composed()
    models = {case.id: lively(case) for case in found}
    for name, model in models.items():
        export_model(model, None, tmp_path / name, ["safetensors"])
    export_model(models[composed()[0].id], chat_tokenizer(), tmp_path / "chat", ["safetensors"])
    x = torch.randint(0, 96, (3, 17), generator=torch.Generator().manual_seed(5))
    np.save(tmp_path / "x.npy", x.numpy())
    job = {
        "x": str(tmp_path / "x.npy"),
        "folders": {name: str(tmp_path / name) for name in models},
        "chat": str(tmp_path / "chat"),
        "prompt": PROMPT,
        "new": NEW_TOKENS,
        "padded": [[0] * (len(PROMPT[0]) - len(OTHER)) + OTHER, PROMPT[0]],
        "messages": MESSAGES,
        "out": str(tmp_path / "results.json"),
    }
    proc = subprocess.run(
        [sys.executable, "-I", "-c", HF_SCRIPT, json.dumps(job)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    pad = len(PROMPT[0]) - len(OTHER)
    for name, model in models.items():
        got = np.load(tmp_path / name / "hf_logits.npy")
        np.testing.assert_allclose(got, full_logits(model, x).numpy(), atol=1e-5, rtol=0)
        ref, other = (
            model.generate(torch.tensor([p]), NEW_TOKENS, temperature=0.0)[0].tolist()
            for p in (PROMPT[0], OTHER)
        )
        greedy = results[name]["greedy"]
        assert greedy["True"] == greedy["False"] == ref, name
        assert greedy["padded"] == [[0] * pad + other, ref], name


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


def test_attention_passes_multiply() -> None:
    """Twicing runs two passes in each boosting round: the FLOP count's attention term is 2M."""
    assert mechanisms.attention_passes(ModelConfig()) == 1
    assert mechanisms.attention_passes(ModelConfig(boost_rounds=3, twicing=True)) == 6
    model = GPT(tiny_model(boost_rounds=3, twicing=True))
    cfg = model.config
    attention = 12 * cfg.n_layer * cfg.n_head * cfg.head_dim * cfg.block_size
    assert model.flops_per_token() == 6 * model.get_num_params() + 6 * attention


@pytest.fixture
def with_toys(monkeypatch: pytest.MonkeyPatch) -> None:
    """The toy mechanisms registered as their author would: a REGISTRY line and a field each."""
    register_toys(monkeypatch, *TOYS)


@pytest.mark.parametrize("toy", [t.SPEC.name for t in TOYS])
@pytest.mark.parametrize("check", cases(SPEC_CHECKS + COMPOSABLE))
def test_a_toy_mechanism_from_one_file_passes(with_toys, check, toy: str) -> None:
    run_check(check, toy)
    if check in COMPOSABLE:  # and composed with the real mechanisms, in each set it joins
        for case in composed():
            if toy in case.enabled:
                check(case)


def test_toys_compose_as_declared(with_toys) -> None:
    """The toy core excludes twicing: the registry derives two largest sets (each without one
    of them), every other pair composes, and the refusal names both and the way out."""
    assert [c.id for c in composed()] == ["all-but-toy_core", "all-but-twicing"]
    assert [(a, b) for a, b, _ in pairs(composes=False)] == [("twicing", "toy_core")]
    assert refused(twicing=True, toy_core=True) == (
        "twicing and toy-core do not compose (the toy_core SPEC's excludes); turn one off: "
        "twicing=False or toy_core=False"
    )
    assert_refused_pairs_named()


def test_two_core_replacements_are_exclusive_by_default(
    with_toys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without its declaration the toy core still never composes with twicing: both replace
    the attention core, and the refusal says so, naming both and the way out."""
    spec = spec_of("toy_core")
    monkeypatch.setattr(toy_core, "SPEC", dataclasses.replace(spec, excludes=()))
    assert refused(twicing=True, toy_core=True) == (
        "twicing and toy-core both replace the attention core and do not compose; turn one "
        "off: twicing=False or toy_core=False"
    )


def test_listings_show_a_registered_mechanism(
    with_toys, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """The CLI's listings come from the registry: info counts the toy's part, the field help
    is the SPECs' (a field whose help is missing is listed as such, not a KeyError traceback),
    and the combinations that do not compose are listed with why."""
    assert main(["info", "shakespeare-char", "n_layer=2", "toy_scale=true"]) == 0
    assert re.search(r"attn\.value_scale\s+256\b", capsys.readouterr().out)  # 2 x kv_dim 128
    assert main(["presets", "--fields"]) == 0
    listed = capsys.readouterr().out
    assert re.search(r"^  toy_scale +bool +false +toy: V \* \(1", listed, re.MULTILINE)
    assert (
        "- twicing + toy-core: twicing and toy-core do not compose (the toy_core SPEC's "
        "excludes); turn one off: twicing=False or toy_core=False\n"
    ) in listed
    spec = spec_of("value_gate")
    dropped = dataclasses.replace(spec, help={"value_gate": spec.help["value_gate"]})
    monkeypatch.setattr(mechanisms.module("value_gate"), "SPEC", dropped)
    assert main(["presets", "--fields"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if "value_gate_init" in line]
    assert len(rows) == 1 and MISSING_HELP in rows[0]
    assert missing_help(dropped) == (
        "mechanism 'value_gate': field 'value_gate_init' needs one line of help in its SPEC's "
        "help (attnlab presets --fields prints it)"
    )


# The steps of docs/adding-a-mechanism.md, applied to a copy of the package: one file ...
RECIPE_MODULE = '''"""Added with only the documented steps: y * (1 + s) before c_proj, s = 0 at init."""

from __future__ import annotations

import torch
from torch import nn

from attnlab.model.mechanisms import Mechanism, Part


class OutputScale(nn.Module):
    def __init__(self, n_embd: int) -> None:
        super().__init__()
        self.s = nn.Parameter(torch.zeros(n_embd))

    def adjust_output(self, x, y, ctx):
        return y * (1 + self.s)


def parts(config) -> list[Part]:
    if not config.out_scale:
        return []
    return [Part("attn", "out_scale", ("output",), lambda: OutputScale(config.n_embd))]


SPEC = Mechanism(
    name="out_scale",
    switch={"out_scale": False},
    fields=("out_scale",),
    example={"out_scale": True},
    bench={"out-scale": {"out_scale": True}},
    zero_gate={},
    help={"out_scale": "a learned per-channel scale of the attention output"},
)
'''
# ... one registry line and one config field; then the tests that read what is registered
RECIPE_FIELD = "    out_scale: bool = False\n"
RECIPE_TESTS = [
    "tests/model/test_mechanism_contract.py",
    "tests/cli/test_terminal.py",
    "tests/bench/test_bench.py",
    "tests/studies/test_studies.py",
    "tests/model/test_padding.py",
    "tests/model/test_properties.py",
]
RECIPE_SELECTION = (
    "out_scale or one_line_of_help or presets_fields or bench_labels or bench_generate_quick "
    "or overhead_study or fields_belong"
)


def apply_recipe(root: Path) -> None:
    """The three documented steps in ``root``, a copy of the checkout, as a user would make them."""
    mech = root / "attnlab/model/mechanisms"
    (mech / "out_scale.py").write_text(RECIPE_MODULE)
    registry = (mech / "__init__.py").read_text()
    line = re.search(r"^REGISTRY = \((.*)\)$", registry, re.MULTILINE)
    assert line, "the registry is no longer one line"
    (mech / "__init__.py").write_text(
        registry.replace(line.group(0), f'REGISTRY = ({line.group(1)}, "out_scale")')
    )
    config = (root / "attnlab/config.py").read_text()
    end = config.index("\n\n    def __post_init__", config.index("class ModelConfig")) + 1
    (root / "attnlab/config.py").write_text(config[:end] + RECIPE_FIELD + config[end:])


@pytest.mark.slow
def test_the_readme_recipe_needs_no_fourth_place(tmp_path: Path) -> None:
    """A mechanism added to a copy of the package with exactly the documented steps shows in every
    listing (field help, info, the bench) and passes the contract and every test that derives
    from the registry; a fourth place it needed would fail here."""
    root = tmp_path / "checkout"
    for part in ("attnlab", "tests"):
        shutil.copytree(ROOT / part, root / part, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", root)
    apply_recipe(root)

    def run(*args: str) -> str:
        proc = subprocess.run(
            [sys.executable, *args], cwd=root, capture_output=True, text=True, timeout=900
        )
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc.stdout

    assert run("-c", "import attnlab; print(attnlab.__file__)").startswith(str(root))
    listed = run("-m", "attnlab", "presets", "--fields")
    assert re.search(r"^  out_scale +bool +false +a learned per-channel", listed, re.MULTILINE)
    assert MISSING_HELP not in listed
    info = run("-m", "attnlab", "info", "shakespeare-char", "out_scale=true")
    assert re.search(r"attn\.out_scale\s+768\b", info)  # 6 layers x n_embd 128
    args = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", "-m", "not slow"]
    out = run(*args, *RECIPE_TESTS, "-k", RECIPE_SELECTION)
    assert re.search(r"\b\d+ passed\b", out) and "failed" not in out, out[-2000:]
