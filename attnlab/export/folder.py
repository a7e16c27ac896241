"""Ship a model in five formats as one Hugging Face-style folder, and run the ONNX file back.

``export(source, out)`` writes ``config.json`` (the ModelConfig), ``generation_config.json``,
``tokenizer.json`` with ``tokenizer_config.json`` and ``special_tokens_map.json``, and the
weights as ``model.safetensors``, ``pytorch_model.bin`` (a plain state_dict: tensors only, so it
loads with ``torch.load(weights_only=True)``), ``model.torchscript.pt`` (a traced graph that
needs no attnlab to load), ``model.onnx`` and ``model-int8.onnx``. The traced and ONNX graphs take
``input_ids`` (int64 [batch, seq]) and return ``logits`` for every position ([batch, seq, vocab]).

ONNX goes through the dynamo exporter (``torch.export``): on torch 2.13 it handles every
component (the TorchScript-based exporter has no ``aten::rms_norm``) and it proves the batch and
sequence axes symbolic instead of trusting a trace. Int8 is onnxruntime's dynamic quantization
(int8 weights, activations quantized per batch at run time).
"""

from __future__ import annotations

import contextlib
import json
import logging
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnlab.errors import AttnlabError
from attnlab.train import checkpoint as ckpt

FILES = {
    "safetensors": ckpt.WEIGHTS,
    "bin": ckpt.BIN_WEIGHTS,
    "torchscript": "model.torchscript.pt",
    "onnx": "model.onnx",
    "onnx-int8": "model-int8.onnx",
}
FORMATS = tuple(FILES)
GENERATION_CONFIG = "generation_config.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
SPECIAL_TOKENS_MAP = "special_tokens_map.json"
INPUT, OUTPUT = "input_ids", "logits"
# nanoGPT's sample.py defaults; `attnlab sample` uses the same temperature
SAMPLING = {"do_sample": True, "temperature": 0.8, "top_k": 200}
# the ONNX protobuf limit: larger models keep their weights in a side file
PROTOBUF_LIMIT = 2**31 - 2**26


class LogitsModel(nn.Module):
    """``input_ids -> logits`` at every position: the one signature the graphs are traced with."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, all_logits=True)[0]


def parse_formats(text: str) -> list[str]:
    """``all`` or a comma list of FORMATS, in FORMATS order; onnx-int8 brings onnx (its source)."""
    names = {n.strip() for n in text.split(",") if n.strip()}
    if "all" in names:
        names = set(FORMATS)
    unknown = sorted(names - set(FORMATS))
    if unknown or not names:
        raise AttnlabError(
            f"unknown format(s) {', '.join(unknown) or repr(text)}; "
            f"choose all or some of {', '.join(FORMATS)}"
        )
    if "onnx-int8" in names:
        names.add("onnx")
    return [f for f in FORMATS if f in names]


def example_input(config: Any) -> torch.Tensor:
    """A [2, up to 8] trace input: sizes above 1, which torch.export would specialise on."""
    return torch.arange(2 * min(8, config.block_size)).view(2, -1) % config.vocab_size


# --- metadata ------------------------------------------------------------------------------


def special_tokens(tokenizer: Any) -> dict[str, str]:
    """HF roles of the tokenizer's special tokens: ChatML's end marker is the EOS, and so on."""
    from attnlab.data.chat import IM_END, IM_START
    from attnlab.data.tokenizer import UNK

    roles = {"bos_token": (IM_START,), "eos_token": (IM_END, "<|endoftext|>"), "unk_token": (UNK,)}
    specials = {t.content for t in tokenizer.hf.get_added_tokens_decoder().values()}
    found = {role: next((t for t in names if t in specials), None) for role, names in roles.items()}
    return {role: token for role, token in found.items() if token is not None}


def write_metadata(folder: Path, config: Any, tokenizer: Any | None) -> None:
    """config.json, generation_config.json and the three tokenizer files HF reads."""
    (folder / ckpt.CONFIG).write_text(config.to_json())
    roles = special_tokens(tokenizer) if tokenizer is not None else {}
    ids = {f"{role[:-6]}_token_id": tokenizer.token_to_id(tok) for role, tok in roles.items()}
    generation = {k: v for k, v in ids.items() if not k.startswith("unk")}
    generation.update(max_length=config.block_size, **SAMPLING)
    (folder / GENERATION_CONFIG).write_text(json.dumps(generation, indent=2))
    if tokenizer is None:
        return
    tokenizer.save(folder / ckpt.TOKENIZER)
    added = {
        str(i): {
            "content": t.content,
            "lstrip": t.lstrip,
            "normalized": t.normalized,
            "rstrip": t.rstrip,
            "single_word": t.single_word,
            "special": t.special,
        }
        for i, t in sorted(tokenizer.hf.get_added_tokens_decoder().items())
    }
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": config.block_size,
        "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": added,
        **roles,
    }
    (folder / TOKENIZER_CONFIG).write_text(json.dumps(tokenizer_config, indent=2))
    (folder / SPECIAL_TOKENS_MAP).write_text(json.dumps(roles, indent=2))


# --- one writer per format ------------------------------------------------------------------


def write_bin(model: nn.Module, path: Path) -> None:
    torch.save(ckpt.model_state_dict(model), path)


def write_torchscript(model: nn.Module, path: Path) -> None:
    """torch.jit.trace: the archive holds the graph and weights, no Python code of ours."""
    with warnings.catch_warnings(), torch.no_grad():
        # the backbone's block_size check reads sizes as Python ints; the trace keeps sizes symbolic
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        traced = torch.jit.trace(LogitsModel(model).eval(), example_input(model.config))
    torch.jit.save(traced, str(path))


@contextlib.contextmanager
def quiet_logger(name: str) -> Iterator[None]:
    """Hide a library's advisory warnings (missing torchvision ops, a quantization hint)."""
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


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


