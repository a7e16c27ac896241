"""`attnlab sample`: print text sampled from a run or a model folder."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("sample", help="generate text from a run or model folder")
    p.add_argument("model", metavar="RUN_OR_FOLDER")
    p.add_argument("--prompt", default="\n", help="text to continue (default: a newline)")
    p.add_argument("--max-new-tokens", type=int, default=500)
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--num-samples", type=int, default=1)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--device", default="auto")
    p.add_argument("--no-cache", action="store_true", help="recompute the full context every step")
    p.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the model first: ~15 s up front, then about 2x faster decoding",
    )
    p.add_argument(
        "--backend",
        choices=("torch", "onnxruntime"),
        default="torch",
        help="onnxruntime: run an exported folder's model.onnx on the CPU (no KV cache)",
    )
    p.add_argument("--int8", action="store_true", help="with onnxruntime: the int8 model-int8.onnx")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import torch

    from attnlab import from_pretrained
    from attnlab.device import resolve_device
    from attnlab.errors import AttnlabError

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
        model, tokenizer = load_onnx(args.model, int8=args.int8)
    else:
        if args.int8:
            raise AttnlabError(
                "--int8 runs the exported model-int8.onnx: add --backend onnxruntime"
            )
        device = resolve_device(args.device)
        model, tokenizer = from_pretrained(args.model, device=device)
        if args.compile:
            from attnlab.model.generation import compile_for_decoding

            model = compile_for_decoding(model)
    if tokenizer is None:
        raise AttnlabError(f"{args.model} has no tokenizer.json; cannot encode a prompt")
    ids = tokenizer.encode(args.prompt)
    if not ids:
        raise AttnlabError("the prompt encodes to no tokens")
    gen = torch.Generator(device=device).manual_seed(args.seed)
    idx = torch.tensor([ids], dtype=torch.long, device=device)
    for i in range(args.num_samples):
        out = model.generate(
            idx,
            args.max_new_tokens,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            use_cache=not args.no_cache,
            generator=gen,
        )
        if i:
            print("-" * 40)
        print(tokenizer.decode(out[0].tolist()))
    return 0
