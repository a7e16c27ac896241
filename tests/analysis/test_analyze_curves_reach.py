"""`attnlab analyze curves` and `reach` on small synthetic study folders, against hand-computed
differences, t intervals, slopes, crossings and ratios; their refusals change nothing on disk."""

from __future__ import annotations

import csv
import math
import subprocess
from pathlib import Path

import pytest

from attnlab.errors import AttnlabError
from attnlab.studies import curves, reach

T_975_DF1 = 12.706204736174698  # Student's t, 97.5th percentile, 1 degree of freedom
T_975_DF2 = 4.302652729911275  # and 2 degrees of freedom


def write_run(study: Path, variant: str, seed: int, losses: dict[int, float]) -> None:
    """A run's metrics.csv as the trainer writes it: training rows without a val loss between
    the evaluations."""
    run = study / "runs" / variant / f"seed{seed}"
    run.mkdir(parents=True)
    lines = ["iter,train_loss,val_loss,lr,tokens_per_s,step_ms,elapsed_s,grad_norm"]
    for it, loss in sorted(losses.items()):
        lines.append(f"{it},,{loss!r},0.001,,,,")
        lines.append(f"{it + 50},2.0,,0.001,1000,10,1,0.5")  # a log row: no evaluation
    (run / "metrics.csv").write_text("\n".join(lines) + "\n")


# A - B per seed at iterations 0, 100, 200, 300:
#   seed 0:  0.0, -0.2, -0.1, -0.05   (below 0 at all three from 100; slope +0.75 per 1k)
#   seed 1: -0.1, -0.1, -0.3, +0.15   (below 0 at two;                slope +1.25 per 1k)
A = {0: {0: 4.0, 100: 3.0, 200: 2.0, 300: 1.5}, 1: {0: 4.0, 100: 3.0, 200: 2.0, 300: 1.5}}
B = {0: {0: 4.0, 100: 3.2, 200: 2.1, 300: 1.55}, 1: {0: 4.1, 100: 3.1, 200: 2.3, 300: 1.35}}


@pytest.fixture
def study(tmp_path: Path) -> Path:
    folder = tmp_path / "study"
    for seed in (0, 1):
        write_run(folder, "kv", seed, A[seed])
        write_run(folder, "vanilla", seed, B[seed])
    write_run(folder, "kv", 2, A[0])  # a seed vanilla did not run: left out of the pairs
    return folder


def test_differences_intervals_counts_and_slopes_match_hand_computation(study: Path) -> None:
    result = curves.compare(study, "kv", "vanilla")
    assert result.iters == [0, 100, 200, 300]
    assert result.start == 100  # the first evaluation after iteration 0
    means = [r["mean_diff"] for r in result.per_iter]
    assert means == pytest.approx([-0.05, -0.15, -0.2, 0.05])
    # at 100: differences -0.2 and -0.1, sd 0.1/sqrt(2), half-width t * sd / sqrt(2) = t * 0.05
    at100 = result.per_iter[1]
    assert [at100["ci95_low"], at100["ci95_high"]] == pytest.approx(
        [-0.15 - 0.05 * T_975_DF1, -0.15 + 0.05 * T_975_DF1]
    )
    assert at100["t"] == pytest.approx(-0.15 / 0.05)
    assert [r["seeds_below_zero"] for r in result.per_iter] == [1, 2, 2, 1]
    seeds = {r["seed"]: r for r in result.per_seed}
    assert [seeds["0"]["below_zero"], seeds["1"]["below_zero"]] == [3, 2]
    assert seeds["0"]["below_at_every_eval"] and not seeds["1"]["below_at_every_eval"]
    assert seeds["0"]["slope_per_1k_iters"] == pytest.approx(0.75)
    assert seeds["1"]["slope_per_1k_iters"] == pytest.approx(1.25)
    # slopes 0.75 and 1.25: mean 1.0, sd 0.25 * sqrt(2), half-width t * 0.25
    s = result.summary
    assert s["seeds"] == [0, 1]
    assert s["slope_per_1k_iters"] == pytest.approx(1.0)
    assert s["slope_ci95"] == pytest.approx([1.0 - 0.25 * T_975_DF1, 1.0 + 0.25 * T_975_DF1])
    assert (s["mean_below_zero"], s["ci_below_zero"], s["seeds_below_at_every_eval"]) == (2, 0, 1)
    assert s["trend"] == "no trend resolved"  # the interval spans 0
    assert seeds["mean"]["below_zero"] == 2


