"""report.md of a study: its head (what ran, by which command and commit, at which scale) and the
markdown helpers the kinds write their sections with."""

from __future__ import annotations

import json
import math
from typing import Any

from attnlab.studies.spec import StudySpec


def num(x: Any, fmt: str = ".4f") -> str:
    """``x`` formatted for a report table; a dash for a missing or non-finite value."""
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
    """The lines of a Markdown table, a blank line after it."""
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
        if "seeds" in over:
            lines.append(f"{name} runs at most the first {over['seeds']} seeds.")
    if scale.data is not None:
        lines.append(f"Data: `{scale.data}`.")
    return [*lines, ""]


def code_state(commit: Any, dirty: Any, diff: Any) -> str:
    """A recorded code state as text: the commit, and whether the package had uncommitted work."""
    name = f"commit `{commit}`" if commit else "an unknown commit"
    if dirty is None:
        return f"{name} (whether the package was as committed was not recorded)"
    if not dirty:
        return f"{name} (the package as committed)"
    return (
        f"{name} with uncommitted changes to the package (sha256 of its `git diff HEAD` and "
        f"untracked files `{diff}`)"
    )


def _short(sha: Any) -> Any:
    """A hash cut to 12 characters where a line names many (study.json keeps it whole)."""
    return sha[:12] if isinstance(sha, str) else sha


def _provenance(record: dict[str, Any]) -> list[str]:
    """Which command and code state produced this report, and which trained its runs."""
    command, commit = record.get("command"), record.get("git_commit")
    parts = [f"Produced by `{command}`" if command else "Produced"]
    parts.append(f"at commit `{commit}`." if commit else "(commit unknown).")
    lines = [" ".join(parts), ""]
    dirty, diff = record.get("git_dirty"), record.get("git_diff_sha256")
    if dirty:
        lines += [
            "The package had uncommitted changes (sha256 of its `git diff HEAD` and untracked "
            f"files `{diff}`).",
            "",
        ]
    elif dirty is not None:
        lines += ["The package was as committed.", ""]
    again = record.get("reported")
    if again:
        lines += [
            f"Reported again by `{again.get('command')}` at "
            f"{code_state(again['git_commit'], again['git_dirty'], again['git_diff_sha256'])}, "
            "from results.json and study.json alone (no run retrained; the statistics are "
            f"this commit's); the spec: {again.get('spec_from')}.",
            "",
        ]
    groups = record.get("run_commits")
    if groups:
        states = [code_state(g["commit"], g["dirty"], _short(g["diff_sha256"])) for g in groups]
        if len(groups) == 1:
            lines += [f"Every run trained at {states[0]}, as its env.json records.", ""]
        else:
            described = [
                f"{s}: {', '.join(g['runs'])}" for s, g in zip(states, groups, strict=True)
            ]
            why = (
                "mixed on request (`--allow-mixed-commits`)"
                if record.get("mixed_commits_allowed")
                else "the code changed while the study ran; a rerun refuses to add to them "
                "without `--allow-mixed-commits`"
            )
            lines += [
                f"**Runs of {len(groups)} code states** ({why}): " + "; ".join(described) + ".",
                "",
            ]
    elif record.get("kind") == "lm":
        lines += ["The runs' code states were not recorded (their run folders are absent).", ""]
    return lines


def _config_lines(configs: dict[str, dict[str, Any]]) -> list[str]:
    """The variants' configs as the values they share and, per variant, those that differ
    (study.json holds each in full)."""
    flat = {
        name: {
            f"{part}.{k}": json.dumps(v)
            for part in ("model", "train")
            for k, v in c[part].items()
            if k != "extra"  # the study's own bookkeeping (the variant's name)
        }
        | {"data": json.dumps(c.get("data"))}
        for name, c in configs.items()
    }
    keys = list(dict.fromkeys(k for f in flat.values() for k in f))
    shared = [k for k in keys if len({f.get(k) for f in flat.values()}) == 1]
    rows = [
        [name, ", ".join(f"`{k}={f[k]}`" for k in keys if k not in shared and k in f) or "–"]
        for name, f in flat.items()
    ]
    first = next(iter(flat.values()))
    return [
        "Shared by every variant: " + ", ".join(f"`{k}={first[k]}`" for k in shared) + ".",
        "",
        *md_table(["variant", "its own values"], rows),
    ]


