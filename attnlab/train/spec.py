"""From a preset, a TOML file and `key=value` overrides to (ModelConfig, TrainConfig, data folder).

Later sources win: preset < TOML file < command-line overrides. A TOML file may name a
``preset`` and a ``data`` folder, and hold ``[model]`` / ``[train]`` tables or flat keys.
"""

from __future__ import annotations

import json
import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnlab.config import ModelConfig, TrainConfig, split_overrides
from attnlab.data.corpus import EMBEDDED
from attnlab.data.prepare import default_data_dir
from attnlab.errors import AttnlabError
from attnlab.presets import get_preset

logger = logging.getLogger(__name__)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DEFAULT_PRESET = "shakespeare-char"


@dataclass
class RunSpec:
    """What one training run is: model, recipe, data, and whether the data sets the vocabulary."""

    model: ModelConfig
    train: TrainConfig
    data_dir: Path | None  # None: the embedded char corpus
    vocab_from_data: bool  # False if set by the user, or by the preset for its own data
    preset: str = DEFAULT_PRESET


def read_toml(path: str | Path) -> dict[str, Any]:
    """A TOML file as a dict; a missing or malformed file is one AttnlabError line."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise AttnlabError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as e:
        raise AttnlabError(f"config file {path} is not valid TOML ({e})") from None
    except UnicodeDecodeError:
        raise AttnlabError(f"config file {path} is not UTF-8 text") from None
    except OSError as e:  # a folder, unreadable, a symlink loop
        raise AttnlabError(
            f"config file {path}: {e.strerror}; --config takes a TOML file"
        ) from None


SCHEDULE_FIELDS = ("warmup_iters", "lr_decay_iters")


def with_scaled_schedule(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``base`` updated by ``overrides``, its warmup and decay scaled to a changed max_iters.

    A recipe's schedule is written for its own max_iters: ``max_iters=300`` on a 3000-iteration
    preset keeps the lr decaying over 300, not 3000, iterations, unless the user sets the
    schedule fields too.
    """
    merged = {**base, **overrides}
    old, new = base.get("max_iters"), overrides.get("max_iters")
    if not isinstance(old, int) or not isinstance(new, int) or old <= 0 or new == old:
        return merged  # bad values are reported by TrainConfig
    for name in SCHEDULE_FIELDS:
        if name not in overrides and isinstance(base.get(name), int):
            merged[name] = max(1 if name == "lr_decay_iters" else 0, round(base[name] * new / old))
    return merged


def as_overrides(table: dict[str, Any]) -> list[str]:
    """TOML values back to `key=value` strings so one router validates every source."""
    return [f"{k}={json.dumps(v)}" for k, v in table.items()]


def resolve(
    preset: str | None = None,
    config_file: str | Path | None = None,
    overrides: list[str] | None = None,
    data: str | Path | None = None,
) -> RunSpec:
    """Merge the sources, validate, and find the data folder the preset expects."""
    file_data = read_toml(config_file) if config_file else {}
    for key, kind, what in (("preset", str, "a name"), ("data", str, "a folder path"),
                            ("model", dict, "a table"), ("train", dict, "a table")):  # fmt: skip
        if key in file_data and not isinstance(file_data[key], kind):
            raise AttnlabError(
                f"config file {config_file}: {key} must be {what}, not {file_data[key]!r}"
            )
    file_preset = file_data.pop("preset", None)
    if preset and file_preset and preset != file_preset:  # --preset silently won
        raise AttnlabError(
            f"--preset {preset} and config file {config_file}'s preset {file_preset!r} disagree; "
            "give one of them"
        )
    preset_name = preset or file_preset or DEFAULT_PRESET
    data = data or file_data.pop("data", None)
    p = get_preset(preset_name)
    tables = {"[model]": file_data.pop("model", {}), "[train]": file_data.pop("train", {})}
    check_tables(config_file, {**tables, "the top level": file_data})
    pairs = (
        as_overrides(tables["[model]"]) + as_overrides(tables["[train]"]) + as_overrides(file_data)
    )
    model, train, model_over = configs(preset_name, pairs + list(overrides or []))
    say_if_warmup_outlasts_decay(train)
    data_dir = Path(data).expanduser() if data else default_data_for(p.data)
    # a preset's vocab_size belongs to its own data; other data brings its own vocabulary
    vocab_from_data = "vocab_size" not in model_over and (
        "vocab_size" not in p.model or not is_presets_own_data(p.data, data_dir)
    )
    return RunSpec(model, train, data_dir, vocab_from_data, preset_name)