def test_start_iteration_restricts_the_counts_and_the_fit(study: Path) -> None:
    s = curves.compare(study, "kv", "vanilla", start=200).summary
    assert s["evals_from_start"] == 2
    # two points a seed: slopes (-0.05 + 0.1) / 100 and (0.15 + 0.3) / 100, per 1,000 iterations
    assert s["slope_per_1k_iters"] == pytest.approx((0.5 + 4.5) / 2)
    assert s["mean_below_zero"] == 1


@pytest.mark.parametrize(
    ("mean", "low", "high", "word"),
    [
        (-0.01, 0.001, 0.004, "narrowing"),  # below 0 and rising towards it
        (-0.01, -0.004, -0.001, "widening"),
        (0.02, -0.5, -0.1, "narrowing"),  # above 0 and falling towards it
        (-0.01, -0.001, 0.004, "no trend resolved"),
        (-0.01, math.nan, math.nan, "no trend resolved"),  # one seed: no interval
    ],
)
def test_trend_words(mean: float, low: float, high: float, word: str) -> None:
    assert curves.trend(mean, low, high) == word


def test_first_reach_interpolates_between_evaluations() -> None:
    curve = {0: 5.0, 100: 4.0, 200: 3.0, 300: 2.5}
    assert reach.first_reach(curve, 3.5) == pytest.approx(150.0)
    assert reach.first_reach(curve, 3.0) == pytest.approx(200.0)  # reached exactly at an eval
    assert reach.first_reach(curve, 2.75) == pytest.approx(250.0)
    assert reach.first_reach(curve, 6.0) == 0.0
    assert math.isnan(reach.first_reach(curve, 2.0))  # never that low
    # the first crossing counts, not a later return below the level
    assert reach.first_reach({0: 5.0, 100: 3.0, 200: 3.6, 300: 2.0}, 3.5) == pytest.approx(75.0)


@pytest.fixture
def gba(tmp_path: Path) -> Path:
    folder = tmp_path / "gba"
    fair = {
        0: {0: 8.0, 100: 6.0, 200: 5.0},
        1: {0: 8.0, 100: 6.2, 200: 5.2},
        2: {0: 8, 100: 6, 200: 4.8},
    }
    # boosted crosses fair's final loss at 150, 160 and 175 of 200 iterations
    boosted = {
        0: {0: 8.0, 100: 5.5, 200: 4.5},  # 5.0 at 100 + 100 * 0.5/1.0 = 150
        1: {0: 8.0, 100: 5.8, 200: 4.8},  # 5.2 at 100 + 100 * 0.6/1.0 = 160
        2: {0: 8.0, 100: 5.1, 200: 4.7},  # 4.8 at 100 + 100 * 0.3/0.4 = 175
    }
    standard = {
        0: {0: 8.0, 100: 6.5, 200: 5.5},
        1: {0: 8, 100: 6, 200: 5.1},
        2: {0: 8, 100: 6, 200: 5},
    }
    for name, runs in {"fair": fair, "boosted": boosted, "standard": standard}.items():
        for seed, losses in runs.items():
            write_run(folder, name, seed, losses)
    return folder


def test_reach_ratios_and_interval_match_hand_computation(gba: Path) -> None:
    result = reach.reach(gba, "fair")
    assert result.variants == ["boosted", "standard"]
    rows = {(r["variant"], r["seed"]): r for r in result.rows}
    assert [rows["boosted", s]["reach_iter"] for s in (0, 1, 2)] == pytest.approx([150, 160, 175])
    summary = {s["variant"]: s for s in result.summary}
    ratios = [0.75, 0.8, 0.875]
    mean = sum(ratios) / 3
    sd = math.sqrt(sum((r - mean) ** 2 for r in ratios) / 2)
    b = summary["boosted"]
    assert (b["reached"], b["seeds"]) == (3, 3)
    assert b["ratio_mean"] == pytest.approx(mean)
    half = T_975_DF2 * sd / math.sqrt(3)
    assert [b["ratio_ci95_low"], b["ratio_ci95_high"]] == pytest.approx([mean - half, mean + half])
    assert b["fewer_steps_pct"] == pytest.approx(100 * (1 - mean))
    # standard ends above fair on seeds 0 and 2; on seed 1 it crosses 5.2 between 100 and 200
    assert [math.isfinite(rows["standard", s]["reach_iter"]) for s in (0, 1, 2)] == [
        False,
        True,
        False,
    ]
    s = summary["standard"]
    assert rows["standard", 1]["reach_iter"] == pytest.approx(100 + 100 * 0.8 / 0.9)
    assert s["reached"] == 1 and math.isnan(s["ratio_mean"])  # no interval over a subset


