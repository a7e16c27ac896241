"""A model whose vocab_size is padded above its tokenizer's (nanoGPT pads GPT-2's to 50304) draws
only ids the tokenizer has: in ``generate`` and ``stream``, the name test's sampling and
``attnlab sample``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import run_cli, tiny_model

from attnlab.data.prepare import load_dataset
from attnlab.data.tokenizer import Tokenizer
from attnlab.errors import ConfigError
from attnlab.model.generation import generate, stream
from attnlab.model.gpt import GPT

ROWS = 128  # the padded model's vocab_size, above any tiny_data tokenizer's


def padded_model(vocab: int, rows: int = ROWS) -> GPT:
    """A model of ``rows`` embedding rows whose ids >= ``vocab`` (the padding) would always win:
    ln_f gives every position all ones, and only lm_head's padded rows sum to much (n_embd)."""
    torch.manual_seed(0)
    model = GPT(tiny_model(vocab_size=rows, bias=True, tie_embeddings=False))
    with torch.no_grad():
        model.transformer.ln_f.weight.zero_()
        model.transformer.ln_f.bias.fill_(1.0)
        model.lm_head.weight[:vocab].normal_(0.0, 0.01)
        model.lm_head.weight[vocab:] = 1.0
    return model.eval()


@pytest.fixture
def tokenizer(tiny_data: Path) -> Tokenizer:
    return load_dataset(tiny_data).tokenizer


@pytest.mark.parametrize(
    "opts",
    [
        {"temperature": 1.0},
        {"temperature": 0.0},  # greedy: argmax over the allowed ids only
        {"temperature": 0.8, "top_k": 1},  # the mask comes before top-k
        {"temperature": 2.0, "top_p": 0.5},
        {"temperature": 1.0, "use_cache": False},
    ],
    ids=lambda opts: ",".join(f"{k}={v}" for k, v in opts.items()),
)
def test_a_padded_vocabulary_samples_only_the_tokenizers_ids(tokenizer: Tokenizer, opts) -> None:
    vocab = tokenizer.vocab_size
    model = padded_model(vocab)
    idx = torch.tensor([tokenizer.encode("KING")] * 3)
    unlimited = generate(model, idx, 8, generator=torch.Generator().manual_seed(0), **opts)
    assert int(unlimited[:, idx.size(1) :].min()) >= vocab  # what the padding made of sampling
    gen = torch.Generator().manual_seed(0)
    out = generate(model, idx, 40, generator=gen, vocab_limit=vocab, **opts)
    new = out[:, idx.size(1) :]
    assert new.shape == (3, 40) and int(new.max()) < vocab
    tokenizer.decode(out[0].tolist())  # decodes: no id out of range
    if "top_k" in opts or opts["temperature"] == 0.0:  # the best allowed id, every step
        last = model(out[:, :-1][:, -model.config.block_size :])[0][:, -1, :vocab]
        assert out[:, -1].tolist() == last.argmax(-1).tolist()


def test_a_limit_at_or_above_the_models_rows_changes_no_draw(tokenizer: Tokenizer) -> None:
    model = padded_model(tokenizer.vocab_size, rows=tokenizer.vocab_size)  # no padding
    idx = torch.tensor([tokenizer.encode("KING")])
    draws = [
        generate(model, idx, 30, generator=torch.Generator().manual_seed(1), vocab_limit=limit)
        for limit in (None, tokenizer.vocab_size, ROWS)
    ]
    assert draws[0].tolist() == draws[1].tolist() == draws[2].tolist()


@pytest.mark.parametrize("limit", [0, -3, 2.5])
def test_a_vocab_limit_that_allows_no_id_is_refused(limit) -> None:
    model = padded_model(16, rows=32)
    with pytest.raises(ConfigError, match=rf"^vocab_limit={limit!r} must be an integer >= 1$"):
        next(stream(model, torch.zeros((1, 1), dtype=torch.long), 1, vocab_limit=limit))


def test_the_name_test_samples_a_padded_vocabulary(tokenizer: Tokenizer) -> None:
    from attnlab.analysis.names import sample_texts

    texts = sample_texts(padded_model(tokenizer.vocab_size), tokenizer, 2, 70, seed=0)
    assert [len(t) for t in texts] == [71, 71]  # the prompt's newline and 70 characters


def test_cli_sample_of_a_padded_vocabulary_exits_0(tokenizer: Tokenizer, tmp_path: Path) -> None:
    from attnlab.train.checkpoint import save_checkpoint

    folder = save_checkpoint(tmp_path / "model", padded_model(tokenizer.vocab_size), tokenizer)
    p = run_cli("sample", str(folder), "--prompt", "KING", "--max-new-tokens", "20")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("KING") and len(p.stdout) == len("KING") + 20 + 1, p.stdout
