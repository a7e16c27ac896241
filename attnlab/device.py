"""Which device and precision to run on: one place for "auto" and friends."""

from __future__ import annotations

import sys

import torch


def resolve_device(name: str) -> torch.device:
    """ "auto" picks cuda, then mps, then cpu."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    return torch.device(name)


def autocast_dtype(name: str, device: torch.device) -> torch.dtype | None:
    """bf16 autocast on CUDA when supported ("auto"); full precision elsewhere."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" and torch.cuda.is_bf16_supported() else None
    return None if name == "float32" else getattr(torch, name)


def peak_memory_mb(device: torch.device) -> float:
    """Peak allocated memory on CUDA, else the process's peak resident set size."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    try:
        import resource
    except ImportError:  # Windows
        return float("nan")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 2**10  # bytes on macOS, KiB on Linux
