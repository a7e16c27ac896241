"""docs/adding-a-mechanism.md stays true: its worked example is tests/toy_core.py (which the
contract runs), and the incompatibilities it shows are what `presets --fields` lists."""

from __future__ import annotations

import re

import pytest
from conftest import ROOT

from attnlab.cli import main

DOC = ROOT / "docs" / "adding-a-mechanism.md"


def blocks(after: str, lang: str) -> str:
    """The first ``lang`` code block of the doc after the line holding ``after``."""
    text = DOC.read_text()
    found = re.search(rf"```{lang}\n(.*?)```", text[text.index(after) :], re.DOTALL)
    assert found, f"no {lang} block after {after!r}"
    return found.group(1)


def test_the_worked_example_is_the_tested_toy() -> None:
    source = (ROOT / "tests" / "toy_core.py").read_text()
    body = source.split("from __future__ import annotations\n\n", 1)[1]
    assert blocks("The whole file:", "python") == body


def test_the_listed_incompatibilities_are_the_real_ones(capsys: pytest.CaptureFixture) -> None:
    assert main(["presets", "--fields"]) == 0
    listed = capsys.readouterr().out
    text = DOC.read_text()
    start = text.index("\nmechanisms that do not compose") + 1
    shown = text[start : text.index("```", start)].strip().splitlines()
    assert shown and all(line in listed.splitlines() for line in shown)
