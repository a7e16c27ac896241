"""The ``integration`` marker is derived, not typed: tests/conftest.py gives it to every test that
starts a process or trains a model, itself or through the helpers and fixtures it uses."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import run_cli, spawns_or_trains, tiny_model


def _starts_the_cli():
    return run_cli("presets")


def _through_a_helper():
    return _starts_the_cli()


def _starts_python():
    return subprocess.run([sys.executable, "-c", "pass"], check=True)


def _trains_in_this_process():
    from attnlab.cli import main

    return main(["train", "--help"])


def _uses_the_trainer():
    from attnlab.train.trainer import Trainer

    return Trainer.resume


def _lists_in_this_process():
    from attnlab.cli import main

    return main(["presets"])


def _builds_a_config():
    return tiny_model(n_layer=1)


@pytest.mark.parametrize(
    ("func", "expected"),
    [
        (_starts_the_cli, True),
        (_through_a_helper, True),
        (_starts_python, True),
        (_trains_in_this_process, True),
        (_uses_the_trainer, True),
        (_lists_in_this_process, False),
        (_builds_a_config, False),
        (len, False),  # not a function of tests/: what it does is its own
    ],
    ids=lambda value: getattr(value, "__name__", str(value)),
)
def test_what_spawns_or_trains_is_found(func, expected: bool) -> None:
    assert spawns_or_trains(func) is expected


@pytest.fixture
def cli() -> object:
    return run_cli  # whoever asks for this fixture may start the CLI


def test_a_test_whose_fixture_spawns_is_marked(request: pytest.FixtureRequest, cli) -> None:
    assert request.node.get_closest_marker("integration") is not None


def test_a_test_that_only_builds_a_config_is_not_marked(request: pytest.FixtureRequest) -> None:
    assert tiny_model().n_layer == 2
    assert request.node.get_closest_marker("integration") is None
