"""The interface of a study kind: ``run`` its units of work, then write its part of the report.

``run_study`` (attnlab.studies.runner) looks a spec's ``kind`` up in ``attnlab.studies.kinds.KINDS``
and writes the study folder from the kind's ``Outcome`` after every finished unit of work.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from attnlab.errors import AttnlabError
from attnlab.studies.executors import Executor, LocalExecutor, OnDone
from attnlab.studies.output import StudyDir
from attnlab.studies.progress import Progress
from attnlab.studies.spec import StudySpec


@dataclass
class Outcome:
    """What a study has so far: the training runs and their comparisons (results.json), the
    statistics per variant and the kind's own fields (study.json, in this order)."""

    runs: list[dict[str, Any]] = field(default_factory=list)
    comparisons: list[dict[str, Any]] = field(default_factory=list)
    variants: dict[str, dict[str, Any]] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Study:
    """One invocation of a study: what to run, where, and whom to tell as it goes."""

    spec: StudySpec
    preset: str
    out: StudyDir
    seeds: list[int]
    jobs: int  # units of work at a time (processes here, or SLURM jobs)
    data: str | Path | None  # the prepared data folder for every training run (None: the spec's)
    progress: Progress | None
    # rewrites the study folder from an outcome; returns results.json's content and study.json's
    publish: Callable[[Outcome], dict[str, Any]]
    # run folder -> another study's identical run, copied in instead of trained (--reuse-from)
    reuse: dict[str, str] = field(default_factory=dict)
    # a --plan: writes nothing, not even a shipped corpus the runs would prepare
    planning: bool = False
    # the trackers every run logs to, the W&B group and MLflow parent run (attnlab.train.trackers)
    tracking: dict[str, Any] = field(default_factory=dict)
    # where its units of work run (None: here, ``jobs`` at a time)
    executor: Executor | None = None

    def run_all(
        self, work: Callable[[Any, int | None], Any], items: list[Any], on_done: OnDone
    ) -> None:
        """``work(item, threads)`` for every item on the study's executor, ``on_done(index,
        result, seconds)`` as each one finishes (attnlab.studies.executors.Executor)."""
        (self.executor or LocalExecutor(self.jobs)).run(work, items, on_done)


class StudyKind(Protocol):
    """What one kind of study measures, how it runs and how it reports."""

    def check(self, spec: StudySpec, preset: str) -> None:
        """Refuse settings the kind cannot run, before anything is written (AttnlabError)."""
        ...

    def refuse(self, study: Study) -> None:
        """Refuse what needs the study itself (its data, what its folder already holds), before
        anything is written there (AttnlabError)."""
        ...

    def run(self, study: Study) -> Outcome:
        """Compute (or resume) every unit of work, ``study.publish`` after each; the final outcome."""
        ...

    def reusable(self, study: Study, donors: list[StudyDir]) -> dict[str, str]:
        """``{run folder: a donor study's run folder}``: the runs ``study`` would train that a
        donor trained identically (AttnlabError for kinds that train no runs)."""
        ...

    def plan(self, study: Study, timed: bool = True) -> dict[str, Any]:
        """What ``study`` would train now and, ``timed``, how long it would take, writing
        nothing (AttnlabError for kinds that train no runs)."""
        ...

    def rebuild(self, study: Study, results: dict[str, Any], record: dict[str, Any]) -> Outcome:
        """The outcome again from a written results.json and study.json (``record``), training
        or measuring nothing: its statistics as this attnlab computes them."""
        ...

    def sections(self, study: Study, results: dict[str, Any], record: dict[str, Any]) -> list[str]:
        """The kind's markdown lines of report.md from the written results.json and study.json
        (``record``), drawing its figures into the study folder."""
        ...


class TrainsNoRuns:
    """``refuse``, ``reusable`` and ``plan`` of a kind that trains no runs: the first has
    nothing to refuse (its ``check`` saw every setting), the others are refused."""

    def refuse(self, study: Study) -> None:
        return None

    def reusable(self, study: Study, donors: list[StudyDir]) -> dict[str, str]:
        raise AttnlabError(
            f"--reuse-from: kind = {study.spec.kind!r} studies train no runs to reuse; leave it out"
        )

    def plan(self, study: Study, timed: bool = True) -> dict[str, Any]:
        raise AttnlabError(
            f"--plan: kind = {study.spec.kind!r} studies train no runs to plan; leave it out"
        )
