"""The report of an lm study: variants, comparisons, wall-clock matching, failed runs, the
training curves (the seed's Figure 1) and the analyses of the first seed."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from attnlab.plotting import legend_outside, pyplot, save_figure, series_styles
from attnlab.studies import verdict as rule
from attnlab.studies.kinds import lm_analyses
from attnlab.studies.kinds.base import Study
from attnlab.studies.output import CONVERGED_WITHIN, LAST_FRACTION, figure_link, val_curve
from attnlab.studies.progress import duration
from attnlab.studies.report import md_table, num, p_cell, p_value
from attnlab.studies.stats import (
    ALPHA,
    BOOTSTRAP_MIN_N,
    BOOTSTRAP_RESAMPLES,
    MAX_SEEDS,
    POWER,
    holm_ci,
)

CURVES = "curves.png"
PAIRED = "paired.png"


UNIGRAM_WITHIN = 0.05  # a final loss this close to the unigram loss: trained to frequencies only


def sections(study: Study, results: dict[str, Any], record: dict[str, Any]) -> list[str]:
    spec = study.spec
    planned = sum(len(spec.seeds_of(n, study.preset, record["seeds"])) for n in spec.variants)
    finished = sum(r["status"] == "ok" for r in results["runs"])
    lines = []
    if finished < planned:
        lines += [
            f"**Partial: {finished} of {planned} runs finished.** Rerunning the command above "
            + ("without --variants " if spec.to_train is not None else "")
            + "continues the study (an unfinished run resumes from its last checkpoint).",
            "",
        ]
    lines += [
        "## Variants",
        "",
        f"Final validation loss of each run ({evaluation_batches(record)}), over the seeds "
        "that finished; std is the sample std (n − 1) and the 95 % CI Student's t.",
        "",
        *_variant_table(record["variants"], results["runs"], record.get("configs") or {}),
        *_convergence_lines(results["runs"]),
        *_unigram_lines(results["runs"], record),
        *_shared_cpu_lines(record),
        *_training_time_lines(results["runs"], record),
        *_reused_lines(record),
        *_wallclock_lines(record),
        "## Comparisons",
        "",
        "Paired by seed (same initial stream and batches): "
        "`scipy.stats.ttest_rel(variant, baseline)` on final val losses; Holm-corrected over "
        "this study's comparisons; wins = seeds where the variant's loss is lower. Seeds with "
        "a non-finite loss are left out (and counted); no spread = every seed differs by the "
        "same amount, which a t-test cannot weigh.",
        "",
        *_comparison_table(results["comparisons"]),
        f"MDE = the smallest |mean diff| these seeds detect with {100 * POWER:.0f} % power at "
        f"α = {ALPHA} given the observed spread (exact, noncentral t); bootstrap = percentile "
        f"interval of {BOOTSTRAP_RESAMPLES:,} resamples of the seeds (fixed generator seed), "
        f"made only for a comparison of {BOOTSTRAP_MIN_N} seeds or more (— with fewer). ppl change = exp(mean diff) − 1 and its CI exp of the "
        f"difference's t interval. Verdicts at p < {ALPHA} (uncorrected; Holm beside it):",
        "",
        *(f"- {verdict(c)}" for c in results["comparisons"]),
        "",
    ]
    paired = plot_paired(results, study.out.figure(PAIRED), f"{spec.name}: paired differences")
    if paired is not None:
        lines += [
            "## Paired differences",
            "",
            f"![each seed's difference, the mean with its 95 % CI]({figure_link(PAIRED)})",
            "",
        ]
    failed = [r for r in results["runs"] if r["status"] == "failed"]
    if failed:
        lines += [
            "## Failed runs",
            "",
            *(f"- {r['variant']} seed {r['seed']}: `{r['error']}`" for r in failed),
            "",
        ]
    drawn = plot_curves(
        results["runs"],
        study.out.figure(CURVES),
        f"{spec.name}: validation loss",
        list(spec.variants),
    )
    # reported again without the run folders: the figure drawn when they were here stands
    if drawn or (record.get("reported") and study.out.figure(CURVES).is_file()):
        lines += [
            "## Training curves",
            "",
            f"![validation loss against iteration]({figure_link(CURVES)})",
            "",
        ]
    return lines + lm_analyses.sections(record.get("analyses", {}))


def evaluation_batches(record: dict[str, Any]) -> str:
    """How the study's runs drew their validation batches (TrainConfig.eval_batches), in words."""
    configs = (record.get("configs") or {}).values()
    if any(c.get("train", {}).get("eval_batches") == "fresh" for c in configs):
        return (
            "fresh validation batches at each evaluation, nanoGPT's way, keyed by the iteration: "
            "every run scores the same ones at the same step"
        )
    return "the same fixed validation batches for every run"


