"""What transformers reads in an export: config.json, remote code, tokenizer and chat template.

A model that is exactly GPT-2 or Llama (attnlab.model.hf_map) is written in that architecture's
names, so ``AutoModelForCausalLM`` loads it with no remote code. Any other model (any mechanism)
gets ``model_type="attnlab"`` with ``auto_map`` pointing at two files written beside it:
``configuration_attnlab.py`` and ``modeling_attnlab.py`` (the templates in ``remote/``), into
which the export writes the ModelConfig fields and the source of attnlab's model code, so the
folder loads with ``trust_remote_code=True`` where attnlab is not installed.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import tokenizers

import attnlab
from attnlab.config import ModelConfig
from attnlab.data.chat import IM_END, IM_START
from attnlab.data.tokenizer import END_TOKENS, UNK, Tokenizer
from attnlab.errors import AttnlabError
from attnlab.fsutil import replace_folder
from attnlab.model import hf_map
from attnlab.model.memory import check_fits
from attnlab.train import checkpoint as ckpt

PACKAGE_DIR = Path(attnlab.__file__).parent
REMOTE_DIR = Path(__file__).with_name("remote")
CONFIGURATION, MODELING = "configuration_attnlab.py", "modeling_attnlab.py"
GENERATION_CONFIG = "generation_config.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
SPECIAL_TOKENS_MAP = "special_tokens_map.json"
# every file write_metadata may write
METADATA_FILES = (
    ckpt.CONFIG,
    ckpt.TOKENIZER,
    GENERATION_CONFIG,
    TOKENIZER_CONFIG,
    SPECIAL_TOKENS_MAP,
    CONFIGURATION,
    MODELING,
)
# config.json key naming the attnlab version that exported the folder
EXPORT_MARK = "attnlab_version"
# nanoGPT's sample.py defaults; `attnlab sample` uses the same temperature
SAMPLING = {"do_sample": True, "temperature": 0.8, "top_k": 200}
AUTO_MAP = {
    "AutoConfig": "configuration_attnlab.AttnlabConfig",
    "AutoModelForCausalLM": "modeling_attnlab.AttnlabForCausalLM",
}
# the model code the remote files embed: the backbone and what it imports from attnlab
EMBEDDED_ROOTS = ("config.py", "model/**/*.py")
_ATTNLAB_IMPORT = re.compile(r"^\s*from attnlab\.([\w.]+) import", re.MULTILINE)
FIELDS_LINE = "FIELDS: dict = {}"
SOURCES_LINE = "SOURCES: dict = {}"
# ChatML exactly as attnlab.data.chat.format_chatml writes it
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def embedded_sources() -> dict[str, str]:
    """Path under attnlab/ -> source of the backbone's modules and every attnlab module they import."""
    todo = sorted({p for pattern in EMBEDDED_ROOTS for p in PACKAGE_DIR.glob(pattern)})
    todo = [p for p in todo if p.name != "hf_map.py"]  # conversions for attnlab's loader
    sources: dict[str, str] = {}
    while todo:
        path = todo.pop()
        name = path.relative_to(PACKAGE_DIR).as_posix()
        if name in sources:
            continue
        sources[name] = path.read_text()
        for module in _ATTNLAB_IMPORT.findall(sources[name]):
            base = PACKAGE_DIR / module.replace(".", "/")
            todo += [p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()]
    return dict(sorted(sources.items()))


def remote_code() -> dict[str, str]:
    """File name -> text of the configuration and modeling files (torch + transformers only)."""
    defaults = {f.name: f.default for f in dataclasses.fields(ModelConfig)}
    configuration = (REMOTE_DIR / CONFIGURATION).read_text()
    modeling = (REMOTE_DIR / MODELING).read_text()
    sources = ",\n".join(f"    {path!r}: {src!r}" for path, src in embedded_sources().items())
    return {
        CONFIGURATION: configuration.replace(FIELDS_LINE, f"FIELDS: dict = {defaults!r}"),
        MODELING: modeling.replace(SOURCES_LINE, f"SOURCES: dict = {{\n{sources},\n}}"),
    }


def hf_config(config: ModelConfig, token_ids: dict[str, int]) -> tuple[dict[str, Any], str | None]:
    """(config.json, native kind or None) for ``config`` with the tokenizer's special ids."""
    kind = hf_map.native_kind(config)
    data = hf_map.config_to_hf(config, kind)
    if kind is None:
        data.update(architectures=["AttnlabForCausalLM"], auto_map=AUTO_MAP)
    data.update(token_ids, torch_dtype="float32")
    data[EXPORT_MARK] = attnlab.__version__
    return data, kind


# --- tokenizer -------------------------------------------------------------------------------


def special_tokens(tokenizer: Tokenizer) -> dict[str, str]:
    """HF roles of the tokenizer's special tokens: ChatML's end marker is the EOS (and pad)."""
    roles = {"bos_token": (IM_START,), "eos_token": END_TOKENS, "unk_token": (UNK,)}
    specials = {t.content for t in tokenizer.hf.get_added_tokens_decoder().values()}
    found = {role: next((t for t in names if t in specials), None) for role, names in roles.items()}
    if found["eos_token"] is not None:
        found["pad_token"] = found["eos_token"]
    return {role: token for role, token in found.items() if token is not None}


