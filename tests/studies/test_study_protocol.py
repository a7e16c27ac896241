"""A study under the comparison protocol (attnlab.studies.protocol): an LR grid tuned per arm on
tuning seeds, two sizes and seeds set by power, checked against the formulas.

The runs are stood in for by a loss formula (``_fake_train``) so the whole study, its phases,
records and report run in seconds; the shipped protocol-demo trains for real in the slow test.
"""

from __future__ import annotations

import json
import math
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli
from scipy import stats
from test_bad_input import error_line
from test_folder_safety import snapshot

from attnlab.studies import protocol
from attnlab.studies.kinds import lm, lm_plan
from attnlab.studies.output import STUDY_JSON
from attnlab.studies.runner import plan_study, report_study, run_study
from attnlab.studies.spec import load_spec, load_spec_text

GRID = [3e-4, 1e-3, 3e-3]
TUNING = [100, 101]
PILOT, CAP, EFFECT = 3, 8, 0.02
SPEC = f"""
name = "proto"
description = "vanilla against K/V-bias under the protocol"
[variants.base]
preset = "shakespeare-char"
reference = 2.0
[variants.kv]
preset = "kv-bias-shakespeare-char"
reference = 1.96
[[comparisons]]
baseline = "base"
variant = "kv"
[scale.ci]
seeds = "auto"
smallest_effect = {EFFECT}
pilot_seeds = {PILOT}
max_seeds = {CAP}
lr_grid = {GRID}
tuning_seeds = {TUNING}
model = {{ n_layer = 1, n_head = 2, block_size = 16 }}
train = {{ max_iters = 4, eval_interval = 2, eval_iters = 2, batch_size = 4, warmup_iters = 1, device = "cpu" }}
[scale.ci.sizes.small.variants]
base = {{ model = {{ n_embd = 32 }} }}
kv = {{ model = {{ n_embd = 28 }} }}
[scale.ci.sizes.large.variants]
base = {{ model = {{ n_embd = 48 }} }}
kv = {{ model = {{ n_embd = 42 }} }}
"""
# each (arm, width)'s best LR in the stand-in's loss: kv at the small size beyond the grid's top
BEST = {("base", 32): 1e-3, ("base", 48): 1e-3, ("kv", 28): 1e-2, ("kv", 42): 1e-3}


def _fake_train(noise: float = 0.004):
    """A stand-in for train_one: a final loss quadratic in log10(lr / the arm's best), lower
    for a wider model, plus a seeded noise per run."""

    def train(job, threads=None) -> dict:
        arm = "kv" if job.preset.startswith("kv") else "base"
        width, lr = job.model["n_embd"], job.train["learning_rate"]
        rng = random.Random(f"{job.variant}:{job.seed}")
        loss = 2.0 + 0.05 * math.log10(lr / BEST[arm, width]) ** 2 - width / 1000
        loss += (0.006 if arm == "kv" else 0.0) + rng.gauss(0, noise)
        return {
            "variant": job.variant,
            "seed": job.seed,
            "run_dir": job.run_dir,
            "val_loss": loss,
            "best_val_loss": loss,
            "iters": 4,
            "wall_s": 0.1,
            "sec_per_step": 0.01,
            "params": 1000 * width,
            "status": "ok",
            "skipped": False,
            "seconds": 0.1,
        }

    return train


@pytest.fixture()
def spec(tmp_path: Path) -> Path:
    path = tmp_path / "proto.toml"
    path.write_text(SPEC)
    return path


@pytest.fixture(scope="module")
def done(tmp_path_factory: pytest.TempPathFactory, tiny_data: Path) -> dict:
    """The study run once, its runs stood in for; the tests only read it."""
    root = tmp_path_factory.mktemp("protocol")
    (root / "proto.toml").write_text(SPEC)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(lm, "train_one", _fake_train())
        result = run_study(
            load_spec(str(root / "proto.toml")), "ci", root / "study", data=tiny_data
        )
    return {**result, "folder": root / "study"}


def _loss(result: dict) -> dict[tuple[str, int], float]:
    return {(r["variant"], r["seed"]): r["val_loss"] for r in result["runs"]}