def export_model(
    model: nn.Module,
    tokenizer: Any | None,
    out: str | Path,
    formats: Iterable[str] = FORMATS,
    log: Callable[[str], None] | None = None,
) -> dict[str, Path]:
    """Write ``model`` to ``out`` (moving it to the CPU, in eval mode); returns format -> file."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model = model.to("cpu").eval()
    write_metadata(out, model.config, tokenizer)
    writers: dict[str, Callable[[], None]] = {
        "safetensors": lambda: ckpt.write_weights(model, out / FILES["safetensors"]),
        "bin": lambda: write_bin(model, out / FILES["bin"]),
        "torchscript": lambda: write_torchscript(model, out / FILES["torchscript"]),
        "onnx": lambda: write_onnx(model, out / FILES["onnx"]),
        "onnx-int8": lambda: write_onnx_int8(out / FILES["onnx"], out / FILES["onnx-int8"]),
    }
    written = {}
    for fmt in parse_formats(",".join(formats)):
        writers[fmt]()
        written[fmt] = out / FILES[fmt]
        if log is not None:
            log(f"{fmt:12s} {written[fmt]} ({written[fmt].stat().st_size / 1e6:.2f} MB)")
    return written


def export(
    source: str | Path,
    out: str | Path,
    formats: Iterable[str] = FORMATS,
    log: Callable[[str], None] | None = None,
) -> dict[str, Path]:
    """Export a run folder or model folder (see ``export_model``)."""
    model, tokenizer = ckpt.load_pretrained(source, device="cpu")
    return export_model(model, tokenizer, out, formats, log)


# --- running the ONNX file ------------------------------------------------------------------


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
    file = folder / FILES["onnx-int8" if int8 else "onnx"]
    if not file.is_file():
        raise AttnlabError(
            f"{folder} has no {file.name}; run `attnlab export {folder} --out DIR` first"
        )
    tokenizer = (
        Tokenizer.load(folder / ckpt.TOKENIZER) if (folder / ckpt.TOKENIZER).is_file() else None
    )
    return OnnxLM(file, ckpt.read_model_config(folder)), tokenizer
