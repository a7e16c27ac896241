"""`attnlab presets`: the named presets with their recipes, or (--fields) every config field."""

from __future__ import annotations

import argparse
import dataclasses
import json
from types import ModuleType
from typing import Any

from attnlab.config import CHOICES, ModelConfig, TrainConfig
from attnlab.errors import AttnlabError
from attnlab.field_help import MODEL_HELP, TRAIN_HELP
from attnlab.presets import PRESETS, get_preset


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "presets",
        help="list the named presets and their training recipes (--fields: every config field)",
        description="Each preset: its architecture, the training recipe of its source and the "
        "data it expects. Fields a preset leaves out take the defaults of --fields.",
    )
    p.add_argument("name", nargs="?", help="show only this preset")
    p.add_argument(
        "--fields",
        action="store_true",
        help="list every model and training field with its type, default and meaning",
    )
    p.set_defaults(func=run)


# a field nobody described (the mechanism contract tests fail on it): listed, not a traceback
MISSING_HELP = (
    "(no help text: add it to its mechanism's SPEC help, or to field_help for the backbone)"
)


def spell(value: Any) -> str:
    """A value the way `key=value` takes it back (true, null, 0.001, rope)."""
    return value if isinstance(value, str) else json.dumps(value)


def field_table() -> list[str]:
    """Lines of `--fields`: name, type, default and meaning of every field, model then train."""
    from attnlab.model import mechanisms  # they declare their own fields' choices and help

    allowed = {**CHOICES, **mechanisms.choices()}
    lines = []
    for title, cls, helps in (
        ("model fields (ModelConfig)", ModelConfig, {**MODEL_HELP, **mechanisms.field_help()}),
        ("training fields (TrainConfig)", TrainConfig, TRAIN_HELP),
    ):
        lines.append(title)
        for f in dataclasses.fields(cls):
            # the declared default: an instance's would show what null becomes at the default
            # width (d_ffn 3072 for n_embd 768), not that it follows the model
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            kind = str(f.type).replace(" | None", " or null")
            choices = " | ".join(map(spell, allowed.get(f.name, ())))
            meaning = helps.get(f.name, MISSING_HELP) + (f" ({choices})" if choices else "")
            lines.append(f"  {f.name:<28} {kind:<16} {spell(default):<10} {meaning}")
        lines.append("")
        if cls is ModelConfig:
            lines += incompatibility_lines(mechanisms)
    lines.append("Set any of them as key=value (or --key=value) after `attnlab train`.")
    return lines


def incompatibility_lines(mechanisms: ModuleType) -> list[str]:
    """Lines of `--fields` naming the mechanisms that do not compose, and why (the SPECs'); a
    dash, not the field rows' indent, starts each."""
    lines = ["mechanisms that do not compose (a config turning both on is refused)"]
    for names, why in mechanisms.incompatibilities():
        labels = " + ".join(mechanisms.module(n).SPEC.label for n in names)
        lines.append(f"- {labels}: {why}")
    return [*lines, ""]


def preset_lines(name: str) -> list[str]:
    """A preset's description, then its model, train and data settings as key=value."""
    preset = get_preset(name)
    data = " ".join(f"{k}={spell(v)}" for k, v in preset.data.items())
    lines = [f"{name}: {preset.description}"]
    for part, values in (("model", preset.model), ("train", preset.train)):
        lines.append(f"  {part}: " + " ".join(f"{k}={spell(v)}" for k, v in values.items()))
    lines.append(f"  data:  {data or 'the embedded corpus, char-level'}")
    return lines


def run(args: argparse.Namespace) -> int:
    if args.fields and args.name is not None:  # --fields lists every field, whatever the name
        raise AttnlabError(
            f"--fields lists the fields of every preset; drop {args.name!r} (or drop --fields to "
            "show that preset)"
        )
    if args.fields:
        print("\n".join(field_table()))
        return 0
    # an empty name is a name that matches nothing (it listed every preset)
    for i, name in enumerate(PRESETS if args.name is None else [args.name]):
        print(("\n" if i else "") + "\n".join(preset_lines(name)))
    return 0
