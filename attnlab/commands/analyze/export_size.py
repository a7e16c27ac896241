"""`attnlab analyze export-size PRESET --out DIR`: a model's export sizes, format by format."""

from __future__ import annotations

import argparse

from attnlab.commands._common import path_arg
from attnlab.commands.analyze import checked_out
from attnlab.errors import AttnlabError


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "export-size",
        help="bytes of a preset's safetensors, ONNX and int8 ONNX export (fresh weights)",
    )
    p.add_argument("target", metavar="PRESET", help="a preset (attnlab presets)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="model fields to change first")
    p.add_argument("--out", type=path_arg, required=True, help="folder for the CSV")
    p.add_argument("--seed", type=int, default=0, help="torch seed of the fresh weights")
    p.set_defaults(func=run, overrides_in="overrides")


def run(args: argparse.Namespace) -> int:
    from attnlab.analysis import export_size
    from attnlab.commands.info import preset_config
    from attnlab.config import check_seed, split_overrides

    check_seed("--seed", args.seed)
    model_over, train_over = split_overrides(args.overrides)
    if train_over:
        raise AttnlabError(f"export-size takes model fields only, not {', '.join(train_over)}")
    config = preset_config(args.target, model_over)  # a preset only: its name names the CSV
    out = checked_out(args.out, export_size.files(args.target))
    rows = export_size.measure(config, args.target, out, args.seed)
    print(f"{args.target}: {rows[0]['parameters']:,} parameters, fresh weights (seed {args.seed})")
    for r in rows:
        print(
            f"  {r['format']:12s} {r['MB']:8.2f} MB ({r['MiB']:.2f} MiB, {r['bytes_per_parameter']:.2f} bytes/param)  {r['files']}"
        )
    print(f"wrote {out / export_size.files(args.target)[0]}")
    return 0
