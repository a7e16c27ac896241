"""The report of an lm study run under a protocol (attnlab.studies.protocol): the evaluation
protocol, the learning-rate tuning and its figure, how the seeds were chosen, the comparisons
at the tuned and the recipe's learning rates at every size, and the trend of each gain over
sizes with its figure. Everything here is read from results.json and study.json."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from attnlab.plotting import legend_outside, plain_log_ticks, pyplot, save_figure, series_styles
from attnlab.studies.kinds import lm_report
from attnlab.studies.kinds.base import Study
from attnlab.studies.output import figure_link
from attnlab.studies.protocol import FEW_SEEDS, RECIPE, TUNED
from attnlab.studies.report import md_table, num, p_value

LR_FIGURE = "lr.png"
SCALE_FIGURE = "scale.png"
# figure path -> the data it was last drawn from in this process: a study publishes after every
# run, and redrawing an unchanged figure each time cost more than the runs of a small study
_DRAWN: dict[Path, str] = {}


def _unchanged(path: Path, data: Any) -> bool:
    """Whether ``path`` already shows ``data`` (drawn from it in this process); else remember
    that it is about to."""
    signature = json.dumps(data, sort_keys=True, default=str)
    if _DRAWN.get(path) == signature and path.is_file():
        return True
    _DRAWN[path] = signature
    return False


def _at(size: str | None) -> str:
    return f" ({size})" if size is not None else ""


def sections(study: Study, results: dict[str, Any], record: dict[str, Any]) -> list[str]:
    """report.md's sections of a protocol study."""
    kept = record["protocol"]
    runs = results["runs"]
    tuning = set(kept["tuning_seeds"])
    evaluated = [r for r in runs if r["seed"] not in tuning]
    stats = {name: s for name, s in record["variants"].items() if s["n"] or s["failed"]}
    lines = [
        *_protocol_lines(kept, record),
        *_tuning_lines(study, kept),
        *_seed_lines(kept),
        "## Variants",
        "",
        "Each arm's cells (its size and learning rate) over the evaluation seeds; std is the "
        "sample std (n − 1) and the 95 % CI Student's t.",
        "",
        *lm_report._variant_table(stats, evaluated, record.get("configs") or {}),
        *lm_report._convergence_lines(evaluated),
        *lm_report._training_time_lines(runs, record),
        "## Comparisons",
        "",
        "Paired by evaluation seed: `scipy.stats.ttest_rel(variant, baseline)` on final val "
        "losses, at each size, once with every arm at its own tuned learning rate (the fair "
        "comparison) and once at the recipe's (what the seed did). Holm's correction is made "
        "within each of the two; the Holm CI is the t interval at the level 1 − α·p/p_Holm, "
        "which excludes 0 exactly when the Holm-adjusted p is below 0.05.",
        "",
        *_comparison_table(results["comparisons"]),
        *_comparison_notes(results["comparisons"], kept),
        *_trend_lines(study, kept, record),
    ]
    failed = [r for r in runs if r["status"] == "failed"]
    if failed:
        lines += [
            "## Failed runs",
            "",
            *(f"- {r['variant']} seed {r['seed']}: `{r['error']}`" for r in failed),
            "",
        ]
    return lines


def _protocol_lines(kept: dict[str, Any], record: dict[str, Any]) -> list[str]:
    """What the protocol is: its evaluation, its learning rates, sizes and seeds."""
    train = next(iter((record.get("configs") or {}).values()), {}).get("train", {})
    evaluation = (
        "**Evaluation.** Every run's validation loss is the mean over the same fixed "
        f"validation batches ({train.get('eval_iters', '?')} batches of "
        f"{train.get('batch_size', '?')} drawn once from eval seed {train.get('eval_seed', '?')}"
        "), identical for every run, arm and evaluation: nanoGPT draws fresh random batches at "
        "each evaluation instead, so our losses have less evaluation noise but are not its "
        "numbers."
        if train.get("eval_batches", "fixed") == "fixed"
        else "**Evaluation.** Every run's validation loss is the mean over "
        f"{train.get('eval_iters', '?')} batches of {train.get('batch_size', '?')} drawn anew "
        'at each evaluation (nanoGPT\'s way, `eval_batches = "fresh"`), keyed by eval seed '
        f"{train.get('eval_seed', '?')} and the iteration, so every run and arm scores the same "
        "batches at the same step."
    )
    grid = kept["lr_grid"]
    lr = (
        f"**Learning rate.** Each arm is trained at every LR of the grid "
        f"{', '.join(f'{x:g}' for x in grid)} on the tuning seeds "
        f"{', '.join(map(str, kept['tuning_seeds']))} (never evaluation seeds); its best LR is "
        "the one of the lowest mean final val loss over them, and the evaluation seeds train "
        "it there and at the recipe's LR. A grid LR other than the recipe's keeps the "
        "recipe's ratio of min_lr to learning_rate."
        if grid
        else "**Learning rate.** Every arm at its recipe's LR (the scale gives no lr_grid)."
    )
    sizes = kept["sizes"]
    size = (
        f"**Sizes.** {len(sizes)}: {', '.join(sizes)}; every comparison is made at each."
        if sizes
        else "**Size.** One (sizes = 1): what this study finds holds at this size only."
    )
    return ["## Protocol", "", evaluation, "", lr, "", size, ""]


