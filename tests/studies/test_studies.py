"""Studies: the kv-bias ci study end to end, statistics recomputed by hand, resume, failures."""

from __future__ import annotations

import ast
import json
import math
import re
from pathlib import Path

import pytest
from conftest import ROOT, fixed_pace, run_cli
from scipy import stats

from attnlab.bench.overhead import bench_variants
from attnlab.errors import AttnlabError
from attnlab.studies import output
from attnlab.studies import spec as spec_format
from attnlab.studies.kinds import KINDS
from attnlab.studies.output import StudyDir
from attnlab.studies.progress import duration
from attnlab.studies.runner import INVOCATION_FIELDS, run_study
from attnlab.studies.spec import list_studies, load_spec, parse_spec

KV_VARIANTS = {
    "vanilla-128",
    "kv-bias-112",
    "kv-bias-detached",
    "vanilla-112",
    "vanilla-7l",
    "vanilla-136",
    "vanilla-128-wallclock",
}
KV_PAIR = ("vanilla-128", "kv-bias-112")  # the wall-clock match's baseline and mechanism
RUN_KEYS = {"variant", "seed", "val_loss", "iters", "wall_s", "status"}
COMPARISON_KEYS = {
    "baseline",
    "variant",
    "n",
    "t",
    "p",
    "p_holm",
    "mean_diff",
    "ppl_change_pct",
    "wins",
}


def _holm_by_hand(p: list[float]) -> list[float]:
    order = sorted(range(len(p)), key=lambda i: p[i])
    out, running = [0.0] * len(p), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(p) - rank) * p[i]))
        out[i] = running
    return out


def _check_statistics(results: dict) -> None:
    """Every comparison recomputed from the runs: paired t by hand and by scipy, Holm by hand."""
    loss = {
        (r["variant"], r["seed"]): r["val_loss"] for r in results["runs"] if r["status"] == "ok"
    }
    for c in results["comparisons"]:
        seeds = sorted(s for (v, s) in loss if v == c["variant"] and (c["baseline"], s) in loss)
        v = [loss[c["variant"], s] for s in seeds]
        b = [loss[c["baseline"], s] for s in seeds]
        d = [x - y for x, y in zip(v, b, strict=True)]
        n = len(d)
        mean_d = sum(d) / n
        sd = math.sqrt(sum((x - mean_d) ** 2 for x in d) / (n - 1))
        t = mean_d / (sd / math.sqrt(n))
        assert c["n"] == n == 2
        assert c["t"] == pytest.approx(t, rel=1e-9)
        assert c["t"] == pytest.approx(stats.ttest_rel(v, b).statistic, rel=1e-9)
        assert c["p"] == pytest.approx(2 * stats.t.sf(abs(t), n - 1), rel=1e-9)
        assert c["mean_diff"] == pytest.approx(mean_d)
        assert c["ppl_change_pct"] == pytest.approx(
            100 * (math.exp(sum(v) / n) / math.exp(sum(b) / n) - 1)
        )
        assert c["wins"] == f"{sum(x < y for x, y in zip(v, b, strict=True))}/{n}"
    holm = _holm_by_hand([c["p"] for c in results["comparisons"]])
    assert [c["p_holm"] for c in results["comparisons"]] == pytest.approx(holm, rel=1e-9)


def test_gba_lm_study_analyses_gates_entropy_and_hull(tmp_path: Path, tiny_data: Path) -> None:
    """The paper's Figures 3-5 as the study's own analyses of its seed-0 runs."""
    out = tmp_path / "gba"
    done = run_study(
        load_spec("gba-lm"), "ci", out, seeds=1, data=tiny_data, variants=["standard", "boosted"]
    )
    hull = done["study"]["analyses"]["hull"]
    assert "error" not in hull
    assert hull["measured"] == 1 * 1 * 4 * 4  # sequences x layers x heads x positions
    assert 0 <= hull["outside"] <= hull["measured"]
    report = (out / "report.md").read_text()
    for title in ("Boosting gates", "Attention entropy", "Leaving the value hull"):
        assert f"## {title} (" in report
    assert "Unavailable" not in report
    assert all((out / "figures" / f"{n}.png").is_file() for n in ("gates", "entropy", "hull"))
    # resumed from its published copy (records, no weights) elsewhere, it keeps the analyses
    StudyDir(out).publish(tmp_path / "copy")
    again = run_study(
        load_spec("gba-lm"),
        "ci",
        tmp_path / "copy",
        seeds=1,
        data=tiny_data,
        variants=["standard", "boosted"],
    )
    recorded = json.loads((out / "study.json").read_text())["analyses"]
    assert again["study"]["analyses"] == recorded and "error" not in recorded["gates"]
    assert "Unavailable" not in (tmp_path / "copy" / "report.md").read_text()


