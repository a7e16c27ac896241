"""`attnlab bench overhead`: step-time cost of each mechanism against vanilla, across widths.

The kv-bias seed's Figure 2: forward + backward + AdamW step on random data, 6 layers, batch 8,
block 256, n_embd 128..768. Each mechanism is timed at the vanilla width (equal width), at
the narrower width whose parameter count is closest to vanilla's (parameter-matched, e.g.
K/V-bias at 112 against vanilla at 128, the kv-bias seed's pairing), and against a vanilla widened
to the mechanism's parameter count ("fair", the gradient-boosted-attention paper's pairing).
All models of one width run interleaved.
"""

from __future__ import annotations

import difflib
import logging
import math
from dataclasses import dataclass
from typing import Any

import torch

from attnlab.bench.timing import (
    allow_compiled_models,
    format_table,
    interleaved,
    relative,
    synchronizer,
    train_step,
)
from attnlab.config import ModelConfig
from attnlab.errors import AttnlabError
from attnlab.model import GPT, mechanisms
from attnlab.model.mechanisms import modern_bench_variants  # `measure`'s argument hides the module
from attnlab.plotting import legend_outside, pyplot, save_figure
from attnlab.reporting import STDERR

logger = logging.getLogger(__name__)

# name -> ModelConfig overrides; shared with `bench generate`


@dataclass(frozen=True)
class Row:
    """One variant's step time at one width against the vanilla model it is compared with."""

    width: int  # the vanilla width this row is compared with
    variant: str
    match: str  # "equal" width, parameter-matched ("params"), vs a widened vanilla ("fair"),
    # or a mechanism on the QKVE-style backbone against that backbone ("modern")
    n_embd: int  # the width actually run
    params: int
    ms: float  # median step time
    ratio: float  # median per-repetition ratio to vanilla at ``width``
    iqr: tuple[float, float]


def count_params(config: ModelConfig) -> int:
    """Parameters of GPT(config) (tied weights once)."""
    return sum(p.numel() for p in GPT(config).parameters())


def with_width(config: ModelConfig, n_embd: int, **overrides: Any) -> ModelConfig:
    """``config`` at another width, the FFN keeping its ratio to n_embd (replace() would keep d_ffn)."""
    d_ffn = round(int(config.d_ffn) * n_embd / config.n_embd)
    return config.replace(n_embd=n_embd, d_ffn=d_ffn, **overrides)


def width_step(base: ModelConfig) -> int:
    """Widths tried for matching: multiples of n_head (of 2 n_head with RoPE) and of 8.

    Odd shapes cost more than their FLOPs (head_dim 31 or GEMMs 124 wide run at lower efficiency),
    and a researcher matching parameters picks a hardware-friendly width, as the kv-bias seed's 112.
    """
    return math.lcm(base.n_head * (2 if base.pos == "rope" else 1), 8)


