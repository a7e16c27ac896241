"""`attnlab train`: train a model from a preset, a TOML file and key=value overrides."""

from __future__ import annotations

import argparse
import json


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "train",
        help="train a model (or --resume a run)",
        description="Train a model. Later sources win: preset < --config < key=value.",
    )
    p.add_argument(
        "--preset", help="named preset (see `attnlab presets`); default shakespeare-char"
    )
    p.add_argument("--config", help="TOML file with [model] / [train] tables or flat keys")
    p.add_argument(
        "--data", help="prepared data folder (default: the embedded corpus, prepared on first use)"
    )
    p.add_argument("--out", help="run folder to create")
    p.add_argument(
        "--resume", metavar="RUN", help="continue the run in RUN from its latest checkpoint"
    )
    p.add_argument("overrides", nargs="*", metavar="key=value", help="any model or training field")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from attnlab.config import split_overrides
    from attnlab.errors import AttnlabError
    from attnlab.train.spec import resolve
    from attnlab.train.trainer import Trainer

    if args.resume:
        if (Path(args.resume) / "sft_data" / "sft.json").is_file():
            raise AttnlabError(
                f"{args.resume} is a fine-tuning run; continue it with `attnlab sft --resume`"
            )
        model_over, train_over = split_overrides(args.overrides)
        if model_over:
            raise AttnlabError(f"cannot change model fields on resume: {', '.join(model_over)}")
        trainer = Trainer(args.resume, resume=True, resume_overrides=train_over)
    else:
        if not args.out:
            raise AttnlabError("--out RUN is required (or --resume RUN)")
        spec = resolve(args.preset, args.config, args.overrides, args.data)
        trainer = Trainer(
            args.out, spec.model, spec.train, spec.data_dir, vocab_from_data=spec.vocab_from_data
        )
    return run_to_end(trainer)


def run_to_end(trainer) -> int:
    """Train, leave the process group, and print the summary (once, from rank 0)."""
    try:
        summary = trainer.run()
    finally:
        trainer.close()
    if trainer.dist.is_main:
        print(json.dumps(summary, indent=2))
    return 0
