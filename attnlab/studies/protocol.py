"""A scale's comparison protocol (docs/studies-protocol.md): every arm at its own best learning
rate, at every size, over a number of seeds set by power.

A scale that gives ``lr_grid``, ``sizes`` or ``seeds = "auto"`` expands each arm of the spec
into cells, one per (arm, size, learning rate): variants of their own, named
``ARM[.SIZE][.lrLR]``, each with the seeds its phase has reached. The study then runs in phases,
each one resumable, the choices between them kept in study.json (``protocol``):

1. tuning: every cell of the grid on the tuning seeds; each arm's best LR at each size is the
   one whose mean final val loss over them is lowest (``edge_of_grid`` where it is the grid's
   first or last point);
2. evaluation: each arm at its best LR and at its recipe's LR on the evaluation seeds 0 .. n-1;
   with ``seeds = "auto"`` the first ``pilot_seeds`` of them are a pilot whose paired spread
   fixes n (the seeds that detect the smallest effect at 80 % power, at most ``max_seeds``)
   once, before any later seed trains; the pilot seeds count in the final test.

Each comparison is made at each size and at both LRs, Holm-corrected within each LR basis; a
spec of two or more sizes also gets the trend of each gain against log10 parameters.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from attnlab.config import TrainConfig
from attnlab.errors import AttnlabError
from attnlab.studies.spec import NAME_MAX, Comparison, Protocol, StudySpec, Variant
from attnlab.studies.stats import (
    ALPHA,
    POWER,
    holm,
    holm_ci,
    paired_comparison,
    paired_power,
    seeds_needed,
    summarize,
)
from attnlab.train.spec import as_overrides, configs

FEW_SEEDS = 5  # a comparison over fewer evaluation seeds says so in its record
TUNED, RECIPE = "tuned", "recipe"  # the two LR bases a comparison is made at

Key = tuple[str, str | None]  # (arm, size; None where the scale gives no sizes)


@dataclass(frozen=True)
class Expanded:
    """A protocol scale as its preset expanded it, with the choices made so far."""

    protocol: Protocol
    arms: dict[str, Variant]  # the spec's own variants
    comparisons: list[Comparison]  # the spec's own comparisons
    sizes: list[str | None]
    recipe: dict[Key, float]  # each arm's recipe LR at each size
    fixed_seeds: int  # the evaluation seeds without "auto" (the scale's or --seeds)
    best: dict[Key, float | None] | None = None  # None: not tuned yet (or no grid: the recipe)
    n: int | None = None  # the evaluation seeds chosen (None: not yet)
    choice: dict[str, Any] = field(default_factory=dict)  # how n was chosen

    @property
    def grid(self) -> tuple[float, ...]:
        return self.protocol.lr_grid

    def cell(self, arm: str, size: str | None, lr: float) -> str:
        """The variant name of ``arm`` at ``size`` and learning rate ``lr``."""
        parts = [arm, *([size] if size is not None else []), *([f"lr{lr:g}"] if self.grid else [])]
        return ".".join(parts)

    def tuned(self, key: Key) -> float | None:
        """The LR ``key`` is evaluated at: its best once tuned, its recipe's without a grid."""
        if not self.grid:
            return self.recipe[key]
        return None if self.best is None else self.best.get(key)

    def edge(self, key: Key) -> bool | None:
        """Whether ``key``'s best LR lies at an edge of the grid (None: not tuned)."""
        lr = self.tuned(key) if self.grid else None
        return None if lr is None else lr in (self.grid[0], self.grid[-1])

    def eval_seeds(self) -> list[int]:
        """The evaluation seeds the study has reached: none before tuning, the pilot's before n
        is chosen, then 0 .. n-1."""
        if self.grid and self.best is None:
            return []
        if not self.protocol.auto:
            return list(range(self.fixed_seeds))
        return list(range(self.n if self.n is not None else self.protocol.pilot_seeds))

    def all_seeds(self) -> list[int]:
        """Every seed a run of the study may train with: the evaluation seeds it may reach,
        then the tuning seeds."""
        cap = self.protocol.max_seeds if self.protocol.auto else self.fixed_seeds
        return [*range(cap), *sorted(self.protocol.tuning_seeds)]