def _cells(result: dict) -> dict[tuple[str, str, float], str]:
    return {(c["arm"], c["size"], c["lr"]): c["cell"] for c in result["study"]["protocol"]["cells"]}


def test_the_tuned_lr_is_each_arms_argmin_over_the_grid(done: dict) -> None:
    loss, cells = _loss(done), _cells(done)
    kept = done["study"]["protocol"]
    assert kept["lr_grid"] == GRID
    best = {(b["arm"], b["size"]): b for b in kept["best_lr"]}
    assert len(best) == 4
    for (arm, size), chosen in best.items():
        means = {lr: np.mean([loss[cells[arm, size, lr], s] for s in TUNING]) for lr in GRID}
        assert chosen["lr"] == min(means, key=means.get)
    # the stand-in's optimum: 1e-3 inside the grid, kv at the small size past its top edge
    assert best["kv", "small"]["lr"] == 3e-3 and best["kv", "small"]["edge_of_grid"] is True
    assert best["base", "small"]["lr"] == 1e-3 and best["base", "small"]["edge_of_grid"] is False


def test_the_edge_of_the_grid_is_flagged_on_its_comparisons(done: dict) -> None:
    flags = {(c["size"], c["lr_basis"]): c["edge_of_grid"] for c in done["comparisons"]}
    assert flags == {
        ("small", "tuned"): True,  # kv's best at the grid's top: no verdict
        ("large", "tuned"): False,
        ("small", "recipe"): None,  # at the recipe's LR the grid does not enter
        ("large", "recipe"): None,
    }


def test_tuning_and_evaluation_seeds_are_disjoint(done: dict) -> None:
    kept = done["study"]["protocol"]
    evaluation = kept["evaluation_seeds"]
    assert evaluation == list(range(kept["seeds"]["n"]))
    assert not set(evaluation) & set(TUNING)
    for c in done["comparisons"]:
        assert c["seeds"] == evaluation and c["n"] == len(evaluation)
    cells = _cells(done)
    best = {(b["arm"], b["size"]): b["lr"] for b in kept["best_lr"]}
    for run in done["runs"]:  # a cell neither tuned nor recipe trains the tuning seeds only
        arm, size, lr = next(k for k, v in cells.items() if v == run["variant"])
        if run["seed"] not in TUNING:
            assert lr in (best[arm, size], 1e-3), run


def _needed(effect: float, sd: float) -> int:
    """The fewest pairs whose two-sided paired t-test at α = 0.05 has power 0.8 (scipy's
    noncentral t directly)."""
    for n in range(2, 10_000):
        crit = stats.t.ppf(0.975, n - 1)
        nc = effect * math.sqrt(n) / sd
        far = stats.nct.cdf(-crit, n - 1, nc)  # NaN in scipy where it underflows
        if stats.nct.sf(crit, n - 1, nc) + (far if math.isfinite(far) else 0.0) >= 0.8:
            return n
    raise AssertionError("unreachable")


def test_n_follows_from_the_pilots_spread(done: dict) -> None:
    loss, cells = _loss(done), _cells(done)
    kept = done["study"]["protocol"]
    best = {(b["arm"], b["size"]): b["lr"] for b in kept["best_lr"]}
    wanted = [PILOT]
    for size in ("small", "large"):
        kv, base = cells["kv", size, best["kv", size]], cells["base", size, best["base", size]]
        diffs = [loss[kv, s] - loss[base, s] for s in range(PILOT)]
        wanted.append(_needed(EFFECT, float(np.std(diffs, ddof=1))))
    assert kept["seeds"]["n"] == min(max(wanted), CAP)
    assert kept["seeds"]["capped"] == (max(wanted) > CAP)
    assert [s["needed"] for s in kept["seeds"]["spreads"]] == wanted[1:]


