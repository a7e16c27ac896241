"""`attnlab train --init-from FOLDER`: a new run that starts from a model folder's weights.

FOLDER is a run folder (its best/, else latest/), an attnlab model folder or export, an
``import-hf`` folder, or a Hugging Face folder: GPT-2, Llama, or an attnlab export trained
further by transformers (its ``save_pretrained`` output, sharded or not). The run trains that
model, whatever the preset says (only dropout, and block_size with rotary positions, may
change), on data whose tokens the folder's tokenizer spells with the same ids, and its
checkpoints carry the folder's tokenizer (with the tokens the data lacks, e.g. ChatML's).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from attnlab.config import ModelConfig
from attnlab.data.prepare import load_dataset
from attnlab.data.tokenizer import Tokenizer
from attnlab.errors import AttnlabError
from attnlab.train import checkpoint as ckpt
from attnlab.train.hf_folder import read_hf_folder
from attnlab.train.sft import check_model_overrides
from attnlab.train.spec import RunSpec, data_folder


@dataclasses.dataclass
class InitFrom:
    """What a run started from a folder takes from it."""

    folder: Path
    config: ModelConfig
    weights: dict[str, torch.Tensor]  # in attnlab's names
    tokenizer: Tokenizer | None


def read_source(source: str | Path) -> InitFrom:
    """The model in ``source``: an HF folder's (config.json with a model_type) or attnlab's."""
    path = Path(source).expanduser()
    if not path.exists():
        raise AttnlabError(f"--init-from {source}: it does not exist")
    if ckpt.model_type(path) is not None:  # an export, or a folder transformers saved
        config, weights, tokenizer = read_hf_folder(path)
        return InitFrom(path, config, weights, tokenizer)
    folder = ckpt.model_folder(path)
    config = ckpt.read_model_config(folder)
    tokenizer = Tokenizer.load(folder) if (folder / ckpt.TOKENIZER).is_file() else None
    ckpt.check_tokenizer_fits(tokenizer, config, folder / ckpt.TOKENIZER)
    return InitFrom(folder, config, ckpt.read_model_weights(folder, config), tokenizer)


def init_spec(
    spec: RunSpec, source: str | Path, model_overrides: dict[str, Any]
) -> tuple[RunSpec, InitFrom]:
    """``spec`` with the model of ``source`` (``model_overrides`` may change only dropout, and
    block_size with RoPE), once its data is known to mean the same tokens to that model."""
    start = read_source(source)
    check_model_overrides(start.config, model_overrides, "train --init-from")
    model = start.config.replace(**model_overrides)
    load_dataset(data_folder(spec)).check_model(start.folder, model.vocab_size, start.tokenizer)
    return dataclasses.replace(spec, model=model, vocab_from_data=False), start
