"""Checkpoints as HF-style folders, written atomically and loaded without running pickled code.

A checkpoint folder holds ``config.json`` (the ModelConfig), ``model.safetensors``,
``tokenizer.json`` and, for a run's checkpoints, ``train_config.json`` and ``trainer_state.pt``
(optimizer, iteration, RNG and sampler state; tensors and plain containers only, so it loads
with ``torch.load(weights_only=True)``).

Atomic swap: everything is written and fsync'ed into a hidden temporary folder; the previous
folder is renamed aside, the new one renamed into place, and only then is the old one deleted.
A crash at any moment leaves either the old or the new folder complete; if it strikes between
the two renames, ``checkpoint_dir`` finds the old one under its aside name.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import os
import pickle
import re
import shutil
import signal
import warnings
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save

from attnlab import errors
from attnlab.config import ModelConfig, TrainConfig
from attnlab.data.tokenizer import Tokenizer
from attnlab.errors import AttnlabError
from attnlab.fsutil import (
    check_manifest,
    fsync_tree,
    holds_only,
    no_space_message,
    out_of_space,
    remove_stale_temps,
    swap_in,
    write_manifest,
)
from attnlab.model import GPT
from attnlab.model.hf_map import config_from_hf, state_dict_from_hf
from attnlab.model.memory import check_fits
from attnlab.rundir import BEST, LATEST, checkpoint_problem

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
BIN_WEIGHTS = "pytorch_model.bin"
TOKENIZER = "tokenizer.json"
MODEL_FILES = (CONFIG, TOKENIZER, WEIGHTS)  # a model folder: write_model_folder's files
TRAIN_CONFIG = "train_config.json"
TRAINER_STATE = "trainer_state.pt"
SHARDS = (
    "shards"  # a sharded checkpoint's weights and optimizer state (torch.distributed.checkpoint)
)
SHARD_METADATA = ".metadata"  # the file torch.distributed.checkpoint writes last
CHECKPOINT_KIND = "checkpoint"  # the kind its manifest (attnlab.fsutil) names
ASIDE = ".old"
DIGEST_KEY = "attnlab.sha256"  # safetensors metadata entry holding weights_digest()
# safetensors metadata entries holding the sha256 of the folder's other files, checked on load
FILE_DIGEST_KEYS = {CONFIG: "attnlab.config.sha256", TOKENIZER: "attnlab.tokenizer.sha256"}
FILES_KEY = "files"  # a sharded checkpoint's trainer_state.pt entry holding those digests
# Test hook for the crash-safety tests: "STAGE:N" makes the Nth save_checkpoint of the process
# SIGKILL itself at STAGE ("write": temporary folder half written; "swap": between the renames).
KILL_HOOK = "ATTNLAB_TEST_KILL_DURING_SAVE"
_SAVES = itertools.count(1)


def model_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The state_dict to save: tied lm_head dropped (it is wte), tensors contiguous and on CPU."""
    sd = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    if getattr(model.config, "tie_embeddings", False):
        sd.pop("lm_head.weight", None)
    return sd


