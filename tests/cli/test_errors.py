"""The CLI's error contract: attnlab's own errors are one line, anything else is a bug with a traceback."""

from __future__ import annotations

import argparse

import pytest

from attnlab import cli
from attnlab.bench import timing
from attnlab.commands import presets
from attnlab.config import ModelConfig, TrainConfig
from attnlab.errors import AttnlabError, ConfigError


def _raising(error: Exception):
    def run(args: argparse.Namespace) -> int:
        raise error

    return run


def test_attnlab_error_is_one_line(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setattr(presets, "run", _raising(ConfigError("n_layer=0 must be > 0")))
    assert cli.main(["presets"]) == 2
    assert capsys.readouterr().err == "attnlab presets: error: n_layer=0 must be > 0\n"


@pytest.mark.parametrize("error", [ValueError("a bug"), FileNotFoundError("a bug"), KeyError("x")])
def test_other_errors_are_bugs_with_a_traceback(monkeypatch: pytest.MonkeyPatch, error) -> None:
    monkeypatch.setattr(presets, "run", _raising(error))
    with pytest.raises(type(error)):
        cli.main(["presets"])


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: ModelConfig(n_embd=30, n_head=4), "n_embd=30 must be divisible by n_head=4"),
        (lambda: ModelConfig(norm="batchnorm"), "norm='batchnorm' is not allowed"),
        (lambda: TrainConfig(beta2=1.0), "beta2=1.0 must be in [0, 1)"),
        (lambda: timing.interleaved({"A": lambda: None}, "A", reps=0), "--reps 0 must be >= 1"),
    ],
)
def test_validation_raises_config_error(build, message: str) -> None:
    """Validation errors are attnlab's own (one line in the CLI) and still ValueErrors (Python API)."""
    with pytest.raises(ConfigError) as info:
        build()
    assert str(info.value).startswith(message)
    assert isinstance(info.value, AttnlabError) and isinstance(info.value, ValueError)