def _same(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9)


def _recipe(
    spec: StudySpec, arm: Variant, preset: str, size: str | None
) -> tuple[dict[str, Any], dict[str, Any], TrainConfig]:
    """(model, train) overrides of ``arm`` at ``size`` and the training config they resolve
    to: the scale's layering, then the size's overrides for every arm, then its own for ``arm``."""
    model, train = spec.layered(arm, preset)
    if size is not None:
        table = spec.scale(preset).protocol.sizes[size]  # type: ignore[union-attr]
        own = table.get("variants", {}).get(arm.name, {})
        model = {**model, **table.get("model", {}), **own.get("model", {})}
        train = {**train, **table.get("train", {}), **own.get("train", {})}
    return model, train, configs(arm.preset, as_overrides(model) + as_overrides(train))[1]


def expand(
    spec: StudySpec, preset: str, kept: dict[str, Any] | None, seeds: int | None = None
) -> StudySpec:
    """``spec`` at ``preset`` with its arms expanded into cells where the scale gives a
    protocol (unchanged otherwise), with the choices ``kept`` in an earlier study.json's
    ``protocol``; ``seeds`` (``--seeds``) the evaluation seeds where they are not "auto"."""
    scale = spec.scale(preset)
    protocol = scale.protocol
    if protocol is None:
        return spec
    where = f"{spec.source}: scale {preset}"
    if spec.to_train is not None:
        raise AttnlabError(f"--variants: {where} runs a protocol, which trains every arm")
    if spec.params.get("analyses"):
        raise AttnlabError(f"{where}: a protocol scale runs no analyses; leave params.analyses out")
    if seeds is not None and protocol.auto:
        raise AttnlabError(f'--seeds: {where} sets its seeds by power (seeds = "auto")')
    fixed = seeds if seeds is not None else scale.seeds
    overlap = sorted(set(protocol.tuning_seeds) & set(range(fixed)))
    if overlap and not protocol.auto:
        raise AttnlabError(
            f"--seeds {fixed}: tuning seed {overlap[0]} of {where} would be an evaluation seed "
            "too; they must be disjoint"
        )
    sizes = list(protocol.sizes) or [None]
    recipe = {}
    for arm, variant in spec.variants.items():
        for size in sizes:
            try:
                recipe[arm, size] = _recipe(spec, variant, preset, size)[2].learning_rate
            except AttnlabError as e:
                raise AttnlabError(f"{where}: variant {arm!r} at size {size}: {e}") from None
    state = Expanded(protocol, dict(spec.variants), list(spec.comparisons), sizes, recipe, fixed)
    state = _with_kept(state, kept or {}, where)
    return _cells(spec, preset, state)


def _with_kept(state: Expanded, kept: dict[str, Any], where: str) -> Expanded:
    """``state`` with the choices an earlier invocation kept; refused where they do not fit
    this spec (its runs were chosen by another grid or other arms)."""
    best = kept.get("best_lr")
    if best is not None and state.grid:
        chosen: dict[Key, float | None] = {}
        for row in best:
            key = (row.get("arm"), row.get("size"))
            lr = row.get("lr")
            if key not in state.recipe or (lr is not None and lr not in state.grid):
                raise AttnlabError(
                    f"the study folder's best learning rates were chosen for another spec than "
                    f"{where} ({key[0]} at {lr}); choose another --out"
                )
            chosen[key] = lr
        state = replace(state, best=chosen)
    seeds = kept.get("seeds") or {}
    if state.protocol.auto and seeds.get("n") is not None:
        state = replace(state, n=seeds["n"], choice=seeds)
    return state


