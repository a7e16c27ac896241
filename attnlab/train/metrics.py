"""A run's metrics: metrics.csv rows (and the trackers': TensorBoard, W&B, MLflow), kept
consistent across resumes."""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from attnlab.errors import AttnlabError
from attnlab.rundir import RunDir
from attnlab.train.trackers import TensorBoardTracker, Tracker

METRIC_COLUMNS = [
    "iter",
    "train_loss",
    "val_loss",
    "lr",
    "tokens_per_s",
    "step_ms",
    "elapsed_s",
    "grad_norm",
]


TB_EVENTS_PREFIX = "events.out.tfevents."  # the files TensorBoard's writer adds to tb/


def read_rows(path: Path) -> list[list[str]]:
    """metrics.csv's rows; a file that is not UTF-8 text, or whose header is not a metrics
    header (a damaged one: rows written under it would lose their values), is one error line."""
    try:
        with path.open(encoding="utf-8") as f:
            rows = list(csv.reader(f))
    except (UnicodeDecodeError, csv.Error) as e:
        problem = str(e)
    else:
        header = rows[0] if rows else METRIC_COLUMNS
        if header[:1] == ["iter"] and "val_loss" in header:
            return rows
        problem = f"its header is {','.join(header)[:60]!r}, not iter,...,val_loss,..."
    raise AttnlabError(f"{path} is not a metrics table ({problem}); repair or remove it to resume")


def val_losses(path: Path) -> dict[int, float]:
    """Iteration -> validation loss at each evaluation metrics.csv logged ({} without one)."""
    rows = read_rows(path) if path.is_file() else []
    if not rows or not {"iter", "val_loss"} <= set(rows[0]):
        return {}
    it, val = rows[0].index("iter"), rows[0].index("val_loss")
    return {int(row[it]): float(row[val]) for row in rows[1:] if len(row) > val and row[val]}


class MetricsLog:
    """metrics.csv (columns fixed by the first row, kept on resume) plus the trackers' rows."""

    def __init__(
        self,
        run: RunDir,
        tensorboard: bool,
        resumed_at: int = 0,
        trackers: Sequence[Tracker] = (),
    ) -> None:
        """``resumed_at``: the iteration of the checkpoint a run resumes from (0: none); what
        TensorBoard holds from after it is hidden, as ``truncate_after`` drops it from the CSV.
        ``trackers`` get every row too (W&B, MLflow), and are closed with the log."""
        self.path = run.metrics
        self.columns: list[str] | None = None
        self.pending: list[
            dict[str, Any]
        ] = []  # rows before the first training row fixes the columns
        if self.path.is_file():
            rows = read_rows(self.path)
            self.columns = rows[0] if rows else None
        tb = [TensorBoardTracker(run, resumed_at)] if tensorboard else []
        self.trackers = [*tb, *trackers]

    def truncate_after(self, it: int) -> None:
        """Drop rows logged after the checkpoint we resume from (they will be logged again)."""
        if not self.path.is_file():
            return
        rows = read_rows(self.path)
        if not rows:
            return
        kept = [rows[0]]
        for n, row in enumerate(rows[1:], start=2):
            if len(row) != len(rows[0]):  # cut short by a kill mid-append: logged again
                continue
            if not row or not row[0].isdigit():
                raise AttnlabError(
                    f"{self.path}: line {n} is not a metrics row (its iter is {row[0]!r}); "
                    "repair or remove that line to resume"
                )
            if int(row[0]) <= it:
                kept.append(row)
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        try:
            with tmp.open("w", newline="") as f:
                csv.writer(f).writerows(kept)
            tmp.replace(self.path)  # a kill mid-rewrite leaves the old file, not half of it
        finally:
            tmp.unlink(missing_ok=True)  # a no-op once renamed

    def write(self, row: dict[str, Any], final: bool = False) -> None:
        """Append ``row`` to metrics.csv (held back until the columns are known) and TensorBoard."""
        if self.columns is None and "train_loss" not in row and not final:
            self.pending.append(row)  # e.g. the eval at iter 0: mechanism columns aren't known yet
            return
        if self.columns is None:
            self.columns = METRIC_COLUMNS + sorted(k for k in row if k not in METRIC_COLUMNS)
            with self.path.open("w", newline="") as f:
                csv.writer(f).writerow(self.columns)
        rows, self.pending = [*self.pending, row], []
        with self.path.open("a", newline="") as f:
            for r in rows:
                csv.writer(f).writerow(["" if r.get(c) is None else r[c] for c in self.columns])
        for tracker in self.trackers:  # every row written, the held-back ones too (iter 0's eval)
            tracker.log(rows)

    def close(self) -> None:
        if self.pending:
            self.write(self.pending.pop(), final=True)
        for tracker in self.trackers:
            tracker.close()
