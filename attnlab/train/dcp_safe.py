"""torch.distributed.checkpoint's reader and load planner, without their two pickle holes.

A sharded checkpoint's ``shards/.metadata`` is a pickle (``FileSystemReader.read_metadata``
loads it with plain ``pickle.load``), and a non-tensor entry of the saved state (an optimizer's
learning rate, its betas) is a pickle inside a ``.distcp`` file, which ``DefaultLoadPlanner``
loads with ``torch.load(weights_only=False)``. Either could run code when a checkpoint is
opened. Here the metadata goes through an unpickler that knows only the classes
torch.distributed.checkpoint's metadata is made of, the entries through the weights-only
unpickler, and every file the metadata names must be a file of the shards folder itself.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path, PosixPath, PurePosixPath
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
import torch.distributed.checkpoint.metadata as dcp_metadata
import torch.serialization
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.planner import ReadItem

from attnlab.errors import AttnlabError
from attnlab.train.checkpoint import SHARD_METADATA, safe_torch_load


def _allowed_globals() -> dict[tuple[str, str], Any]:
    """What a .metadata may import: every class of torch.distributed.checkpoint's metadata
    module (dataclasses and an enum, built from plain values), the storage record of its file
    system writer, torch.Size, the layout look-up torch pickles layouts with, and the path of
    the checkpoint (StorageMeta.checkpoint_id)."""
    found: dict[tuple[str, str], Any] = {
        (dcp_metadata.__name__, name): value
        for name, value in vars(dcp_metadata).items()
        if isinstance(value, type) and value.__module__ == dcp_metadata.__name__
    }
    for value in (_StorageInfo, torch.Size, torch.serialization._get_layout, PosixPath):
        found[(value.__module__, value.__qualname__)] = value
    return found


_ALLOWED = _allowed_globals()
_TORCH_CONSTANTS = (torch.dtype, torch.layout, torch.memory_format)


class _MetadataUnpickler(pickle.Unpickler):
    """An unpickler that admits _ALLOWED and torch's dtype, layout and memory-format constants."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED:
            return _ALLOWED[(module, name)]
        constant = getattr(torch, name, None) if module == "torch" else None
        if isinstance(constant, _TORCH_CONSTANTS):
            return constant
        raise pickle.UnpicklingError(f"it imports {module}.{name}, which could run code")


def read_metadata(path: Path) -> dcp_metadata.Metadata:
    """``path`` (a .metadata) through _MetadataUnpickler; anything else refused in one line."""
    try:
        metadata = _MetadataUnpickler(io.BytesIO(path.read_bytes())).load()
    except pickle.UnpicklingError as e:
        raise AttnlabError(f"{path} refused: it is not plain checkpoint metadata ({e})") from None
    except OSError as e:
        raise AttnlabError(f"cannot read {path} ({e.strerror or e})") from None
    except Exception as e:  # bytes that are no pickle fail in many ways
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise AttnlabError(f"{path} is truncated or corrupted ({reason})") from None
    if not isinstance(metadata, dcp_metadata.Metadata) or not isinstance(
        metadata.storage_data, dict
    ):
        raise AttnlabError(f"{path} is not torch.distributed.checkpoint metadata")
    for info in metadata.storage_data.values():
        name = getattr(info, "relative_path", None)
        # a plain name inside the folder: "../x" or "/etc/x" would read a file outside it
        if not isinstance(name, str) or name in ("", ".", "..") or PurePosixPath(name).name != name:
            raise AttnlabError(f"{path} names {name!r}, which is not a file of {path.parent}")
        if getattr(info, "transform_descriptors", None):  # attnlab never writes transforms
            raise AttnlabError(f"{path} asks for storage transforms ({info.transform_descriptors})")
    return metadata


class SafeReader(dcp.FileSystemReader):
    """FileSystemReader whose metadata goes through read_metadata (never plain pickle)."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> dcp_metadata.Metadata:
        if kwargs.get("rank") is not None:  # per-rank metadata: attnlab never writes it
            raise AttnlabError(f"{self.path}: per-rank metadata is not supported")
        metadata = read_metadata(Path(self.path) / SHARD_METADATA)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = dcp_metadata.StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafePlanner(dcp.DefaultLoadPlanner):
    """DefaultLoadPlanner whose non-tensor entries load through the weights-only unpickler."""

    def __init__(self, folder: Path, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.folder = folder

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        fqn = read_item.dest_index.fqn
        loaded = safe_torch_load(value, f"{self.folder} entry {fqn}")
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[fqn], loaded)
        else:
            self.state_dict[fqn] = loaded
