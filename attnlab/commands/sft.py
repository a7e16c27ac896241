"""`attnlab sft`: fine-tune a pretrained run on instruction pairs or ChatML conversations."""

from __future__ import annotations

import argparse

from attnlab.commands._common import path_arg
from attnlab.errors import AttnlabError


class _IntermixedParser(argparse.ArgumentParser):
    """Lets positionals follow options (`sft RUN --out RUN2 key=value`); argparse's default
    parser takes one run of positionals only."""

    _mixing = False

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        if self._mixing:  # parse_known_intermixed_args calls back into this method
            return super().parse_known_args(args, namespace)
        self._mixing = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._mixing = False


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "sft",
        help="supervised fine-tuning (loss on responses only) into a new run",
        description='Fine-tune RUN (a run or model folder) on JSONL records: {"prompt", "response"} '
        'pairs or {"messages": [{"role", "content"}, ...]} ChatML conversations. '
        "<|im_start|> and <|im_end|> join the tokenizer; only response tokens are trained.",
    )
    p.add_argument(
        "--data",
        type=path_arg,
        help="JSONL file (.jsonl or .jsonl.xz); default: the shipped "
        "Shakespeare instruction set (with --chat: the chat set)",
    )
    p.add_argument(
        "--chat",
        action="store_true",
        help="write instruction pairs as ChatML turns too (and default to the chat set)",
    )
    p.add_argument("--out", type=path_arg, help="run folder to create")
    p.add_argument("--resume", type=path_arg, metavar="RUN2", help="continue the SFT run in RUN2")
    p.add_argument(
        "args",
        nargs="*",
        metavar="RUN [key=value ...]",
        help="pretrained run or model folder, then training fields "
        "(defaults: max_iters=300 learning_rate=1e-4 ...)",
    )
    p.set_defaults(func=run, overrides_in="args")
    p.__class__ = _IntermixedParser


def run(args: argparse.Namespace) -> int:
    from attnlab.commands.train import refuse_resume_flags, run_to_end
    from attnlab.train import sft

    sources = [a for a in args.args if "=" not in a]
    overrides = [a for a in args.args if "=" in a]
    if args.resume:
        if sources:
            raise AttnlabError(f"--resume takes no RUN argument (got {', '.join(sources)})")
        refuse_resume_flags(("--data", args.data), ("--chat", args.chat), ("--out", args.out))
        trainer, name = sft.resume(args.resume, overrides), f"{args.resume} (resumed)"
    else:
        if len(sources) != 1 or not args.out:
            raise AttnlabError("give one pretrained RUN and --out RUN2 (or --resume RUN2)")
        trainer = sft.start(sources[0], args.out, args.data, args.chat, overrides)
        name = f"{sources[0]} (fine-tuned)"
    return run_to_end(trainer, name)
