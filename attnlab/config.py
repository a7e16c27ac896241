"""Serialisable configs: plain data, validated on construction, saved next to the weights.

Components are chosen by name (``norm="rmsnorm"``, ``pos="rope"``, ``mlp="swiglu"``) and every
mechanism is one or two flags, so a config round-trips through JSON and TOML unchanged.

The mechanism flags' allowed values and rules are declared by the mechanisms themselves (their
SPECs in attnlab.model.mechanisms), which install their check in MECHANISM_CHECKS when imported;
that package's docstring says why this module does not import them.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from attnlab.errors import AttnlabError, ConfigError
from attnlab.field_help import ALIASES
from attnlab.presets import get_preset

C = TypeVar("C", bound="_Serialisable")

CHOICES: dict[str, tuple[Any, ...]] = {
    "norm": ("layernorm", "rmsnorm"),
    "pos": ("learned", "rope"),
    "mlp": ("gelu", "gelu_tanh", "swiglu"),  # gelu_tanh: GPT-2's tanh approximation
    "norm_placement": ("pre", "post"),
    "ffn_sublayers": (1, 2),
    "nan_policy": ("stop", "skip"),
    "dtype": ("auto", "float32", "bfloat16", "float16"),
    # where metric rows go (attnlab.train.trackers); csv is metrics.csv, which every run keeps
    "trackers": ("csv", "tensorboard", "wandb", "mlflow"),
    # validation batches: one set drawn once, or new ones at each evaluation (nanoGPT's way)
    "eval_batches": ("fixed", "fresh"),
}

# Checks of the mechanism fields, run by ModelConfig after its own: attnlab.model.mechanisms
# installs its ``validate`` here when imported (a config cannot import the layer above it).
MECHANISM_CHECKS: list[Callable[[ModelConfig], None]] = []


def check_choice(name: str, value: Any, allowed: tuple[Any, ...]) -> None:
    """Refuse ``name=value`` unless value is one of ``allowed``."""
    if value not in allowed:
        raise ConfigError(
            f"{name}={value!r} is not allowed; choose one of {', '.join(map(repr, allowed))}"
        )


SEED_LIMIT = 2**32  # seeds are 0 .. 2**32 - 1: torch and numpy take them all, with room to offset


def check_seed(name: str, value: int) -> None:
    """Refuse a seed outside 0 .. 2**32 - 1 (torch.manual_seed overflows past 64 bits)."""
    if not 0 <= value < SEED_LIMIT:
        raise ConfigError(f"{name}={value} must be a whole number from 0 to {SEED_LIMIT - 1}")


class _Serialisable:
    """JSON round-trip, `key=value` overrides and field validation helpers shared by the configs."""

    def to_dict(self) -> dict[str, Any]:
        """Every field by name (the JSON a run folder records)."""
        return dataclasses.asdict(self)  # type: ignore[call-overload]

    def to_json(self) -> str:
        """``to_dict`` as indented JSON."""
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def field_names(cls) -> list[str]:
        """The dataclass's fields in declaration order."""
        return [f.name for f in fields(cls)]  # type: ignore[arg-type]

    @classmethod
    def from_dict(cls: type[C], data: dict[str, Any]) -> C:
        """Build from a dict; an unknown key is an error with a did-you-mean."""
        known = cls.field_names()
        for key in data:
            if key not in known:
                raise AttnlabError(unknown_key_message(key, known, cls.__name__))
        return cls(**data)

    @classmethod
    def from_json(cls: type[C], path: str | Path) -> C:
        """Read a JSON file of ``to_dict``'s shape; an unreadable one is one AttnlabError line."""
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:  # ValueError: not JSON, or not UTF-8 text at all
            raise AttnlabError(f"cannot read config {path}: {e}") from None
        if not isinstance(data, dict):
            raise AttnlabError(f"config {path} must hold a JSON object, not {type(data).__name__}")
        try:
            return cls.from_dict(data)
        except AttnlabError as e:  # name the file: it may come from a stranger
            raise AttnlabError(f"{path}: {e}") from None

    def replace(self: C, **overrides: Any) -> C:
        """A validated copy with some fields changed (unknown fields are an error)."""
        return type(self).from_dict({**self.to_dict(), **overrides})

    def _check_types(self) -> None:
        """Reject values of the wrong type with a message naming the field (JSON/TOML are untyped)."""
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            kinds = [k.strip() for k in str(f.type).split("|")]
            if value is None and "None" in kinds:
                continue
            ok = any(_is_kind(value, k) for k in kinds)
            if not ok:
                raise ConfigError(f"{f.name}={value!r} must be of type {f.type}")
            if isinstance(value, float) and not math.isfinite(value):  # NaN, inf, 1e999
                raise ConfigError(f"{f.name}={value!r} must be a finite number")

    def _check_choice(self, name: str) -> None:
        check_choice(name, getattr(self, name), CHOICES[name])

    def _check_positive(self, *names: str, allow_zero: bool = False) -> None:
        for name in names:
            value = getattr(self, name)
            if value is None:
                continue
            if value < 0 or (value == 0 and not allow_zero):
                bound = ">= 0" if allow_zero else "> 0"
                raise ConfigError(f"{name}={value!r} must be {bound}")


