"""`attnlab bench gpu`: the GPU acceptance run, written as one JSON and one Markdown report.

What a user moving to a GPU depends on, checked where it runs:

- every registered mechanism (and plain attention) trains in the device's default precision
  (``dtype=auto``: bf16 where native, else fp16 with a GradScaler), eager and under
  ``torch.compile``, with a finite loss that went down;
- each then decodes greedily with the KV cache, giving the tokens full recomputation gives;
- the scaled-dot-product-attention kernel its training step calls (flash, efficient, cuDNN or
  math, read off the profiler's op names; "none" where a mechanism computes the weights itself);
- tokens/s and MFU of plain attention against the functional nanoGPT reference (bench train's)
  on the same device, interleaved, so the ratio comes from one run.

``smoke`` runs the same checks at toy size (CPU in the test suite), so the script cannot rot.
Multi-GPU training and the study are the shell script's (scripts/gpu_check.sh).
"""

from __future__ import annotations

import json
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.profiler import profile

from attnlab.bench.timing import (
    interleaved,
    matmul_peak_flops,
    seeded_model,
    synchronizer,
    train_step,
)
from attnlab.bench.train import reference_step
from attnlab.config import ModelConfig
from attnlab.device import autocast_dtype
from attnlab.errors import AttnlabError
from attnlab.fsutil import check_name_lengths, check_out_path, check_writable, write_json
from attnlab.model import GPT, mechanisms

REPORT_JSON, REPORT_MD = "gpu_check.json", "gpu_check.md"
# (model fields, batch, training steps, timing repetitions): a GPU-sized model, or a toy
FULL = (dict(n_layer=6, n_head=6, n_embd=384, block_size=256), 32, 50, 20)
SMOKE = (dict(n_layer=1, n_head=2, n_embd=16, block_size=16), 2, 3, 2)
VOCAB = 256
# profiler op names of the SDPA kernels, most specific first
KERNELS = (
    ("flash", "flash_attention"),
    ("efficient", "efficient_attention"),
    ("cudnn", "cudnn_attention"),
    ("math", "attention_math"),
)


def variants() -> dict[str, dict[str, Any]]:
    """Plain attention and every registered mechanism's example, from the registry."""
    return {"plain": {}, **{spec.label: dict(spec.example) for spec in mechanisms.specs()}}


def _config(fields: dict[str, Any], size: dict[str, Any]) -> ModelConfig:
    return ModelConfig(vocab_size=VOCAB, bias=False, dropout=0.0, **{**size, **fields})