def cli(capsys: pytest.CaptureFixture, *args: str) -> subprocess.CompletedProcess:
    from attnlab.cli import main

    status = main(list(args))
    out = capsys.readouterr()
    return subprocess.CompletedProcess(list(args), status, out.out, out.err)


def test_commands_write_csv_and_figure(
    study: Path, gba: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "answers"
    p = cli(
        capsys, "analyze", "curves", str(study), "--a", "kv", "--b", "vanilla", "--out", str(out)
    )
    assert p.returncode == 0, p.stderr
    assert "no trend resolved" in p.stdout
    with (out / "curves-kv-vs-vanilla.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [float(r["mean_diff"]) for r in rows] == pytest.approx([-0.05, -0.15, -0.2, 0.05])
    assert (out / "curves-kv-vs-vanilla.png").stat().st_size > 0
    p = cli(capsys, "analyze", "reach", str(gba), "--target", "fair", "--variants", "boosted")
    assert p.returncode == 0, p.stderr
    assert "reached on 3 of 3 seeds" in p.stdout
    with (gba / "analysis" / "reach-fair.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["seed"] for r in rows] == ["0", "1", "2", "mean (3 of 3 reached)"]
    assert float(rows[1]["ratio"]) == pytest.approx(0.8)
    assert float(rows[3]["ratio"]) == pytest.approx((0.75 + 0.8 + 0.875) / 3)
    assert (
        float(rows[3]["ratio_ci95_low"])
        < float(rows[3]["ratio"])
        < float(rows[3]["ratio_ci95_high"])
    )


def tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["curves", "{study}", "--a", "kv", "--b", "gated"],
         "{study} has no variant 'gated' (it has: kv, vanilla)"),
        (["curves", "{study}", "--a", "kv", "--b", "kv"], "--a and --b name the same variant 'kv'"),
        (["curves", "{study}", "--a", "kv", "--b", "vanilla", "--from", "400"],
         "--from 400 is after the last shared evaluation (300)"),
        (["curves", "{final}", "--a", "kv", "--b", "vanilla"],
         "{final} has no runs/ folder with per-evaluation losses (its results.json holds final "
         "losses only: the study was published without its runs' records)"),
        (["reach", "{study}", "--target", "kv", "--variants", "kv,vanilla"],
         "the target 'kv' is also one of the variants compared with it"),
        (["reach", "{study}/runs", "--target", "kv"],
         "{study}/runs has no runs/ folder with per-evaluation losses"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line_and_changes_nothing(
    study: Path, tmp_path: Path, capsys: pytest.CaptureFixture, args: list[str], message: str
) -> None:
    final = tmp_path / "final-only"
    final.mkdir()
    (final / "results.json").write_text("{}")
    names = {"study": str(study), "final": str(final)}
    before = tree(tmp_path)
    p = cli(capsys, "analyze", *(a.format(**names) for a in args))
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [
        f"attnlab analyze {args[0]}: error: {message.format(**names)}"
    ]
    assert tree(tmp_path) == before


def test_api_refuses_a_missing_study(tmp_path: Path) -> None:
    with pytest.raises(AttnlabError, match="is not a study folder"):
        curves.compare(tmp_path / "nothing", "a", "b")


def test_export_size_counts_a_graph_with_its_external_data(tmp_path: Path) -> None:
    from attnlab.analysis import export_size

    (tmp_path / "model.onnx").write_bytes(b"g" * 10)
    (tmp_path / "model.onnx.data").write_bytes(b"w" * 20)
    (tmp_path / "model-int8.onnx").write_bytes(b"q" * 7)
    assert export_size.format_bytes(tmp_path, "onnx") == (30, ["model.onnx", "model.onnx.data"])
    assert export_size.format_bytes(tmp_path, "onnx-int8") == (7, ["model-int8.onnx"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["qkve-61mm"], "unknown preset 'qkve-61mm'"),
        (["qkve-61m", "max_iters=0"], "export-size takes model fields only, not max_iters"),
    ],
)
def test_export_size_refusals(
    tmp_path: Path, capsys: pytest.CaptureFixture, args: list[str], message: str
) -> None:
    p = cli(capsys, "analyze", "export-size", *args, "--out", str(tmp_path / "out"))
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"attnlab analyze export-size: error: {message}")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # an ONNX export and its quantization: about 30 s on a busy 2-core machine
def test_export_size_measures_fresh_weights_and_leaves_only_its_csv(tmp_path: Path) -> None:
    from attnlab.analysis import export_size
    from attnlab.config import ModelConfig

    config = ModelConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=64, bias=False)
    rows = export_size.measure(config, "tiny", tmp_path)
    by = {r["format"]: r for r in rows}
    params = rows[0]["parameters"]
    # tied embedding 64*32 + position 16*32, attention 4*32*32, MLP 2*32*128, three LayerNorms
    assert params == 64 * 32 + 16 * 32 + 4 * 32 * 32 + 2 * 32 * 128 + 3 * 32
    # float32 weights plus a header of names and shapes (the tied table may be stored twice)
    assert 4 * params < by["safetensors"]["bytes"] < 4 * (params + 64 * 32) + 4096
    assert by["onnx-int8"]["bytes"] < by["onnx"]["bytes"]
    assert by["onnx"]["MB"] == by["onnx"]["bytes"] / 1e6
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".attnlab-analysis",
        "export-size-tiny.csv",
    ]