def _is_kind(value: Any, kind: str) -> bool:
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "float":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "str":
        return isinstance(value, str)
    return kind.startswith("dict") and isinstance(value, dict)


def unknown_key_message(key: str, known: list[str], where: str) -> str:
    """The error for an unknown key, suggesting a close spelling or the field another tool's
    name for it stands for (``lr`` -> ``learning_rate``)."""
    alias = ALIASES.get(key.lower())
    close = [alias] if alias in known else difflib.get_close_matches(key, known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown {where} key {key!r}{hint}"


# the defaults of fields that act only with another setting: any other value without it is refused
ROPE_THETA = 10000.0  # with pos="rope"
DIST_TIMEOUT_MAX = 365 * 24 * 3600  # dist_timeout's bound, seconds
MAX_BAD_STEPS = 10  # with nan_policy="skip"


@dataclass
class ModelConfig(_Serialisable):
    """The model: nanoGPT's fields first, then components, then one group of flags per mechanism
    (each group owned, choices and rules included, by its module in attnlab.model.mechanisms)."""

    # nanoGPT (GPTConfig) fields and defaults
    block_size: int = 1024
    vocab_size: int = 50304
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True
    # backbone components, chosen by name
    norm: str = "layernorm"
    norm_eps: float | None = None  # None: 1e-5 for layernorm (nanoGPT), 1e-6 for rmsnorm (QKVE)
    norm_placement: str = "pre"
    pos: str = "learned"
    rope_theta: float = ROPE_THETA
    mlp: str = "gelu"
    d_ffn: int | None = None  # None: 4 * n_embd (nanoGPT)
    ffn_sublayers: int = 1  # 2 = the QKVE seed's "deep SwiGLU": two pre-normed FFNs per block
    n_kv_head: int | None = None  # None: n_head (plain multi-head attention); fewer = GQA
    tie_embeddings: bool = True
    # kv-bias (mechanisms/kv_bias.py): the K/V-bias purpose state (seed kv-bias-purpose-state)
    use_m_gate: bool = False
    m_gate_detached: bool = False
    m_inject: str = "kv"
    # value-gate (mechanisms/value_gate.py; seed qkve-value-gate)
    value_gate: bool = False
    value_gate_init: str = "normal"
    # boosted (mechanisms/boosted.py) and twicing (mechanisms/twicing.py)
    boost_rounds: int = 1
    boost_gate: str = "linear"
    boost_kv_source: str = "residual"
    twicing: bool = False
    # gated-attn (mechanisms/gated_attn.py; Qiu et al. 2025): sigmoid output gate before c_proj
    attn_output_gate: bool = False
    attn_output_gate_init: str = "normal"

    def __post_init__(self) -> None:
        self._check_types()
        self._check_positive(
            "block_size", "vocab_size", "n_layer", "n_head", "n_embd", "rope_theta"
        )
        self._check_positive("d_ffn", "n_kv_head", "boost_rounds", "norm_eps")
        for name in ("norm", "norm_placement", "pos", "mlp", "ffn_sublayers"):
            self._check_choice(name)
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"dropout={self.dropout!r} must be in [0, 1)")
        if self.n_embd % self.n_head:
            raise ConfigError(f"n_embd={self.n_embd} must be divisible by n_head={self.n_head}")
        if self.n_kv_head is not None and self.n_head % self.n_kv_head:
            raise ConfigError(
                f"n_head={self.n_head} must be divisible by n_kv_head={self.n_kv_head}"
            )
        if self.pos == "rope" and self.head_dim % 2:
            raise ConfigError(
                f"pos='rope' needs an even head dim, got n_embd/n_head={self.head_dim}"
            )
        if self.pos != "rope" and self.rope_theta != ROPE_THETA:  # recorded, and did nothing
            raise ConfigError(
                f"rope_theta={self.rope_theta} needs pos='rope' (pos={self.pos!r} rotates nothing)"
            )
        for name, value in self._derived().items():
            if getattr(self, name) is None:
                setattr(self, name, value)
        # after the derivation: a mechanism's rule reads the n_kv_head the model will have
        for check in MECHANISM_CHECKS:
            check(self)

    def _derived(self) -> dict[str, Any]:
        """What the fields given as None take, from the other fields."""
        return {
            "d_ffn": 4 * self.n_embd,
            "n_kv_head": self.n_head,
            "norm_eps": 1e-6 if self.norm == "rmsnorm" else 1e-5,
        }

    def replace(self, **overrides: Any) -> ModelConfig:
        """A validated copy; fields left at their derived defaults are derived again.

        ``replace(n_embd=112)`` on a config whose d_ffn was 4 * n_embd gives d_ffn 448, not the
        old 512; likewise n_kv_head follows n_head and norm_eps follows norm.
        """
        data = self.to_dict()
        for name, default in self._derived().items():
            if name not in overrides and data[name] == default:
                data[name] = None
        return ModelConfig.from_dict({**data, **overrides})

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def kv_dim(self) -> int:
        """Width of K and V (n_kv_head heads of head_dim)."""
        return self.head_dim * (self.n_kv_head or self.n_head)

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> ModelConfig:
        """A named architecture (see attnlab.presets), with field overrides."""
        return cls.from_dict({**get_preset(name).model, **overrides})