def say_if_warmup_outlasts_decay(train: TrainConfig) -> None:
    """One line on stderr when the warmup does not end before the decay does: the learning rate
    never reaches its peak and never decays (accepted: a smoke test may not care)."""
    decay = train.lr_decay_iters or train.max_iters
    if train.decay_lr and train.warmup_iters >= decay:
        logger.warning(
            f"attnlab: warmup_iters={train.warmup_iters} is not shorter than the decay ({decay} "
            f"iterations): no cosine decay, and the learning rate never reaches "
            f"learning_rate={train.learning_rate}",
        )


def check_tables(config_file: str | Path | None, tables: dict[str, dict[str, Any]]) -> None:
    """Refuse a TOML key set twice (one value silently won) or in the other config's table (a
    model field under [train] was applied to the model)."""
    seen: dict[str, str] = {}
    for table, keys in tables.items():
        for key in keys:
            if key in seen:
                raise AttnlabError(
                    f"config file {config_file} sets {key} twice (in {seen[key]} and {table}); "
                    "keep one"
                )
            seen[key] = table
    for table, other in (("[model]", TrainConfig), ("[train]", ModelConfig)):
        misplaced = [key for key in tables[table] if key in other.field_names()]
        if misplaced:
            home = "[train]" if table == "[model]" else "[model]"
            raise AttnlabError(
                f"config file {config_file}: {misplaced[0]} belongs in {home}, not {table}"
            )


def data_folder(spec: RunSpec) -> Path:
    """The folder a run of ``spec`` reads its data from (the embedded char corpus is prepared
    into its default folder)."""
    return spec.data_dir or default_data_dir("char")


def configs(preset_name: str, pairs: list[str]) -> tuple[ModelConfig, TrainConfig, dict[str, Any]]:
    """The preset's configs with the `key=value` ``pairs`` applied and validated, and the model
    fields the pairs set."""
    p = get_preset(preset_name)
    model_over, train_over = split_overrides(pairs)
    model = ModelConfig.from_dict({**p.model, **model_over})
    return model, TrainConfig.from_dict(with_scaled_schedule(p.train, train_over)), model_over


def _shipped_dir(data_spec: dict[str, Any]) -> Path:
    """The folder a ``{corpus, tokenizer, vocab_size}`` table is prepared into."""
    return default_data_dir(
        data_spec.get("tokenizer", "char"),
        data_spec.get("vocab_size"),
        data_spec.get("corpus", EMBEDDED),
    )


def is_presets_own_data(wanted: dict[str, Any], data: Path | None) -> bool:
    """Whether ``data`` is the shipped corpus prepared the way the preset asks for."""
    return data is None or data.expanduser().resolve() == _shipped_dir(wanted).resolve()


def default_data_for(data_spec: dict[str, Any]) -> Path | None:
    """The folder of a shipped corpus prepared the way a preset needs (``{corpus, tokenizer,
    vocab_size}``); None for the embedded corpus as chars (load_dataset's default). Nothing is
    written here: loading the folder prepares it on first use (load_dataset)."""
    if set(data_spec) - {"corpus", "tokenizer", "vocab_size"}:
        raise AttnlabError(f"data table {data_spec}: expected only corpus, tokenizer, vocab_size")
    folder = _shipped_dir(data_spec)
    return None if folder == default_data_dir() else folder
