"""A payload planted in any file of a sharded run runs nothing, whatever command opens the run.

The payload is a pickle whose unpickling touches a marker file. It goes into each file that
verify, sample, export, eval, train --resume and train --init-from read, with the checkpoint's
manifest deleted (the folder then looks like an older attnlab's) or rewritten to match (anyone
who can write the files can write the manifest): each command refuses in one line or, where it
never reads that file, does its work; no marker ever appears.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import shlex
import shutil
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from conftest import tiny_model, tiny_train
from torch.distributed.checkpoint.state_dict import get_state_dict

from attnlab import cli
from attnlab.errors import AttnlabError
from attnlab.fsutil import MANIFEST, write_manifest
from attnlab.rundir import BEST, LATEST
from attnlab.train import checkpoint as ckpt
from attnlab.train import dcp_safe
from attnlab.train.trainer import Trainer

ITERS = 4  # the run's length; a resume asks for one more


class RunsCode:
    """Unpickling this runs ``touch MARKER``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {shlex.quote(str(self.marker))}",)


def shard(run: Path, name: str, payload: object | None = None, into: str = "") -> None:
    """Rewrite the run's ``name``/ as a sharded checkpoint (what sharded_checkpoints=true writes
    under torchrun: shards/ in place of model.safetensors, the optimizer state in them).
    ``payload``: saved as every non-tensor optimizer entry (``into="optim"``: a learning rate,
    the betas) or as a weight (``into="model"``: the metadata then calls it a bytes entry)."""
    trainer = Trainer.resume(run, quiet=True)
    try:
        model_sd, optim_sd = get_state_dict(trainer.model, trainer.optimizer)
        if into == "optim":
            optim_sd["param_groups"] = [
                {k: v if k == "params" else payload for k, v in g.items()}
                for g in optim_sd["param_groups"]
            ]
        elif into == "model":
            model_sd["transformer.wte.weight"] = payload
        staged = run / f".{name}-shards"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=staged, no_dist=True)
        state = ckpt.read_trainer_state(run / name)
        ckpt.save_checkpoint(
            run / name,
            trainer.model,
            trainer.data.tokenizer,
            trainer.cfg,
            {**state, "optimizer": {}},
            staged,
        )
    finally:
        trainer.close()


