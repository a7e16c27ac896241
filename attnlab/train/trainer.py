"""The training loop: nanoGPT's recipe, made resumable, paired and observable.

Random streams are separate so that variants compare fairly: ``torch.manual_seed(seed)`` before
building the model (nanoGPT's init), the data sampler's own generator (same batches whatever the
model), fixed validation batches from ``eval_seed`` (identical across runs and evals), and the
global RNG for dropout (one stream per rank under torchrun), saved in every checkpoint.
Interrupted and resumed on CPU, a run ends bit-identical to one never interrupted.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import math
import os
import shlex
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from attnlab.config import FIXED, ModelConfig, TrainConfig, train_fields
from attnlab.data.bins import BatchSampler, fixed_batches
from attnlab.data.prepare import fingerprint, load_dataset
from attnlab.data.tokenizer import Tokenizer
from attnlab.device import (
    autocast_dtype,
    peak_memory_mb,
    reset_peak_memory,
    resolve_device,
    synchronize,
)
from attnlab.errors import AttnlabError, reason
from attnlab.fsutil import check_manifest, full_disk_in_one_line, remove_stale_temps
from attnlab.model import GPT
from attnlab.model.memory import check_fits
from attnlab.reporting import silenced
from attnlab.rundir import (
    BEST,
    CONFIG,
    ENV,
    LATEST,
    LOCK_FILE,
    METRICS,
    SUMMARY,
    TENSORBOARD,
    RunConfig,
    RunDir,
    RunLock,
)
from attnlab.train import checkpoint as ckpt
from attnlab.train import distributed, trackers
from attnlab.train.environment import environment
from attnlab.train.metrics import TB_EVENTS_PREFIX, MetricsLog, read_rows

logger = logging.getLogger(__name__)


def _count(n: float) -> str:
    """12.35M, 436.97M, 1.50B, 30.5K: three or four significant figures."""
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.2f}{unit}" if scale > 1e3 else f"{n / scale:.1f}{unit}"
    return f"{n:.0f}"


def describe_device(device: torch.device, amp_dtype: torch.dtype | None) -> str:
    """e.g. "cpu, 2 threads, float32" or "cuda:0 (NVIDIA H200), bfloat16 autocast"."""
    if device.type == "cuda":
        where = f"{device} ({torch.cuda.get_device_name(device)})"
    else:
        where = f"{device}, {torch.get_num_threads()} threads"
    precision = f"{str(amp_dtype).removeprefix('torch.')} autocast" if amp_dtype else "float32"
    return f"{where}, {precision}"


def holds_only_run_files(folder: Path, extra: Iterable[str] = ()) -> bool:
    """Whether ``folder`` holds what a trainer writes into a run (and the files in ``extra``) and
    nothing else: its records, checkpoints holding only checkpoint files, a tb/ of TensorBoard
    event files. Links count as someone else's."""

    def is_file(p: Path) -> bool:
        return p.is_file() and not p.is_symlink()

    def own(p: Path) -> bool:
        if p.is_symlink():
            return False
        if p.name in (LATEST, BEST):
            return p.is_dir() and ckpt.holds_only_checkpoint_files(p)
        if p.name == TENSORBOARD:
            return p.is_dir() and all(
                is_file(e) and e.name.startswith(TB_EVENTS_PREFIX) for e in p.iterdir()
            )
        return p.name in {*extra, LOCK_FILE, CONFIG, ENV, METRICS, SUMMARY} and is_file(p)

    return all(own(p) for p in folder.iterdir())


FIXED_ON_RESUME = train_fields(FIXED)  # a resume could record another value, never honour it


@dataclass
class TrainState:
    """What a checkpoint must hold to continue exactly where it stopped."""

    iter: int = 0
    best_val: float = math.inf
    bad_steps: int = 0
    skipped_steps: int = 0
    train_seconds: float = 0.0
    tokens: int = 0  # positions trained on, all ranks (SFT batches vary in length)
    history: list[dict[str, float]] = field(default_factory=list)  # (iter, val_loss) of each eval
    # the train_loss averaging window since the last logged row: metrics.csv survives a resume
    window_loss: float = 0.0
    window_steps: int = 0


