"""Long studies: one progress line per finished run, results rewritten after every run,
mid-run resume equal to an uninterrupted study, and variant selection."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import fixed_pace
from safetensors.torch import load_file
from test_folder_safety import snapshot

from attnlab.errors import AttnlabError
from attnlab.studies import jobs
from attnlab.studies.kinds import lm, lm_report
from attnlab.studies.progress import Tracker
from attnlab.studies.runner import run_study
from attnlab.studies.spec import load_spec, parse_spec
from attnlab.train.trainer import Trainer

TWO_ARMS = {
    "name": "two-arms",
    "description": "vanilla against K/V-bias, tiny",
    "variants": {
        "base": {"preset": "shakespeare-char"},
        "kv": {"preset": "kv-bias-shakespeare-char", "model": {"n_embd": 24}},
    },
    "comparisons": [{"baseline": "base", "variant": "kv", "wallclock": True}],
    "scale": {
        "ci": {
            "seeds": 2,
            "model": {"n_layer": 1, "n_head": 2, "n_embd": 32, "block_size": 16},
            "train": {
                "max_iters": 8,
                "lr_decay_iters": 8,
                "warmup_iters": 1,
                "batch_size": 4,
                "eval_interval": 4,
                "eval_iters": 1,
                "log_interval": 2,
                "device": "cpu",
            },
        }
    },
}


def _spec():
    return parse_spec(json.loads(json.dumps(TWO_ARMS)), "two-arms.toml")


def test_progress_lines_and_results_after_every_run(tmp_path: Path, tiny_data: Path) -> None:
    out = tmp_path / "study"
    lines: list[str] = []
    seen_runs: list[int] = []

    def progress(line: str) -> None:
        lines.append(line)
        # results.json is already rewritten when the line for a run arrives (the timing's
        # comes before the first)
        results = out / "results.json"
        seen_runs.append(len(json.loads(results.read_text())["runs"]) if results.exists() else 0)

    run_study(_spec(), "ci", out, data=tiny_data, progress=progress, command="attnlab study x")
    # first the side-by-side timing that sets the wall-clock-matched budget (before anything
    # trains); then 2 variants + the wall-clock-matched baseline, 2 seeds, seed-major order for
    # the first two
    assert lines.pop(0) == (
        "timing kv against base side by side (30 interleaved training steps each) "
        "for the wall-clock-matched budget"
    )
    assert len(lines) == 6 and seen_runs == [0, 1, 2, 3, 4, 5, 6]
    order = [re.match(r"\[\d/6\] (\S+) seed (\d)", line).groups() for line in lines]
    assert order[:4] == [("base", "0"), ("kv", "0"), ("base", "1"), ("kv", "1")]
    assert {o[0] for o in order[4:]} == {"base-wallclock"}
    for k, line in enumerate(lines, 1):
        assert re.search(rf"^\[{k}/6\] .*: val loss \d\.\d{{4}} after \d+ iters \(", line), line
        assert f"; {6 - k} left" in line
        assert ("ETA" in line) == (k < 6)
    report = (out / "report.md").read_text()
    assert re.search(r"^Produced by `attnlab study x` at commit `[0-9a-f]{40}`\.$", report, re.M)

    # A second invocation computes nothing and says so on every line.
    again: list[str] = []
    run_study(_spec(), "ci", out, data=tiny_data, progress=again.append)
    assert len(again) == 6 and all("finished earlier" in line for line in again)

    # With one early run to redo, everything that finished (the wall-clock arm's runs too) is
    # reported, and published in one report, before it trains: results.json never lists fewer
    # runs than had finished (the 5 that still have, then 6).
    (out / "runs" / "kv" / "seed0" / "summary.json").unlink()
    lines.clear()
    seen_runs.clear()
    run_study(_spec(), "ci", out, data=tiny_data, progress=progress)
    assert ["finished earlier" in line for line in lines[:5]] == [True] * 5
    assert (
        re.match(r"\[6/6\] kv seed 0: val loss ", lines[5]) and "finished earlier" not in lines[5]
    )
    assert seen_runs == [5, 5, 5, 5, 5, 6]
    assert len(json.loads((out / "results.json").read_text())["runs"]) == 6


def test_interrupted_study_resumes_mid_run_and_equals_uninterrupted(
    tmp_path: Path, tiny_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole = tmp_path / "whole"
    run_study(_spec(), "ci", whole, seeds=1, data=tiny_data)

    # Interrupt the second run (kv, seed 0) after its checkpoint at iteration 4 of 8.
    cut = tmp_path / "cut"
    original = Trainer.run

    def stop_halfway(self: Trainer, until: int | None = None) -> dict:
        if self.run_dir.parent.name == "kv":
            original(self, until=4)
            raise KeyboardInterrupt
        return original(self, until)

    monkeypatch.setattr(Trainer, "run", stop_halfway)
    with pytest.raises(KeyboardInterrupt):
        run_study(_spec(), "ci", cut, seeds=1, data=tiny_data)
    partial = json.loads((cut / "results.json").read_text())
    assert [r["variant"] for r in partial["runs"]] == ["base"]  # what finished is published
    # the stopped run left a summary at iteration 4: the study must not take it as finished
    assert json.loads((cut / "runs/kv/seed0/summary.json").read_text())["iters"] == 4
    monkeypatch.setattr(Trainer, "run", original)

    resumed_iters: list[int] = []
    monkeypatch.setattr(
        Trainer,
        "run",
        lambda self, until=None: resumed_iters.append(self.state.iter) or original(self, until),
    )
    run_study(_spec(), "ci", cut, seeds=1, data=tiny_data)
    assert resumed_iters[0] == 4  # the kv run went on from its checkpoint, not from 0

    def finals(out: Path) -> dict:  # the wall-clock budget comes from timings: not compared
        return {
            (r["variant"], r["seed"]): (r["val_loss"], r["iters"])
            for r in json.loads((out / "results.json").read_text())["runs"]
            if r["variant"] != "base-wallclock"
        }

    assert finals(cut) == finals(whole)
    a = load_file(str(whole / "runs/kv/seed0/latest/model.safetensors"))
    b = load_file(str(cut / "runs/kv/seed0/latest/model.safetensors"))
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)


def test_wallclock_budget_is_the_side_by_side_ratio_not_the_logged_times(
    tmp_path: Path, tiny_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    timed: list[jobs.Pace] = []
    out = tmp_path / "study"
    trained_then: list[list[Path]] = []

    def fixed_ratio(pace: jobs.Pace, threads: int | None = None) -> dict:
        timed.append(pace)
        trained_then.append(list(out.glob("runs/*/seed*/summary.json")))
        return fixed_pace()(pace)

    monkeypatch.setattr(lm, "time_steps", fixed_ratio)
    run_study(_spec(), "ci", out, seeds=1, data=tiny_data)
    # both arms' models as their runs train them, timed before any run trains (the wall-clock
    # runs then queue with the others: no --jobs slot waits for the last equal-iteration runs)
    assert [(p.baseline.variant, p.mechanism.variant) for p in timed] == [("base-wallclock", "kv")]
    base, mech = (jobs.planned(job) for job in (timed[0].baseline, timed[0].mechanism))
    assert (base.model.n_embd, mech.model.n_embd, mech.model.use_m_gate) == (32, 24, True)
    assert base.train.batch_size == mech.train.batch_size == 4 and base.train.max_iters == 8
    assert trained_then == [[]]
    runs = json.loads((out / "results.json").read_text())["runs"]
    assert {r["variant"]: r["iters"] for r in runs} == {"base": 8, "kv": 8, "base-wallclock": 12}
    report = (out / "report.md").read_text()
    assert (
        "kv takes 1.500x the time per training step of base (the median of paired step ratios, "
        "IQR 1.400-1.600; median step times 300.0 vs 200.0 ms), timed side by side: 30 interleaved steps each of both arms' models on 1 thread(s)."
    ) in report
    assert "`base-wallclock` trains base for 12 iterations." in report

    # The budget is kept in study.json: more seeds later are not timed again.
    run_study(_spec(), "ci", out, seeds=2, data=tiny_data)
    assert len(timed) == 1


def test_time_steps_times_both_jobs_and_leaves_the_random_stream(tiny_data: Path) -> None:
    arms = {
        name: jobs.Job(
            name,
            0,
            v["preset"],
            {**TWO_ARMS["scale"]["ci"]["model"], **v.get("model", {})},
            TWO_ARMS["scale"]["ci"]["train"],
            str(tiny_data),
            "",
        )
        for name, v in TWO_ARMS["variants"].items()
    }
    before = torch.random.get_rng_state()
    pace = jobs.Pace(arms["base"], arms["kv"], reps=3, warmup=1)
    threads = torch.get_num_threads()
    try:
        got = jobs.time_steps(pace, threads=1)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(torch.random.get_rng_state(), before)
    assert set(got) == {
        "baseline_sec_per_step",
        "mechanism_sec_per_step",
        "ratio",
        "ratio_iqr",
        "reps",
        "threads",
    }
    assert got["reps"] == 3 and got["threads"] == 1
    assert got["baseline_sec_per_step"] > 0 and got["mechanism_sec_per_step"] > 0
    assert got["ratio_iqr"][0] <= got["ratio"] <= got["ratio_iqr"][1]


def test_a_budget_from_an_earlier_attnlab_is_reported_as_logged_times() -> None:
    record = {
        "wallclock": {
            "base-wallclock": {
                "baseline": "base",
                "mechanism": "kv",
                "baseline_sec_per_step": 1.0,
                "mechanism_sec_per_step": 1.457,
                "ratio": 1.457,
                "iters": 1166,
            }
        }
    }
    assert lm_report._wallclock_lines(record) == [
        "**Wall-clock matching.** kv takes 1.457x the time per training step of base (1457.0 vs "
        "1000.0 ms), from the runs' own logged step times (mean over seeds), which include "
        "whatever else ran on the machine during each run; a fresh --out times both arms side by "
        "side. So `base-wallclock` trains base for 1166 iterations.",
        "",
    ]


def _with_train(**train: object) -> dict:
    """TWO_ARMS with its ci training values changed."""
    spec = json.loads(json.dumps(TWO_ARMS))
    spec["scale"]["ci"]["train"].update(train)
    return spec


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"train": {"max_iters": 6}}, "train.max_iters 8, not 6"),
        ({"train": {"learning_rate": 3e-3}}, "train.learning_rate 0.001, not 0.003"),
        ({"data": "other"}, "data "),
    ],
)
def test_a_study_refuses_run_folders_of_another_setup(
    tmp_path: Path, tiny_data: Path, change: dict, expected: str
) -> None:
    """Another preset, spec, --data or budget would silently reuse wrong finished runs."""
    out = tmp_path / "study"
    run_study(_spec(), "ci", out, seeds=1, data=tiny_data, variants=["base", "kv"])
    before = snapshot(out)
    data = tiny_data
    if "data" in change:  # the same tokens in another folder: still another setup
        data = tmp_path / "other"
        shutil.copytree(tiny_data, data)
    spec = parse_spec(_with_train(**change.get("train", {})), "two-arms.toml")
    with pytest.raises(AttnlabError) as e:
        run_study(spec, "ci", out, seeds=1, data=data, variants=["base", "kv"])
    message = str(e.value)
    assert message.startswith(
        f"{out / 'runs/base/seed0'} holds a run of another setup than base seed 0 here ("
    )
    moved = (  # a copy restored on another machine names its data by this machine's path
        " (a study copied from another machine: prepare its data at the path its runs name, "
        "e.g. with the same ATTNLAB_HOME, or pass --data that path)"
    )
    assert expected in message and message.endswith(
        "): use another --out, or move that folder away to train it again"
        + (moved if "data" in change else "")
    )
    assert "\n" not in message
    assert snapshot(out) == before
    # the setup the runs were made with is still accepted (and trains nothing)
    again = run_study(_spec(), "ci", out, seeds=1, data=tiny_data, variants=["base", "kv"])
    assert again["study"]["retrained"] == 0


def test_variant_selection_trains_a_subset_of_the_whole_study() -> None:
    spec = load_spec("kv-bias")
    chosen = spec.training(["vanilla-128", "kv-bias-112", "vanilla-128-wallclock"])
    assert chosen.variants == spec.variants and chosen.comparisons == spec.comparisons
    assert [n for n in spec.variants if chosen.trains(n)] == [
        "vanilla-128",
        "kv-bias-112",
        "vanilla-128-wallclock",
    ]
    assert all(spec.trains(n) for n in spec.variants)  # the shipped spec itself is unchanged


@pytest.mark.parametrize(
    ("names", "message"),
    [
        (["vanilla-128", "nope"], "study 'kv-bias' has no variant 'nope'; it has vanilla-128, "),
        (["vanilla-128-wallclock"], "is timed from vanilla-128 and kv-bias-112: select them too"),
        (["vanilla-128", "kv-bias-112", "vanilla-128"], "--variants names 'vanilla-128' twice"),
    ],
)
def test_variant_selection_errors(names: list[str], message: str) -> None:
    with pytest.raises(AttnlabError, match=re.escape(message)):
        load_spec("kv-bias").training(names)


TINY_RETRIEVAL = {
    "name": "tiny-retrieval",
    "kind": "retrieval",
    "params": {
        "protocols": {"released": {}, "attnlab": {"loss": "mse"}},
        "tables": [
            {
                "title": "T: tiny",
                "defaults": {"d": 8, "patterns": 4, "methods": ["bayes", "one-step", "boosted"]},
                "cells": [
                    {"column": "a", "args": {"sigma": 0.5}},
                    {"column": "b", "args": {"sigma": 0.8}},
                ],
            }
        ],
    },
    "scale": {"ci": {"seeds": 2, "params": {"steps": 5, "queries": 100}}},
}


@pytest.mark.slow  # spawns a process pool
def test_retrieval_cells_in_parallel_then_kept_on_rerun(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = parse_spec(json.loads(json.dumps(TINY_RETRIEVAL)), "tiny.toml")
    one, two = tmp_path / "one", tmp_path / "two"
    run_study(spec, "ci", one)
    lines: list[str] = []
    run_study(spec, "ci", two, jobs=2, progress=lines.append)
    assert len(lines) == 4
    assert all(re.match(r"\[\d/4\] T [ab] \((released|attnlab)\): bayes ", x) for x in lines)

    def tables(out: Path) -> list:
        return json.loads((out / "study.json").read_text())["tables"]

    assert tables(two) == tables(one)  # the same numbers whatever the number of processes
    again: list[str] = []
    run_study(spec, "ci", two, progress=again.append)
    assert len(again) == 4 and all("finished earlier" in line for line in again)
    assert tables(two) == tables(one)

    # More seeds later: the first two are kept, only the third is computed.
    three = tmp_path / "three"
    run_study(spec, "ci", three, seeds=3)
    calls: list[int] = []
    original = jobs.run_retrieval

    def counted(*args, seed, **kwargs):
        calls.append(seed)
        return original(*args, seed=seed, **kwargs)

    monkeypatch.setattr(jobs, "run_retrieval", counted)
    run_study(spec, "ci", two, seeds=3)
    assert calls == [2, 2, 2, 2]  # one new seed for each of the 4 cells
    assert tables(two) == tables(three)


def test_a_study_refuses_runs_of_data_prepared_again(tmp_path: Path, tiny_data: Path) -> None:
    """The same --data folder prepared again (another split, same tokenizer) kept the finished
    runs, which were trained and measured on the old one, to pair with new ones."""
    from attnlab.data.prepare import prepare

    out, data = tmp_path / "study", tmp_path / "data"
    shutil.copytree(tiny_data, data)
    run_study(_spec(), "ci", out, seeds=1, data=data, variants=["base", "kv"])
    prepare(sources=[str(tiny_data.parent / "corpus.txt")], out=data, val_fraction=0.2)
    before = snapshot(out)
    with pytest.raises(AttnlabError) as e:
        run_study(_spec(), "ci", out, seeds=1, data=data, variants=["base", "kv"])
    assert "(data prepared again (its train and val tokens differ: " in str(e.value)
    assert snapshot(out) == before


def _swap_two_ids(data: Path) -> None:
    """Prepare ``data`` again as the library's BPE trainer did from one process to the next: the
    same text and number of tokens, two ids swapped (tokenizer.json, bins, meta.json, manifest)."""
    import hashlib

    from attnlab.fsutil import MANIFEST, write_manifest

    tok = json.loads((data / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    a, b = sorted(vocab)[:2]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (data / "tokenizer.json").write_text(json.dumps(tok))
    meta = json.loads((data / "meta.json").read_text())
    for split in ("train", "val"):
        ids = np.fromfile(data / f"{split}.bin", dtype=meta["dtype"])
        ids = np.where(ids == vocab[a], vocab[b], np.where(ids == vocab[b], vocab[a], ids))
        ids.astype(meta["dtype"]).tofile(data / f"{split}.bin")
        meta[f"{split}_ids_sha256"] = hashlib.sha256(ids.astype(meta["dtype"])).hexdigest()
    (data / "meta.json").write_text(json.dumps(meta))
    write_manifest(data, json.loads((data / MANIFEST).read_text())["kind"])


def test_a_study_refuses_runs_of_the_same_text_under_other_ids(
    tmp_path: Path, tiny_data: Path
) -> None:
    """Only the token files' hashes tell such data apart: the text's hashes and the token
    counts are the same, and a finished run is counted from its records alone."""
    out, data = tmp_path / "study", tmp_path / "data"
    shutil.copytree(tiny_data, data)
    run_study(_spec(), "ci", out, seeds=1, data=data, variants=["base", "kv"])
    _swap_two_ids(data)
    before = snapshot(out)
    with pytest.raises(AttnlabError) as e:
        run_study(_spec(), "ci", out, seeds=1, data=data, variants=["base", "kv"])
    meta = json.loads((data / "meta.json").read_text())
    assert (
        "(data prepared again (its train and val tokens differ (another sha256, the same "
        f"{meta['train_tokens']:,} train / {meta['val_tokens']:,} val tokens)))"
    ) in str(e.value)
    assert snapshot(out) == before


def test_the_eta_counts_a_resumed_run_at_its_whole_length() -> None:
    """A study resumed mid-run gave an ETA from the part of that run trained in this invocation
    (28 min of a 49-minute run): half the time really left. Each computed run now counts at the
    longer of its time here and its training time in all."""
    lines: list[str] = []
    tracker = Tracker(6, lines.append, parallel=2)
    tracker.done("a seed 0", "done", 5.0, cached=True)  # found finished: not in the ETA
    tracker.done("b seed 0", "done", 100.0, whole=90.0)  # fresh: its time here (evals too)
    tracker.done("c seed 0", "done", 40.0, whole=100.0)  # resumed: 60 of its 100 s trained before
    assert lines[-1] == "[3/6] c seed 0: done (40 s); 3 left, ETA 2 min 30 s"  # 100 s x 3 / 2


def test_a_budget_is_kept_before_any_run_finishes(
    tmp_path: Path, tiny_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A budget reached study.json only with a finished run: a study stopped before then timed
    again on resume, and a new budget refused its own unfinished wall-clock runs."""
    timed: list[jobs.Pace] = []
    monkeypatch.setattr(
        lm, "time_steps", lambda pace, threads=None: timed.append(pace) or fixed_pace()(pace)
    )
    original = Trainer.run

    def stop(self: Trainer, until: int | None = None) -> dict:
        raise KeyboardInterrupt

    monkeypatch.setattr(Trainer, "run", stop)
    out = tmp_path / "study"
    with pytest.raises(KeyboardInterrupt):
        run_study(_spec(), "ci", out, seeds=1, data=tiny_data)
    kept = json.loads((out / "study.json").read_text())["wallclock"]["base-wallclock"]
    assert (kept["ratio"], kept["iters"]) == (1.5, 12)
    monkeypatch.setattr(Trainer, "run", original)
    run_study(_spec(), "ci", out, seeds=1, data=tiny_data)
    assert len(timed) == 1  # resumed on the kept budget, not timed again
