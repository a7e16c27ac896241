"""Synthetic pattern retrieval (Table 2, 5 and 6 of the gradient-boosted attention paper).

K unit-norm patterns are stored; a query is pattern i plus Gaussian noise; keys = values =
patterns. A method is scored by whether the pattern nearest (Euclidean) to its output is i.

Model choices (kept minimal and faithful to the paper and its released experiments):
each attention step has its own bias-free ``W_q, W_k: d -> d`` and ``W_v: d -> d`` and a
learnable ``beta = exp(log_beta)`` starting at 2; there is no output projection, because the
output is compared with the patterns directly in input space. Adam 3e-3 with a cosine schedule,
gradient clipping at 1.0, fresh batches of 512 each step.

Two training protocols:

- ``released`` (the default): the authors' released experiment scripts. One global random
  stream, seeded once per cell (``42 + seed``), draws the patterns, every model's initial
  weights, the training batches and the evaluation queries, in that order, methods one after
  another. The loss is ``(1 - cos) + 0.5 * CE`` where the cross-entropy is applied to the
  softmax *weights* of the step that reads the query, as if they were logits (converged
  variants: the cosine term alone). Every 50 steps the model is scored on fresh queries and the
  best state kept; the reported accuracy is the larger of that best score and a last score of
  the kept state on fresh queries, so it selects on evaluation draws.
- ``attnlab``: independent streams per seed for patterns, training batches and evaluation
  queries (every method sees the same ones), one fixed evaluation set scored once after
  training, and a choice of loss: ``cos-ce`` (cross-entropy on the logits) or ``mse`` to the
  target pattern.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator, Sequence

import torch
import torch.nn.functional as Fn
from torch import Tensor, nn

from attnlab.analysis.retrieval_options import DEFAULTS, LOSSES, METHODS, PROTOCOLS, UNTRAINED
from attnlab.config import check_seed
from attnlab.errors import AttnlabError
from attnlab.model.mechanisms.boost_gates import GATE_KINDS, make_gate
from attnlab.model.memory import FLOAT_BYTES, device_memory, gib

CONVERGED_STEPS = 20
BETA_INIT = 2.0
LR = 3e-3
BATCH = 512
CE_WEIGHT = 0.5
GRAD_CLIP = 1.0
# Adjoint fixed-point iteration of the DEQ backward pass.
ADJOINT_MAX_ITER = 30
ADJOINT_TOL = 1e-6
# Independent random streams per seed, so every method sees the same patterns, the same
# training batches and the same evaluation queries.
PATTERN_STREAM, TRAIN_STREAM, EVAL_STREAM = 0, 1, 2
# The released scripts: torch.manual_seed(42) before the patterns; evaluation every 50 steps.
RELEASED_SEED = 42
RELEASED_EVAL_EVERY = 50


def _generator(seed: int, stream: int) -> torch.Generator:
    return torch.Generator().manual_seed(1000 * seed + stream)


def make_patterns(patterns: int, d: int, generator: torch.Generator | None) -> Tensor:
    """``patterns`` stored patterns ``normalize(randn(K, d))``."""
    return Fn.normalize(torch.randn(patterns, d, generator=generator), dim=-1)


def draw_queries(
    patterns: Tensor, n: int, generator: torch.Generator | None
) -> tuple[Tensor, Tensor]:
    """Labels i of ``n`` queries and their unit Gaussian noise (labels drawn first)."""
    labels = torch.randint(patterns.shape[0], (n,), generator=generator)
    return labels, torch.randn(n, patterns.shape[1], generator=generator)


def sample_queries(
    patterns: Tensor, n: int, sigma: float, generator: torch.Generator | None
) -> tuple[Tensor, Tensor]:
    """``n`` noisy queries (pattern i + sigma * N(0, I)) and their labels i (labels drawn first)."""
    labels, noise = draw_queries(patterns, n, generator)
    return patterns[labels] + sigma * noise, labels


def nearest_pattern_accuracy(outputs: Tensor, patterns: Tensor, labels: Tensor) -> float:
    """Percentage of outputs whose nearest pattern (Euclidean) is the true one."""
    nearest = torch.cdist(outputs, patterns).argmin(dim=-1)
    return 100.0 * (nearest == labels).double().mean().item()


def bayes_accuracy(patterns: Tensor, labels: Tensor, noise: Tensor, sigma: float) -> float:
    """Accuracy of the Bayes-optimal classifier on the queries ``patterns[labels] + sigma * noise``.

    With equal-norm patterns and a uniform prior the posterior over i is
    softmax(patterns . query / sigma^2), i.e. one attention step with identity projections and
    beta = 1 / sigma^2. Only its argmax is needed, and that is the argmax of the scores
    patterns . query times any positive number, so the posterior is never formed (1 / sigma^2
    overflows for a tiny sigma) and the query is taken divided by max(1, sigma) (sigma * noise
    overflows for a huge one): a tiny sigma scores 100%, a huge one chance.
    """
    scale = max(1.0, sigma)
    queries = patterns[labels] / scale + (sigma / scale) * noise
    decision = (queries @ patterns.T).argmax(dim=-1)
    return 100.0 * (decision == labels).double().mean().item()


class AttentionStep(nn.Module):
    """One retrieval step ``softmax(beta * (W_q z).(W_k P)) @ (W_v P)`` over the patterns P."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.W_q = nn.Linear(d, d, bias=False)
        self.W_k = nn.Linear(d, d, bias=False)
        self.W_v = nn.Linear(d, d, bias=False)
        self.log_beta = nn.Parameter(torch.tensor(math.log(BETA_INIT)))

    def logits(self, z: Tensor, patterns: Tensor) -> Tensor:
        return self.log_beta.exp() * self.W_q(z) @ self.W_k(patterns).T

    def forward(self, z: Tensor, patterns: Tensor) -> tuple[Tensor, Tensor]:
        logits = self.logits(z, patterns)
        return torch.softmax(logits, dim=-1) @ self.W_v(patterns), logits


