"""`attnlab analyze <name> ...`: analyses of trained runs, one sub-command module each here.

The analyses themselves live in attnlab.analysis; each module here registers its parser when
the CLI starts and imports its analysis (and torch) only once it runs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from attnlab.commands._common import path_arg, register_all
from attnlab.errors import AttnlabError
from attnlab.fsutil import check_out_path, check_writable


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("analyze", help="analyses of trained runs")
    register_all(
        parser.add_subparsers(dest="analysis", required=True, metavar="ANALYSIS"),
        sys.modules[__name__],
    )


def add_common_args(parser: Any, sequences: int = 50) -> None:
    """RUN, --data, --sequences, --out, --device: the arguments every attention analysis takes."""
    parser.add_argument("run", type=path_arg, metavar="RUN", help="a run folder or model folder")
    parser.add_argument(
        "--data", type=path_arg, help="prepared data folder (default: the run's own data)"
    )
    parser.add_argument(
        "--sequences",
        type=int,
        default=sequences,
        help=f"validation windows to average over (default {sequences})",
    )
    parser.add_argument(
        "--out",
        type=path_arg,
        help="output folder (default: RUN/analysis; needed when RUN is a model folder)",
    )
    parser.add_argument("--device", default="cpu")


def out_dir(args: Any, files: Sequence[str]) -> Path:
    """--out, checked to be a folder or nothing yet (else RUN/analysis), where the analysis may
    write ``files`` (none of them one it did not write): call it before the analysis runs, so
    that what is in the way is refused at once."""
    from attnlab.analysis.inputs import check_not_file, default_analysis_dir  # torch

    check_not_file(args.run)  # before its --out: "cannot write FILE/analysis" misled
    return (
        checked_out(args.out, files)
        if args.out
        else default_out(default_analysis_dir(args.run), files)
    )


def checked_out(out: str, files: Sequence[str]) -> Path:
    """A given --out, checked to be an analysis folder or empty or nothing yet, where the
    analysis may write ``files``."""
    from attnlab.analysis.inputs import is_analysis_folder  # torch

    path = Path(out)
    if check_out_path(path) and not is_analysis_folder(path):  # its gates.csv may be the user's
        raise AttnlabError(
            f"{path} is not empty and is not an attnlab analysis folder; choose another --out"
        )
    return default_out(path, files)


def default_out(out: Path, files: Sequence[str]) -> Path:
    """``out``, where the analysis may write ``files`` (none of them one it did not write)."""
    from attnlab.analysis.inputs import check_analysis_out  # torch

    check_analysis_out(out, files)
    check_writable(out)
    return out
