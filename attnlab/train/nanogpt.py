"""A checkpoint of karpathy/nanoGPT's train.py as an attnlab model folder (`attnlab import-nanogpt`).

nanoGPT saves ``{"model": state_dict, "model_args": GPTConfig fields, "optimizer": ..., "iter_num",
"best_val_loss", "config"}``; the backbone's parameter names are nanoGPT's, so the weights load as
they are once ``torch.compile``'s ``_orig_mod.`` prefix and the causal-mask buffer some versions
keep (``attn.bias``, a [1, 1, T, T] constant) are dropped. Nothing is unpickled that could run
code: the checkpoint goes through ``torch.load(weights_only=True)`` and ``meta.pkl`` through an
unpickler that knows only dict, list, str and int.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

from torch import is_tensor

from attnlab.config import ModelConfig
from attnlab.data.tokenizer import Tokenizer
from attnlab.errors import AttnlabError
from attnlab.fsutil import refuse_foreign, replace_folder
from attnlab.model import GPT
from attnlab.model.memory import check_fits
from attnlab.train.checkpoint import (
    check_tensors,
    load_weights_strict,
    refuse_run_checkpoint,
    safe_torch_load,
    weights_record,
    write_model_folder,
)

# the builtins a nanoGPT char meta.pkl is made of (ints and strs need no lookup at all)
META_TYPES = frozenset({"dict", "list", "str", "int"})


class MetaUnpickler(pickle.Unpickler):
    """Refuses every global but the plain containers: unpickling cannot call anything."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "builtins" and name in META_TYPES:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"global {module}.{name} is not allowed")


def read_meta(path: str | Path) -> Tokenizer:
    """A char Tokenizer from nanoGPT's meta.pkl (``vocab_size``, ``itos``, ``stoi``)."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise AttnlabError(f"{path}: {e.strerror}") from None
    try:
        meta = MetaUnpickler(io.BytesIO(data)).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as e:
        raise AttnlabError(f"{path} refused: not a plain char meta.pkl ({e})") from None
    itos = meta.get("itos") if isinstance(meta, dict) else None
    if (
        not isinstance(itos, dict)
        or not all(type(i) is int for i in itos)
        or sorted(itos) != list(range(len(itos)))
    ):
        raise AttnlabError(f"{path}: expected a dict with 'itos' mapping ids 0..n-1 to characters")
    if meta.get("vocab_size", len(itos)) != len(itos):
        raise AttnlabError(
            f"{path}: vocab_size={meta['vocab_size']!r} but itos has {len(itos)} entries"
        )
    stoi = meta.get("stoi", {})
    if not isinstance(stoi, dict) or any(stoi.get(c, i) != i for i, c in itos.items()):
        raise AttnlabError(f"{path}: stoi and itos disagree")
    try:
        return Tokenizer.from_chars([itos[i] for i in range(len(itos))])
    except AttnlabError as e:  # e.g. an itos entry that is not one character
        raise AttnlabError(f"{path}: {e}") from None


def nanogpt_weights(sd: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """(attnlab state_dict, tied?) from nanoGPT's: prefixes and mask buffers gone."""
    sd = {k.removeprefix("_orig_mod.").removeprefix("module."): v for k, v in sd.items()}
    sd = {k: v for k, v in sd.items() if not k.endswith(".attn.bias")}
    head, wte = sd.get("lm_head.weight"), sd.get("transformer.wte.weight")
    # nanoGPT always ties; an untied head (someone's fork) is kept as its own matrix
    tied = head is None or (
        wte is not None and head.shape == wte.shape and bool((head == wte).all())
    )
    return sd, tied


def import_nanogpt(
    ckpt_path: str | Path,
    out: str | Path,
    meta: str | Path | None = None,
    overwrite: bool = False,
) -> tuple[GPT, Tokenizer | None]:
    """Write ``out`` as a model folder; returns the loaded (model, tokenizer or None).

    A non-empty ``out`` is refused unless ``overwrite``; then the new folder is swapped in whole.
    """
    sources = [p for p in (ckpt_path, meta) if p is not None]
    refuse_run_checkpoint(Path(out))
    refuse_foreign(Path(out), "model folder", overwrite, sources=sources)  # before the slow part
    saved = safe_torch_load(ckpt_path)
    if (
        not isinstance(saved, dict)
        or not isinstance(saved.get("model"), dict)
        or not isinstance(saved.get("model_args"), dict)
    ):
        raise AttnlabError(
            f"{ckpt_path} is not a nanoGPT checkpoint (no 'model' and 'model_args' dicts)"
        )
    odd = [repr(k) for k, v in saved["model"].items() if not isinstance(k, str) or not is_tensor(v)]
    if odd:
        raise AttnlabError(
            f"{ckpt_path}: 'model' must map parameter names to tensors; not: {', '.join(odd[:5])}"
        )
    check_tensors(saved["model"], Path(ckpt_path))  # a NaN weight: a folder nothing loads
    sd, tied = nanogpt_weights(saved["model"])
    try:
        config = ModelConfig.from_dict({**saved["model_args"], "tie_embeddings": tied})
    except (AttnlabError, ValueError) as e:
        raise AttnlabError(f"{ckpt_path}: model_args: {e}") from None
    tokenizer = read_meta(meta) if meta is not None else None
    # nanoGPT sizes a char model's vocabulary from its meta.pkl: any other count is another
    # dataset's (fewer characters: the model samples ids no character stands for)
    if tokenizer is not None and tokenizer.vocab_size != config.vocab_size:
        raise AttnlabError(
            f"{meta} has {tokenizer.vocab_size} characters, the model {config.vocab_size} ids: "
            "not this checkpoint's meta.pkl"
        )
    check_fits(config, "cpu", what=str(ckpt_path))
    model = GPT(config)  # tied as nanoGPT ties; loading wte fills lm_head too
    load_weights_strict(model, sd, str(ckpt_path))
    with replace_folder(
        out, "model folder", overwrite, sources=sources, describe=weights_record
    ) as tmp:
        write_model_folder(tmp, model, tokenizer)
    return model.eval(), tokenizer
