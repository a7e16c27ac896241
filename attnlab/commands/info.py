"""`attnlab info`: a model's config, parameter count by component, and FLOPs per token."""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from pathlib import Path
from typing import Any

from attnlab.commands._common import path_arg
from attnlab.config import ModelConfig, split_overrides
from attnlab.errors import AttnlabError
from attnlab.presets import PRESETS, RENAMED, get_preset

COMPONENTS = ("embeddings", "attention", "ffn", "norms", "mechanisms")
# export formats that hold a traced graph, not weights PyTorch loads into a GPT
GRAPH_FORMATS = ("torchscript", "onnx", "onnx-int8")
_BLOCK_PARAM = re.compile(r"^transformer\.h\.\d+\.(?:(attn)\.)?([^.]+)\.")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "info",
        help="config, parameters by component and FLOPs of a model",
        description="Describe a preset, run or model folder without loading weights.",
    )
    p.add_argument("target", type=path_arg, metavar="PRESET_OR_FOLDER")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="model fields to change first")
    p.set_defaults(func=run, overrides_in="overrides")


def parameter_counts(model: Any) -> dict[str, int]:
    """Parameters per component (shared tensors once), mechanism parts by name, and the total.

    attention = c_attn + c_proj + the mechanism parts that live in the attention (e.g. the value
    gate ``attn.W_E``, also listed alone); mechanisms = parts that live in the block.
    """
    from attnlab.model.mechanisms import parts_for

    attn_parts = {p.name for p in parts_for(model.config, "attn")}
    block_parts = {p.name for p in parts_for(model.config, "block")}
    counts = dict.fromkeys(COMPONENTS, 0)
    for name, p in model.named_parameters():
        match = _BLOCK_PARAM.match(name)
        inner = match.group(2) if match else ""
        if match and match.group(1):
            counts["attention"] += p.numel()
            if inner in attn_parts:
                counts[f"attn.{inner}"] = counts.get(f"attn.{inner}", 0) + p.numel()
        elif inner in block_parts:
            counts["mechanisms"] += p.numel()
            counts[f"block.{inner}"] = counts.get(f"block.{inner}", 0) + p.numel()
        elif inner.startswith("mlp"):
            counts["ffn"] += p.numel()
        elif inner.startswith("ln_") or name.startswith("transformer.ln_f."):
            counts["norms"] += p.numel()
        elif name.startswith(("transformer.wte.", "transformer.wpe.", "lm_head.")):
            counts["embeddings"] += p.numel()
        else:
            raise ValueError(f"parameter {name} belongs to no known component")
    counts["total"] = sum(counts[c] for c in COMPONENTS)
    return counts


def folder_config(target: str) -> tuple[ModelConfig, str | None]:
    """The ModelConfig of a run or model folder, and None; for an export with graphs but no
    PyTorch weights (``export --formats onnx``), the one in its config.json and a line saying
    what the folder is and what runs it.

    info never reads weights, so such an export's config.json tells all that info shows.
    """
    from attnlab.export.folder import FILES
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
    if "vocab_size" not in get_preset(target).model and "vocab_size" not in model_over:
        from attnlab.data.prepare import shipped_char_vocab_size

        # what `train --preset` builds: the vocabulary of the data it trains on by default
        model_over["vocab_size"] = shipped_char_vocab_size(
            get_preset(target).data.get("corpus", "shakespeare")
        )
    return ModelConfig.preset(target, **model_over), None


def shapes_only(config: Any) -> Any:
    """The GPT of ``config`` with its initialisation skipped: right shapes, values never written.

    Not the meta device: meta kernels of normal_, arange and friends import torch._dynamo, which
    costs seconds. Uninitialised CPU storage is as cheap (the pages are never touched).
    """
    import torch
    from torch.overrides import TorchFunctionMode

    from attnlab.model import GPT

    class SkipInit(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
            kwargs = kwargs or {}
            if getattr(func, "__module__", None) == "torch.nn.init" or func in (
                torch.Tensor.normal_,
                torch.Tensor.uniform_,
            ):
                return args[0] if args else kwargs["tensor"]
            return func(*args, **kwargs)

    with SkipInit():
        return GPT(config)


def run(args: argparse.Namespace) -> int:
    from attnlab.model.memory import check_fits

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
