"""What a researcher sees in the terminal: startup summaries, progress, help texts, CLI habits."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import ROOT


@pytest.mark.parametrize("preset", ["qkve-small", "gba-lm-twicing", "kvbias-shakespeare-char"])
def test_info_shapes_match_a_real_build(preset: str) -> None:
    from attnlab.commands.info import parameter_counts, shapes_only
    from attnlab.config import ModelConfig
    from attnlab.model import GPT

    config = ModelConfig.preset(preset)
    fast, real = shapes_only(config), GPT(config)
    assert parameter_counts(fast) == parameter_counts(real)
    assert fast.flops_per_token() == real.flops_per_token()


def test_info_build_does_not_import_dynamo() -> None:
    """What made `info qkve-61m` take seconds: meta-device kernels pull in torch._dynamo."""
    code = (
        "import sys\n"
        "from attnlab.commands.info import shapes_only\n"
        "from attnlab.config import ModelConfig\n"
        "m = shapes_only(ModelConfig.preset('qkve-61m'))\n"
        "print(sum(p.numel() for p in m.parameters()), 'torch._dynamo' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert done.returncode == 0, done.stderr
    n, dynamo = done.stdout.split()
    assert int(n) > 60_000_000 and dynamo == "False"


def test_every_config_field_has_one_line_of_help() -> None:
    from attnlab.config import ModelConfig, TrainConfig
    from attnlab.field_help import ALIASES, MODEL_HELP, TRAIN_HELP

    assert list(MODEL_HELP) == ModelConfig.field_names()
    assert list(TRAIN_HELP) == TrainConfig.field_names()
    assert all(h and "\n" not in h for h in [*MODEL_HELP.values(), *TRAIN_HELP.values()])
    fields = set(MODEL_HELP) | set(TRAIN_HELP)
    assert set(ALIASES.values()) <= fields and not set(ALIASES) & fields


def test_presets_fields_lists_type_default_and_meaning(capsys: pytest.CaptureFixture) -> None:
    from attnlab.cli import main
    from attnlab.config import ModelConfig, TrainConfig
    from attnlab.field_help import MODEL_HELP, TRAIN_HELP

    assert main(["presets", "--fields"]) == 0
    rows = {
        line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line[:2] == "  "
    }
    assert set(rows) == set(MODEL_HELP) | set(TRAIN_HELP)
    assert rows["learning_rate"].split()[1:3] == ["float", str(TrainConfig().learning_rate)]
    assert rows["lr_decay_iters"].split()[1:5] == ["int", "or", "null", "null"]
    assert rows["bias"].split()[1:3] == ["bool", "true"]
    assert "(layernorm | rmsnorm)" in rows["norm"]
    assert rows["n_layer"].split()[2] == str(ModelConfig().n_layer)


def test_presets_print_recipes_that_parse_back(capsys: pytest.CaptureFixture) -> None:
    """Each preset's printed model/train lines are key=value pairs giving back the preset."""
    from attnlab.cli import main
    from attnlab.config import split_overrides
    from attnlab.presets import PRESETS

    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    blocks = out.strip().split("\n\n")
    assert len(blocks) == len(PRESETS)
    for block, (name, preset) in zip(blocks, PRESETS.items(), strict=True):
        head, model, train, data = block.splitlines()
        assert head == f"{name}: {preset.description}"
        assert split_overrides(model.split()[1:]) == (preset.model, {})
        assert split_overrides(train.split()[1:]) == ({}, preset.train)
        expected = " ".join(f"{k}={v}" for k, v in preset.data.items())
        assert data == f"  data:  {expected or 'the embedded corpus, char-level'}"
    assert main(["presets", "gba-lm-fair"]) == 0
    assert capsys.readouterr().out.startswith("gba-lm-fair: ")
