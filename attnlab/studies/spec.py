"""Study specs: a TOML file naming variants, a baseline, comparisons, seeds and per-preset scale.

A study is one of three kinds:

- ``lm`` (default): language-model training runs, one per (variant, seed). Each variant is a
  model preset plus ``model`` / ``train`` overrides. Comparisons pair a variant with a baseline
  by seed; ``wallclock = true`` also trains the baseline for the iteration budget that matches
  the variant's wall-clock time (variant ``<baseline>-wallclock``) and compares against it.
- ``overhead``: seconds per training step (forward, backward, optimizer step) against width,
  each variant timed interleaved with the first one (the reference).
- ``retrieval``: tables of the synthetic pattern-retrieval task (no language-model training).

Settings are layered, later wins: the model preset < the scale's ``model``/``train`` < the
variant's own overrides < the scale's per-variant overrides. A scale (``[scale.ci]``,
``[scale.cpu]``, ``[scale.paper]``, ``[scale.converged]``) also sets ``seeds``, an optional
``data`` (a folder or a ``{tokenizer, vocab_size}`` table for the embedded corpus) and ``notes``
saying what it scales down. A scale's per-variant table may set that variant's own ``seeds`` (at
most the scale's): it runs the first that many of the study's seeds (a control needs fewer than
the main arms), and a wall-clock-matched variant runs its baseline's.

A variant's name is a folder under --out and a row of the report's tables: 1 to 64 letters,
digits, '.', '_' or '-'. Its runs' seeds are the study's (``seeds = N`` or ``--seeds``), never a
``train.seed``. Every value is refused in one line when the spec is read, or by its kind's
``check`` (attnlab.studies.kinds), before the study folder is made.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace
from importlib import resources
from pathlib import Path
from typing import Any

from attnlab.config import ModelConfig, TrainConfig, unknown_key_message
from attnlab.errors import AttnlabError
from attnlab.presets import get_preset
from attnlab.studies import SCALES
from attnlab.train.spec import default_data_for, tomllib

KINDS = ("lm", "overhead", "retrieval")
WALLCLOCK_SUFFIX = "-wallclock"


@dataclass
class Variant:
    """One arm of the study: a model preset plus overrides."""

    name: str
    preset: str
    description: str = ""
    model: dict[str, Any] = field(default_factory=dict)
    train: dict[str, Any] = field(default_factory=dict)
    reference: float | None = None  # the seed's reported value, shown beside ours
    # set on the generated wall-clock-matched variants: the baseline they re-run, whose time they match
    matches: str | None = None
    clock_of: str | None = None
    # set on the cells a protocol scale expands an arm into (attnlab.studies.protocol): the arm,
    # its size, its learning rate and the seeds that cell trains
    arm: str | None = None
    size: str | None = None
    lr: float | None = None
    seeds: tuple[int, ...] | None = None


@dataclass
class Comparison:
    """``variant`` against ``baseline`` (paired by seed); optionally also wall-clock matched."""

    baseline: str
    variant: str
    wallclock: bool = False
    wallclock_reference: float | None = None  # the seed's value for the wall-clock-matched baseline
    reference_t: float | None = None  # the seed's published paired t, shown beside ours


@dataclass(frozen=True)
class Protocol:
    """A scale's comparison protocol (docs/studies-protocol.md): each arm at its own best
    learning rate of ``lr_grid`` (tuned on ``tuning_seeds``), at every one of ``sizes``, over
    ``seeds`` evaluation seeds or, ``auto``, as many as a pilot of ``pilot_seeds`` says detect
    the ``smallest_effect`` at 80 % power (at most ``max_seeds``)."""

    lr_grid: tuple[float, ...] = ()
    tuning_seeds: tuple[int, ...] = ()
    # size name -> {"model": ..., "train": ..., "variants": {arm: {"model", "train"}}}
    sizes: dict[str, dict[str, Any]] = field(default_factory=dict)
    auto: bool = False
    smallest_effect: tuple[float, ...] = ()
    pilot_seeds: int = 0
    max_seeds: int = 0


@dataclass
class Scale:
    """How big the study runs at one preset."""

    seeds: int
    notes: str = ""
    data: Any = None  # None, a folder path, or {"tokenizer": ..., "vocab_size": ...}
    model: dict[str, Any] = field(default_factory=dict)
    train: dict[str, Any] = field(default_factory=dict)
    # per variant: its ``model`` / ``train`` overrides and its own ``seeds``
    variants: dict[str, dict[str, Any]] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)  # kind-specific (widths, steps, ...)
    protocol: Protocol | None = None  # None: every arm at its recipe's LR, one size, fixed seeds


@dataclass
class StudySpec:
    """A study as its TOML declares it: kind, variants, scales and comparisons."""

    name: str
    description: str
    kind: str
    variants: dict[str, Variant]
    comparisons: list[Comparison]
    scales: dict[str, Scale]
    params: dict[str, Any] = field(default_factory=dict)  # kind-specific (tables, widths, ...)
    source: str = ""
    text: str = ""  # the spec's full contents: its TOML text, or the table it was given as JSON
    # the variants this invocation may train (None: all, ``training``); the others' finished
    # runs are still reported, so results and report always cover the whole study
    to_train: frozenset[str] | None = None
    # the protocol's state once a preset expanded the arms into cells (attnlab.studies.protocol)
    expanded: Any = None

    @property
    def baseline(self) -> str:
        """The first comparison's baseline (the reference arm of the study)."""
        return self.comparisons[0].baseline if self.comparisons else next(iter(self.variants))

    def training(self, names: list[str]) -> StudySpec:
        """This whole study, training only the variants ``names`` (``attnlab study --variants``).

        The other variants are never trained, but their finished runs are reported with the rest.
        A wall-clock-matched variant needs both the baseline it re-runs and the mechanism it is
        timed against.
        """
        if not self.variants:  # "it has " and nothing: only lm studies train variants
            raise AttnlabError(
                f"--variants: kind = {self.kind!r} studies train no variants; leave it out"
            )
        twice = next((n for i, n in enumerate(names) if n in names[:i]), None)
        if twice is not None:
            raise AttnlabError(f"--variants names {twice!r} twice; name each variant once")
        unknown = [n for n in names if n not in self.variants]
        if unknown:
            raise AttnlabError(
                f"study {self.name!r} has no variant {unknown[0]!r}; "
                f"it has {', '.join(self.variants)}"
            )
        for name in names:
            v = self.variants[name]
            missing = [n for n in (v.matches, v.clock_of) if n and n not in names]
            if missing:
                raise AttnlabError(
                    f"variant {name!r} is timed from {' and '.join(missing)}: select "
                    f"{'them' if len(missing) > 1 else 'it'} too"
                )
        return replace(self, to_train=frozenset(names))

    def trains(self, name: str) -> bool:
        """Whether this invocation may train (or resume) variant ``name``."""
        return self.to_train is None or name in self.to_train

    def scale(self, preset: str) -> Scale:
        """The scale ``preset`` names, refused in one line where the spec has none."""
        if preset not in self.scales:
            raise AttnlabError(
                f"study {self.name!r} has no preset {preset!r}; it has {', '.join(self.scales)}"
            )
        return self.scales[preset]

    def seeds_of(self, name: str, preset: str, seeds: list[int]) -> list[int]:
        """The ``seeds`` variant ``name`` runs at ``preset``: the first as many as its own
        ``seeds`` in the scale (its baseline's for a wall-clock-matched variant), else all."""
        variant = self.variants[name]
        if variant.seeds is not None:  # a protocol's cell: the seeds its phase has reached
            return [s for s in seeds if s in variant.seeds]
        own = self.scale(preset).variants.get(variant.matches or name, {}).get("seeds")
        return list(seeds[:own] if own else seeds)

    def layered(self, variant: Variant, preset: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """(model, train) overrides for ``variant`` at ``preset``, layered as the module says."""
        scale = self.scale(preset)
        own = scale.variants.get(variant.matches or variant.name, {})
        model = {**scale.model, **variant.model, **own.get("model", {})}
        train = {**scale.train, **variant.train, **own.get("train", {})}
        return model, train


def _specs_dir() -> Any:
    return resources.files("attnlab.studies") / "specs"


def list_studies() -> list[tuple[str, str]]:
    """(name, description) of every shipped study."""
    out = []
    for entry in sorted(_specs_dir().iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".toml"):
            spec = parse_spec(_load_toml_text(entry.read_text(), entry.name), entry.name)
            out.append((spec.name, spec.description))
    return out


def _load_toml_text(text: str, where: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise AttnlabError(f"study spec {where} is not valid TOML ({e})") from None


def load_spec(name_or_path: str | Path) -> StudySpec:
    """A shipped study by name, or a user's TOML file by path."""
    path = Path(name_or_path)
    if path.suffix == ".toml" or path.is_file():
        if not path.is_file():
            raise AttnlabError(f"study spec {path} does not exist")
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise AttnlabError(f"study spec {path} is not UTF-8 text") from None
        except OSError as e:  # unreadable
            raise AttnlabError(f"study spec {path}: {e.strerror}") from None
        return load_spec_text(text, str(path))
    entry = _specs_dir() / f"{name_or_path}.toml"
    if not entry.is_file():
        known = ", ".join(name for name, _ in list_studies())
        raise AttnlabError(
            f"unknown study {str(name_or_path)!r} (known: {known}; or pass a .toml path)"
        )
    return load_spec_text(entry.read_text(), entry.name)


def load_spec_text(text: str, source: str) -> StudySpec:
    """A spec from its ``text`` as a study folder recorded it (``StudySpec.text``: TOML, or the
    JSON of a spec given as a table); ``source`` names it."""
    if text.lstrip().startswith("{"):  # no TOML document starts with a brace
        return parse_spec(json.loads(text), source, text)
    return parse_spec(_load_toml_text(text, source), source, text)


def shipped_spec_at(name: str, commit: str) -> str | None:
    """The text of the shipped spec file ``name`` at git ``commit`` (None where that cannot
    be read: not a shipped spec's name, no git checkout, no such commit or file)."""
    if Path(name).name != name or not name.endswith(".toml"):
        return None
    try:
        folder = Path(str(_specs_dir()))
        proc = subprocess.run(
            ["git", "show", f"{commit}:./{name}"], capture_output=True, timeout=30, cwd=folder
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.decode("utf-8", "replace") if proc.returncode == 0 else None


def _table(data: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise AttnlabError(f"{where}: {key} must be a table, not {type(value).__name__}")
    return value


def check_keys(
    data: dict[str, Any], allowed: Sequence[str], where: str, what: str = "study"
) -> None:
    """Refuse a key of ``data`` not in ``allowed``, naming a close spelling and every known key."""
    for key in data:
        if key not in allowed:
            known = ", ".join(allowed)
            raise AttnlabError(
                f"{where}: {unknown_key_message(key, list(allowed), what)} (known: {known})"
            )


@dataclass(frozen=True)
class Rule:
    """What one value of a kind's table must be: ``test`` passes it, or it "must be ``what``"."""

    test: Callable[[Any], bool]
    what: str


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # a bool is an int to Python


def _finite(value: Any) -> bool:
    return (_whole(value) or isinstance(value, float)) and math.isfinite(value)


def whole_number(least: int) -> Rule:
    """A spec value that must be an integer (not a bool) of at least ``least``."""
    return Rule(lambda v: _whole(v) and v >= least, f"a whole number >= {least}")


def one_of(choices: Sequence[str]) -> Rule:
    """A spec value that must be one of ``choices``."""
    return Rule(lambda v: isinstance(v, str) and v in choices, f"one of {', '.join(choices)}")


def list_of(item: Rule, empty: bool = False) -> Rule:
    """A list (non-empty unless ``empty``) of values that each pass ``item``."""
    return Rule(
        lambda v: isinstance(v, list) and (empty or bool(v)) and all(item.test(x) for x in v),
        f"a {'' if empty else 'non-empty '}list, each {item.what}",
    )


FINITE = Rule(_finite, "a finite number")
POSITIVE = Rule(lambda v: _finite(v) and v > 0, "a finite number > 0")
FLAG = Rule(lambda v: isinstance(v, bool), "true or false")
TEXT = Rule(lambda v: isinstance(v, str), "a string")
TABLE = Rule(lambda v: isinstance(v, dict), "a table")
# a column or row name, or a title: a cell or heading of the report's markdown, which a '|' or
# a line break would split
LABEL = Rule(
    lambda v: isinstance(v, str) and bool(v.strip()) and not any(c in v for c in "|\r\n"),
    "a non-empty string without '|' or line breaks",
)


def check_table(
    table: Any,
    rules: dict[str, Rule],
    where: str,
    what: str,
    required: Sequence[str] = (),
) -> None:
    """Refuse (in one line) a kind-specific ``table`` of the spec that is not a table of only
    the keys of ``rules``, each value passing its rule, with every key ``required``."""
    if not isinstance(table, dict):
        raise AttnlabError(f"{where} must be a table, not {table!r}")
    check_keys(table, list(rules), where, what)
    for key, value in table.items():
        if not rules[key].test(value):
            raise AttnlabError(f"{where}: {key} must be {rules[key].what}, not {value!r}")
    for key in required:
        if key not in table:
            raise AttnlabError(f"{where}: needs {key}")


_FIELDS = {
    "model": [f.name for f in fields(ModelConfig)],
    "train": [f.name for f in fields(TrainConfig)],
}


def _check_fields(table: dict[str, Any], where: str) -> None:
    """The ``model`` and ``train`` tables of ``table`` name only real config fields, so a typo
    fails when the spec is read, not when its run starts."""
    for section, known in _FIELDS.items():
        overrides = table.get(section, {})
        if not isinstance(overrides, dict):
            raise AttnlabError(f"{where}: {section} must be a table of key = value")
        for key in overrides:
            if key not in known:
                raise AttnlabError(f"{where}: {unknown_key_message(key, known, section)}")
        if section == "train" and "seed" in overrides:  # planned() sets every run's seed
            raise AttnlabError(
                f"{where}: train.seed is not read in a study: its runs' seeds come from "
                "`seeds = N` (0 .. N-1) or `--seeds`; leave it out"
            )


_TYPES = {str: "a string", bool: "true or false", float: "a number", dict: "a table"}


def _typed(table: dict[str, Any], key: str, kinds: tuple[type, ...], where: str) -> Any:
    """``table[key]`` (None if absent) when it has one of ``kinds``: TOML is typed, so a quoted
    "yes" for a flag or a number for a name would otherwise be taken for something else."""
    value = table.get(key)
    if value is None:
        return None
    if isinstance(value, bool):  # a bool is an int to Python, never a number here
        fits = bool in kinds
    else:  # an integer is a number too
        fits = isinstance(value, kinds) or (float in kinds and isinstance(value, int))
    if fits and isinstance(value, float) and not math.isfinite(value):  # TOML has nan and inf
        raise AttnlabError(f"{where}: {key} must be a finite number, not {value!r}")
    if fits:
        return value
    what = " or ".join(_TYPES[k] for k in kinds)
    raise AttnlabError(f"{where}: {key} must be {what}, not {value!r}")


def _seeds(table: dict[str, Any], where: str, default: int) -> int:
    """``table``'s ``seeds``: a whole number >= 1 (``default`` if absent)."""
    seeds = table.get("seeds", default)
    if not isinstance(seeds, int) or isinstance(seeds, bool) or seeds < 1:
        raise AttnlabError(f"{where}: seeds must be a whole number >= 1")
    return seeds


NAME_MAX = 64
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def _check_path_name(name: str, what: str) -> None:
    """Variant names become folders under --out (no separators, no '..', nothing hidden, well
    under the file-name limit with its wall-clock arm's suffix) and rows of the report's markdown
    tables (no '|', no line break): 1 to NAME_MAX letters, digits, '.', '_' or '-'."""
    if not name or name.startswith(".") or any(c in name for c in "/\\\0:"):
        raise AttnlabError(
            f"{what} name {name!r} cannot be a folder name (no '/', '\\', ':' or leading '.')"
        )
    if len(name) > NAME_MAX or not _NAME.fullmatch(name):
        shown = (
            repr(name) if len(name) <= NAME_MAX else f"{name[:16]!r}... ({len(name)} characters)"
        )
        raise AttnlabError(
            f"{what} name {shown} must be 1 to {NAME_MAX} letters (a-z, A-Z), digits, '.', '_' or "
            "'-', starting with a letter or digit"
        )


# the types of a ``{corpus, tokenizer, vocab_size}`` data table, checked before its meaning
_DATA = {"corpus": TEXT, "tokenizer": TEXT, "vocab_size": whole_number(1)}


def _data(s: dict[str, Any], where: str, preset: str) -> Any:
    """A scale's ``data``: a folder (checked when the study starts: it may be prepared by then)
    or a table of the shipped corpus prepared the way it says, checked here."""
    data = _typed(s, "data", (str, dict), f"{where} scale {preset}")
    if isinstance(data, dict):
        at = f"{where}: scale {preset}: data"
        check_table(data, _DATA, at, "data")
        try:  # the corpus, tokenizer and vocabulary as the data module knows them
            default_data_for(data)
        except AttnlabError as e:
            raise AttnlabError(f"{at}: {e}") from None
    return data


def parse_spec(data: dict[str, Any], source: str = "", text: str | None = None) -> StudySpec:
    """Validate a study table (as read from TOML ``text``) into a StudySpec."""
    where = source or "study spec"
    check_keys(
        data, ("name", "description", "kind", "variants", "comparisons", "scale", "params"), where
    )
    kind = data.get("kind", "lm")
    if kind not in KINDS:
        raise AttnlabError(
            f"{where}: kind={kind!r} is not allowed; choose one of {', '.join(KINDS)}"
        )
    variants: dict[str, Variant] = {}
    for name, v in _table(data, "variants", where).items():
        _check_path_name(name, f"{where}: variant")
        check_keys(
            v, ("preset", "description", "model", "train", "reference"), f"{where} variant {name}"
        )
        if "preset" not in v:
            raise AttnlabError(f"{where}: variant {name!r} needs a preset")
        if not isinstance(v["preset"], str):
            raise AttnlabError(f"{where}: variant {name!r}: preset must be a name (a string)")
        try:
            get_preset(v["preset"])
        except AttnlabError as e:
            raise AttnlabError(f"{where}: variant {name!r}: {e}") from None
        _check_fields(v, f"{where} variant {name}")
        at = f"{where} variant {name}"
        variants[name] = Variant(
            name,
            v["preset"],
            _typed(v, "description", (str,), at) or "",
            _table(v, "model", where),
            _table(v, "train", where),
            _typed(v, "reference", (float,), at),
        )
    if kind == "lm" and not variants:
        raise AttnlabError(f"{where}: a {kind} study needs at least one variant")
    if kind != "lm" and (variants or data.get("comparisons")):  # they were dropped unread
        raise AttnlabError(
            f"{where}: kind = {kind!r} takes no variants or comparisons (those are for kind = 'lm')"
        )
    comparisons = []
    listed = data.get("comparisons", [])
    if not isinstance(listed, list) or not all(isinstance(c, dict) for c in listed):
        raise AttnlabError(f"{where}: comparisons must be [[comparisons]] tables")
    for c in listed:
        check_keys(
            c,
            ("baseline", "variant", "wallclock", "wallclock_reference", "reference_t"),
            f"{where} comparison",
        )
        for role in ("baseline", "variant"):
            if c.get(role) not in variants:
                raise AttnlabError(f"{where}: comparison {role} {c.get(role)!r} is not a variant")
        if c["baseline"] == c["variant"]:  # its differences are all zero: no test, no information
            raise AttnlabError(
                f"{where}: comparison of {c['variant']!r} against baseline {c['baseline']!r} "
                "compares a variant with itself; name two different variants"
            )
        at = f"{where} comparison"
        # either way round it is the same test: Holm would correct for two where there is one
        if any({c["baseline"], c["variant"]} == {k.baseline, k.variant} for k in comparisons):
            raise AttnlabError(
                f"{where}: the comparison of {c['variant']!r} against baseline "
                f"{c['baseline']!r} is listed twice (in either direction); keep one"
            )
        comparisons.append(
            Comparison(
                c["baseline"],
                c["variant"],
                bool(_typed(c, "wallclock", (bool,), at)),
                _typed(c, "wallclock_reference", (float,), at),
                _typed(c, "reference_t", (float,), at),
            )
        )
    scales = {}
    for preset, s in _table(data, "scale", where).items():
        if preset not in SCALES:
            raise AttnlabError(f"{where}: scale {preset!r} is not one of {', '.join(SCALES)}")
        check_keys(
            s,
            ("seeds", "notes", "data", "model", "train", "variants", "params", *PROTOCOL_KEYS),
            f"{where} scale {preset}",
        )
        at = f"{where} scale {preset}"
        protocol = _protocol(s, f"{where}: scale {preset}", variants, comparisons)
        auto = protocol is not None and protocol.auto
        seeds = protocol.max_seeds if auto else _seeds(s, f"{where}: scale {preset}", 1)
        if protocol is not None and protocol.tuning_seeds:
            overlap = sorted(set(protocol.tuning_seeds) & set(range(seeds)))
            if overlap:
                raise AttnlabError(
                    f"{where}: scale {preset}: tuning seed {overlap[0]} is also an evaluation "
                    f"seed (0 .. {seeds - 1}); tuning seeds must be disjoint from them"
                )
        per_variant = _table(s, "variants", where)
        for name, own in per_variant.items():
            if name not in variants:
                raise AttnlabError(f"{where}: scale {preset} overrides unknown variant {name!r}")
            if not isinstance(own, dict):
                raise AttnlabError(f"{at} variant {name} must be a table")
            check_keys(own, ("model", "train", "seeds"), f"{at} variant {name}")
            if protocol is not None and "seeds" in own:  # the protocol gives every cell its seeds
                raise AttnlabError(
                    f"{at} variant {name}: seeds is not read with an lr_grid, sizes or seeds = "
                    "'auto' (every arm runs the protocol's seeds); leave it out"
                )
            _check_fields(own, f"{at} variant {name}")
            if "seeds" in own and _seeds(own, f"{at} variant {name}", seeds) > seeds:
                raise AttnlabError(
                    f"{at} variant {name}: seeds {own['seeds']} is more than the scale's {seeds} "
                    "(a variant runs at most the study's seeds)"
                )
        _check_fields(s, f"{where} scale {preset}")
        scales[preset] = Scale(
            seeds,
            _typed(s, "notes", (str,), at) or "",
            _data(s, where, preset),
            _table(s, "model", where),
            _table(s, "train", where),
            per_variant,
            _table(s, "params", where),
            protocol,
        )
    if not scales:
        raise AttnlabError(f"{where}: a study needs at least one [scale.<preset>] table")
    spec = StudySpec(
        _typed(data, "name", (str,), where) or Path(source).stem,
        _typed(data, "description", (str,), where) or "",
        kind,
        variants,
        comparisons,
        scales,
        _table(data, "params", where),
        source,
        text if text is not None else json.dumps(data, indent=2, default=str),
    )
    _add_wallclock_variants(spec)
    return spec


PROTOCOL_KEYS = (
    "lr_grid",
    "tuning_seeds",
    "sizes",
    "smallest_effect",
    "pilot_seeds",
    "max_seeds",
)
_SEED = whole_number(0)
# a size's table: overrides for every arm and, per arm, its own
_SIZE_KEYS = ("model", "train", "variants")


def _protocol(
    s: dict[str, Any], where: str, variants: dict[str, Variant], comparisons: list[Comparison]
) -> Protocol | None:
    """A scale's protocol keys (PROTOCOL_KEYS and ``seeds = "auto"``), each refused in one line
    where it is wrong or lacks what it needs; None where the scale gives none of them."""
    if not any(k in s for k in PROTOCOL_KEYS) and s.get("seeds") != "auto":
        return None
    grid = s.get("lr_grid", [])
    if "lr_grid" in s and not (list_of(POSITIVE).test(grid) and len(set(grid)) == len(grid) >= 3):
        raise AttnlabError(
            f"{where}: lr_grid must be a list of 3 or more different learning rates > 0, "
            f"not {grid!r}"
        )
    tuning = s.get("tuning_seeds", [])
    if "tuning_seeds" in s and not (
        list_of(_SEED).test(tuning) and len(set(tuning)) == len(tuning)
    ):
        raise AttnlabError(
            f"{where}: tuning_seeds must be a list of different whole numbers >= 0, not {tuning!r}"
        )
    if bool(grid) != bool(tuning):
        raise AttnlabError(
            f"{where}: lr_grid and tuning_seeds go together (the grid is trained on the tuning "
            "seeds); give both or neither"
        )
    auto = s.get("seeds") == "auto"
    power = ("smallest_effect", "pilot_seeds", "max_seeds")
    if not auto and any(k in s for k in power):
        given = next(k for k in power if k in s)
        raise AttnlabError(f'{where}: {given} is read only with seeds = "auto"; set that too')
    effects: list[float] = []
    if auto:
        missing = [k for k in power if k not in s]
        if missing:
            raise AttnlabError(f'{where}: seeds = "auto" needs {", ".join(missing)}')
        effects = s["smallest_effect"]
        effects = effects if isinstance(effects, list) else [effects]
        if not list_of(Rule(lambda v: _finite(v) and v != 0, "")).test(effects):
            raise AttnlabError(
                f"{where}: smallest_effect must be a loss difference other than 0 (or a list "
                f"of them), not {s['smallest_effect']!r}"
            )
        for key in ("pilot_seeds", "max_seeds"):
            if not whole_number(2).test(s[key]):
                raise AttnlabError(f"{where}: {key} must be a whole number >= 2, not {s[key]!r}")
        if s["max_seeds"] < s["pilot_seeds"]:
            raise AttnlabError(
                f"{where}: max_seeds {s['max_seeds']} is below pilot_seeds {s['pilot_seeds']}"
            )
        if not comparisons:
            raise AttnlabError(f'{where}: seeds = "auto" sizes n by a comparison; add one')
    sizes = _table(s, "sizes", where)
    if "sizes" in s and len(sizes) < 2:
        raise AttnlabError(
            f"{where}: sizes must name 2 or more sizes (one size: give its values in the scale)"
        )
    for size, table in sizes.items():
        _check_path_name(size, f"{where}: size")
        at = f"{where} size {size}"
        check_table(table, dict.fromkeys(_SIZE_KEYS, TABLE), at, "size")
        _check_fields(table, at)
        for arm, own in table.get("variants", {}).items():
            if arm not in variants:
                raise AttnlabError(f"{at}: overrides unknown variant {arm!r}")
            check_table(own, {"model": TABLE, "train": TABLE}, f"{at} variant {arm}", "variant")
            _check_fields(own, f"{at} variant {arm}")
    if any(c.wallclock for c in comparisons):
        raise AttnlabError(
            f"{where}: a wall-clock comparison is not made under lr_grid, sizes or seeds = "
            "'auto' (its budget is timed for one learning rate and size); use another scale"
        )
    return Protocol(
        tuple(sorted(grid)),
        tuple(tuning),
        sizes,
        auto,
        tuple(effects),
        s.get("pilot_seeds", 0),
        s.get("max_seeds", 0),
    )


def _add_wallclock_variants(spec: StudySpec) -> None:
    """For each wall-clock comparison, the baseline re-run at the matched budget and its comparison."""
    defined = set(spec.variants)  # the spec's own: a generated arm never takes one's place
    for comp in [c for c in spec.comparisons if c.wallclock]:
        name = comp.baseline + WALLCLOCK_SUFFIX
        if name in spec.variants and name not in defined:  # a second mechanism, same baseline
            name = f"{comp.baseline}{WALLCLOCK_SUFFIX}-{comp.variant}"
        if name in defined:
            raise AttnlabError(
                f"{spec.source or 'study spec'}: variant {name!r} has the name of the wall-clock "
                f"arm generated for {comp.variant!r} against {comp.baseline!r}; rename the variant"
            )
        base = spec.variants[comp.baseline]
        spec.variants[name] = Variant(
            name,
            base.preset,
            f"{comp.baseline} trained for {comp.variant}'s wall-clock time",
            dict(base.model),
            dict(base.train),
            comp.wallclock_reference,
            comp.baseline,
            comp.variant,
        )
        spec.comparisons.append(Comparison(name, comp.variant))