def test_kv_bias_ci_study_end_to_end_and_resume(tmp_path: Path, tiny_data: Path) -> None:
    out = tmp_path / "kv"
    run_study(load_spec("kv-bias"), "ci", out, data=tiny_data)

    results = json.loads((out / "results.json").read_text())
    assert set(results) == {"runs", "comparisons"}
    runs = results["runs"]
    assert {(r["variant"], r["seed"]) for r in runs} == {
        (v, s) for v in KV_VARIANTS for s in (0, 1)
    }
    assert all(set(r) >= RUN_KEYS and r["status"] == "ok" for r in runs), runs
    for r in runs:  # paired by seed: the train seed of every variant's run s is s
        config = json.loads((Path(r["run_dir"]) / "config.json").read_text())
        assert config["train"]["seed"] == r["seed"]
    assert all(set(c) >= COMPARISON_KEYS for c in results["comparisons"])
    # the eight comparisons of the spec, then the wall-clock-matched one
    assert [(c["variant"], c["baseline"]) for c in results["comparisons"]][-1] == (
        "kv-bias-112",
        "vanilla-128-wallclock",
    )
    assert len(results["comparisons"]) == 9
    _check_statistics(results)

    # The wall-clock budget: mechanism iters * the step-time ratio timed side by side on both
    # arms' models; the report gives the runs' own logged ratio beside it for comparison.
    clock = json.loads((out / "study.json").read_text())["wallclock"]["vanilla-128-wallclock"]
    assert clock["reps"] == 30 and clock["threads"] >= 1
    assert clock["ratio_iqr"][0] <= clock["ratio"] <= clock["ratio_iqr"][1]
    sps = {v: [r["sec_per_step"] for r in runs if r["variant"] == v] for v in KV_PAIR}
    logged = sum(sps[KV_PAIR[1]]) / sum(sps[KV_PAIR[0]])
    assert f"The runs' own logged step times give {logged:.3f}x" in (out / "report.md").read_text()
    # what the runs cost in all, from their own training times
    walls = [r["wall_s"] for r in runs]
    assert (
        f"**Training time.** The {len(runs)} finished runs trained for {duration(sum(walls))} in "
        f"all, {duration(min(walls))} to {duration(max(walls))} a run: each run's time in its "
        "training steps, evaluations and start-up aside (results.csv's wall_s)."
    ) in (out / "report.md").read_text()
    budget = round(20 * clock["ratio"])
    assert clock["iters"] == budget
    assert {r["iters"] for r in runs if r["variant"] == "vanilla-128-wallclock"} == {budget}
    assert {r["iters"] for r in runs if r["variant"] != "vanilla-128-wallclock"} == {20}

    report = (out / "report.md").read_text()
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", report)
    assert "figures/curves.png" in images and "figures/paired.png" in images
    assert all(
        (out / img).is_file() and (out / img).read_bytes()[:4] == b"\x89PNG" for img in images
    )
    # the study's own analyses of the seed-0 runs (the seed's section 8)
    assert "## Per-position loss (vanilla-128 vs kv-bias-112" in report and "## Name test" in report
    assert "Unavailable" not in report
    assert "vanilla-128-wallclock" in report and "kv-bias-112 vs vanilla-128-wallclock" in report
    # the wall-clock arm's stretched schedule (its cosine ends with its budget), and a verdict
    # per comparison
    assert f"Its schedule as its runs train it: {budget} iterations, warmup 2, cosine" in report
    assert f"at iteration {budget} (vanilla-128: 20 iterations" in report
    assert all(f"- **{c['variant']} vs {c['baseline']}: " in report for c in results["comparisons"])
    # each variant's shape as it trained at this scale (the descriptions name the seed's widths)
    table = report.split("## Variants", 1)[1].split("\n## ", 1)[0]
    shapes = {
        cells[0].removeprefix("| "): cells[2]
        for cells in (line.split(" | ") for line in table.splitlines())
        if cells[0].startswith(("| vanilla", "| kv-bias"))
    }
    assert shapes["vanilla-128"] == "2 × 128" and shapes["kv-bias-112"] == "2 × 112"
    assert shapes["vanilla-7l"] == "3 × 128"
    lines = (out / "results.csv").read_text().splitlines()
    assert len(lines) == 1 + len(runs)

    # Resume: finished runs are skipped (summaries untouched); a run with latest/ but no summary
    # is resumed from its checkpoint, which is already at max_iters, so it ends with the same loss.
    summaries = sorted((out / "runs").glob("*/seed*/summary.json"))
    assert len(summaries) == 14
    mtimes = {p: p.stat().st_mtime_ns for p in summaries}
    resumed = out / "runs" / "vanilla-112" / "seed1" / "summary.json"
    resumed.unlink()
    again = run_study(load_spec("kv-bias"), "ci", out, data=tiny_data)
    assert again["study"]["retrained"] == 1
    assert all(p.stat().st_mtime_ns == t for p, t in mtimes.items() if p != resumed)
    assert resumed.is_file()

    def key(rs: list[dict]) -> list[tuple]:
        return sorted((r["variant"], r["seed"], r["val_loss"], r["iters"]) for r in rs)

    assert key(again["runs"]) == key(runs)


