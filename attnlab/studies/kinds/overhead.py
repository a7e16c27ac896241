"""Overhead studies: seconds per training step (forward, backward, optimizer step) against
width for every mechanism against vanilla, timed interleaved (the kv-bias seed's Figure 2)
through ``attnlab bench overhead``'s timer. One measurement, no seeds to pair."""

from __future__ import annotations

import inspect
from dataclasses import asdict
from typing import Any

from attnlab.bench import overhead
from attnlab.config import ModelConfig
from attnlab.device import resolve_device
from attnlab.errors import AttnlabError
from attnlab.studies.kinds.base import Outcome, Study, TrainsNoRuns
from attnlab.studies.output import figure_link
from attnlab.studies.spec import FLAG, TEXT, StudySpec, check_table, list_of, whole_number

FIGURE = "overhead.png"
_MEASURED = ("overhead", "overhead_table", "unavailable")  # study.json's own fields
_ARGUMENTS = inspect.signature(overhead.measure).parameters
_DEFAULTS = {k: p.default for k, p in _ARGUMENTS.items() if p.default is not p.empty}
# what each of bench overhead's keyword arguments takes in a spec's params, by its annotation
# (the known keys a refusal lists, in its order); which benchmark variants and devices exist is
# checked apart, with their own messages
_SIZE = whole_number(1)
_BY_ANNOTATION = {
    "list[int]": list_of(_SIZE),
    "int": _SIZE,
    "str": TEXT,
    "list[str] | None": list_of(TEXT, empty=True),  # none: every registered mechanism's variants
    "bool": FLAG,
}
_RULES = {k: _BY_ANNOTATION[p.annotation] for k, p in _ARGUMENTS.items()}
_RULES["warmup"] = whole_number(0)  # no warm-up step is a valid timing


def _options(spec: StudySpec, preset: str) -> dict[str, Any]:
    """bench overhead's keyword arguments: its defaults, the spec's params, then the preset's."""
    return {**_DEFAULTS, **spec.params, **spec.scale(preset).params}


class Overhead(TrainsNoRuns):
    """One interleaved timing of every mechanism at every width."""

    def check(self, spec: StudySpec, preset: str) -> None:
        """Every value bench overhead would be given, and the model of every width: a wrong one
        fails here, not in the timing once the study folder is made."""
        for where, table in (
            ("params", spec.params),
            (f"scale {preset} params", spec.scale(preset).params),
        ):
            check_table(table, _RULES, f"{spec.source} {where}", "params")
        opts = _options(spec, preset)
        where = f"{spec.source} params at {preset}"
        missing = [k for k in _ARGUMENTS if k not in opts]
        if missing:
            raise AttnlabError(f"{where}: needs {missing[0]} (in [params] or the scale's params)")
        overhead.check_variants(opts["mechanisms"] or [])
        try:
            resolve_device(opts["device"])
            for width in opts["widths"]:  # the vanilla model measure() builds first
                ModelConfig(
                    n_layer=opts["layers"],
                    n_head=opts["n_head"],
                    n_embd=width,
                    block_size=opts["block"],
                    vocab_size=opts["vocab"],
                )
        except AttnlabError as e:
            raise AttnlabError(f"{where}: {e}") from None

    def run(self, study: Study) -> Outcome:
        opts = _options(study.spec, study.preset)
        # "auto" as the machine resolves it: the timer takes a device, not a choice
        opts["device"] = str(resolve_device(opts["device"]))
        rows, missing = overhead.measure(**opts)
        title = (
            f"{opts['layers']} layers, batch {opts['batch']}, "
            f"block {opts['block']}, {opts['reps']} interleaved reps"
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
