"""`attnlab bench gpu`: the GPU acceptance run (every mechanism trains, compiles and decodes in the
device's default precision; SDPA kernels; tokens/s and MFU against nanoGPT), as a JSON + Markdown
report."""

from __future__ import annotations

import argparse
from pathlib import Path

from attnlab.commands._common import path_arg
from attnlab.errors import AttnlabError


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "gpu",
        help="GPU acceptance: every mechanism trains (eager, compiled) and decodes; SDPA kernels; MFU",
        description=__doc__.split(": ", 1)[1],
    )
    p.add_argument("--device", default="auto", help="cuda (the default where one is), or cpu")
    p.add_argument(
        "--out", type=path_arg, default="results/gpu", help="report folder (default results/gpu)"
    )
    p.add_argument(
        "--smoke",
        action="store_true",
        help="toy sizes on any device (CPU included): checks the script, measures nothing",
    )
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile runs")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from attnlab.bench import gpu
    from attnlab.device import resolve_device

    device = resolve_device(args.device)
    if device.type != "cuda" and not args.smoke:
        raise AttnlabError(
            f"bench gpu: no CUDA GPU here (device {device}); pass --smoke to check the script "
            "on this device"
        )
    out = Path(args.out)
    gpu.check_out(out)  # before the run: a refusal after it would waste the run
    report = gpu.run(device, args.smoke, compile=not args.no_compile)
    gpu.write(report, out)
    print(gpu.markdown(report), end="")
    print(f"report: {out / gpu.REPORT_JSON}, {out / gpu.REPORT_MD}")
    return 0 if report["passed"] else 1
