"""ONNX: the dynamo-exported graph, its int8 quantization, and running it with onnxruntime.

ONNX goes through the dynamo exporter (``torch.export``): on torch 2.13 it handles every
component (the TorchScript-based exporter has no ``aten::rms_norm``) and it proves the batch and
sequence axes symbolic instead of trusting a trace. Int8 is onnxruntime's dynamic quantization
(int8 weights, activations quantized per batch at run time).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnlab.errors import AttnlabError
from attnlab.export.trace import INPUT, OUTPUT, LogitsModel, example_input, quiet_logger
from attnlab.train import checkpoint as ckpt

ONNX_FILE, INT8_FILE = "model.onnx", "model-int8.onnx"
# the ONNX protobuf limit: larger models keep their weights in a side file
PROTOBUF_LIMIT = 2**31 - 2**26


def write_onnx(model: nn.Module, path: Path) -> None:
    """Dynamo export with symbolic batch and seq (up to block_size); onnx.checker must pass."""
    import onnx

    batch = torch.export.Dim("batch", min=1)
    seq = torch.export.Dim("seq", min=1, max=model.config.block_size)
    weight_bytes = sum(v.numel() * v.element_size() for v in ckpt.model_state_dict(model).values())
    with warnings.catch_warnings(), quiet_logger("torch.onnx"):
        warnings.simplefilter("ignore")  # deprecation chatter from torch.export internals
        torch.onnx.export(
            LogitsModel(model).eval(),
            (example_input(model.config),),
            str(path),
            dynamo=True,
            input_names=[INPUT],
            output_names=[OUTPUT],
            dynamic_shapes={INPUT: {0: batch, 1: seq}},
            external_data=weight_bytes > PROTOBUF_LIMIT,
            verbose=False,
        )
    onnx.checker.check_model(str(path))


def write_onnx_int8(path_fp32: Path, path: Path) -> None:
    """onnxruntime dynamic quantization: MatMul/Gather weights to QInt8."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with quiet_logger(""):  # onnxruntime logs its pre-processing advice on the root logger
        quantize_dynamic(str(path_fp32), str(path), weight_type=QuantType.QInt8)


class OnnxLM:
    """An exported ONNX graph behind the calls attnlab.model.generation makes of a model.

    The graph has no KV cache, so every step reruns the (cropped) context window.
    """

    def __init__(self, path: str | Path, config: Any, threads: int | None = None) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        if threads is not None:
            options.intra_op_num_threads = threads
        self.path, self.config = Path(path), config
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    def logits(self, idx: torch.Tensor) -> torch.Tensor:
        """All-position logits [B, T, V] of ids [B, T] (on the CPU)."""
        out = self.session.run([OUTPUT], {INPUT: idx.detach().cpu().numpy().astype("int64")})[0]
        return torch.from_numpy(out)

    def __call__(self, idx: torch.Tensor) -> tuple[torch.Tensor, None]:
        return self.logits(idx), None

    def generate(self, idx: torch.Tensor, max_new_tokens: int, **kwargs: Any) -> torch.Tensor:
        """Like GPT.generate (same sampling code); ``use_cache`` is ignored."""
        from attnlab.model.generation import stream

        kwargs["use_cache"] = False
        return torch.cat([idx.cpu(), *stream(self, idx.cpu(), max_new_tokens, **kwargs)], dim=1)


def load_onnx(path: str | Path, int8: bool = False) -> tuple[OnnxLM, Any | None]:
    """(OnnxLM, tokenizer or None) from an exported folder's model.onnx (or model-int8.onnx)."""
    from attnlab.data.tokenizer import Tokenizer

    folder = Path(path).expanduser()
    file = folder / (INT8_FILE if int8 else ONNX_FILE)
    if not file.is_file():
        raise AttnlabError(
            f"{folder} has no {file.name}; run `attnlab export {folder} --out DIR` first"
        )
    tokenizer = (
        Tokenizer.load(folder / ckpt.TOKENIZER) if (folder / ckpt.TOKENIZER).is_file() else None
    )
    return OnnxLM(file, ckpt.read_model_config(folder)), tokenizer
