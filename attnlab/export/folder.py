"""The exported model folder: five formats beside the metadata Hugging Face tools read.

``export(source, out)`` writes ``config.json`` (transformers' config: GPT-2's or Llama's where
the model is exactly that, else the ModelConfig with ``model_type="attnlab"`` and the remote
code beside it; see attnlab.export.hf), ``generation_config.json``, ``tokenizer.json`` with
``tokenizer_config.json`` and ``special_tokens_map.json``, and the weights as
``model.safetensors``, ``pytorch_model.bin`` (a plain state_dict: tensors only, so it loads with
``torch.load(weights_only=True)``), ``model.torchscript.pt`` (a traced ``input_ids -> logits``
graph that needs no attnlab to load), ``model.onnx`` (with a KV cache, attnlab.export.onnx) and
``model-int8.onnx``; on request (not in ``all``), llama.cpp's ``model.gguf`` (f32),
``model-f16.gguf`` or ``model-q8_0.gguf`` for a model that is exactly GPT-2 or Llama
(attnlab.export.gguf).

The folder is written beside ``out`` and swapped in (attnlab.fsutil), so a failure leaves the
previous export whole; a non-empty ``out`` that is not an attnlab export needs ``overwrite``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from attnlab.errors import AttnlabError
from attnlab.export import gguf
from attnlab.export.hf import (
    EXPORT_MARK,
    METADATA_FILES,
    TOKENIZER_CONFIG,
    Metadata,
    ShippedTokenizer,
    genai_reads_own,
    genai_tokenizer,
    shipped_tokenizer,
    write_metadata,
)
from attnlab.export.onnx import (
    GENAI_CONFIG,
    GENAI_ONNX_FILE,
    INT8_FILE,
    ONNX_FILE,
    cache_slots,
    genai_config,
    plain_cache,
    write_onnx,
    write_onnx_int8,
)
from attnlab.export.torchscript import write_torchscript
from attnlab.fsutil import holds_only, replace_folder
from attnlab.model import hf_map
from attnlab.train import checkpoint as ckpt

FILES = {
    "safetensors": ckpt.WEIGHTS,
    "bin": ckpt.BIN_WEIGHTS,
    "torchscript": "model.torchscript.pt",
    "onnx": ONNX_FILE,
    "onnx-int8": INT8_FILE,
}
FORMATS = tuple(FILES)  # what `all` writes
# GGUF only on request: llama.cpp runs only the GPT-2 and Llama backbones
FILES.update({fmt: file for fmt, (file, _) in gguf.FORMATS.items()})
# the formats that hold a traced graph, not weights PyTorch loads into a GPT
GRAPH_FORMATS = ("torchscript", "onnx", "onnx-int8")


def parse_formats(text: str) -> list[str]:
    """``all`` (FORMATS: every format but GGUF) or a comma list of FILES' formats, in that order;
    onnx-int8 brings onnx (its source)."""
    names = {n.strip() for n in text.split(",") if n.strip()}
    if "all" in names:
        names = (names - {"all"}) | set(FORMATS)
    unknown = sorted(names - set(FILES))
    if unknown or not names:
        raise AttnlabError(
            f"unknown format(s) {', '.join(unknown) or repr(text)}; "
            f"choose all or some of {', '.join(FILES)}"
        )
    if "onnx-int8" in names:
        names.add("onnx")
    return [f for f in FILES if f in names]


# --- one writer per format ------------------------------------------------------------------


def hf_state_dict(model: nn.Module, kind: str | None) -> dict[str, torch.Tensor]:
    """The weights to write: attnlab's names, or GPT-2's / Llama's for a native export."""
    return hf_map.state_dict_to_hf(ckpt.model_state_dict(model), model.config, kind)


def with_rows(model: nn.Module, rows: int) -> nn.Module:
    """``model`` with its embedding (and untied output layer) grown to ``rows`` zero rows past
    its own: a zero output row gives its token logit 0 and leaves every other logit as it was."""
    if rows == model.config.vocab_size:
        return model
    sd = ckpt.model_state_dict(model)
    for name in ("transformer.wte.weight", "lm_head.weight"):
        if name in sd:  # a tied lm_head is not in the state_dict
            sd[name] = torch.cat(
                [sd[name], sd[name].new_zeros(rows - len(sd[name]), sd[name].size(1))]
            )
    config = model.config.replace(vocab_size=rows)
    return ckpt.model_with_weights(config, sd, "the export's grown embedding", "cpu")


def write_bin(sd: dict[str, torch.Tensor], path: Path) -> None:
    """``pytorch_model.bin``: the state dict as torch.save writes it (what transformers reads)."""
    torch.save(sd, path)


# the folder holding a tokenizer.json onnxruntime-genai reads, where it cannot read the export's
GENAI_TOKENIZER_DIR = "genai_tokenizer"
# where none would do, genai_config.json names this folder, which is never written: og.Tokenizer
# then fails naming it (its own tokenizer would give wrong ids without a word), while a
# generator fed token ids runs as usual
GENAI_NO_TOKENIZER = "no-genai-tokenizer-reads-this-vocabulary-pass-token-ids"
GENAI_TOKENIZER_FILES = (ckpt.TOKENIZER, TOKENIZER_CONFIG)


