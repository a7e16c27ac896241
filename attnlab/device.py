"""Which device and precision to run on: one place for "auto" and friends."""

from __future__ import annotations

import sys

import torch

from attnlab.errors import AttnlabError


def _mps_available() -> bool:
    return getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()


def device_choices() -> list[str]:
    """The device names that work on this machine, "auto" first."""
    n_cuda = torch.cuda.device_count() if torch.cuda.is_available() else 0
    cuda = ["cuda", *(f"cuda:{i}" for i in range(n_cuda))] if n_cuda else []
    return ["auto", "cpu", *cuda, *(["mps"] if _mps_available() else [])]


def resolve_device(name: str) -> torch.device:
    """ "auto" picks cuda, then mps, then cpu; anything this machine lacks is refused."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if _mps_available():
            return torch.device("mps")
        return torch.device("cpu")
    choose = f"choose one of: {', '.join(device_choices())}"
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError, ValueError):
        raise AttnlabError(f"device={name!r} is not a device; {choose}") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise AttnlabError(f"device={name!r}: no CUDA GPU is available here; {choose}")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise AttnlabError(
                f"device={name!r}: this machine has {torch.cuda.device_count()} CUDA GPU(s); "
                f"{choose}"
            )
    elif device.type == "mps":
        if not _mps_available():
            raise AttnlabError(f"device={name!r}: Apple's MPS is not available here; {choose}")
    elif device.type != "cpu":
        raise AttnlabError(f"device={name!r} is not supported by attnlab; {choose}")
    return device


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
