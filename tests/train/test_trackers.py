"""W&B and MLflow trackers, for real: a training run and a study logged to W&B in offline mode
(its local run files read back) and to an MLflow SQLite store (read back through MLflow's own
client). One module, so wandb's slow import and service start are paid once."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_cli, tiny_model, tiny_train

pytest.importorskip("wandb")
pytest.importorskip("mlflow")


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory):
    """WANDB_DIR (offline) and an MLflow SQLite store for this module, set in os.environ."""
    root = tmp_path_factory.mktemp("trackers")
    env = {
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(root / "wandb-dir"),
        "WANDB_SILENT": "true",
        "WANDB_PROJECT": "attnlab-test",
        "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}",
        "MLFLOW_EXPERIMENT_NAME": "attnlab-test",
    }
    (root / "wandb-dir").mkdir()
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    from mlflow import MlflowClient

    # the experiment's artifacts in tmp (a SQLite store's default is ./mlruns, in the cwd)
    MlflowClient().create_experiment("attnlab-test", artifact_location=str(root / "artifacts"))
    yield root, env
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def wandb_runs(root: Path) -> dict[str, list[Path]]:
    """run id -> its offline run folders (WANDB_DIR/wandb/offline-run-DATE-ID; a resume adds one)."""
    runs: dict[str, list[Path]] = {}
    for folder in sorted((root / "wandb-dir" / "wandb").glob("offline-run-*")):
        runs.setdefault(folder.name.rsplit("-", 1)[1], []).append(folder)
    return runs


def wandb_log(path: Path) -> list[bytes]:
    """The records of a .wandb file: W&B's 7-byte header, then LevelDB's log format (32 KiB
    blocks of records, each checksum, length, type and data; FULL, or FIRST..MIDDLE..LAST)."""
    data, pos, records, part = path.read_bytes(), 7, [], b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:  # the block's tail is padding
            pos += left
            continue
        length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind == 0:
            continue
        part = chunk if kind in (1, 2) else part + chunk
        if kind in (1, 4):
            records.append(part)
    return records


def wandb_records(folders: list[Path]) -> dict[str, list]:
    """The run records and history rows of a W&B run's offline files, parsed with W&B's own
    protobuf schema."""
    from wandb.proto import wandb_internal_pb2

    found: dict[str, list] = {"run": [], "history": []}
    for folder in folders:
        for data in wandb_log(next(folder.glob("*.wandb"))):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(data)
            kind = record.WhichOneof("record_type")
            if kind == "run":
                found["run"].append(record.run)
            elif kind == "history":
                items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}  # fmt: skip
                found["history"].append({**items, "_step": record.history.step.num})
    return found


def csv_rows(run: Path) -> list[dict[str, str]]:
    with (run / "metrics.csv").open() as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def tracked_run(stores, tiny_data: Path):
    """A tiny run trained with trackers=csv,wandb,mlflow, then resumed to 14 iterations."""
    from attnlab.train.trainer import Trainer

    root, _ = stores
    run = root / "run"
    cfg = tiny_train(max_iters=10, eval_interval=5, trackers="csv,wandb,mlflow", log_interval=5)
    trainer = Trainer(run, tiny_model(), cfg, tiny_data, quiet=True)
    try:
        trainer.run()
    finally:
        trainer.close()
    resumed = Trainer.resume(run, {"max_iters": 14}, quiet=True)
    try:
        resumed.run()
    finally:
        resumed.close()
    return run


def test_a_run_logs_to_wandb_offline_files(stores, tracked_run: Path) -> None:
    root, _ = stores
    ids = json.loads((tracked_run / "env.json").read_text())["trackers"]
    folders = wandb_runs(root)[ids["wandb"]]  # the resume logged into the same run's id
    assert len(folders) == 2
    records = wandb_records(folders)
    run = records["run"][0]
    assert run.project == "attnlab-test" and run.run_id == ids["wandb"]
    assert {"seed=1337", "lr=0.003", "n_layer=2"} <= set(run.tags)
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert config["model.n_embd"] == 32 and config["train.max_iters"] == 10
    # every metrics.csv value is in W&B's history at its iteration, the resumed ones too
    steps = {h["_step"]: h for h in records["history"] if "_step" in h}
    rows = csv_rows(tracked_run)
    assert [int(r["iter"]) for r in rows] == [0, 5, 10, 14]
    for row in rows:
        logged = steps[int(row["iter"])]
        assert logged["val_loss" if row["val_loss"] else "train_loss"] == pytest.approx(
            float(row["val_loss"] or row["train_loss"]), rel=1e-6
        )


def test_a_run_logs_to_mlflow_read_back_by_its_client(stores, tracked_run: Path) -> None:
    from mlflow import MlflowClient

    ids = json.loads((tracked_run / "env.json").read_text())["trackers"]
    client = MlflowClient()
    run = client.get_run(ids["mlflow"])
    assert run.info.status == "FINISHED"
    assert run.data.params["model.n_embd"] == "32" and run.data.params["train.seed"] == "1337"
    tags = run.data.tags
    assert tags["attnlab.seed"] == "1337" and tags["attnlab.lr"] == "0.003"
    assert tags["attnlab.size"] == str(
        json.loads((tracked_run / "summary.json").read_text())["params"]
    )
    history = client.get_metric_history(run.info.run_id, "val_loss")
    rows = csv_rows(tracked_run)
    want = {int(r["iter"]): float(r["val_loss"]) for r in rows if r["val_loss"]}
    assert {m.step: m.value for m in history} == pytest.approx(want, rel=1e-6)
    assert len(history) == len(want)  # the resume logged its rows once, in the same run


@pytest.mark.slow
def test_a_study_is_a_wandb_group_and_an_mlflow_parent_run(stores, tiny_data: Path) -> None:
    """`attnlab study --trackers wandb,mlflow`: each run tagged with its variant, seed, LR and
    size, children of one parent run / one group, the report attached."""
    from mlflow import MlflowClient

    root, env = stores
    spec = root / "tiny.toml"
    spec.write_text(
        'name = "tiny"\ndescription = "two widths"\n'
        '[variants.a]\npreset = "shakespeare-char"\n'
        '[variants.b]\npreset = "shakespeare-char"\nmodel = { n_embd = 32 }\n'
        '[[comparisons]]\nbaseline = "a"\nvariant = "b"\n'
        "[scale.ci]\nseeds = 1\nmodel = { n_layer = 1, n_head = 2, n_embd = 16, block_size = 16 }\n"
        "train = { max_iters = 4, eval_interval = 2, eval_iters = 1, batch_size = 4, "
        'warmup_iters = 1, device = "cpu", tensorboard = false }\n'
    )
    out = root / "study"
    argv = ["study", str(spec), "--out", str(out), "--data", str(tiny_data)]
    done = run_cli(*argv, "--trackers", "wandb,mlflow", env=env)
    assert done.returncode == 0, done.stderr
    client = MlflowClient()
    experiment = client.get_experiment_by_name("attnlab-test")
    parents = client.search_runs(
        [experiment.experiment_id], f"tags.`attnlab.study_dir` = '{out.resolve()}'"
    )
    assert len(parents) == 1
    parent = parents[0].info.run_id
    children = client.search_runs(
        [experiment.experiment_id], f"tags.`mlflow.parentRunId` = '{parent}'"
    )
    assert sorted(c.data.tags["attnlab.variant"] for c in children) == ["a", "b"]
    for child in children:
        assert child.data.tags["attnlab.seed"] == "0" and "attnlab.lr" in child.data.tags
        assert int(child.data.tags["attnlab.size"]) > 0
    artifacts = {a.path for a in client.list_artifacts(parent)}
    assert {"report.md", "results.json", "verdicts.json"} <= artifacts
    verdicts = json.loads(Path(client.download_artifacts(parent, "verdicts.json")).read_text())
    results = json.loads((out / "results.json").read_text())
    assert verdicts["comparisons"] == results["comparisons"]
    # W&B: both runs in the study's group, and a report run holding the files
    group_runs = []
    for folders in wandb_runs(root).values():
        run = wandb_records(folders)["run"][0]
        if run.run_group.startswith("tiny-"):
            group_runs.append(run)
    assert sorted(r.job_type for r in group_runs) == ["report", "train", "train"]
    assert len({r.run_group for r in group_runs}) == 1
    assert {t for r in group_runs for t in r.tags} >= {"variant=a", "variant=b", "seed=0"}


def test_a_missing_tracker_package_is_one_line_naming_the_extra(
    tmp_path: Path, tiny_data: Path
) -> None:
    """Without wandb installed (hidden from the import), training refuses before it starts."""
    code = "import sys; sys.modules['wandb'] = None\nfrom attnlab.cli import main; sys.exit(main())"
    argv = ["train", "--data", str(tiny_data), "--out", str(tmp_path / "run"), "max_iters=2",
            "n_layer=1", "n_embd=16", "n_head=2", "block_size=16", "eval_iters=1", "batch_size=4",
            "device=cpu", "tensorboard=false", "trackers=csv,wandb"]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", code, *argv],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 2
    assert done.stderr == (
        "attnlab train: error: trackers=wandb needs the wandb package: pip install 'attnlab[track]'\n"
    )
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_trackers_must_name_known_backends_and_keep_csv(tmp_path: Path, capsys) -> None:
    from attnlab.cli import main
    from attnlab.config import TrainConfig
    from attnlab.errors import ConfigError

    with pytest.raises(ConfigError, match="trackers='neptune' is not allowed"):
        TrainConfig(trackers="csv,neptune")
    with pytest.raises(ConfigError, match="must include csv"):
        TrainConfig(trackers="wandb")
    assert TrainConfig().trackers == "csv,tensorboard"
    study = ["study", "kv-bias-4l", "--out", str(tmp_path / "s"), "--trackers"]
    assert main([*study, "neptune"]) == 2
    assert "--trackers='neptune' is not allowed" in capsys.readouterr().err
    assert main([*study, "wandb", "--plan"]) == 2
    assert capsys.readouterr().err == (
        "attnlab study: error: --plan trains nothing to track; leave out --trackers\n"
    )
    assert not (tmp_path / "s").exists()
