"""Studies show convergence (each run's last-20 % change, flagged in the report; the curves with
their window), run per-variant seed counts, and the gate-position study's sink and sparsity."""

from __future__ import annotations

import csv
import json
import math
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import fixed_pace

from attnlab.errors import AttnlabError
from attnlab.studies import output
from attnlab.studies.runner import report_study, run_study
from attnlab.studies.spec import WALLCLOCK_SUFFIX, load_spec, parse_spec


def test_last_fifth_change_by_hand() -> None:
    """(L(N) - L(0.8 N)) / L(0.8 N), L(0.8 N) interpolated between the evaluations around it."""
    curve = {0: 5.0, 500: 3.0, 1000: 2.5, 1500: 2.0}
    at_1200 = 2.5 + (2.0 - 2.5) * (1200 - 1000) / (1500 - 1000)
    assert output.val_change(curve, 1500) == pytest.approx((2.0 - at_1200) / at_1200, rel=1e-12)
    assert output.val_change({0: 4.0, 800: 2.0, 1000: 1.9}, 1000) == pytest.approx(-0.05)
    assert output.val_change(curve, 1400) is None  # no evaluation at the run's end
    assert output.val_change({900: 2.0, 1000: 1.9}, 1000) is None  # none at or before 800


def _spec(extra: str = "") -> str:
    return f"""
name = "two-arms"
description = "vanilla against a wider vanilla, tiny"
[variants.base]
preset = "shakespeare-char"
[variants.wide]
preset = "shakespeare-char"
model = {{ n_embd = 40 }}
[variants.deep]
preset = "shakespeare-char"
model = {{ n_layer = 2 }}
[[comparisons]]
baseline = "base"
variant = "wide"
wallclock = true
[[comparisons]]
baseline = "base"
variant = "deep"
[scale.ci]
seeds = 2
model = {{ n_layer = 1, n_head = 2, n_embd = 32, block_size = 16 }}
train = {{ max_iters = 10, eval_interval = 3, eval_iters = 1, batch_size = 4, decay_lr = false, learning_rate = 3e-3, device = "cpu" }}
{extra}"""


