"""`attnlab bench export`: cached decoding tokens/s of PyTorch eager and compiled, onnxruntime."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from attnlab.commands._common import path_arg
from attnlab.commands.bench import add_threads_arg
from attnlab.errors import AttnlabError


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
        type=path_arg,
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
    add_threads_arg(p, also=", for PyTorch and onnxruntime alike")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from attnlab.bench import export
    from attnlab.bench.timing import format_table

    asked_len = 1 if args.prompt_len is None else args.prompt_len  # 0 silently meant default
    if min(args.tokens, args.prompts, args.reps, asked_len) < 1:
        raise AttnlabError("--tokens, --prompts, --prompt-len and --reps must be at least 1")
    model = export.bench_model(args.model, args.preset)
    cfg = model.config
    prompt_len = args.prompt_len or max(1, cfg.block_size // 4)
    if prompt_len > cfg.block_size:
        raise AttnlabError(
            f"--prompt-len {prompt_len} is longer than the model's block_size {cfg.block_size}"
        )
    with tempfile.TemporaryDirectory(prefix="attnlab-bench-export-") as scratch:
        folder = export.onnx_folder(model, args.model, Path(scratch))
        rows = export.measure(
            model, folder, args.tokens, args.prompts, prompt_len, args.reps, not args.no_compile
        )
    source = args.model or f"preset {args.preset} (random weights)"
    print(
        f"{source}: {cfg.n_layer} layers, n_embd {cfg.n_embd}, {model.get_num_params() / 1e6:.2f}M parameters; "
        f"{args.prompts} prompts x {prompt_len} tokens, {args.tokens} new tokens each, greedy, KV cache, "
        f"{torch.get_num_threads()} threads, {args.reps} reps"
    )
    print(
        format_table(["backend", "file MB", "tokens/s", "vs eager", "vs fp32", "same tokens"], rows)
    )
    return 0