def _cells(spec: StudySpec, preset: str, state: Expanded) -> StudySpec:
    """The spec whose variants are ``state``'s cells, each with the seeds its phase reached."""
    evaluated = state.eval_seeds()
    variants = {}
    for (arm, size), recipe in state.recipe.items():
        variant = state.arms[arm]
        model, train, config = _recipe(spec, variant, preset, size)
        tuned = state.tuned((arm, size))
        lrs = sorted({*state.grid, recipe}) if state.grid else [recipe]
        for lr in lrs:
            name = state.cell(arm, size, lr)
            if len(name) > NAME_MAX:
                raise AttnlabError(
                    f"{spec.source}: the cell name {name[:24]!r}... is over {NAME_MAX} "
                    "characters; shorten the variant or size name"
                )
            on_grid = any(_same(lr, g) for g in state.grid)
            seeds = list(state.protocol.tuning_seeds) if on_grid else []
            if evaluated and (_same(lr, recipe) or (tuned is not None and _same(lr, tuned))):
                seeds = [*evaluated, *seeds]
            own = dict(train)
            if state.grid:  # the schedule's floor keeps its ratio to the peak
                floor = float(f"{config.min_lr * lr / config.learning_rate:.12g}")  # no 2.9999e-05
                own.update(learning_rate=lr, min_lr=floor)
            where = f" at size {size}" if size is not None else ""
            variants[name] = Variant(
                name,
                variant.preset,
                f"{arm}{where}, lr {lr:g}" + (" (recipe)" if _same(lr, recipe) else ""),
                model,
                own,
                variant.reference,
                arm=arm,
                size=size,
                lr=lr,
                seeds=tuple(seeds),
            )
    return replace(spec, variants=variants, comparisons=[], expanded=state)


def _losses(runs: list[dict[str, Any]]) -> dict[tuple[str, int], float]:
    """(variant, seed) -> final val loss of every finished run (NaN where it diverged)."""
    return {
        (r["variant"], r["seed"]): (math.nan if r.get("val_loss") is None else r["val_loss"])
        for r in runs
        if r["status"] == "ok"
    }


def tuning(spec: StudySpec, runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each grid cell's final val losses on the tuning seeds and their mean (NaN when a run
    failed or diverged: such an LR is never the best)."""
    state: Expanded = spec.expanded
    loss = _losses(runs)
    done = {(r["variant"], r["seed"]) for r in runs}
    rows = []
    for arm, size in state.recipe:
        for lr in state.grid:
            name = state.cell(arm, size, lr)
            seeds = list(state.protocol.tuning_seeds)
            values = [loss.get((name, s), math.nan) for s in seeds]
            rows.append(
                {
                    "arm": arm,
                    "size": size,
                    "lr": lr,
                    "cell": name,
                    "losses": values,
                    "mean": float(np.mean(values)),
                    "done": all((name, s) in done for s in seeds),
                }
            )
    return rows


def best_lrs(rows: list[dict[str, Any]]) -> dict[Key, float | None]:
    """Each (arm, size)'s LR of the lowest mean tuning loss (None where none is finite)."""
    best: dict[Key, float | None] = {}
    for row in rows:
        key = (row["arm"], row["size"])
        now = best.get(key)
        mean = {r["lr"]: r["mean"] for r in rows if (r["arm"], r["size"]) == key}
        if math.isfinite(row["mean"]) and (now is None or row["mean"] < mean[now]):
            best[key] = row["lr"]
        else:
            best.setdefault(key, None)
    return best


def advance(spec: StudySpec, preset: str, runs: list[dict[str, Any]]) -> StudySpec:
    """The spec of the next phase once ``runs`` completes the current one (the best LRs after
    tuning, n after the pilot), else ``spec`` itself."""
    state: Expanded | None = spec.expanded
    if state is None:  # no protocol: one phase
        return spec
    if state.grid and state.best is None:
        rows = tuning(spec, runs)
        if not all(r["done"] for r in rows):
            return spec
        return _cells(spec, preset, replace(state, best=best_lrs(rows)))
    if state.protocol.auto and state.n is None:
        loss = _losses(runs)
        pilot = state.eval_seeds()
        cells = [state.cell(arm, size, lr) for (arm, size), lr in _tuned(state).items()]
        if not all((c, s) in loss for c in cells for s in pilot):
            return spec
        choice = choose_n(state, loss)
        return _cells(spec, preset, replace(state, n=choice["n"], choice=choice))
    return spec


