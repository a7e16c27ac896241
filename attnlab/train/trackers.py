"""Experiment trackers: where a run's metric rows go besides metrics.csv.

``trackers=csv,tensorboard`` (the default) keeps what attnlab always wrote; ``wandb`` and
``mlflow`` add a Weights & Biases run and an MLflow run (the ``track`` extra installs both);
config.CHOICES["trackers"] names them all.
Each backend is one ``Tracker``: ``log`` takes metric rows as metrics.csv gets them, ``close``
ends the run. Where the tracker writes follows its own conventions (``WANDB_MODE``,
``WANDB_DIR``, ``WANDB_PROJECT``; ``MLFLOW_TRACKING_URI``, ``MLFLOW_EXPERIMENT_NAME``), so a
researcher's set-up for other tools works unchanged.

A study is one W&B group and one MLflow parent run (``StudyTracking``); each run in it is tagged
with its variant, seed, learning rate and size, and the study's report, figures and verdicts
are attached as artifacts when it finishes.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import math
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnlab.config import ModelConfig, TrainConfig
from attnlab.errors import AttnlabError
from attnlab.rundir import RunDir

EXTRA = "track"  # pip install 'attnlab[track]'
PROJECT = "attnlab"  # W&B project / MLflow experiment unless the tool's own variable names one
# env.json's key for the trackers' ids of this run, so a resume continues the same runs
ENV_KEY = "trackers"


def _require(module: str) -> Any:
    """Import an optional tracker package, or refuse in one line naming the extra."""
    name = module.split(".")[0]
    try:
        return importlib.import_module(module)
    except ImportError:
        raise AttnlabError(
            f"trackers={name} needs the {name} package: pip install 'attnlab[{EXTRA}]'"
        ) from None


def require(names: Iterable[str]) -> None:
    """Refuse, before a run starts, a tracker whose package is missing."""
    for name in names:
        if name in REMOTE:
            _require(name)


def parse(names: str) -> list[str]:
    """``"csv,wandb"`` -> ["csv", "wandb"] (blanks dropped)."""
    return [n.strip() for n in names.split(",") if n.strip()]


@dataclass
class RunInfo:
    """What a tracker names and tags a run by."""

    run: RunDir
    model: ModelConfig
    train: TrainConfig
    params: int
    resumed_at: int = 0
    # a study's: its name and folder (the W&B group, the MLflow parent run) and the ids found
    study: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        variant = self.train.extra.get("study_variant")
        return f"{variant}-seed{self.train.seed}" if variant else self.run.path.name

    def tags(self) -> dict[str, str]:
        """variant, seed, learning rate and size (parameters), as strings."""
        tags = {
            "seed": str(self.train.seed),
            "lr": f"{self.train.learning_rate:g}",
            "size": str(self.params),
            "n_embd": str(self.model.n_embd),
            "n_layer": str(self.model.n_layer),
            "run_dir": str(self.run.path.resolve()),
        }
        variant = self.train.extra.get("study_variant")
        return {**tags, "variant": str(variant)} if variant else tags

    def params_flat(self) -> dict[str, Any]:
        """model.* and train.* fields, for the tracker's config/params."""
        flat = {f"model.{k}": v for k, v in self.model.to_dict().items()}
        flat.update({f"train.{k}": v for k, v in self.train.to_dict().items() if k != "extra"})
        return flat

    def recorded_ids(self) -> dict[str, str]:
        ids = (self.run.read_env() or {}).get(ENV_KEY)
        return ids if isinstance(ids, dict) else {}

    def record_id(self, tracker: str, run_id: str) -> None:
        """Keep the tracker's run id in env.json: a resume logs into the same run."""
        env = self.run.read_env() or {}
        ids = {**self.recorded_ids(), tracker: run_id}
        self.run.write_env({**env, ENV_KEY: ids})


def _scalars(row: dict[str, Any]) -> dict[str, float]:
    return {
        k: float(v)
        for k, v in row.items()
        if k != "iter" and isinstance(v, int | float) and math.isfinite(v)
    }


class Tracker:
    """One backend: rows in, a run out."""

    def log(self, rows: Sequence[dict[str, Any]]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """End the tracker's run (a no-op by default)."""


class TensorBoardTracker(Tracker):
    """TensorBoard scalars in RUN/tb; a resume hides what was logged past its checkpoint."""

    def __init__(self, run: RunDir, resumed_at: int = 0) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # purge_step: the events a killed process logged past the checkpoint are logged again
        purge = resumed_at + 1 if resumed_at else 0
        self.writer = SummaryWriter(str(run.tensorboard), purge_step=purge)

    def log(self, rows: Sequence[dict[str, Any]]) -> None:
        for r in rows:
            for key, value in _scalars(r).items():
                self.writer.add_scalar(key, value, r["iter"])
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbTracker(Tracker):
    """A W&B run (offline with WANDB_MODE=offline); a study's runs share its group."""

    def __init__(self, info: RunInfo) -> None:
        wandb = _require("wandb")
        run_id = info.recorded_ids().get("wandb") or _new_id(info.run.path)
        group = info.study.get("group")
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT") or PROJECT,
            id=run_id,
            name=info.name,
            group=group,
            job_type="train",
            tags=[f"{k}={v}" for k, v in info.tags().items() if k != "run_dir"],
            config={**info.params_flat(), **info.tags()},
            resume="allow",
            reinit="create_new",
            settings=_wandb_settings(wandb),
        )
        info.record_id("wandb", run_id)

    def log(self, rows: Sequence[dict[str, Any]]) -> None:
        for r in rows:
            self.run.log(_scalars(r), step=int(r["iter"]))

    def close(self) -> None:
        self.run.finish()


