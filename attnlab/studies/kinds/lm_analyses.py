"""An lm study's own analyses of its first seed's runs, as the spec's ``params.analyses`` asks:
per-position losses, the name test, boosting gates, attention entropy, the value hull, every
gate's sparsity and the attention sink, each with its figure and its report section."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from attnlab.analysis import entropy, gates, hull, names, per_position, sink
from attnlab.analysis.inputs import load_baseline, load_inputs
from attnlab.errors import AttnlabError
from attnlab.studies.kinds.base import Study
from attnlab.studies.output import figure_link, run_label
from attnlab.studies.report import md_table, num


@dataclass(frozen=True)
class Canvas:
    """Where an analysis draws its figure, and the labels of the study's first-seed runs in its
    spec's order: a figure of several runs styles each by its place there, as the curves do."""

    path: Path
    order: list[str]


@dataclass(frozen=True)
class Analysis:
    """One analysis: its report title, its computation on run folders (with the scale's
    ``params`` and the canvas to draw on) and its report lines from what it computed."""

    title: str
    compute: Callable[[list[str], dict[str, Any], Canvas], dict[str, Any]]
    lines: Callable[[dict[str, Any]], list[str]]


def run_analyses(
    study: Study, runs: list[dict[str, Any]], recorded: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Every analysis the spec asks for, on the runs of the first seed; one that cannot run (a
    failed run, an unknown name) is reported with its reason instead of stopping the study.

    An analysis in ``recorded`` (an earlier call's) made of the same runs (their val losses
    alike, or not all reported yet) is kept as it is, not computed again: so a study calls this after each finished run
    and analyses its first seed as soon as it is complete, and a study resumed from its runs'
    records (a published copy, whose runs have no weights) keeps the analyses of its weights.
    """
    wanted = study.spec.params.get("analyses", {})
    sizes = study.spec.scale(study.preset).params
    seed = min((r["seed"] for r in runs), default=0)
    done = {r["variant"]: r for r in runs if r["seed"] == seed and r["status"] == "ok"}
    results: dict[str, Any] = {}
    order = [run_label(study.out.run_dir(v, seed)) for v in study.spec.variants]
    for name, opts in wanted.items():
        trained = {v: done[v]["val_loss"] for v in opts["runs"] if v in done}
        missing = [v for v in opts["runs"] if v not in done]
        earlier = (recorded or {}).get(name) or {}
        # kept while its runs are still being reported, and once they all are, if they alike
        if (
            "error" not in earlier
            and earlier.get("seed") == seed
            and (missing or earlier.get("of") == trained)
        ):
            results[name] = earlier
            continue
        try:
            if missing:
                raise AttnlabError(f"no finished seed-{seed} run of {', '.join(missing)}")
            png = f"{name}.png"
            results[name] = {
                "runs": opts["runs"],
                "seed": seed,
                "of": trained,
                "figure": figure_link(png),
                **ANALYSES[name].compute(
                    [done[v]["run_dir"] for v in opts["runs"]],
                    sizes,
                    Canvas(study.out.figure(png), order),
                ),
            }
        except Exception as e:  # an analysis is an extra; the statistics stand without it
            results[name] = {"runs": opts.get("runs"), "error": f"{type(e).__name__}: {e}"}
    return results


def sections(analyses: dict[str, Any]) -> list[str]:
    lines = []
    for name, a in analyses.items():
        analysis = ANALYSES.get(name)
        title = analysis.title if analysis else name
        lines += [f"## {title} ({' vs '.join(a.get('runs') or [])}, seed {a.get('seed', 0)})", ""]
        if "error" in a:
            lines += [f"Unavailable: `{a['error']}`.", ""]
        elif analysis is not None:
            lines += analysis.lines(a)
    return lines


def _per_position(runs: list[str], sizes: dict[str, Any], canvas: Canvas) -> dict[str, Any]:
    cmp = per_position.compare(runs[0], runs[1], max_tokens=sizes.get("per_position_tokens"))
    groups = per_position.groupings(cmp)
    per_position.plot(groups, canvas.path, run_label(runs[0]), run_label(runs[1]))
    return {"by_region": groups["by_region"], "top": per_position.top_positions(cmp, 10)}


def _per_position_lines(a: dict[str, Any]) -> list[str]:
    regions = [
        [
            r["group"],
            str(r["count"]),
            num(r["loss_a"]),
            num(r["loss_b"]),
            num(r["b_minus_a"], "+.4f"),
        ]
        for r in a["by_region"]
    ]
    top = [
        [
            str(r["rank"]),
            f"`{r['context']}`",
            f"`{r['target']}`",
            num(r["loss_a"]),
            num(r["loss_b"]),
        ]
        for r in a["top"]
    ]
    return [
        "Mean loss by region of the text (A = first run, B = second):",
        "",
        *md_table(["region", "targets", "loss A", "loss B", "B - A"], regions),
        "Targets where B gains most over A:",
        "",
        *md_table(["rank", "context", "target", "loss A", "loss B"], top),
        f"![loss difference by region, column and distance from a header]({a['figure']})",
        "",
    ]


def _names(runs: list[str], sizes: dict[str, Any], canvas: Canvas) -> dict[str, Any]:
    report = names.name_test(
        runs, samples=sizes.get("name_samples", 30), length=sizes.get("name_length", 2000)
    )
    names.plot(report, canvas.path)
    return {"cast_size": report["cast_size"], "scores": list(report["runs"].values())}


def _names_lines(a: dict[str, Any]) -> list[str]:
    rows = [
        [run, str(s["headers"]), str(s["canonical_headers"]), num(s["fraction_canonical"], ".3f")]
        for run, s in zip(a["runs"], a["scores"], strict=True)
    ]
    return [
        f"Speaker headers in generated samples against the {a['cast_size']} speakers of the "
        "training text:",
        "",
        *md_table(["run", "headers", "canonical", "fraction canonical"], rows),
        f"![speaker headers in generated samples]({a['figure']})",
        "",
    ]


def _gates(runs: list[str], sizes: dict[str, Any], canvas: Canvas) -> dict[str, Any]:
    inputs = load_inputs(runs[0], None, sizes.get("analysis_sequences", 50))
    means = gates.gate_means(inputs.model, inputs.x)
    gates.plot(means, canvas.path, run_label(runs[0]))
    return {
        "layers": [
            {"layer": i, "mean": float(m.mean()), "std": float(m.std())}
            for i, m in enumerate(means)
        ]
    }


def _gates_lines(a: dict[str, Any]) -> list[str]:
    rows = [[str(r["layer"]), num(r["mean"]), num(r["std"])] for r in a["layers"]]
    return [
        *md_table(["layer", "gate mean", "std over dims"], rows),
        f"![gate per layer and dimension]({a['figure']})",
        "",
    ]


def _entropy(runs: list[str], sizes: dict[str, Any], canvas: Canvas) -> dict[str, Any]:
    inputs = load_inputs(runs[1], None, sizes.get("analysis_sequences", 50))
    sources = {"standard": entropy.entropies(load_baseline(runs[0], inputs.model), inputs.x)[0]}
    for m, ent in enumerate(entropy.entropies(inputs.model, inputs.x)):
        sources[f"round{m}"] = ent
    entropy.plot(sources, canvas.path, f"{run_label(runs[1])} vs {run_label(runs[0])}")
    return {"rows": [r for r in entropy.summary_rows(sources) if r["layer"] == "all"]}


def _entropy_lines(a: dict[str, Any]) -> list[str]:
    rows = [[r["source"], num(r["mean"])] for r in a["rows"]]
    return [
        *md_table(["source", "mean entropy (nats)"], rows),
        f"![attention entropy]({a['figure']})",
        "",
    ]


def _hull(runs: list[str], sizes: dict[str, Any], canvas: Canvas) -> dict[str, Any]:
    inputs = load_inputs(runs[0], None, sizes.get("hull_sequences", 5))
    rows = hull.measure(inputs, sizes.get("hull_positions", 30))
    hull.plot(rows, canvas.path, run_label(runs[0]))
    outside = sum(r["distance"] > hull.INSIDE_TOL for r in rows)
    return {"measured": len(rows), "outside": outside, "layers": hull.layer_means(rows)}


def _hull_lines(a: dict[str, Any]) -> list[str]:
    rows = [[str(layer), num(mean, ".4g")] for layer, mean in a["layers"].items()]
    return [
        f"{a['outside']} of {a['measured']} boosted outputs lie outside the convex hull of the "
        "round-0 values (exact distances; plain attention's output is always inside):",
        "",
        *md_table(["layer", "mean distance"], rows),
        f"![distance of the boosted output to the round-0 value hull]({a['figure']})",
        "",
    ]


def _sparsity(runs: list[str], sizes: dict[str, Any], canvas: Canvas) -> dict[str, Any]:
    stats = {}
    for run in runs:
        inputs = load_inputs(run, None, sizes.get("analysis_sequences", 50))
        stats[run_label(run)] = gates.gate_stats(inputs.model, inputs.x)
    gates.plot_sparsity(stats, canvas.path, canvas.order)
    return {
        "rows": [{"run": run, **row} for run, s in stats.items() for row in gates.summary_rows(s)]
    }


def _sparsity_lines(a: dict[str, Any]) -> list[str]:
    below = f"below_{gates.SPARSE_BELOW}"
    rows = [
        [r["run"], r["gate"], str(r["layer"]), num(r["mean"]), num(r["std"]), num(r[below], ".3f")]
        for r in a["rows"]
    ]
    return [
        f"Every gate's scores over validation windows and positions; sparsity = the fraction "
        f"below {gates.SPARSE_BELOW} (Qiu et al. 2025 find the output gate's scores mostly near 0):",
        "",
        *md_table(
            ["run", "gate", "layer", "mean", "std", f"fraction < {gates.SPARSE_BELOW}"], rows
        ),
        f"![gate sparsity per layer]({a['figure']})",
        "",
    ]


def _sink(runs: list[str], sizes: dict[str, Any], canvas: Canvas) -> dict[str, Any]:
    masses, block = {}, 0
    for run in runs:
        inputs = load_inputs(run, None, sizes.get("analysis_sequences", 50))
        masses[run_label(run)] = sink.first_token_mass(inputs.model, inputs.x)
        block = inputs.x.size(1)
    sink.plot_runs(masses, canvas.path, block, canvas.order)
    return {
        "uniform": sink.uniform_mass(block),
        "runs": {run: m.tolist() for run, m in masses.items()},
    }


def _sink_lines(a: dict[str, Any]) -> list[str]:
    masses = {run: np.asarray(mass) for run, mass in a["runs"].items()}
    n_layer = max(m.shape[0] for m in masses.values())
    rows = [
        [run, *(num(float(v), ".3f") for v in m.mean(1)), num(float(m.mean()), ".3f")]
        for run, m in masses.items()
    ]
    return [
        "Mean attention weight on a window's first token over queries 1..T-1, per layer (mean "
        f"over heads; uniform causal attention gives {a['uniform']:.3f}); Qiu et al. 2025 "
        "report that the output gate lowers it:",
        "",
        *md_table(["run", *(f"layer {i}" for i in range(n_layer)), "all"], rows),
        f"![attention on the first token per layer]({a['figure']})",
        "",
    ]


ANALYSES = {
    "per_position": Analysis("Per-position loss", _per_position, _per_position_lines),
    "names": Analysis("Name test", _names, _names_lines),
    "gates": Analysis("Boosting gates", _gates, _gates_lines),
    "entropy": Analysis("Attention entropy", _entropy, _entropy_lines),
    "hull": Analysis("Leaving the value hull", _hull, _hull_lines),
    "sparsity": Analysis("Gate sparsity", _sparsity, _sparsity_lines),
    "sink": Analysis("Attention sink", _sink, _sink_lines),
}