def test_runs_report_their_convergence_and_variants_their_own_seeds(
    tmp_path: Path, tiny_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """deep runs its own 1 seed of the study's 2; every run's last-20 % change in results.csv
    and results.json recomputes from its metrics.csv; the report flags the runs beyond the
    threshold (10 iterations at a constant learning rate are far from a plateau: a cosine
    schedule this short anneals to nothing in its last fifth) and the curves show the window."""
    from attnlab.studies.kinds import lm

    monkeypatch.setattr(lm, "time_steps", fixed_pace())
    spec_file = tmp_path / "two-arms.toml"
    spec_file.write_text(_spec("[scale.ci.variants.deep]\nseeds = 1\n"))
    out = tmp_path / "study"
    done = run_study(load_spec(spec_file), "ci", out, data=tiny_data)
    trained = {(r["variant"], r["seed"]) for r in done["runs"]}
    clocked = "base" + WALLCLOCK_SUFFIX
    assert trained == {(v, s) for v in ("base", "wide", clocked) for s in (0, 1)} | {("deep", 0)}
    assert [(c["variant"], c["baseline"], c["n"]) for c in done["comparisons"]] == [
        ("wide", "base", 2),
        ("deep", "base", 1),
        ("wide", clocked, 2),
    ]
    with (out / "results.csv").open() as f:
        rows = {(r["variant"], int(r["seed"])): r for r in csv.DictReader(f)}
    for run in done["runs"]:
        with (Path(run["run_dir"]) / "metrics.csv").open() as f:
            curve = {
                int(r["iter"]): float(r["val_loss"]) for r in csv.DictReader(f) if r["val_loss"]
            }
        n = run["iters"]
        lo, hi = max(i for i in curve if i <= 0.8 * n), min(i for i in curve if i >= 0.8 * n)
        # the wall-clock arm's 15 iterations put 0.8 N on an evaluation (12)
        start = (
            curve[lo]
            if lo == hi
            else curve[lo] + (curve[hi] - curve[lo]) * (0.8 * n - lo) / (hi - lo)
        )
        change = (curve[n] - start) / start
        assert run["val_change_last20"] == pytest.approx(change, rel=1e-9)
        assert run["converged"] is (abs(change) <= output.CONVERGED_WITHIN)
        row = rows[run["variant"], run["seed"]]
        assert float(row["val_change_last20"]) == pytest.approx(change, rel=1e-9)
        assert row["converged"] == str(run["converged"])
    results = json.loads((out / "results.json").read_text())
    assert all("val_change_last20" in r and "converged" in r for r in results["runs"])
    flagged = [r for r in done["runs"] if not r["converged"]]
    assert flagged, "10 iterations should not reach a plateau"
    report = (out / "report.md").read_text()
    assert f"**Not converged: {len(flagged)} of {len(done['runs'])} runs**" in report
    for r in flagged:
        assert f"{r['variant']} seed {r['seed']} ({100 * r['val_change_last20']:+.2f} %)" in report
    assert "last 20 % change (farthest seed)" in report
    assert "deep runs at most the first 1 seeds." in report and "Partial" not in report
    assert (out / "figures" / "curves.png").read_bytes()[:4] == b"\x89PNG"
    # the unigram floor: study.json's, by hand from the bins; the report names exactly the runs
    # within 5 % of it (10 iterations of a char model end near it)
    floor = _unigram_by_hand(tiny_data)
    record = json.loads((out / "study.json").read_text())
    assert record["data"][str(tiny_data)]["unigram_loss"] == pytest.approx(floor, rel=1e-12)
    stuck = [r for r in done["runs"] if r["val_loss"] > 0.95 * floor]
    if stuck:
        assert (
            f"**{len(stuck)} of {len(done['runs'])} runs ended above it or less than 5 % below it**"
            in report
        )
        assert all(
            f"{r['variant']} seed {r['seed']} ({r['val_loss']:.4f})" in report for r in stuck
        )
    else:
        assert "every run ended below it" in report
    # a study from before convergence was measured gains it when reported again; a run whose
    # folder is gone keeps what results.json recorded
    measured = {(r["variant"], r["seed"]): r["val_change_last20"] for r in done["runs"]}
    older = json.loads((out / "results.json").read_text())
    for r in older["runs"]:
        r.pop("val_change_last20"), r.pop("converged")
    gone, other = older["runs"][0], older["runs"][1]
    gone["val_change_last20"], gone["converged"] = 0.5, False  # as recorded
    # a recorded loss that is not the folder's run: that folder holds another run now
    other["val_loss"], other["val_change_last20"], other["converged"] = 9.0, 0.25, False
    (out / "results.json").write_text(json.dumps(older))
    shutil.rmtree(gone["run_dir"])
    again = report_study(load_spec(spec_file), out)
    for r in again["runs"]:
        if r["run_dir"] == gone["run_dir"]:
            assert (r["val_change_last20"], r["converged"]) == (0.5, False)
        elif r["run_dir"] == other["run_dir"]:
            assert (r["val_change_last20"], r["converged"]) == (0.25, False)
        else:
            assert r["val_change_last20"] == measured[r["variant"], r["seed"]]


def _unigram_by_hand(folder: Path) -> float:
    """Mean -log p(token) over val, p the train split's add-one frequencies, token by token."""
    meta = json.loads((folder / "meta.json").read_text())
    train = np.fromfile(folder / "train.bin", dtype=meta["dtype"])
    val = np.fromfile(folder / "val.bin", dtype=meta["dtype"])
    counts = Counter(train.tolist())
    denominator = len(train) + meta["vocab_size"]
    return sum(-math.log((counts[t] + 1) / denominator) for t in val.tolist()) / len(val)


def test_unigram_loss_counts_in_chunks_and_the_report_names_runs_at_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from attnlab.data import token_files
    from attnlab.studies.kinds.lm_report import _unigram_lines

    train = np.array([0, 0, 0, 1, 2, 2], dtype=np.uint16)
    val = np.array([0, 1, 3], dtype=np.uint16)  # token 3 never occurs in train: add-one
    by_hand = -(math.log(4 / 10) + math.log(2 / 10) + math.log(1 / 10)) / 3
    monkeypatch.setattr(token_files, "_COUNT_CHUNK", 4)  # two chunks of train
    assert token_files.unigram_loss(train, val, 4) == pytest.approx(by_hand, rel=1e-12)
    record = {
        "configs": {"a": {"data": "/d"}, "b": {"data": "/d"}},
        "data": {"/d": {"unigram_loss": 6.0}},
    }
    runs = [
        {"variant": "a", "seed": 0, "status": "ok", "val_loss": 5.8},  # 96.7 %: at the floor
        {"variant": "b", "seed": 0, "status": "ok", "val_loss": 4.5},
        {"variant": "b", "seed": 1, "status": "failed", "val_loss": None},
    ]
    line = _unigram_lines(runs, record)[0]
    assert "(6.0000: the val tokens under the train split's add-one" in line
    assert "**1 of 2 runs ended above it or less than 5 % below it**: a seed 0 (5.8000)." in line
    assert _unigram_lines(runs[1:], record)[0].endswith(
        "every run ended below it, the highest at 75 % of it."
    )
    assert _unigram_lines(runs, {"configs": record["configs"]}) == []  # an older study.json


def test_a_study_run_several_at_a_time_says_its_step_times_share_the_machine() -> None:
    from attnlab.studies.kinds.lm_report import _shared_cpu_lines

    assert _shared_cpu_lines({"jobs": 1}) == [] and _shared_cpu_lines({}) == []
    line = _shared_cpu_lines({"jobs": 2})[0]
    assert line.startswith("**Step times.** The study (its last invocation) ran 2 runs at a time")
    assert line.endswith("compared side by side by `attnlab bench`.")
    clocked = _shared_cpu_lines({"jobs": 3, "wallclock": {"v-wallclock": {}}})[0]
    assert clocked.endswith("`attnlab bench` and by the wall-clock arm's interleaved timing below.")


def test_the_curves_show_the_convergence_window(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The figure shades the last 20 % of the budget most variants train for, and a second
    panel zooms into it: x from its start to the longest run, y over the window's values only."""
    from attnlab.studies.kinds import lm_report

    runs = []
    for variant, iters, offset in (("a", 100, 0.0), ("b", 100, 0.1), ("a-wallclock", 120, 0.0)):
        folder = tmp_path / variant
        folder.mkdir()
        lines = ["iter,val_loss", *(f"{i},{offset + 3 - i / 100}" for i in range(0, iters + 1, 20))]
        (folder / "metrics.csv").write_text("\n".join(lines) + "\n")
        runs.append({"variant": variant, "seed": 0, "status": "ok", "run_dir": str(folder)})
    figures = []
    save = lm_report.save_figure
    monkeypatch.setattr(
        lm_report, "save_figure", lambda fig, path: figures.append(fig) or save(fig, path)
    )
    assert lm_report.plot_curves(runs, tmp_path / "curves.png", "t", ["a", "b", "a-wallclock"])
    whole, window = figures[0].axes
    (span,) = [p for p in whole.patches if "convergence window" in p.get_label()]
    assert (span.get_x(), span.get_x() + span.get_width()) == pytest.approx((80.0, 100.0))
    assert "of 100 iterations" in span.get_label()
    assert window.get_xlim() == pytest.approx((80.0 - 0.8, 120.0 + 0.8))  # a 2 % margin
    # the window holds a-wallclock's 1.8 at 120 up to b's 2.3 at 80 (a 5 % margin each side)
    assert window.get_ylim() == pytest.approx((1.8 - 0.025, 2.3 + 0.025))
    assert whole.get_ylim()[1] > 2.9  # the whole descent (iteration 0 aside) stays on the left


def test_a_variant_whose_seeds_share_no_evaluation_is_left_out_of_the_curves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seeds evaluated at other iterations (a copied run logged otherwise) have no mean curve:
    that variant is left out, the others are drawn, and no figure is drawn from none."""
    from attnlab.studies.kinds import lm_report

    def run(variant: str, seed: int, first: int) -> dict[str, Any]:
        folder = tmp_path / f"{variant}{seed}"
        folder.mkdir()
        points = "".join(f"{i},{3 - i / 100}\n" for i in range(first, 101, 20))
        (folder / "metrics.csv").write_text("iter,val_loss\n" + points)
        return {"variant": variant, "seed": seed, "status": "ok", "run_dir": str(folder)}

    disjoint = [run("a", 0, 0), run("a", 1, 10)]
    figures = []
    save = lm_report.save_figure
    monkeypatch.setattr(
        lm_report, "save_figure", lambda fig, path: figures.append(fig) or save(fig, path)
    )
    assert not lm_report.plot_curves(disjoint, tmp_path / "none.png", "t", ["a", "b"])
    assert not (tmp_path / "none.png").exists()
    both = [*disjoint, run("b", 0, 0), run("b", 1, 0)]
    assert lm_report.plot_curves(both, tmp_path / "curves.png", "t", ["a", "b"])
    labels = {line.get_label().split(" ")[0] for ax in figures[0].axes for line in ax.get_lines()}
    assert labels == {"b"}


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("[scale.ci.variants.deep]\nseeds = 3\n",
         "scale ci variant deep: seeds 3 is more than the scale's 2"),
        ("[scale.ci.variants.deep]\nseeds = 0\n",
         "scale ci variant deep: seeds must be a whole number >= 1"),
        ("[scale.ci.variants.deep]\nsede = 1\n", "unknown study key 'sede'"),
    ],
)  # fmt: skip
def test_bad_per_variant_seeds_are_refused_when_read(
    tmp_path: Path, extra: str, message: str
) -> None:
    spec_file = tmp_path / "bad.toml"
    spec_file.write_text(_spec(extra))
    with pytest.raises(AttnlabError, match=message):
        load_spec(spec_file)


def test_kv_bias_paper_scale_is_the_seeds_main_table() -> None:
    """Issue #30's run 2: 6 layers, 3000 iterations on shakespeare_char; the main arms and the
    wall-clock-matched vanilla 5 seeds, the controls 3."""
    from attnlab.presets import get_preset
    from attnlab.train.spec import as_overrides, resolve

    spec = load_spec("kv-bias")
    seeds = list(range(spec.scale("paper").seeds))
    counts = {name: len(spec.seeds_of(name, "paper", seeds)) for name in spec.variants}
    main = ("vanilla-128", "kv-bias-112", "kv-bias-detached", "vanilla-128" + WALLCLOCK_SUFFIX)
    assert counts == {
        **{name: 5 for name in main},
        **{name: 3 for name in ("vanilla-112", "vanilla-7l", "vanilla-136")},
    }
    assert spec.scale("paper").data is None  # each preset's own data
    for name, variant in spec.variants.items():
        model, train = spec.layered(variant, "paper")
        run = resolve(variant.preset, None, as_overrides(model) + as_overrides(train), "unused")
        assert run.train.max_iters == 3000 and run.model.n_layer == (
            7 if name == "vanilla-7l" else 6
        )
        assert get_preset(variant.preset).data == {"corpus": "shakespeare_char"}, name


def test_converged_scales_plateau_settings() -> None:
    """The converged scales train longer than the cpu scales, with evaluations dense enough
    that the last 20 % holds several."""
    for name in ("gba-lm", "qkve", "gates"):
        spec = load_spec(name)
        cpu, converged = spec.scale("cpu"), spec.scale("converged")
        assert converged.train["max_iters"] > cpu.train["max_iters"]
        assert (
            converged.train["max_iters"] * output.LAST_FRACTION
            >= 3 * converged.train["eval_interval"]
        )
        assert converged.seeds >= 3 and converged.notes


def test_gates_study_measures_sink_and_sparsity(
    tmp_path: Path, tiny_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gate-position study's own analyses: the first-token mass of every arm and each
    gate's sparsity, from the seed-0 runs, as the report's sections and figures; a variant
    keeps its colour, marker and line style in every figure of the report."""
    from attnlab.analysis import gates as gate_analysis
    from attnlab.analysis import sink as sink_analysis
    from attnlab.studies.kinds import lm_report

    figures = {}  # each figure's last drawing
    for module in (gate_analysis, sink_analysis, lm_report):
        save = module.save_figure
        monkeypatch.setattr(
            module,
            "save_figure",
            lambda fig, path, save=save: (
                figures.__setitem__(Path(path).stem, fig) or save(fig, path)
            ),
        )
    out = tmp_path / "gates"
    arms = ["no-gate", "value-gate", "output-gate", "both"]
    done = run_study(load_spec("gates"), "ci", out, seeds=1, data=tiny_data, variants=arms)
    styles = {}  # variant -> every style it was drawn in, over the three figures' panels
    for name in ("curves", "sink", "sparsity"):
        for ax in figures[name].axes:
            for line in ax.get_lines():
                variant = line.get_label().split(" ")[0]
                if variant in arms:
                    style = (line.get_color(), line.get_marker(), line.get_linestyle())
                    styles.setdefault(variant, set()).add(style)
    assert sorted(styles) == sorted(arms)
    assert all(len(drawn) == 1 for drawn in styles.values()), styles
    assert len({next(iter(drawn)) for drawn in styles.values()}) == len(arms)
    analyses = done["study"]["analyses"]
    assert "error" not in analyses["sink"] and "error" not in analyses["sparsity"]
    sink = analyses["sink"]
    assert [label.split(" seed")[0] for label in sink["runs"]] == arms
    block = json.loads((out / "runs/no-gate/seed0/config.json").read_text())["model"]["block_size"]
    assert sink["uniform"] == pytest.approx(sum(1 / (t + 1) for t in range(1, block)) / (block - 1))
    assert all(0 < v < 1 for mass in sink["runs"].values() for heads in mass for v in heads)
    gates = {(r["run"].split(" seed")[0], r["gate"]) for r in analyses["sparsity"]["rows"]}
    assert gates == {
        ("value-gate", "value_gate"),
        ("output-gate", "output_gate"),
        ("both", "value_gate"),
        ("both", "output_gate"),
    }
    assert all(
        0 <= r["below_0.1"] <= 1 and math.isfinite(r["mean"]) for r in analyses["sparsity"]["rows"]
    )
    report = (out / "report.md").read_text()
    assert "## Attention sink (" in report and "## Gate sparsity (" in report
    assert "Unavailable" not in report
    for name in ("sink", "sparsity"):
        assert (out / "figures" / f"{name}.png").read_bytes()[:4] == b"\x89PNG"


def test_per_variant_seeds_in_a_table_spec_are_read() -> None:
    """The same rule from a JSON table (a spec recorded in study.json)."""
    spec = parse_spec(
        {
            "variants": {"a": {"preset": "shakespeare-char"}, "b": {"preset": "shakespeare-char"}},
            "comparisons": [{"baseline": "a", "variant": "b", "wallclock": True}],
            "scale": {"ci": {"seeds": 4, "variants": {"a": {"seeds": 2}}}},
        }
    )
    assert spec.seeds_of("a", "ci", [0, 1, 2, 3]) == [0, 1]
    assert spec.seeds_of("a" + WALLCLOCK_SUFFIX, "ci", [0, 1, 2, 3]) == [0, 1]  # its baseline's
    assert spec.seeds_of("b", "ci", [0, 1, 2, 3]) == [0, 1, 2, 3]
    assert spec.seeds_of("a", "ci", [0]) == [0]  # --seeds 1 caps every variant