def _provenance_section(record: dict[str, Any]) -> list[str]:
    """Packages, data folders, resolved configs and the spec's text, at the end of the report."""
    lines = ["## Provenance", ""]
    again = record.get("reported") or {}

    def listed(versions: dict[str, str]) -> str:
        return ", ".join(f"{k} {v}" for k, v in versions.items())

    if record.get("packages"):
        lines += [f"Packages: {listed(record['packages'])}.", ""]
    elif again.get("packages"):
        lines += [
            "Packages: not recorded when the study ran; reported again with "
            f"{listed(again['packages'])}.",
            "",
        ]
    if record.get("kind") == "lm" and not record.get("data"):
        lines += ["The data folder's provenance was not recorded when the study ran.", ""]
    for folder, d in (record.get("data") or {}).items():
        meta = d.get("meta", {})
        origin = meta.get("provenance", {}) if isinstance(meta.get("provenance"), dict) else {}
        bins = ", ".join(
            f"{n} `{b['sha256']}` ({b['bytes']:,} bytes)" for n, b in d["bins"].items()
        )
        lines += [
            f"Data `{folder}`: {origin.get('name', 'corpus')}, {meta.get('tokenizer')} tokenizer, "
            f"vocab {meta.get('vocab_size')}, {num(meta.get('train_tokens'), ',')} train / "
            f"{num(meta.get('val_tokens'), ',')} val tokens; sha256 {bins} (meta.json in "
            "study.json).",
            "",
        ]
    configs = record.get("configs")
    if configs:
        lines += [
            "<details><summary>Each variant's resolved model and training config"
            + (" (resolved again from the spec when reported again)" if again else "")
            + "</summary>",
            "",
            *_config_lines(configs),
            "</details>",
            "",
        ]
    if record.get("spec_text"):
        lines += [
            f"<details><summary>The study spec ({record.get('source')})</summary>",
            "",
            "```toml" if str(record.get("source")).endswith(".toml") else "```json",
            record["spec_text"].strip(),
            "```",
            "",
            "</details>",
            "",
        ]
    return lines if len(lines) > 2 else []


def _time_taken(record: dict[str, Any]) -> str:
    """The wall time of the invocation that last trained the study, and of all of them where
    it resumed across several (study.json's ``invocations`` lists each)."""
    if "elapsed_s" not in record:
        return "its time was not recorded."
    last = f"{record['elapsed_s']:.0f} s " + (
        "in the invocation that ran it" if record.get("reported") else "this invocation"
    )
    held = record.get("invocations") or []
    if len(held) < 2:
        return last + "."
    total = sum(i["elapsed_s"] for i in held)  # each one checked before the study ran
    return f"{last}; {total:.0f} s over its {len(held)} invocations (study.json lists each)."


def _seeds_said(record: dict[str, Any]) -> str:
    """The seeds the study ran: a protocol's evaluation seeds so far and its tuning seeds."""
    kept = record.get("protocol")
    if not kept:
        seeds = record["seeds"]
        return f"Seeds {seeds[0]}–{seeds[-1]} ({len(seeds)})"
    seeds = kept["evaluation_seeds"]
    said = (
        f"Evaluation seeds {seeds[0]}–{seeds[-1]} ({len(seeds)})"
        if seeds
        else "No evaluation seeds yet"
    )
    tuning = kept["tuning_seeds"]
    return said + (f", tuning seeds {', '.join(map(str, tuning))}" if tuning else "")


def render(spec: StudySpec, preset: str, record: dict[str, Any], sections: list[str]) -> str:
    """The whole report.md: the head from study.json (``record``), then the kind's ``sections``."""
    lines = [
        f"# Study `{spec.name}`",
        "",
        spec.description,
        "",
        f"{_seeds_said(record)}; study spec `{spec.source}`; " + _time_taken(record),
        "",
        *_provenance(record),
        *_scale_lines(spec, preset),
        *sections,
        *_provenance_section(record),
    ]
    return "\n".join(lines).rstrip() + "\n"
