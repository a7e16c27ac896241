"""Run a study: its kind's units of work (attnlab.studies.kinds), then statistics and report.

The study folder (attnlab.studies.output) is rewritten after every finished unit of work, so an
interrupted study shows what it has, and rerunning the same command finishes it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from attnlab.data.prepare import load_dataset
from attnlab.errors import AttnlabError
from attnlab.studies.kinds import KINDS
from attnlab.studies.kinds.base import Outcome, Study
from attnlab.studies.output import RUN_FIELDS, StudyDir
from attnlab.studies.progress import Progress
from attnlab.studies.report import render
from attnlab.studies.spec import StudySpec
from attnlab.train.environment import environment


def run_study(
    spec: StudySpec,
    preset: str,
    out: str | Path,
    seeds: int | None = None,
    jobs: int = 1,
    data: str | Path | None = None,
    variants: list[str] | None = None,
    progress: Progress | None = None,
    command: str | None = None,
) -> dict[str, Any]:
    """Run (or finish) the study in ``out``; write results.json, results.csv, study.json, report.md.

    ``variants`` restricts what an LM study trains to those arms: the results, comparisons and
    report still cover the whole study, with every finished run of the others found in ``out``.
    ``command`` is recorded at the top of the report. Returns results.json's content with
    study.json's as ``study``.
    """
    if variants is not None:
        if not variants:  # `--variants ,` ran every variant
            raise AttnlabError(f"--variants names none; choose from {', '.join(spec.variants)}")
        spec = spec.training(variants)
    scale = spec.scale(preset)
    n_seeds = seeds if seeds is not None else scale.seeds
    if n_seeds < 1 or jobs < 1:
        raise AttnlabError(f"--seeds and --jobs must be >= 1 (got {n_seeds} and {jobs})")
    kind = KINDS[spec.kind]
    kind.check(spec, preset)
    # a missing or unprepared folder fails here, not in every run once the study folder is made
    if data is not None:
        load_dataset(data)
    elif spec.kind == "lm" and isinstance(scale.data, str):  # a table is prepared by the study
        try:
            load_dataset(scale.data)
        except AttnlabError as e:
            raise AttnlabError(f"{spec.source}: scale {preset}: data: {e}") from None
    folder = StudyDir(out)
    # held until the study returns: a second study in this folder is refused
    with folder.create():
        seed_list = list(range(n_seeds))
        t0 = time.perf_counter()
        header = {
            "name": spec.name,
            "description": spec.description,
            "kind": spec.kind,
            "preset": preset,
            "seeds": seed_list,
            "jobs": jobs,
            "source": spec.source,
            "notes": scale.notes,
            "command": command,
            "git_commit": environment(torch.device("cpu"))["git_commit"],
        }

        def publish(outcome: Outcome) -> dict[str, Any]:
            results = {
                "runs": [{k: r.get(k) for k in RUN_FIELDS} for r in outcome.runs],
                "comparisons": outcome.comparisons,
            }
            record = {
                **header,
                "elapsed_s": time.perf_counter() - t0,
                "retrained": sum(not r.get("skipped", True) for r in outcome.runs),
                "variants": outcome.variants,
                **outcome.extra,
            }
            folder.write_results(results, record)
            folder.write_report(render(spec, preset, record, kind.sections(study, results, record)))
            return {**results, "study": record}

        study = Study(spec, preset, folder, seed_list, jobs, data, progress, publish)
        return publish(kind.run(study))
