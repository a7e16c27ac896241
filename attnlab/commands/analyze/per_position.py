"""`attnlab analyze per-position RUN_A RUN_B`: where on the validation text does B beat A?

Both runs score every validation token in the same sequential windows (the smaller of the two
block sizes). The positions where B's loss is lowest relative to A's are listed with their
context (``\\n\\nCUR -> T``), and B - A is grouped by column in the line and by distance from
the start of the latest speaker header (the seed's finding: K/V-bias wins mid-name).
"""

from __future__ import annotations

import argparse
import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "per-position", help="per-position validation loss of two runs, B vs A"
    )
    p.add_argument("run_a", metavar="RUN_A")
    p.add_argument("run_b", metavar="RUN_B")
    p.add_argument("--top", type=int, default=20, help="positions to list (default 20)")
    p.add_argument("--data", help="prepared data folder (default: the runs' own data)")
    p.add_argument(
        "--out",
        default="per_position.csv",
        help="CSV of the top positions; the grouped tables go next to it",
    )
    p.add_argument(
        "--max-tokens", type=int, default=None, help="score only the first N validation tokens"
    )
    p.add_argument(
        "--context", type=int, default=12, help="characters of context shown (default 12)"
    )
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--device", default="auto")
    p.set_defaults(func=run)


@dataclass
class Comparison:
    """Per-target losses of two models on one token stream (target i is token i + 1)."""

    loss_a: np.ndarray
    loss_b: np.ndarray
    pieces: list[str]  # text of every token, targets included
    block_size: int

    @property
    def text(self) -> str:
        return "".join(self.pieces)


def escape(text: str) -> str:
    """One-line form of a text snippet: backslash, newline and tab spelled out."""
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t")


def shared_data_dir(run_a: str, run_b: str, data: str | None) -> str | None:
    """``data`` if given, else the data folder both runs were trained on."""
    from attnlab.commands.eval import run_data_dir
    from attnlab.errors import AttnlabError

    if data:
        return data
    dir_a, dir_b = run_data_dir(run_a), run_data_dir(run_b)
    if dir_a and dir_b and Path(dir_a).resolve() != Path(dir_b).resolve():
        raise AttnlabError(
            f"the runs were trained on different data ({dir_a} vs {dir_b}); pass --data"
        )
    return dir_a or dir_b


def compare(
    run_a: str | Path,
    run_b: str | Path,
    data: str | Path | None = None,
    max_tokens: int | None = None,
    batch_size: int = 16,
    device: str = "cpu",
) -> Comparison:
    """Score the validation split of ``data`` (default: the runs' data) with both runs."""
    from attnlab import from_pretrained
    from attnlab.data.prepare import load_dataset
    from attnlab.errors import AttnlabError
    from attnlab.eval.per_position import per_position_losses, token_pieces

    if max_tokens is not None and max_tokens < 1:
        raise AttnlabError(f"--max-tokens must be >= 1, got {max_tokens}")
    dataset = load_dataset(shared_data_dir(str(run_a), str(run_b), data))
    tokens = dataset.val if max_tokens is None else dataset.val[: max_tokens + 1]
    models = []
    for run in (run_a, run_b):
        model, tokenizer = from_pretrained(run, device=device)
        if tokenizer is not None and tokenizer.hf.get_vocab() != dataset.tokenizer.hf.get_vocab():
            raise AttnlabError(f"{run} uses another tokenizer than the data folder {dataset.dir}")
        models.append(model)
    block = min(m.config.block_size for m in models)
    loss_a, loss_b = (per_position_losses(m, tokens, block, batch_size) for m in models)
    return Comparison(loss_a, loss_b, token_pieces(dataset.tokenizer, tokens), block)


