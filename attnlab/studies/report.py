"""report.md of a study: its head (what ran, by which command and commit, at which scale) and the
markdown helpers the kinds write their sections with."""

from __future__ import annotations

import math
from typing import Any

from attnlab.studies.spec import StudySpec


def num(x: Any, fmt: str = ".4f") -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    return f"{x:{fmt}}"


def p_value(p: Any) -> str:
    """A p-value as text, never rounded across 0.05 or 0.01 (0.04996 is not "0.0500")."""
    if p is None or (isinstance(p, float) and not math.isfinite(p)):
        return "–"
    if p == 0:  # below the smallest float: scipy's answer to an enormous t
        return "< 1e-300"
    if p < 1e-3:
        return f"{p:.2e}"
    digits = 4
    text = f"{p:.{digits}f}"
    while digits < 8 and any((float(text) < a) != (p < a) for a in (0.05, 0.01)):
        digits += 1
        text = f"{p:.{digits}f}"
    return text


def p_cell(comparison: dict[str, Any]) -> str:
    """A comparison's p column: no p-value where every seed differs by the same amount."""
    return "– (no spread)" if comparison.get("no_spread") else p_value(comparison["p"])


def md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(r) + " |" for r in rows),
        "",
    ]


def _scale_lines(spec: StudySpec, preset: str) -> list[str]:
    """What this preset changes against the seed's settings (the paper preset changes nothing)."""
    scale = spec.scale(preset)
    lines = [f"**Preset `{preset}`.** {scale.notes}".rstrip(), ""]
    changed = [f"`{k}={v}`" for k, v in {**scale.model, **scale.train}.items()]
    if changed:
        lines.append("Changed for every variant: " + ", ".join(changed) + ".")
    for name, over in scale.variants.items():
        pairs = [
            f"`{k}={v}`" for k, v in {**over.get("model", {}), **over.get("train", {})}.items()
        ]
        if pairs:
            lines.append(f"Changed for {name}: " + ", ".join(pairs) + ".")
    if scale.data is not None:
        lines.append(f"Data: `{scale.data}`.")
    return [*lines, ""]


def _provenance(record: dict[str, Any]) -> list[str]:
    """Which command and which commit produced this report (when known)."""
    command, commit = record.get("command"), record.get("git_commit")
    parts = [f"Produced by `{command}`" if command else "Produced"]
    parts.append(f"at commit `{commit}`." if commit else "(commit unknown).")
    return [" ".join(parts), ""]


def render(spec: StudySpec, preset: str, record: dict[str, Any], sections: list[str]) -> str:
    """The whole report.md: the head from study.json (``record``), then the kind's ``sections``."""
    seeds = record["seeds"]
    lines = [
        f"# Study `{spec.name}`",
        "",
        spec.description,
        "",
        f"Seeds {seeds[0]}–{seeds[-1]} ({len(seeds)}); study spec `{spec.source}`; "
        f"{record['elapsed_s']:.0f} s this invocation.",
        "",
        *_provenance(record),
        *_scale_lines(spec, preset),
        *sections,
    ]
    return "\n".join(lines).rstrip() + "\n"
