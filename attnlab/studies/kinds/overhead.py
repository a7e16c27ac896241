"""Overhead studies: seconds per training step (forward, backward, optimizer step) against
width for every mechanism against vanilla, timed interleaved (the kv-bias seed's Figure 2)
through ``attnlab bench overhead``'s timer. One measurement, no seeds to pair."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from attnlab.bench import overhead
from attnlab.studies.kinds.base import Outcome, Study, TrainsNoRuns
from attnlab.studies.output import figure_link
from attnlab.studies.spec import StudySpec

FIGURE = "overhead.png"
_MEASURED = ("overhead", "overhead_table", "unavailable")  # study.json's own fields


def _options(spec: StudySpec, preset: str) -> dict[str, Any]:
    """bench overhead's keyword arguments: the spec's params, then the preset's."""
    return {**spec.params, **spec.scale(preset).params}


class Overhead(TrainsNoRuns):
    """One interleaved timing of every mechanism at every width."""

    def check(self, spec: StudySpec, preset: str) -> None:
        overhead.check_variants(_options(spec, preset).get("mechanisms", []))

    def run(self, study: Study) -> Outcome:
        opts = _options(study.spec, study.preset)
        rows, missing = overhead.measure(**opts)
        title = (
            f"{opts.get('layers', 6)} layers, batch {opts.get('batch', 8)}, "
            f"block {opts.get('block', 256)}, {opts.get('reps', 5)} interleaved reps"
        )
        overhead.plot(rows, str(study.out.figure(FIGURE)), title)
        extra = {
            "overhead": [asdict(r) for r in rows],
            "overhead_table": overhead.table(rows),
            "unavailable": missing,
        }
        return Outcome(extra=extra)

    def rebuild(self, study: Study, results: dict[str, Any], record: dict[str, Any]) -> Outcome:
        """The measurement as recorded: there are no statistics to compute again."""
        return Outcome(extra={k: record[k] for k in _MEASURED})

    def sections(self, study: Study, results: dict[str, Any], record: dict[str, Any]) -> list[str]:
        lines = [
            "## Step time against width",
            "",
            "Forward + backward + AdamW step on random data, all models of one width timed "
            "interleaved; ratio = median of per-repetition ratios to vanilla.",
            "",
            "```",
            record["overhead_table"],
            "```",
            "",
            f"![step time and overhead against width]({figure_link(FIGURE)})",
            "",
        ]
        if record["unavailable"]:
            lines += [f"Not available in this build: {', '.join(record['unavailable'])}.", ""]
        return lines
