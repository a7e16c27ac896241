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
import itertools
import json
import os
import shutil
import signal
from pathlib import Path
from typing import Any

import torch

from attnlab.config import ModelConfig, TrainConfig
from attnlab.errors import AttnlabError

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
BIN_WEIGHTS = "pytorch_model.bin"
TOKENIZER = "tokenizer.json"
TRAIN_CONFIG = "train_config.json"
TRAINER_STATE = "trainer_state.pt"
ASIDE = ".old"
DIGEST_KEY = "attnlab.sha256"  # safetensors metadata entry holding weights_digest()
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
    from safetensors.torch import save_file

    sd = model_state_dict(model)
    save_file(sd, str(path), metadata={"format": "pt", DIGEST_KEY: weights_digest(sd)})


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(folder: Path) -> None:
    for path in [*folder.iterdir(), folder]:
        _fsync(path)


def write_model_folder(folder: Path, model: torch.nn.Module, tokenizer: Any | None) -> None:
    """config.json + model.safetensors (+ tokenizer.json) into an existing folder."""
    (folder / CONFIG).write_text(model.config.to_json())
    write_weights(model, folder / WEIGHTS)
    if tokenizer is not None:
        tokenizer.save(folder / TOKENIZER)


def save_checkpoint(
    folder: str | Path,
    model: torch.nn.Module,
    tokenizer: Any | None = None,
    train_config: TrainConfig | None = None,
    trainer_state: dict[str, Any] | None = None,
) -> Path:
    """Atomically (re)write ``folder`` as a checkpoint; an error leaves the old one intact."""
    folder = Path(folder)
    save_number = next(_SAVES)
    tmp = folder.parent / f".{folder.name}.tmp-{os.getpid()}"
    for stale in folder.parent.glob(f".{folder.name}.tmp-*"):  # left by a killed process
        shutil.rmtree(stale, ignore_errors=True)
    aside = folder.parent / f"{folder.name}{ASIDE}"
    try:
        tmp.mkdir(parents=True)
        write_model_folder(tmp, model, tokenizer)
        _kill_hook("write", save_number)
        if train_config is not None:
            (tmp / TRAIN_CONFIG).write_text(train_config.to_json())
        if trainer_state is not None:
            torch.save(trainer_state, tmp / TRAINER_STATE)
        _fsync_tree(tmp)
        if folder.exists():
            shutil.rmtree(aside, ignore_errors=True)
            os.replace(folder, aside)
        _kill_hook("swap", save_number)
        os.replace(tmp, folder)
        _fsync(folder.parent)  # make the renames themselves durable (power loss, not just a kill)
    except (OSError, RuntimeError) as e:  # torch.save reports a full disk as a RuntimeError
        shutil.rmtree(tmp, ignore_errors=True)
        lines = str(e).splitlines() or [type(e).__name__]
        reason = e.strerror if isinstance(e, OSError) and e.strerror else lines[0]
        raise AttnlabError(
            f"could not write checkpoint {folder} ({reason}); the previous checkpoint is intact"
        ) from e
    shutil.rmtree(aside, ignore_errors=True)
    return folder


def _kill_hook(stage: str, save_number: int) -> None:
    """The KILL_HOOK test hook: SIGKILL this process at ``stage`` of the chosen save."""
    if os.environ.get(KILL_HOOK) == f"{stage}:{save_number}":
        os.kill(os.getpid(), signal.SIGKILL)


def checkpoint_dir(folder: str | Path) -> Path | None:
    """The complete checkpoint at ``folder``, or its aside copy if a crash hit mid-swap."""
    folder = Path(folder)
    for candidate in (folder, folder.parent / f"{folder.name}{ASIDE}"):
        if (candidate / CONFIG).is_file() and (candidate / WEIGHTS).is_file():
            return candidate
    return None


def read_weights(folder: Path) -> dict[str, torch.Tensor]:
    """model.safetensors if present, else pytorch_model.bin through the weights-only unpickler."""
    from safetensors import SafetensorError, safe_open

    path = folder / WEIGHTS
    if path.is_file():
        try:
            with safe_open(str(path), framework="pt") as f:  # one open: tensors and metadata
                # a safe_open handle has keys() but is not iterable
                sd = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118
                expected = (f.metadata() or {}).get(DIGEST_KEY)
        except (SafetensorError, OSError, ValueError) as e:
            raise AttnlabError(f"{path} is truncated or corrupted ({e})") from None
        # files written by other tools carry no digest; ours must match it
        if expected is not None and weights_digest(sd) != expected:
            raise AttnlabError(f"{path} is corrupted: its weights do not match their sha256")
        return sd
    path = folder / BIN_WEIGHTS
    if path.is_file():
        return safe_torch_load(path)
    raise AttnlabError(f"{folder} has neither {WEIGHTS} nor {BIN_WEIGHTS}")