def _worst_change(runs: list[dict[str, Any]], variant: str) -> float | None:
    """The variant's val-loss change over the last 20 % of its runs' iterations farthest from 0."""
    changes = [
        r["val_change_last20"]
        for r in runs
        if r["variant"] == variant and r.get("val_change_last20") is not None
    ]
    return max(changes, key=abs, default=None)


def _percent(change: float | None) -> str:
    return "–" if change is None else f"{100 * change:+.2f} %"


def _shape(config: dict[str, Any] | None) -> str:
    """``4 × 128``: layers × width of a variant's resolved model, as it trained (a spec's
    description names the widths of the scale it was written for)."""
    model = (config or {}).get("model") or {}
    if not all(isinstance(model.get(k), int) for k in ("n_layer", "n_embd")):
        return "–"  # a study recorded before its configs were
    return f"{model['n_layer']} × {model['n_embd']}"


def _variant_table(
    stats: dict[str, dict[str, Any]], runs: list[dict[str, Any]], configs: dict[str, Any]
) -> list[str]:
    rows = []
    for name, s in stats.items():
        mean = s["mean"]
        ppl = math.exp(mean) if mean is not None and math.isfinite(mean) else None
        rows.append(
            [
                name,
                s["description"],
                _shape(configs.get(name)),
                f"{s['params']:,}" if s["params"] else "–",
                f"{s['n']}" + (f" ({s['failed']} failed)" if s["failed"] else ""),
                f"{num(mean)} ± {num(s['std'])}",
                f"{num(s['ci95_low'])} – {num(s['ci95_high'])}",
                num(ppl, ".3f"),
                num(s["reference"]),
                num(s["iters"], "d"),
                num(1000 * s["sec_per_step"] if s["sec_per_step"] else None, ".1f"),
                _percent(_worst_change(runs, name)),
            ]
        )
    header = ["variant", "what", "layers × d", "params", "seeds", "val loss mean ± std"]
    last = f"last {100 * LAST_FRACTION:.0f} % change (farthest seed)"
    return md_table([*header, "95 % CI", "ppl", "seed's value", "iters", "ms/step", last], rows)


def _convergence_lines(runs: list[dict[str, Any]]) -> list[str]:
    """How far each run still moved at its end, and which runs are not converged."""
    measured = [r for r in runs if r.get("converged") is not None]
    if not measured:
        return []
    unconverged = [r for r in measured if not r["converged"]]
    lines = [
        f"**Convergence.** A run's last {100 * LAST_FRACTION:.0f} % change is the relative change "
        f"of its validation loss from iteration {1 - LAST_FRACTION:g} N (interpolated between "
        "evaluations) to its last, N; beyond "
        f"±{100 * CONVERGED_WITHIN:g} % it is flagged not converged (every run's value is in "
        "results.csv). "
    ]
    if unconverged:
        named = ", ".join(
            f"{r['variant']} seed {r['seed']} ({_percent(r['val_change_last20'])})"
            for r in unconverged
        )
        lines[0] += (
            f"**Not converged: {len(unconverged)} of {len(measured)} runs**: {named}. Their "
            "final losses rank where training stopped, not where it would settle."
        )
    else:
        lines[0] += f"All {len(measured)} measured runs are within it."
    if len(measured) < len(runs):
        lines[0] += f" ({len(runs) - len(measured)} runs have no measured change.)"
    return [*lines, ""]


