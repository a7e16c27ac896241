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
from attnlab.train import checkpoint as ckpt
from attnlab.train.hf_folder import read_hf_folder

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
# config.json key listing the tokens an export added embedding rows for (token -> id)
ADDED_KEY = "attnlab_added_tokens"
# nanoGPT's sample.py defaults; `attnlab sample` uses the same temperature
SAMPLING = {"do_sample": True, "temperature": 0.8, "top_k": 200}
AUTO_MAP = {
    "AutoConfig": "configuration_attnlab.AttnlabConfig",
    "AutoModelForCausalLM": "modeling_attnlab.AttnlabForCausalLM",
    "AutoModelForSequenceClassification": "modeling_attnlab.AttnlabForSequenceClassification",
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


# the document separator a pretraining export gets as its end, start and padding token
EOT = END_TOKENS[-1]
# what transformers 4.x would add to every encoding: GPT-2 embeds token_type_ids as positions
MODEL_INPUT_NAMES = ["input_ids", "attention_mask"]


@dataclasses.dataclass
class ShippedTokenizer:
    """The tokenizer an export writes: the model's, completed with the tokens HF tools need."""

    hf: tokenizers.Tokenizer
    kind: str  # attnlab's tokenizer kind: char, bpe or bytebpe
    roles: dict[str, str]  # bos_token / eos_token / pad_token (/ unk_token) -> token
    added: dict[str, int]  # tokens that got a new, zero-initialised embedding row -> id
    rows: int  # the exported model's vocab_size (the original's plus the added rows)


def shipped_tokenizer(tokenizer: Tokenizer, vocab_size: int) -> ShippedTokenizer:
    """``tokenizer`` with real bos, eos, pad (and, where text can be unknown, unk) tokens.

    The end token is the one the model was trained on (END_TOKENS); a pretraining tokenizer has
    none and gets ``<|endoftext|>`` as eos, bos (lm-eval's prefix token) and pad. Char and bpe
    tokenizers get ``<unk>`` (byte-level BPE encodes any text). A token the tokenizer lacks takes
    the model's first spare id, or else a new id past the model's rows, which the export fills
    with zeros (``rows``): the logits of every other token are unchanged.
    """
    data = json.loads(tokenizer.hf.to_str())
    present = {t["content"] for t in data["added_tokens"]}
    eos = next((t for t in END_TOKENS if t in present), EOT)
    roles = {"bos_token": IM_START if IM_START in present else eos, "eos_token": eos}
    roles["pad_token"] = eos
    if tokenizer.kind != "bytebpe":
        roles["unk_token"] = UNK
    missing = [t for t in dict.fromkeys(roles.values()) if t not in present]
    new = {t: tokenizer.vocab_size + i for i, t in enumerate(missing)}
    for token, i in new.items():
        data["added_tokens"].append(
            {
                "id": i,
                "content": token,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
        )
    if tokenizer.kind == "char":
        # WordLevel needs its unknown token in the vocabulary, and tokenizers renumbers added
        # tokens missing from it once it holds one: every special token goes in with its id
        data["model"]["vocab"].update({t["content"]: t["id"] for t in data["added_tokens"]})
        data["model"]["unk_token"] = UNK
    hf = tokenizers.Tokenizer.from_str(json.dumps(data))
    wrong = [t for t, i in new.items() if hf.token_to_id(t) != i]
    if wrong:  # a tokenizers version that numbers added tokens its own way
        raise AttnlabError(f"tokenizers renumbered the export's {', '.join(wrong)}")
    added = {t: i for t, i in new.items() if i >= vocab_size}
    rows = max(vocab_size, tokenizer.vocab_size + len(new))
    return ShippedTokenizer(hf, tokenizer.kind, roles, added, rows)


# SentencePiece's space, which onnxruntime-extensions' non-byte-level tokenizer reads
SPM_SPACE = "\u2581"


def genai_reads_own(tokenizer: ShippedTokenizer) -> bool:
    """Whether onnxruntime-genai's tokenizer reads the export's tokenizer.json as it is: only
    byte-level BPE (it would read bpe's ``##`` pieces and a char vocabulary, silently wrong)."""
    return tokenizer.kind == "bytebpe"


def genai_tokenizer(tokenizer: ShippedTokenizer) -> str | None:
    """tokenizer.json for onnxruntime-genai where its tokenizer (onnxruntime-extensions) cannot
    read the export's own; None where it reads that one (``genai_reads_own``) or none would do.

    A char tokenizer is written as a merge-free SentencePiece-style BPE, the form in which
    onnxruntime-extensions reads one character at a time without byte-level renaming: the
    space is ``▁``, a no-op pre-tokenizer, and every byte a character outside the vocabulary
    falls back to is ``<unk>`` (one per UTF-8 byte, where transformers gives one per character).
    """
    if tokenizer.kind != "char":  # byte-level BPE it reads as it is, bpe's WordPiece never
        return None
    data = json.loads(tokenizer.hf.to_str())
    vocab = data["model"]["vocab"]
    if SPM_SPACE in vocab:  # the character would read as a space
        return None
    unk = vocab[UNK]
    vocab = {SPM_SPACE if token == " " else token: i for token, i in vocab.items()}
    vocab.update({f"<0x{b:02X}>": unk for b in range(256)})
    data.update(
        normalizer=None,
        # a Split on a string no text holds: onnxruntime-extensions then reads character by
        # character (a regex Split runs through std::regex, byte by byte)
        pre_tokenizer={"type": "Split", "pattern": {"String": "\u0000"}, "behavior": "Isolated"},
        decoder={
            "type": "Sequence",
            "decoders": [{"type": "Replace", "pattern": {"String": SPM_SPACE}, "content": " "}],
        },
        model={"type": "BPE", "vocab": vocab, "merges": [], "unk_token": UNK},
    )
    return json.dumps(data, ensure_ascii=False, indent=2)


def added_token_ids(folder: Path) -> list[int]:
    """The ids an export gave new zero rows (config.json's ADDED_KEY) in the model folder
    ``folder``: tokens the model never trained, which no sampler draws."""
    path = folder / ckpt.CONFIG
    data = json.loads(path.read_text()) if path.is_file() else {}
    return sorted(data.get(ADDED_KEY, {}).values())


@dataclasses.dataclass(frozen=True)
class Metadata:
    """What write_metadata wrote that other files of the export derive from."""

    kind: str | None  # the native architecture ("gpt2", "llama"), None: attnlab's remote code
    generation: dict[str, Any]  # generation_config.json
    tokenizer_config: dict[str, Any] | None  # tokenizer_config.json (None: no tokenizer)


def write_metadata(
    folder: Path, config: ModelConfig, tokenizer: ShippedTokenizer | None
) -> Metadata:
    """config.json (+ remote code), generation_config.json and the tokenizer files HF reads.

    ``config`` already has ``tokenizer.rows`` rows.
    """
    roles = tokenizer.roles if tokenizer is not None else {}
    hf = tokenizer.hf if tokenizer is not None else None
    # GPT-2's and Llama's configs default to ids of their own vocabularies: always say none
    ids = {f"{role}_token_id": None for role in ("bos", "eos", "pad")}
    ids.update(
        {f"{role[:-6]}_token_id": hf.token_to_id(t) for role, t in roles.items() if hf is not None}
    )
    ids.pop("unk_token_id", None)
    data, kind = hf_config(config, ids)
    if tokenizer is not None and tokenizer.added:
        data[ADDED_KEY] = tokenizer.added
    (folder / ckpt.CONFIG).write_text(json.dumps(data, indent=2))
    if kind is None:
        for name, text in remote_code().items():
            (folder / name).write_text(text)
    # no max_length: transformers warns on every generate(max_new_tokens=...) when the model's
    # generation config sets one (the context limit is config.json's, and the tokenizer's)
    generation = {k: v for k, v in ids.items() if v is not None} | SAMPLING
    if tokenizer is not None and tokenizer.added:
        # rows the model never trained: sampling from the rest is `attnlab sample`'s distribution
        generation["suppress_tokens"] = sorted(tokenizer.added.values())
    (folder / GENERATION_CONFIG).write_text(json.dumps(generation, indent=2))
    if hf is None:
        return Metadata(kind, generation, None)
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
        "model_input_names": MODEL_INPUT_NAMES,
        # batched generation needs the prompts' ends aligned; transformers 4.x pipelines pad on
        # the tokenizer's side (5.x pads left itself); the models read positions off the mask
        "padding_side": "left",
        "clean_up_tokenization_spaces": False,
        "added_tokens_decoder": added,
        **roles,
    }
    if {IM_START, IM_END} <= {t.content for t in hf.get_added_tokens_decoder().values()}:
        tokenizer_config["chat_template"] = CHAT_TEMPLATE
    (folder / TOKENIZER_CONFIG).write_text(json.dumps(tokenizer_config, indent=2))
    (folder / SPECIAL_TOKENS_MAP).write_text(json.dumps(roles, indent=2))
    return Metadata(kind, generation, tokenizer_config)


# --- import ----------------------------------------------------------------------------------


# the decoder each attnlab tokenizer kind has: another (Llama's Metaspace...) would decode wrongly
def import_hf(
    source: str | Path, out: str | Path, overwrite: bool = False
) -> tuple[Any, Path, str | None]:
    """A local HF folder (see ``read_hf_folder``) as an attnlab model folder.

    Returns (model, out, tokenizer kind or None).
    """
    folder, out = Path(source).expanduser(), Path(out).expanduser()
    ckpt.refuse_run_checkpoint(out)
    config, sd, tokenizer = read_hf_folder(folder)
    model = ckpt.model_with_weights(config, sd, str(folder), "cpu")
    with replace_folder(
        out,
        "model folder written by import-hf",
        overwrite,
        ckpt.is_model_folder,
        sources=[folder],
        describe=ckpt.weights_record,
    ) as tmp:
        ckpt.write_model_folder(tmp, model, tokenizer)
    return model, out, None if tokenizer is None else tokenizer.kind