def test_each_comparison_carries_what_a_verdict_needs(done: dict) -> None:
    loss = _loss(done)
    tuned = [c for c in done["comparisons"] if c["lr_basis"] == "tuned"]
    p = [c["p"] for c in tuned]
    for c in done["comparisons"]:
        v = [loss[c["cells"]["variant"], s] for s in c["seeds"]]
        b = [loss[c["cells"]["baseline"], s] for s in c["seeds"]]
        res = stats.ttest_rel(v, b)
        assert c["mean_diff"] == pytest.approx(np.mean(np.subtract(v, b)))
        assert c["ci95"] == pytest.approx(list(res.confidence_interval()))
        assert c["claimed_diff"] == pytest.approx(1.96 - 2.0)
        assert c["sizes"] == 2 and c["few_seeds"] == (c["n"] < 5)
        # the Holm interval excludes 0 exactly when Holm's p is below 0.05
        low, high = c["ci95_holm"]
        assert (low > 0 or high < 0) == (c["p_holm"] < 0.05)
        assert low <= c["ci95"][0] and high >= c["ci95"][1]
    order = sorted(range(2), key=lambda i: p[i])
    assert tuned[order[0]]["p_holm"] == pytest.approx(min(1.0, 2 * p[order[0]]))


def test_the_trend_over_sizes_is_the_mean_per_seed_slope(done: dict) -> None:
    loss = _loss(done)
    trend = next(t for t in done["study"]["protocol"]["trend"] if t["lr_basis"] == "tuned")
    rows = {c["size"]: c for c in done["comparisons"] if c["lr_basis"] == "tuned"}
    x = {
        z: math.log10((r["params"]["baseline"] + r["params"]["variant"]) / 2)
        for z, r in rows.items()
    }

    def d(z: str, s: int) -> float:
        return loss[rows[z]["cells"]["variant"], s] - loss[rows[z]["cells"]["baseline"], s]

    slopes = [(d("large", s) - d("small", s)) / (x["large"] - x["small"]) for s in trend["seeds"]]
    assert trend["slope_per_decade"] == pytest.approx(np.mean(slopes))
    half = stats.t.ppf(0.975, len(slopes) - 1) * np.std(slopes, ddof=1) / math.sqrt(len(slopes))
    assert trend["slope_ci95"] == pytest.approx([np.mean(slopes) - half, np.mean(slopes) + half])


def test_the_report_shows_the_protocol_and_its_figures(done: dict) -> None:
    text = (done["folder"] / "report.md").read_text()
    for part in ("## Learning-rate tuning", "## Seeds", "## Gain against scale", "fixed"):
        assert part in text
    assert "Best LR at an edge of the grid: kv (small)" in text
    for figure in ("lr.png", "scale.png"):
        assert (done["folder"] / "figures" / figure).is_file()


