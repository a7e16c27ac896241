"""Progress of a study: one line per finished unit of work (a run, a table cell) with an ETA."""

from __future__ import annotations

from collections.abc import Callable

# Receives one human-readable line per finished run or table cell (the CLI passes print).
Progress = Callable[[str], None]


class Tracker:
    """Counts finished units of work and reports each as one line with what is left and an ETA.

    The ETA averages the units actually computed in this invocation (not ones found finished),
    each at its whole length (``whole``: a resumed run's time in all, not only the part trained
    now), and divides by how many run at a time (fewer when fewer are left).
    """

    def __init__(self, total: int, progress: Progress | None, parallel: int = 1) -> None:
        self.total, self.progress, self.parallel = total, progress, parallel
        self.finished = self.computed = 0
        self.seconds = 0.0

    def done(
        self, what: str, result: str, seconds: float, cached: bool = False, whole: float = 0.0
    ) -> None:
        """``what`` finished with ``result`` after ``seconds`` in this invocation; ``whole``, when
        longer, is its length in all (a run resumed here had trained for part of it before)."""
        self.finished += 1
        if not cached:
            self.computed += 1
            self.seconds += max(seconds, whole)
        if self.progress is None:
            return
        left = self.total - self.finished
        eta = ""
        if left and self.computed:
            at_once = min(self.parallel, left)
            eta = f", ETA {duration(self.seconds / self.computed * left / at_once)}"
        took = "finished earlier" if cached else f"{duration(seconds)}"
        self.progress(f"[{self.finished}/{self.total}] {what}: {result} ({took}); {left} left{eta}")


def duration(seconds: float) -> str:
    """``seconds`` as a person reads it: seconds, minutes or hours."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"