def top_positions(cmp: Comparison, n: int = 20, context: int = 12) -> list[dict[str, Any]]:
    """The ``n`` targets where B's loss is lowest relative to A's, with their context."""
    gain = cmp.loss_a - cmp.loss_b
    rows = []
    for rank, i in enumerate(np.argsort(-gain, kind="stable")[:n], start=1):
        before = "".join(cmp.pieces[max(0, i + 1 - context) : i + 1])[-context:]
        rows.append(
            {
                "rank": rank,
                "position": int(i) + 1,
                "context": escape(before),
                "target": escape(cmp.pieces[i + 1]),
                "loss_a": float(cmp.loss_a[i]),
                "loss_b": float(cmp.loss_b[i]),
                "a_minus_b": float(gain[i]),
            }
        )
    return rows


def groupings(cmp: Comparison) -> dict[str, list[dict[str, Any]]]:
    """B - A inside speaker headers vs speech, by column in the line, and by distance from the
    first character of the latest speaker header line."""
    from attnlab.eval.names import detect_style
    from attnlab.eval.per_position import (
        MAX_COLUMN,
        MAX_HEADER_DISTANCE,
        char_offsets,
        difference_row,
        grouped_difference,
        header_distances,
        line_columns,
    )

    text = cmp.text
    offsets = char_offsets(cmp.pieces)[1:]  # targets only
    distance, in_header = header_distances(text, offsets, detect_style(text))
    regions = [
        ("header", in_header),
        ("speech", (distance >= 0) & ~in_header),
        ("before any header", distance < 0),
    ]
    return {
        "by_region": [
            difference_row(name, mask, cmp.loss_a, cmp.loss_b)
            for name, mask in regions
            if mask.any()
        ],
        "by_column": grouped_difference(
            line_columns(text, offsets), cmp.loss_a, cmp.loss_b, MAX_COLUMN
        ),
        "by_header_distance": grouped_difference(
            distance, cmp.loss_a, cmp.loss_b, MAX_HEADER_DISTANCE
        ),
    }


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else [])
        writer.writeheader()
        writer.writerows(rows)


def _print_table(rows: list[dict[str, Any]], columns: list[str]) -> None:
    """Numbers right-aligned, text left-aligned."""
    cells = [
        [f"{r[c]:.4f}" if isinstance(r[c], float) else str(r[c]) for c in columns] for r in rows
    ]
    widths = [max([len(c)] + [len(row[j]) for row in cells]) for j, c in enumerate(columns)]
    text = [bool(rows) and isinstance(rows[0][c], str) for c in columns]
    for line in [columns, *cells]:
        print(
            "  ".join(
                v.ljust(w) if t else v.rjust(w) for v, w, t in zip(line, widths, text, strict=True)
            )
        )


def run(args: argparse.Namespace) -> int:
    from attnlab.device import resolve_device

    cmp = compare(
        args.run_a,
        args.run_b,
        args.data,
        args.max_tokens,
        args.batch_size,
        str(resolve_device(args.device)),
    )
    a, b = float(cmp.loss_a.mean()), float(cmp.loss_b.mean())
    print(
        f"A {args.run_a}: loss {a:.4f} | B {args.run_b}: loss {b:.4f} | B - A {b - a:+.4f} "
        f"over {len(cmp.loss_a)} validation tokens (block {cmp.block_size})"
    )
    print(f"\ntop {args.top} positions where B beats A (context -> target):")
    top = top_positions(cmp, args.top, args.context)
    for row in top:
        row["shown"] = f"{row['context']} -> {row['target']}"
    _print_table(top, ["rank", "position", "shown", "loss_a", "loss_b", "a_minus_b"])
    out = Path(args.out)
    write_csv(out, [{k: v for k, v in r.items() if k != "shown"} for r in top])
    written = [out]
    for name, rows in groupings(cmp).items():
        print(f"\nB - A {name.replace('_', ' ')}:")
        _print_table(rows, ["group", "count", "loss_a", "loss_b", "b_minus_a"])
        written.append(out.with_name(f"{out.stem}_{name}.csv"))
        write_csv(written[-1], rows)
    print(f"\nwrote {', '.join(map(str, written))}")
    return 0