class OneStep(nn.Module):
    """Standard attention: a single step from the query."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.step = AttentionStep(d)

    def forward(self, q: Tensor, patterns: Tensor) -> tuple[Tensor, Tensor]:
        return self.step(q, patterns)


class Converged(nn.Module):
    """The update ``z <- attn(z)`` iterated CONVERGED_STEPS times from the query.

    ``deq=False`` backpropagates through the whole loop. ``deq=True`` runs all but the last
    step without a graph and differentiates implicitly at the (approximate) fixed point:
    the gradient into the last step's output is replaced by the adjoint solution
    ``u = grad + J^T u`` (J = d step / d z), found by fixed-point iteration.
    Both compute the same forward function; only their gradients differ.
    """

    def __init__(self, d: int, deq: bool) -> None:
        super().__init__()
        self.step = AttentionStep(d)
        self.deq = deq

    def forward(self, q: Tensor, patterns: Tensor) -> tuple[Tensor, Tensor]:
        z = q
        if self.deq:
            with torch.no_grad():
                for _ in range(CONVERGED_STEPS - 1):
                    z, _ = self.step(z, patterns)
            z, _ = self.step(z, patterns)
            if z.requires_grad:
                self._attach_implicit_gradient(z, patterns)
        else:
            for _ in range(CONVERGED_STEPS):
                z, _ = self.step(z, patterns)
        return z, self.step.logits(z, patterns)

    def _attach_implicit_gradient(self, z: Tensor, patterns: Tensor) -> None:
        z0 = z.detach().requires_grad_()
        f0, _ = self.step(z0, patterns)

        def adjoint(grad: Tensor) -> Tensor:
            u = grad
            for _ in range(ADJOINT_MAX_ITER):
                vjp = torch.autograd.grad(f0, z0, u, retain_graph=True)[0]
                u_next = grad + vjp
                done = (u_next - u).norm() <= ADJOINT_TOL * (u_next.norm() + 1e-12)
                u = u_next
                if done:
                    break
            return u

        z.register_hook(adjoint)


class BoostedRetrieval(nn.Module):
    """Gradient-boosted attention over the patterns with M rounds (M=1 is one-step).

    Round 0: ``F = Attn_0(q)``; round m >= 1: ``r = q - F``, ``c = Attn_m(r)`` (own
    projections, keys/values still the patterns), ``F = F + gate_m(F, c, H0) * c`` where H0 is
    the entropy of the round-0 attention weights.
    """

    def __init__(self, d: int, rounds: int, gate: str) -> None:
        super().__init__()
        self.rounds = nn.ModuleList(AttentionStep(d) for _ in range(rounds))
        self.gates = nn.ModuleList(make_gate(gate, d) for _ in range(rounds - 1))

    def forward(self, q: Tensor, patterns: Tensor) -> tuple[Tensor, Tensor]:
        F, logits0 = self.rounds[0](q, patterns)
        entropy = -(torch.softmax(logits0, -1) * torch.log_softmax(logits0, -1)).sum(-1)
        for attn, gate in zip(self.rounds[1:], self.gates, strict=True):
            c, _ = attn(q - F, patterns)
            F = F + gate(F, c, entropy) * c
        return F, logits0


def retrieval_loss(
    out: Tensor, logits: Tensor, targets: Tensor, labels: Tensor, loss: str
) -> Tensor:
    """The training loss named ``loss`` (see LOSSES).

    ``cos-ce``: ``(1 - cos) + 0.5 * CE(logits)``; ``cos-ce-weights``: the released scripts'
    variant, the cross-entropy taken of the softmax weights as if they were logits; ``cos``:
    the cosine term alone (the released converged baseline); ``mse``: MSE to the target.
    """
    if loss == "mse":
        return Fn.mse_loss(out, targets)
    cos_term = (1 - Fn.cosine_similarity(out, targets, dim=-1)).mean()
    if loss == "cos":
        return cos_term
    scores = torch.softmax(logits, dim=-1) if loss == "cos-ce-weights" else logits
    return cos_term + CE_WEIGHT * Fn.cross_entropy(scores, labels)


def train(
    model: nn.Module,
    patterns: Tensor,
    sigma: float,
    steps: int,
    generator: torch.Generator,
    loss: str = "cos-ce",
) -> nn.Module:
    """Fit ``model`` on ``steps`` fresh batches of noisy queries (the attnlab protocol)."""
    for _ in _training_steps(model, patterns, sigma, steps, generator, loss):
        pass
    return model.eval()


def _training_steps(
    model: nn.Module,
    patterns: Tensor,
    sigma: float,
    steps: int,
    generator: torch.Generator | None,
    loss: str,
) -> Iterator[int]:
    """Adam + cosine schedule + clipping on fresh batches; yields after each step (1-based)."""
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
    for step in range(1, steps + 1):
        model.train()
        queries, labels = sample_queries(patterns, BATCH, sigma, generator)
        out, logits = model(queries, patterns)
        opt.zero_grad()
        retrieval_loss(out, logits, patterns[labels], labels, loss).backward()
        nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
        opt.step()
        sched.step()
        yield step


def train_released(
    model: nn.Module, patterns: Tensor, sigma: float, steps: int, loss: str, queries: int
) -> float:
    """The released scripts' loop on the global random stream; returns the accuracy they report.

    Every RELEASED_EVAL_EVERY steps the model is scored on ``queries`` fresh queries and the best
    state kept; the result is max(best score, a last score of the kept state on fresh queries).
    """
    best, best_state = 0.0, None
    for step in _training_steps(model, patterns, sigma, steps, None, loss):
        if step % RELEASED_EVAL_EVERY == 0:
            acc = _score_fresh(model, patterns, sigma, queries)
            if acc > best:
                best, best_state = acc, copy.deepcopy(model.state_dict())
    if best_state is not None:
        model.load_state_dict(best_state)
    return max(best, _score_fresh(model, patterns, sigma, queries))


@torch.no_grad()
def _score_fresh(model: nn.Module, patterns: Tensor, sigma: float, n: int) -> float:
    model.eval()
    q, labels = sample_queries(patterns, n, sigma, None)
    out, _ = model(q, patterns)
    return nearest_pattern_accuracy(out, patterns, labels)


def _build(method: str, d: int, rounds: int, gate: str) -> nn.Module:
    if method == "one-step":
        return OneStep(d)
    if method == "converged-backprop":
        return Converged(d, deq=False)
    if method == "converged-deq":
        return Converged(d, deq=True)
    return BoostedRetrieval(d, rounds, gate)


def run_retrieval(
    d: int,
    patterns: int,
    sigma: float,
    methods: Sequence[str],
    rounds: int = DEFAULTS["rounds"],
    gate: str = DEFAULTS["gate"],
    queries: int = DEFAULTS["queries"],
    steps: int = DEFAULTS["steps"],
    seed: int = 0,
    loss: str | None = None,
    protocol: str = DEFAULTS["protocol"],
) -> dict[str, float]:
    """Accuracy (%) of each method under ``protocol`` (see the module docstring).

    ``loss`` None means the protocol's own: the released scripts' ``cos-ce-weights`` (``cos``
    for the converged variants), or ``cos-ce`` under the attnlab protocol.
    """
    if not methods:
        raise AttnlabError(f"no methods given; choose from {', '.join(METHODS)}")
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise AttnlabError(f"unknown method {unknown[0]!r}; allowed: {', '.join(METHODS)}")
    if gate not in GATE_KINDS:
        raise AttnlabError(f"unknown gate {gate!r}; allowed: {', '.join(GATE_KINDS)}")
    if loss is not None and loss not in LOSSES:
        raise AttnlabError(f"unknown loss {loss!r}; allowed: {', '.join(LOSSES)}")
    if protocol not in PROTOCOLS:
        raise AttnlabError(f"unknown protocol {protocol!r}; allowed: {', '.join(PROTOCOLS)}")
    if d < 1 or patterns < 2 or rounds < 1 or queries < 1 or steps < 1:
        raise AttnlabError("need d >= 1, patterns >= 2, rounds/queries/steps >= 1")
    if not (math.isfinite(sigma) and sigma > 0):  # NaN noise scored 0% for every method
        raise AttnlabError(f"sigma={sigma} must be a finite number > 0")
    check_seed("seed", seed)
    check_memory(d, patterns, methods, rounds, queries, protocol)
    if protocol == "released":
        return _run_released(d, patterns, sigma, methods, rounds, gate, queries, steps, seed, loss)

    stored = make_patterns(patterns, d, _generator(seed, PATTERN_STREAM))
    eval_q, eval_labels = sample_queries(stored, queries, sigma, _generator(seed, EVAL_STREAM))
    results: dict[str, float] = {}
    for method in methods:
        if method == "random":
            results[method] = 100.0 / patterns
        elif method == "bayes":  # the same draws as eval_q, kept apart from sigma
            labels, noise = draw_queries(stored, queries, _generator(seed, EVAL_STREAM))
            results[method] = bayes_accuracy(stored, labels, noise, sigma)
        else:
            # Same initial weights and training batches for every trained method.
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                model = _build(method, d, rounds, gate)
            generator = _generator(seed, TRAIN_STREAM)
            train(model, stored, sigma, steps, generator, training_loss(protocol, method, loss))
            with torch.no_grad():
                out, _ = model(eval_q, stored)
            results[method] = nearest_pattern_accuracy(out, stored, eval_labels)
    return results


def memory_needed(
    d: int, patterns: int, methods: Sequence[str], rounds: int, queries: int, protocol: str
) -> int:
    """Bytes at least that ``run_retrieval`` holds at its peak, from the sizes alone.

    Always the patterns (K x d); under the attnlab protocol the evaluation queries (queries x d)
    for the whole run, under the released one a query set drawn per scored method. Then the
    largest of the methods, which run one after another: bayes draws its own noise (queries x d,
    under either protocol) and holds one score per query and pattern; a trained method's ``s``
    attention steps (``3 d^2`` weights each; ``s`` = rounds for boosted) are held four times
    while training (weights, gradients, Adam's two moments) beside a batch of queries and its
    logits, and once while scoring beside the query set, the outputs and the logits.
    """
    query_set = 0 if protocol == "attnlab" else queries * d
    peak = 0
    for method in methods:
        if method == "bayes":
            peak = max(peak, queries * d + queries * patterns)
        elif method not in UNTRAINED:
            weights = 3 * d * d * (rounds if method == "boosted" else 1)
            training = 4 * weights + BATCH * (d + patterns)
            scoring = weights + query_set + queries * (d + patterns)
            peak = max(peak, training, scoring)
    held = patterns * d + (queries * d if protocol == "attnlab" else 0)
    return (held + peak) * FLOAT_BYTES


def check_memory(
    d: int, patterns: int, methods: Sequence[str], rounds: int, queries: int, protocol: str
) -> None:
    """Refuse, before allocating, sizes whose ``memory_needed`` exceeds the machine's memory."""
    need = memory_needed(d, patterns, methods, rounds, queries, protocol)
    have = device_memory(torch.device("cpu"))
    if have is not None and need > have:
        sizes = f"d={d:,}, patterns={patterns:,}, queries={queries:,}"
        sizes += f", rounds={rounds:,}" if "boosted" in methods else ""
        raise AttnlabError(
            f"retrieval with {sizes} needs at least {gib(need)} of memory, and this machine has "
            f"{gib(have)}; make them smaller"
        )


def training_loss(protocol: str, method: str, loss: str | None = None) -> str:
    """The loss ``method`` trains with: ``loss`` if given, else the protocol's own (the released
    scripts' ``cos-ce-weights``, ``cos`` for the converged variants; ``cos-ce`` under attnlab's)."""
    if loss is not None:
        return loss
    if protocol == "attnlab":
        return "cos-ce"
    return "cos" if method.startswith("converged") else "cos-ce-weights"


def _run_released(
    d: int,
    patterns: int,
    sigma: float,
    methods: Sequence[str],
    rounds: int,
    gate: str,
    queries: int,
    steps: int,
    seed: int,
    loss: str | None,
) -> dict[str, float]:
    """The released scripts' protocol: one global stream, methods trained one after another."""
    results: dict[str, float] = {}
    with torch.random.fork_rng(devices=[]):  # the caller's global stream is left as it was
        torch.manual_seed(RELEASED_SEED + seed)
        stored = make_patterns(patterns, d, None)
        for method in methods:
            if method == "random":
                results[method] = 100.0 / patterns
            elif method == "bayes":  # not in the scripts: scored off the stream, on its own draw
                labels, noise = draw_queries(stored, queries, _generator(seed, EVAL_STREAM))
                results[method] = bayes_accuracy(stored, labels, noise, sigma)
            else:
                model = _build(method, d, rounds, gate)
                own = training_loss("released", method, loss)
                results[method] = train_released(model, stored, sigma, steps, own, queries)
                # the scripts' per-round analysis draws one more query set; keep in step with it
                sample_queries(stored, queries, sigma, None)
    return results
