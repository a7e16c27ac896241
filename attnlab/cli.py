"""`attnlab <command>`: every module in attnlab/commands/ registers one sub-command.

A command module defines ``register(subparsers)`` which adds its parser and sets ``func``.
Heavy imports (torch, matplotlib, onnx) belong inside the command's function, so
`attnlab --help` stays fast.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

from attnlab import commands
from attnlab.commands._common import path_arg, register_all, silence_stdout
from attnlab.config import repeated_override
from attnlab.errors import AttnlabError, reason
from attnlab.reporting import END_KEY, LOGGER, STDERR_KEY
from attnlab.rundir import checkpoint_problem


def shows_default(action: argparse.Action) -> bool:
    """Whether --help should name the default: not for None, switches off, or suppressed ones."""
    return not any(action.default is v for v in (None, False, argparse.SUPPRESS))


class DefaultsFormatter(argparse.HelpFormatter):
    """--help shows every option's default, unless its help already says it or there is none."""

    def _format_action(self, action: argparse.Action) -> str:
        if action.help is None and action.option_strings and shows_default(action):
            action = copy.copy(action)  # an option without help still shows its default
            action.help = "default: %(default)s"
        return super()._format_action(action)

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.option_strings and shows_default(action) and "default" not in text:
            text += " (default: %(default)s)"
        return text


class Parser(argparse.ArgumentParser):
    """Every attnlab parser (sub-commands inherit it) formats help with DefaultsFormatter."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", DefaultsFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        """One line, like every other attnlab error, instead of argparse's usage block."""
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The attnlab parser with every command module's sub-command registered."""
    parser = Parser(prog="attnlab", description=__doc__.splitlines()[0])
    parser.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
    level = parser.add_mutually_exclusive_group()
    level.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="only warnings and errors: no progress or training log lines",
    )
    level.add_argument(
        "-v", "--verbose", action="store_true", help="also the library's debug messages"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    register_all(sub, commands)
    return parser


def config_flags_as_overrides(
    parser: argparse.ArgumentParser, args: argparse.Namespace, extra: list[str]
) -> None:
    """nanoGPT's `--max_iters=10` spelling: for commands that take `key=value` overrides
    (``overrides_in`` names where), unknown `--key=value` arguments join them as `key=value`,
    and so do the `key=value` after them (argparse stops collecting positionals at an unknown
    option). Anything else unknown is argparse's usual error."""
    dest = getattr(args, "overrides_in", None)
    pairs = [a for a in extra if "=" in a and (a.startswith("--") or not a.startswith("-"))]
    if dest is None or len(pairs) != len(extra):
        typed_parser(parser, args).error(f"unrecognized arguments: {' '.join(extra)}")
    getattr(args, dest).extend(a.removeprefix("--") for a in pairs)


def command_path(args: argparse.Namespace) -> list[str]:
    """The command as typed: ["bench", "export"], not ["bench"]."""
    parts = (args.command, getattr(args, "benchmark", None), getattr(args, "analysis", None))
    return [str(n) for n in parts if n]


def typed_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Any:
    """The parser of the command as typed (``bench export``'s, not ``bench``'s)."""
    for name in command_path(args):
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[name]
    return parser


def path_problem(parser: argparse.ArgumentParser, args: argparse.Namespace) -> str | None:
    """Why a path given to the typed command cannot be used (empty, or not UTF-8), if any."""
    for action in typed_parser(parser, args)._actions:
        given = getattr(args, action.dest, None)
        if action.type is not path_arg:
            continue
        flag = max(action.option_strings, key=len, default=action.metavar or action.dest)
        for value in given if isinstance(given, list) else [given]:  # a repeatable one: each
            if not isinstance(value, str):
                continue
            if not value.strip():
                return f"{flag} is empty; name a file or folder"
            try:
                value.encode()
            except UnicodeEncodeError:  # bytes the locale could not decode arrive as surrogates
                shown = os.fsencode(value).decode(errors="backslashreplace")
                return f"{flag} {shown} is not valid UTF-8; name a file or folder in UTF-8"
            if action.dest == "out" and (problem := checkpoint_problem(Path(value))):
                return problem  # every command's output: never in a run's checkpoint
    return None


def out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is an allocation that failed (torch raises RuntimeError on the CPU)."""
    text = str(error)
    return isinstance(error, MemoryError) or any(
        s in text for s in ("can't allocate memory", "out of memory", "OutOfMemory")
    )


class TerminalHandler(logging.Handler):
    """The library's reports as the CLI prints them: INFO on stdout (on stderr when the record
    is marked so), WARNING and above on stderr, each line flushed (attnlab.reporting)."""

    def emit(self, record: logging.LogRecord) -> None:
        to_stderr = record.levelno >= logging.WARNING or getattr(record, STDERR_KEY, False)
        stream = sys.stderr if to_stderr else sys.stdout
        try:
            stream.write(self.format(record) + getattr(record, END_KEY, "\n"))
            stream.flush()
        except BrokenPipeError:
            raise
        except Exception:
            self.handleError(record)


@contextlib.contextmanager
def reporting(args: argparse.Namespace) -> Iterator[None]:
    """The attnlab logger at the level -q / -v ask for, written by a TerminalHandler."""
    logger = logging.getLogger(LOGGER)
    handler = TerminalHandler()
    level = logging.WARNING if args.quiet else logging.DEBUG if args.verbose else logging.INFO
    before = logger.level
    logger.addHandler(handler)
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(before)


def main(argv: list[str] | None = None) -> int:
    """Run the command in ``argv`` (sys.argv when None); the exit status: 0, or 2 with one
    line on stderr for a bad input (a traceback only with --debug)."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    with reporting(args):
        return _run(parser, args, extra)


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace, extra: list[str]) -> int:
    """The command of ``main``, with the library's reports going to the terminal."""
    if extra:
        config_flags_as_overrides(parser, args, extra)
    name = " ".join(command_path(args))
    dest = getattr(args, "overrides_in", None)  # the key=value pairs, where a command takes them
    problem = path_problem(parser, args) or (
        repeated_override(getattr(args, dest)) if dest else None
    )
    if problem is not None:
        print(f"attnlab {name}: error: {problem}", file=sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except AttnlabError as e:  # anything else is a bug: let its traceback show
        if args.debug:
            raise
        # one line, whatever a library's text quoted in the message holds (a pickle error's
        # own line break made two)
        # an empty message is named by its type and the error underneath (errors.reason)
        message = " ".join(str(e).splitlines()).strip() or reason(e)
        print(f"attnlab {name}: error: {message}", file=sys.stderr)
        return 2
    except (MemoryError, RuntimeError) as e:  # sizes the user asked for, not a bug
        if args.debug or not out_of_memory(e):
            raise
        first = (str(e).strip().splitlines() or ["MemoryError"])[0]
        print(f"attnlab {name}: error: out of memory ({first}); ask for less", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader of stdout went away: `attnlab presets | head -1`
        silence_stdout()
        return 141  # 128 + SIGPIPE: what a shell reports for a command a closed pipe stopped
