"""Shared fixtures: a tiny prepared corpus, tiny configs, and a quick trainer; and the
``integration`` marker, given to every test that spawns a process or trains a model."""

from __future__ import annotations

import ast
import atexit
import inspect
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

# keep the prepared default corpus and any cache out of the user's home; the process that made
# the folder removes it at exit (xdist workers and test subprocesses inherit it)
if "ATTNLAB_HOME" not in os.environ:
    os.environ["ATTNLAB_HOME"] = tempfile.mkdtemp(prefix="attnlab-test-home-")
    atexit.register(shutil.rmtree, os.environ["ATTNLAB_HOME"], ignore_errors=True)
# under pytest-xdist every worker (and each subprocess it starts) gets one thread: two workers
# with two OpenMP threads each on two cores spin against each other and run many times slower
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A char-level data folder prepared from ~200 kB of the embedded corpus."""
    from attnlab.data.corpus import embedded_documents
    from attnlab.data.prepare import prepare

    root = tmp_path_factory.mktemp("tiny_data")
    text = "\n\n".join(t for _, t in embedded_documents()[:3])[:200_000]
    (root / "corpus.txt").write_text(text)
    return prepare(sources=[str(root / "corpus.txt")], out=root / "prepared")


def fixed_pace(ratio: float = 1.5, iqr: tuple[float, float] = (1.4, 1.6)):
    """A stand-in for a study's side-by-side step timing (attnlab.studies.jobs.time_steps):
    the baseline's step 0.2 s, the mechanism's ``ratio`` times that, at once."""

    def time_steps(pace, threads=None) -> dict:
        return {
            "baseline_sec_per_step": 0.2,
            "mechanism_sec_per_step": round(0.2 * ratio, 9),
            "ratio": ratio,
            "ratio_iqr": list(iqr),
            "reps": pace.reps,
            "threads": 1,
        }

    return time_steps


TINY = dict(block_size=32, vocab_size=96, n_layer=2, n_head=4, n_embd=32, bias=False)
# the backbone the composed mechanisms run on: the modern one, with GQA
COMPOSED_ON = {"n_kv_head": 2, "pos": "rope"}


def tiny_model(**overrides):
    """A 2-layer, 32-wide model config; vocab comes from the data when trained."""
    from attnlab.config import ModelConfig

    return ModelConfig(**{**TINY, **overrides})


def mechanism_examples() -> dict[str, dict]:
    """Each registered mechanism's SPEC example, by name: what "every mechanism" tests run."""
    from attnlab.model import mechanisms

    return {name: mechanisms.module(name).SPEC.example for name in mechanisms.REGISTRY}


def composed_label(names: tuple[str, ...]) -> str:
    """ "all" for the whole registry, else "all-but-" the mechanisms ``names`` leaves out."""
    from attnlab.model import mechanisms

    left = [n for n in mechanisms.REGISTRY if n not in names]
    return "all-but-" + "+".join(left) if left else "all"


def compatible_sets(**backbone) -> dict[str, dict]:
    """label -> fields of each largest set of registered mechanisms that compose (their examples
    merged, on RoPE with GQA and ``backbone``): what every "all mechanisms" test runs, derived
    from the SPECs (one set, "all", while nothing refuses another)."""
    from attnlab.model import mechanisms

    on = {**COMPOSED_ON, **backbone}
    return {
        composed_label(names): mechanisms.composition(names, **on)
        for names in mechanisms.compatible_sets(**{**TINY, **on})
    }


def register_toys(monkeypatch: pytest.MonkeyPatch, *toys) -> None:
    """Register mechanism modules written as a user would (tests/toy_*.py) for one test: each
    its REGISTRY line, and its switch fields added to ModelConfig as its author adds them (a
    subclass with the fields, put wherever attnlab and the tests read ModelConfig)."""
    import dataclasses

    from attnlab import config
    from attnlab.model import mechanisms

    fields = [
        (name, type(off).__name__, dataclasses.field(default=off))
        for toy in toys
        for name, off in toy.SPEC.switch.items()
    ]
    shipped = config.ModelConfig
    grown = dataclasses.make_dataclass("ModelConfig", fields, bases=(shipped,))
    for module in list(sys.modules.values()):
        # the module's own names only: a lazy module's __getattr__ would import on a lookup
        if getattr(module, "__dict__", {}).get("ModelConfig") is shipped:
            monkeypatch.setattr(module, "ModelConfig", grown)
    for toy in toys:
        monkeypatch.setitem(sys.modules, f"{mechanisms.__name__}.{toy.SPEC.name}", toy)
    names = tuple(toy.SPEC.name for toy in toys)
    monkeypatch.setattr(mechanisms, "REGISTRY", (*mechanisms.REGISTRY, *names))


