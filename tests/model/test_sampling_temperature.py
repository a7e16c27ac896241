"""Sampling at any finite temperature: the extremes draw from the limit distribution."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import run_cli, tiny_model
from test_chat import chat_tokenizer

from attnlab.model import GPT
from attnlab.model.generation import sample_next
from attnlab.train.checkpoint import save_checkpoint

LOGITS = torch.tensor([[0.0, 1.0, 1.0, -float("inf"), 0.5]])  # two tied maxima, one masked


@pytest.mark.parametrize("temperature", [1e-300, 5e-324, 1e-30, 1e-45])
def test_a_tiny_temperature_draws_only_the_largest_logits(temperature: float) -> None:
    """1e-300 rounds to 0 in float32 (0/0: NaN, "probability tensor contains either inf, nan
    or element < 0"): the limit is uniform over the tied maxima."""
    gen = torch.Generator().manual_seed(0)
    drawn = [int(sample_next(LOGITS, temperature, generator=gen)) for _ in range(200)]
    assert set(drawn) == {1, 2}
    assert 60 < drawn.count(1) < 140  # both maxima, about equally


@pytest.mark.parametrize("temperature", [1e300, 1.7e308])
def test_a_huge_temperature_draws_every_unmasked_token(temperature: float) -> None:
    """1e300 is inf in float32: a masked -inf / inf was NaN; the limit is uniform, mask kept."""
    gen = torch.Generator().manual_seed(0)
    drawn = [int(sample_next(LOGITS, temperature, generator=gen)) for _ in range(400)]
    assert set(drawn) == {0, 1, 2, 4}


def test_ordinary_temperatures_draw_as_before() -> None:
    """The float64 path is taken only where float32 overflows: a usual draw is unchanged."""
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(1))
    for temperature in (0.7, 1.0, 2.0):
        got = sample_next(logits, temperature, generator=torch.Generator().manual_seed(2))
        probs = (logits / temperature).softmax(-1)
        want = torch.multinomial(probs, 1, generator=torch.Generator().manual_seed(2))
        assert torch.equal(got, want)


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("chat") / "model"
    tok = chat_tokenizer()
    torch.manual_seed(0)
    save_checkpoint(folder, GPT(tiny_model(vocab_size=tok.vocab_size, block_size=32)), tok)
    return folder


@pytest.mark.parametrize("command", ["sample", "chat"])
def test_the_commands_sample_at_1e_300(chat_model: Path, command: str) -> None:
    extra = ["--max-new-tokens", "4"] + (["--prompt", "ab"] if command == "sample" else [])
    p = run_cli(command, str(chat_model), "--temperature", "1e-300", *extra, input="hi\n")
    assert p.returncode == 0, p.stderr
    assert "Traceback" not in p.stderr


def test_chat_says_when_a_long_message_was_cut(chat_model: Path) -> None:
    """A message longer than the context is answered from its last tokens: it says so."""
    p = run_cli("chat", str(chat_model), "--max-new-tokens", "4", input="ab " * 30_000 + "\n")
    assert p.returncode == 0, p.stderr
    (line,) = [ln for ln in p.stderr.splitlines() if ln.startswith("attnlab chat: ")]
    assert line == (  # the line is stripped: 30,000 "ab" and the spaces between them
        "attnlab chat: your message is 89,999 tokens, more than the 9 the context leaves it "
        "(32, 4 kept for the reply); the model reads only its last 9"
    )