FAILING_STUDY = """
name = "one-bad"
description = "a good variant and one that fails once it trains (a valid config, checked first)"
[variants.good]
preset = "shakespeare-char"
[variants.bad]
preset = "shakespeare-char"
model = { vocab_size = 5 }
[[comparisons]]
baseline = "good"
variant = "bad"
[scale.ci]
seeds = 1
model = { n_layer = 1, block_size = 16, n_embd = 32 }
train = { max_iters = 4, eval_interval = 2, eval_iters = 1, batch_size = 4, warmup_iters = 1, device = "cpu" }
"""


def test_failing_run_is_recorded_and_others_finish(tmp_path: Path, tiny_data: Path) -> None:
    spec_file = tmp_path / "one-bad.toml"
    spec_file.write_text(FAILING_STUDY)
    out = tmp_path / "study"
    proc = run_cli(
        "study",
        str(spec_file),
        "--preset",
        "ci",
        "--out",
        str(out),
        "--data",
        str(tiny_data),
        "--seeds",
        "2",
        "--jobs",
        "2",
    )
    assert proc.returncode == 1, proc.stderr  # finished, with failures
    runs = json.loads((out / "results.json").read_text())["runs"]
    status = {(r["variant"], r["seed"]): r["status"] for r in runs}
    assert status == {
        ("good", 0): "ok",
        ("good", 1): "ok",
        ("bad", 0): "failed",
        ("bad", 1): "failed",
    }
    bad = [r for r in runs if r["variant"] == "bad"]
    assert all("vocab_size=5 is smaller than the data's" in r["error"] for r in bad)
    good = [r for r in runs if r["variant"] == "good"]
    assert all(r["iters"] == 4 and math.isfinite(r["val_loss"]) for r in good)
    comparison = json.loads((out / "results.json").read_text())["comparisons"][0]
    assert comparison["n"] == 0 and comparison["wins"] == "0/0"
    assert "bad seed 0" in (out / "report.md").read_text()


THREE_ARMS = """
name = "three-arms"
description = "vanilla against K/V-bias (also wall-clock matched) and a wider vanilla, tiny"
[variants.base]
preset = "shakespeare-char"
[variants.kv]
preset = "kv-bias-shakespeare-char"
model = { n_embd = 24 }
[variants.wide]
preset = "shakespeare-char"
model = { n_embd = 40 }
[[comparisons]]
baseline = "base"
variant = "kv"
wallclock = true
[[comparisons]]
baseline = "base"
variant = "wide"
[scale.ci]
seeds = 2
model = { n_layer = 1, n_head = 2, n_embd = 32, block_size = 16 }
train = { max_iters = 4, eval_interval = 2, eval_iters = 1, batch_size = 4, warmup_iters = 1, device = "cpu" }
"""


def _tree(folder: Path) -> dict[str, int]:
    """Relative path -> mtime (ns) of every file under ``folder``."""
    return {
        str(p.relative_to(folder)): p.stat().st_mtime_ns for p in folder.rglob("*") if p.is_file()
    }