# how a training field stands to a run already under way (its ON_RESUME metadata): a FIXED one
# is drawn on once, at the start (the model and batch stream from seed and batch_size, the val
# batches from eval_seed and eval_iters), so a resume could record another value but never
# honour it; an INCIDENTAL one leaves the run's arithmetic alone, so a study may resume or
# reuse a run with another value
ON_RESUME, FIXED, INCIDENTAL = "on_resume", "fixed", "incidental"


def _on_resume(kind: str, default: Any) -> Any:
    return field(default=default, metadata={ON_RESUME: kind})


@dataclass
class TrainConfig(_Serialisable):
    """The optimisation recipe. Defaults are nanoGPT's train.py with a small char-level model in mind."""

    max_iters: int = 5000
    batch_size: int = _on_resume(FIXED, 64)  # the batch stream's shape
    gradient_accumulation_steps: int = 1
    learning_rate: float = 1e-3
    min_lr: float = 1e-4
    warmup_iters: int = 100
    lr_decay_iters: int | None = None  # None: max_iters
    decay_lr: bool = True
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.99
    grad_clip: float = 1.0  # 0 disables clipping
    eval_interval: int = 250
    eval_iters: int = _on_resume(FIXED, 20)
    log_interval: int = _on_resume(INCIDENTAL, 10)
    ckpt_interval: int | None = _on_resume(INCIDENTAL, None)  # None: every eval_interval
    seed: int = _on_resume(FIXED, 1337)
    # the validation batches' stream, the same for every run and variant
    eval_seed: int = _on_resume(FIXED, 2024)
    eval_batches: str = _on_resume(FIXED, "fixed")
    device: str = "auto"
    dtype: str = "auto"
    compile: bool = _on_resume(INCIDENTAL, False)
    max_seconds: float | None = None  # stop early after this much training time
    nan_policy: str = "stop"
    max_bad_steps: int = (
        MAX_BAD_STEPS  # with nan_policy="skip": stop after this many non-finite steps in a row
    )
    fsdp: bool = False
    hsdp: bool = False  # with fsdp: shard within a node, replicate across nodes
    sharded_checkpoints: bool = False  # with fsdp: each rank writes its shards
    dist_timeout: float = 600.0  # seconds; torch's default (30 min) hid a lost peer that long
    tensorboard: bool = _on_resume(INCIDENTAL, True)
    trackers: str = _on_resume(INCIDENTAL, "csv,tensorboard")  # comma-separated
    # free-form notes (e.g. a study's variant name)
    extra: dict[str, Any] = field(default_factory=dict, metadata={ON_RESUME: INCIDENTAL})

    def __post_init__(self) -> None:
        self._check_types()
        self._check_positive(
            "max_iters",
            "batch_size",
            "gradient_accumulation_steps",
            "eval_interval",
            "eval_iters",
            "log_interval",
            "ckpt_interval",
            "lr_decay_iters",
            "max_seconds",
            "dist_timeout",
        )
        self._check_positive(
            "learning_rate",
            "min_lr",
            "warmup_iters",
            "weight_decay",
            "grad_clip",
            "max_bad_steps",
            allow_zero=True,
        )
        if self.dist_timeout > DIST_TIMEOUT_MAX:  # timedelta and the backends overflow past it
            raise ConfigError(
                f"dist_timeout={self.dist_timeout!r} must be at most {DIST_TIMEOUT_MAX:,} "
                "seconds (a year)"
            )
        self._check_choice("nan_policy")
        self._check_choice("dtype")
        self._check_choice("eval_batches")
        self._check_trackers()
        if self.nan_policy != "skip" and self.max_bad_steps != MAX_BAD_STEPS:
            raise ConfigError(
                f"max_bad_steps={self.max_bad_steps} needs nan_policy='skip' (it counts skipped "
                f"steps; nan_policy={self.nan_policy!r} skips none)"
            )
        for name in ("hsdp", "sharded_checkpoints"):  # do nothing without shards
            if getattr(self, name) and not self.fsdp:
                raise ConfigError(f"{name}=true needs fsdp=true (it is about FSDP's shards)")
        check_seed("seed", self.seed)
        check_seed("eval_seed", self.eval_seed)
        for name in self.field_names():  # counts torch cannot hold (negatives are refused above)
            value = getattr(self, name)
            if isinstance(value, int) and value >= 2**63:
                raise ConfigError(f"{name}={value!r} is too large")
        for name in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ConfigError(f"{name}={getattr(self, name)!r} must be in [0, 1)")
        if self.min_lr > self.learning_rate:
            raise ConfigError(
                f"min_lr={self.min_lr} must not exceed learning_rate={self.learning_rate}"
            )

    def _check_trackers(self) -> None:
        names = [n.strip() for n in self.trackers.split(",")]
        for name in names:
            check_choice("trackers", name, CHOICES["trackers"])
        if "csv" not in names:  # resume, studies and reports read it
            raise ConfigError(
                f"trackers={self.trackers!r} must include csv: metrics.csv is the run's own "
                "record (resume and studies read it); add the others beside it"
            )

    def lr_at(self, it: int) -> float:
        """nanoGPT's schedule: linear warmup, cosine decay to min_lr, then min_lr."""
        if not self.decay_lr:
            return self.learning_rate
        decay_iters = self.lr_decay_iters or self.max_iters
        if it < self.warmup_iters:
            return self.learning_rate * (it + 1) / (self.warmup_iters + 1)
        if it > decay_iters:
            return self.min_lr
        ratio = (it - self.warmup_iters) / max(1, decay_iters - self.warmup_iters)
        coeff = 0.5 * (1.0 + math.cos(math.pi * ratio))
        return self.min_lr + coeff * (self.learning_rate - self.min_lr)