def _tuned(state: Expanded) -> dict[Key, float]:
    return {k: lr for k in state.recipe if (lr := state.tuned(k)) is not None}


def choose_n(state: Expanded, loss: dict[tuple[str, int], float]) -> dict[str, Any]:
    """n from the pilot: for each comparison at each size (at the tuned LRs), the sd of its
    pilot seeds' paired differences and the seeds that detect the smallest |effect| at that
    spread at 80 % power; n is the most any needs, at least the pilot's, at most max_seeds."""
    protocol = state.protocol
    pilot = list(range(protocol.pilot_seeds))
    effect = min(abs(e) for e in protocol.smallest_effect)
    spreads = []
    for comp in state.comparisons:
        for size in state.sizes:
            b, v = (state.tuned((name, size)) for name in (comp.baseline, comp.variant))
            if b is None or v is None:
                continue
            cb, cv = state.cell(comp.baseline, size, b), state.cell(comp.variant, size, v)
            diffs = [loss[cv, s] - loss[cb, s] for s in pilot]
            sd = float(np.std(diffs, ddof=1)) if all(map(math.isfinite, diffs)) else math.nan
            needed = seeds_needed(effect, sd)
            # a spread no number of seeds overcomes, or none to weigh, asks for the most
            reach = needed if needed is not None else protocol.max_seeds
            spreads.append(
                {
                    "baseline": comp.baseline,
                    "variant": comp.variant,
                    "size": size,
                    "pilot_diffs": diffs,
                    "sd": sd,
                    "needed": needed,
                    "asks": reach,
                }
            )
    wanted = max([protocol.pilot_seeds, *(s["asks"] for s in spreads)])
    n = min(wanted, protocol.max_seeds)
    widest = max((s["sd"] for s in spreads if math.isfinite(s["sd"])), default=math.nan)
    return {
        "rule": "auto",
        "pilot_seeds": protocol.pilot_seeds,
        "smallest_effect": list(protocol.smallest_effect),
        "sized_for": effect,
        "power": POWER,
        "alpha": ALPHA,
        "max_seeds": protocol.max_seeds,
        "spreads": spreads,
        "wanted": wanted,
        "n": n,
        "capped": wanted > protocol.max_seeds,
        "power_at_n": [
            {"effect": e, "power": paired_power(e, widest, n)} for e in protocol.smallest_effect
        ],
    }


