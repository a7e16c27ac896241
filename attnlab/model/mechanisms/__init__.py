"""Attention signals: one module per mechanism, plugged into the backbone at named hooks.

A mechanism module defines ``parts(config) -> list[Part]``; each Part is a small nn.Module that
lives either in the attention (``where="attn"``) or in the block (``where="block"``) under a fixed
attribute name (which fixes its state_dict key), and implements one or more hooks:

=========  ===================================================  ==============================
hook       signature (x: the attention's normalised input)       used by
=========  ===================================================  ==============================
qkv        adjust_qkv(x, q, k, v, ctx) -> (q, k, v)             K/V-bias, value gate
core       core(q, k, v, ctx, slot, dropout_p, need_weights)    Twicing (replaces softmax(QK)V)
           -> (y [B,H,T,D], weights | None)
rounds     add_rounds(x, F, w0, attn, ctx) -> F                 gradient-boosted rounds
output     adjust_output(x, y, ctx) -> y  (y [B,T,E], heads     gated attention (sigmoid gate),
           concatenated, after every round, before c_proj)      K/V-bias ablation "output_mul"
state      update_state(h, ctx) -> None (h = the MLP input)     purpose-state GRU gate
mlp_input  adjust_mlp_input(h, ctx) -> h                        K/V-bias ablation "mlp_input"
=========  ===================================================  ==============================

Every attention hook sees x, so a gate computed from the layer's input is one part with one
hook; ``ctx.state`` is for signals that cross layers (K/V-bias's M); ``ctx.layer`` is the
block's index (0 first), for a depth schedule; ``ctx.layer_cache`` is the layer's KV cache when
decoding (None otherwise). ``ctx.record`` logs a statistic when the trainer asks for them;
``ctx.keep(name + ".gate", g)`` hands a gate to ``attnlab analyze gates`` (the SPEC's
``gates`` names them). What a hook returns is cast back to the dtype it was given (so a
float32 parameter does not leak float32 into the next mechanism under autocast).
docs/adding-a-mechanism.md is the author's guide, with a worked example.

A part may also define ``init_weights()`` (called after the nanoGPT init) and expose
``needs_weights = True`` (a rounds part that needs round-0 attention weights).

Besides ``parts``, a mechanism module declares ``SPEC = Mechanism(...)``: the ModelConfig fields
it owns and their "off" values, a one-line help text for each (``attnlab presets --fields``), their
allowed values (``choices``) and the combinations it refuses (``rules``), a small example config
for the contract tests, its benchmark variants, what it does to the FLOP count, the gates it
hands to the gate analysis, the setting (if any) under which a fresh model computes plain
attention, and the mechanisms it does not compose with (``excludes``; two core replacements
never compose). Everything else is derived here: which mechanisms a config enables, the bench
lists (and so the overhead study), the field help, the plain-reference fields, the validation
of the mechanism fields, and which mechanisms compose (``compatible_sets``: the largest sets
whose examples are accepted together; ``pairs``). tests/model/test_mechanism_contract.py checks every
registered mechanism, each ablation variant it derives from a SPEC's fields and choices, every
compatible pair and each largest compatible set against the contract, that every other pair is
refused with a message naming both, and that a mechanism added by the documented steps needs
nothing else.

How the mechanisms' validation reaches ModelConfig. The SPECs live beside nn.Modules, so reading
them imports torch, and attnlab.config sits below the model (it must not import it, and
``attnlab --help`` must not load torch). So the dependency is inverted: importing this package
installs ``validate`` in ``attnlab.config.MECHANISM_CHECKS``, which ModelConfig runs on
construction after its own checks. Every code path that builds a model, trains or exports
imports this package before it makes a config, so a bad mechanism field is refused where the
config is made, with the message and error type (ConfigError) it always had, before anything is
written. A config made before this package was imported is checked again when it becomes a model
(``attach`` runs ``validate``), so no model is ever built from a config its mechanisms refuse.
"""

from __future__ import annotations

import importlib
import itertools
import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from torch import nn

from attnlab.config import MECHANISM_CHECKS, ModelConfig, check_choice
from attnlab.errors import ConfigError

HOOKS = ("qkv", "core", "rounds", "output", "state", "mlp_input")

# module names under attnlab.model.mechanisms, in the order their hooks run
REGISTRY = ("kv_bias", "value_gate", "twicing", "boosted", "gated_attn")


@dataclass(frozen=True)
class Part:
    """One module a mechanism adds: where it lives, its attribute name, the hooks it serves."""

    where: str  # "attn" or "block"
    name: str  # attribute name on the owner, hence the state_dict key
    hooks: tuple[str, ...]
    build: Callable[[], nn.Module]