def parse_value(text: str) -> Any:
    """Parse the right-hand side of `key=value`: JSON literals (numbers, true/false, null) else string."""
    lowered = text.strip()
    for literal, value in (("true", True), ("false", False), ("none", None), ("null", None)):
        if lowered.lower() == literal:
            return value
    try:
        return json.loads(lowered)
    except json.JSONDecodeError:
        pass
    if lowered.lower().lstrip("+-") in ("nan", "inf", "infinity"):  # refused as non-finite
        return float(lowered)
    return text


def override_key(pair: str) -> str:
    """The field a `key=value` pair sets (`--max-iters=5` sets max_iters)."""
    return pair.partition("=")[0].strip().lstrip("-").replace("-", "_")


def repeated_override(pairs: list[str]) -> str | None:
    """Why one command line's `key=value` ``pairs`` cannot be taken: a key set twice (the last
    value won without a word); None if none is."""
    first: dict[str, str] = {}
    for pair in pairs:
        key = override_key(pair)
        if key in first:
            return f"{key} is given twice ({first[key]} and {pair}); keep one"
        first[key] = pair
    return None


def split_overrides(pairs: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Route `key=value` pairs to (model, train) overrides; unknown keys get a did-you-mean."""
    model_keys, train_keys = ModelConfig.field_names(), TrainConfig.field_names()
    model: dict[str, Any] = {}
    train: dict[str, Any] = {}
    for pair in pairs:
        key, (_, sep, value) = override_key(pair), pair.partition("=")
        if not sep:
            raise AttnlabError(f"override {pair!r} must look like key=value")
        if key in model_keys:
            model[key] = parse_value(value)
        elif key in train_keys:
            train[key] = parse_value(value)
        else:
            raise AttnlabError(unknown_key_message(key, model_keys + train_keys, "config"))
    return model, train


def train_fields(on_resume: str) -> tuple[str, ...]:
    """The TrainConfig fields of one ON_RESUME kind (FIXED or INCIDENTAL), in field order."""
    return tuple(f.name for f in fields(TrainConfig) if f.metadata.get(ON_RESUME) == on_resume)