def matched_width(base: ModelConfig, overrides: dict[str, Any], target: int) -> int:
    """The width (a width_step multiple, at most base.n_embd) whose parameter count is closest to target.

    Parameter counts grow with width, so a bisection finds the widest model not above target;
    the answer is it or the next step up.
    """
    step = width_step(base)

    def count(k: int) -> int:
        return count_params(with_width(base, k * step, **overrides))

    lo, hi = 1, base.n_embd // step
    if count(lo) <= target:
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if count(mid) <= target else (lo, mid - 1)
    candidates = [k for k in (lo, lo + 1) if k <= base.n_embd // step]
    return step * min(candidates, key=lambda k: (abs(count(k) - target), -k))


def fair_width(base: ModelConfig, target: int) -> int:
    """The vanilla width, at or above base's, whose parameter count is closest to target.

    The gradient-boosted-attention paper's "parameter-fair" baseline widens vanilla to the
    mechanism's parameter count (d 288 against boosted d 256) instead of narrowing the mechanism.
    """
    step = width_step(base)
    widths = [base.n_embd]
    while count_params(with_width(base, widths[-1])) < target:
        widths.append(widths[-1] + step)
    return min(widths[-2:], key=lambda w: abs(count_params(with_width(base, w)) - target))


def modern_backbone(base: ModelConfig) -> ModelConfig:
    """The QKVE seed's backbone at base's size: GQA (2 query heads per kv head), RoPE, RMSNorm,
    two SwiGLU sub-layers with d_ffn 4/3 n_embd (the seed's 512 at 384)."""
    return base.replace(
        n_kv_head=base.n_head // 2,
        pos="rope",
        norm="rmsnorm",
        mlp="swiglu",
        d_ffn=round(4 * base.n_embd / 3),
        ffn_sublayers=2,
    )


def bench_variants() -> dict[str, dict[str, Any]]:
    """Every registered mechanism's benchmark variants: label -> config fields."""
    return mechanisms.bench_variants()


def check_variants(names: list[str]) -> None:
    """Refuse a benchmark variant no registered mechanism declares (one line, did-you-mean)."""
    known = list(bench_variants())
    for name in names:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise AttnlabError(
                f"unknown benchmark variant {name!r}; {hint}known: {', '.join(known)}"
            )


def available(name: str, base: ModelConfig) -> bool:
    """False when a parameterised mechanism adds no parameters (its module is not registered)."""
    return name not in mechanisms.param_adding_variants() or count_params(
        base.replace(**bench_variants()[name])
    ) != count_params(base)


def measure(
    widths: list[int],
    layers: int = 6,
    batch: int = 8,
    block: int = 256,
    reps: int = 5,
    warmup: int = 1,
    n_head: int = 4,
    vocab: int = 65,
    device: str = "cpu",
    mechanisms: list[str] | None = None,
    compile: bool = False,
) -> tuple[list[Row], list[str]]:
    """Time every mechanism at every width; returns (rows, names of unavailable mechanisms)."""
    fields = bench_variants()
    names = mechanisms or list(fields)
    check_variants(names)
    rows: list[Row] = []
    missing: list[str] = []
    for width in widths:
        base = ModelConfig(
            n_layer=layers,
            n_head=n_head,
            n_embd=width,
            block_size=block,
            vocab_size=vocab,
            bias=False,
            dropout=0.0,
        )
        base_params = count_params(base)
        configs = {("vanilla", "equal"): base}
        for name in names:
            if not available(name, base):
                if name not in missing:
                    missing.append(name)
                continue
            configs[(name, "equal")] = base.replace(**fields[name])
            w = matched_width(base, fields[name], base_params)
            if w != width:
                configs[(name, "params")] = with_width(base, w, **fields[name])
                wide = fair_width(base, count_params(configs[(name, "equal")]))
                configs[("vanilla", f"fair:{name}")] = with_width(base, wide)
        # the mechanisms whose SPEC asks for it also on the QKVE-style backbone (its GQA needs
        # an even n_head)
        on_modern = [n for n in modern_bench_variants() if (n, "equal") in configs]
        if on_modern and n_head % 2 == 0:
            modern = modern_backbone(base)
            configs[("modern", "equal")] = modern
            for name in on_modern:
                configs[(name, "modern")] = modern.replace(**fields[name])
        if compile:
            allow_compiled_models(len(configs))
        steps = {
            key: train_step(cfg, batch, device, compile=compile)[0] for key, cfg in configs.items()
        }
        logger.info(
            f"bench overhead: n_embd {width}, {len(steps)} models x {reps} reps", extra=STDERR
        )
        timings = interleaved(
            {f"{v}|{m}": fn for (v, m), fn in steps.items()},
            "vanilla|equal",
            reps,
            warmup,
            synchronizer(device),
        )
        for (variant, match), cfg in configs.items():
            t = timings[f"{variant}|{match}"]
            versus = width
            if variant == "modern":  # the modern backbone only serves as the value gate's baseline
                continue
            if match == "modern":  # the value gate against the same modern backbone without it
                t = relative(t, timings["modern|equal"])
            if match.startswith("fair:"):  # the mechanism at this width vs the widened vanilla
                mech = match.removeprefix("fair:")
                t = relative(timings[f"{mech}|equal"], t)
                variant, match, versus, cfg = mech, "fair", cfg.n_embd, configs[(mech, "equal")]
            rows.append(
                Row(
                    versus,
                    variant,
                    match,
                    cfg.n_embd,
                    count_params(cfg),
                    1000 * t.median_s,
                    t.ratio,
                    t.ratio_iqr,
                )
            )
        del steps  # free this width's models before building the next, wider ones
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return rows, missing


def table(rows: list[Row]) -> str:
    body = [
        [
            f"{r.variant} @{r.n_embd}" + (f" ({r.match})" if r.match in ("fair", "modern") else ""),
            str(r.width),
            r.match,
            f"{r.params:,}",
            f"{r.ms:.1f}",
            f"{r.ratio:.3f}",
            f"{100 * (r.ratio - 1):+.1f}%",
            f"{r.iqr[0]:.3f}-{r.iqr[1]:.3f}",
        ]
        for r in rows
    ]
    return format_table(
        ["model", "vs vanilla@", "match", "params", "ms/iter", "ratio", "overhead", "ratio IQR"],
        body,
    )


# how each kind of comparison is drawn: (label suffix, line style, marker, hollow marker)
MATCH_STYLE: dict[str, tuple[str, str, str, bool]] = {
    "equal": ("at equal width", "-", "o", False),
    "params": ("parameter-matched (narrower)", "--", "s", True),
    "fair": ("vs a widened vanilla (fair)", ":", "^", True),
    "modern": ("vs its QKVE-style backbone", "-.", "D", False),
}


def plot(rows: list[Row], out: str, title: str) -> Any:
    """Step time (left) and overhead against vanilla (right) per vanilla width: one colour per
    mechanism, one line style and marker per comparison, every row of the table drawn."""
    plt = pyplot()
    fig, (ax_t, ax_o) = plt.subplots(1, 2, figsize=(11, 5.2), layout="constrained")
    variants = list(dict.fromkeys(r.variant for r in rows))
    widths = sorted({r.width for r in rows if r.match == "equal"})
    for i, variant in enumerate(variants):
        color = "black" if variant == "vanilla" else f"C{i}"
        for match, (suffix, style, marker, hollow) in MATCH_STYLE.items():
            pts = [r for r in rows if r.variant == variant and r.match == match]
            if not pts:
                continue
            # a fair row's width is the widened vanilla's: place it at the mechanism's own width
            xs = [r.n_embd if match == "fair" else r.width for r in pts]
            label = "vanilla" if variant == "vanilla" else f"{variant}, {suffix}"
            kw = dict(
                linestyle=style,
                marker=marker,
                color=color,
                markerfacecolor="white" if hollow else color,
                label=label,
            )
            if match != "fair":  # a fair row's time is the equal-width row's
                ax_t.plot(xs, [r.ms for r in pts], **kw)
            if variant != "vanilla":
                ax_o.plot(xs, [100 * (r.ratio - 1) for r in pts], **kw)
    ax_t.set(xlabel="vanilla n_embd", ylabel="step time (ms)", title="fwd + bwd + AdamW step")
    ax_o.set(
        xlabel="vanilla n_embd",
        ylabel="overhead vs vanilla (%)",
        title="step-time overhead (median of per-rep ratios)",
    )
    ax_o.axhline(0, color="grey", lw=0.8)
    for ax in (ax_t, ax_o):
        ax.set_xticks(widths)
    legend_outside(fig, [ax_t, ax_o], ncol=3)
    fig.suptitle(title, fontsize=10)
    save_figure(fig, out)
    return fig
