"""Every figure at tiny scale: a real PNG, the expected axes, a label on every series, axis labels
with units, a title naming what was run, and plain ticks (matplotlib's objects, not pixels)."""

from __future__ import annotations

import itertools
import math
from pathlib import Path
from typing import Any

import pytest

from attnlab.plotting import SMOKE

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def labelled_lines(ax) -> list[str]:
    """Labels of the series drawn on ``ax`` (lines, bars, fills), skipping matplotlib's
    unlabelled helpers: what a legend can show."""
    return [label for label in ax.get_legend_handles_labels()[1] if not label.startswith("_")]


def check_figure(fig: Any, png: Path, n_axes: int, title_has: str) -> list[Any]:
    """The checks every figure passes; returns its data axes (colorbars excluded)."""
    assert png.read_bytes()[:8] == PNG_MAGIC
    axes = [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]
    assert len(axes) == n_axes
    titles = [fig.get_suptitle(), *(ax.get_title() for ax in axes)]
    assert any(title_has in t for t in titles), titles
    for ax in axes:
        shared = ax.get_shared_x_axes().get_siblings(ax)  # panels stacked on one x axis
        assert any(a.get_xlabel() for a in shared) and ax.get_ylabel(), ax.get_title()
        for axis in (ax.xaxis, ax.yaxis):  # no 6x10^0: every tick label plain text
            fig.canvas.draw()
            labels = axis.get_ticklabels(which="both")
            assert not any("times" in t.get_text() for t in labels)
        assert_apart(ax.get_xticklabels(), fig)
    return axes


def assert_apart(labels: list[Any], fig: Any) -> None:
    """No two tick labels of an axis overlap on the drawn figure (they did under a bar chart)."""
    fig.canvas.draw()
    boxes = sorted(
        (t.get_window_extent() for t in labels if t.get_visible() and t.get_text()),
        key=lambda box: box.x0,
    )
    for left, right in itertools.pairwise(boxes):
        assert left.x1 <= right.x0, [t.get_text() for t in labels]