def test_curves_figure(study: Path, tmp_path: Path) -> None:
    from test_figures import check_figure, labelled_lines

    result = curves.compare(study, "kv", "vanilla")
    fig = curves.plot(result, tmp_path / "c.png")
    (ax,) = check_figure(fig, tmp_path / "c.png", 1, "kv minus vanilla")
    assert "nats per token" in ax.get_ylabel()
    assert labelled_lines(ax) == [
        "each seed (0, 1)",
        "95 % CI (paired t)",
        "mean over 2 seeds",
        "no difference",
        "counted from iteration 100",
    ]
    band = ax.collections[0].get_paths()[0].vertices  # the interval band spans the t CI
    assert band[:, 1].min() == pytest.approx(result.per_iter[2]["ci95_low"])  # widest at 200


def test_reach_figure(gba: Path, tmp_path: Path) -> None:
    from test_figures import check_figure, labelled_lines

    fig = reach.plot(reach.reach(gba, "fair"), tmp_path / "r.png")
    axes = check_figure(fig, tmp_path / "r.png", 2, "reaches fair's final val loss")
    for ax in axes:
        labels = labelled_lines(ax)
        assert labels[:3] == ["fair (mean of 3)", "boosted (mean of 3)", "standard (mean of 3)"]
        # a cross per seed that reaches the level: boosted's three and standard's one
        assert labels.count("boosted reaches it (one seed)") == 3
        assert labels.count("standard reaches it (one seed)") == 1
    assert axes[1].get_xlim()[0] == pytest.approx(100)  # the zoom: the last half of 200


def test_a_diverged_evaluation_leaves_its_seed_out_of_the_trend(tmp_path: Path) -> None:
    folder = tmp_path / "study"
    for seed in (0, 1):
        write_run(folder, "kv", seed, A[seed])
        write_run(folder, "vanilla", seed, B[seed])
    write_run(folder, "kv", 2, {0: 4.0, 100: math.nan, 200: 2.0, 300: 1.5})
    write_run(folder, "vanilla", 2, A[0])
    result = curves.compare(folder, "kv", "vanilla")
    assert math.isnan(result.per_seed[2]["slope_per_1k_iters"])
    assert result.summary["slope_per_1k_iters"] == pytest.approx(1.0)  # seeds 0 and 1 only
    assert result.per_iter[1]["n"] == 2  # the paired test leaves the diverged seed out
