"""`attnlab info`: a model's config, parameter count by component, and FLOPs per token."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from attnlab.commands._common import path_arg
from attnlab.config import ModelConfig, split_overrides
from attnlab.errors import AttnlabError
from attnlab.presets import PRESETS, RENAMED, get_preset


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "info",
        help="config, parameters by component and FLOPs of a model",
        description="Describe a preset, run or model folder without loading weights.",
    )
    p.add_argument("target", type=path_arg, metavar="PRESET_OR_FOLDER")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="model fields to change first")
    p.set_defaults(func=run, overrides_in="overrides")


def folder_config(target: str) -> tuple[ModelConfig, str | None]:
    """The ModelConfig of a run or model folder, and None; for an export with graphs but no
    PyTorch weights (``export --formats onnx``), the one in its config.json and a line saying
    what the folder is and what runs it.

    info never reads weights, so such an export's config.json tells all that info shows.
    """
    from attnlab.export.folder import FILES, GRAPH_FORMATS
    from attnlab.train.checkpoint import CONFIG, model_folder, read_model_config

    try:
        folder = model_folder(target)
    except AttnlabError:
        folder = Path(target).expanduser()
        graphs = [n for f, n in FILES.items() if f in GRAPH_FORMATS and (folder / n).is_file()]
        if not (graphs and (folder / CONFIG).is_file()):  # no model at all: model_folder's message
            raise
    else:
        return read_model_config(folder), None
    note = f"an export of {' and '.join(graphs)} only, no PyTorch weights: shown from its {CONFIG}"
    if FILES["onnx"] in graphs:
        note += f"; `attnlab sample {shlex.quote(target)} --backend onnxruntime` runs it"
    return read_model_config(folder), note


def load_config(target: str, overrides: list[str]) -> tuple[ModelConfig, str | None]:
    """The ModelConfig of a folder (see folder_config, and its note), else of a preset (None),
    with model overrides."""
    model_over, train_over = split_overrides(overrides)
    if train_over:
        raise AttnlabError(f"info takes model fields only, not {', '.join(train_over)}")
    if Path(target).expanduser().exists() or "/" in target:  # a path, even a mistyped one
        if "/" not in target and (target in PRESETS or target in RENAMED):
            print(
                f"attnlab info: {target} is a folder here and a preset; showing the folder (for "
                "the preset, run info where no folder has its name)",
                file=sys.stderr,
            )
        config, note = folder_config(target)
        return config.replace(**model_over), note
    return preset_config(target, model_over), None


def preset_config(name: str, model_over: dict) -> ModelConfig:
    """The ModelConfig of preset ``name`` with model overrides, a char preset's vocabulary
    being that of the data it trains on by default (what `train --preset` builds)."""
    if "vocab_size" not in get_preset(name).model and "vocab_size" not in model_over:
        from attnlab.data.prepare import shipped_char_vocab_size

        model_over["vocab_size"] = shipped_char_vocab_size(
            get_preset(name).data.get("corpus", "shakespeare")
        )
    return ModelConfig.preset(name, **model_over)


def run(args: argparse.Namespace) -> int:
    from attnlab.model.memory import check_fits
    from attnlab.model.summary import COMPONENTS, parameter_counts, shapes_only

    config, note = load_config(args.target, args.overrides)
    check_fits(config, "cpu", what=args.target)  # shapes_only allocates the weights on the CPU
    model = shapes_only(config)
    counts = parameter_counts(model)
    print(args.target)
    if note:
        print(f"  {note}")
    print("\nconfig")
    for key, value in config.to_dict().items():
        print(f"  {key:<18} {value}")
    print("\nparameters")
    parent_of = {"attn": "attention", "block": "mechanisms"}
    for component in (*COMPONENTS, "total"):
        print(f"  {component:<24} {counts[component]:>14,}")
        for key, n in counts.items():
            if parent_of.get(key.split(".")[0]) == component:
                print(f"    of which {key:<13} {n:>14,}")
    tied = "tied to lm_head" if config.tie_embeddings else "lm_head separate"
    print(f"  (embeddings: {config.vocab_size:,} x {config.n_embd}, {tied})")
    print(
        f"\nFLOPs per token (training, 6N + attention at T={config.block_size}): "
        f"{model.flops_per_token():,.0f}"
    )
    return 0