def _shared_cpu_lines(record: dict[str, Any]) -> list[str]:
    """A study run several at a time: its ms/step column measures load as much as cost."""
    jobs = record.get("jobs")
    if not isinstance(jobs, int) or jobs < 2:
        return []
    timed = (
        " and by the wall-clock arm's interleaved timing below" if record.get("wallclock") else ""
    )
    return [
        f"**Step times.** The study (its last invocation) ran {jobs} runs at a time (`--jobs "
        f"{jobs}`), so a run's ms/step is its mean step while sharing the machine with whichever "
        "runs trained beside it: it shows load as much as cost. Step costs are compared side by "
        f"side by `attnlab bench`{timed}.",
        "",
    ]


def _training_time_lines(runs: list[dict[str, Any]], record: dict[str, Any]) -> list[str]:
    """What the finished runs cost in all: the figure to plan a rerun or a longer budget by (a
    resumed study's wall time covers only its last invocations)."""
    times = [r["wall_s"] for r in runs if r.get("status") == "ok" and r.get("wall_s")]
    if not times:
        return []
    copied = " (a copied run: where it trained)" if record.get("reused") else ""
    return [
        f"**Training time.** The {len(times)} finished runs trained for {duration(sum(times))} "
        f"in all, {duration(min(times))} to {duration(max(times))} a run: each run's time in its "
        f"training steps{copied}, evaluations and start-up aside (results.csv's wall_s).",
        "",
    ]


def _unigram_lines(runs: list[dict[str, Any]], record: dict[str, Any]) -> list[str]:
    """The runs whose final loss sits at their data's unigram loss: a plateau the convergence
    test passes, though the model learned no more than how often each token occurs."""
    data = record.get("data") or {}
    floors = {
        name: floor
        for name, config in (record.get("configs") or {}).items()
        if (floor := (data.get(config.get("data")) or {}).get("unigram_loss"))
    }
    ended = [
        r
        for r in runs
        if r.get("status") == "ok"
        and r["variant"] in floors
        and isinstance(r.get("val_loss"), float)
        and math.isfinite(r["val_loss"])
    ]
    if not ended:
        return []
    stuck = [r for r in ended if r["val_loss"] > (1 - UNIGRAM_WITHIN) * floors[r["variant"]]]
    values = ", ".join(f"{v:.4f}" for v in sorted(set(floors.values())))
    text = (
        "**Unigram floor.** A model that learned only how often each token occurs scores the "
        f"data's unigram loss ({values}: the val tokens under the train split's add-one "
        "smoothed token frequencies); "
    )
    if stuck:
        named = ", ".join(f"{r['variant']} seed {r['seed']} ({r['val_loss']:.4f})" for r in stuck)
        text += (
            f"**{len(stuck)} of {len(ended)} runs ended above it or less than "
            f"{100 * UNIGRAM_WITHIN:g} % below it**: {named}. They did not train past token "
            "frequencies, whatever their convergence says."
        )
    else:
        worst = max(r["val_loss"] / floors[r["variant"]] for r in ended)
        text += f"every run ended below it, the highest at {100 * worst:.0f} % of it."
    return [text, ""]


def _reused_lines(record: dict[str, Any]) -> list[str]:
    """Which runs were copied from another study (``--reuse-from``) instead of trained here."""
    reused = record.get("reused") or {}
    if not reused:
        return []
    listed = "; ".join(f"{run} from `{folder}`" for run, folder in reused.items())
    return [
        f"**Copied runs.** {len(reused)} run{'s' if len(reused) > 1 else ''} "
        "came from another study that trained them identically (the same preset, resolved "
        "model and training config, logging and torch.compile aside, data and seed; each "
        "keeps its env.json, so its code state is counted below), copied by `--reuse-from`: "
        f"{listed}.",
        "",
    ]


