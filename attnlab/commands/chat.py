"""`attnlab chat`: talk to a chat-tuned model in the terminal (ChatML, streamed replies)."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import sys
from typing import Any

from attnlab.commands._common import path_arg
from attnlab.errors import AttnlabError

HELP = "type a message; /help lists the commands"
COMMANDS = {
    "/help": "list these commands",
    "/reset": "forget the conversation so far",
    "/exit": "quit (so does Ctrl-D)",
}


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "chat",
        help="chat with a ChatML-tuned run in the terminal",
        description=f"Chat with RUN (a run or model folder); {HELP}. "
        "Reads stdin line by line, so it also works through a pipe.",
    )
    p.add_argument("model", type=path_arg, metavar="RUN")
    p.add_argument("--temperature", type=float, default=0.7, help="0 = greedy")
    p.add_argument(
        "--top-p", type=float, default=0.9, help="sample from the fewest tokens reaching p"
    )
    p.add_argument("--top-k", type=int, help="sample from the k most likely only (default: all)")
    p.add_argument(
        "--max-new-tokens", type=int, default=200, help="at most half the context window"
    )
    p.add_argument("--system", help="system message put at the start of every prompt")
    p.add_argument("--seed", type=int, default=1337, help="seed of the sampling")
    p.add_argument("--device", default="auto", help="auto (cuda, mps, cpu) or a torch device")
    p.add_argument(
        "--compile", action="store_true", help="torch.compile first: slower start, faster replies"
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from attnlab import from_pretrained
    from attnlab.commands._common import check_sampling_args, compile_announced, quiet_broken_pipe
    from attnlab.data.chat import IM_END, IM_START
    from attnlab.device import resolve_device
    from attnlab.train.sft import tuned_on_chatml

    if args.max_new_tokens < 1:  # was raised to 1 silently; before sampling's own ">= 0" rule
        raise AttnlabError(f"--max-new-tokens must be >= 1 for a reply, got {args.max_new_tokens}")
    check_sampling_args(args)
    device = resolve_device(args.device)
    model, tok = from_pretrained(args.model, device=device)
    if args.compile:
        model = compile_announced(model)
    stops = {tok.token_to_id(IM_END), tok.token_to_id(IM_START)} if tok is not None else {None}
    if None in stops:
        raise AttnlabError(
            f"{args.model} has no ChatML tokens; fine-tune it first (attnlab sft --chat)"
        )
    if tuned_on_chatml(args.model) is False:  # its ChatML tokens only ever ended a response
        raise AttnlabError(
            f"{args.model} was fine-tuned on instruction pairs, never on ChatML conversations; "
            "fine-tune it with `attnlab sft --chat`, or prompt it with `attnlab sample`"
        )
    if hasattr(sys.stdin, "reconfigure"):  # bytes that are not UTF-8 become U+FFFD, not a crash
        sys.stdin.reconfigure(errors="replace")
    with quiet_broken_pipe():
        converse(args, model, tok, stops)
    return 0


def converse(args: argparse.Namespace, model: Any, tok: Any, stops: set[int]) -> None:
    """The read-reply loop: Ctrl-C stops a reply and returns to the prompt; at the prompt, quits."""
    import torch

    from attnlab.commands._common import echo_tokens
    from attnlab.data.chat import IM_END, fit_history, framing_tokens, message_fit
    from attnlab.export.hf import added_token_ids
    from attnlab.model.generation import stream
    from attnlab.train.checkpoint import model_folder

    device = next(model.parameters()).device
    block = model.config.block_size
    max_new = max(1, min(args.max_new_tokens, block // 2))  # keep half the window for the history
    system = [{"role": "system", "content": args.system}] if args.system else []
    if args.system:  # refused once, here, instead of in place of every reply
        try:
            tok.encode(args.system)
        except AttnlabError as e:
            raise AttnlabError(f"--system: {e}") from None
    try:  # a context too small for the markers (and --system): refused once, not at every turn
        fit_history(tok, [*system, {"role": "user", "content": ""}], block - max_new)
    except AttnlabError as e:
        room = block - framing_tokens(tok, system) - 1  # the reply that leaves one token to say
        fix = (
            f"pass --max-new-tokens {room} or fewer"
            if room >= 1
            else "shorten --system"
            if system
            else "the model's context is too short for ChatML"
        )
        raise AttnlabError(
            f"{e} (a context of {block} tokens, {max_new} kept for the reply); {fix}"
        ) from None
    history: list[dict[str, str]] = []
    gen = torch.Generator(device=device).manual_seed(args.seed)
    suppress = added_token_ids(model_folder(args.model))
    interactive = sys.stdin.isatty()
    if interactive:
        line_editing()
        print(f"chatting with {args.model}: {HELP}")
    while True:
        try:
            line = input("you> " if interactive else "").strip()
        except (EOFError, KeyboardInterrupt):
            print(flush=True)
            break
        if line.startswith("/"):  # a command, or one that does not exist: not for the model
            word, *extra = line.split()
            if word in COMMANDS and extra:  # "/exit now": ending or clearing is not guessed at
                print(f"{word} takes no arguments")
            elif word == "/exit":
                break
            elif word == "/reset":
                history.clear()
                print("(history cleared)")
            else:
                print(command_help(word))
            continue
        if not line:
            continue
        user = {"role": "user", "content": line}
        try:
            ids = fit_history(tok, system + history + [user], block - max_new)
        except AttnlabError as e:  # e.g. a character a char-level model has never seen
            print(f"attnlab chat: {e}", file=sys.stderr)
            continue
        length, held = message_fit(tok, system + history + [user], block - max_new)
        if held < length:  # its start is cut away: the reply answers only the rest
            print(
                f"attnlab chat: your message is {length:,} tokens, more than the {held:,} the "
                f"context leaves it ({block:,}, {max_new:,} kept for the reply); the model reads "
                f"only its last {held:,}",
                file=sys.stderr,
            )
        if interactive:
            print("model> ", end="", flush=True)
        tokens = stream(
            model,
            torch.tensor([ids], device=device),
            max_new,
            args.temperature,
            args.top_k,
            args.top_p,
            eos_token_id=tok.token_to_id(IM_END),
            generator=gen,
            suppress_tokens=suppress,
            vocab_limit=tok.vocab_size,
        )
        try:
            reply = echo_tokens(tok, [], (int(t) for t in tokens), stops)
        except KeyboardInterrupt:  # this reply stops; the conversation goes on without it
            print("\n(stopped)", flush=True)
            continue
        print(flush=True)
        history += [user, {"role": "assistant", "content": reply}]


def command_help(word: str) -> str:
    """The answer to /help (or to an unknown /command): every command, one per line."""
    head = "commands:" if word == "/help" else f"unknown command {word}; the commands are:"
    return "\n".join([head, *(f"  {name:<8} {what}" for name, what in COMMANDS.items())])


def line_editing() -> None:
    """Arrow keys, editing and this session's history for input() (readline, where there is one)."""
    with contextlib.suppress(ImportError):  # Windows has none
        importlib.import_module("readline")  # importing it is what turns it on
