"""`attnlab train`: train a model from a preset, a TOML file and key=value overrides."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from attnlab.commands._common import path_arg
from attnlab.config import split_overrides
from attnlab.errors import AttnlabError
from attnlab.fsutil import check_writable, refuse_foreign, refuse_source_inside, replace_folder
from attnlab.presets import get_preset
from attnlab.rundir import LOCK_FILE, RunDir, RunLock, finished_summary, is_run_folder

if TYPE_CHECKING:
    from attnlab.train.init_from import InitFrom
    from attnlab.train.spec import RunSpec
    from attnlab.train.trainer import Trainer


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "train",
        help="train a model (or --resume a run)",
        description="Train a model. Later sources win: preset < --config < key=value.",
    )
    p.add_argument(
        "--preset", help="named preset (see `attnlab presets`); default shakespeare-char"
    )
    p.add_argument(
        "--config", type=path_arg, help="TOML file with [model] / [train] tables or flat keys"
    )
    p.add_argument(
        "--data",
        type=path_arg,
        help="prepared data folder (default: the embedded corpus, prepared on first use); with "
        "--resume: where the run's data is now, if it moved (checked against the run's record)",
    )
    p.add_argument("--out", type=path_arg, help="run folder to create")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a non-empty --out: the new run is trained beside it and swapped in at the end",
    )
    p.add_argument(
        "--resume",
        type=path_arg,
        metavar="RUN",
        help="continue the run in RUN from its latest checkpoint",
    )
    p.add_argument(
        "--init-from",
        type=path_arg,
        metavar="FOLDER",
        help="start a new run from the weights and tokenizer of a run, model or export folder, "
        "an import-hf folder or a Hugging Face GPT-2 / Llama / attnlab folder (the model is "
        "FOLDER's; --data must use its tokenizer)",
    )
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="any model or training field, also as --key=value; "
        "`attnlab presets --fields` lists them with types, defaults and meanings",
    )
    p.set_defaults(func=run, overrides_in="overrides")


def run(args: argparse.Namespace) -> int:
    from attnlab.train.spec import data_folder, resolve
    from attnlab.train.trainer import Trainer

    if args.resume and args.overwrite:
        raise AttnlabError("--overwrite starts a new run; it does not combine with --resume")
    if args.resume and args.init_from:
        raise AttnlabError("--init-from starts a new run; it does not combine with --resume")
    if args.resume:
        if RunDir(args.resume).is_sft():
            raise AttnlabError(
                f"{args.resume} is a fine-tuning run; continue it with `attnlab sft --resume`"
            )
        model_over, train_over = split_overrides(args.overrides)
        if model_over:
            raise AttnlabError(f"cannot change model fields on resume: {', '.join(model_over)}")
        # a resumed run keeps its model, recipe and folder (its data may have moved: --data)
        refuse_resume_flags(
            ("--preset", args.preset), ("--config", args.config), ("--out", args.out)
        )
        trainer = Trainer.resume(args.resume, train_over, data=args.data)
        name = f"{args.resume} (resumed)"
    elif restarted_run(args.out):
        # torchrun --max-restarts reruns the same command after a rank failed: the run it
        # started continues from its last checkpoint (it was refused: 'already holds a run')
        trainer = Trainer.resume(args.out, data=args.data)
        name = f"{args.out} (torchrun restart {os.environ['TORCHELASTIC_RESTART_COUNT']}, resumed)"
    else:
        if not args.out:
            raise AttnlabError("--out RUN is required (or --resume RUN)")
        out = Path(args.out).expanduser()
        # --overwrite never deletes them
        inputs = [p for p in (args.data, args.config, args.init_from) if p]
        # a run folder killed before its first checkpoint may be started again
        replace = refuse_foreign(out, "run folder", args.overwrite, is_run_folder, sources=inputs)
        check_writable(out)
        spec = resolve(args.preset, args.config, args.overrides, args.data)
        start = None
        if args.init_from:
            from attnlab.train.init_from import init_spec

            spec, start = init_spec(spec, args.init_from, split_overrides(args.overrides)[0])
        if args.overwrite and replace:
            if os.environ.get("WORLD_SIZE", "1") != "1":
                raise AttnlabError(f"--overwrite does not work under torchrun; remove {out} first")
            refuse_source_inside(out, [data_folder(spec)])  # --data and --config: checked above
            # the old run's lock, held (its file unchanged) until the swap: a trainer still
            # writing there is refused, not swapped away
            lock = (
                RunLock(out, record_pid=False)
                if (out / LOCK_FILE).is_file()
                else contextlib.nullcontext()
            )
            # no manifest: resumes and analyses add to a run after it is written
            with lock, replace_folder(out, "run folder", overwrite=True, manifest=False) as tmp:
                try:
                    trainer = new_trainer(tmp, spec, start)
                    trainer.after_interrupt = (
                        f"the new run is discarded and {out} is unchanged (--overwrite replaces "
                        "it only with a finished run)"
                    )
                    status = run_to_end(trainer, spec.preset)
                except AttnlabError as e:  # named as the run it was to become, not its temp
                    raise AttnlabError(str(e).replace(str(tmp), str(out))) from e.__cause__
            print(f"replaced {out} with the new run", file=sys.stderr)
            return status
        trainer, name = new_trainer(out, spec, start), spec.preset
    return run_to_end(trainer, name)


def restarted_run(out: str | None) -> bool:
    """Whether this is torchrun restarting its workers (``--max-restarts``) and ``out`` holds a
    checkpoint of the run this torchrun job started (its env.json names the job): never a run
    the first attempt was refused to overwrite."""
    from attnlab.train.checkpoint import checkpoint_dir

    if not out or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
        return False
    env = RunDir(out).read_env() or {}
    job = os.environ.get("TORCHELASTIC_RUN_ID")
    started_here = job is not None and env.get("torchrun_run_id") == job
    if started_here and finished_summary(out) is not None:
        # a restart continues a run its job left unfinished; a finished one with this job id
        # is another job's that reused the id (a fixed --rdzv-id): resumed, it trains nothing
        raise AttnlabError(
            f"{out} holds a finished run of a torchrun job with this id ({job}); a restart "
            "continues only an unfinished one: choose another --out, or give each job its own "
            "--rdzv-id"
        )
    return started_here and checkpoint_dir(RunDir(out).latest) is not None


def refuse_resume_flags(*given: tuple[str, object]) -> None:
    """Refuse the flags among ``given`` (flag, value) that were set: a resumed run keeps its own
    (train's model and recipe, sft's data and format, both their folder)."""
    flags = [flag for flag, value in given if value]
    if flags:
        raise AttnlabError(f"{', '.join(flags)}: a resumed run keeps its own; leave them out")


def new_trainer(run_dir: Path, spec: RunSpec, start: InitFrom | None = None) -> Trainer:
    """A new run of ``spec``, from ``start``'s weights and with its tokenizer when given."""
    from attnlab.train.trainer import Trainer

    trainer = Trainer.start(
        run_dir,
        spec.model,
        spec.train,
        spec.data_dir,
        vocab_from_data=spec.vocab_from_data,
        init_weights=None if start is None else start.weights,
    )
    if start is not None:
        if start.tokenizer is not None:  # what checkpoints save: the data's tokens and the rest
            trainer.data.tokenizer = start.tokenizer
        if trainer.dist.is_main:
            print(f"initialised from {start.folder}", file=sys.stderr)
        return trainer
    preset_vocab = get_preset(spec.preset).model.get("vocab_size")
    vocab = trainer.model_config.vocab_size
    if preset_vocab is not None and vocab != preset_vocab and trainer.dist.is_main:
        print(
            f"vocab_size {vocab:,}: the data's ({spec.preset}'s {preset_vocab:,} is for its own "
            "data; set vocab_size= to keep it)",
            file=sys.stderr,
        )
    return trainer


def run_to_end(trainer: Trainer, model_name: str) -> int:
    """Say what is trained, train, leave the process group, print the summary (from rank 0)."""
    if trainer.dist.is_main:
        print("\n".join(trainer.describe(model_name)), flush=True)
    try:
        summary = trainer.run()
    finally:
        trainer.close()
    if trainer.dist.is_main:
        print(json.dumps(summary, indent=2))
    return 0
