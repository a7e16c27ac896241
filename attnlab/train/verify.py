"""Check a data, run or model folder in full: what `attnlab verify FOLDER` runs.

Loading a folder checks what is cheap (attnlab.fsutil.check_manifest: every size, the sha256 of
small files and of files changed since; a data folder's recorded largest token id). ``verify``
also hashes every large file, scans every token id of a data folder against its tokenizer, loads
a model's weights into the model its config.json describes, and for a run checks that each
checkpoint is the model its config.json names and that its data is the data it recorded. It
returns one line saying what it checked, or raises AttnlabError naming the first thing wrong.
A folder from before manifests listed digests (names only, or none) is checked for everything
else, and the line says so.
"""

from __future__ import annotations

from pathlib import Path

from attnlab.data.prepare import (
    META_FILE,
    fingerprint_change,
    is_data_folder,
    load_dataset,
    read_fingerprint,
)
from attnlab.data.token_files import read_tokens
from attnlab.data.tokenizer import Tokenizer
from attnlab.errors import AttnlabError
from attnlab.fsutil import MANIFEST, check_manifest
from attnlab.rundir import BEST, LATEST, RunDir, is_run_folder
from attnlab.train import checkpoint as ckpt
from attnlab.train.metrics import read_rows


def verify(folder: str | Path) -> str:
    """Check ``folder`` (a data, run or model folder) in full; one line saying what was checked."""
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise AttnlabError(f"{folder} {'is not a folder' if folder.exists() else 'does not exist'}")
    if is_data_folder(folder):
        return f"ok: {folder}: {verify_data(folder)}"
    if is_run_folder(folder):
        return f"ok: {folder}: {verify_run(folder)}"
    if (folder / ckpt.CONFIG).is_file():
        return f"ok: {folder}: {verify_model(folder)}"
    raise AttnlabError(
        f"{folder} is not a data, run or model folder (no {META_FILE} or {ckpt.CONFIG})"
    )


def _files_checked(folder: Path) -> str:
    """Every file against the manifest, digests included: how many, or that there is no list."""
    manifest = check_manifest(folder, full=True)
    files = (manifest or {}).get("files")
    if files is None:  # written by an older attnlab: nothing to compare, never refused
        return f"no file digests to check (no {MANIFEST} listing them: an older folder)"
    return f"{len(files)} files match their sha256"


def verify_data(folder: Path) -> str:
    """A data folder: its files, and every token id below its tokenizer's size (the scan that
    loading leaves to the recorded largest id)."""
    files = _files_checked(folder)
    data = load_dataset(folder)
    vocab, largest = int(data.meta["vocab_size"]), -1
    for split in ("train", "val"):
        tokens = read_tokens(folder / f"{split}.bin", data.meta["dtype"], vocab)  # the scan
        largest = max(largest, int(tokens.max()) if tokens.size else -1)
    recorded = data.meta.get("max_token_id")
    if recorded is not None and recorded != largest:
        raise AttnlabError(
            f"{folder / META_FILE} records max_token_id {recorded} but the largest id in the "
            f"bins is {largest}: the bins or meta.json changed after prepare wrote them; prepare "
            "the folder again"
        )
    return (
        f"data folder, {len(data.train):,} train + {len(data.val):,} val tokens, every id below "
        f"the {vocab:,} of its {data.tokenizer.kind} tokenizer; {files}"
    )


def verify_model(folder: Path) -> str:
    """A model folder (a checkpoint, an import, an export): its files, its weights loaded into
    the model its config.json describes, its tokenizer, and a checkpoint's trainer state."""
    files = _files_checked(folder)
    config = ckpt.read_model_config(folder)
    tokenizer = None
    if (folder / ckpt.TOKENIZER).is_file():
        tokenizer = Tokenizer.load(folder / ckpt.TOKENIZER)
        ckpt.check_tokenizer_fits(tokenizer, config, folder / ckpt.TOKENIZER)
    has_weights = any((folder / n).is_file() for n in (ckpt.WEIGHTS, ckpt.BIN_WEIGHTS)) or (
        ckpt.shards_of(folder) is not None  # a sharded checkpoint's: resharded into one
    )
    if has_weights:  # an export of graphs only has none: its files alone were checked
        ckpt.model_with_weights(config, ckpt.read_model_weights(folder, config), str(folder), "cpu")
    if (folder / ckpt.TRAIN_CONFIG).is_file():  # what a resume reads first
        ckpt.read_train_config(folder)
    if (folder / ckpt.TRAINER_STATE).is_file():
        ckpt.read_trainer_state(folder)
    weights = "weights loaded" if has_weights else "no PyTorch weights"
    told = f"{tokenizer.kind} tokenizer" if tokenizer is not None else "no tokenizer"
    return f"model folder, {weights}, {told}; {files}"


def verify_run(folder: Path) -> str:
    """A run folder: its config.json, each checkpoint in full and as the model config.json
    names, metrics.csv, and its data folder (where it is there) as the data it recorded."""
    run = RunDir(folder)
    saved = run.read_config()
    if run.metrics.is_file():
        read_rows(run.metrics)
    checked, at = [], ""
    for name in (LATEST, BEST):
        checkpoint = ckpt.checkpoint_dir(folder / name)
        if checkpoint is None:
            if (folder / name).exists():  # a save swaps a whole folder in: this is damage
                raise AttnlabError(
                    f"{folder / name} is not a complete checkpoint (no {ckpt.CONFIG} and "
                    "weights); restore it" + (", or it cannot be resumed" if name == LATEST else "")
                )
            continue
        verify_model(checkpoint)
        edited = ckpt.model_mismatch(saved.model, checkpoint)
        if edited:
            raise AttnlabError(f"{run.config} says {edited}; restore it")
        checked.append(f"{name}/")
        if name == LATEST and (checkpoint / ckpt.TRAINER_STATE).is_file():
            at = f" at iteration {ckpt.read_trainer_state(checkpoint)['state'].get('iter')}"
    if not checked:
        raise AttnlabError(f"{folder} holds no complete checkpoint (latest/ or best/)")
    data = Path(saved.data)
    if not is_data_folder(data):
        where = f"its data folder {data} is not here (resume takes --data)"
    else:
        change = fingerprint_change(saved.data_splits or {}, read_fingerprint(data))
        if change:
            raise AttnlabError(
                f"{data} no longer holds the data {folder} was trained on ({change})"
            )
        where = f"{data} holds the data it recorded"
    listed = " and ".join(checked)
    if f"{LATEST}/" not in checked:  # killed before its first save to latest/, or latest/ gone
        where += (
            "; no latest/, so it cannot be resumed (train --init-from its best/ can start anew)"
        )
    return f"run{at}: {listed} whole and the model its {run.config.name} names; {where}"
