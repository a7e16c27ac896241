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


def takes_runs(parser: argparse.ArgumentParser) -> bool:
    """Whether the analysis reads trained runs (RUN; RUN_A and RUN_B), not a study or a preset."""
    return any(not a.option_strings and a.dest.startswith("run") for a in parser._actions)


ANALYSES = {name: p for name, p in analyses().items() if takes_runs(p)}
STUDY_ANALYSES = {
    name: p
    for name, p in analyses().items()
    if any(not a.option_strings and a.dest == "study" for a in p._actions)
}


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


@pytest.mark.parametrize("name", sorted(STUDY_ANALYSES))
def test_every_study_analysis_refuses_a_file_as_its_study(
    name: str,
    tmp_path: Path,
    attnlab,  # noqa: F811
) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text('name = "not a study"\n')
    required = [
        x
        for a in STUDY_ANALYSES[name]._actions
        if a.option_strings and a.required
        for x in (a.option_strings[0], "vanilla")
    ]
    before = snapshot(tmp_path)
    p = attnlab("analyze", name, str(spec), *required)
    assert p.returncode == 2 and len(p.stderr.splitlines()) == 1, p.stderr
    assert str(spec) in p.stderr and p.stdout == ""
    assert snapshot(tmp_path) == before


def test_the_runs_and_study_analyses_are_found() -> None:
    """The two tables above are derived: an analysis of neither kind (export-size) is left out."""
    assert {"per-position", "names"} <= set(ANALYSES)
    assert {"curves", "reach"} == set(STUDY_ANALYSES)
