"""`attnlab sample`: print text sampled from a run or a model folder."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from attnlab.commands._common import path_arg
from attnlab.errors import AttnlabError

if TYPE_CHECKING:
    from attnlab.data.tokenizer import Tokenizer


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "sample",
        help="generate text from a run or model folder",
        description="Print the prompt and its continuation, token by token as they are generated.",
    )
    p.add_argument("model", type=path_arg, metavar="RUN_OR_FOLDER")
    prompt = p.add_mutually_exclusive_group()
    prompt.add_argument(
        "--prompt",
        help="text to continue (default: a newline; for a bpe run, which has no token for one, "
        "the first token of its validation data)",
    )
    prompt.add_argument(
        "--prompt-file", type=path_arg, metavar="FILE", help="continue the text of FILE (UTF-8)"
    )
    p.add_argument("--max-new-tokens", type=int, default=500, help="tokens to generate per sample")
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    p.add_argument(
        "--top-k", type=int, help="sample from the k most likely tokens only (default: all)"
    )
    p.add_argument(
        "--top-p",
        type=float,
        help="sample from the fewest tokens whose probability reaches p (default: all)",
    )
    p.add_argument("--num-samples", type=int, default=1, help="independent continuations")
    p.add_argument(
        "--ignore-eos",
        action="store_true",
        help="go on past the token that ends a text (<|im_end|> after sft, an imported GPT-2's "
        "<|endoftext|>) and print it; by default a sample stops there, as transformers' "
        "generate does with the exported folder",
    )
    p.add_argument("--seed", type=int, default=1337, help="seed of the sampling")
    p.add_argument("--device", default="auto", help="auto (cuda, mps, cpu) or a torch device")
    p.add_argument("--no-cache", action="store_true", help="recompute the full context every step")
    p.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the decoding step first: slower start, faster tokens (see README)",
    )
    p.add_argument(
        "--backend",
        choices=("torch", "onnxruntime"),
        default="torch",
        help="onnxruntime: run an exported folder's model.onnx on the CPU (KV-cached)",
    )
    p.add_argument("--int8", action="store_true", help="with onnxruntime: the int8 model-int8.onnx")
    p.add_argument(
        "--threads",
        type=int,
        help="CPU threads per op, for PyTorch or onnxruntime (default: each one's own choice; "
        "one thread often decodes a small model faster, see README)",
    )
    p.set_defaults(func=run)


def read_prompt(args: argparse.Namespace) -> str | None:
    """--prompt, or the text of --prompt-file (None: neither given)."""
    if args.prompt_file is None:
        return args.prompt
    try:  # utf-8-sig: the byte-order mark Windows editors write is not part of the prompt
        return Path(args.prompt_file).expanduser().read_text(encoding="utf-8-sig")
    except OSError as e:
        raise AttnlabError(f"--prompt-file {args.prompt_file}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise AttnlabError(f"--prompt-file {args.prompt_file}: {e}") from None


def prompt_ids(args: argparse.Namespace, tokenizer: Tokenizer) -> list[int]:
    """The prompt's token ids; without one, where demo starts (a newline, or for bpe the first
    token of the run's validation data)."""
    from attnlab.data.prepare import start_tokens
    from attnlab.rundir import run_data_dir

    prompt = read_prompt(args)
    if prompt is not None:
        ids = tokenizer.encode(prompt)
        if not ids:
            raise AttnlabError("the prompt encodes to no tokens")
        return ids
    try:
        ids = start_tokens(tokenizer, run_data_dir(args.model))
    except AttnlabError as e:  # the data moved or was deleted since training: a prompt needs none
        raise AttnlabError(
            f"{e}; give --prompt TEXT to sample without {args.model}'s data "
            "(only the default prompt reads it)"
        ) from None
    if not ids:  # a model folder keeps no data to start from
        raise AttnlabError(
            f"the tokenizer of {args.model} has no token for a newline, the default prompt, "
            "and no run data to start from; give --prompt"
        )
    return ids


def run(args: argparse.Namespace) -> int:
    import torch

    from attnlab import from_pretrained
    from attnlab.commands._common import (
        apply_threads,
        check_sampling_args,
        compile_announced,
        echo_tokens,
        quiet_broken_pipe,
    )
    from attnlab.device import resolve_device
    from attnlab.export.hf import added_token_ids
    from attnlab.model.generation import stream
    from attnlab.train.checkpoint import model_folder

    check_sampling_args(args)
    apply_threads(args.threads)
    if args.backend == "onnxruntime":
        from attnlab.export import load_onnx

        unsupported = [
            flag
            for flag, used in (
                ("--compile", args.compile),
                (f"--device {args.device}", args.device not in ("auto", "cpu")),
            )
            if used
        ]
        if unsupported:
            raise AttnlabError(
                f"{', '.join(unsupported)}: not available with --backend onnxruntime"
            )
        device = torch.device("cpu")
        model, tokenizer = load_onnx(args.model, int8=args.int8, threads=args.threads)
    else:
        if args.int8:
            raise AttnlabError(
                "--int8 runs the exported model-int8.onnx: add --backend onnxruntime"
            )
        device = resolve_device(args.device)
        model, tokenizer = from_pretrained(args.model, device=device)
    if tokenizer is None:
        raise AttnlabError(f"{args.model} has no tokenizer.json; cannot encode a prompt")
    ids = prompt_ids(args, tokenizer)
    context = model.config.block_size
    if len(ids) > context:  # the model sees only the last block anyway: echo what it continues
        print(
            f"note: the prompt is {len(ids):,} tokens, more than the model's context of "
            f"{context:,}; it continues the last {context:,}, shown below",
            file=sys.stderr,
        )
        ids = ids[-context:]
    if args.compile:
        model = compile_announced(model)
    gen = torch.Generator(device=device).manual_seed(args.seed)
    eos = None if args.ignore_eos else tokenizer.eos_id
    suppress = added_token_ids(model_folder(args.model))
    idx = torch.tensor([ids], dtype=torch.long, device=device)
    with quiet_broken_pipe():
        for i in range(args.num_samples):
            if i:
                print("-" * 40)
            print(tokenizer.decode(ids), end="", flush=True)
            tokens = stream(
                model,
                idx,
                args.max_new_tokens,
                temperature=args.temperature,
                top_k=args.top_k,
                top_p=args.top_p,
                eos_token_id=eos,
                use_cache=not args.no_cache,
                generator=gen,
                suppress_tokens=suppress,
                vocab_limit=tokenizer.vocab_size,
            )
            echo_tokens(tokenizer, ids, (int(t) for t in tokens), stop={eos} - {None})
            print()
    return 0
