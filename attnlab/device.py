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
    """ "auto": bf16 autocast on a CUDA GPU that computes bf16 natively (Ampere and later), fp16
    (with the trainer's GradScaler) on older GPUs, whose bf16 is emulated and slower than fp32
    (T4, V100); float32 on CPU and MPS. Otherwise the dtype named."""
    if name == "auto":
        if device.type != "cuda":
            return None
        native = torch.cuda.is_bf16_supported(including_emulation=False)
        return torch.bfloat16 if native else torch.float16
    return None if name == "float32" else getattr(torch, name)


def synchronize(device: torch.device) -> None:
    """Wait for the kernels queued on ``device`` (a no-op on CPU): before reading a clock."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def reset_peak_memory(device: torch.device) -> None:
    """Start a new peak on CUDA (a study worker trains many runs in one process); the CPU's
    peak resident set size cannot be reset."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


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