def with_unknown_token(tokenizer: Tokenizer, vocab_size: int) -> tuple[tokenizers.Tokenizer, str]:
    """A char tokenizer's ``tokenizers`` copy that maps unseen characters to a token, and it.

    ``<unk>`` takes the first id the model has beyond the tokenizer's; a model with no spare id
    maps unseen characters to its end-of-text token, or failing that to the space (or first)
    character. attnlab's own encoder still refuses unknown characters.
    """
    data = json.loads(tokenizer.hf.to_str())
    vocab = data["model"]["vocab"]
    # tokenizers renumbers added tokens missing from the model's vocabulary once it holds one
    # more entry, so every special token goes in with its id
    vocab.update({t["content"]: t["id"] for t in data["added_tokens"]})
    roles = special_tokens(tokenizer)
    if tokenizer.vocab_size < vocab_size:
        unk = UNK
        vocab[unk] = tokenizer.vocab_size
        data["added_tokens"].append(
            {
                "id": tokenizer.vocab_size,
                "content": UNK,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
        )
    elif "eos_token" in roles:
        unk = roles["eos_token"]
    else:
        unk = " " if " " in vocab else min(vocab, key=vocab.get)
    data["model"]["unk_token"] = unk
    return tokenizers.Tokenizer.from_str(json.dumps(data)), unk


def write_metadata(folder: Path, config: ModelConfig, tokenizer: Tokenizer | None) -> str | None:
    """config.json (+ remote code), generation_config.json and the tokenizer files HF reads.

    Returns the native kind ("gpt2", "llama") or None (attnlab's own, with remote code).
    """
    roles = special_tokens(tokenizer) if tokenizer is not None else {}
    hf = tokenizer.hf if tokenizer is not None else None
    if tokenizer is not None and tokenizer.kind == "char":
        hf, roles["unk_token"] = with_unknown_token(tokenizer, config.vocab_size)
    ids = {f"{role[:-6]}_token_id": hf.token_to_id(tok) for role, tok in roles.items()}
    ids.pop("unk_token_id", None)
    data, kind = hf_config(config, ids)
    (folder / ckpt.CONFIG).write_text(json.dumps(data, indent=2))
    if kind is None:
        for name, text in remote_code().items():
            (folder / name).write_text(text)
    # no max_length: transformers warns on every generate(max_new_tokens=...) when the model's
    # generation config sets one (the context limit is config.json's, and the tokenizer's)
    generation = {**ids, **SAMPLING}
    (folder / GENERATION_CONFIG).write_text(json.dumps(generation, indent=2))
    if hf is None:
        return kind
    hf.save(str(folder / ckpt.TOKENIZER))
    added = {
        str(i): {
            "content": t.content,
            "lstrip": t.lstrip,
            "normalized": t.normalized,
            "rstrip": t.rstrip,
            "single_word": t.single_word,
            "special": t.special,
        }
        for i, t in sorted(hf.get_added_tokens_decoder().items())
    }
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": config.block_size,
        "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": added,
        **roles,
    }
    if {IM_START, IM_END} <= {t.content for t in hf.get_added_tokens_decoder().values()}:
        tokenizer_config["chat_template"] = CHAT_TEMPLATE
    (folder / TOKENIZER_CONFIG).write_text(json.dumps(tokenizer_config, indent=2))
    (folder / SPECIAL_TOKENS_MAP).write_text(json.dumps(roles, indent=2))
    return kind


# --- import ----------------------------------------------------------------------------------


# the decoder each attnlab tokenizer kind has: another (Llama's Metaspace...) would decode wrongly
TOKENIZER_DECODERS = {"char": "Fuse", "bpe": "WordPiece", "bytebpe": "ByteLevel"}


def attnlab_tokenizer(path: Path) -> Tokenizer | None:
    """``tokenizer.json`` as attnlab's Tokenizer, or None when it is not one of attnlab's kinds."""
    try:
        tokenizer = Tokenizer.load(path)
    except AttnlabError:
        return None
    decoder = type(tokenizer.hf.decoder).__name__
    return tokenizer if TOKENIZER_DECODERS[tokenizer.kind] == decoder else None


def import_hf(
    source: str | Path, out: str | Path, overwrite: bool = False
) -> tuple[Any, Path, str | None]:
    """A local GPT-2 or Llama folder (config.json + safetensors or bin) as an attnlab model folder.

    Returns (model, out, tokenizer kind or None). Weights load through safetensors or the
    weights-only unpickler; ``tokenizer.json`` comes along when it is one of attnlab's kinds
    (GPT-2's byte-level BPE is).
    """
    folder, out = Path(source).expanduser(), Path(out).expanduser()
    ckpt.refuse_run_checkpoint(out)
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
    if kind not in hf_map.KINDS:
        raise AttnlabError(f"{path}: model_type {kind!r}; import-hf reads gpt2 and llama folders")
    config = hf_map.config_from_hf(data, str(path))
    check_fits(config, "cpu", what=str(folder))
    sd = hf_map.state_dict_from_hf(ckpt.read_weights(folder), config, kind, str(path))
    model = ckpt.model_with_weights(config, sd, str(folder), "cpu")
    tokenizer = None
    if (folder / ckpt.TOKENIZER).is_file():
        tokenizer = attnlab_tokenizer(folder / ckpt.TOKENIZER)
        ckpt.check_tokenizer_fits(tokenizer, config, folder / ckpt.TOKENIZER)
    with replace_folder(
        out, "model folder written by import-hf", overwrite, ckpt.is_model_folder, sources=[folder]
    ) as tmp:
        ckpt.write_model_folder(tmp, model, tokenizer)
    return model, out, None if tokenizer is None else tokenizer.kind