@dataclass(frozen=True)
class Rule:
    """A combination of config fields a mechanism refuses, with its one-line message.

    A rule may read any ModelConfig field: its own mechanism's, the backbone's (``n_embd``,
    ``n_head``, ``pos``; derived ones such as ``n_kv_head`` already filled in) and any other
    mechanism's, switch or not. It must read at least one field of its own mechanism.
    """

    reads: tuple[str, ...]  # the ModelConfig fields ``refuses`` looks at
    refuses: Callable[[Any], bool]
    message: str  # formatted with the ``reads`` fields: "m_inject={m_inject!r} needs ..."
    example: dict[str, Any]  # fields of a config it refuses, for the contract tests


def _one(config: Any) -> int:
    return 1


@dataclass(frozen=True)
class Mechanism:
    """What a mechanism module declares as its ``SPEC``."""

    name: str  # the module's name under attnlab.model.mechanisms
    switch: dict[str, Any]  # the fields that turn it on, with their "off" (plain model) values
    fields: tuple[str, ...]  # every ModelConfig field it owns, the switch included
    example: dict[str, Any]  # a small config that turns it on, for tests
    bench: dict[str, dict[str, Any]]  # `bench overhead` variants: label (``label`` or
    # ``label-ablation``) -> fields
    adds_params: bool = True  # bench overhead checks the parameter count grows
    # attention passes per layer, a factor on the FLOP count's attention term
    attention_passes: Callable[[Any], int] = _one
    zero_gate: dict[str, Any] | None = None  # fields under which a fresh model is plain attention
    always_on: bool = False  # no switch: on whenever registered (tests' toy mechanisms)
    choices: dict[str, tuple[Any, ...]] = field(default_factory=dict)  # field -> allowed values
    # combinations refused; a rule may read any config field (see Rule)
    rules: tuple[Rule, ...] = ()
    # mechanisms it never composes with, by name (one side declaring it is enough): a config
    # turning both on is refused with a message naming both. Two mechanisms that replace the
    # attention core are exclusive without saying so.
    excludes: tuple[str, ...] = ()
    help: dict[str, str] = field(default_factory=dict)  # field -> one line for `presets --fields`
    # gates it keeps for `analyze gates` (``ctx.keep(f"{name}.gate", g)``): name -> the range of
    # the scores; ``{m}`` in a name stands for a number (``r{m}``: one gate per boosting round)
    gates: dict[str, tuple[float, float]] = field(default_factory=dict)
    # `bench overhead` also times its variants on the QKVE-style backbone against that backbone
    # (the seed's own setting), besides the nanoGPT one every mechanism is timed on
    bench_on_modern: bool = False

    @property
    def label(self) -> str:
        """The mechanism's one name (the module's, hyphenated): presets, bench labels, studies."""
        return self.name.replace("_", "-")

    def enabled(self, config: Any) -> bool:
        """Whether ``config`` turns the mechanism on (a switch field away from its off value)."""
        return self.always_on or any(getattr(config, k) != off for k, off in self.switch.items())


def module(name: str) -> ModuleType:
    """The mechanism module ``name`` (a REGISTRY entry)."""
    return importlib.import_module(f"{__name__}.{name}")


def specs() -> list[Mechanism]:
    """Every registered mechanism's SPEC, in REGISTRY order."""
    return [module(name).SPEC for name in REGISTRY]


def enabled(config: Any) -> list[str]:
    """Names of the mechanisms ``config`` turns on."""
    return [spec.name for spec in specs() if spec.enabled(config)]


def plain_fields() -> dict[str, Any]:
    """The switches of every mechanism set to off: what makes a config plain attention."""
    return {k: v for spec in specs() for k, v in spec.switch.items()}


def bench_variants() -> dict[str, dict[str, Any]]:
    """`bench overhead` variants of every mechanism: label -> config fields."""
    return {label: fields for spec in specs() for label, fields in spec.bench.items()}


def modern_bench_variants() -> tuple[str, ...]:
    """Bench variants also timed on the QKVE-style backbone (their SPEC's ``bench_on_modern``)."""
    return tuple(label for spec in specs() if spec.bench_on_modern for label in spec.bench)


def param_adding_variants() -> tuple[str, ...]:
    """Bench variants whose mechanism must add parameters."""
    return tuple(label for spec in specs() if spec.adds_params for label in spec.bench)


def field_help() -> dict[str, str]:
    """One line of help for every registered mechanism's fields (field -> text)."""
    return {name: text for spec in specs() for name, text in spec.help.items()}


def choices() -> dict[str, tuple[Any, ...]]:
    """Allowed values of every registered mechanism's choice fields."""
    return {name: allowed for spec in specs() for name, allowed in spec.choices.items()}


