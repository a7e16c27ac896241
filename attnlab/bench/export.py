"""`attnlab bench export`: cached decoding tokens/s of PyTorch eager and compiled, onnxruntime fp32 and int8.

All four decode the same random prompts greedily as one batch with their KV cache (the ONNX
graph carries it as past_key_values / present). Backends alternate within each repetition
(attnlab.bench._timing.interleaved) and onnxruntime gets as many threads as PyTorch. The
compiled model is a compiled copy (``--no-compile`` leaves it out: compiling takes a while).
"same tokens" is the share of generated tokens equal to eager PyTorch's: 100 % shows the graphs
agree; int8 may drift once a rare near-tie flips.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def bench_model(args: argparse.Namespace, scratch: Path) -> tuple[Any, Path]:
    """(PyTorch model, folder holding model.onnx and model-int8.onnx for the same weights)."""
    import torch

    from attnlab import from_pretrained
    from attnlab.export import FILES, export_model

    if args.model:
        model, _ = from_pretrained(args.model, device="cpu")
        folder = Path(args.model)
        if all((folder / FILES[f]).is_file() for f in ("onnx", "onnx-int8")):
            return model, folder
    else:
        from attnlab.bench.train import bench_config
        from attnlab.model import GPT

        torch.manual_seed(0)
        model = GPT(bench_config(args.preset)[0])
    print(f"bench export: exporting ONNX fp32 and int8 to {scratch}", file=sys.stderr)
    export_model(model, None, scratch, ["onnx-int8"])
    return model, scratch


def measure(
    model: Any,
    folder: Path,
    tokens: int,
    prompts: int,
    prompt_len: int,
    reps: int,
    compile: bool = True,
) -> list[list[str]]:
    """Table rows: backend, file MB, tokens/s, throughput vs eager, share of eager's tokens."""
    import copy

    import torch

    from attnlab.bench._timing import interleaved
    from attnlab.export import FILES, OnnxLM
    from attnlab.model.generation import compile_for_decoding

    cfg = model.config
    prompt = torch.randint(
        0, cfg.vocab_size, (prompts, prompt_len), generator=torch.Generator().manual_seed(0)
    )
    threads = torch.get_num_threads()
    weights = folder / FILES["safetensors"]
    backends = {"pytorch eager": (model.eval(), weights)}
    if compile:
        print("bench export: compiling a copy of the model for decoding", file=sys.stderr)
        backends["pytorch compiled"] = (compile_for_decoding(copy.deepcopy(model)), weights)
    for name, fmt in (("onnxruntime fp32", "onnx"), ("onnxruntime int8", "onnx-int8")):
        backends[name] = (OnnxLM(folder / FILES[fmt], cfg, threads), folder / FILES[fmt])
    outputs: dict[str, torch.Tensor] = {}

    def decode(name: str) -> None:
        outputs[name] = backends[name][0].generate(prompt, tokens, temperature=0.0)

    timings = interleaved(
        {name: (lambda name=name: decode(name)) for name in backends}, "pytorch eager", reps
    )
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    rows = []
    for name, (_, file) in backends.items():
        size = file.stat().st_size if file.is_file() else weight_bytes
        same = (
            (outputs[name][:, prompt_len:] == outputs["pytorch eager"][:, prompt_len:])
            .float()
            .mean()
        )
        rows.append(
            [
                name,
                f"{size / 1e6:.2f}",
                f"{prompts * tokens / timings[name].median_s:,.0f}",
                f"{1 / timings[name].ratio:.2f}x",
                f"{100 * float(same):.0f}%",
            ]
        )
    return rows


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "export", help="cached tokens/s of PyTorch eager, compiled, onnxruntime fp32 and int8"
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--preset", default="shakespeare-char", help="a randomly initialised model of this preset"
    )
    src.add_argument(
        "--model",
        metavar="DIR",
        help="an exported folder (its ONNX files are used) or a run/model folder (exported first)",
    )
    p.add_argument("--tokens", type=int, default=64, help="new tokens per prompt")
    p.add_argument("--prompts", type=int, default=4, help="prompts, decoded together as one batch")
    p.add_argument(
        "--prompt-len", type=int, default=None, help="tokens per prompt (default: block_size / 4)"
    )
    p.add_argument("--reps", type=int, default=3, help="interleaved repetitions")
    p.add_argument(
        "--no-compile", action="store_true", help="leave out the torch.compile'd PyTorch row"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import tempfile

    import torch

    from attnlab.bench._timing import format_table
    from attnlab.errors import AttnlabError

    if min(args.tokens, args.prompts, args.reps) < 1:
        raise AttnlabError("--tokens, --prompts and --reps must be at least 1")
    with tempfile.TemporaryDirectory(prefix="attnlab-bench-export-") as scratch:
        model, folder = bench_model(args, Path(scratch))
        cfg = model.config
        prompt_len = min(args.prompt_len or max(1, cfg.block_size // 4), cfg.block_size)
        rows = measure(
            model, folder, args.tokens, args.prompts, prompt_len, args.reps, not args.no_compile
        )
    source = args.model or f"preset {args.preset} (random weights)"
    print(
        f"{source}: {cfg.n_layer} layers, n_embd {cfg.n_embd}, {model.get_num_params() / 1e6:.2f}M parameters; "
        f"{args.prompts} prompts x {prompt_len} tokens, {args.tokens} new tokens each, greedy, KV cache, "
        f"{torch.get_num_threads()} threads, {args.reps} reps"
    )
    print(format_table(["backend", "file MB", "tokens/s", "vs eager", "same tokens"], rows))
    return 0
