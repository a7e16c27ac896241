"""Synthetic retrieval: analytic baselines, trained models, determinism and the CLI."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnlab.analysis.retrieval import (
    Converged,
    bayes_accuracy,
    check_memory,
    draw_queries,
    make_patterns,
    memory_needed,
    retrieval_loss,
    run_retrieval,
    sample_queries,
)
from attnlab.errors import AttnlabError

REPO = Path(__file__).resolve().parents[2]


def test_bayes_matches_paper_ceiling() -> None:
    # The ceiling depends on the drawn pattern set; average a few to compare with 80.7.
    accs = []
    for seed in range(4):
        patterns = make_patterns(4, 16, torch.Generator().manual_seed(seed))
        labels, noise = draw_queries(patterns, 50_000, torch.Generator().manual_seed(99))
        accs.append(bayes_accuracy(patterns, labels, noise, 0.5))
    assert sum(accs) / len(accs) == pytest.approx(80.7, abs=2.5)


@pytest.mark.parametrize("sigma", [1e-20, 1e-300, 0.5, 3.0, 1e200, 1e308])
def test_bayes_accuracy_is_the_two_pattern_closed_form_at_any_sigma(sigma) -> None:
    # Two patterns: the optimal rule errs when the noise along their difference passes
    # the midpoint, so the accuracy is Phi(|p0 - p1| / (2 sigma)). A tiny sigma once
    # overflowed 1 / sigma^2 (NaN posteriors, below chance) and a huge one raised.
    patterns = make_patterns(2, 8, torch.Generator().manual_seed(0))
    labels, noise = draw_queries(patterns, 20_000, torch.Generator().manual_seed(1))
    z = (patterns[0] - patterns[1]).norm().item() / (2 * sigma)
    expected = 50.0 * (1 + math.erf(z / math.sqrt(2)))
    assert bayes_accuracy(patterns, labels, noise, sigma) == pytest.approx(expected, abs=1.0)


@pytest.mark.parametrize("protocol", ["released", "attnlab"])
def test_bayes_is_perfect_at_tiny_sigma_and_chance_at_huge(protocol) -> None:
    kwargs = {"queries": 4000, "protocol": protocol}
    assert run_retrieval(8, 4, 1e-20, ["bayes"], **kwargs) == {"bayes": 100.0}
    assert run_retrieval(8, 4, 1e200, ["bayes"], **kwargs)["bayes"] == pytest.approx(25, abs=2.5)


def test_random_is_one_over_k() -> None:
    assert run_retrieval(8, 5, 0.5, ["random"]) == {"random": 20.0}


def test_one_step_beats_chance_and_converged_collapses() -> None:
    methods = ["random", "bayes", "one-step", "converged-backprop"]
    r = run_retrieval(16, 4, 0.5, methods, queries=2000, steps=100)
    assert r["one-step"] > r["random"] + 30
    assert r["one-step"] <= r["bayes"] + 3
    assert r["converged-backprop"] < r["random"] + 10


def test_boosted_with_one_round_is_one_step() -> None:
    kwargs = {"queries": 500, "steps": 10}
    one = run_retrieval(8, 4, 0.5, ["one-step"], **kwargs)["one-step"]
    assert run_retrieval(8, 4, 0.5, ["boosted"], rounds=1, **kwargs)["boosted"] == one


def test_deterministic_for_a_seed() -> None:
    kwargs = {"methods": ["bayes", "boosted", "converged-deq"], "queries": 500, "steps": 10}
    a = run_retrieval(8, 4, 0.5, seed=3, **kwargs)
    assert a == run_retrieval(8, 4, 0.5, seed=3, **kwargs)
    assert a != run_retrieval(8, 4, 0.5, seed=4, **kwargs)


def test_deq_implicit_gradient_matches_backprop_at_a_contraction() -> None:
    # At initialisation the update is a strong contraction, so 20 unrolled steps reach the
    # fixed point and the implicit gradient must equal the unrolled one.
    patterns = make_patterns(4, 8, torch.Generator().manual_seed(0))
    q, labels = sample_queries(patterns, 64, 0.5, torch.Generator().manual_seed(1))
    grads = []
    for deq in (False, True):
        torch.manual_seed(0)
        model = Converged(8, deq=deq)
        out, _ = model(q, patterns)
        ((out - patterns[labels]) ** 2).sum().backward()
        grads.append(model.step.W_v.weight.grad.clone())
    assert torch.allclose(grads[0], grads[1], rtol=1e-4, atol=1e-7)


# Accuracies printed by the authors' released code (salehsargolzaee/boosted-attention at
# 2d52967, experiments/exp_ablations.py: torch.manual_seed(SEED), the patterns, then
# train_and_eval(StandardAttention) and train_and_eval(BoostedAttention(n_rounds=3,
# gate_type="scalar")) with epochs=100, n_val=500), run on this CPU.
RELEASED_REFERENCE = [
    ((8, 4, 0.5, 0), {"one-step": 37.8, "boosted": 74.6}),
    ((16, 4, 0.8, 1), {"one-step": 55.8, "boosted": 60.2}),
]


@pytest.mark.parametrize(("setting", "expected"), RELEASED_REFERENCE)
def test_released_protocol_reproduces_the_authors_code(setting, expected) -> None:
    d, k, sigma, seed = setting
    state = torch.random.get_rng_state()
    got = run_retrieval(
        d,
        k,
        sigma,
        ["one-step", "boosted"],
        rounds=3,
        gate="scalar",
        steps=100,
        queries=500,
        seed=seed,
        protocol="released",
    )
    assert got == pytest.approx(expected, abs=1e-9)
    assert torch.equal(torch.random.get_rng_state(), state)  # the caller's stream is untouched


def test_losses_by_formula() -> None:
    torch.manual_seed(0)
    out, targets, logits = torch.randn(6, 4), torch.randn(6, 4), torch.randn(6, 3)
    labels = torch.tensor([0, 1, 2, 0, 1, 2])
    cos = (1 - torch.nn.functional.cosine_similarity(out, targets, dim=-1)).mean()
    ce = torch.nn.functional.cross_entropy
    expected = {
        "cos": cos,
        "cos-ce": cos + 0.5 * ce(logits, labels),
        "cos-ce-weights": cos + 0.5 * ce(torch.softmax(logits, -1), labels),
        "mse": ((out - targets) ** 2).mean(),
    }
    for name, value in expected.items():
        assert torch.allclose(retrieval_loss(out, logits, targets, labels, name), value), name


def test_attnlab_protocol_scores_every_method_on_one_eval_set() -> None:
    kwargs = {"queries": 400, "steps": 10, "protocol": "attnlab"}
    one = run_retrieval(8, 4, 0.5, ["one-step"], **kwargs)["one-step"]
    both = run_retrieval(8, 4, 0.5, ["boosted", "one-step"], rounds=1, **kwargs)
    assert both == {"boosted": one, "one-step": one}  # same init, batches and eval queries


def _cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "attnlab", "retrieval", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def test_cli_json() -> None:
    proc = _cli(
        "--d",
        "8",
        "--patterns",
        "4",
        "--methods",
        "random,bayes,one-step",
        "--queries",
        "300",
        "--steps",
        "5",
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert set(out["accuracy"]) == {"random", "bayes", "one-step"}
    assert out["accuracy"]["random"] == 25.0
    assert out["settings"] == {
        "d": 8,
        "patterns": 4,
        "sigma": 0.5,
        "methods": ["random", "bayes", "one-step"],
        "rounds": 2,
        "gate": "mlp",
        "protocol": "released",
        "loss": {"one-step": "cos-ce-weights"},
        "queries": 300,
        "steps": 5,
        "seed": 0,
    }


def test_cli_bad_method_is_one_clean_line() -> None:
    proc = _cli("--methods", "random,oracle")
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert "oracle" in lines[0] and "one-step" in lines[0]


def test_memory_needed_by_formula() -> None:
    d, k, q = 10, 3, 100
    # patterns 30; attnlab's eval set 1000 held; one-step: 300 weights, training
    # 4 * 300 + 512 * 13 = 7856 against scoring 300 + 100 * 13 = 1600
    assert memory_needed(d, k, ["random", "one-step"], 2, q, "attnlab") == 4 * (30 + 1000 + 7856)
    # released: no eval set held; bayes 1000 + 300; boosted's 2 rounds: 4 * 600 + 6656
    assert memory_needed(d, k, ["bayes", "boosted"], 2, q, "released") == 4 * (30 + 9056)
    assert memory_needed(d, k, ["random"], 2, q, "released") == 4 * 30  # draws no queries
    # bayes draws its own noise beside attnlab's eval set: 1000 + 300 on top of 30 + 1000
    assert memory_needed(d, k, ["bayes"], 2, q, "attnlab") == 4 * (30 + 1000 + 1300)
    # a large query set: scoring (weights, query set, outputs, logits) is the peak
    assert memory_needed(d, k, ["one-step"], 2, 10**6, "released") == 4 * (
        30 + 300 + 10**7 + 10**6 * 13
    )


def test_check_memory_refuses_only_past_the_machine(monkeypatch) -> None:
    args = (64, 16, ["bayes", "boosted"], 2, 5000, "released")
    need = memory_needed(*args)
    monkeypatch.setattr("attnlab.analysis.retrieval.device_memory", lambda device: need)
    check_memory(*args)
    monkeypatch.setattr("attnlab.analysis.retrieval.device_memory", lambda device: need - 1)
    with pytest.raises(AttnlabError, match=r"d=64, patterns=16, queries=5,000, rounds=2 needs"):
        check_memory(*args)
    with pytest.raises(AttnlabError, match="needs at least"):  # refused before any drawing
        run_retrieval(*args[:2], 0.5, args[2], queries=5000)


@pytest.mark.parametrize(
    ("flags", "sizes"),
    [
        (["--d", "100000000"], "d=100,000,000, patterns=16, queries=5,000, rounds=2"),
        (["--queries", "10000000000"], "d=64, patterns=16, queries=10,000,000,000, rounds=2"),
        (["--patterns", "10000000000", "--methods", "random"], "patterns=10,000,000,000, q"),
    ],
)
def test_cli_sizes_too_large_for_memory_are_one_line(tmp_path, flags, sizes) -> None:
    proc = _cli(*flags, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert sizes in lines[0] and "needs at least" in lines[0] and "make them smaller" in lines[0]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_table2_smallest_setting_in_shape() -> None:
    r = run_retrieval(16, 4, 0.5, ["random", "bayes", "one-step", "converged-deq", "boosted"])
    assert r["converged-deq"] < r["random"] + 5
    assert r["random"] + 40 < r["one-step"] <= r["bayes"] + 2
    assert r["boosted"] > r["one-step"] - 2