def validate(config: Any) -> None:
    """Refuse (ConfigError) a config whose mechanism fields break a registered SPEC's choices or
    rules, or that turns on two mechanisms that do not compose."""
    for spec in specs():
        for name, allowed in spec.choices.items():
            check_choice(name, getattr(config, name), allowed)
        for rule in spec.rules:
            if rule.refuses(config):
                raise ConfigError(
                    rule.message.format(**{f: getattr(config, f) for f in rule.reads})
                )
    on = [spec for spec in specs() if spec.enabled(config)]
    for a, b in itertools.combinations(on, 2):
        if b.name in a.excludes or a.name in b.excludes:
            declared = a.name if b.name in a.excludes else b.name
            raise ConfigError(
                f"{a.label} and {b.label} do not compose (the {declared} SPEC's excludes); "
                f"turn one off: {way_out(a, b)}"
            )
    # parts() only declares the parts (nothing is built), so this costs no model
    cores = [s for s in on if any("core" in p.hooks for p in module(s.name).parts(config))]
    if len(cores) > 1:
        raise ConfigError(
            f"{cores[0].label} and {cores[1].label} both replace the attention core and do not "
            f"compose; turn one off: {way_out(cores[0], cores[1])}"
        )


def way_out(*off: Mechanism) -> str:
    """The settings that turn any one of ``off`` off: "twicing=False or boost_rounds=1"."""
    return " or ".join(", ".join(f"{k}={v!r}" for k, v in s.switch.items()) for s in off)


if validate not in MECHANISM_CHECKS:
    MECHANISM_CHECKS.append(validate)


def composition(names: Sequence[str], **backbone: Any) -> dict[str, Any]:
    """The config fields of ``names`` on together: their examples merged in REGISTRY order, then
    ``backbone`` (fields of the model they run on, which win)."""
    merged = {
        k: v for name in REGISTRY if name in names for k, v in module(name).SPEC.example.items()
    }
    return {**merged, **backbone}


def refusal(names: Sequence[str], **backbone: Any) -> str | None:
    """Why ``names`` do not compose on ``backbone`` (the config's one-line refusal), or None."""
    try:
        ModelConfig(**composition(names, **backbone))
    except ConfigError as e:
        return str(e)
    return None


def compatible_sets(**backbone: Any) -> list[tuple[str, ...]]:
    """The largest sets of registered mechanisms that compose on ``backbone``: each set whose
    merged examples are accepted and that no larger accepted set contains, largest first.
    With nothing refused this is one set, the whole registry: what "all mechanisms" means."""
    found: list[tuple[str, ...]] = []
    for size in range(len(REGISTRY), 0, -1):
        for names in itertools.combinations(REGISTRY, size):
            if not any(set(names) <= set(f) for f in found) and not refusal(names, **backbone):
                found.append(names)
    return found


def pairs(**backbone: Any) -> dict[tuple[str, str], str | None]:
    """Every pair of registered mechanisms -> why it does not compose on ``backbone`` (None: it
    composes)."""
    return {p: refusal(p, **backbone) for p in itertools.combinations(REGISTRY, 2)}


def incompatibilities() -> list[tuple[tuple[str, ...], str]]:
    """What does not compose, for the listings: each pair refused together on the default
    backbone (with its refusal), then each rule reading another mechanism's fields, which
    refuses only some of their settings (with its message, for its example's settings)."""
    found = [(names, why) for names, why in pairs().items() if why]
    owner = {f: spec.name for spec in specs() for f in spec.fields}
    defaults = ModelConfig().to_dict()
    for spec in specs():
        for rule in spec.rules:
            others = {owner[f] for f in rule.reads if owner.get(f, spec.name) != spec.name}
            if others:
                values = {**defaults, **rule.example}
                message = rule.message.format(**{f: values[f] for f in rule.reads})
                found.append(((spec.name, *sorted(others, key=REGISTRY.index)), message))
    return found


def attention_passes(config: Any) -> int:
    """Attention passes per layer under ``config`` (1 for plain attention)."""
    return math.prod(spec.attention_passes(config) for spec in specs() if spec.enabled(config))


def parts_for(config: ModelConfig, where: str) -> list[Part]:
    """Every enabled part of every registered mechanism that lives in ``where``."""
    found = []
    for name in REGISTRY:
        found += [p for p in module(name).parts(config) if p.where == where]
    return found


def attach(owner: nn.Module, config: ModelConfig, where: str) -> dict[str, list[nn.Module]]:
    """Create the parts that live in ``owner`` and return them grouped by hook."""
    validate(config)  # the config may predate this package's import (see the module docstring)
    hooks: dict[str, list[nn.Module]] = defaultdict(list)
    for part in parts_for(config, where):
        module = part.build()
        setattr(owner, part.name, module)
        for hook in part.hooks:
            if hook not in HOOKS:
                raise ValueError(
                    f"part {part.name!r} names unknown hook {hook!r}; hooks are {HOOKS}"
                )
            hooks[hook].append(module)
    if len(hooks["core"]) > 1:
        raise ValueError("only one mechanism may replace the attention core")
    # a plain dict with every hook: a defaultdict would grow on first read, and torch.compile
    # guards on its length, so the first forward after compiling would recompile
    return {hook: hooks[hook] for hook in HOOKS}
