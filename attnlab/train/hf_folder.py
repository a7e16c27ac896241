"""Reading a local Hugging Face folder (GPT-2, Llama, or an attnlab export with remote code):
config.json, the weights in one file or in shards, and tokenizer.json where it is one of
attnlab's kinds. ``train --init-from`` and ``import-hf`` both start from it."""

from __future__ import annotations

import json
from pathlib import Path

import safetensors
import safetensors.torch
import tokenizers
import torch

from attnlab.config import ModelConfig
from attnlab.data.tokenizer import Tokenizer
from attnlab.errors import AttnlabError
from attnlab.model import hf_map
from attnlab.model.memory import check_fits
from attnlab.train import checkpoint as ckpt

# (bpe's is a Sequence since its decoder holds the spacing rules; older exports: WordPiece)
TOKENIZER_DECODERS = {
    "char": ("Fuse",),
    "bpe": ("WordPiece", "Sequence"),
    "bytebpe": ("ByteLevel",),
}


def attnlab_tokenizer(path: Path) -> Tokenizer | None:
    """``tokenizer.json`` as attnlab's Tokenizer, or None when it is not one of attnlab's kinds;
    one that is no tokenizer at all (damaged, cut) is refused: skipped, the import lost it."""
    try:
        hf = tokenizers.Tokenizer.from_file(str(path))
    except Exception as e:  # the Rust error says what is wrong; keep its first line
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise AttnlabError(
            f"{path}: not a valid tokenizer.json ({reason}); repair it, or move it away to "
            "import the model without a tokenizer"
        ) from None
    decoder = type(hf.decoder).__name__  # the file's own (Tokenizer sets bpe's)
    try:
        tokenizer = Tokenizer(hf)
    except AttnlabError:  # another model (Unigram, WordPiece): not one attnlab reads
        return None
    return tokenizer if decoder in TOKENIZER_DECODERS[tokenizer.kind] else None


# transformers' index of a checkpoint saved in shards: {"weight_map": {tensor: shard file}}
SHARD_INDEX = {
    ckpt.WEIGHTS: f"{ckpt.WEIGHTS}.index.json",
    ckpt.BIN_WEIGHTS: f"{ckpt.BIN_WEIGHTS}.index.json",
}


def read_hf_weights(folder: Path) -> dict[str, torch.Tensor]:
    """The folder's tensors: one weights file (attnlab.train.checkpoint.read_weights) or the
    shards a ``model.safetensors.index.json`` (or ``pytorch_model.bin.index.json``) lists."""
    single = [name for name in SHARD_INDEX if (folder / name).is_file()]
    index = next((folder / i for w, i in SHARD_INDEX.items() if (folder / i).is_file()), None)
    if single or index is None:
        return ckpt.read_weights(folder)
    try:
        weight_map = json.loads(index.read_text())["weight_map"]
        shards = sorted(set(weight_map.values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise AttnlabError(f"{index} is not a shard index ({type(e).__name__}: {e})") from None
    sd: dict[str, torch.Tensor] = {}
    for shard in shards:
        path = folder / shard
        if Path(shard).name != shard or not path.is_file():
            raise AttnlabError(f"{index} lists {shard!r}, which is not a file beside it")
        if shard.endswith(".safetensors"):
            try:
                sd.update(safetensors.torch.load_file(str(path)))
            except (safetensors.SafetensorError, OSError, ValueError) as e:
                raise AttnlabError(f"{path} is truncated or corrupted ({e})") from None
        else:
            sd.update(ckpt.check_tensors(ckpt.safe_torch_load(path), path))
    missing = sorted(set(weight_map) - set(sd))
    if missing:
        raise AttnlabError(f"{index} lists {missing[0]}, which none of its shards holds")
    return ckpt.check_tensors(sd, index)


def read_hf_folder(
    source: str | Path,
) -> tuple[ModelConfig, dict[str, torch.Tensor], Tokenizer | None]:
    """(config, weights in attnlab's names, tokenizer or None) of a local GPT-2, Llama or
    attnlab (remote-code) folder: config.json + safetensors or bin, one file or shards.

    Weights load through safetensors or the weights-only unpickler; ``tokenizer.json`` comes
    along when it is one of attnlab's kinds (GPT-2's byte-level BPE is).
    """
    folder = Path(source).expanduser()
    path = folder / ckpt.CONFIG
    if not path.is_file():
        raise AttnlabError(f"{folder} has no {ckpt.CONFIG}; expected a Hugging Face model folder")
    try:
        data = json.loads(path.read_text())
    except ValueError as e:
        raise AttnlabError(f"{path} is not valid JSON ({e})") from None
    if not isinstance(data, dict):  # a list or a number said "model_type None"
        raise AttnlabError(f"{path} is not a JSON object; expected a Hugging Face config.json")
    kind = data.get("model_type")
    if kind is None and ckpt.checkpoint_dir(folder) == folder:  # said "model_type None"
        raise AttnlabError(
            f"{folder} is an attnlab model folder already: every command reads it as it is "
            "(import-hf converts Hugging Face gpt2 and llama folders)"
        )
    if kind not in (*hf_map.KINDS, "attnlab"):
        raise AttnlabError(
            f"{path}: model_type {kind!r}; import-hf reads gpt2 and llama folders "
            "(and attnlab's own exports)"
        )
    config = hf_map.config_from_hf(data, str(path))
    check_fits(config, "cpu", what=str(folder))
    sd = hf_map.state_dict_from_hf(read_hf_weights(folder), config, kind, str(path))
    tokenizer = None
    if (folder / ckpt.TOKENIZER).is_file():
        tokenizer = attnlab_tokenizer(folder / ckpt.TOKENIZER)
        ckpt.check_tokenizer_fits(tokenizer, config, folder / ckpt.TOKENIZER)
    return config, sd, tokenizer
