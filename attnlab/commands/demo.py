"""`attnlab demo`: the first command a new user runs (README): prepare, train a small model, sample."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import TYPE_CHECKING

from attnlab.commands._common import path_arg
from attnlab.fsutil import replace_folder

if TYPE_CHECKING:
    from attnlab.train.spec import RunSpec

DEMO_MARKER = ".attnlab-demo"  # marks a folder `attnlab demo` wrote and may therefore replace

# shakespeare-char (the kv-bias seed's vanilla model) on a schedule that fits a 2-core laptop
DEMO_OVERRIDES = dict(
    max_iters=800,
    lr_decay_iters=800,
    warmup_iters=50,
    eval_interval=200,
    eval_iters=20,
    log_interval=20,
    max_seconds=270.0,
)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "demo", help="prepare the embedded corpus, train a small model, sample"
    )
    p.add_argument(
        "--out",
        type=path_arg,
        default="runs/demo",
        help="run folder (default runs/demo); a previous demo run there is replaced, "
        "anything else is refused",
    )
    p.add_argument(
        "--overwrite", action="store_true", help="replace --out even if it is not a demo run"
    )
    p.add_argument("--preset", default="shakespeare-char")
    p.add_argument(
        "overrides", nargs="*", metavar="key=value", help="change the demo's model or training"
    )
    p.set_defaults(func=run, overrides_in="overrides")


def is_demo_run(folder: Path) -> bool:
    """True for a folder this command wrote and nothing else: the DEMO_MARKER file beside what a
    trainer writes into a run. Anything a user added (a README, an ``analyze ... RUN``
    analysis/ folder, a file in a checkpoint) makes it theirs."""
    from attnlab.train.trainer import holds_only_run_files

    marker = folder / DEMO_MARKER
    return (
        marker.is_file() and not marker.is_symlink() and holds_only_run_files(folder, {DEMO_MARKER})
    )


def run(args: argparse.Namespace) -> int:
    from attnlab.train.spec import data_folder, resolve

    out = Path(args.out).expanduser()
    overrides = [f"{k}={v}" for k, v in DEMO_OVERRIDES.items()] + list(args.overrides)
    spec = resolve(args.preset, overrides=overrides)  # every argument is checked before any write
    started = time.perf_counter()
    # trained beside --out and swapped in at the end: a failed demo leaves the previous one
    sources = [data_folder(spec)]  # --overwrite never deletes the data it trains on
    # no manifest: a run (is_demo_run says what a demo writes), which analyses add to later
    with replace_folder(
        out, "demo run", args.overwrite, is_demo_run, sources=sources, manifest=False
    ) as tmp:
        train_and_sample(tmp, spec, args.preset, started)  # a trainer starts in an empty folder
        (tmp / DEMO_MARKER).write_text("written by `attnlab demo`, which may replace this folder\n")
    print(f"run folder: {out}  (try: attnlab sample {out} --prompt 'ROMEO.')")
    return 0


def train_and_sample(run_dir: Path, spec: RunSpec, preset: str, started: float) -> None:
    """Train the demo model in ``run_dir``, printing what the README promises."""
    import torch

    from attnlab.data.prepare import start_tokens
    from attnlab.train.trainer import Trainer

    trainer = Trainer.start(
        run_dir, spec.model, spec.train, spec.data_dir, vocab_from_data=spec.vocab_from_data
    )
    # said on Ctrl-C or SIGTERM instead of the resume command: run_dir is a temporary folder,
    # removed as the demo stops
    trainer.after_interrupt = "the unfinished demo is discarded (run `attnlab demo` again)"
    print("\n".join(trainer.describe(preset)))
    before = trainer.evaluate()
    print(f"val loss before training: {before:.4f}")
    summary = trainer.run()
    trainer.close()
    planned = spec.train.max_iters
    # on a slow machine the time cap ends training early: say so, or the sample reads as if
    # the full schedule had produced it
    cut = (
        f"; the demo's {spec.train.max_seconds:g} s time cap stopped it before iteration {planned}"
        if summary["iters"] < planned
        else ""
    )
    print(
        f"val loss after {summary['iters']} iterations: {summary['final_val_loss']:.4f} "
        f"(best {summary['best_val_loss']:.4f}) in {time.perf_counter() - started:.0f} s, "
        f"{summary['tokens_per_s']:.0f} tokens/s{cut}"
    )
    gen = torch.Generator(device=trainer.device).manual_seed(1337)
    start = start_tokens(trainer.data.tokenizer, trainer.data.dir)
    prompt = torch.tensor([start], device=trainer.device)
    sample = trainer.model.generate(
        prompt,
        400,
        temperature=0.8,
        top_k=50,
        generator=gen,
        vocab_limit=trainer.data.tokenizer.vocab_size,
    )
    print(
        "sample:\n" + "-" * 60 + trainer.data.tokenizer.decode(sample[0].tolist()) + "\n" + "-" * 60
    )