def _wandb_settings(wandb: Any) -> Any:
    """No console capture unless WANDB_CONSOLE asks: it wraps stdout and stderr, which are the
    caller's (attnlab's lines are in metrics.csv anyway)."""
    return wandb.Settings(console=os.environ.get("WANDB_CONSOLE") or "off")


def _new_id(path: Path) -> str:
    """A fresh W&B run id, unique to this run folder and moment."""
    seed = f"{path.resolve()}:{os.getpid()}:{os.urandom(8).hex()}"
    return hashlib.sha256(seed.encode()).hexdigest()[:16]


def mlflow_client() -> Any:
    """MLflow's client at MLFLOW_TRACKING_URI (or MLflow's default store)."""
    return _require("mlflow").MlflowClient()


def mlflow_experiment(client: Any) -> str:
    """The experiment id of MLFLOW_EXPERIMENT_NAME (or "attnlab"), created if needed."""
    name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or PROJECT
    found = client.get_experiment_by_name(name)
    return found.experiment_id if found is not None else client.create_experiment(name)


class MlflowTracker(Tracker):
    """An MLflow run with the config as params; a study's runs are children of its run."""

    def __init__(self, info: RunInfo) -> None:
        self.client = mlflow_client()
        entities = _require("mlflow.entities")
        self.Metric = entities.Metric
        run_id = info.recorded_ids().get("mlflow")
        tags = {f"attnlab.{k}": v for k, v in info.tags().items()}
        if info.study.get("mlflow_parent"):  # MLflow's own tag for nesting
            tags["mlflow.parentRunId"] = info.study["mlflow_parent"]
        if run_id is None:
            run = self.client.create_run(
                mlflow_experiment(self.client), run_name=info.name, tags=tags
            )
            run_id = run.info.run_id
            params = [entities.Param(k, json.dumps(v)) for k, v in info.params_flat().items()]
            self.client.log_batch(run_id, params=params)
            info.record_id("mlflow", run_id)
        else:  # params are fixed once logged; a resume's overrides are in config.json
            self.client.update_run(run_id, status="RUNNING")
        self.run_id = run_id

    def log(self, rows: Sequence[dict[str, Any]]) -> None:
        now = _now_ms()
        metrics = [
            self.Metric(k, v, now, int(r["iter"])) for r in rows for k, v in _scalars(r).items()
        ]
        if metrics:
            self.client.log_batch(self.run_id, metrics=metrics)

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def _now_ms() -> int:
    return int(time.time() * 1000)


# the trackers outside the run folder; csv (metrics.csv) and tensorboard are MetricsLog's own
REMOTE: dict[str, type[WandbTracker | MlflowTracker]] = {
    "wandb": WandbTracker,
    "mlflow": MlflowTracker,
}


def open_trackers(names: Iterable[str], info: RunInfo) -> list[Tracker]:
    """The remote trackers among ``names``, each with its run started (or resumed)."""
    opened: list[Tracker] = []
    try:
        for name in dict.fromkeys(names):
            if name in REMOTE:
                opened.append(REMOTE[name](info))
    except BaseException:
        for tracker in opened:
            tracker.close()
        raise
    return opened


class StudyTracking:
    """A study's place in the trackers: a W&B group and an MLflow parent run, named by the
    study and its folder; ``context`` goes to every run, ``attach`` adds the report."""

    def __init__(self, names: Sequence[str], study: str, folder: Path) -> None:
        self.names = [n for n in names if n in REMOTE]
        self.study, self.folder = study, folder.resolve()
        digest = hashlib.sha256(str(self.folder).encode()).hexdigest()[:8]
        self.group = f"{study}-{digest}"
        self.context: dict[str, Any] = {"trackers": list(names), "group": self.group}
        require(self.names)
        if "mlflow" in self.names:
            self.context["mlflow_parent"] = self._mlflow_parent()

    def _mlflow_parent(self) -> str:
        """The parent run of this study folder (a resumed study finds its own)."""
        client = mlflow_client()
        experiment = mlflow_experiment(client)
        found = client.search_runs(
            [experiment], filter_string=f"tags.`attnlab.study_dir` = '{self.folder}'"
        )
        if found:
            return found[0].info.run_id
        tags = {"attnlab.study": self.study, "attnlab.study_dir": str(self.folder)}
        return client.create_run(experiment, run_name=self.group, tags=tags).info.run_id

    def attach(self, files: Iterable[Path], verdicts: dict[str, Any]) -> None:
        """The report's files and the verdicts, as artifacts of the study's parent run and of
        a W&B run of job type "report" in the study's group."""
        files = [f for f in files if f.is_file()]
        if "mlflow" in self.names:
            client, run_id = mlflow_client(), self.context["mlflow_parent"]
            for f in files:
                client.log_artifact(run_id, str(f), _subdir(f, self.folder))
            client.log_dict(run_id, verdicts, "verdicts.json")
            client.set_terminated(run_id)
        if "wandb" in self.names:
            wandb = _require("wandb")
            run = wandb.init(
                project=os.environ.get("WANDB_PROJECT") or PROJECT,
                name=f"{self.group}-report",
                group=self.group,
                job_type="report",
                reinit="create_new",
                settings=_wandb_settings(wandb),
            )
            artifact = wandb.Artifact(f"{self.group}-report", type="report")
            for f in files:
                artifact.add_file(str(f), name=str(Path(_subdir(f, self.folder) or "") / f.name))
            run.log_artifact(artifact)
            run.summary["verdicts"] = verdicts
            run.finish()


def _subdir(path: Path, root: Path) -> str | None:
    """The artifact folder of ``path``: its folder relative to the study's (None at the top)."""
    rel = path.resolve().parent.relative_to(root)
    return None if rel == Path(".") else str(rel)