def weights_digest(sd: dict[str, torch.Tensor]) -> str:
    """sha256 over every tensor's name, dtype, shape and bytes, in name order.

    safetensors has no checksum of its own, so without this a flipped bit in the data section
    would load silently; it is stored in the file's metadata and checked on every load.
    """
    digest = hashlib.sha256()
    for name in sorted(sd):
        t = sd[name].detach().contiguous().cpu()
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        digest.update(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
    return digest.hexdigest()


def write_weights(model: torch.nn.Module, path: Path) -> None:
    """model.safetensors with the weights' sha256 in its metadata."""
    write_state_dict(model_state_dict(model), path)


def write_state_dict(sd: dict[str, torch.Tensor], path: Path) -> None:
    """A safetensors file of ``sd`` with its sha256 in the metadata."""
    metadata = {"format": "pt", DIGEST_KEY: weights_digest(sd), **file_digests(path.parent)}
    write_bytes(path, save(sd, metadata=metadata))


def file_digests(folder: Path) -> dict[str, str]:
    """sha256 of the config.json and tokenizer.json already in ``folder``, by metadata key."""
    return {
        key: hashlib.sha256((folder / name).read_bytes()).hexdigest()
        for name, key in FILE_DIGEST_KEYS.items()
        if (folder / name).is_file()
    }


def weights_record(folder: Path) -> dict[str, Any]:
    """What a model folder's manifest (attnlab.fsutil) adds: the weights' sha256 and those of
    the config.json and tokenizer.json they were saved with, from model.safetensors' metadata.
    Read back without hashing the file, it tells another model's weights of the same size (a
    copy that kept its old time) from the folder's own."""
    path = folder / WEIGHTS
    if not path.is_file():  # an export of graphs only
        return {}
    with safe_open(str(path), framework="pt") as f:
        metadata = f.metadata() or {}
    names = {DIGEST_KEY: "sha256", **{k: name for name, k in FILE_DIGEST_KEYS.items()}}
    return {
        "weights": {"file": WEIGHTS, **{v: metadata[k] for k, v in names.items() if k in metadata}}
    }


def write_bytes(path: Path, data: bytes) -> None:
    """Write a file with plain file I/O, so a full disk is an OSError naming its reason."""
    with path.open("wb") as f:
        f.write(data)


def refuse_run_checkpoint(out: Path) -> None:
    """Refuse a run's latest/ or best/, or a path inside them, as the --out of a command that
    writes a model folder (see rundir.checkpoint_problem), with --overwrite or not."""
    problem = checkpoint_problem(out)
    if problem is not None:
        raise AttnlabError(problem)


def write_model_folder(folder: Path, model: torch.nn.Module, tokenizer: Any | None) -> None:
    """config.json (+ tokenizer.json) + model.safetensors, which records both files' sha256."""
    _write_config(folder, model, tokenizer)
    write_weights(model, folder / WEIGHTS)


def _write_config(folder: Path, model: torch.nn.Module, tokenizer: Any | None) -> None:
    (folder / CONFIG).write_text(model.config.to_json())
    if tokenizer is not None:
        tokenizer.save(folder / TOKENIZER)


def shards_of(folder: Path) -> Path | None:
    """The checkpoint's shards/ (written by every rank under sharded_checkpoints), or None."""
    shards = folder / SHARDS
    return shards if (shards / SHARD_METADATA).is_file() else None


def save_checkpoint(
    folder: str | Path,
    model: torch.nn.Module,
    tokenizer: Any | None = None,
    train_config: TrainConfig | None = None,
    trainer_state: dict[str, Any] | None = None,
    shards: Path | None = None,
) -> Path:
    """Atomically (re)write ``folder`` as a checkpoint; an error leaves the old one intact.

    ``shards``: a folder of fsdp.save_shards (every rank's part of the weights and optimizer
    state), moved in as ``shards/`` in place of model.safetensors."""
    folder = Path(folder)
    save_number = next(_SAVES)
    remove_stale_temps(folder)  # left by a killed process
    tmp = folder.parent / f".{folder.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    aside = folder.parent / f"{folder.name}{ASIDE}"
    try:
        tmp.mkdir(parents=True)
        if shards is None:
            write_model_folder(tmp, model, tokenizer)
        else:
            _write_config(tmp, model, tokenizer)
            shards.rename(tmp / SHARDS)
        _kill_hook("write", save_number)
        if train_config is not None:
            (tmp / TRAIN_CONFIG).write_text(train_config.to_json())
        if trainer_state is not None:  # into memory first: a full disk is then an OSError
            if shards is not None:  # no model.safetensors records them: read_weights checks
                trainer_state = {**trainer_state, FILES_KEY: file_digests(tmp)}
            buffer = io.BytesIO()
            torch.save(trainer_state, buffer)
            write_bytes(tmp / TRAINER_STATE, buffer.getvalue())
        write_manifest(tmp, CHECKPOINT_KIND, weights_record(tmp))  # last: the files are complete
        fsync_tree(tmp)
        # the old checkpoint waits at ``aside`` (where checkpoint_dir looks after a crash) and
        # is renamed back if the swap fails
        swap_in(tmp, folder, aside, between=lambda: _kill_hook("swap", save_number))
    except BaseException as e:  # a full disk, a bug, Ctrl-C: the previous one stays
        full = out_of_space(e, folder.parent)  # before the space tmp held is freed
        shutil.rmtree(tmp, ignore_errors=True)
        if full:
            raise AttnlabError(no_space_message(folder)) from e
        if not isinstance(e, OSError | RuntimeError):
            raise
        # never blank: safetensors' refusal of shared tensors starts with a line break
        why = e.strerror if isinstance(e, OSError) and e.strerror else errors.reason(e)
        raise AttnlabError(
            f"could not write checkpoint {folder} ({why}); the previous checkpoint is intact"
        ) from e
    return folder


def _kill_hook(stage: str, save_number: int) -> None:
    """The KILL_HOOK test hook: SIGKILL this process at ``stage`` of the chosen save."""
    if os.environ.get(KILL_HOOK) == f"{stage}:{save_number}":
        os.kill(os.getpid(), signal.SIGKILL)


def holds_only_checkpoint_files(folder: Path) -> bool:
    """Whether ``folder`` holds a checkpoint's files (a model folder's, the training config and
    state) and nothing else."""
    return holds_only(folder, {*MODEL_FILES, TRAIN_CONFIG, TRAINER_STATE})


def is_model_folder(folder: Path) -> bool:
    """Whether ``folder`` is an attnlab model folder (write_model_folder's files, nothing else)."""
    return (
        checkpoint_dir(folder) == folder
        and model_type(folder) is None
        and holds_only(folder, MODEL_FILES)
    )


def checkpoint_dir(folder: str | Path) -> Path | None:
    """The complete checkpoint at ``folder``, or its aside copy if a crash hit mid-swap."""
    folder = Path(folder)
    for candidate in (folder, folder.parent / f"{folder.name}{ASIDE}"):
        if (candidate / CONFIG).is_file() and (
            (candidate / WEIGHTS).is_file() or shards_of(candidate) is not None
        ):
            return candidate
    return None


def read_weights(folder: Path) -> dict[str, torch.Tensor]:
    """model.safetensors if present, else pytorch_model.bin through the weights-only unpickler,
    else a sharded checkpoint's shards/ gathered into one state_dict; the folder's files are checked against its manifest first (attnlab.fsutil.check_manifest)."""
    manifest = check_manifest(folder) or {}
    path = folder / WEIGHTS
    if path.is_file():
        try:
            with safe_open(str(path), framework="pt") as f:  # one open: tensors and metadata
                # a safe_open handle has keys() but is not iterable
                sd = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118
                metadata = f.metadata() or {}
        except (SafetensorError, OSError, ValueError) as e:
            raise AttnlabError(f"{path} is truncated or corrupted ({e})") from None
        # files written by other tools carry no digest; ours must match it
        expected = metadata.get(DIGEST_KEY)
        if expected is not None and weights_digest(sd) != expected:
            raise AttnlabError(f"{path} is corrupted: its weights do not match their sha256")
        weights = manifest.get("weights")
        recorded = weights.get("sha256") if isinstance(weights, dict) else None
        if recorded is not None and expected != recorded:  # whole, but not the folder's
            raise AttnlabError(
                f"{path} holds other weights than the ones {folder} was written with (another "
                "model's, copied in?); restore it, or write the folder again"
            )
        check_file_digests(folder, metadata)
        return check_tensors(sd, path)
    path = folder / BIN_WEIGHTS
    if path.is_file():
        return check_tensors(safe_torch_load(path), path)
    shards = shards_of(folder)
    if shards is not None:
        from attnlab.train import fsdp

        if (folder / TRAINER_STATE).is_file():  # a tokenizer.json swapped in, without a manifest
            recorded = read_trainer_state(folder).get(FILES_KEY)
            check_file_digests(
                folder, recorded if isinstance(recorded, dict) else {}, TRAINER_STATE
            )

        return check_tensors(fsdp.read_shard_weights(shards, read_model_config(folder)), shards)
    raise AttnlabError(f"{folder} has neither {WEIGHTS} nor {BIN_WEIGHTS}")


def check_file_digests(folder: Path, metadata: dict[str, str], recorded_in: str = WEIGHTS) -> None:
    """Refuse a config.json or tokenizer.json changed since ``recorded_in`` (the weights, or a
    sharded checkpoint's trainer state) recorded its sha256."""
    for name, key in FILE_DIGEST_KEYS.items():
        expected, path = metadata.get(key), folder / name
        if expected is None:
            continue  # written before digests were recorded, or by another tool
        if not path.is_file():
            raise AttnlabError(f"{path} is missing; {recorded_in} was saved with it")
        if hashlib.sha256(path.read_bytes()).hexdigest() != expected:
            raise AttnlabError(  # either file may be the one replaced: say both
                f"{path} does not match the sha256 recorded in {recorded_in}: one of them was "
                "edited or replaced after the model was saved"
            )


def check_tensors(sd: Any, path: Path) -> dict[str, torch.Tensor]:
    """``sd`` if it maps names to finite tensors; else one line naming the first odd entry."""
    if not isinstance(sd, dict):
        raise AttnlabError(f"{path} holds a {type(sd).__name__}, not a dict of tensors")
    for name, value in sd.items():
        if not isinstance(name, str) or not isinstance(value, torch.Tensor):
            raise AttnlabError(f"{path}: entry {name!r} is a {type(value).__name__}, not a tensor")
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            raise AttnlabError(f"{path}: tensor {name} holds NaN or infinite values")
    return sd


_GLOBAL = re.compile(r"GLOBAL ([\w.]+)")


def _refusal_reason(message: str) -> str:
    """What torch's weights-only unpickler refused, without its advice to load it unsafely."""
    found = _GLOBAL.search(message)
    if found:
        name = found.group(1) if "." in found.group(1) else f"builtins.{found.group(1)}"
        return f"it imports {name}, which could run code"
    for line in (ln.strip() for ln in message.splitlines()):
        reason = line.partition("WeightsUnpickler error:")[2].strip()
        if reason:
            return reason
    lines = [ln.strip() for ln in message.splitlines()]
    plain = [ln for ln in lines if ln and not ln.startswith(_TORCH_LOAD_BOILERPLATE)]
    return next((ln for ln in plain if "weights_only" not in ln), "not a plain pickle")


_TORCH_LOAD_BOILERPLATE = (
    "Weights only load failed",
    "Please file an issue",
    "Check the documentation",
)


def safe_torch_load(path: str | Path | io.BytesIO, name: str | None = None) -> Any:
    """torch.load that refuses anything but tensors and plain containers (never runs code);
    ``name``: what the messages call it (default: the path)."""
    name = str(path) if name is None else name
    try:
        with warnings.catch_warnings():  # e.g. "Detected pickle protocol 4": noise on stderr
            warnings.simplefilter("ignore")
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise AttnlabError(
            f"{name} refused: it is not a plain weights file ({_refusal_reason(str(e))})"
        ) from None
    except FileNotFoundError:
        raise AttnlabError(f"{name} does not exist") from None
    except IsADirectoryError:
        raise AttnlabError(f"{name} is a folder, not a weights file") from None
    except (RuntimeError, EOFError, OSError) as e:
        reason = (str(e).strip().splitlines() or [f"{type(e).__name__}: empty file?"])[0]
        raise AttnlabError(f"{name} is truncated or corrupted ({reason})") from None
    except (
        KeyError,
        IndexError,
        ValueError,
        TypeError,
    ):  # the unpickler fed bytes that are no pickle
        raise AttnlabError(
            f"{name} is not a PyTorch checkpoint (its bytes are neither a zip nor a pickle)"
        ) from None


def load_weights_strict(model: torch.nn.Module, sd: dict[str, torch.Tensor], source: str) -> None:
    """load_state_dict listing every missing and unexpected key in one error."""
    expected = model.state_dict()
    sd = {k.removeprefix("_orig_mod.").removeprefix("module."): v for k, v in sd.items()}
    if getattr(model.config, "tie_embeddings", False):
        expected.pop("lm_head.weight", None)
        head, wte = sd.pop("lm_head.weight", None), sd.get("transformer.wte.weight")
        if head is not None and wte is not None and not torch.equal(head, wte):
            # tying would silently replace the file's output layer with its embedding
            raise AttnlabError(
                f"{source}: the config ties the output layer to the embedding "
                "(tie_embeddings / tie_word_embeddings), but its lm_head.weight differs from it"
            )
    missing = sorted(set(expected) - set(sd))
    unexpected = sorted(set(sd) - set(expected))
    shapes = [
        f"{k} {tuple(sd[k].shape)} vs {tuple(v.shape)}"
        for k, v in expected.items()
        if k in sd and sd[k].shape != v.shape
    ]
    if missing or unexpected or shapes:
        parts = [
            f"{what}: {_first(items, sep)}"
            for what, items, sep in (
                ("missing keys", missing, ", "),
                ("unexpected keys", unexpected, ", "),
                ("shape mismatches", shapes, "; "),
            )
            if items
        ]
        raise AttnlabError(f"{source} does not fit the model: " + "; ".join(parts))
    model.load_state_dict(sd, strict=False)


def _first(items: list[str], sep: str, n: int = 5) -> str:
    """The first ``n`` items (a wrong model lists hundreds of keys; one line stays readable)."""
    more = f"{sep}and {len(items) - n} more" if len(items) > n else ""
    return sep.join(items[:n]) + more


def model_type(folder: Path) -> str | None:
    """config.json's ``model_type`` (attnlab, gpt2, llama in an export), None in a checkpoint."""
    try:
        data = json.loads((folder / CONFIG).read_text())
    except (OSError, ValueError):
        return None  # read_model_config reports what is wrong with the file
    return data.get("model_type") if isinstance(data, dict) else None


def model_mismatch(config: ModelConfig, folder: Path) -> str | None:
    """How ``config`` differs from the model the checkpoint ``folder`` was saved as, in words
    ("twicing=True where FOLDER was saved with twicing=False"); None when they are alike. A
    field without parameters (twicing) or dropout changes what the same weights compute."""
    mine, saved = config.to_dict(), read_model_config(folder).to_dict()
    changed = [k for k in mine if mine[k] != saved.get(k)]
    if not changed:
        return None
    fields = ", ".join(f"{k}={mine[k]!r}" for k in changed)
    theirs = ", ".join(f"{k}={saved.get(k)!r}" for k in changed)
    return f"{fields} where {folder} was saved with {theirs}"


def read_train_config(folder: Path) -> dict[str, Any]:
    """The training fields a checkpoint was saved with ({} for a model folder without them)."""
    path = folder / TRAIN_CONFIG
    try:
        recipe = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError) as e:  # ValueError: not JSON, or not UTF-8 text at all
        raise AttnlabError(f"cannot read {path}: {e}") from None
    if not isinstance(recipe, dict):
        raise AttnlabError(f"{path} must hold a JSON object, not {type(recipe).__name__}")
    return recipe


