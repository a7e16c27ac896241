"""`attnlab analyze gates|entropy|hull|attention` on a tiny boosted run, and their helpers."""

import csv
import math
from pathlib import Path

import pytest
import torch
from conftest import tiny_model, tiny_train

from attnlab.analysis.entropy import entropies
from attnlab.analysis.hull import hull_table
from attnlab.analysis.inputs import captured, evenly_spaced, validation_windows
from attnlab.cli import main
from attnlab.model.mechanisms.boost_gates import make_gate
from attnlab.model.mechanisms.boosted import attention_entropy
from attnlab.train.checkpoint import load_pretrained

L, H, E, T = 2, 4, 32, 32  # tiny_model


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, tiny_data: Path) -> dict[str, Path]:
    """A boosted (M=2) and a standard tiny run, trained once for the module."""
    from attnlab.train.trainer import Trainer

    root = tmp_path_factory.mktemp("gba_runs")
    for name, model in (("boosted", {"boost_rounds": 2}), ("standard", {})):
        Trainer(
            root / name, tiny_model(**model), tiny_train(max_iters=10), tiny_data, quiet=True
        ).run()
    return {"boosted": root / "boosted", "standard": root / "standard", "data": tiny_data}


def _read(path: Path) -> list[dict]:
    with path.open() as f:
        return list(csv.DictReader(f))


def _is_png(path: Path) -> bool:
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _boosted_inputs(runs, n: int = 4):
    from attnlab.data.prepare import load_dataset

    model, _ = load_pretrained(runs["boosted"])
    x, _ = validation_windows(load_dataset(runs["data"]).val, T, n)
    return model, x


def test_gates_per_layer_and_dimension(runs, tmp_path) -> None:
    assert (
        main(["analyze", "gates", str(runs["boosted"]), "--sequences", "4", "--out", str(tmp_path)])
        == 0
    )
    rows = _read(tmp_path / "gates.csv")
    assert len(rows) == L * 1 * E and _is_png(tmp_path / "gates.png")
    assert {r["gate"] for r in rows} == {"r1"}  # the one extra round's gate
    # reference: the captured per-token gates averaged by hand over all 4 windows at once
    model, x = _boosted_inputs(runs)
    capture: dict = {}
    with torch.no_grad():
        model(x, capture=capture)
    for layer in range(L):
        expected = capture[f"layer{layer}.r1.gate"].mean(dim=(0, 1))
        got = torch.tensor([float(r["mean"]) for r in rows if r["layer"] == str(layer)])
        assert torch.allclose(got, expected, atol=1e-6)


def test_gates_need_a_gate(runs, tmp_path, capsys) -> None:
    assert main(["analyze", "gates", str(runs["standard"]), "--out", str(tmp_path)]) == 2
    assert "needs a model with a gate (one of use_m_gate, value_gate, boost_rounds" in (
        capsys.readouterr().err
    )


def test_entropy_rounds_and_baseline(runs, tmp_path) -> None:
    args = [
        "analyze",
        "entropy",
        str(runs["boosted"]),
        "--baseline",
        str(runs["standard"]),
        "--sequences",
        "3",
        "--out",
        str(tmp_path),
    ]
    assert main(args) == 0
    rows = _read(tmp_path / "entropy.csv")
    assert [(r["source"], r["layer"]) for r in rows] == [
        (s, layer) for s in ("standard", "round0", "round1") for layer in ("0", "1", "all")
    ]
    assert all(int(r["n"]) == 3 * H * T * (L if r["layer"] == "all" else 1) for r in rows)
    # a row over t + 1 positions has entropy in [0, log(t + 1)]: the mean is below log(T)
    assert all(0.0 < float(r["mean"]) < math.log(T) for r in rows)
    assert _is_png(tmp_path / "entropy.png")


def test_entropy_of_uniform_causal_rows_is_log_t_plus_one() -> None:
    w = torch.ones(6, 6).tril()
    w = w / w.sum(-1, keepdim=True)
    expected = torch.log(torch.arange(1, 7, dtype=torch.float32))
    assert torch.allclose(attention_entropy(w), expected, atol=1e-6)
    one_hot = torch.eye(6)  # zeros contribute 0 (0 log 0 = 0), not nan
    assert torch.equal(attention_entropy(one_hot), torch.zeros(6))