def _wallclock_lines(record: dict[str, Any]) -> list[str]:
    lines, variants = [], record.get("variants") or {}
    for name, b in record.get("wallclock", {}).items():
        speeds = (
            f"**Wall-clock matching.** {b['mechanism']} takes {b['ratio']:.3f}x the time per "
            f"training step of {b['baseline']}"
        )
        mechanism_ms, baseline_ms = (
            1000 * b[f"{k}_sec_per_step"] for k in ("mechanism", "baseline")
        )
        times = f"{mechanism_ms:.1f} vs {baseline_ms:.1f} ms"
        if "reps" in b:
            # the ratio is the median of paired ratios, the times each median on their own: on a
            # busy machine the two can point different ways
            low, high = b["ratio_iqr"]
            at_once = b.get("concurrent")
            how = (
                f" (the median of paired step ratios, IQR {low:.3f}-{high:.3f}; median step times "
                f"{times}), timed side by side: {b['reps']} interleaved steps each of both arms' "
                f"models on {b['threads']} thread(s)"
                + (
                    f", {at_once} timings at once as the study ran {at_once} runs at a time (the "
                    "one of the median ratio)."
                    if at_once
                    else "."
                )
            )
            logged = [variants.get(b[k], {}).get("sec_per_step") for k in ("mechanism", "baseline")]
            if all(logged):
                ratio = logged[0] / logged[1]
                how += (
                    f" (The runs' own logged step times give {ratio:.3f}x, but "
                    "they include whatever else ran on the machine during each run.)"
                )
                if not low <= ratio <= high:  # both ratios, where they differ
                    mechanism = (record.get("configs") or {}).get(b["mechanism"]) or {}
                    iters = mechanism.get("train", {}).get("max_iters")
                    how += " **The two ratios differ** (the logged one lies outside the timed IQR)"
                    how += (
                        f": matched by the logged ratio, `{name}` would train "
                        f"{max(1, round(iters * ratio))} iterations."
                        if isinstance(iters, int)
                        else "."
                    )
        else:  # a budget an earlier attnlab computed, kept so that every seed trains alike
            how = (
                f" ({times}), from the runs' own logged step times (mean over seeds), which "
                "include whatever else ran on the machine during each run; a fresh --out times "
                "both arms side by side."
            )
        lines += [
            f"{speeds}{how} So `{name}` trains {b['baseline']} for {b['iters']} iterations.",
            "",
            *_schedule_lines(name, b, record.get("configs") or {}),
        ]
    return lines


def _schedule_lines(name: str, budget: dict[str, Any], configs: dict[str, Any]) -> list[str]:
    """The wall-clock arm's stretched schedule beside its baseline's, and whether the timing
    ratio's IQR tells the arm apart from the equal-iteration one."""
    lines = []
    arm, base = configs.get(name), configs.get(budget["baseline"])
    if arm and base:

        def schedule(train: dict[str, Any]) -> str:
            if not train["decay_lr"]:
                return f"{train['max_iters']} iterations at a constant learning rate"
            end = train["lr_decay_iters"] or train["max_iters"]
            return (
                f"{train['max_iters']} iterations, warmup {train['warmup_iters']}, cosine decay "
                f"to {train['min_lr']:g} at iteration {end}"
            )

        lines += [
            f"Its schedule as its runs train it: {schedule(arm['train'])} "
            f"({budget['baseline']}: {schedule(base['train'])}).",
            "",
        ]
    iqr = budget.get("ratio_iqr")  # none from an earlier attnlab's logged step times
    if not iqr:
        return lines
    if iqr[0] <= 1.0 <= iqr[1]:
        lines.append(
            f"The timing ratio's IQR ({iqr[0]:.3f}-{iqr[1]:.3f}) spans 1.0: "
            f"{budget['mechanism']}'s step cannot be told apart from {budget['baseline']}'s in "
            f"time, so `{name}` cannot be told apart from the equal-iteration "
            f"{budget['baseline']} arm."
        )
    else:
        lines.append(f"The timing ratio's IQR ({iqr[0]:.3f}-{iqr[1]:.3f}) excludes 1.0.")
    return [*lines, ""]


def _interval(pair: list[Any] | None, fmt: str, unit: str = "") -> str:
    """A [low, high] interval as "low – high" and its unit ("–" without one)."""
    if not pair or not all(isinstance(x, float | int) and math.isfinite(x) for x in pair):
        return "–"
    return f"{pair[0]:{fmt}} – {pair[1]:{fmt}}{unit}"