def test_bench_overhead_figure_draws_every_row_distinguishably(tmp_path: Path) -> None:
    from attnlab.bench.overhead import MATCH_STYLE, Row, plot

    rows = [Row(w, "vanilla", "equal", w, 100 * w, 2.0 * w, 1.0, (1.0, 1.0)) for w in (16, 32)]
    for w in (16, 32):
        rows += [
            Row(w, "kv-bias", "equal", w, 120 * w, 2.4 * w, 1.2, (1.1, 1.3)),
            Row(w, "kv-bias", "params", w - 8, 100 * w, 2.1 * w, 1.05, (1.0, 1.1)),
            Row(w + 8, "kv-bias", "fair", w, 120 * w, 2.4 * w, 0.97, (0.9, 1.0)),
            Row(w, "value-gate", "modern", w, 110 * w, 2.2 * w, 1.1, (1.0, 1.2)),
        ]
    fig = plot(rows, str(tmp_path / "o.png"), f"{SMOKE}\nbench overhead: 1 layers")
    ax_t, ax_o = check_figure(fig, tmp_path / "o.png", 2, SMOKE)
    assert ax_t.get_ylabel() == "step time (ms)" and ax_o.get_ylabel() == "overhead vs vanilla (%)"
    suffix = {m: s[0] for m, s in MATCH_STYLE.items()}
    assert labelled_lines(ax_o) == [
        f"kv-bias, {suffix['equal']}",
        f"kv-bias, {suffix['params']}",
        f"kv-bias, {suffix['fair']}",
        f"value-gate, {suffix['modern']}",
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
    from attnlab.cli import main
    from attnlab.commands.bench import figure_path, train

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


def test_gates_figure(tmp_path: Path) -> None:
    import numpy as np

    from attnlab.analysis.gates import plot

    means = np.random.default_rng(0).uniform(0.2, 0.8, (3, 2, 16))  # 3 layers, 2 extra rounds
    fig = plot(means, tmp_path / "g.png", "runs/boosted")
    axes = check_figure(fig, tmp_path / "g.png", 3, "runs/boosted")
    for ax in axes:
        assert ax.get_ylabel() == "gate value"
        assert labelled_lines(ax) == [
            "round 1 gate",
            "round 2 gate",
            "g = 0.5 (half of each correction)",
        ]
        assert any(t.get_text() == "g = 0.5" for t in ax.texts)  # the line is labelled in place
    assert len(fig.legends) == 1


def test_entropy_figure_has_a_legend_on_every_panel(tmp_path: Path) -> None:
    import numpy as np

    from attnlab.analysis.entropy import plot

    rng = np.random.default_rng(0)
    sources = {k: rng.gamma(3, 0.5, (2, 3, 4, 8)) for k in ("standard", "round0", "round1")}
    fig = plot(sources, tmp_path / "e.png", "runs/b (rounds) vs runs/s (standard)")
    left, right = check_figure(fig, tmp_path / "e.png", 2, "runs/b (rounds) vs runs/s")
    for ax in (left, right):
        assert ax.get_legend() is not None
        assert [t.get_text().split(" (")[0] for t in ax.get_legend().get_texts()] == list(sources)
    # outlined densities: one line per source, each with its own colour and style
    patches = [p for p in left.patches if not p.get_label().startswith("_")]
    assert len(patches) == 3 and all(not p.get_fill() for p in patches)
    assert len({(str(p.get_edgecolor()), p.get_linestyle()) for p in patches}) == 3


def test_hull_figure(tmp_path: Path) -> None:
    from attnlab.analysis.hull import plot

    rows = [
        {"sequence": 0, "layer": layer, "head": h, "position": p, "distance": 0.1 * layer + p / 100}
        for layer in range(2)
        for h in range(2)
        for p in range(3)
    ]
    fig = plot(rows, tmp_path / "h.png", "runs/boosted")
    (ax,) = check_figure(fig, tmp_path / "h.png", 1, "runs/boosted")
    assert set(labelled_lines(ax)) == {
        "quartiles (whiskers 1.5 IQR)",
        "median",
        "one (window, head, position)",
        "layer mean",
    }
    assert ax.get_legend() is not None


def test_attention_figure_marks_the_query(tmp_path: Path) -> None:
    from attnlab.analysis.attention import plot

    labels = ["a", "b", "\u2423", "c"]
    panel = {"labels": labels, "weights": {"round0": [0.1, 0.2, 0.3, 0.4]}, "title": "seq 0 pos 9"}
    panel2 = {**panel, "weights": {"standard": [0.25] * 4, "round0": [0.1, 0.2, 0.3, 0.4]}}
    fig = plot([panel, panel2], tmp_path / "a.png", "runs/boosted, layer 1")
    axes = check_figure(fig, tmp_path / "a.png", 2, "runs/boosted, layer 1")
    assert labelled_lines(axes[0]) == ["query token", "round0"]
    assert labelled_lines(axes[1]) == ["query token", "standard", "round0"]
    for ax in axes:
        assert ax.get_legend() is not None
        ticks = ax.get_xticklabels()
        assert [t.get_text() for t in ticks] == labels and ticks[-1].get_fontweight() == "bold"


def test_attention_queries_have_context(tmp_path: Path) -> None:
    """Chosen queries are never position 0: with a full window of context when picked."""
    import torch

    from attnlab.analysis.attention import chosen_tokens
    from attnlab.analysis.inputs import Inputs
    from attnlab.errors import AttnlabError

    x = torch.zeros(3, 32, dtype=torch.long)
    inputs = Inputs(None, None, x, x)
    assert chosen_tokens(inputs, {}, None, sequence=1, top=3, window=16) == [
        (1, 15),
        (1, 23),
        (1, 31),
    ]
    gain = torch.zeros(3, 32)
    gain[0, 0], gain[2, 5], gain[1, 20] = 9.0, 8.0, 1.0  # the best gains lack context
    losses = {"standard": gain, "boosted": torch.zeros(3, 32)}
    assert chosen_tokens(inputs, losses, None, top=1, window=8) == [(1, 20)]
    with pytest.raises(AttnlabError, match="position 0 attends only to itself"):
        chosen_tokens(inputs, {}, [0, 4])


def test_per_position_figure(tmp_path: Path) -> None:
    from attnlab.analysis.per_position import plot

    def rows(keys: list[str], count: int = 5) -> list[dict]:
        return [
            {"group": k, "count": count, "loss_a": 1.0, "loss_b": 0.9, "b_minus_a": -0.1}
            for k in keys
        ]

    groups = {  # the regions and counts of the embedded corpus (their labels once overlapped)
        "by_region": rows(["header", "speech", "before any header"], 479_828),
        "by_column": rows(["0", "1", "2+"]),
        "by_header_distance": rows(["none", "0", "1+"]),
    }
    fig = plot(groups, tmp_path / "p.png", "runs/a", "runs/b")
    axes = check_figure(fig, tmp_path / "p.png", 3, "B = runs/b against A = runs/a")
    line = "no difference (below: B better)"
    assert labelled_lines(axes[0]) == [line, "B - A per region (targets)"]
    assert labelled_lines(axes[1]) == labelled_lines(axes[2]) == ["B - A", line]
    assert list(axes[2].get_lines()[0].get_xdata()) == [0, 1]  # "none" left out, 1+ pooled at 1
    assert "(1+ pooled)" in axes[2].get_xlabel()
    assert len(fig.legends) == 1


def test_names_figure(tmp_path: Path) -> None:
    from attnlab.analysis.names import plot

    score = {"headers": 10, "canonical_headers": 6, "distinct_names": 5, "distinct_canonical": 2}
    report = {
        "samples": 2,
        "length": 50,
        "cast_size": 40,
        "runs": {"runs/a": score, "runs/b": score},
    }
    fig = plot(report, tmp_path / "n.png")
    # runs are named by the fewest path parts that tell them apart
    axes = check_figure(fig, tmp_path / "n.png", 2, "name test of a and b")
    for ax in axes:
        assert labelled_lines(ax) == ["in the training cast", "invented"]
        assert [t.get_text() for t in ax.texts] == ["60% real"] * 2 or [
            t.get_text() for t in ax.texts
        ] == ["40% real"] * 2


def test_the_paired_figure_draws_what_each_t_test_weighs(tmp_path: Path) -> None:
    """One row per comparison: each seed's difference where it is, the mean with its t interval,
    the bootstrap interval and the seed's published difference where the comparison has them."""
    from attnlab.studies.kinds.lm_report import plot_paired

    losses = {"base": [1.50, 1.52, 1.49], "kv": [1.48, 1.53, 1.46], "wide": [1.47, 1.50, 1.45]}
    losses["same"] = [x + 0.01 for x in losses["base"]]  # every seed 0.01 higher: no spread
    runs = [
        {"variant": v, "seed": s, "val_loss": loss, "status": "ok"}
        for v, seeds in losses.items()
        for s, loss in enumerate(seeds)
    ]
    runs.append({"variant": "kv", "seed": 3, "val_loss": None, "status": "failed"})
    comparisons = [
        {"variant": "kv", "baseline": "base", "seeds": [0, 1, 2], "n": 3, "mean_diff": -0.0133,
         "ci95": [-0.05, 0.02], "bootstrap_ci95": [-0.03, 0.01], "claimed_diff": -0.043,
         "p": 0.31},
        {"variant": "wide", "baseline": "base", "seeds": [0, 1, 2], "n": 3, "mean_diff": -0.03,
         "ci95": [-2.0, 1.9], "bootstrap_ci95": None, "claimed_diff": None, "p": 0.004},
        {"variant": "none", "baseline": "base", "seeds": [], "n": 0, "ci95": None},
        {"variant": "same", "baseline": "base", "seeds": [0, 1, 2], "n": 3, "mean_diff": 0.01,
         "ci95": [math.nan, math.nan], "no_spread": True, "p": math.nan},
    ]  # fmt: skip
    results = {"runs": runs, "comparisons": comparisons}
    fig = plot_paired(results, tmp_path / "paired.png", "study: paired differences")
    (ax,) = check_figure(fig, tmp_path / "paired.png", 1, "study: paired differences")
    assert set(labelled_lines(ax)) == {
        "one seed", "mean, 95 % t interval", "bootstrap 95 %", "the seed's difference",
        "interval runs on past the edge", "mean (no interval: no spread)",
    }  # fmt: skip
    # the x range shows every seed, 0 and the seed's difference; the far wider interval (two
    # seeds' t(1)) is cut at both edges, the narrow one is shown whole
    left, right = ax.get_xlim()
    assert left < -0.05 < 0.02 < right and right - left < 0.5
    heads = [
        line for line in ax.get_lines() if line.get_label() == "interval runs on past the edge"
    ]
    assert sorted((h.get_marker(), float(h.get_xdata()[0])) for h in heads) == [
        ("<", pytest.approx(left)), (">", pytest.approx(right))
    ]  # fmt: skip
    dots = [line for line in ax.get_lines() if line.get_label() == "one seed"]
    assert [list(d.get_xdata()) for d in dots] == [
        pytest.approx([-0.02, 0.01, -0.03]),
        pytest.approx([-0.03, -0.02, -0.04]),
        pytest.approx([0.01, 0.01, 0.01]),
    ]
    assert [round(float(d.get_ydata().mean()), 6) for d in dots] == [2.0, 1.0, 0.0]  # first on top
    ticks = zip(ax.get_yticks(), ax.get_yticklabels(), strict=True)
    labels = {round(y): t.get_text() for y, t in ticks}
    assert labels == {
        2: "kv\n− base\nn = 3, p = 0.3100",
        1: "wide\n− base\nn = 3, p = 0.0040",
        0: "same\n− base\nn = 3, p = – (no spread)",
    }
    # nothing to draw: no figure, no file
    assert (
        plot_paired({"runs": runs, "comparisons": comparisons[2:3]}, tmp_path / "x.png", "t")
        is None
    )
    assert not (tmp_path / "x.png").exists()
