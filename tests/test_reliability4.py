"""Red team, round four: sampling a padded vocabulary, a figure of NaN losses, a file as RUN.

- a model whose vocab_size is padded above its tokenizer's (nanoGPT pads GPT-2's to 50304)
  draws only ids the tokenizer has, in stream, the name test's sampling and ``attnlab sample``;
- the paired-differences figure of a study whose only difference is NaN sets no identical
  x limits (matplotlib warned on stderr);
- every ``attnlab analyze`` sub-command refuses a plain file as its RUN first, writing nothing.
"""

from __future__ import annotations

import argparse
import math
import warnings
from pathlib import Path

import pytest
import torch
from conftest import run_cli, tiny_model
from test_bad_input import attnlab, error_line  # noqa: F401  (attnlab: a fixture)
from test_folder_safety import snapshot

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


def test_the_paired_figure_of_a_nan_difference_warns_of_nothing(tmp_path: Path) -> None:
    """One variant's final loss is NaN: the only difference is NaN, so the x range held 0 alone
    (set_xlim(0, 0) made matplotlib warn 'identical low and high xlims')."""
    from attnlab.studies.kinds.lm_report import plot_paired

    runs = [
        {"variant": "base", "seed": 0, "val_loss": 1.5, "status": "ok"},
        {"variant": "kv", "seed": 0, "val_loss": math.nan, "status": "ok"},
    ]
    comparison = {"variant": "kv", "baseline": "base", "seeds": [0], "n": 1,
                  "mean_diff": math.nan, "ci95": [math.nan, math.nan], "p": math.nan}  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fig = plot_paired({"runs": runs, "comparisons": [comparison]}, tmp_path / "p.png", "t")
    left, right = fig.axes[0].get_xlim()
    assert left < 0.0 < right and math.isfinite(left) and math.isfinite(right)


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