class Trainer:
    """Train a GPT in a run folder: ``Trainer.start`` a new run or ``Trainer.resume`` one;
    ``run(until)`` can stop early.

    ``Trainer(...)`` itself is ``start``'s constructor (``resumed`` is for ``resume``).
    """

    @classmethod
    def start(
        cls,
        run_dir: str | Path,
        model_config: ModelConfig,
        train_config: TrainConfig,
        data_dir: str | Path | None = None,
        **options: Any,
    ) -> Trainer:
        """A new run in ``run_dir`` (refused if it already holds a checkpoint); ``options`` are
        the constructor's: vocab_from_data, quiet, batches, init_weights, lock."""
        return cls(run_dir, model_config, train_config, data_dir, **options)

    @classmethod
    def resume(
        cls,
        run_dir: str | Path,
        overrides: dict[str, Any] | None = None,
        *,
        quiet: bool = False,
        batches: Any | None = None,
        data: str | Path | None = None,
    ) -> Trainer:
        """Continue the run in ``run_dir`` from latest/ with its saved configs; ``overrides`` may
        change training fields (a longer ``max_iters``, say) but not the model. ``data``: where
        the run's data is now (moved, or on another machine), checked against its fingerprint."""
        run = RunDir(run_dir)
        saved = run.read_config()
        latest = ckpt.checkpoint_dir(run.latest)
        recorded = ckpt.read_train_config(latest) if latest is not None else {}
        lost = sorted((recorded.keys() & set(TrainConfig.field_names())) - run.train_keys())
        if lost:  # deleted by hand: the default filled in would silently train the rest
            raise AttnlabError(
                f"cannot resume {run_dir}: {run.config} has no train "
                + ", ".join(f"{k} (latest/ trained with {recorded[k]!r})" for k in lost)
                + "; restore it as the run wrote it"
            )
        if data is None and not Path(saved.data).is_dir():
            raise AttnlabError(
                f"cannot resume {run_dir}: its data folder {saved.data} is gone (moved, or the "
                "run was copied from another machine?); pass --data with the folder that holds "
                "that data now"
            )
        if data is not None and saved.data_splits is None:
            raise AttnlabError(
                f"cannot resume {run_dir} on --data {data}: the run records no fingerprint of "
                "its data to check that folder against (an older run)"
            )
        train = saved.train.replace(**(overrides or {}))
        changed = [
            f"{name}={getattr(train, name)!r} (the run's: {getattr(saved.train, name)!r})"
            for name in FIXED_ON_RESUME
            if getattr(train, name) != getattr(saved.train, name)
        ]
        if changed:  # written into config.json, they would have described another run
            raise AttnlabError(
                f"cannot change on resume: {', '.join(changed)}; a run keeps the seed and "
                "batch size its weights and batches came from, and the validation batches its "
                "val losses and best/ compare (to score other batches: attnlab eval)"
            )
        return cls(
            run_dir,
            saved.model,
            train,
            saved.data if data is None else data,
            vocab_from_data=False,
            quiet=quiet,
            batches=batches,
            resumed=saved,
        )

    def __init__(
        self,
        run_dir: str | Path,
        model_config: ModelConfig,
        train_config: TrainConfig,
        data_dir: str | Path | None = None,
        *,
        vocab_from_data: bool = True,
        quiet: bool = False,
        batches: Any | None = None,
        init_weights: dict[str, torch.Tensor] | None = None,
        resumed: RunConfig | None = None,
        lock: RunLock | None = None,
    ) -> None:
        """``batches(trainer) -> (sampler, val_batches)`` replaces the random windows of the token
        stream (SFT draws masked examples); ``init_weights`` start a new run from given weights;
        ``lock``: the run folder's, when the caller took it before writing there itself."""
        trackers.require(trackers.parse(train_config.trackers))  # before anything is written
        self.run_folder = RunDir(run_dir)
        self.run_dir = self.run_folder.path
        self.quiet = quiet
        # one trainer per run folder, taken before any write
        self.lock = lock if lock is not None else self.run_folder.lock()
        self.stop_requested = 0  # the signal (SIGINT or SIGTERM) asking to stop after this step
        self._finished_step: dict[str, Any] | None = None  # streams after the last finished step
        # the first non-finite step (iter, loss, grad norm) noted on the device; iter -1: none
        self._bad = torch.tensor([-1.0, 0.0, 0.0])
        self.peer_lost = False
        self.after_interrupt: str | None = None  # said instead of the resume command
        self.tracking: dict[str, Any] = {}  # a study's trackers, group and parent run
        # resumed from a checkpoint, and not yet recorded in env.json (done once it trains)
        self.resume_unrecorded = False
        self.data = load_dataset(data_dir)
        data_vocab = int(self.data.meta["vocab_size"])
        if vocab_from_data:
            model_config = model_config.replace(vocab_size=data_vocab)
        if model_config.vocab_size < data_vocab:
            raise AttnlabError(
                f"vocab_size={model_config.vocab_size} is smaller than the data's {data_vocab}"
            )
        self.model_config, self.cfg = model_config, train_config
        self.device = resolve_device(train_config.device)
        self.dist = distributed.setup(self.device.type, train_config.dist_timeout)
        if self.device.type == "cuda" and self.dist.enabled:
            self.device = torch.device("cuda", self.dist.local_rank)
        reset_peak_memory(self.device)  # this run's peak, not an earlier one's in this process

        self.sharded = train_config.fsdp and self.dist.enabled
        shards = self.dist.local_world_size if train_config.hsdp else self.dist.world_size
        check_fits(
            model_config,
            self.device,
            train_config.batch_size,
            ranks=self.dist.world_size,
            shards=shards if self.sharded else 1,
            sharing=self.dist.local_world_size if self.device.type == "cpu" else 1,
        )
        torch.manual_seed(train_config.seed)  # nanoGPT's init stream
        # under FSDP the whole model exists only on rank 0's CPU, as the source of the shards
        # (_distribute); the other ranks hold its shape on the meta device until then
        if self.sharded and not self.dist.is_main:
            with torch.device("meta"):
                self.model = GPT(model_config)
        else:
            self.model = GPT(model_config).to("cpu" if self.sharded else self.device)
            if init_weights is not None and resumed is None:
                ckpt.load_weights_strict(self.model, init_weights, "init_weights")
        self._resume_optimizer: dict[str, Any] | None = None  # latest/'s, for FSDP's shards
        self._resume_shards: Path | None = None  # a sharded latest/, loaded once distributed
        if self.dist.rank:  # rank 0 goes on with nanoGPT's stream; the others draw other masks
            torch.manual_seed(distributed.rank_stream_seed(train_config.seed, self.dist.rank, 0))

        def make_optimizer() -> torch.optim.Optimizer:
            return self.model.configure_optimizers(
                train_config.weight_decay,
                train_config.learning_rate,
                (train_config.beta1, train_config.beta2),
                self.device.type,
            )

        self.optimizer = make_optimizer()  # under FSDP made again over the shards
        self.sampler, self.val_batches = (batches or Trainer.token_batches)(self)
        self.batches_vary = batches is not None  # e.g. SFT examples padded per batch
        self.state = TrainState()
        self.amp_dtype = autocast_dtype(train_config.dtype, self.device)
        self.scaler = torch.amp.GradScaler(
            self.device.type, enabled=self.amp_dtype == torch.float16
        )
        refused = None
        if self.dist.is_main:
            try:
                if resumed is None:  # refused before the lock file is touched: nothing changes
                    self._refuse_a_started_run()
                self.lock.acquire(record=resumed is None)  # a resume's, once it goes on
            except AttnlabError as e:
                refused = str(e)
        # every rank stops on rank 0's refusal (the others went on into DDP and died there with
        # a traceback once rank 0 had left)
        refused = distributed.from_rank0(refused, self.dist)
        if refused is not None:
            raise AttnlabError(refused)
        try:
            with full_disk_in_one_line(self.run_dir):
                if resumed is not None:
                    self._load_latest(resumed)
                    self.lock.record()
                elif self.dist.is_main:
                    self._start_run_dir()
            self._distribute(make_optimizer)  # a sharded latest/ is read here
            if resumed is not None and self.dist.is_main:  # read whole: its overrides (e.g.
                with full_disk_in_one_line(self.run_dir):  # a longer max_iters) are the run's
                    self._write_run_config()
        except BaseException:  # refused: the folder is free again for the next trainer
            if lock is None:
                self.lock.release()
            raise
        self.forward_model = torch.compile(self.wrapped) if train_config.compile else self.wrapped

    def _distribute(self, make_optimizer: Callable[[], torch.optim.Optimizer]) -> None:
        """DDP around the model, or FSDP's shards in its place (rank 0's model their source)
        with an optimizer over them; then what a sharded latest/ holds, resharded to this run."""
        if self.sharded:
            from attnlab.train import fsdp

            env, cfg = self.dist, self.cfg
            mesh = fsdp.mesh(self.device.type, env.world_size, env.local_world_size, cfg.hsdp)
            source = self.model if env.is_main else None
            self.model = fsdp.build(self.model_config, source, self.device, self.amp_dtype, mesh)
            del source
            self.optimizer = make_optimizer()
            if self._resume_optimizer is not None:
                fsdp.load_optimizer(self.model, self.optimizer, self._resume_optimizer)
            self.wrapped = self.model
        else:
            self.wrapped = distributed.wrap(self.model, self.dist, self.device)
        if self._resume_shards is not None:
            from attnlab.train import fsdp

            fsdp.load_shards(self.model, self.optimizer, self._resume_shards)
        self._resume_optimizer = self._resume_shards = None

    def token_batches(self) -> tuple[Any, list[tuple[torch.Tensor, torch.Tensor]]]:
        """Random training windows of the token stream and the fixed validation batches."""
        block, cfg = self.model_config.block_size, self.cfg
        for split in ("train", "val"):  # name the file: the sampler only knows a token count
            n = len(getattr(self.data, split))
            if n < block + 1:
                raise AttnlabError(
                    f"{self.data.dir / f'{split}.bin'}: {n} tokens, too few for "
                    f"block_size={block} (need at least {block + 1})"
                )
        sampler = BatchSampler(
            self.data.train,
            block,
            cfg.batch_size,
            cfg.seed,
            self.dist.rank,
            self.dist.world_size,
            self.device,
        )
        val = fixed_batches(
            self.data.val, block, cfg.batch_size, cfg.eval_iters, cfg.eval_seed, self.device
        )
        return sampler, val

    # --- run folder -------------------------------------------------------------------------
    def _write_run_config(self) -> None:
        # absolute: a relative --data would name another folder from another working directory
        data = str(self.data.dir.resolve())
        splits = fingerprint(self.data.meta)
        self.run_folder.write_config(RunConfig(self.model_config, self.cfg, data, splits))

    def _refuse_a_started_run(self) -> None:
        if self.run_folder.is_foreign():  # the CLI refuses it first; library callers meet this
            raise AttnlabError(
                f"{self.run_dir} is not empty and is not a run folder; choose another --out"
            )
        if ckpt.checkpoint_dir(self.run_folder.latest) is not None:
            raise AttnlabError(
                f"{self.run_dir} already holds a run; use --resume, --overwrite or another --out"
            )

    def _start_run_dir(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._refuse_a_started_run()  # again under the lock: another trainer may have begun
        self._write_run_config()
        self.run_folder.write_env(environment(self.device, self.dist.world_size))
        self.run_folder.metrics.unlink(missing_ok=True)

    def _load_latest(self, run_config: RunConfig) -> None:
        """Restore latest/, once the data is the data the run's config.json records."""
        folder = ckpt.checkpoint_dir(self.run_folder.latest)
        if folder is None:
            raise AttnlabError(f"cannot resume {self.run_dir}: no complete checkpoint in latest/")
        if self.data.dir.resolve() == Path(run_config.data).resolve():  # prepared again since?
            wrong = f"{self.data.dir} no longer holds the data it was trained on"
            fix = "restore that data, or train a new run"
        else:  # --data: where the data is now
            wrong = f"{self.data.dir} does not hold the data it was trained on"
            fix = "pass --data with the folder that holds it"
        if (folder / ckpt.TOKENIZER).is_file():
            tokenizer = Tokenizer.load(folder / ckpt.TOKENIZER)  # damaged: its own error
            try:
                self.data.check_model(folder, self.model_config.vocab_size, tokenizer)
            except AttnlabError:
                raise AttnlabError(
                    f"cannot resume {self.run_dir}: {wrong} (its tokenizer differs from the "
                    f"checkpoint's); {fix}"
                ) from None
        change = self.data.changed_since(run_config.data_splits)
        if change:  # same tokenizer, other text: prepared again with another split or corpus
            raise AttnlabError(f"cannot resume {self.run_dir}: {wrong} ({change}); {fix}")
        # first: its config.json is checked with them (read on every rank, so that every rank
        # refuses what one refuses); a sharded latest/ is read once the model is distributed
        shards = ckpt.shards_of(folder)
        if shards is not None:  # read_weights checks the others' (shards are read below)
            check_manifest(folder)
        weights = ckpt.read_weights(folder) if shards is None else None
        # config.json edited to another model (twicing=true, another dropout): the same weights
        # would go on as this run computing something else
        edited = ckpt.model_mismatch(self.model_config, folder)
        if edited:
            raise AttnlabError(
                f"cannot resume {self.run_dir}: {self.run_folder.config} says {edited}; restore "
                "it, or start a new run from the checkpoint (train --init-from) with those fields"
            )
        on_meta = self.sharded and not self.dist.is_main  # FSDP's source is rank 0's model
        if weights is not None and not on_meta:
            ckpt.load_weights_strict(self.model, weights, str(folder))
        self._resume_shards = shards
        saved = ckpt.read_trainer_state(folder)
        try:
            if shards is None and self.sharded:  # into the shards, once there are shards
                self._resume_optimizer = saved["optimizer"]
            elif shards is None:
                self.optimizer.load_state_dict(saved["optimizer"])
            self.sampler.load_state_dict(saved["sampler"])
            torch.set_rng_state(saved["torch_rng"])
            if saved.get("scaler"):  # older checkpoints, and runs not in float16, have none
                self.scaler.load_state_dict(saved["scaler"])
            if self.device.type == "cuda" and "cuda_rng" in saved:
                torch.cuda.set_rng_state(saved["cuda_rng"])
            self._restore_rank_stream(saved.get("rank_rng"), saved["state"]["iter"])
            self.state = TrainState(**saved["state"])
        except (KeyError, TypeError, ValueError, RuntimeError, IndexError, AttributeError) as e:
            raise AttnlabError(
                f"{folder / ckpt.TRAINER_STATE} does not fit this run ({reason(e)})"
            ) from None
        if self.state.iter > self.cfg.max_iters:  # config.json would say fewer than were run
            raise AttnlabError(
                f"cannot resume {self.run_dir} with max_iters={self.cfg.max_iters}: it has run "
                f"{self.state.iter} iterations already"
            )
        self.run_folder.refuse_misshapen(self.cfg.tensorboard and self.dist.is_main)
        if self.run_folder.metrics.is_file():  # a damaged log is refused before anything changes
            read_rows(self.run_folder.metrics)
        self.resume_unrecorded = True

    def _restore_rank_stream(self, saved: list[dict[str, Any]] | None, start_iter: int) -> None:
        """A rank other than 0 goes on with its own saved dropout stream, or, when the run was
        saved by fewer ranks, starts one of its own at the checkpoint's iteration."""
        rank = self.dist.rank
        if not rank:
            return
        if saved is None or rank >= len(saved):
            torch.manual_seed(distributed.rank_stream_seed(self.cfg.seed, rank, start_iter))
            return
        torch.set_rng_state(saved[rank]["torch"])
        if self.device.type == "cuda" and saved[rank]["cuda"] is not None:
            torch.cuda.set_rng_state(saved[rank]["cuda"])

    def save(self, name: str) -> None:
        self._check_finite()  # nothing non-finite is ever written
        # collectives first: every rank's dropout stream, and under FSDP every rank's shards
        cuda = torch.cuda.get_rng_state() if self.device.type == "cuda" else None
        rank_rng = distributed.gather({"torch": torch.get_rng_state(), "cuda": cuda}, self.dist)
        main, shards = self.dist.is_main, None
        if not self.sharded:
            model, optimizer_state = (
                (self.model, self.optimizer.state_dict()) if main else (None, None)
            )
        elif self.cfg.sharded_checkpoints:  # each rank writes its own part
            from attnlab.train import fsdp

            # named by rank 0's PID (fsutil's temporary-folder convention) and moved into the
            # checkpoint by rank 0; a killed rank 0's leftovers are removed, nothing else
            staging = self.run_dir / f"{name}-shards"
            pid = distributed.from_rank0(os.getpid(), self.dist)
            shards = staging.parent / f".{staging.name}.tmp-{pid}"
            if main:
                remove_stale_temps(staging)
            distributed.barrier(self.dist)
            fsdp.save_shards(self.model, self.optimizer, shards)
            model, optimizer_state = (self.model, {}) if main else (None, None)
        else:
            from attnlab.train import fsdp

            model, optimizer_state = fsdp.full_state(
                self.model, self.optimizer, main, functools.partial(GPT, self.model_config)
            )
        if model is None:
            return
        self._write_checkpoint(name, model, optimizer_state, self._stream_state(), rank_rng, shards)

    def _stream_state(self) -> dict[str, Any]:
        """Where the batch stream and rank 0's dropout stream stand now."""
        state = {"sampler": self.sampler.state_dict(), "torch_rng": torch.get_rng_state()}
        if self.device.type == "cuda":
            state["cuda_rng"] = torch.cuda.get_rng_state()
        return state

    def _write_checkpoint(
        self,
        name: str,
        model: torch.nn.Module,
        optimizer_state: dict[str, Any],
        streams: dict[str, Any],
        rank_rng: list[dict[str, Any]] | None,
        shards: Path | None = None,
    ) -> None:
        trainer_state = {
            "optimizer": optimizer_state,  # empty when the shards hold it
            **streams,
            "scaler": self.scaler.state_dict(),  # float16's loss scale: empty when unused
            "state": self.state.__dict__,
        }
        if rank_rng is not None:  # rank 0's is torch_rng; the others resume theirs from here
            trainer_state["rank_rng"] = rank_rng
        ckpt.save_checkpoint(
            self.run_dir / name, model, self.data.tokenizer, self.cfg, trainer_state, shards
        )

    def _after_lost_peer(self) -> str:
        """A collective found no peer within dist_timeout: save latest/ at the last step every
        rank finished, where this rank can do it alone, and say so in one line.

        Under DDP rank 0 holds the whole model, and its weights, optimizer state and streams
        are those of the last finished step (a step's collectives come before its update, and
        the streams were noted when it finished); the other ranks' dropout streams start anew
        there on resume. Under FSDP the shards are on the ranks that stopped answering: the last
        regular checkpoint stands.
        """
        st = self.state
        what = (
            f"rank {self.dist.rank}: no answer from a peer within dist_timeout="
            f"{self.cfg.dist_timeout:g} s after iter {st.iter} (a rank hung, or its machine was "
            "lost)"
        )
        if self.dist.is_main and not self.cfg.fsdp and self._finished_step is not None:
            st.history = [h for h in st.history if h["iter"] <= st.iter]
            self._write_checkpoint(
                LATEST, self.model, self.optimizer.state_dict(), self._finished_step, None
            )
            saved = f"saved {self.run_folder.latest} at iter {st.iter}"
        elif self.dist.is_main:
            latest = ckpt.checkpoint_dir(self.run_folder.latest)
            saved = f"the last checkpoint is {latest}" if latest else "no checkpoint was written"
        else:
            return f"{what}; rank 0 says what was saved"
        return f"{what}; {saved}; continue with: {self.resume_command()} (on any number of ranks)"

    # --- what the run is ----------------------------------------------------------------------
    def describe(self, model_name: str) -> list[str]:
        """The lines `train`, `sft` and `demo` print first: data, model, device and schedule."""
        meta, cfg, mc = self.data.meta, self.cfg, self.model_config
        sharding = ""
        if cfg.fsdp:  # recorded either way: say when it does nothing
            one = ", fsdp=true: nothing to shard in one process"
            env = self.dist
            nodes = env.world_size // env.local_world_size
            hybrid = f", HSDP ({nodes} nodes x {env.local_world_size} shards)"
            sharding = (hybrid if cfg.hsdp else ", FSDP") if env.enabled else one
        lines = [
            f"data:     {self.data.dir}: {meta['train_tokens']:,} train / "
            f"{meta['val_tokens']:,} val tokens, vocab {meta['vocab_size']:,} "
            f"({meta.get('tokenizer', 'char')} tokenizer)",
            f"model:    {model_name}: {_count(self.model.get_num_params(non_embedding=False))} "
            f"parameters, {mc.n_layer} layers x {mc.n_embd} wide, block {mc.block_size}, "
            f"{_count(self.model.flops_per_token())} FLOPs per token (training)",
            f"device:   {describe_device(self.device, self.amp_dtype)}"
            + (f", {self.dist.world_size} processes" if self.dist.enabled else "")
            + sharding
            + (", torch.compile" if cfg.compile else ""),
        ]
        decay = cfg.lr_decay_iters or cfg.max_iters
        lrs = (
            f"lr {cfg.learning_rate:g}, warmup {cfg.warmup_iters}, cosine decay to "
            f"{cfg.min_lr:g} at {decay}"
            if cfg.decay_lr
            else f"lr {cfg.learning_rate:g} constant"
        )
        if cfg.decay_lr and max(decay, cfg.warmup_iters) > cfg.max_iters:
            lrs += f" (beyond max_iters: the last step's lr is {cfg.lr_at(cfg.max_iters - 1):.3g})"
        per_step = cfg.batch_size * cfg.gradient_accumulation_steps  # batch_size is global
        ranks = self.dist.world_size
        lines.append(
            f"schedule: {cfg.max_iters:,} iters, {lrs}; batch {cfg.batch_size}"
            + (f" ({cfg.batch_size // ranks} per rank x {ranks} ranks)" if ranks > 1 else "")
            + (
                f" x {cfg.gradient_accumulation_steps} accum"
                if cfg.gradient_accumulation_steps > 1
                else ""
            )
            + f" x {mc.block_size} = {per_step * mc.block_size:,} tokens per step"
            + (" (at most: examples are padded to the longest)" if self.batches_vary else "")
            + f"; eval every {cfg.eval_interval} on {len(self.val_batches)} batches"
            + (f"; stop after {cfg.max_seconds:g} s" if cfg.max_seconds else "")
        )
        if self.state.iter >= cfg.max_iters:
            lines.append(
                f"this run already finished its {cfg.max_iters:,} iters: nothing to train "
                "(to train further, pass a larger max_iters=)"
            )
        elif self._time_used_up():
            lines.append(
                f"this run already used its max_seconds={cfg.max_seconds:g} "
                f"({self.state.train_seconds:.1f} s trained): nothing to train (to train further, "
                "pass a larger max_seconds= or max_seconds=null)"
            )
        elif self.state.iter:
            lines.append(f"resuming at iter {self.state.iter:,} of {cfg.max_iters:,}")
        return lines

    def _time_used_up(self) -> bool:
        """The run has trained its max_seconds (train_seconds is rank 0's, saved: every rank
        reads the same)."""
        return self.cfg.max_seconds is not None and self.state.train_seconds >= self.cfg.max_seconds

    # --- evaluation -------------------------------------------------------------------------
    def _autocast(self) -> contextlib.AbstractContextManager:
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean loss over the fixed validation batches (each batch's mean over its targets).

        Each rank scores its share of every batch's rows and one all-reduce adds up the losses
        and target counts: one process's number, at 1/world_size of the memory and time (every
        rank scored every batch whole). Every rank runs every batch: under FSDP a forward is a
        collective.
        """
        batches = self.val_batches if self.cfg.eval_batches == "fixed" else self._fresh_val()
        self.model.eval()
        sums = torch.zeros((len(batches), 2), device=self.device)
        for i, (x, y) in enumerate(batches):
            x, y = (torch.tensor_split(t, self.dist.world_size)[self.dist.rank] for t in (x, y))
            with self._autocast():
                logits, _ = self.model(x, all_logits=True)
            sums[i, 0] = F.cross_entropy(
                logits.float().flatten(0, 1), y.flatten(), ignore_index=-1, reduction="sum"
            )
            sums[i, 1] = (y != -1).sum()
        self.model.train()
        sums = distributed.all_reduce(sums, self.dist, op="sum")
        return float((sums[:, 0] / sums[:, 1]).mean())

    def _fresh_val(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """eval_batches="fresh": new validation windows at each evaluation, from a stream keyed
        by (eval_seed, iteration) alone, so the training stream is untouched, runs compared by
        seed score the same windows at the same step, and a resume draws them again."""
        seed = int(
            np.random.SeedSequence([self.cfg.eval_seed, self.state.iter]).generate_state(1)[0]
        )
        block, cfg = self.model_config.block_size, self.cfg
        return fixed_batches(
            self.data.val, block, cfg.batch_size, cfg.eval_iters, seed, self.device
        )

    # --- the loop ---------------------------------------------------------------------------
    def _step(
        self, want_stats: bool
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor], int]:
        """One optimizer step over all micro-batches.

        Returns (loss, grad norm, mechanism stats, positions run). Positions are this rank's
        times the world size: exact for token windows, an estimate for SFT batches under DDP.
        """
        accum = self.cfg.gradient_accumulation_steps
        stats: dict[str, torch.Tensor] = {}
        loss_sum = torch.zeros((), device=self.device)
        positions = 0
        for micro in range(accum):
            x, y = self.sampler.next_batch()
            positions += x.numel() * self.dist.world_size
            last = micro == accum - 1
            with distributed.sync_context(self.wrapped, last), self._autocast():
                _, loss = self.forward_model(x, y, stats=stats if (want_stats and last) else None)
                loss = loss / accum
            self.scaler.scale(loss).backward()
            loss_sum += loss.detach().float()
        self.scaler.unscale_(self.optimizer)
        params = self.model.parameters()
        if self.cfg.grad_clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(params, self.cfg.grad_clip)
        else:
            norm = torch.linalg.vector_norm(
                torch.stack([p.grad.norm() for p in self.model.parameters() if p.grad is not None])
            )
        if hasattr(norm, "full_tensor"):  # under FSDP a DTensor: the same plain value everywhere
            norm = norm.full_tensor()
        # the global batch's loss (ranks hold equal shares), so every rank logs and skips alike
        return distributed.all_reduce(loss_sum, self.dist), norm, stats, positions

    def run(self, until: int | None = None) -> dict[str, Any]:
        """Train up to ``max_iters`` (or ``until``); return the run summary."""
        if self.dist.is_main:
            self.lock.acquire()
        self.stop_requested = 0
        try:
            with self._stop_on_interrupt(), full_disk_in_one_line(self.run_dir):
                return self._run(until)
        except RuntimeError as e:
            if self.dist.enabled and distributed.lost_peer(e):
                self.peer_lost = True  # no goodbye barrier: it would wait for the lost peer too
                raise AttnlabError(self._after_lost_peer()) from None
            raise
        finally:
            self.lock.release()

    @contextlib.contextmanager
    def _stop_on_interrupt(self) -> Any:
        """Ctrl-C, or a SIGTERM (what a scheduler or `kill` sends before it kills), stops the
        loop after the current step (then a checkpoint); a second one stops at once. Under
        torchrun the agent passes the signal on to every rank, and the ranks agree on the step."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        handled = (signal.SIGINT, signal.SIGTERM)

        def stop(signum: int, frame: Any) -> None:
            self.stop_requested = signum
            signal.signal(signum, previous[signum])

        previous = {signum: signal.signal(signum, stop) for signum in handled}
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def resume_command(self) -> str:
        sft = self.run_folder.is_sft()
        return f"attnlab {'sft' if sft else 'train'} --resume {shlex.quote(str(self.run_dir))}"

    def _run(self, until: int | None) -> dict[str, Any]:
        """The loop: one optimizer step per pass, then what the step's iteration asks for.

        The device is waited for only where a value is read on the host: a logged row, an
        evaluation, a checkpoint, the end (nanoGPT reads the loss once per log interval). The
        loss is summed and non-finite steps noted on the device in between; under torchrun the
        ranks agree on stopping (a signal, max_seconds) at those same points.
        """
        cfg, st = self.cfg, self.state
        stop_at = min(cfg.max_iters, until) if until is not None else cfg.max_iters
        if self._time_used_up():  # resumed after its time ran out: it took one more step
            stop_at = st.iter
        log = self._open_log(stop_at)
        bar = Progress(
            self.run_dir.name, cfg.max_iters, st.iter, self.dist.is_main and not self.quiet
        )
        self._first_eval(log, bar)
        compiling = cfg.compile and st.iter < stop_at
        if compiling:
            bar.note("compiling the model (torch.compile): the first step takes longer")
        window = _Window(self.device, st)
        self._bad = torch.tensor([-1.0, 0.0, 0.0], device=self.device)  # (iter, loss, norm)
        try:
            while st.iter < stop_at:
                t0 = time.perf_counter()
                lr = cfg.lr_at(st.iter)
                for group in self.optimizer.param_groups:
                    group["lr"] = lr
                # read on the host after this step: its row, its evaluation, its checkpoint
                reads = self._reads(st.iter + 1, stop_at)
                # every logged row carries the mechanism statistics, the last one too: the first
                # training row fixes metrics.csv's columns for the rest of the run
                loss, norm, stats, positions = self._step(want_stats=reads)
                if compiling:
                    bar.note(f"compiled in {time.perf_counter() - t0:.1f} s (the first step)")
                    compiling = False
                if not self._finite_or_skip(loss, norm):
                    continue
                self._update()
                st.iter += 1
                if self.dist.enabled:  # what rank 0 can save alone if a peer is lost
                    self._finished_step = self._stream_state()
                if reads:
                    synchronize(self.device)  # the clock, below, after the step has run
                    self._check_finite()
                st.train_seconds += time.perf_counter() - t0
                st.tokens += positions
                window.add(loss, positions)
                bar.update(1)
                out_of_time, stop = self._agree(reads)
                is_last = st.iter == stop_at or out_of_time
                row = self._train_row(window, lr, norm, stats) if self._logs(is_last) else None
                # a run stopped by max_seconds ends with an eval too: its summary stays current
                if st.iter % cfg.eval_interval == 0 or st.iter == cfg.max_iters or out_of_time:
                    row = self._evaluate_row(row or {"iter": st.iter, "lr": lr})
                if row is not None:
                    bar.show(row)
                    if log is not None:
                        log.write(row)
                if st.iter % (cfg.ckpt_interval or cfg.eval_interval) == 0 or is_last or stop:
                    window.into(st)  # the loss window since the last row is in the checkpoint
                    self.save(LATEST)
                if out_of_time:
                    break
                if stop:
                    self._stop_now(stop)
        finally:
            bar.close()
            if log is not None:
                log.close()
        return self.summary()

    def _open_log(self, stop_at: int) -> MetricsLog | None:
        """Rank 0's metrics.csv (and TensorBoard), cut back to the checkpoint's iteration; a
        resume that will train is recorded in env.json."""
        st = self.state
        if not self.dist.is_main:
            return None
        names = trackers.parse(self.cfg.trackers) + self.tracking.get("trackers", [])
        params = self.model.get_num_params(non_embedding=False)
        info = trackers.RunInfo(
            self.run_folder, self.model_config, self.cfg, params, st.iter, self.tracking
        )
        tensorboard = self.cfg.tensorboard and "tensorboard" in names
        log = MetricsLog(self.run_folder, tensorboard, st.iter, trackers.open_trackers(names, info))
        log.truncate_after(st.iter)
        if self.resume_unrecorded and st.iter < stop_at:  # once it is sure to train
            self.run_folder.add_resume_env(environment(self.device, self.dist.world_size), st.iter)
            self.resume_unrecorded = False  # a second run() goes on, it does not resume
        return log

    def _first_eval(self, log: MetricsLog | None, bar: Progress) -> None:
        """The iteration-0 validation loss of a new run; a resumed one shows its latest."""
        st, lr = self.state, self.cfg.lr_at(0)
        if st.iter == 0 and not st.history:  # every rank evaluates: it is a collective
            val = self.evaluate()
            st.history.append({"iter": 0, "val_loss": val})
            if log is not None:
                log.write({"iter": 0, "val_loss": val, "lr": lr})
            bar.show({"iter": 0, "val_loss": val, "lr": lr})
        elif st.history:
            bar.show(st.history[-1], print_line=False)

    def _reads(self, it: int, stop_at: int) -> bool:
        """Whether iteration ``it`` reads values on the host (a row, an eval, a checkpoint)."""
        cfg = self.cfg
        every = (cfg.log_interval, cfg.eval_interval, cfg.ckpt_interval or cfg.eval_interval)
        return it >= stop_at or it == cfg.max_iters or any(it % n == 0 for n in every)

    def _logs(self, is_last: bool) -> bool:
        return self.state.iter % self.cfg.log_interval == 0 or is_last

    def _update(self) -> None:
        """The optimizer step (the GradScaler's under float16), gradients freed."""
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)

    def _agree(self, reads: bool) -> tuple[bool, int]:
        """(out of time, the signal asking to stop: 0, SIGINT or SIGTERM), the same on every rank.

        Each rank times its own steps and catches its own signals; under torchrun they agree at
        the steps that read values anyway (a collective needs the host), so all stop at one step.
        """
        timed_out = self.cfg.max_seconds is not None and self._time_used_up()
        if not self.dist.enabled:
            return timed_out, int(self.stop_requested)
        if not reads:
            return False, 0
        # (agreed into a local: the handler may set stop_requested while this runs)
        late, agreed = distributed.max_over_ranks(
            [timed_out, int(self.stop_requested)], self.dist, self.device
        )
        return bool(late), int(agreed)

    def _train_row(
        self, window: _Window, lr: float, norm: torch.Tensor, stats: dict[str, torch.Tensor]
    ) -> dict[str, Any]:
        """metrics.csv's row for this iteration: the window's mean loss and throughput."""
        row = {
            "iter": self.state.iter,
            "train_loss": window.mean_loss(self.state),
            "lr": lr,
            "tokens_per_s": window.tokens / max(window.elapsed(), 1e-9),
            "step_ms": 1000 * window.elapsed() / max(1, window.steps),
            "elapsed_s": self.state.train_seconds,
            "grad_norm": float(norm),
            **{k: float(v) for k, v in stats.items()},
        }
        window.restart(self.state)
        return row

    def _evaluate_row(self, row: dict[str, Any]) -> dict[str, Any]:
        """The row with this iteration's validation loss; best/ when it is the best yet."""
        st = self.state
        row["val_loss"] = self.evaluate()
        st.history.append({"iter": st.iter, "val_loss": row["val_loss"]})
        if row["val_loss"] < st.best_val:
            st.best_val = row["val_loss"]
            self.save(BEST)
        return row

    def _stop_now(self, signum: int) -> None:
        """After a Ctrl-C or SIGTERM and the checkpoint: say how to continue, then leave."""
        term = signum == signal.SIGTERM
        if self.dist.is_main:
            logger.warning(
                f"{'terminated (SIGTERM)' if term else 'interrupted'} at iter {self.state.iter}: "
                + (
                    self.after_interrupt
                    or f"saved {self.run_folder.latest}; continue with: {self.resume_command()}"
                ),
            )
        if term:
            raise SystemExit(128 + signal.SIGTERM)  # what the shell reports for it
        raise KeyboardInterrupt

    def _finite_or_skip(self, loss: torch.Tensor, norm: torch.Tensor) -> bool:
        """Apply nan_policy: True to take the step, False to drop it (raises when stopping).

        With nan_policy=stop the check stays on the device: the first bad step is noted there
        and ``_check_finite`` stops at the next step that reads values, before anything is
        written (a row, a checkpoint), so no sync per step. Skipping has to know now.

        Under float16 an overflowing gradient with a finite loss is not a bad step: it is the
        GradScaler's normal start (and its answer to a spike); ``scaler.step`` skips the update,
        ``scaler.update`` lowers the scale, and the step counts as skipped.
        """
        if self.cfg.nan_policy == "stop" and not self.scaler.is_enabled():
            bad = ~(torch.isfinite(loss) & torch.isfinite(norm))
            first = bad & (self._bad[0] < 0)
            self._bad = torch.where(
                first, torch.stack([torch.full_like(loss, self.state.iter), loss, norm]), self._bad
            )
            return True
        if bool(torch.isfinite(loss)):
            finite = bool(torch.isfinite(norm))
            if finite or self.scaler.is_enabled():
                self.state.bad_steps = 0
                self.state.skipped_steps += not finite
                return True
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.update()
        st = self.state
        st.bad_steps += 1
        st.skipped_steps += 1
        self._stop_on_bad(st.iter, float(loss), float(norm))
        # the sampler has moved on, so the next attempt sees a fresh batch
        return False

    def _check_finite(self) -> None:
        """Stop on the first non-finite step noted on the device (nan_policy=stop)."""
        at, loss, norm = self._bad.tolist()
        if at >= 0:
            self._stop_on_bad(int(at), loss, norm)

    def _stop_on_bad(self, at: int, loss: float, norm: float) -> None:
        """Raise unless nan_policy=skip has bad steps to spare."""
        st = self.state
        what = f"non-finite loss or gradient at iter {at} (loss {loss:.4g}, grad norm {norm:.4g})"
        if self.cfg.nan_policy == "stop":
            latest = ckpt.checkpoint_dir(self.run_folder.latest)
            if latest is None:
                raise AttnlabError(
                    f"{what}; stopped before any checkpoint was written: start the run again "
                    "(a lower learning_rate, or nan_policy=skip, may help)"
                )
            raise AttnlabError(f"{what}; stopped, the last good checkpoint is {latest}")
        if st.bad_steps >= self.cfg.max_bad_steps:
            raise AttnlabError(
                f"{what}; {st.bad_steps} bad steps in a row (max_bad_steps), stopped"
            )

    def summary(self) -> dict[str, Any]:
        st = self.state
        evals = [h["val_loss"] for h in st.history]
        # the run's peak over every process that trained it: a resume (even one that found
        # nothing left to train) measured only its own
        earlier = (self.run_folder.read_summary() or {}).get("peak_memory_mb")
        peak = peak_memory_mb(self.device)
        if isinstance(earlier, int | float) and not earlier <= peak:  # peak is nan on Windows
            peak = earlier
        summary = {
            "iters": st.iter,
            "final_val_loss": evals[-1] if evals else None,
            "best_val_loss": st.best_val if math.isfinite(st.best_val) else None,
            "train_seconds": st.train_seconds,
            "sec_per_step": st.train_seconds / st.iter if st.iter else None,
            "tokens_per_s": st.tokens / st.train_seconds if st.train_seconds else None,
            "peak_memory_mb": peak,
            "params": self.model.get_num_params(non_embedding=False),
            "skipped_steps": st.skipped_steps,
        }
        if self.dist.is_main:
            self.run_folder.write_summary(summary)
        return summary

    def close(self) -> None:
        self.lock.release()
        if self.dist.enabled:
            # DDP's reducer holds the process group. Freed after the group was destroyed, it
            # would be the group's last owner, and its destructor runs with the GIL held: gloo's
            # worker thread, still freeing its last work (which needs the GIL), is then joined
            # forever, a hang at exit. Freed now, the group's last owner is the registry, which
            # frees it without the GIL.
            self.wrapped = self.forward_model = self.model
            gc.collect()  # the wrapper sits in reference cycles (its hooks)
        distributed.teardown(self.dist, goodbye=not self.peer_lost)


