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
