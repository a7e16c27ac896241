"""`attnlab export`: a run or model folder as an HF-style folder in up to five formats."""

from __future__ import annotations

import argparse

from attnlab.commands._common import path_arg


def register(subparsers: argparse._SubParsersAction) -> None:
    # the format names are spelled out (not imported from attnlab.export) to keep torch out of --help
    p = subparsers.add_parser(
        "export", help="write safetensors / bin / TorchScript / ONNX / int8 ONNX"
    )
    p.add_argument("model", type=path_arg, metavar="RUN_OR_FOLDER")
    p.add_argument(
        "--formats",
        default="all",
        help="all, or a comma list of safetensors, bin, torchscript, onnx, onnx-int8 "
        "(onnx-int8 also writes onnx), gguf, gguf-f16, gguf-q8_0 (llama.cpp's file, for "
        "GPT-2 and Llama backbones; not in all)",
    )
    p.add_argument(
        "--out",
        type=path_arg,
        required=True,
        metavar="DIR",
        help="folder to write (created if missing; an earlier export there is replaced whole)",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a non-empty --out that is not an attnlab export",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from attnlab.export import export, parse_formats

    formats = parse_formats(args.formats)
    written = export(
        args.model,
        args.out,
        formats,
        log=lambda line: print(f"export: {line}", flush=True),
        overwrite=args.overwrite,
    )
    print(f"wrote {len(written)} format(s) to {args.out}")
    return 0