_TORCH_LOAD_BOILERPLATE = (
    "Weights only load failed",
    "Please file an issue",
    "Check the documentation",
)


def safe_torch_load(path: str | Path) -> Any:
    """torch.load that refuses anything but tensors and plain containers (never runs code)."""
    import pickle
    import warnings

    try:
        with warnings.catch_warnings():  # e.g. "Detected pickle protocol 4": noise on stderr
            warnings.simplefilter("ignore")
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        # torch wraps the reason in advice to retry with weights_only=False: keep the reason only
        lines = [ln.strip() for ln in str(e).splitlines()]
        reasons = [ln for ln in lines if ln and not ln.startswith(_TORCH_LOAD_BOILERPLATE)]
        reason = reasons[0] if reasons else type(e).__name__
        raise AttnlabError(f"{path} refused: it is not a plain weights file ({reason})") from None
    except (RuntimeError, EOFError, OSError) as e:
        raise AttnlabError(f"{path} is truncated or corrupted ({str(e).splitlines()[0]})") from None


def load_weights_strict(model: torch.nn.Module, sd: dict[str, torch.Tensor], source: str) -> None:
    """load_state_dict listing every missing and unexpected key in one error."""
    expected = model.state_dict()
    if getattr(model.config, "tie_embeddings", False):
        expected.pop("lm_head.weight", None)
        sd = {k: v for k, v in sd.items() if k != "lm_head.weight"}
    sd = {k.removeprefix("_orig_mod.").removeprefix("module."): v for k, v in sd.items()}
    missing = sorted(set(expected) - set(sd))
    unexpected = sorted(set(sd) - set(expected))
    shapes = [
        f"{k} {tuple(sd[k].shape)} vs {tuple(v.shape)}"
        for k, v in expected.items()
        if k in sd and sd[k].shape != v.shape
    ]
    if missing or unexpected or shapes:
        parts = [
            f"missing keys: {', '.join(missing)}" if missing else "",
            f"unexpected keys: {', '.join(unexpected)}" if unexpected else "",
            f"shape mismatches: {'; '.join(shapes)}" if shapes else "",
        ]
        raise AttnlabError(f"{source} does not fit the model: " + "; ".join(p for p in parts if p))
    model.load_state_dict(sd, strict=False)


def read_model_config(folder: Path) -> ModelConfig:
    path = folder / CONFIG
    if not path.is_file():
        raise AttnlabError(f"{folder} is not a model folder (no {CONFIG})")
    return ModelConfig.from_json(path)


def model_folder(path: str | Path) -> Path:
    """A model folder from a run folder (best/, else latest/) or a model folder itself."""
    path = Path(path).expanduser()
    if not path.exists():
        raise AttnlabError(f"{path} does not exist")
    for candidate in (path, path / "best", path / "latest"):
        found = checkpoint_dir(candidate)
        if found is not None:
            return found
    if (path / CONFIG).is_file() and (path / BIN_WEIGHTS).is_file():
        return path
    raise AttnlabError(
        f"{path} holds no checkpoint (expected {CONFIG} and {WEIGHTS}, or best/ or latest/)"
    )


def load_pretrained(path: str | Path, device: str | torch.device = "cpu"):
    """(model in eval mode, tokenizer or None) from a model folder or a run folder."""
    from attnlab.data.tokenizer import Tokenizer
    from attnlab.model import GPT

    folder = model_folder(path)
    config = read_model_config(folder)
    with torch.device("meta"):
        model = GPT(config)
    model.to_empty(device=device)
    load_weights_strict(model, read_weights(folder), str(folder))
    if config.tie_embeddings:
        model.lm_head.weight = model.transformer.wte.weight
    if model.rotary is not None:  # non-persistent buffers are not in the file: rebuild them
        from attnlab.model.layers import Rotary

        model.rotary = Rotary(config.head_dim, config.block_size, config.rope_theta).to(device)
    tokenizer = Tokenizer.load(folder / TOKENIZER) if (folder / TOKENIZER).is_file() else None
    return model.eval(), tokenizer


def read_trainer_state(folder: Path) -> dict[str, Any]:
    return safe_torch_load(folder / TRAINER_STATE)


def write_json(path: Path, data: Any) -> None:
    """Write JSON via a temporary file and rename, so readers never see half a file."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str))
    os.replace(tmp, path)