def test_variants_restricts_training_not_the_results(
    tmp_path: Path, tiny_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--variants base,wide` on a finished study rewrote results.json, results.csv, report.md
    and study.json with only base and wide: kv's rows and comparisons vanished, Holm ran over
    one comparison, and the wall-clock budget was dropped from study.json (`wallclock: {}`), so
    a later full run timed it again and refused its own base-wallclock runs."""
    from attnlab.studies.kinds import lm, lm_report

    monkeypatch.setattr(lm, "time_steps", fixed_pace())  # the budget is 6 iterations, at once
    monkeypatch.setattr(lm_report, "plot_curves", lambda *args: False)  # figures: not checked here
    spec_file = tmp_path / "three-arms.toml"
    spec_file.write_text(THREE_ARMS)
    out = tmp_path / "study"
    full = run_study(load_spec(str(spec_file)), "ci", out, data=tiny_data)
    every = {(v, s) for v in ("base", "kv", "wide", "base-wallclock") for s in (0, 1)}
    assert {(r["variant"], r["seed"]) for r in full["runs"]} == every
    assert all(r["status"] == "ok" for r in full["runs"])
    pairs = [("base", "kv"), ("base", "wide"), ("base-wallclock", "kv")]
    assert [(c["baseline"], c["variant"]) for c in full["comparisons"]] == pairs
    assert full["study"]["wallclock"]["base-wallclock"]["iters"] == 6

    def rows(results: dict) -> list[tuple]:
        return sorted((r["variant"], r["seed"], r["val_loss"], r["iters"]) for r in results["runs"])

    # wide seed 0 to finish again (its checkpoint is at max_iters: the same loss); kv and
    # base-wallclock are not selected and must be neither trained nor dropped
    (out / "runs/wide/seed0/summary.json").unlink()
    unselected = {v: _tree(out / "runs" / v) for v in ("kv", "base-wallclock")}
    lines: list[str] = []
    part = run_study(
        load_spec(str(spec_file)),
        "ci",
        out,
        data=tiny_data,
        variants=["base", "wide"],
        progress=lines.append,
    )
    assert part["study"]["retrained"] == 1
    assert {v: _tree(out / "runs" / v) for v in unselected} == unselected
    results = json.loads((out / "results.json").read_text())
    assert rows(results) == rows(full)
    assert results["comparisons"] == json.loads(json.dumps(full["comparisons"]))
    _check_statistics(results)  # Holm over all three comparisons
    csv_rows = (out / "results.csv").read_text().splitlines()[1:]
    assert sorted(tuple(r.split(",")[:2]) for r in csv_rows) == sorted(
        (v, str(s)) for v, s in every
    )
    study = json.loads((out / "study.json").read_text())
    assert study["wallclock"] == json.loads(json.dumps(full["study"]["wallclock"]))
    assert set(study["variants"]) == {"base", "kv", "wide", "base-wallclock"}
    report = (out / "report.md").read_text()
    assert "kv vs base-wallclock" in report and "Partial" not in report
    # every run considered is counted: the two trained variants' and the others' finished runs
    assert len(lines) == 8 and all(
        line.startswith(tuple(f"[{k}/8]" for k in range(1, 9))) for line in lines
    )

    # An unfinished run of an unselected variant is left alone and absent from the results.
    (out / "runs/kv/seed1/summary.json").unlink()
    before = _tree(out / "runs/kv")
    lines.clear()
    again = run_study(
        load_spec(str(spec_file)),
        "ci",
        out,
        data=tiny_data,
        variants=["base", "wide"],
        progress=lines.append,
    )
    assert again["study"]["retrained"] == 0
    assert _tree(out / "runs/kv") == before
    assert {(r["variant"], r["seed"]) for r in again["runs"]} == every - {("kv", 1)}
    assert [(c["baseline"], c["variant"], c["n"]) for c in again["comparisons"]] == [
        ("base", "kv", 1),
        ("base", "wide", 2),
        ("base-wallclock", "kv", 1),
    ]
    assert len(lines) == 7 and lines[-1].startswith("[7/7]")
    assert "base-wallclock" in json.loads((out / "study.json").read_text())["wallclock"]
    # the subset command would not train kv: the report says how to finish the study
    assert (
        "Rerunning the command above without --variants continues the study"
        in (out / "report.md").read_text()
    )

    # The full study later resumes kv seed 1 with the kept budget: nothing is refused.
    done = run_study(load_spec(str(spec_file)), "ci", out, data=tiny_data)
    assert done["study"]["retrained"] == 1
    assert rows(done) == rows(full)

    # study.json keeps every invocation, the one that trained nothing too, this one last
    held = json.loads((out / "study.json").read_text())["invocations"]
    assert [i["retrained"] for i in held] == [8, 1, 0, 1]
    assert held[-1] == {k: done["study"][k] for k in INVOCATION_FIELDS}
    assert all(i["elapsed_s"] > 0 and i["git_commit"] == held[0]["git_commit"] for i in held)
    total = sum(i["elapsed_s"] for i in held)
    assert f"; {total:.0f} s over its 4 invocations" in (out / "report.md").read_text()


def test_invocations_begin_with_a_study_json_written_before_them(
    tmp_path: Path, tiny_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A study.json written before ``invocations`` existed describes one invocation at its top
    level: a resumed study lists that one first instead of forgetting it."""
    from attnlab.studies.kinds import lm, lm_report

    monkeypatch.setattr(lm, "time_steps", fixed_pace())
    monkeypatch.setattr(lm_report, "plot_curves", lambda *args: False)
    spec_file = tmp_path / "three-arms.toml"
    spec_file.write_text(THREE_ARMS)
    out = tmp_path / "study"
    run_study(load_spec(str(spec_file)), "ci", out, data=tiny_data, command="first")
    record = json.loads((out / "study.json").read_text())
    for key in ("invocations", "started"):
        del record[key]
    record["elapsed_s"] = 1234.0
    (out / "study.json").write_text(json.dumps(record))
    (out / "runs/wide/seed0/summary.json").unlink()
    again = run_study(load_spec(str(spec_file)), "ci", out, data=tiny_data, command="second")
    first, second = again["study"]["invocations"]
    assert first == {**{k: record.get(k) for k in INVOCATION_FIELDS}, "started": None}
    assert (first["command"], first["elapsed_s"], first["retrained"]) == ("first", 1234.0, 8)
    assert (second["command"], second["retrained"]) == ("second", 1)


def test_shipped_specs_resolve_at_every_preset() -> None:
    """Every variant of every shipped study builds valid configs at every scale it has (ci, cpu
    and paper at least)."""
    from attnlab.train.spec import as_overrides, resolve

    names = {name for name, _ in list_studies()}
    assert names == {
        "kv-bias",
        "kv-bias-4l",
        "qkve",
        "gba-lm",
        "gba-retrieval",
        "overhead",
        "gates",
        "protocol-demo",
    }
    for name in names:
        spec = load_spec(name)
        least = {"ci"} if name == "protocol-demo" else {"ci", "cpu", "paper"}  # a demo: ci only
        assert least <= set(spec.scales) <= set(spec_format.SCALES), name
        for preset in spec.scales:
            for variant in spec.variants.values():
                model, train = spec.layered(variant, preset)
                resolve(
                    variant.preset,
                    None,
                    as_overrides(model) + as_overrides(train),
                    "unused-data-dir",
                )


def test_spec_errors_are_one_line() -> None:
    with pytest.raises(AttnlabError, match="comparison variant 'nope' is not a variant"):
        parse_spec(
            {
                "variants": {"a": {"preset": "shakespeare-char"}},
                "comparisons": [{"baseline": "a", "variant": "nope"}],
                "scale": {"ci": {"seeds": 1}},
            }
        )
    with pytest.raises(AttnlabError, match="unknown study"):
        load_spec("no-such-study")
    with pytest.raises(AttnlabError, match="has no preset 'cpu'"):
        parse_spec(
            {"variants": {"a": {"preset": "shakespeare-char"}}, "scale": {"ci": {"seeds": 1}}}
        ).scale("cpu")


def test_a_comparison_of_a_variant_with_itself_is_refused_when_read(tmp_path: Path) -> None:
    """baseline = variant trained the arm and reported a comparison of zero differences."""
    from test_bad_input import error_line
    from test_folder_safety import snapshot

    spec_file = tmp_path / "self.toml"
    spec_file.write_text(FAILING_STUDY.replace('variant = "bad"', 'variant = "good"'))
    assert 'variant = "bad"' not in spec_file.read_text()  # its one comparison: good vs good
    before = snapshot(tmp_path)
    proc = run_cli("study", str(spec_file), "--preset", "ci", "--out", str(tmp_path / "out"))
    assert error_line(proc, "study") == (
        f"{spec_file}: comparison of 'good' against baseline 'good' compares a variant with "
        "itself; name two different variants"
    )
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ('description = "a', 'description = 5 # "a', "{f}: description must be a string, not 5"),
        ('name = "one-bad"', "name = 42", "{f}: name must be a string, not 42"),
        ("[scale.ci]", "[scale.ci]", None),  # the spec as it is: read without a word
        ("[variants.good]", "[variants.good]\ndescription = 7",
         "{f} variant good: description must be a string, not 7"),
        ("[variants.good]", '[variants.good]\nreference = "abc"',
         "{f} variant good: reference must be a number, not 'abc'"),
        ('variant = "bad"', 'variant = "bad"\nwallclock = "yes"',
         "{f} comparison: wallclock must be true or false, not 'yes'"),
        ("seeds = 1", "seeds = 1\nnotes = 5", "{f} scale ci: notes must be a string, not 5"),
        ("seeds = 1", "seeds = 1\ndata = 5",
         "{f} scale ci: data must be a string or a table, not 5"),
    ],
)  # fmt: skip
def test_spec_values_of_the_wrong_type_are_refused_when_read(
    tmp_path: Path, old: str, new: str, message: str | None
) -> None:
    """A description of 5 or a reference of "abc" crashed the report once the first run had
    trained (a traceback, a study folder without report.md); wallclock = "yes" was taken for
    true and trained the wall-clock arm; name = 42 and notes = 5 went into the report."""
    spec_file = tmp_path / "typed.toml"
    spec_file.write_text(FAILING_STUDY.replace(old, new, 1))
    if message is None:
        assert load_spec(spec_file).name == "one-bad"
        return
    with pytest.raises(AttnlabError) as err:
        load_spec(spec_file)
    assert str(err.value) == message.format(f=spec_file)


def test_a_missing_data_folder_in_a_spec_is_refused_before_the_study_starts(tmp_path: Path):
    """Every run failed with "meta.json: not found" (exit 1) and a study folder was left."""
    from test_bad_input import error_line
    from test_folder_safety import snapshot

    spec_file = tmp_path / "nodata.toml"
    missing = tmp_path / "nodata"
    spec_file.write_text(FAILING_STUDY.replace("seeds = 1", f"seeds = 1\ndata = '{missing}'"))
    before = snapshot(tmp_path)
    proc = run_cli("study", str(spec_file), "--preset", "ci", "--out", str(tmp_path / "out"))
    assert error_line(proc, "study") == (
        f"{spec_file}: scale ci: data: {missing}/meta.json: not found (run `attnlab prepare` first)"
    )
    assert snapshot(tmp_path) == before


BAD_SPECS = [
    ({"preset": 5}, {}, "variant 'a': preset must be a name (a string)"),
    ({"preset": "nope"}, {}, "variant 'a': unknown preset 'nope' (known: "),
    (
        {"preset": "shakespeare-char", "model": {"n_layr": 2}},
        {},
        "variant a: unknown model key 'n_layr'; did you mean 'n_layer'?",
    ),
    (
        {"preset": "shakespeare-char"},
        {"train": {"lr": 1e-3}},
        "scale ci: unknown train key 'lr'; did you mean 'learning_rate'?",
    ),
    ({"preset": "shakespeare-char"}, {"seeds": "x"}, "scale ci: seeds must be a whole number >= 1"),
    ({"preset": "shakespeare-char"}, {"seeds": 0}, "scale ci: seeds must be a whole number >= 1"),
]


@pytest.mark.parametrize(("variant", "scale", "message"), BAD_SPECS)
def test_bad_spec_values_are_refused_when_read(
    tmp_path: Path, variant: dict, scale: dict, message: str
) -> None:
    lines = ["[variants.a]"]
    for key, value in variant.items():
        if isinstance(value, dict):
            inner = ", ".join(f"{k} = {v!r}" for k, v in value.items())
            lines.append(f"{key} = {{ {inner} }}")
        else:
            lines.append(f"{key} = {json.dumps(value)}")
    lines.append("[scale.ci]")
    lines.append(f"seeds = {json.dumps(scale.get('seeds', 1))}")
    for key, value in scale.items():
        if key != "seeds":
            inner = ", ".join(f"{k} = {v!r}" for k, v in value.items())
            lines.append(f"{key} = {{ {inner} }}")
    spec_file = tmp_path / "bad.toml"
    spec_file.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    proc = run_cli("study", str(spec_file), "--out", str(out))
    assert proc.returncode != 0
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and message in err[0] and "Traceback" not in proc.stderr, proc.stderr
    assert not out.exists()  # nothing written


def test_every_kind_a_spec_may_name_has_one_implementation() -> None:
    """The registry holds exactly the kinds a spec may name, each with run and sections."""
    assert sorted(KINDS) == sorted(spec_format.KINDS) == ["lm", "overhead", "retrieval"]
    assert {load_spec(name).kind for name, _ in list_studies()} == set(KINDS)
    for kind in KINDS.values():
        assert callable(kind.check) and callable(kind.run) and callable(kind.sections)


def test_unknown_kind_is_refused_in_one_line(tmp_path: Path) -> None:
    spec_file = tmp_path / "timing.toml"
    spec_file.write_text('kind = "timing"\n[scale.ci]\nseeds = 1\n')
    out = tmp_path / "out"
    proc = run_cli("study", str(spec_file), "--out", str(out))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"attnlab study: error: {spec_file}: kind='timing' is not allowed; "
        "choose one of lm, overhead, retrieval"
    ]
    assert not out.exists()  # nothing written


def test_overhead_study_refuses_an_unknown_variant_before_writing(tmp_path: Path) -> None:
    """A mechanism label no SPEC declares (here the old "value gate") is one line, nothing written."""
    spec = (ROOT / "attnlab/studies/specs/overhead.toml").read_text()
    spec_file = tmp_path / "overhead.toml"
    spec_file.write_text(spec.replace("[params]\n", '[params]\nmechanisms = ["value gate"]\n'))
    out = tmp_path / "out"
    proc = run_cli("study", str(spec_file), "--preset", "ci", "--out", str(out))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "attnlab study: error: unknown benchmark variant 'value gate'; did you mean 'value-gate'? "
        f"known: {', '.join(bench_variants())}"
    ]
    assert not out.exists()


def _code_strings(path: Path) -> list[str]:
    """Every string constant of ``path``'s code, f-string parts included, docstrings left out."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
    ]


def test_only_the_output_module_names_the_study_files() -> None:
    """results.json, results.csv, study.json and report.md are spelled as paths in one module."""
    names = (output.RESULTS_JSON, output.RESULTS_CSV, output.STUDY_JSON, output.REPORT)
    owner = ROOT / "attnlab" / "studies" / "output.py"
    spelled = {
        str(path.relative_to(ROOT))
        for path in (ROOT / "attnlab").rglob("*.py")
        for s in _code_strings(path)
        if any(s == n or s.endswith("/" + n) for n in names)
    }
    assert spelled == {str(owner.relative_to(ROOT))}


@pytest.mark.parametrize("case", ["foreign", "file", "proc", "in-a-study", "in-a-run"])
def test_a_study_out_that_is_not_a_study_folder_is_refused(tmp_path: Path, case: str) -> None:
    """A folder of the user's with a report.md and results.csv had both overwritten; an
    unwritable --out was a traceback; a study inside another's folder (or a run's) was taken."""
    from test_bad_input import error_line
    from test_folder_safety import snapshot

    out = {"foreign": tmp_path / "mine", "file": tmp_path / "notes.txt", "proc": None}.get(case)
    if case == "in-a-study":
        (tmp_path / "a").mkdir()
        (tmp_path / "a" / output.STUDY_JSON).write_text("{}")
        out = tmp_path / "a" / "runs" / "b"
    elif case == "in-a-run":
        (tmp_path / "run").mkdir()
        (tmp_path / "run" / "config.json").write_text('{"model": {}, "train": {}, "data": "d"}')
        out = tmp_path / "run" / "study"
    elif case == "proc":
        if not Path("/proc/self").is_dir():
            pytest.skip("needs Linux's /proc")
        out = Path("/proc/attnlab-study-test")
    elif case == "foreign":
        out.mkdir()
        (out / "report.md").write_text("my report")
        (out / "results.csv").write_text("a,b\n1,2\n")
    else:
        out.write_text("my notes")
    before = snapshot(tmp_path)
    p = run_cli("study", "kv-bias", "--preset", "ci", "--out", str(out))
    line = error_line(p, "study")
    if case == "foreign":
        assert line == f"{out} is not empty and is not a study folder; choose another --out"
    elif case == "file":
        assert line == f"{out} exists and is not a folder; choose another --out"
    elif case.startswith("in-a-"):
        parent, what = out.parent.parent if case == "in-a-study" else out.parent, case[5:]
        assert line == f"{out} lies inside the {what} folder {parent}; choose another --out"
    else:
        assert re.fullmatch(rf"cannot write {out} \([A-Z][\w ]+\); choose another --out", line)
    assert snapshot(tmp_path) == before


def test_a_second_study_in_a_folder_in_use_is_refused(tmp_path: Path) -> None:
    """Two studies in one folder marked each other's runs failed and both exited 1, silently:
    the second is refused while the first holds the folder, and nothing there changes."""
    import os

    from test_bad_input import error_line
    from test_folder_safety import snapshot

    from attnlab.rundir import RunLock

    out = tmp_path / "study"
    with output.StudyDir(out).create():  # what a running study holds
        assert (out / output.MARKER).is_file()
        before = snapshot(tmp_path)
        p = run_cli("study", "kv-bias", "--preset", "ci", "--out", str(out))
        assert error_line(p, "study") == (
            f"{out} is in use by another study (PID {os.getpid()}); "
            "wait for it to finish or stop it, or choose another folder"
        )
        assert snapshot(tmp_path) == before
    with RunLock(out, user="study"):  # released with the study: the folder is free again
        pass


@pytest.mark.parametrize("held", [("gba-lm", "ci"), ("kv-bias", "paper")])
def test_a_study_folder_of_another_study_or_preset_is_refused(
    tmp_path: Path, held: tuple[str, str]
) -> None:
    """Training study B (or another preset) into study A's folder replaced A's results and
    report with B's, exit 0, and left A's runs orphaned there."""
    import json

    from test_bad_input import error_line
    from test_folder_safety import snapshot

    out = tmp_path / "study"
    with output.StudyDir(out).create():
        pass
    (out / output.STUDY_JSON).write_text(json.dumps({"name": held[0], "preset": held[1]}))
    before = snapshot(tmp_path)
    for extra in ([], ["--plan"]):
        p = run_cli("study", "kv-bias", "--preset", "ci", "--out", str(out), *extra)
        assert error_line(p, "study") == (
            f"{out} holds study {held[0]!r} at preset {held[1]!r}, not 'kv-bias' at 'ci'; "
            "choose another --out"
        )
        assert snapshot(tmp_path) == before


def test_a_wall_clock_budget_timed_for_another_pair_is_refused(tmp_path: Path) -> None:
    """A spec changed to clock the arm against another variant reused the budget timed for the
    first one, retrained nothing and reported the arm as matched to the new variant."""
    import json

    from test_bad_input import error_line
    from test_folder_safety import snapshot

    out = tmp_path / "study"
    with output.StudyDir(out).create():
        pass
    arm = f"{KV_PAIR[0]}-wallclock"
    budget = {"baseline": KV_PAIR[0], "mechanism": "kv-bias-detached", "iters": 7}
    record = {"name": "kv-bias", "preset": "ci", "wallclock": {arm: budget}}
    (out / output.STUDY_JSON).write_text(json.dumps(record))
    before = snapshot(tmp_path)
    p = run_cli("study", "kv-bias", "--preset", "ci", "--out", str(out))
    assert error_line(p, "study") == (
        f"{out}: its {arm!r} budget was timed for 'kv-bias-detached' against {KV_PAIR[0]!r}, "
        f"the spec now matches {arm!r} to {KV_PAIR[1]!r} against {KV_PAIR[0]!r}; "
        "choose another --out"
    )
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--seeds", "0"], "--seeds and --jobs must be >= 1 (got 0 and 1)"),
        (["--jobs", "0"], "--seeds and --jobs must be >= 1 (got 2 and 0)"),  # ci: 2 seeds
        # 10**23 seeds was an OverflowError traceback, 10**6 a plan that never ended
        (["--seeds", str(10**6)], f"--seeds must be at most 10,000 (got {10**6:,})"),
    ],
)
def test_seed_and_job_counts_out_of_range_are_refused(
    tmp_path: Path, flags: list[str], expected: str
) -> None:
    from test_bad_input import error_line
    from test_folder_safety import snapshot

    before = snapshot(tmp_path)
    p = run_cli("study", "kv-bias", "--preset", "ci", "--out", str(tmp_path / "s"), *flags)
    assert error_line(p, "study") == expected
    assert snapshot(tmp_path) == before
