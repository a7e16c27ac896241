"""Figures as PNG files, with no display needed: the one place that sets matplotlib up.

Conventions every figure follows (tests check them on the matplotlib objects): a title naming
the run(s), axis labels with units, a label on every plotted series, plain tick labels on log
axes, and legends placed where they hide no data (``legend_outside``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attnlab.errors import AttnlabError
from attnlab.fsutil import atomic_path, check_writable

SMOKE = "SMOKE TEST (--quick): tiny models, not a measurement"
# the PNG text entry every figure carries, so that a later run knows the file is attnlab's
MARK_KEY, MARK = "Software", "attnlab"
# markers and line styles cycle beside the ten colours, so coinciding series stay apart
MARKERS = ("o", "s", "^", "D", "v", "P", "X")
LINESTYLES = ("-", "--", "-.", ":")


def series_style(i: int) -> dict[str, str]:
    """The colour, marker and line style of a figure's ``i``-th series."""
    return {
        "color": f"C{i % 10}",
        "marker": MARKERS[i % len(MARKERS)],
        "ls": LINESTYLES[i % len(LINESTYLES)],
    }


def series_styles(names: list[str], order: list[str] | None = None) -> dict[str, dict[str, str]]:
    """Each named series' style by its place in ``order`` (a study's runs: a variant looks the
    same in every figure of its report, whichever runs a figure shows), else among ``names``."""
    order = order or []
    return {
        name: series_style(order.index(name) if name in order else i)
        for i, name in enumerate(names)
    }


def written_by_attnlab(path: Path) -> bool:
    """Whether the PNG at ``path`` carries save_figure's mark (in a text chunk before the image)."""
    with path.open("rb") as f:
        return f"{MARK_KEY}\0{MARK}".encode() in f.read(4096)


def check_figure_out(path: Path, flag: str = "--out") -> None:
    """Refuse, before any work, a figure path that would replace a file attnlab did not write
    or whose folder cannot be written (a file on the way, a read-only or pseudo file system)."""
    if path.is_file() and not written_by_attnlab(path):
        raise AttnlabError(
            f"{path} exists and was not written by attnlab; choose another {flag} or remove it"
        )
    check_writable(path.parent, flag)


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (imported on first use: it is slow to load)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: str | Path) -> Path:
    """Lay out, write ``path`` (creating its folder) at 120 dpi, and free the figure.

    The Figure object stays usable for inspection (tests read its axes and lines).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if fig.get_layout_engine() is None:
        fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120, metadata={MARK_KEY: MARK})
    pyplot().close(fig)
    return path


def plain_log_ticks(ax: Any, axis: str = "y") -> None:
    """Tick labels on a log axis as plain numbers (0.5, 2, 20), never 6x10^0."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    target = ax.yaxis if axis == "y" else ax.xaxis
    target.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    target.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    target.set_minor_formatter(NullFormatter())


def legend_outside(fig: Any, axes: list[Any], ncol: int = 3) -> Any:
    """One legend for all ``axes`` below them (each label once), so that it covers no data.

    Needs a figure made with ``layout="constrained"``, which keeps room for it.
    """
    handles: dict[str, Any] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    return fig.legend(
        handles.values(), handles.keys(), loc="outside lower center", ncol=ncol, fontsize=8
    )