def test_the_choices_stay_fixed_when_the_study_is_run_again(
    done: dict, spec: Path, tmp_path: Path, tiny_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No peeking: a rerun whose pilot would now ask for other seeds keeps n and the LRs, and
    a report made again from the records alone keeps them too."""
    out = tmp_path / "study"
    shutil.copytree(done["folder"], out)
    before = done["study"]["protocol"]
    monkeypatch.setattr(lm, "train_one", _fake_train(noise=0.05))
    after = run_study(load_spec(str(spec)), "ci", out, data=tiny_data)["study"]["protocol"]
    assert after["seeds"]["n"] == before["seeds"]["n"]
    assert after["best_lr"] == before["best_lr"]
    report_study(load_spec(str(spec)), out)
    record = json.loads((out / STUDY_JSON).read_text())
    assert record["protocol"]["seeds"]["n"] == before["seeds"]["n"]


def test_a_study_stopped_after_tuning_resumes_at_its_evaluation(
    spec: Path, tmp_path: Path, tiny_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trained: list[tuple[str, int]] = []
    fake = _fake_train()

    def tuning_only(job, threads=None) -> dict:
        if job.seed not in TUNING:
            raise KeyboardInterrupt  # the study stopped as its evaluation began
        trained.append((job.variant, job.seed))
        return fake(job)

    monkeypatch.setattr(lm, "train_one", tuning_only)
    out = tmp_path / "study"
    with pytest.raises(KeyboardInterrupt):
        run_study(load_spec(str(spec)), "ci", out, data=tiny_data)
    kept = json.loads((out / STUDY_JSON).read_text())["protocol"]
    assert len(trained) == 2 * 2 * len(GRID) * len(TUNING)
    assert kept["best_lr"] and all(b["lr"] in GRID for b in kept["best_lr"])
    monkeypatch.setattr(lm, "train_one", fake)
    result = run_study(load_spec(str(spec)), "ci", out, data=tiny_data)
    assert result["study"]["protocol"]["seeds"]["n"] is not None
    assert {c["n"] for c in result["comparisons"]} == {result["study"]["protocol"]["seeds"]["n"]}


def test_the_plan_counts_the_tuning_runs(
    spec: Path, tmp_path: Path, tiny_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lm_plan, "step_seconds", lambda job: 0.01)
    plan = plan_study(load_spec(str(spec)), "ci", tmp_path / "study", data=tiny_data)
    tuning = [r for r in plan["rows"] if r["seed"] in TUNING]
    assert len(tuning) == plan["protocol"]["tuning_runs"] == 2 * 2 * len(GRID) * len(TUNING)
    # evaluation: each arm and size at the recipe's LR and at its tuned one, up to the cap
    assert plan["protocol"]["evaluation_runs"] == 2 * 2 * 2 * CAP
    assert not (tmp_path / "study").exists()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            ("tuning_seeds = [100, 101]", "tuning_seeds = [100, 2]"),
            "tuning seed 2 is also an evaluation seed (0 .. 7); tuning seeds must be disjoint from them",
        ),
        (
            ("lr_grid = [0.0003, 0.001, 0.003]", "lr_grid = [0.001, 0.003]"),
            "lr_grid must be a list of 3 or more different learning rates > 0, not [0.001, 0.003]",
        ),
        (("pilot_seeds = 3\n", ""), 'seeds = "auto" needs pilot_seeds'),
        (
            (
                "[scale.ci.sizes.large.variants]",
                "[scale.ci.sizes.large.variants.nobody]\n[scale.ci.sizes.huge.variants]",
            ),
            "size large: overrides unknown variant 'nobody'",
        ),
    ],
    ids=["overlap", "short-grid", "no-pilot", "unknown-arm"],
)
def test_a_bad_protocol_is_refused_in_one_line(
    change: tuple[str, str], message: str, tmp_path: Path
) -> None:
    text = SPEC
    assert change[0] in text
    path = tmp_path / "bad.toml"
    path.write_text(text.replace(change[0], change[1]))
    before = snapshot(tmp_path)
    p = run_cli("study", str(path), "--out", str(tmp_path / "out"))
    assert message in error_line(p, "study")
    assert snapshot(tmp_path) == before


def test_the_kv_bias_fair_preset_is_the_protocol_the_issue_asks_for() -> None:
    scale = load_spec("kv-bias-4l").scale("fair")
    p = scale.protocol
    assert p is not None and p.auto and p.max_seeds == 16
    grid = list(p.lr_grid)
    assert 1e-3 in grid and grid.index(1e-3) >= 2 and len(grid) - grid.index(1e-3) >= 3
    assert np.allclose(np.diff(np.log10(grid)), 0.25, atol=0.03)  # half a decade in two steps
    assert set(p.sizes) == {"small", "large"}
    assert min(abs(e) for e in p.smallest_effect) == pytest.approx(-math.log(1 - 0.006), rel=1e-2)
    assert not set(p.tuning_seeds) & set(range(p.max_seeds))


def test_a_spec_without_protocol_keys_expands_to_itself() -> None:
    spec = load_spec("kv-bias-4l")
    assert spec.scale("ci").protocol is None
    assert protocol.expand(spec, "ci", None) is spec
    assert load_spec_text(spec.text, spec.source).variants.keys() == spec.variants.keys()


@pytest.mark.slow
def test_the_shipped_protocol_demo_runs_from_one_command(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    p = run_cli("study", "protocol-demo", "--out", str(out), timeout=1800)
    assert p.returncode == 0, p.stderr
    record = json.loads((out / STUDY_JSON).read_text())["protocol"]
    assert record["best_lr"] and record["seeds"]["n"] is not None
    assert (out / "figures" / "lr.png").is_file() and (out / "figures" / "scale.png").is_file()