class _Window:
    """The training loss and throughput since the last logged row. The loss is one float32 sum
    on the device, read into the train state only where it is logged or saved, and a resumed
    window goes on from the saved sum: the same additions in the same order, so a row's loss is
    the same wherever checkpoints or interrupts fell."""

    def __init__(self, device: torch.device, st: TrainState) -> None:
        # a float32 sum saved by this class converts back exactly
        self.loss = torch.tensor(st.window_loss, dtype=torch.float32, device=device)
        self.pending = 0  # steps summed in ``loss``, not yet counted in the train state
        self.steps = self.tokens = 0  # since the last row, for its throughput
        self.t0 = time.perf_counter()

    def add(self, loss: torch.Tensor, positions: int) -> None:
        self.loss += loss.detach().float()
        self.pending += 1
        self.steps += 1
        self.tokens += positions

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def into(self, st: TrainState) -> None:
        """Read the sum into the train state (a checkpoint saves it, a resume goes on)."""
        if self.pending:
            st.window_loss = float(self.loss)
            st.window_steps += self.pending
            self.pending = 0

    def mean_loss(self, st: TrainState) -> float:
        self.into(st)
        return st.window_loss / max(1, st.window_steps)

    def restart(self, st: TrainState) -> None:
        st.window_loss, st.window_steps = 0.0, 0
        self.loss.zero_()
        self.steps = self.tokens = 0
        self.t0 = time.perf_counter()