@pytest.fixture(scope="module")
def sharded_run(tiny_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished tiny run whose latest/ and best/ are sharded checkpoints."""
    run = tmp_path_factory.mktemp("sharded") / "run"
    recipe = tiny_train(max_iters=ITERS, eval_interval=2, log_interval=1)
    trainer = Trainer(run, tiny_model(n_layer=1), recipe, tiny_data, quiet=True)
    trainer.run()
    trainer.close()
    for name in (LATEST, BEST):
        shard(run, name)
    return run


COMMANDS = ("verify", "sample", "export", "eval", "resume", "init-from")


def commands(run: Path, tmp_path: Path, data: Path) -> dict[str, list[str]]:
    """Every command that opens a run, a checkpoint or a model folder, on ``run``."""
    return {
        "verify": ["verify", str(run)],
        "sample": ["sample", str(run), "--max-new-tokens", "2", "--device", "cpu"],
        "export": ["export", str(run), "--formats", "safetensors", "--out", str(tmp_path / "x")],
        "eval": ["eval", str(run / LATEST), "--data", str(data), "--device", "cpu"],
        "resume": ["train", "--resume", str(run), f"max_iters={ITERS + 1}"],
        "init-from": ["train", "--init-from", str(run), "--out", str(tmp_path / "new"),
                      "--data", str(data), "max_iters=1", "device=cpu", "tensorboard=false"],
    }  # fmt: skip


def test_the_sharded_run_loads(sharded_run: Path, tiny_data: Path, tmp_path: Path, capsys):
    """The control: every command works on the untouched run, so a refusal below is the
    payload's."""
    run = tmp_path / "run"
    shutil.copytree(sharded_run, run)
    for args in commands(run, tmp_path, tiny_data).values():
        assert cli.main(args) == 0, (args, capsys.readouterr().err)


def test_the_payloads_are_live(sharded_run: Path, tmp_path: Path) -> None:
    """The control: torch's own reader and planner do run them (so "no marker" below means
    they were refused, not that they were harmless)."""
    run, marker = tmp_path / "run", tmp_path / "marker"
    shutil.copytree(sharded_run, run)
    PLANTS["shards weight as a pickle"].plant(run, marker)
    state = {"model": {"transformer.wte.weight": torch.zeros(1)}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(state, checkpoint_id=run / LATEST / ckpt.SHARDS, no_dist=True)
    assert marker.exists()
    marker.unlink()
    PLANTS[_METADATA].plant(run, marker)
    with contextlib.suppress(Exception):
        dcp.FileSystemReader(run / LATEST / ckpt.SHARDS).read_metadata()
    assert marker.exists()


class Plant:
    """A way to plant the payload, the text naming it in a refusal, and the commands that read
    what it replaced (the others do their work)."""

    def __init__(self, plant, named: str, read_by: tuple[str, ...] = COMMANDS) -> None:
        self.plant, self.named, self.read_by = plant, named, read_by


def pickled(marker: Path) -> bytes:
    return pickle.dumps(RunsCode(marker))


def plant_bytes(name: str):
    """Replace ``name`` (relative to a checkpoint, or to the run with "run/") with a pickle."""

    def plant(run: Path, marker: Path) -> None:
        where = [run] if name.startswith("run/") else [run / LATEST, run / BEST]
        for folder in where:
            (folder / name.removeprefix("run/")).write_bytes(pickled(marker))

    return plant


def plant_trainer_state(run: Path, marker: Path) -> None:
    for name in (LATEST, BEST):
        path = run / name / ckpt.TRAINER_STATE
        torch.save({**torch.load(path, weights_only=True), "optimizer": RunsCode(marker)}, path)


def plant_in_shards(into: str):
    def plant(run: Path, marker: Path) -> None:
        for name in (BEST, LATEST):  # latest/ last: shard() resumes from it
            shard(run, name, RunsCode(marker), into)

    return plant


_METADATA = f"{ckpt.SHARDS}/{ckpt.SHARD_METADATA}"
_RECORDS = ("verify", "resume")  # a run's own records: checked by verify, read by resume
PLANTS = {
    ckpt.CONFIG: Plant(plant_bytes(ckpt.CONFIG), ckpt.CONFIG),
    ckpt.TOKENIZER: Plant(plant_bytes(ckpt.TOKENIZER), ckpt.TOKENIZER),
    ckpt.TRAIN_CONFIG: Plant(plant_bytes(ckpt.TRAIN_CONFIG), ckpt.TRAIN_CONFIG, _RECORDS),
    # a sharded checkpoint's digests of config.json and tokenizer.json are in it: read by all
    ckpt.TRAINER_STATE: Plant(plant_bytes(ckpt.TRAINER_STATE), ckpt.TRAINER_STATE),
    "trainer_state.pt optimizer": Plant(plant_trainer_state, ckpt.TRAINER_STATE),
    _METADATA: Plant(plant_bytes(_METADATA), _METADATA),
    f"{ckpt.SHARDS}/__0_0.distcp": Plant(plant_bytes(f"{ckpt.SHARDS}/__0_0.distcp"), ckpt.SHARDS),
    "shards weight as a pickle": Plant(plant_in_shards("model"), "entry model."),
    # the optimizer's entries: only a resume reads them
    "shards optimizer entries": Plant(plant_in_shards("optim"), "entry optim.", ("resume",)),
    MANIFEST: Plant(plant_bytes(MANIFEST), MANIFEST),
    "run/config.json": Plant(plant_bytes("run/config.json"), "config.json", _RECORDS),
    "run/metrics.csv": Plant(plant_bytes("run/metrics.csv"), "metrics.csv", _RECORDS),
    "run/env.json": Plant(plant_bytes("run/env.json"), "", ()),  # provenance: read by none
    "run/summary.json": Plant(plant_bytes("run/summary.json"), "", ()),
}
# the executed class of the battery (issue 53): in the default suite; the rest is slow
EXECUTED = (_METADATA, "shards weight as a pickle", "shards optimizer entries")


def snapshot(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != ".attnlab.lock"
    }


def planted_cases() -> list:
    cases = []
    for plant in PLANTS:
        for manifest in ("deleted", "rewritten") if plant != MANIFEST else ("planted",):
            slow = plant not in EXECUTED or manifest == "deleted"
            marks = [pytest.mark.slow] if slow else []
            cases.append(pytest.param(plant, manifest, marks=marks, id=f"{plant}-{manifest}"))
    return cases


@pytest.mark.parametrize(("plant", "manifest"), planted_cases())
def test_a_planted_payload_runs_nothing(
    sharded_run: Path, tiny_data: Path, tmp_path: Path, capsys, plant: str, manifest: str
) -> None:
    """Each command refuses in one line naming the file, or (where it never reads it) works;
    no marker appears, and a refusal changes nothing on disk."""
    run, marker = tmp_path / "run", tmp_path / "marker"
    shutil.copytree(sharded_run, run)
    case = PLANTS[plant]
    case.plant(run, marker)
    for name in (LATEST, BEST):
        if manifest == "deleted":
            (run / name / MANIFEST).unlink()
        elif manifest == "rewritten":  # anyone who can write the files can write it
            write_manifest(run / name, ckpt.CHECKPOINT_KIND, ckpt.weights_record(run / name))
    capsys.readouterr()
    for command, args in commands(run, tmp_path, tiny_data).items():
        before = snapshot(tmp_path)
        code = cli.main(args)
        err = capsys.readouterr().err
        assert not marker.exists(), command
        if command not in case.read_by:
            assert code == 0, (command, err)
            continue
        assert code == 2, (command, err)
        assert err.count("\n") == 1 and err.startswith(f"attnlab {args[0]}: error: "), err
        assert case.named in err, (command, err)
        assert snapshot(tmp_path) == before, command


def test_a_swapped_tokenizer_of_a_sharded_checkpoint_is_refused(
    sharded_run: Path, tmp_path: Path, capsys
) -> None:
    """Without a manifest a sharded checkpoint sampled with another tokenizer.json: there is
    no model.safetensors to record its digest, so trainer_state.pt does."""
    run = tmp_path / "run"
    shutil.copytree(sharded_run, run)
    path = run / BEST / ckpt.TOKENIZER
    (run / BEST / MANIFEST).unlink()
    text = path.read_text()
    swapped = text.replace('"a": ', '"a_": ').replace('"b": ', '"a": ').replace('"a_": ', '"b": ')
    assert swapped != text
    path.write_text(swapped)
    before = snapshot(tmp_path)
    assert cli.main(["sample", str(run), "--max-new-tokens", "2", "--device", "cpu"]) == 2
    assert capsys.readouterr().err == (
        f"attnlab sample: error: {path} does not match the sha256 recorded in "
        f"{ckpt.TRAINER_STATE}: one of them was edited or replaced after the model was saved\n"
    )
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("name", ["../../config.json", "/etc/hostname", ".."])
def test_shard_metadata_naming_a_file_outside_the_folder_is_refused(
    sharded_run: Path, tmp_path: Path, name: str
) -> None:
    """A .metadata whose storage names ../x read that file's bytes into the weights."""
    shards = tmp_path / "run" / BEST / ckpt.SHARDS
    shutil.copytree(sharded_run, tmp_path / "run")
    metadata = dcp_safe.read_metadata(shards / ckpt.SHARD_METADATA)
    for info in metadata.storage_data.values():
        info.relative_path = name
    (shards / ckpt.SHARD_METADATA).write_bytes(pickle.dumps(metadata))
    (shards.parent / MANIFEST).unlink()  # the manifest would refuse the changed file first
    with pytest.raises(AttnlabError) as err:
        ckpt.read_weights(shards.parent)
    assert str(err.value) == (
        f"{shards / ckpt.SHARD_METADATA} names {name!r}, which is not a file of {shards}"
    )