def tiny_train(**overrides):
    """A 30-iteration CPU recipe with frequent evals and no TensorBoard."""
    from attnlab.config import TrainConfig

    base = dict(
        max_iters=30,
        batch_size=8,
        learning_rate=3e-3,
        min_lr=3e-4,
        warmup_iters=5,
        eval_interval=10,
        eval_iters=4,
        log_interval=5,
        device="cpu",
        tensorboard=False,
    )
    return TrainConfig(**{**base, **overrides})


@pytest.fixture
def train_tiny(tiny_data: Path):
    """Factory: train_tiny(run_dir, model={...}, **train_overrides) -> (Trainer, summary)."""
    from attnlab.train.trainer import Trainer

    def run(run_dir: Path, model: dict | None = None, until: int | None = None, **train):
        trainer = Trainer(
            run_dir, tiny_model(**(model or {})), tiny_train(**train), tiny_data, quiet=True
        )
        return trainer, trainer.run(until)

    return run


def interrupt_cli(
    args: list[str], ready: Callable[[], bool], signum: int, env: dict[str, str] | None = None
) -> tuple[int, str]:
    """Start `python -m attnlab ARGS`, send it ``signum`` once ``ready()`` holds, and return its
    exit code and stderr (the process is killed should the test fail meanwhile)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "attnlab", *args],
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        while not ready():
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.02)
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, err


def run_cli(*args: str, timeout: float = 300, **kwargs) -> subprocess.CompletedProcess:
    """Run `python -m attnlab ARGS` in a subprocess with the repo on the path."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), **kwargs.pop("env", {})}
    return subprocess.run(
        [sys.executable, "-m", "attnlab", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        **kwargs,
    )


# What makes a test an integration test: a process started (the CLI, torchrun), or a model
# trained (the trainer, a study, or the CLI's main asked to train in this process).
SUBPROCESS_CALLS = {"run", "Popen", "check_output", "check_call", "call"}
SPAWNS = {"start_processes", "spawn"}
TRAINS = {"Trainer", "run_study", "Popen"}
TRAINING_COMMANDS = {"train", "sft", "demo", "study", "bench"}
_verdicts: dict[object, bool] = {}


def _first_word(call: ast.Call) -> object:
    """``"train"`` of ``main(["train", ...])`` or ``attnlab("train", ...)``; None otherwise."""
    first = call.args[0] if call.args else None
    if isinstance(first, ast.List) and first.elts:
        first = first.elts[0]
    return first.value if isinstance(first, ast.Constant) else None


def spawns_or_trains(func: Callable) -> bool:
    """Whether ``func`` (a test, a fixture or a helper of the tests) starts a process or trains
    a model, itself or through the helpers and fixtures of tests/ that it calls."""
    code = getattr(func, "__code__", None)
    if code is None or not code.co_filename.startswith(str(Path(__file__).parent)):
        return False  # attnlab's own functions and pytest's fixtures: what they do is their own
    if code not in _verdicts:
        _verdicts[code] = False  # a helper calling itself back adds nothing
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
        except (OSError, TypeError, SyntaxError):
            return False
        _verdicts[code] = any(_node_spawns_or_trains(node, func) for node in ast.walk(tree))
    return _verdicts[code]


def _node_spawns_or_trains(node: ast.AST, func: Callable) -> bool:
    if isinstance(node, ast.Attribute):
        if node.attr in SPAWNS:  # torch.multiprocessing's ranks
            return True
        named = node.value.id if isinstance(node.value, ast.Name) else None
        return named == "subprocess" and node.attr in SUBPROCESS_CALLS
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        return node.func.id in ("main", "attnlab") and _first_word(node) in TRAINING_COMMANDS
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
        helper = func.__globals__.get(node.id)
        return node.id in TRAINS or (inspect.isfunction(helper) and spawns_or_trains(helper))
    return False


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test that spawns or trains, or uses a fixture that does, as ``integration``:
    ``pytest -m "not integration"`` is then the fast unit run."""
    for item in items:
        fixtures = getattr(item, "_fixtureinfo", None)
        defs = fixtures.name2fixturedefs.values() if fixtures else ()
        funcs = [getattr(item, "function", None), *(d.func for ds in defs for d in ds)]
        if any(f is not None and spawns_or_trains(f) for f in funcs):
            item.add_marker(pytest.mark.integration)