def train_check(
    config: ModelConfig,
    batch: int,
    steps: int,
    device: torch.device,
    amp: torch.dtype | None,
    compile: bool,
) -> tuple[dict[str, Any], GPT]:
    """``steps`` AdamW steps on one fixed batch (the loss must fall; it is read twice): the
    result and the trained model."""
    model = seeded_model(config).to(device)
    opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.99), device.type)
    scaler = torch.amp.GradScaler(device.type, enabled=amp == torch.float16)
    gen = torch.Generator().manual_seed(0)
    x, y = (
        torch.randint(VOCAB, (batch, config.block_size), generator=gen).to(device) for _ in "xy"
    )
    forward = torch.compile(model) if compile else model
    sync = synchronizer(device)
    losses, t0 = [], time.perf_counter()
    for i in range(steps):
        with torch.autocast(device.type, dtype=amp or torch.float32, enabled=amp is not None):
            _, loss = forward(x, y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        if i in (0, steps - 1):
            losses.append(float(loss.detach()))
    sync()
    first, last = losses[0], losses[-1]
    ok = all(map(torch.isfinite, torch.tensor(losses))) and last < first
    return {
        "ok": bool(ok),
        "first_loss": first,
        "last_loss": last,
        "seconds": time.perf_counter() - t0,
    }, model


def decode_check(model: GPT, tokens: int) -> bool:
    """Greedy decoding with the KV cache equals decoding by full recomputation."""
    model.eval()
    prompt = torch.zeros((1, 1), dtype=torch.long, device=next(model.parameters()).device)
    n = min(tokens, model.config.block_size - 1)
    with torch.no_grad():
        cached = model.generate(prompt, n, temperature=0.0, use_cache=True)
        full = model.generate(prompt, n, temperature=0.0, use_cache=False)
    model.train()
    return bool(torch.equal(cached, full))


def sdpa_kernel(model: GPT, batch: int, device: torch.device, amp: torch.dtype | None) -> str:
    """The SDPA kernel one training step calls, from the profiler's op names."""
    x = torch.zeros((batch, model.config.block_size), dtype=torch.long, device=device)
    with profile() as prof:
        with torch.autocast(device.type, dtype=amp or torch.float32, enabled=amp is not None):
            _, loss = model(x, x)
        loss.backward()
    names = {e.key for e in prof.key_averages()}
    for kernel, mark in KERNELS:
        if any(mark in name for name in names):
            return kernel
    return "none"


def throughput(
    size: dict[str, Any], batch: int, reps: int, device: torch.device, amp: torch.dtype | None
) -> dict[str, Any]:
    """Plain attention's training step against the functional nanoGPT reference, interleaved."""
    config = _config({}, size)
    ours, model = train_step(config, batch, device, amp_dtype=amp)
    reference = reference_step(model, batch, str(device))

    def in_precision(step: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            with torch.autocast(device.type, dtype=amp or torch.float32, enabled=amp is not None):
                step()

        return run

    timings = interleaved(
        {"attnlab": ours, "nanoGPT reference": in_precision(reference)},
        "attnlab",
        reps,
        warmup=2,
        sync=synchronizer(device),
    )
    peak = matmul_peak_flops(2048 if reps > 2 else 128, device=device, dtype=amp)
    tokens_per_s = batch * config.block_size / timings["attnlab"].median_s
    return {
        "tokens_per_s": tokens_per_s,
        "mfu": tokens_per_s * model.flops_per_token() / peak,
        "matmul_peak_flops": peak,
        "speed_vs_reference": timings["nanoGPT reference"].ratio,  # reference time / ours
        "ratio_iqr": timings["nanoGPT reference"].ratio_iqr,
    }


def run(device: torch.device, smoke: bool, compile: bool = True) -> dict[str, Any]:
    """Every check, as the report's dictionary."""
    size, batch, steps, reps = SMOKE if smoke else FULL
    amp = autocast_dtype("auto", device)
    rows = {}
    for label, fields in variants().items():
        config = _config(fields, size)
        eager, model = train_check(config, batch, steps, device, amp, compile=False)
        row: dict[str, Any] = {
            "train": eager,
            "decode_cached_equals_full": decode_check(model, 8 if smoke else 32),
            "sdpa_kernel": sdpa_kernel(model, batch, device, amp),
        }
        # on a CPU smoke run one compiled model says that compiling works (each takes seconds)
        if compile and (not smoke or label == "plain"):
            row["train_compiled"], _ = train_check(config, batch, steps, device, amp, compile=True)
        rows[label] = row
    return {
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "precision": str(amp).removeprefix("torch.") if amp else "float32",
        "smoke": smoke,
        "size": {**size, "batch": batch, "steps": steps},
        "mechanisms": rows,
        "throughput": throughput(size, batch, reps, device, amp),
        "passed": all(
            r["train"]["ok"]
            and r["decode_cached_equals_full"]
            and r.get("train_compiled", {"ok": True})["ok"]
            for r in rows.values()
        ),
    }


def markdown(report: dict[str, Any]) -> str:
    """The report as a page: one row per mechanism, then the throughput line."""
    lines = [
        f"# GPU acceptance: {report['device_name']} ({report['device']})",
        "",
        f"torch {report['torch']}, {report['precision']}, model {report['size']}"
        + (" (a smoke run: toy size, not a measurement)" if report["smoke"] else ""),
        "",
        "| mechanism | trains (eager) | loss first -> last | trains (compiled) | KV-cache decode | SDPA kernel |",
        "|---|---|---|---|---|---|",
    ]
    for label, r in report["mechanisms"].items():
        compiled = r.get("train_compiled")
        lines.append(
            f"| {label} | {'yes' if r['train']['ok'] else 'NO'} | "
            f"{r['train']['first_loss']:.3f} -> {r['train']['last_loss']:.3f} | "
            f"{'-' if compiled is None else 'yes' if compiled['ok'] else 'NO'} | "
            f"{'exact' if r['decode_cached_equals_full'] else 'DIFFERS'} | {r['sdpa_kernel']} |"
        )
    t = report["throughput"]
    lo, hi = t["ratio_iqr"]
    lines += [
        "",
        f"Plain attention: {t['tokens_per_s']:,.0f} tokens/s, MFU {100 * t['mfu']:.1f} % of the "
        f"measured matmul peak ({t['matmul_peak_flops'] / 1e12:.1f} TFLOP/s); speed relative to "
        f"the nanoGPT reference {t['speed_vs_reference']:.3f}x (IQR {lo:.3f}-{hi:.3f}).",
        "",
        f"Verdict: {'every check passed' if report['passed'] else 'SOME CHECKS FAILED'}.",
    ]
    return "\n".join(lines) + "\n"


def _is_report(out: Path) -> bool:
    """Whether ``out``'s two report files are the pair this command wrote (the page is the
    JSON's rendering): only those may be replaced."""
    try:
        report = json.loads((out / REPORT_JSON).read_text(encoding="utf-8"))
        page = out / REPORT_MD
        return not page.exists() or page.read_text(encoding="utf-8") == markdown(report)
    except (OSError, ValueError, TypeError, KeyError, IndexError, AttributeError):
        return False


def check_out(out: Path) -> None:
    """Refuse, before the run, an ``out`` the report cannot go to: not a folder, not writable,
    or holding a gpu_check.json/.md this command did not write (a user's notes of that name)."""
    check_name_lengths(out)
    written = check_out_path(out) and any((out / n).exists() for n in (REPORT_JSON, REPORT_MD))
    if written and not _is_report(out):
        raise AttnlabError(
            f"{out} holds a {REPORT_JSON} or {REPORT_MD} that bench gpu did not write; move "
            "it, or choose another --out"
        )
    check_writable(out)


def write(report: dict[str, Any], out: Path) -> None:
    """``gpu_check.json`` and ``gpu_check.md`` in ``out`` (each written whole, then renamed)."""
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / REPORT_JSON, report)
    tmp = out / f".{REPORT_MD}.tmp"
    tmp.write_text(markdown(report), encoding="utf-8")
    tmp.replace(out / REPORT_MD)