def write_onnx_folder(
    model: nn.Module,
    folder: Path,
    shipped: ShippedTokenizer | None,
    metadata: Metadata,
    log: Callable[[str], None] | None,
) -> None:
    """model.onnx and what onnxruntime-genai runs: genai_config.json (from the export's
    ``metadata``), model-genai.onnx where the cache is more than one key and value a layer, a
    tokenizer where it cannot read ours."""
    config = ckpt.read_model_config(folder)
    suppressed = sorted(shipped.added.values()) if shipped is not None else []
    write_onnx(model, folder / FILES["onnx"], config, suppressed)
    if not plain_cache(cache_slots(model)):
        write_onnx(model, folder / GENAI_ONNX_FILE, config, suppressed, packed=True)
        if log is not None:
            log(f"{'onnx':12s} {GENAI_ONNX_FILE}: the cache packed as onnxruntime-genai feeds it")
    text = genai_tokenizer(shipped) if shipped is not None else None
    if text is not None:
        (folder / GENAI_TOKENIZER_DIR).mkdir()
        (folder / GENAI_TOKENIZER_DIR / ckpt.TOKENIZER).write_text(text)
        # transformers adds no bos or eos; SentencePiece-style tokenizers there do by default
        tokenizer_config = {**(metadata.tokenizer_config or {})}
        tokenizer_config.update(add_bos_token=False, add_eos_token=False)
        (folder / GENAI_TOKENIZER_DIR / TOKENIZER_CONFIG).write_text(
            json.dumps(tokenizer_config, indent=2)
        )
    tokenizer_dir = None
    if text is not None:
        tokenizer_dir = GENAI_TOKENIZER_DIR
    elif shipped is not None and not genai_reads_own(shipped):
        tokenizer_dir = GENAI_NO_TOKENIZER
    genai = genai_config(model, metadata.generation, tokenizer_dir)
    (folder / GENAI_CONFIG).write_text(json.dumps(genai, indent=2))


# every file an export may hold (a large model's ONNX weights go to an external data file)
EXPORT_FILES = frozenset(
    {
        *FILES.values(),
        *(f"{graph}.data" for graph in (ONNX_FILE, GENAI_ONNX_FILE)),
        GENAI_ONNX_FILE,
        GENAI_CONFIG,
        *METADATA_FILES,
    }
)


def is_export(folder: Path) -> bool:
    """Whether ``folder`` holds an attnlab export and nothing else, which export may replace."""
    try:
        data = json.loads((folder / ckpt.CONFIG).read_text())
    except (OSError, ValueError):
        return False
    return (
        isinstance(data, dict)
        and EXPORT_MARK in data
        and holds_only(folder, EXPORT_FILES, {GENAI_TOKENIZER_DIR: GENAI_TOKENIZER_FILES})
    )


def export_model(
    model: nn.Module,
    tokenizer: Any | None,
    out: str | Path,
    formats: Iterable[str] = FORMATS,
    log: Callable[[str], None] | None = None,
    overwrite: bool = False,
    sources: Iterable[str | Path] = (),
) -> dict[str, Path]:
    """Write ``model`` to ``out`` (moving it to the CPU, in eval mode); returns format -> file.

    ``out`` is written beside and swapped in; a non-empty ``out`` that is not an attnlab export
    is refused unless ``overwrite``, and an ``out`` holding one of ``sources`` (where the model
    came from) always.
    """
    out = Path(out).expanduser()
    ckpt.refuse_run_checkpoint(out)
    formats = parse_formats(",".join(formats))
    model = model.to("cpu").eval()
    written = {}
    what = "model folder exported by attnlab"
    shipped = None if tokenizer is None else shipped_tokenizer(tokenizer, model.config.vocab_size)
    if shipped is not None and shipped.added:
        model = with_rows(model, shipped.rows)
    if any(fmt in gguf.FORMATS for fmt in formats):  # refused before anything is written
        problem = gguf.refusal(model.config, shipped)
        if problem is not None:
            raise AttnlabError(problem)
        if log is not None and (note := gguf.caveat(model.config)) is not None:
            log(f"{'gguf':12s} {note}")
    with replace_folder(
        out, what, overwrite, is_export, sources=sources, describe=ckpt.weights_record
    ) as tmp:  # out is checked first: nothing is said of an export that is refused
        if log is not None and shipped is not None and shipped.added:
            tokens = ", ".join(f"{t} (id {i})" for t, i in shipped.added.items())
            log(f"{'tokenizer':12s} added {tokens}: zero embedding rows, vocab_size {shipped.rows}")
        metadata = write_metadata(tmp, model.config, shipped)
        sd = hf_state_dict(model, metadata.kind)
        writers: dict[str, Callable[[], None]] = {
            "safetensors": lambda: ckpt.write_state_dict(sd, tmp / FILES["safetensors"]),
            "bin": lambda: write_bin(sd, tmp / FILES["bin"]),
            "torchscript": lambda: write_torchscript(model, tmp / FILES["torchscript"]),
            "onnx": lambda: write_onnx_folder(model, tmp, shipped, metadata, log),
            "onnx-int8": lambda: write_onnx_int8(tmp / FILES["onnx"], tmp / FILES["onnx-int8"]),
        }
        for fmt, (file, precision) in gguf.FORMATS.items():
            writers[fmt] = lambda file=file, precision=precision: gguf.write_gguf(
                tmp / file, model.config, sd, shipped, precision, out.name
            )
        for fmt in formats:
            writers[fmt]()
            written[fmt] = out / FILES[fmt]
            if log is not None:
                size = (tmp / FILES[fmt]).stat().st_size / 1e6
                log(f"{fmt:12s} {written[fmt]} ({size:.2f} MB)")
    return written


def export(
    source: str | Path,
    out: str | Path,
    formats: Iterable[str] = FORMATS,
    log: Callable[[str], None] | None = None,
    overwrite: bool = False,
) -> dict[str, Path]:
    """Export a run folder or model folder (see ``export_model``)."""
    sources = (source, ckpt.model_folder(source))  # a run folder, and the checkpoint in it
    model, tokenizer = ckpt.load_pretrained(source, device="cpu")
    return export_model(model, tokenizer, out, formats, log, overwrite, sources)