def read_model_config(folder: Path) -> ModelConfig:
    """The ModelConfig of a checkpoint or of an export (attnlab, GPT-2 or Llama config.json)."""
    path = folder / CONFIG
    if not path.is_file():
        raise AttnlabError(f"{folder} is not a model folder (no {CONFIG})")
    if model_type(folder) is not None:
        return config_from_hf(json.loads(path.read_text()), str(path))
    return ModelConfig.from_json(path)


def model_folder(path: str | Path) -> Path:
    """A model folder from a run folder (best/, else latest/) or a model folder itself."""
    path = Path(path).expanduser()
    if not path.exists():
        raise AttnlabError(f"{path} does not exist")
    for candidate in (path, path / BEST, path / LATEST):
        found = checkpoint_dir(candidate)
        if found is not None:
            return found
    if (path / CONFIG).is_file() and (path / BIN_WEIGHTS).is_file():
        return path
    raise AttnlabError(
        f"{path} holds no checkpoint (expected {CONFIG} and {WEIGHTS}, or best/ or latest/)"
    )


def load_pretrained(
    path: str | Path, device: str | torch.device = "cpu"
) -> tuple[GPT, Tokenizer | None]:
    """(model in eval mode, tokenizer or None) from a model folder or a run folder."""
    folder = model_folder(path)
    config = read_model_config(folder)
    check_fits(config, torch.device(device), what=str(folder))
    tokenizer = Tokenizer.load(folder / TOKENIZER) if (folder / TOKENIZER).is_file() else None
    check_tokenizer_fits(tokenizer, config, folder / TOKENIZER)
    model = model_with_weights(config, read_model_weights(folder, config), str(folder), device)
    return model, tokenizer


