"""Supervised fine-tuning: start a normal run from a pretrained model, train on responses only.

``start`` turns a model or run folder plus JSONL records into a new run folder: the tokenizer
gains ``<|im_start|>`` / ``<|im_end|>`` (the embedding grows, new rows drawn from N(0, 0.02),
tying kept), the records are split and written into ``RUN/sft_data`` (a prepared data folder
whose tokenizer is the extended one, plus the records themselves), and the Trainer gets an
``ExampleSampler`` instead of random windows. Checkpoints, metrics and ``--resume`` are those of
any run; ``resume`` rebuilds the sampler from ``sft_data``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from attnlab.config import ModelConfig, TrainConfig, split_overrides
from attnlab.data.bins import SeededSampler
from attnlab.data.chat import (
    SHIPPED,
    SPECIAL_TOKENS,
    encode_record,
    framing_tokens,
    load_jsonl,
    response_texts,
    targets,
)
from attnlab.data.prepare import TOKENIZER_FILE, write_meta
from attnlab.data.token_files import write_tokens
from attnlab.data.tokenizer import Tokenizer
from attnlab.device import resolve_device
from attnlab.errors import AttnlabError
from attnlab.fsutil import check_out_path, check_writable, write_json
from attnlab.rundir import BEST, LATEST, SFT_FILE, RunDir, RunLock
from attnlab.train import checkpoint as ckpt
from attnlab.train import distributed
from attnlab.train.spec import with_scaled_schedule
from attnlab.train.trainer import Trainer

logger = logging.getLogger(__name__)

VAL_EVERY = 20  # every 20th record is held out for validation
# fine-tuning recipe on top of the source run's (device, batch size, dtype... carry over)
DEFAULTS: dict[str, Any] = dict(
    max_iters=300,
    learning_rate=1e-4,
    min_lr=1e-5,
    warmup_iters=20,
    lr_decay_iters=None,  # max_iters: not the pretraining run's decay
    eval_interval=100,
    eval_iters=10,
    log_interval=10,
    ckpt_interval=None,
    max_seconds=None,
)

Example = tuple[list[int], list[int]]  # (inputs, targets with -1 where not trained)
PAD_MULTIPLE = 8


class ExampleSampler(SeededSampler):
    """Random whole examples, each batch padded by pad_batch.

    Seeding, the global batch split across ranks and ``state_dict`` are BatchSampler's (both are
    SeededSamplers), so the Trainer, its checkpoints and resume work unchanged.
    """

    def __init__(
        self,
        examples: list[Example],
        block_size: int,
        batch_size: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        device: str | torch.device = "cpu",
    ) -> None:
        if not examples:
            raise AttnlabError("no training examples")
        super().__init__(batch_size, seed, rank, world_size, device)
        self.examples, self.block_size = examples, block_size

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        picks = self._draw(len(self.examples)).tolist()
        return pad_batch([self.examples[i] for i in picks], self.block_size, self.device)

    def _identity(self) -> dict[str, int]:
        return {
            **super()._identity(),
            "block_size": self.block_size,
            "examples": len(self.examples),
        }


def pad_batch(
    examples: list[Example], block_size: int, device: str | torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs padded with 0 and targets with -1 (ignored), to the batch's longest example.

    Not to block_size: instruction pairs are mostly far shorter than the context, and causal
    attention makes the padding after an example irrelevant to it, so the loss is the same and
    the compute is what the examples need. Lengths are rounded up to a multiple of 8 (at most
    block_size) so that kernels see aligned shapes and a compiled model few distinct ones.
    """
    longest = max(len(inp) for inp, _ in examples)
    width = min(block_size, -(-longest // PAD_MULTIPLE) * PAD_MULTIPLE)
    x = torch.zeros(len(examples), width, dtype=torch.long)
    y = torch.full((len(examples), width), -1, dtype=torch.long)
    for row, (inp, tgt) in enumerate(examples):
        x[row, : len(inp)] = torch.tensor(inp)
        y[row, : len(tgt)] = torch.tensor(tgt)
    return x.to(device), y.to(device)


def encode_examples(
    records: list[dict[str, Any]], tokenizer: Tokenizer, chat: bool, block_size: int
) -> tuple[list[Example], list[int], dict[str, int], int]:
    """(inputs, targets) of each usable record, its last block_size + 1 tokens, their indices,
    drop counts, and how many of those kept were longer than that (cut)."""
    examples: list[Example] = []
    kept: list[int] = []
    dropped = {"unencodable": 0, "no trained token": 0, "prompt cut away": 0}
    cut = 0
    for i, record in enumerate(records):
        try:
            ids, mask = encode_record(tokenizer, record, chat)
        except AttnlabError:  # e.g. a character outside a char-level vocabulary
            dropped["unencodable"] += 1
            continue
        longer = len(ids) > block_size + 1
        # keep the end: that is where the response (or the latest assistant turn) is
        ids, mask = ids[-(block_size + 1) :], mask[-(block_size + 1) :]
        if longer and mask[0]:  # it starts inside a response: a reply to no prompt at all
            dropped["prompt cut away"] += 1
            continue
        cut += longer
        tgt = targets(ids, mask)
        if all(t == -1 for t in tgt):
            dropped["no trained token"] += 1
            continue
        examples.append((ids[:-1], tgt))
        kept.append(i)
    return examples, kept, dropped, cut


def resize_embeddings(
    sd: dict[str, torch.Tensor], vocab_size: int, seed: int
) -> dict[str, torch.Tensor]:
    """Grow the token embedding (and an untied lm_head) to vocab_size rows; new rows ~ N(0, 0.02)."""
    sd = dict(sd)
    gen = torch.Generator().manual_seed(seed)
    for key in ("transformer.wte.weight", "lm_head.weight"):
        if key in sd and sd[key].size(0) < vocab_size:
            old = sd[key]
            new = torch.randn(vocab_size - old.size(0), old.size(1), generator=gen) * 0.02
            sd[key] = torch.cat([old, new.to(old.dtype)])
    return sd


def _write_data(
    folder: Path,
    records: list[dict[str, Any]],
    tokenizer: Tokenizer,
    chat: bool,
    block_size: int,
    source: str,
) -> dict[str, int]:
    """The run's SFT data folder: a loadable prepared folder plus the records it was made of;
    returns how many records were dropped, and why, and how many kept were cut to the context."""
    if not any(text.strip() for record in records for text in response_texts(record)):
        raise AttnlabError(
            f"{source}: every response is empty, so the model would learn only to end at once; "
            "give records with responses"
        )
    _, indices, dropped, cut = encode_examples(records, tokenizer, chat, block_size)
    kept = [records[i] for i in indices]
    if len(kept) < 2:
        raise AttnlabError(
            f"{source}: {len(kept)} usable record(s) (need 2: train and validation); "
            f"dropped {dropped_text(dropped)}"
        )
    splits = {"val": kept[VAL_EVERY - 1 :: VAL_EVERY] or kept[-1:]}
    held = {id(r) for r in splits["val"]}
    splits["train"] = [r for r in kept if id(r) not in held]
    folder.mkdir(parents=True, exist_ok=True)
    meta: dict[str, Any] = {"vocab_size": tokenizer.vocab_size, "tokenizer": tokenizer.kind}
    largest = 0
    for split, recs in splits.items():
        (folder / f"{split}.jsonl").write_text(
            "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs)
        )
        ids = [t for r in recs for t in encode_record(tokenizer, r, chat)[0]]
        meta["dtype"] = write_tokens(folder / f"{split}.bin", ids, tokenizer.vocab_size)
        meta[f"{split}_tokens"] = len(ids)
        largest = max(largest, *ids)
    meta["provenance"] = {
        "sft_source": source,
        "records": {k: len(v) for k, v in splits.items()},
        "dropped": dropped,
        "cut": cut,
        "split": f"every {VAL_EVERY}th record is validation",
    }
    meta["max_token_id"] = largest
    tokenizer.save(folder / TOKENIZER_FILE)
    write_json(folder / SFT_FILE, {"chat": chat, "source": source})
    write_meta(folder, meta)
    return dropped, cut


def check_model_overrides(
    base: ModelConfig, overrides: dict[str, Any], command: str = "sft"
) -> None:
    """Refuse model overrides that change what the pretrained weights compute, naming them.

    SFT (and ``train --init-from``, say ``command``) trains the model it was given. A field that
    reshapes a weight failed the strict load with internal key names; one that keeps the shapes
    (n_head, norm, rope_theta, ...) would silently give the weights another meaning. Only dropout
    may change, and block_size where positions are rotary (a learned position table has one row
    per position).
    """
    asked = base.replace(**overrides)  # an invalid value gets the config's own message
    changed = [k for k in overrides if getattr(asked, k) != getattr(base, k)]
    fixed = [
        k for k in changed if k != "dropout" and not (k == "block_size" and base.pos == "rope")
    ]
    if fixed:
        fields = ", ".join(
            f"{k}={getattr(asked, k)!r} (pretrained: {getattr(base, k)!r})" for k in fixed
        )
        raise AttnlabError(
            f"{command} keeps the pretrained model as it is: {fields}; only dropout (and block_size "
            "with pos=rope) may change"
        )


def sft_batches(trainer: Trainer) -> tuple[ExampleSampler, list[tuple[torch.Tensor, torch.Tensor]]]:
    """The Trainer's ``batches`` hook: examples from the run's sft_data folder."""
    folder = trainer.data.dir
    if not (folder / SFT_FILE).is_file():
        raise AttnlabError(
            f"{trainer.run_dir} is not an SFT run (its data folder has no {SFT_FILE})"
        )
    chat = json.loads((folder / SFT_FILE).read_text())["chat"]
    block, cfg, dist = trainer.model_config.block_size, trainer.cfg, trainer.dist
    tok = trainer.data.tokenizer
    train = encode_examples(load_jsonl(folder / "train.jsonl"), tok, chat, block)[0]
    val = encode_examples(load_jsonl(folder / "val.jsonl"), tok, chat, block)[0]
    val = val[: cfg.batch_size * cfg.eval_iters]
    sampler = ExampleSampler(
        train, block, cfg.batch_size, cfg.seed, dist.rank, dist.world_size, trainer.device
    )
    val_batches = [
        pad_batch(val[i : i + cfg.batch_size], block, trainer.device)
        for i in range(0, len(val), cfg.batch_size)
    ]
    return sampler, val_batches


def dropped_text(dropped: dict[str, int]) -> str:
    """``3 records (2 unencodable, 1 with no trained token)``: the reasons that dropped any."""
    reasons = {"unencodable": "unencodable", "no trained token": "with no trained token",
               "prompt cut away": "whose prompt the context cut away"}  # fmt: skip
    parts = [f"{n} {reasons[why]}" for why, n in dropped.items() if n]
    total = sum(dropped.values())
    return f"{total} record{'s' if total != 1 else ''} ({', '.join(parts) or 'none'})"


def check_chat_context(tokenizer: Tokenizer, config: ModelConfig, resizable: bool) -> None:
    """Refuse a chat SFT whose context cannot hold one ChatML turn (the markers, one token of
    the message, one of the reply): `attnlab chat` would refuse the model it trains."""
    need = framing_tokens(tokenizer, []) + 2
    if config.block_size < need:
        fix = (
            f"pass block_size={need} or more"
            if resizable  # rotary positions: the context may grow (check_model_overrides)
            else f"start from a model with a context of {need} tokens or more"
        )
        raise AttnlabError(
            f"sft --chat: a context of {config.block_size} tokens cannot hold a ChatML turn "
            f"(the markers, a message and a reply need {need}); {fix}"
        )


def start(
    source: str | Path,
    out: str | Path,
    data: str | Path | None = None,
    chat: bool = False,
    overrides: list[str] | None = None,
    quiet: bool = False,
) -> Trainer:
    """A new SFT run in ``out`` from the model or run folder ``source``."""
    folder = ckpt.model_folder(source)
    run = RunDir(Path(out).expanduser().resolve())
    if ckpt.checkpoint_dir(run.latest) is not None:
        raise AttnlabError(f"{run.path} already holds a run; use --resume or another --out")
    if check_out_path(run.path) and run.is_foreign():  # nothing of someone else's
        raise AttnlabError(f"{out} is not empty and is not a run folder; choose another --out")
    check_writable(run.path)  # a read-only --out: one line, not a traceback mid-write
    if not (folder / ckpt.TOKENIZER).is_file():
        raise AttnlabError(f"{folder} has no {ckpt.TOKENIZER}; SFT needs the model's tokenizer")
    tokenizer = Tokenizer.load(folder / ckpt.TOKENIZER)
    tokenizer.add_special_tokens(SPECIAL_TOKENS)
    model_over, train_over = split_overrides(overrides or [])
    base = ckpt.read_model_config(folder)
    check_model_overrides(base, model_over)
    model_config = base.replace(
        **{**model_over, "vocab_size": max(base.vocab_size, tokenizer.vocab_size)}
    )
    if chat:
        check_chat_context(tokenizer, model_config, base.pos == "rope")
    recipe = ckpt.read_train_config(folder)
    train_config = TrainConfig.from_dict(with_scaled_schedule({**recipe, **DEFAULTS}, train_over))
    resolve_device(train_config.device)  # refused before anything is written
    if train_config.eval_batches != "fixed":  # its validation examples are a set, not a stream
        raise AttnlabError(
            "eval_batches='fresh' draws new windows of a token stream; SFT scores its held-out "
            "examples, the same ones each evaluation: leave eval_batches out"
        )
    data_path = Path(data) if data else SHIPPED["chat" if chat else "instruct"]
    records = load_jsonl(data_path)
    # the trainer's own checks (the weights fit the model, the model fits the device...) read
    # the data written first: a refusal among them takes back what was written
    with _claimed(run) as lock:
        dropped, cut = _write_data(
            run.sft_data, records, tokenizer, chat, model_config.block_size, str(data_path)
        )
        weights = resize_embeddings(
            ckpt.read_model_weights(folder, base), model_config.vocab_size, train_config.seed
        )
        trainer = Trainer.start(
            run.path,
            model_config,
            train_config,
            run.sft_data,
            vocab_from_data=False,
            quiet=quiet,
            batches=sft_batches,
            init_weights=weights,
            lock=lock,
        )
    # once it started: a refused start prints its one line alone
    if any(dropped.values()):
        logger.warning(f"attnlab sft: dropped {dropped_text(dropped)}")
    if cut:
        block = model_config.block_size
        logger.warning(
            f"attnlab sft: {cut} record(s) longer than the context (block_size={block}) are "
            f"trained on their last {block + 1} tokens",
        )
    return trainer


@contextlib.contextmanager
def _claimed(run: RunDir) -> Iterator[RunLock | None]:
    """Create the run folder and take its lock (on the main process) before anything is written
    there, and yield the lock for the trainer to keep.

    On any exception the outermost folder this start created (the run folder and the parents it
    needed, or only sft_data/ in a run folder that was there) is removed, and only while this
    start holds the lock: a start that lost the race for the folder to another one leaves that
    run alone (it removed the running run's folder). A folder that was there stays, whatever it
    holds: it is not this command's to delete.
    """
    created = None
    for folder in [*reversed(run.path.parents), run.path, run.sft_data]:
        try:
            folder.mkdir()  # atomic: exactly one of two racing starts creates a folder
        except FileExistsError:
            continue
        created = created or folder
    lock = run.lock() if distributed.launched_as_main() else None  # torchrun: rank 0 locks
    new_lock_file = lock is not None and not lock.path.exists()
    try:
        if lock is not None:
            lock.acquire()
        yield lock
    except BaseException:  # Ctrl-C during the start too
        if lock is not None and lock.held:
            if created is not None:
                shutil.rmtree(created, ignore_errors=True)
            if new_lock_file:  # a folder that was there is left as it was found
                lock.path.unlink(missing_ok=True)
        if lock is not None:
            lock.release()
        raise


def tuned_on_chatml(path: str | Path) -> bool | None:
    """Whether the fine-tuning run at ``path`` (or whose latest/ or best/ it is) was trained on
    ChatML (``--chat``, or records that are conversations); None where ``path`` is not such a
    run (a pretrained model, an export: there the tokenizer alone tells)."""
    path = Path(path).expanduser()
    run = RunDir(path.parent if path.name in (LATEST, BEST) else path)
    if not run.is_sft():
        return None
    try:
        chat = json.loads((run.sft_data / SFT_FILE).read_text()).get("chat")
    except (OSError, ValueError, AttributeError):  # damaged: nothing to tell from it
        return None
    return bool(chat) or any("messages" in r for r in load_jsonl(run.sft_data / "train.jsonl"))


def resume(run: str | Path, overrides: list[str] | None = None, quiet: bool = False) -> Trainer:
    """Continue an SFT run from its latest checkpoint (training fields may change)."""
    model_over, train_over = split_overrides(overrides or [])
    if model_over:
        raise AttnlabError(f"cannot change model fields on resume: {', '.join(model_over)}")
    return Trainer.resume(run, train_over, quiet=quiet, batches=sft_batches)