# metrics shown while training: (metrics.csv column, progress-bar name, format)
SHOWN = (
    ("train_loss", "loss", ".4f"),
    ("val_loss", "val", ".4f"),
    ("lr", "lr", ".2e"),
    ("tokens_per_s", "tok/s", ".0f"),
)


class Progress:
    """A tqdm bar on a terminal (train loss, latest val loss, lr, tokens/s), else plain lines.

    Off a terminal every row shown is one line on stdout: one per log_interval and one per
    evaluation. Nothing at all when ``enabled`` is False (quiet trainers, ranks other than 0).
    """

    def __init__(self, name: str, total: int, initial: int, enabled: bool) -> None:
        enabled = enabled and not silenced()  # a silenced attnlab: no bar either
        self.total, self.enabled, self.postfix = total, enabled, {}
        self.bar = tqdm(
            total=total,
            initial=initial,
            disable=not (enabled and sys.stderr.isatty()),
            unit="it",
            dynamic_ncols=True,
            desc=name,
        )

    def show(self, row: dict[str, Any], print_line: bool = True) -> None:
        """Put the row's metrics on the bar, keeping the others' latest values (the val loss)."""
        for key, name, fmt in SHOWN:
            if row.get(key) is not None:
                self.postfix[name] = f"{row[key]:{fmt}}"
        self.bar.set_postfix(self.postfix)
        if self.enabled and self.bar.disable and print_line:
            logger.info(log_line(row, self.total))

    def note(self, message: str) -> None:
        """A message on stderr that does not break the bar."""
        if self.enabled:
            self.bar.write(message, file=sys.stderr)

    def update(self, n: int) -> None:
        self.bar.update(n)

    def close(self) -> None:
        self.bar.close()


def log_line(row: dict[str, Any], max_iters: int) -> str:
    """e.g. "iter 250/5000 | train_loss 1.8123 | val_loss 1.9034 | lr 9.50e-04 | tokens_per_s 81234"."""
    parts = [f"iter {row['iter']}/{max_iters}"]
    parts += [f"{key} {row[key]:{fmt}}" for key, _, fmt in SHOWN if row.get(key) is not None]
    return " | ".join(parts)