def read_model_weights(folder: Path, config: ModelConfig) -> dict[str, torch.Tensor]:
    """The folder's weights in attnlab's names (an export in GPT-2's or Llama's converted)."""
    sd = read_weights(folder)
    kind = model_type(folder)
    return sd if kind is None else state_dict_from_hf(sd, config, kind, str(folder / CONFIG))


def check_tokenizer_fits(tokenizer: Tokenizer | None, config: ModelConfig, path: Path) -> None:
    """Refuse a tokenizer with ids the model has no embedding for."""
    if tokenizer is not None and tokenizer.vocab_size > config.vocab_size:
        raise AttnlabError(
            f"{path}: {tokenizer.vocab_size:,} tokens, more than the model's "
            f"vocab_size={config.vocab_size:,}"
        )


def model_with_weights(
    config: ModelConfig, sd: dict[str, torch.Tensor], source: str, device: str | torch.device
) -> GPT:
    """A GPT of ``config`` in eval mode holding exactly ``sd`` (strict: errors name ``source``)."""
    with torch.device("meta"):  # no random init of weights about to be overwritten
        model = GPT(config)
    model.materialise(device)
    load_weights_strict(model, sd, source)
    return model.eval()


def read_trainer_state(folder: Path) -> dict[str, Any]:
    """trainer_state.pt, refused in one line unless it has the parts a trainer saves."""
    path = folder / TRAINER_STATE
    saved = safe_torch_load(path)
    parts = {"optimizer": dict, "sampler": dict, "torch_rng": torch.Tensor, "state": dict}
    wrong = [
        name
        for name, kind in parts.items()
        if not isinstance(saved, dict) or not isinstance(saved.get(name), kind)
    ]
    if wrong:
        raise AttnlabError(
            f"{path} is not an attnlab trainer state (missing or odd: {', '.join(wrong)})"
        )
    return saved