def test_entropies_shape_matches_model(runs) -> None:
    model, x = _boosted_inputs(runs, 2)
    ent = entropies(model, x)
    assert ent.shape == (2, L, 2, H, T)
    assert (ent[..., 0] == 0).all()  # position 0 attends only to itself


def test_hull_table_and_cli(runs, tmp_path, capsys) -> None:
    capsys.readouterr()
    args = [
        "analyze",
        "hull",
        str(runs["boosted"]),
        "--sequences",
        "2",
        "--positions",
        "5",
        "--out",
        str(tmp_path),
    ]
    assert main(args) == 0
    assert capsys.readouterr().err == ""  # off a terminal no bar (it was carriage returns)
    rows = _read(tmp_path / "hull.csv")
    assert len(rows) == 2 * L * H * 5
    assert {int(r["position"]) for r in rows} == set(evenly_spaced(T, 5)) and _is_png(
        tmp_path / "hull.png"
    )
    assert max(float(r["distance"]) for r in rows) > 1e-3  # the trained extra round leaves the hull


def test_hull_distance_is_zero_when_the_gate_is_closed(runs) -> None:
    model, x = _boosted_inputs(runs, 2)
    for block in model.transformer.h:  # g = sigmoid(-inf) = 0 exactly: F is round 0's output
        gate = make_gate("scalar", E)
        gate.logit.data.fill_(-math.inf)
        block.attn.boost[0].gate = gate
    rows = hull_table(model, x, evenly_spaced(T, 6))
    assert len(rows) == 2 * L * H * 6
    assert max(r["distance"] for r in rows) < 1e-6


def test_attention_picks_tokens_the_baseline_gets_wrong(runs, tmp_path) -> None:
    args = [
        "analyze",
        "attention",
        str(runs["boosted"]),
        "--baseline",
        str(runs["standard"]),
        "--sequences",
        "3",
        "--top",
        "2",
        "--window",
        "8",
        "--out",
        str(tmp_path),
    ]
    assert main(args) == 0
    rows = _read(tmp_path / "attention.csv")
    tokens = sorted({(int(r["sequence"]), int(r["position"])) for r in rows})
    assert len(tokens) == 2 and _is_png(tmp_path / "attention.png")
    # reference: the biggest per-token loss gaps, computed here from the two models' logits
    from attnlab.data.prepare import load_dataset

    x, y = validation_windows(load_dataset(runs["data"]).val, T, 3)
    gaps = []
    for name in ("standard", "boosted"):
        model, _ = load_pretrained(runs[name])
        logits = torch.cat([lg for _, lg, _ in captured(model, x)])
        gaps.append(torch.nn.functional.cross_entropy(logits.transpose(1, 2), y, reduction="none"))
    first = 8 - 1  # queries with a full --window of context: never position 0
    best = (gaps[0] - gaps[1])[:, first:].flatten().topk(2).indices
    assert tokens == sorted((int(i) // (T - first), first + int(i) % (T - first)) for i in best)
    for seq, pos in tokens:
        for source in ("standard", "round0", "round1"):
            w = [
                float(r["weight"])
                for r in rows
                if (int(r["sequence"]), int(r["position"]), r["source"]) == (seq, pos, source)
            ]
            assert len(w) == min(8, pos + 1) and all(v >= 0 for v in w)


def test_attention_weights_of_given_tokens_are_distributions(runs, tmp_path) -> None:
    args = [
        "analyze",
        "attention",
        str(runs["boosted"]),
        "--tokens",
        "3,31",
        "--sequence",
        "1",
        "--sequences",
        "2",
        "--window",
        str(T),
        "--out",
        str(tmp_path),
    ]
    assert main(args) == 0
    rows = _read(tmp_path / "attention.csv")
    for pos in (3, 31):
        for source in ("round0", "round1"):
            w = [
                float(r["weight"])
                for r in rows
                if (r["position"], r["source"]) == (str(pos), source)
            ]
            assert len(w) == pos + 1 and math.isclose(sum(w), 1.0, abs_tol=1e-5)
