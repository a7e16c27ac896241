"""Every ``attnlab analyze`` sub-command refuses a plain file as its RUN first, writing nothing."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from test_bad_input import attnlab, error_line  # noqa: F401  (attnlab: a fixture)
from test_folder_safety import snapshot


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The sub-command parsers of ``parser``, by name."""
    (action,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def analyses() -> dict[str, argparse.ArgumentParser]:
    """Every `attnlab analyze` sub-command the CLI registers, with its parser."""
    from attnlab.cli import build_parser

    return subparsers(subparsers(build_parser())["analyze"])


def required_positionals(parser: argparse.ArgumentParser) -> int:
    """How many positional arguments ``parser`` requires (RUN; RUN_A and RUN_B)."""
    return sum(1 for a in parser._actions if not a.option_strings and a.nargs is None)


ANALYSES = analyses()


@pytest.mark.parametrize(
    ("name", "out"),
    [(name, out) for name in sorted(ANALYSES) for out in (False, True)],
    ids=lambda value: value if isinstance(value, str) else "with-out" if value else "default-out",
)
def test_every_analysis_refuses_a_file_as_its_run_first(
    name: str,
    out: bool,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    attnlab,  # noqa: F811
) -> None:
    monkeypatch.setenv("ATTNLAB_HOME", str(tmp_path / "home"))
    spec = tmp_path / "spec.toml"
    spec.write_text('name = "not a run"\n')
    # a name every analysis' --out takes: per-position's must end in .csv, the others make it
    # a folder
    extra = ["--out", str(tmp_path / "out.csv")] if out else []
    before = snapshot(tmp_path)
    argv = ["analyze", name, *[str(spec)] * required_positionals(ANALYSES[name]), *extra]
    p = attnlab(*argv)
    assert error_line(p, f"analyze {name}") == f"{spec} is a file, not a run or model folder"
    assert p.stdout == ""
    assert snapshot(tmp_path) == before