def comparisons(spec: StudySpec, runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every comparison of the spec at every size, at the tuned LRs and at the recipe's, over
    the evaluation seeds both arms finished; Holm within each basis; each row carries what a
    verdict rule reads (docs/studies-protocol.md)."""
    state: Expanded = spec.expanded
    loss = _losses(runs)
    converged = {(r["variant"], r["seed"]): r.get("converged") for r in runs}
    params = {r["variant"]: r.get("params") for r in runs if r["status"] == "ok"}
    evaluated = set(range(state.protocol.max_seeds if state.protocol.auto else state.fixed_seeds))
    bases = [TUNED, RECIPE] if state.grid else [RECIPE]
    out = []
    for basis in bases:
        family = []
        for size in state.sizes:
            for comp in state.comparisons:
                keys = [(comp.baseline, size), (comp.variant, size)]
                lrs = [state.tuned(k) if basis == TUNED else state.recipe[k] for k in keys]
                if None in lrs:
                    continue
                cb, cv = (state.cell(k[0], size, lr) for k, lr in zip(keys, lrs, strict=True))
                seeds = sorted(
                    s for (v, s) in loss if v == cv and s in evaluated and (cb, s) in loss
                )
                refs = [state.arms[name].reference for name in (comp.variant, comp.baseline)]
                tested = paired_comparison(
                    [loss[cv, s] for s in seeds],
                    [loss[cb, s] for s in seeds],
                    claimed=refs[0] - refs[1] if None not in refs else None,
                )
                flags = [converged.get((c, s)) for c in (cb, cv) for s in seeds]
                edges = [state.edge(k) for k in keys] if basis == TUNED else []
                family.append(
                    {
                        "baseline": comp.baseline,
                        "variant": comp.variant,
                        **tested,
                        "reference_t": comp.reference_t,
                        "seeds": seeds,
                        "size": size,
                        "sizes": len(state.sizes),
                        "lr_basis": basis,
                        "lr": {"baseline": lrs[0], "variant": lrs[1]},
                        "cells": {"baseline": cb, "variant": cv},
                        "params": {"baseline": params.get(cb), "variant": params.get(cv)},
                        "edge_of_grid": any(edges) if edges else None,
                        "converged": None if None in flags or not flags else all(flags),
                        "few_seeds": tested["n"] < FEW_SEEDS,
                        "seeds_rule": "auto" if state.protocol.auto else "fixed",
                    }
                )
        for row, p in zip(family, holm([r["p"] for r in family]), strict=True):
            row["p_holm"] = p
            row["ci95_holm"] = holm_ci(row)
        out += family
    return out


def trends(spec: StudySpec, runs: list[dict[str, Any]], rows: list[dict[str, Any]]) -> list[dict]:
    """Per comparison and LR basis over two or more sizes: the gain (mean paired difference)
    at each size and its slope against log10 parameters (the mean of the arms' counts), the
    slope fitted per seed (least squares over the sizes, on the seeds every size has) and its
    95 % t interval over seeds."""
    state: Expanded = spec.expanded
    if len(state.sizes) < 2:
        return []
    loss = _losses(runs)
    out = []
    for basis in dict.fromkeys(r["lr_basis"] for r in rows):
        for comp in state.comparisons:
            at = [
                r
                for r in rows
                if r["lr_basis"] == basis
                and (r["baseline"], r["variant"]) == (comp.baseline, comp.variant)
            ]
            counts = [r["params"] for r in at]
            if len(at) < 2 or any(None in c.values() for c in counts):
                continue
            x = np.log10([(c["baseline"] + c["variant"]) / 2 for c in counts])
            seeds = sorted(set.intersection(*(set(r["seeds"]) for r in at)))
            slopes = []
            for s in seeds:
                d = [loss[r["cells"]["variant"], s] - loss[r["cells"]["baseline"], s] for r in at]
                slopes.append(float(np.polyfit(x, d, 1)[0]))
            summary = summarize(slopes)
            out.append(
                {
                    "baseline": comp.baseline,
                    "variant": comp.variant,
                    "lr_basis": basis,
                    "sizes": [r["size"] for r in at],
                    "log10_params": x.tolist(),
                    "gain": [r["mean_diff"] for r in at],
                    "gain_ci95": [r["ci95"] for r in at],
                    "seeds": seeds,
                    "slope_per_decade": summary["mean"],
                    "slope_ci95": [summary["ci95_low"], summary["ci95_high"]],
                }
            )
    return out


def record(spec: StudySpec, runs: list[dict[str, Any]], rows: list[dict[str, Any]]) -> dict:
    """study.json's ``protocol``: the settings, the tuning table, the best LRs and their edges,
    how n was chosen and the trends over sizes."""
    state: Expanded = spec.expanded
    p = state.protocol
    seeds: dict[str, Any] = state.choice or {
        "rule": "auto" if p.auto else "fixed",
        "n": None if p.auto else state.fixed_seeds,
    }
    return {
        "lr_grid": list(state.grid),
        "tuning_seeds": list(p.tuning_seeds),
        "sizes": [s for s in state.sizes if s is not None] or None,
        "n_sizes": len(state.sizes),
        "recipe_lr": [{"arm": a, "size": z, "lr": lr} for (a, z), lr in state.recipe.items()],
        "cells": [
            {"cell": name, "arm": v.arm, "size": v.size, "lr": v.lr}
            for name, v in spec.variants.items()
        ],
        "tuning": tuning(spec, runs) if state.grid else [],
        "best_lr": None
        if state.best is None
        else [
            {"arm": a, "size": z, "lr": lr, "edge_of_grid": state.edge((a, z))}
            for (a, z), lr in state.best.items()
        ],
        "seeds": {**seeds, "pilot_seeds": p.pilot_seeds} if p.auto else seeds,
        "evaluation_seeds": state.eval_seeds(),
        "trend": trends(spec, runs, rows),
    }