def _tuning_lines(study: Study, kept: dict[str, Any]) -> list[str]:
    """The tuning table (mean loss per grid LR, the best marked) and the LR figure."""
    if not kept["tuning"]:
        return []
    grid = kept["lr_grid"]
    best = {(b["arm"], b["size"]): b for b in kept["best_lr"] or []}
    rows = []
    keys = list(dict.fromkeys((t["arm"], t["size"]) for t in kept["tuning"]))
    for key in keys:
        means = {t["lr"]: t for t in kept["tuning"] if (t["arm"], t["size"]) == key}
        chosen = best.get(key, {})
        cells = []
        for lr in grid:
            t = means[lr]
            text = num(t["mean"]) if t["done"] else "…"
            cells.append(f"**{text}**" if chosen.get("lr") == lr else text)
        edge = chosen.get("edge_of_grid")
        rows.append(
            [
                f"{key[0]}{_at(key[1])}",
                *cells,
                num(chosen.get("lr"), "g"),
                "–" if edge is None else ("**yes**" if edge else "no"),
            ]
        )
    header = ["arm", *(f"lr {x:g}" for x in grid), "best LR", "edge of grid"]
    lines = [
        "## Learning-rate tuning",
        "",
        f"Mean final val loss over the {len(kept['tuning_seeds'])} tuning seeds at each LR "
        "(… : not all trained yet; bold: the best).",
        "",
        *md_table(header, rows),
    ]
    edged = [f"{a}{_at(z)}" for (a, z), b in best.items() if b["edge_of_grid"]]
    if edged:
        lines += [
            f"**Best LR at an edge of the grid: {', '.join(edged)}.** Its best may lie beyond "
            "the grid, so the tuned comparisons that involve it carry `edge_of_grid` and give "
            "no verdict: widen the grid on that side.",
            "",
        ]
    path = study.out.figure(LR_FIGURE)
    tuned = all(t["done"] for t in kept["tuning"])  # drawn once tuning is complete
    title = f"{study.spec.name}: learning-rate tuning"
    if tuned and (_unchanged(path, kept["tuning"]) or plot_lr(kept, path, title)):
        lines += [f"![mean final val loss against learning rate]({figure_link(LR_FIGURE)})", ""]
    return lines


def _seed_lines(kept: dict[str, Any]) -> list[str]:
    """How the number of evaluation seeds was chosen."""
    seeds = kept["seeds"]
    if seeds.get("rule") != "auto":
        return [f"**Seeds.** {seeds.get('n')} evaluation seeds, as the spec fixes them.", ""]
    if seeds.get("n") is None:
        return [
            f"**Seeds.** Set by power: a pilot of {seeds['pilot_seeds']} evaluation seeds "
            "estimates the paired spread; n is chosen once it has trained.",
            "",
        ]
    rows = [
        [
            f"{s['variant']} vs {s['baseline']}{_at(s['size'])}",
            ", ".join(f"{d:+.4f}" for d in s["pilot_diffs"]),
            num(s["sd"]),
            "unreachable" if s["needed"] is None else str(s["needed"]),
        ]
        for s in seeds["spreads"]
    ]
    powers = "; ".join(
        f"{100 * p['power']:.0f} % for {p['effect']:+.4f}"
        if math.isfinite(p["power"] or math.nan)
        else f"– for {p['effect']:+.4f}"
        for p in seeds["power_at_n"]
    )
    capped = f", capped at max_seeds = {seeds['max_seeds']}" if seeds["capped"] else ""
    return [
        "## Seeds",
        "",
        f"Set by power: the first {seeds['pilot_seeds']} evaluation seeds were a pilot at the "
        "tuned learning rates. From each comparison's pilot differences, the seeds a two-sided "
        f"paired t-test (α = {seeds['alpha']}, exact noncentral t) needs to detect the smallest "
        f"effect of interest, |{seeds['sized_for']:.4f}|, with {100 * seeds['power']:.0f} % "
        f"power; n is the most any comparison needs (at least the pilot's{capped}), fixed "
        "before any later seed trained, and the pilot seeds count in the tests below.",
        "",
        *md_table(["comparison", "pilot differences", "sd", "seeds needed"], rows),
        f"**n = {seeds['n']}.** Power at n for the widest spread: {powers}.",
        "",
    ]


