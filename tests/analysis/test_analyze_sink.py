"""`attnlab analyze sink`: the first token's attention mass against formulas and the captured weights."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch
from conftest import tiny_model

from attnlab.analysis.inputs import validation_windows
from attnlab.analysis.sink import FILES, first_token_mass, uniform_mass
from attnlab.cli import main
from attnlab.data.prepare import load_dataset
from attnlab.model import GPT
from attnlab.train.checkpoint import save_checkpoint


def _folder(tmp_path: Path, model: GPT, tiny_data: Path) -> Path:
    folder = tmp_path / "model"
    save_checkpoint(folder, model, load_dataset(tiny_data).tokenizer)
    return folder


def _model(tiny_data: Path, **overrides) -> GPT:
    torch.manual_seed(0)
    vocab = load_dataset(tiny_data).tokenizer.vocab_size
    return GPT(tiny_model(vocab_size=vocab, **overrides)).eval()


def test_uniform_attention_gives_the_harmonic_mass(tiny_data: Path, tmp_path: Path) -> None:
    """Zero query and key projections make every score equal, so query t gives the first token
    exactly 1 / (t + 1): the mean over t = 1..T-1 in every layer and head (RoPE rotates zeros)."""
    model = _model(tiny_data, pos="rope")
    with torch.no_grad():
        for block in model.transformer.h:
            block.attn.c_attn.weight[: 2 * model.config.n_embd].zero_()  # q, then k (no GQA)
    t = model.config.block_size
    assert uniform_mass(t) == pytest.approx(sum(1 / (q + 1) for q in range(1, t)) / (t - 1))
    out = tmp_path / "out"
    folder = _folder(tmp_path, model, tiny_data)
    args = ["analyze", "sink", str(folder), "--data", str(tiny_data), "--sequences", "3"]
    assert main([*args, "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == sorted(FILES)
    with (out / "sink.csv").open() as f:
        rows = list(csv.DictReader(f))
    cfg = model.config
    assert [(int(r["layer"]), int(r["head"])) for r in rows] == [
        (layer, head) for layer in range(cfg.n_layer) for head in range(cfg.n_head)
    ]
    for r in rows:
        assert float(r["first_token_mass"]) == pytest.approx(uniform_mass(t), abs=1e-6)
    assert (out / "sink.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_mass_is_the_mean_of_the_captured_weights(tiny_data: Path) -> None:
    """Over more windows than one capture batch (8), the mass equals the mean weight on key 0
    of the model's own softmax rows, queries 1..T-1, per layer and head."""
    model = _model(tiny_data)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)  # far from uniform
    x, _ = validation_windows(load_dataset(tiny_data).val, model.config.block_size, 11)
    capture: dict = {}
    with torch.no_grad():
        model(x, capture=capture)
    mass = first_token_mass(model, x)
    for layer in range(model.config.n_layer):
        w = capture[f"layer{layer}.r0.weights"].double()
        expected = w[:, :, 1:, 0].mean(dim=(0, 2)).numpy()
        assert mass[layer] == pytest.approx(expected, abs=1e-9)
    assert abs(float(mass.mean()) - uniform_mass(x.size(1))) > 1e-3  # not uniform by accident


def test_sink_replaces_only_its_own_files(tiny_data: Path, tmp_path: Path) -> None:
    """A sink.csv of the user's in --out is refused and kept; its own files are replaced."""
    folder = _folder(tmp_path, _model(tiny_data), tiny_data)
    args = ["analyze", "sink", str(folder), "--data", str(tiny_data), "--sequences", "1"]
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / ".attnlab-analysis").write_text("gates.csv\n")  # an analysis folder, not of sink.csv
    (mine / "sink.csv").write_text("layer,mine\n0,1\n")
    assert main([*args, "--out", str(mine)]) != 0
    assert (mine / "sink.csv").read_text() == "layer,mine\n0,1\n"
    out = tmp_path / "out"
    for _ in range(2):
        assert main([*args, "--out", str(out)]) == 0
    assert (out / ".attnlab-analysis").read_text().splitlines() == ["sink.csv"]
