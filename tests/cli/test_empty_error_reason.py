"""No refusal with an empty reason: an error whose message is blank is named by its type and the
error underneath it, in the CLI's one line and in the checkpoint writer's."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from conftest import tiny_model
from test_folder_safety import snapshot

from attnlab import GPT, cli
from attnlab.commands import presets
from attnlab.errors import AttnlabError, reason
from attnlab.train import checkpoint

# safetensors' refusal of shared tensors: its message starts with a line break
SHARED = (
    "\n            Some tensors share memory, this will lead to duplicate memory on disk: "
    "[{'attn.sharpen.b', 'attn.core_hook.b'}].\n            A potential way to correct this..."
)


def raised(error: BaseException, cause: BaseException | None = None) -> BaseException:
    """``error`` as it arrives in an except clause: raised, from ``cause`` if given."""
    try:
        try:
            raise cause or error
        except BaseException as inner:
            if cause is None:
                raise
            raise error from inner
    except BaseException as e:
        return e


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (
            raised(RuntimeError(SHARED)),
            "Some tensors share memory, this will lead to duplicate "
            "memory on disk: [{'attn.sharpen.b', 'attn.core_hook.b'}].",
        ),
        (raised(RuntimeError()), "RuntimeError"),
        (raised(AttnlabError(""), ValueError("the cause")), "AttnlabError (ValueError: the cause)"),
        (raised(AttnlabError(" \n"), KeyError()), "AttnlabError (KeyError)"),
        (
            raised(
                RuntimeError(),
                AttnlabError(
                    "",
                ),
            ),
            "RuntimeError (AttnlabError)",
        ),
    ],
)
def test_a_reason_is_never_blank(error: BaseException, expected: str) -> None:
    assert reason(error) == expected


def test_the_cli_names_an_empty_error(monkeypatch: pytest.MonkeyPatch, capsys, tmp_path) -> None:
    """An AttnlabError with an empty message, raised from another error, through the CLI's
    error path: exit 2, one line naming both, nothing written."""

    def run(args: argparse.Namespace) -> int:
        try:
            raise ValueError("safetensors refused shared tensors")
        except ValueError as e:
            raise AttnlabError("") from e

    monkeypatch.setattr(presets, "run", run)
    before = snapshot(tmp_path)
    assert cli.main(["presets"]) == 2
    assert capsys.readouterr().err == (
        "attnlab presets: error: AttnlabError (ValueError: safetensors refused shared tensors)\n"
    )
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(
    ("error", "shown"),
    [
        (RuntimeError(SHARED), "Some tensors share memory, this will lead to duplicate memory"),
        (RuntimeError(), "RuntimeError"),
    ],
)
def test_the_checkpoint_writer_names_its_cause(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, error: BaseException, shown: str
) -> None:
    """The `()` of a failed checkpoint write: the reason is the message's first non-blank line,
    or the error's type; the previous checkpoint stays as it was."""
    model = GPT(tiny_model())
    checkpoint.save_checkpoint(tmp_path / "best", model)
    before = snapshot(tmp_path)

    def fail(*args) -> None:
        raise error

    monkeypatch.setattr(checkpoint, "write_model_folder", fail)
    with pytest.raises(AttnlabError) as err:
        checkpoint.save_checkpoint(tmp_path / "best", model)
    message = str(err.value)
    assert message.startswith(f"could not write checkpoint {tmp_path / 'best'} ({shown}")
    assert message.endswith("); the previous checkpoint is intact") and "()" not in message
    assert snapshot(tmp_path) == before
