"""`attnlab bench export`: cached decoding tokens/s of PyTorch eager and compiled, onnxruntime fp32 and int8.

All four decode the same random prompts greedily as one batch with their KV cache (the ONNX
graph carries it as past_key_values / present). Backends alternate within each repetition
(attnlab.bench.timing.interleaved) and onnxruntime gets as many threads as PyTorch. The
compiled model is a compiled copy (``--no-compile`` leaves it out: compiling takes a while).
"same tokens" is the share of generated tokens equal to eager PyTorch's: 100 % shows the graphs
agree; int8 may drift once a rare near-tie flips.
"""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any

import torch

from attnlab import from_pretrained
from attnlab.bench.timing import interleaved, relative, seeded_model
from attnlab.bench.train import bench_config
from attnlab.export import FILES, export_model, load_onnx
from attnlab.export.hf import added_token_ids
from attnlab.model.generation import compile_for_decoding
from attnlab.reporting import STDERR

logger = logging.getLogger(__name__)


def bench_model(model_dir: str | None, preset: str) -> Any:
    """The PyTorch model in ``model_dir``, or a randomly initialised model of ``preset``."""
    if model_dir:
        return from_pretrained(model_dir, device="cpu")[0]
    return seeded_model(bench_config(preset)[0])


def onnx_folder(model: Any, model_dir: str | None, scratch: Path) -> Path:
    """A folder holding model.onnx and model-int8.onnx of ``model``'s weights: ``model_dir``
    when it holds both already, else ``scratch`` after exporting them there."""
    if model_dir and all((Path(model_dir) / FILES[f]).is_file() for f in ("onnx", "onnx-int8")):
        return Path(model_dir)
    logger.info(f"bench export: exporting ONNX fp32 and int8 to {scratch}", extra=STDERR)
    export_model(model, None, scratch, ["onnx-int8"])
    return scratch


def measure(
    model: Any,
    folder: Path,
    tokens: int,
    prompts: int,
    prompt_len: int,
    reps: int,
    compile: bool = True,
) -> list[list[str]]:
    """Table rows: backend, file MB, tokens/s, throughput vs eager and (onnxruntime rows) vs
    onnxruntime fp32, each the median of per-repetition ratios, share of eager's tokens."""
    cfg = model.config
    prompt = torch.randint(
        0, cfg.vocab_size, (prompts, prompt_len), generator=torch.Generator().manual_seed(0)
    )
    threads = torch.get_num_threads()
    weights = folder / FILES["safetensors"]
    backends = {"pytorch eager": (model.eval(), weights)}
    if compile:
        logger.info("bench export: compiling a copy of the model for decoding", extra=STDERR)
        backends["pytorch compiled"] = (compile_for_decoding(copy.deepcopy(model)), weights)
    for name, fmt in (("onnxruntime fp32", "onnx"), ("onnxruntime int8", "onnx-int8")):
        graph = load_onnx(folder, int8=fmt == "onnx-int8", threads=threads)[0]
        backends[name] = (graph, folder / FILES[fmt])
    outputs: dict[str, torch.Tensor] = {}
    suppressed = added_token_ids(folder)  # as `attnlab sample` does: ONNX gives them -inf

    def decode(name: str) -> None:
        outputs[name] = backends[name][0].generate(
            prompt, tokens, temperature=0.0, suppress_tokens=suppressed
        )

    timings = interleaved(
        {name: (lambda name=name: decode(name)) for name in backends}, "pytorch eager", reps
    )
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    fp32 = timings["onnxruntime fp32"]
    rows = []
    for name, (_, file) in backends.items():
        size = file.stat().st_size if file.is_file() else weight_bytes
        same = (
            (outputs[name][:, prompt_len:] == outputs["pytorch eager"][:, prompt_len:])
            .float()
            .mean()
        )
        rows.append(
            [
                name,
                f"{size / 1e6:.2f}",
                f"{prompts * tokens / timings[name].median_s:,.0f}",
                f"{1 / timings[name].ratio:.2f}x",
                f"{1 / relative(timings[name], fp32).ratio:.2f}x" if "onnx" in name else "",
                f"{100 * float(same):.0f}%",
            ]
        )
    return rows
