"""`attnlab analyze gates` on every gate a mechanism declares: statistics recomputed by hand."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch
from conftest import tiny_model

from attnlab.analysis.gates import FILES, SPARSE_BELOW, plot_gates
from attnlab.analysis.inputs import validation_windows
from attnlab.cli import main
from attnlab.data.prepare import load_dataset
from attnlab.model import GPT, mechanisms
from attnlab.train.checkpoint import save_checkpoint

# every mechanism that declares a gate, turned on by its own example
GATED = [spec for spec in mechanisms.specs() if spec.gates]


def _read(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def gated_folder(tmp_path_factory: pytest.TempPathFactory, tiny_data: Path) -> tuple[Path, GPT]:
    """A model folder with every gated mechanism on, its weights spread (std 0.3) so that the
    scores fill their ranges."""
    dataset = load_dataset(tiny_data)
    examples = {k: v for spec in GATED for k, v in spec.example.items()}
    torch.manual_seed(0)
    model = GPT(tiny_model(vocab_size=dataset.tokenizer.vocab_size, **examples)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    folder = tmp_path_factory.mktemp("gated") / "model"
    save_checkpoint(folder, model, dataset.tokenizer)
    return folder, model


def test_every_declared_gate_is_analysed(gated_folder, tiny_data: Path, tmp_path: Path) -> None:
    """Per gate and layer, the summary's mean, std and fraction below 0.1 equal those of the
    captured scores over the same windows; every mechanism's gate is there."""
    folder, model = gated_folder
    out = tmp_path / "out"
    args = ["analyze", "gates", str(folder), "--data", str(tiny_data), "--sequences", "2"]
    assert main([*args, "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == sorted(FILES)
    x, _ = validation_windows(load_dataset(tiny_data).val, model.config.block_size, 2)
    capture: dict = {}
    with torch.no_grad():
        model(x, capture=capture)
    summary = _read(out / "gate_summary.csv")
    names = {r["gate"] for r in summary}
    # one name per declared gate ("r{m}" is r1 at boost_rounds 2)
    assert len(names) == sum(len(spec.gates) for spec in GATED)
    for row in summary:
        g = capture[f"layer{row['layer']}.{row['gate']}.gate"].double()
        assert float(row["mean"]) == pytest.approx(g.mean().item(), abs=1e-9)
        assert float(row["std"]) == pytest.approx(g.std(correction=0).item(), abs=1e-9)
        below = (g < SPARSE_BELOW).double().mean().item()
        assert float(row[f"below_{SPARSE_BELOW}"]) == pytest.approx(below, abs=1e-12)
    # K/V-bias's last block computes no M (none reads it): its gate is in every other layer
    layers = {r["layer"] for r in summary if r["gate"] == "m_gate"}
    assert layers == {str(i) for i in range(model.config.n_layer - 1)}
    channels = {r["gate"]: int(r["dim"]) + 1 for r in _read(out / "gates.csv") if r["layer"] == "0"}
    assert channels["value_gate"] == model.config.kv_dim
    assert channels["output_gate"] == model.config.n_embd


def test_gates_figure_has_a_row_per_gate(gated_folder, tiny_data: Path, tmp_path: Path) -> None:
    from attnlab.analysis.gates import gate_stats

    _, model = gated_folder
    x, _ = validation_windows(load_dataset(tiny_data).val, model.config.block_size, 1)
    stats = gate_stats(model, x)
    fig = plot_gates(stats, tmp_path / "g.png", "gated")
    assert (tmp_path / "g.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(fig.axes) == 2 * len(stats)
    for g, ax in zip(stats.values(), fig.axes[::2], strict=True):
        assert ax.get_xlim() == (g.low, g.high) and g.name in ax.get_title()
        assert g.hist.sum(axis=1).tolist() == pytest.approx([1.0] * len(g.layers))  # in range