def _comparison_table(comparisons: list[dict[str, Any]]) -> list[str]:
    rows = []
    for c in comparisons:
        lr = c["lr"]
        edge = c.get("edge_of_grid")
        rows.append(
            [
                f"{c['variant']} vs {c['baseline']}",
                c["size"] or "–",
                f"{c['lr_basis']} ({lr['variant']:g} vs {lr['baseline']:g})",
                str(c["n"]) + (" (< 5)" if c["few_seeds"] else ""),
                num(c["mean_diff"], "+.4f"),
                lm_report._interval(c.get("ci95"), "+.4f"),
                lm_report._interval(c.get("ci95_holm"), "+.4f"),
                num(c["ppl_change_pct"], "+.2f") + " %",
                p_value(c["p"]),
                p_value(c["p_holm"]),
                "–" if c["converged"] is None else ("yes" if c["converged"] else "**no**"),
                "–" if edge is None else ("**yes**" if edge else "no"),
            ]
        )
    header = ["comparison", "size", "LR (variant vs baseline)", "n", "mean diff", "95 % CI"]
    header += ["Holm 95 % CI", "ppl change", "p", "p Holm", "converged", "edge of grid"]
    return md_table(header, rows)


def _comparison_notes(comparisons: list[dict[str, Any]], kept: dict[str, Any]) -> list[str]:
    """What each comparison's record says a verdict must weigh."""
    notes = []
    few = [c for c in comparisons if c["few_seeds"]]
    if few:
        notes.append(
            f"- {len(few)} comparison(s) rest on fewer than {FEW_SEEDS} seeds (`few_seeds`): "
            "their spread is estimated from so few differences that a verdict says so."
        )
    edged = [c for c in comparisons if c.get("edge_of_grid")]
    if edged:
        notes.append(
            f"- {len(edged)} tuned comparison(s) have an arm whose best LR lies at an edge of "
            "the grid (`edge_of_grid`): no verdict until the grid is widened."
        )
    if not kept["sizes"]:
        notes.append("- One size (`sizes = 1`): a verdict holds at this size only.")
    flipped = _flips(comparisons)
    if flipped:
        notes.append(
            "- The sign of the gain differs between the recipe's and the tuned learning rates "
            f"for: {', '.join(flipped)}."
        )
    return [*notes, ""] if notes else []


def _flips(comparisons: list[dict[str, Any]]) -> list[str]:
    """The comparisons (at a size) whose mean difference changes sign between the two bases."""
    by = {(c["variant"], c["baseline"], c["size"], c["lr_basis"]): c for c in comparisons}
    out = []
    for (v, b, z, basis), c in by.items():
        other = by.get((v, b, z, RECIPE))
        if basis == TUNED and other and c["mean_diff"] * other["mean_diff"] < 0:
            out.append(f"{v} vs {b}{_at(z)}")
    return out


def _trend_lines(study: Study, kept: dict[str, Any], record: dict[str, Any]) -> list[str]:
    """The gain at each size and its slope against log10 parameters, and the scale figure."""
    if not kept["trend"]:
        return []
    rows = [
        [
            f"{t['variant']} vs {t['baseline']}",
            t["lr_basis"],
            "; ".join(
                f"{z}: {g:+.4f} ({lm_report._interval(ci, '+.4f')})"
                for z, g, ci in zip(t["sizes"], t["gain"], t["gain_ci95"], strict=True)
            ),
            num(t["slope_per_decade"], "+.4f"),
            lm_report._interval(t["slope_ci95"], "+.4f"),
            str(len(t["seeds"])),
        ]
        for t in kept["trend"]
    ]
    header = ["comparison", "LR", "gain at each size (95 % CI)", "slope per decade", "95 % CI"]
    lines = [
        "## Gain against scale",
        "",
        "The gain (mean paired difference, variant − baseline, so below 0 the variant is "
        "better) at each size, and its slope against log10 of the parameters (the mean of the "
        "two arms' counts): a least-squares slope per seed over the sizes, on the seeds every "
        "size has, and its 95 % t interval over seeds. A negative slope: the gain grows with "
        "size.",
        "",
        *md_table([*header, "seeds"], rows),
    ]
    path = study.out.figure(SCALE_FIGURE)
    title = f"{study.spec.name}: loss against parameters"
    if _unchanged(path, [record["variants"], kept["trend"]]) or plot_scale(
        record, kept, path, title
    ):
        lines += [f"![final val loss against parameters per arm]({figure_link(SCALE_FIGURE)})", ""]
    return lines