def _comparison_table(comparisons: list[dict[str, Any]]) -> list[str]:
    rows = [
        [
            f"{c['variant']} vs {c['baseline']}",
            str(c["n"]),
            num(c["mean_diff"], "+.4f"),
            _interval(c.get("ci95"), "+.4f"),
            _interval(c.get("bootstrap_ci95"), "+.4f"),
            num(c["ppl_change_pct"], "+.2f") + " %",
            _interval(c.get("ppl_ci95_pct"), "+.2f", " %"),
            f"{num(c['t'], '.2f')} ({c['df']})",
            num(c.get("reference_t"), ".2f"),
            p_cell(c),
            p_value(c["p_holm"]),
            c["wins"],
            num(c.get("mde"), ".4f"),
        ]
        for c in comparisons
    ]
    header = ["comparison", "n", "mean diff", "95 % CI (t)", "95 % CI (bootstrap)"]
    header += ["ppl change", "ppl 95 % CI", "t (df)", "seed's t", "p", "p Holm", "wins"]
    return md_table([*header, "MDE (80 %)"], rows)


def verdict(c: dict[str, Any]) -> str:
    """One comparison's verdict at p < 0.05, with what its seeds could see: an inconclusive
    one always says which effect they could detect and how many seeds the seed's claim needs."""
    what = f"{c['variant']} vs {c['baseline']}"
    n, p = c["n"], c.get("p")
    if c.get("no_spread"):
        return (
            f"**{what}: no test.** Every seed differs by the same {num(c['mean_diff'], '+.4f')}, "
            "which a t-test cannot weigh."
        )
    if p is None or not math.isfinite(p):
        return f"**{what}: no test.** {n} finished pair(s); a paired t-test needs two."
    ours = f"t({c['df']}) = {c['t']:.2f}, p = {p_value(p)}"
    if c.get("reference_t") is not None:
        ours += f"; the seed's t = {c['reference_t']:.2f}"
    word = ruled(c)
    if p < ALPHA:
        side = "lower" if c["mean_diff"] < 0 else "higher"
        held = (
            "" if c["p_holm"] < ALPHA else f" (not after Holm's correction: {p_value(c['p_holm'])})"
        )
        return (
            f"**{what}: {word}**; {c['variant']} {side} by {c['mean_diff']:+.4f} "
            f"(95 % CI {_interval(c['ci95'], '+.4f')}; {ours}){held}."
        )
    sees = (
        f"At the observed spread (sd of the per-seed differences {c['sd_diff']:.4f}) {n} seeds "
        f"detect a difference of ±{c['mde']:.4f} at {100 * POWER:.0f} % power (paired t, "
        f"two-sided, α = {ALPHA})"
    )
    claim, needed = c.get("claimed_diff"), c.get("seeds_for_claim")
    if claim is None:
        claimed = (
            "; the seed gives no values for both arms, so there is no claimed effect to size "
            "seeds for."
        )
    elif needed is None:
        claimed = f"; not even {MAX_SEEDS:,} seeds would detect the seed's claimed {claim:+.4f}."
    elif needed <= n:
        claimed = (
            f"; {needed} would already detect the seed's claimed {claim:+.4f}, so these {n} "
            "seeds do not bear that claim out."
        )
    else:
        claimed = f"; detecting the seed's claimed {claim:+.4f} would take {needed} seeds."
    return f"**{what}: {word}** ({ours}). {sees}{claimed}"


def ruled(c: dict[str, Any]) -> rule.Verdict:
    """The comparison's verdict by the one rule (attnlab.studies.verdict), over its Holm interval
    against the seed's claimed difference where the spec gives one."""
    low, high = c.get("ci95_holm") or holm_ci(c)
    return rule.verdict(
        c["mean_diff"],
        (low, high),
        c.get("claimed_diff"),
        n=c["n"],
        edge_of_grid=bool(c.get("edge_of_grid")),
        sizes=c.get("sizes", 1),
    )


