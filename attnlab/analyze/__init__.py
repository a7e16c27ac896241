"""`attnlab analyze <name>`: one module per analysis, each with ``register(subparsers)``.

The argument helpers live here, light to import: every analysis registers its parser when the
CLI starts, and torch is only loaded once an analysis runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def add_common_args(parser: Any, sequences: int = 50) -> None:
    """RUN, --data, --sequences, --out, --device: the arguments every analysis takes."""
    parser.add_argument("run", metavar="RUN", help="a run folder or model folder")
    parser.add_argument("--data", help="prepared data folder (default: the run's own data)")
    parser.add_argument(
        "--sequences",
        type=int,
        default=sequences,
        help=f"validation windows to average over (default {sequences})",
    )
    parser.add_argument("--out", help="output folder (default: RUN/analysis)")
    parser.add_argument("--device", default="cpu")


def out_dir(args: Any) -> Path:
    return Path(args.out) if args.out else Path(args.run) / "analysis"
