"""How large is a model's export on disk, format by format (a model card's "int8 ONNX ~64 MB")?

The model is built from its config with freshly initialised weights: a file's size depends on
the tensors' shapes and types, not their values, so no training is needed. It is exported by
attnlab's own path (attnlab.export: ``onnx-int8`` is onnxruntime's dynamic quantization of the
``onnx`` graph) into a scratch folder inside ``out``, measured, and the scratch folder removed.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from attnlab.analysis.inputs import write_csv
from attnlab.config import ModelConfig
from attnlab.export.folder import FILES, export_model
from attnlab.model import GPT

log = logging.getLogger(__name__)

# what is measured: the PyTorch weights beside the two ONNX graphs (int8 export writes fp32 too)
FORMATS = ("safetensors", "onnx", "onnx-int8")


def files(name: str) -> list[str]:
    """The file ``measure`` writes for the model ``name``."""
    return [f"export-size-{name}.csv"]


def format_bytes(folder: Path, fmt: str) -> tuple[int, list[str]]:
    """Bytes of one format in an export ``folder``: its file plus the external data file a large
    graph keeps its weights in (``model.onnx.data``), and the names counted."""
    names = [n for n in (FILES[fmt], f"{FILES[fmt]}.data") if (folder / n).is_file()]
    return sum((folder / n).stat().st_size for n in names), names


def measure(config: ModelConfig, name: str, out: Path, seed: int = 0) -> list[dict[str, Any]]:
    """Export a freshly initialised ``config`` model (torch seed ``seed``) in FORMATS and write
    one row per format: bytes, MB (10^6 bytes), MiB and bytes per parameter."""
    torch.manual_seed(seed)
    model = GPT(config)
    params = sum(p.numel() for p in model.parameters())
    out.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".export-size-", dir=out))
    try:
        export_model(model, None, scratch / "export", FORMATS, log=log.info)
        rows = []
        for fmt in FORMATS:
            size, names = format_bytes(scratch / "export", fmt)
            rows.append(
                {
                    "model": name,
                    "format": fmt,
                    "files": " + ".join(names),
                    "bytes": size,
                    "MB": size / 1e6,
                    "MiB": size / 2**20,
                    "parameters": params,
                    "bytes_per_parameter": size / params,
                }
            )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)  # the scratch export is ours, hundreds of MB
    write_csv(out / files(name)[0], rows)
    return rows