def _curves(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per variant, at each evaluated iteration every finished seed logged: the mean val loss
    over seeds, its lowest and highest seed, and the number of seeds."""
    per_variant: dict[str, list[dict[int, float]]] = {}
    for r in runs:
        points = val_curve(r["run_dir"]) if r["status"] == "ok" else {}
        if points:
            per_variant.setdefault(r["variant"], []).append(points)
    curves = {}
    for name, seeds in per_variant.items():
        iters = sorted(set.intersection(*(set(s) for s in seeds)))
        if not iters:  # seeds evaluated at other iterations (a copy logged otherwise): no mean
            continue
        curves[name] = {
            "iters": iters,
            "mean": [sum(s[i] for s in seeds) / len(seeds) for i in iters],
            "low": [min(s[i] for s in seeds) for i in iters],
            "high": [max(s[i] for s in seeds) for i in iters],
            "seeds": len(seeds),
        }
    return curves


def plot_curves(runs: list[dict[str, Any]], path: Path, title: str, order: list[str]) -> bool:
    """The seed's Figure 1: val loss against iteration per variant, the mean over seeds as a
    line and the spread between the lowest and highest seed as a band; ``order`` (the spec's
    variants) styles them as in the report's other figures. A second panel zooms into the
    convergence window, where the final losses the comparisons weigh separate (the whole
    descent spans a range many times the differences between variants)."""
    curves = _curves(runs)
    if not curves:
        return False
    ends = [c["iters"][-1] for c in curves.values() if c["iters"]]
    end = max(set(ends), key=ends.count)  # the budget most variants train for
    start = (1 - LAST_FRACTION) * end
    zoom = any(sum(i >= start for i in c["iters"]) > 1 for c in curves.values())
    plt = pyplot()
    fig, axes = plt.subplots(
        1,
        2 if zoom else 1,
        figsize=(11 if zoom else 7.5, 5),
        width_ratios=[3, 2] if zoom else None,
        squeeze=False,
        layout="constrained",
    )
    styles = series_styles(list(curves), order)
    for ax in axes[0]:
        for name, c in curves.items():
            ax.plot(
                c["iters"],
                c["mean"],
                **styles[name],
                ms=4,
                mfc="none",
                label=f"{name} (mean of {c['seeds']} seed{'s' if c['seeds'] > 1 else ''})",
            )
            if c["seeds"] > 1:
                ax.fill_between(
                    c["iters"], c["low"], c["high"], color=styles[name]["color"], alpha=0.15, lw=0
                )
        ax.set(xlabel="iteration", ylabel="validation loss (nats per token)")
        ax.grid(alpha=0.3)
    whole = axes[0][0]
    # the first eval (iter 0) is near log(vocab) and would flatten everything after it
    _fit_y(whole, curves, lambda i: i > 0)
    whole.axvspan(
        start,
        end,
        color="0.85",
        zorder=0,
        label=f"last {100 * LAST_FRACTION:.0f} % of {end:,} iterations (convergence window)",
    )
    whole.set_title("line: mean over seeds; band: lowest to highest seed", fontsize=9)
    if zoom:
        window = axes[0][1]
        pad = 0.02 * (max(ends) - start)  # the end points' markers whole
        window.set_xlim(start - pad, max(ends) + pad)
        _fit_y(window, curves, lambda i: i >= start)
        window.set_title("the convergence window, zoomed", fontsize=9)
    fig.suptitle(title, fontsize=11)
    legend_outside(fig, list(axes[0]), ncol=2)
    save_figure(fig, path)
    return True


def _fit_y(ax: Any, curves: dict[str, dict[str, Any]], shown: Callable[[int], bool]) -> None:
    """Set ``ax``'s y range to the bands' values at the iterations ``shown`` selects, with a
    margin of 5 %."""
    values = [
        v
        for c in curves.values()
        for i, low, high in zip(c["iters"], c["low"], c["high"], strict=True)
        if shown(i)
        for v in (low, high)
    ]
    if values:
        lo, hi = min(values), max(values)
        ax.set_ylim(lo - 0.05 * (hi - lo + 1e-9), hi + 0.05 * (hi - lo + 1e-9))


def _paired_differences(
    loss: dict[tuple[str, int], float], comparison: dict[str, Any]
) -> list[float]:
    """The comparison's per-seed differences (variant - baseline final val loss), seed order;
    ``loss`` maps (variant, seed) to the final val loss of each finished run."""
    pairs = [(comparison["variant"], s, comparison["baseline"]) for s in comparison["seeds"]]
    return [loss[v, s] - loss[b, s] for v, s, b in pairs if (v, s) in loss and (b, s) in loss]


def plot_paired(results: dict[str, Any], path: Path, title: str) -> Any | None:
    """What each paired t-test weighs, drawn: one row per comparison with every seed's
    difference, their mean with its 95 % t interval (and the bootstrap one where there are
    seeds enough), and the seed's own difference where it published one. The figure, or None
    when no comparison has seeds to draw. Needs only results.json, so --report-only redraws it."""
    comparisons = [c for c in results["comparisons"] if c.get("seeds") and c.get("ci95")]
    if not comparisons:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 1.8 + 0.75 * len(comparisons)), layout="constrained")
    loss = {
        (r["variant"], r["seed"]): r["val_loss"] for r in results["runs"] if r["status"] == "ok"
    }
    # the first comparison on top, as in the report's table
    rows = [(len(comparisons) - 1 - i, c) for i, c in enumerate(comparisons)]
    ticks, core = [], [0.0]  # core: what the x range must show (0, dots, means, the seed's)
    for y, c in rows:
        diffs = _paired_differences(loss, c)
        spread = 0.12 * (len(diffs) > 1)  # seeds side by side, not on one another
        offsets = [spread * (2 * i / max(len(diffs) - 1, 1) - 1) for i in range(len(diffs))]
        ax.plot(diffs, [y + o for o in offsets], "o", color="C0", mfc="none", label="one seed")
        core += [*diffs, c["mean_diff"], *(c.get("bootstrap_ci95") or [])]
        low, high = c["ci95"]
        if math.isfinite(low) and math.isfinite(high):
            ax.errorbar(
                c["mean_diff"],
                y,
                xerr=[[c["mean_diff"] - low], [high - c["mean_diff"]]],
                fmt="D",
                color="k",
                capsize=5,
                label="mean, 95 % t interval",
            )
        else:  # one seed, or no spread: a mean without an interval
            ax.plot(c["mean_diff"], y, "D", color="k", label="mean (no interval: no spread)")
        if c.get("bootstrap_ci95"):
            ax.plot(c["bootstrap_ci95"], [y - 0.28] * 2, color="0.55", lw=3, label="bootstrap 95 %")
        if c.get("claimed_diff") is not None:
            ax.plot(
                c["claimed_diff"], y, "x", color="C3", ms=10, mew=2, label="the seed's difference"
            )
            core.append(c["claimed_diff"])
        ticks.append((y, f"{c['variant']}\n− {c['baseline']}\nn = {c['n']}, p = {p_cell(c)}"))
    ax.axvline(0.0, color="0.3", lw=0.8, ls="--", zorder=0)
    _clip_intervals(ax, rows, core)
    ax.set_yticks([y for y, _ in ticks], [label for _, label in ticks], fontsize=8)
    ax.set_ylim(-0.6, len(comparisons) - 0.4)
    ax.set(
        xlabel="difference in final validation loss (nats per token); below 0: the variant is "
        "lower",
        ylabel="comparison",
        title=f"{title}\nper seed, variant minus baseline, same seed",
    )
    ax.grid(alpha=0.3, axis="x")
    legend_outside(fig, [ax], ncol=4)
    save_figure(fig, path)
    return fig


def _clip_intervals(ax: Any, rows: list[tuple[int, dict[str, Any]]], core: list[float]) -> None:
    """Set the x range to show ``core`` and every t interval not far wider than it; one that
    runs far past (a t(1) interval of two seeds is 12.7 standard errors wide) is cut at the
    edge with an arrowhead, so that it does not squash every other row to a point."""
    shown = [x for x in core if math.isfinite(x)]  # a diverged seed's NaN has no place; 0 stays
    low, high = min(shown), max(shown)
    span = high - low or abs(high) or 1e-3
    reach = (low - 1.5 * span, high + 1.5 * span)
    ends = [e for _, c in rows for e in c["ci95"] if reach[0] <= e <= reach[1]]  # NaN: none
    left, right = min([low, *ends]), max([high, *ends])
    # nothing but 0 to show (every difference NaN, or exactly 0): identical limits would make
    # matplotlib warn and widen them its own way, so the range is the span around the point
    pad = 0.06 * (right - left) if right > left else span
    left, right = left - pad, right + pad
    ax.set_xlim(left, right)
    for y, c in rows:
        low_end, high_end = c["ci95"]
        for past, edge, head in ((low_end < left, left, "<"), (high_end > right, right, ">")):
            if past:
                ax.plot(edge, y, head, color="k", ms=7, clip_on=False,
                        label="interval runs on past the edge")  # fmt: skip
