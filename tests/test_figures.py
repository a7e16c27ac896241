"""Every figure at tiny scale: a real PNG, the expected axes, a label on every series, axis labels
with units, a title naming what was run, and plain ticks (matplotlib's objects, not pixels)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from attnlab.plotting import SMOKE, labelled_lines

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def check_figure(fig: Any, png: Path, n_axes: int, title_has: str) -> list[Any]:
    """The checks every figure passes; returns its data axes (colorbars excluded)."""
    assert png.read_bytes()[:8] == PNG_MAGIC
    axes = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
    assert len(axes) == n_axes
    titles = [fig.get_suptitle(), *(ax.get_title() for ax in axes)]
    assert any(title_has in t for t in titles), titles
    for ax in axes:
        assert ax.get_xlabel() and ax.get_ylabel(), ax.get_title()
        for axis in (ax.xaxis, ax.yaxis):  # no 6x10^0: every tick label plain text
            fig.canvas.draw()
            labels = axis.get_ticklabels(which="both")
            assert not any("times" in t.get_text() for t in labels)
    return axes


def test_bench_overhead_figure_draws_every_row_distinguishably(tmp_path: Path) -> None:
    from attnlab.bench.overhead import MATCH_STYLE, Row, plot

    rows = [Row(w, "vanilla", "equal", w, 100 * w, 2.0 * w, 1.0, (1.0, 1.0)) for w in (16, 32)]
    for w in (16, 32):
        rows += [
            Row(w, "kv-bias", "equal", w, 120 * w, 2.4 * w, 1.2, (1.1, 1.3)),
            Row(w, "kv-bias", "params", w - 8, 100 * w, 2.1 * w, 1.05, (1.0, 1.1)),
            Row(w + 8, "kv-bias", "fair", w, 120 * w, 2.4 * w, 0.97, (0.9, 1.0)),
            Row(w, "value gate", "modern", w, 110 * w, 2.2 * w, 1.1, (1.0, 1.2)),
        ]
    fig = plot(rows, str(tmp_path / "o.png"), f"{SMOKE}\nbench overhead: 1 layers")
    ax_t, ax_o = check_figure(fig, tmp_path / "o.png", 2, SMOKE)
    assert ax_t.get_ylabel() == "step time (ms)" and ax_o.get_ylabel() == "overhead vs vanilla (%)"
    suffix = {m: s[0] for m, s in MATCH_STYLE.items()}
    assert labelled_lines(ax_o) == [
        f"kv-bias, {suffix['equal']}",
        f"kv-bias, {suffix['params']}",
        f"kv-bias, {suffix['fair']}",
        f"value gate, {suffix['modern']}",
    ]
    assert labelled_lines(ax_t)[0] == "vanilla"
    styles = {(line.get_linestyle(), line.get_marker()) for line in ax_o.get_lines()[:4]}
    assert len(styles) == 4  # a mechanism and its partners differ in line and marker
    assert [t.get_text() for t in ax_o.get_xticklabels()] == ["16", "32"]
    # one legend outside both axes: no series hidden under it
    assert len(fig.legends) == 1 and all(ax.get_legend() is None for ax in (ax_t, ax_o))
    assert {t.get_text() for t in fig.legends[0].get_texts()} == set(
        labelled_lines(ax_t) + labelled_lines(ax_o)
    )


def test_bench_generate_figure(tmp_path: Path) -> None:
    from attnlab.bench.generate import GenRow, plot

    def row(name: str, scale: float) -> GenRow:
        lat = [scale * (1 + i / 10) for i in range(8)]
        return GenRow(name, 100.0, 20.0, 5.0, 1.1, True, lat, [5 * x for x in lat])

    fig = plot(
        [row("vanilla", 0.3), row("twicing", 0.6)], str(tmp_path / "g.png"), "bench generate"
    )
    (ax,) = check_figure(fig, tmp_path / "g.png", 1, "bench generate")
    assert labelled_lines(ax) == [
        "vanilla, KV cache",
        "vanilla, recompute",
        "twicing, KV cache",
        "twicing, recompute",
    ]
    assert ax.get_ylabel() == "latency (ms per token)" and ax.get_yscale() == "log"
    fig.canvas.draw()
    labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
    assert labels and all(label.replace(".", "").isdigit() for label in labels)


def test_quick_benches_say_they_are_smoke_tests(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from attnlab.bench import train
    from attnlab.bench._timing import figure_path
    from attnlab.cli import main

    assert main(["bench", "train", "--quick"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(SMOKE + "\n") and "(smoke test: no target)" in out
    assert f"x {train.QUICK['steps']} steps" in err  # what --help promises
    with pytest.raises(SystemExit):
        main(["bench", "train", "--help"])
    assert f"{train.QUICK['steps']} steps: a smoke test" in " ".join(
        capsys.readouterr().out.split()
    )
    # a smoke figure never lands on the measured figure's default path
    assert figure_path(None, "overhead", quick=True) == "runs/bench/overhead-quick.png"
    assert figure_path(None, "overhead", quick=False) == "runs/bench/overhead.png"
    assert figure_path("x.png", "overhead", quick=True) == "x.png"