def plot_lr(kept: dict[str, Any], path: Path, title: str) -> bool:
    """Mean final val loss over the tuning seeds against LR (log x), one line per arm and
    size, the spread of the seeds as error bars and each tuned LR marked with a star."""
    done = [t for t in kept["tuning"] if any(math.isfinite(x or math.nan) for x in t["losses"])]
    if not done:
        return False
    keys = list(dict.fromkeys((t["arm"], t["size"]) for t in done))
    labels = [f"{a}{_at(z)}" for a, z in keys]
    styles = series_styles(labels)
    best = {(b["arm"], b["size"]): b["lr"] for b in kept["best_lr"] or []}
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 5), layout="constrained")
    for key, label in zip(keys, labels, strict=True):
        points = [t for t in done if (t["arm"], t["size"]) == key]
        xs = [t["lr"] for t in points]
        finite = [[x for x in t["losses"] if x is not None and math.isfinite(x)] for t in points]
        means = [sum(f) / len(f) if f else math.nan for f in finite]
        low = [m - min(f) if f else 0.0 for m, f in zip(means, finite, strict=True)]
        high = [max(f) - m if f else 0.0 for m, f in zip(means, finite, strict=True)]
        style = styles[label]
        ax.errorbar(xs, means, yerr=[low, high], capsize=3, mfc="none", label=label, **style)
        if best.get(key) in xs:
            at = xs.index(best[key])
            ax.plot(xs[at], means[at], "*", color=style["color"], ms=16, mec="k",
                    label="tuned LR (lowest mean)")  # fmt: skip
    _finish(fig, ax, path, "peak learning rate", f"{title}\nmean over the tuning seeds; bars: "
            "lowest to highest seed")  # fmt: skip
    return True


def _finish(fig: Any, ax: Any, path: Path, x: str, title: str) -> None:
    """Label a loss-against-``x`` figure on a log x axis, add its legend and save it."""
    ax.set_xscale("log")
    plain_log_ticks(ax, "x")
    ax.set(xlabel=f"{x} (log scale)", ylabel="final validation loss (nats per token)", title=title)
    ax.grid(alpha=0.3, which="both")
    legend_outside(fig, [ax], ncol=2)
    save_figure(fig, path)


def plot_scale(record: dict[str, Any], kept: dict[str, Any], path: Path, title: str) -> bool:
    """Each arm's mean final val loss over the evaluation seeds against its parameter count
    (log x) at each size, with its 95 % CI: solid at its tuned LR, dashed at the recipe's."""
    stats = record["variants"]
    cells = {(c["arm"], c["size"], c["lr"]): c["cell"] for c in kept["cells"]}
    best = {(b["arm"], b["size"]): b["lr"] for b in kept["best_lr"] or []}
    recipe = {(r["arm"], r["size"]): r["lr"] for r in kept["recipe_lr"]}
    arms = list(dict.fromkeys(a for a, _ in recipe))
    styles = series_styles(arms)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 5), layout="constrained")
    drawn = False
    for arm in arms:
        for basis, lrs, ls in ((TUNED, best, "-"), (RECIPE, recipe, "--")):
            points = []
            for (a, z), lr in lrs.items():
                s = stats.get(cells.get((a, z, lr), ""), {})
                if a == arm and s.get("n") and s.get("params"):
                    points.append((s["params"], s["mean"], s["ci95_low"], s["ci95_high"]))
            points.sort()
            if len(points) < 1:
                continue
            xs, ys = [p[0] for p in points], [p[1] for p in points]
            # no interval (one seed): no bar
            err = [[abs(y - e) if e is not None and math.isfinite(e) else 0.0
                    for y, e in zip(ys, ends, strict=True)]
                   for ends in ([p[2] for p in points], [p[3] for p in points])]  # fmt: skip
            style = {**styles[arm], "ls": ls}
            ax.errorbar(xs, ys, yerr=err, capsize=3, mfc="none" if basis == RECIPE else None,
                        label=f"{arm} ({basis} LR)", **style)  # fmt: skip
            drawn = True
    if not drawn:
        plt.close(fig)
        return False
    _finish(fig, ax, path, "parameters", f"{title}\nmean over the evaluation seeds, bars: 95 % t "
            "interval")  # fmt: skip
    return True
