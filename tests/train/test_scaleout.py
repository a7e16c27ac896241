"""The mechanism contract where users scale, checked on CPU: every registered mechanism, each of
its ablation variants and all of them together train under the GPU defaults (bf16 autocast; fp16
autocast with a GradScaler) with finite losses close to float32's, and take the same optimizer
steps under DDP and under FSDP2 on 2 gloo ranks as one process does at the same global batch.

The variants are derived from the SPECs (a choice field's every value, a boolean field turned
on), never listed, so a new mechanism is covered by registering it. Each check is shown able to
fail by a mutant that reintroduces the bug it guards against.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
from conftest import ROOT, compatible_sets, tiny_model

from attnlab.config import ModelConfig
from attnlab.model import GPT, mechanisms
from attnlab.model.mechanisms import kv_bias
from attnlab.train import distributed, fsdp

DEFAULTS = {f.name: f.default for f in dataclasses.fields(ModelConfig)}
GLOBAL_BATCH, STEPS, RANKS = 4, 2, 2


def variants() -> dict[str, dict[str, Any]]:
    """label -> model fields: each mechanism's example, each ablation variant, all together (each
    largest set that composes, on the modern backbone with GQA)."""
    out: dict[str, dict[str, Any]] = {}
    for spec in mechanisms.specs():
        out[spec.label] = dict(spec.example)
        for name, allowed in spec.choices.items():
            for value in allowed:
                if value not in (DEFAULTS[name], spec.example.get(name)):
                    out[f"{spec.label}-{name}={value}"] = {**spec.example, name: value}
        for name in spec.fields:
            if DEFAULTS[name] is False and name not in spec.example:
                out[f"{spec.label}-{name}"] = {**spec.example, name: True}
    return {**out, **compatible_sets()}


VARIANTS = variants()


def batch(config: ModelConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed global batch, the same in every process."""
    g = torch.Generator().manual_seed(7)
    tokens = torch.randint(config.vocab_size, (GLOBAL_BATCH, config.block_size + 1), generator=g)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def build(config: ModelConfig) -> GPT:
    torch.manual_seed(0)
    return GPT(config)


def optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    """SGD with momentum and weight decay: linear in the gradients, so ranks and one process
    agree to float precision (Adam's per-element normalisation magnifies the summation order of
    near-zero gradients), and a parameter handed a zero gradient instead of none still moves."""
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.1)


def train_steps(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, opt) -> list[float]:
    losses = []
    for _ in range(STEPS):
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    return losses


def one_process(config: ModelConfig) -> dict[str, torch.Tensor]:
    model = build(config)
    train_steps(model, *batch(config), optimizer(model))
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


# --- precision -----------------------------------------------------------------------------


def loss_and_grads(config: ModelConfig, dtype: torch.dtype | None) -> tuple[float, list]:
    """One forward and backward in ``dtype`` autocast (None: float32); fp16 through a GradScaler,
    unscaled as the trainer does before clipping."""
    model = build(config)
    x, y = batch(config)
    scaler = torch.amp.GradScaler("cpu", enabled=dtype == torch.float16)
    with torch.autocast("cpu", dtype=dtype or torch.float32, enabled=dtype is not None):
        _, loss = model(x, y)
    scaler.scale(loss).backward()
    opt = optimizer(model)
    scaler.unscale_(opt)
    return float(loss.detach()), [p.grad for p in model.parameters() if p.grad is not None]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("label", list(VARIANTS))
def test_every_variant_trains_under_autocast(label: str, dtype: torch.dtype) -> None:
    config = tiny_model(**VARIANTS[label])
    reference, _ = loss_and_grads(config, None)
    loss, grads = loss_and_grads(config, dtype)
    assert loss == pytest.approx(reference, rel=0.02)  # bf16 keeps ~3 significant digits
    assert grads and all(bool(torch.isfinite(g).all()) for g in grads)


def test_the_autocast_check_fails_on_the_mixed_dtype_lerp(monkeypatch) -> None:
    """The mutant: kv-bias's gate as it was (lerp of a float32 M with a bf16 candidate)."""

    def old_update(self, h, ctx):
        if ctx.layer == self.last_layer:
            return
        g_pre, c_pre = self(h).chunk(2, dim=2)
        m = kv_bias.previous_m(h, ctx)
        ctx.state["M"] = torch.lerp(torch.tanh(c_pre), m, torch.sigmoid(g_pre))

    monkeypatch.setattr(kv_bias.PurposeGate, "update_state", old_update)
    with pytest.raises(RuntimeError, match="expected dtype"):
        test_every_variant_trains_under_autocast("kv-bias", torch.bfloat16)


# --- parallelism ---------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_main(rank: int, port: int, labels: list[str], out: str, ignore_unreachable: bool) -> None:
    """Rank ``rank`` of 2: every variant 2 steps under DDP, then under FSDP2 (built on the meta
    device from rank 0's model, as the trainer does), on its half of the global batch; rank 0
    saves the full state_dicts (FSDP's also before the first step, or the error) for the parent
    to compare."""
    torch.distributed.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=RANKS
    )
    env = distributed.DistEnv(rank, RANKS, 0)
    device = torch.device("cpu")
    if not ignore_unreachable:  # the mutant: DDP is not told of the parameters no loss reaches
        GPT.unreachable_parameters = lambda self: []
    results: dict[str, Any] = {}
    rows = slice(rank * GLOBAL_BATCH // RANKS, (rank + 1) * GLOBAL_BATCH // RANKS)
    for label in labels:
        config = tiny_model(**VARIANTS[label])
        x, y = (t[rows] for t in batch(config))
        for mode in ("ddp", "fsdp"):
            model = None
            try:
                if mode == "ddp":
                    model = distributed.wrap(build(config), env, device)
                else:
                    model = fsdp.build(config, build(config) if rank == 0 else None, device)
                    opt = optimizer(model)
                    plain, _ = fsdp.full_state(model, opt, rank == 0, lambda c=config: GPT(c))
                    if rank == 0:
                        results[f"{label}/init"] = plain.state_dict()
                opt = optimizer(model)  # under FSDP: over the sharded parameters
                train_steps(model, x, y, opt)
                if mode == "ddp":
                    plain = model.module if rank == 0 else None
                else:
                    plain, _ = fsdp.full_state(model, opt, rank == 0, lambda c=config: GPT(c))
                if rank == 0:
                    results[f"{label}/{mode}"] = {
                        k: v.clone() for k, v in plain.state_dict().items()
                    }
            except RuntimeError as e:
                results[f"{label}/{mode}"] = str(e).splitlines()[0]
                break  # the ranks may no longer agree on where they are; stop this variant
    if rank == 0:
        torch.save(results, out)
    torch.distributed.destroy_process_group()


def run_ranks(labels: list[str], tmp_path: Path, ignore_unreachable: bool = True) -> dict:
    out = tmp_path / "ranks.pt"
    mp.start_processes(
        rank_main,
        args=(free_port(), labels, str(out), ignore_unreachable),
        nprocs=RANKS,
        start_method="spawn",
    )
    return torch.load(out, weights_only=False)


# spawning ranks is slow on 2 cores: the default suite runs the variants with a parameter no loss
# reaches, a 0-dim parameter, and all together; the slow suite runs every variant
QUICK = ("kv-bias", "kv-bias-m_gate_detached", "boosted-boost_gate=scalar", *compatible_sets())


@pytest.mark.parametrize(
    "labels",
    [
        pytest.param(QUICK, id="quick"),
        pytest.param(
            tuple(v for v in VARIANTS if v not in QUICK), id="the-rest", marks=pytest.mark.slow
        ),
    ],
)
def test_variants_take_one_process_steps_under_ddp_and_fsdp(labels, tmp_path: Path) -> None:
    results = run_ranks(list(labels), tmp_path)
    for label in labels:
        init = build(tiny_model(**VARIANTS[label])).state_dict()
        got = results.get(f"{label}/init")
        assert isinstance(got, dict), f"{label}: FSDP's meta-device build failed"
        assert all(torch.equal(got[k], init[k]) for k in init), f"{label}: FSDP's init differs"
        reference = one_process(tiny_model(**VARIANTS[label]))
        for mode in ("ddp", "fsdp"):
            got = results[f"{label}/{mode}"]
            assert not isinstance(got, str), f"{label} under {mode}: {got}"
            assert got.keys() == reference.keys(), f"{label} under {mode}"
            for key, value in reference.items():
                torch.testing.assert_close(
                    got[key], value, rtol=1e-4, atol=1e-6, msg=f"{label} {mode} {key}"
                )


@pytest.mark.slow
def test_the_ddp_check_fails_when_ddp_waits_for_unreachable_parameters(tmp_path: Path) -> None:
    """The mutant: no parameter ignored, so DDP waits for the last W_gm's gradient."""
    got = run_ranks(["kv-bias"], tmp_path, ignore_unreachable=False)["kv-bias/ddp"]
    assert isinstance(got, str) and "finished reduction in the prior iteration" in got


# --- per-rank semantics, precision defaults, restarts, the GPU acceptance script -------------


@pytest.mark.parametrize(("native", "expected"), [(True, torch.bfloat16), (False, torch.float16)])
def test_auto_precision_is_bf16_only_where_native(monkeypatch, native, expected) -> None:
    """bf16 where the GPU computes it natively, else fp16 (T4, V100 emulate bf16); never
    counting emulation; float32 on CPU."""
    from attnlab.device import autocast_dtype

    asked = []

    def supported(including_emulation: bool = True) -> bool:
        asked.append(including_emulation)
        return native

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", supported)
    assert autocast_dtype("auto", torch.device("cuda")) is expected
    assert asked == [False]
    assert autocast_dtype("auto", torch.device("cpu")) is None
    assert autocast_dtype("bfloat16", torch.device("cpu")) is torch.bfloat16


def test_the_memory_check_is_per_rank(monkeypatch) -> None:
    """A global batch that each rank's share fits is accepted; under FSDP the weights and
    optimizer state are split too; ranks sharing one host's RAM add up."""
    from attnlab.model import memory

    config = tiny_model(n_layer=4, n_embd=64)
    one_rank = memory.memory_needed(config, 512 // 16)
    monkeypatch.setattr(memory, "device_memory", lambda device: one_rank)
    memory.check_fits(config, "cpu", 512, ranks=16)  # 32 rows each: fits
    with pytest.raises(memory.AttnlabError, match=r"batch_size=512\b"):
        memory.check_fits(config, "cpu", 512)  # the whole batch on one process does not
    with pytest.raises(memory.AttnlabError, match=r"\(32 rows on each of 16 ranks\)"):
        memory.check_fits(config, "cpu", 512, ranks=16, sharing=2)  # two ranks on one host
    sharded = memory.memory_needed(config, 32, shards=16)
    params = memory.parameter_count(config)
    assert one_rank - sharded == 4 * memory.FLOAT_BYTES * (params - -(-params // 16))


def test_study_workers_spread_over_the_visible_gpus(monkeypatch) -> None:
    from attnlab.studies import jobs

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert jobs.visible_gpus() == ["3", "5"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert jobs.visible_gpus() == ["0", "1"]

    class Claims:
        def get(self) -> str:
            return "5"

    jobs._claim_gpu(Claims())
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "5"


def test_a_torchrun_restart_resumes_the_run_its_job_began(train_tiny, tmp_path, monkeypatch):
    """--max-restarts reruns `train --out RUN`: the run this torchrun job started resumes; a run
    another job (or no torchrun) made is still refused."""
    from attnlab.commands.train import restarted_run

    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-a")
    run = tmp_path / "run"
    train_tiny(run, until=2, max_iters=4, eval_interval=2, ckpt_interval=2)  # a rank failed
    assert not restarted_run(str(run))  # the first attempt: nothing to restart
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert restarted_run(str(run))
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job-b")
    assert not restarted_run(str(run))
    assert not restarted_run(str(tmp_path / "nothing-here"))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_kv_bias_trains_under_autocast(train_tiny, tmp_path, dtype) -> None:
    """The issue's command: use_m_gate=true dtype=bfloat16 (float16) died at iter 0."""
    _, summary = train_tiny(
        tmp_path / "run", model={"use_m_gate": True}, dtype=dtype, max_iters=3, eval_interval=3
    )
    assert summary["iters"] == 3 and summary["final_val_loss"] < 10


def test_the_gpu_acceptance_script_runs_on_cpu(tmp_path: Path) -> None:
    """scripts/gpu_check.sh --smoke: the GPU run's every step at toy size, so it cannot rot."""
    bindir = Path(sys.executable).parent
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "OUT": str(tmp_path / "gpu"),
        "ATTNLAB": str(bindir / "attnlab"),
        "PYTHON": sys.executable,
        "ATTNLAB_HOME": str(tmp_path / "home"),
    }
    proc = subprocess.run(
        [str(ROOT / "scripts" / "gpu_check.sh"), "--smoke"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = json.loads((tmp_path / "gpu" / "gpu_check.json").read_text())
    assert report["passed"] and report["smoke"]
    assert set(report["mechanisms"]) == {"plain", *(s.label for s in mechanisms.specs())}
    for row in report["mechanisms"].values():
        assert row["decode_cached_equals_full"] and row["sdpa_kernel"] in (
            "flash",
            "efficient",
            "cudnn",
            "math",
            "none",
        )
    assert report["mechanisms"]["plain"]["train_compiled"]["ok"]
    assert (tmp_path / "gpu" / "gpu_check.md").read_text().startswith("# GPU acceptance")
    assert (tmp_path / "gpu" / "study-smoke" / "report.md").is_file()


def test_the_default_data_is_prepared_once_by_concurrent_ranks(tmp_path: Path) -> None:
    """torchrun's ranks each prepared the default data (and swapped in their own copy); now the
    first to take the lock prepares and the others find it ready."""
    script = (
        "import logging; logging.basicConfig(level=logging.INFO); "  # its reports on stderr
        "from pathlib import Path; from attnlab.data.prepare import prepare_once; "
        f"prepare_once(Path({str(tmp_path / 'data')!r}), 'shakespeare_char')"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True, env=env)
        for _ in range(3)
    ]
    errs = [p.communicate(timeout=300)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], errs
    assert sum(e.count("preparing the shipped corpus") for e in errs) == 1
    assert (tmp_path / "data" / "meta.json").is_file()
    assert not [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name]


@pytest.mark.parametrize("field", ["hsdp", "sharded_checkpoints"])
def test_shard_options_without_fsdp_are_refused(field: str) -> None:
    from attnlab.config import ConfigError, TrainConfig

    with pytest.raises(ConfigError, match=rf"^{field}=true needs fsdp=true"):
        TrainConfig(**{field: True})
    assert getattr(TrainConfig(fsdp=True, **{field: True}), field)


def test_hsdp_needs_equal_nodes() -> None:
    """Refused before any mesh is built (a 2-D mesh of unequal nodes does not exist)."""
    with pytest.raises(fsdp.AttnlabError, match="5 ranks do not divide into nodes of 2"):
        fsdp.mesh("cpu", 5, 2, hybrid=True)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # one process is meant
def test_a_sharded_checkpoint_missing_a_weight_is_one_line(tmp_path: Path) -> None:
    """Read for export in one process: all weights resharded into one state_dict; one missing
    weight would keep uninitialised memory, so it is refused, naming it."""
    import torch.distributed.checkpoint as dcp

    config = tiny_model()
    sd = build(config).state_dict()
    dcp.save({"model": sd}, checkpoint_id=str(tmp_path / "whole"), no_dist=True)
    got = fsdp.read_shard_weights(tmp_path / "whole", config)
    assert all(torch.equal(got[k], sd[k]) for k in sd)
    cut = {k: v for k, v in sd.items() if k != "lm_head.weight"}
    cut.pop("transformer.wte.weight")  # tied: one tensor under both names
    dcp.save({"model": cut}, checkpoint_id=str(tmp_path / "cut"), no_dist=True)
    with pytest.raises(fsdp.AttnlabError, match=r"sharded checkpoint does not load \(no "):
        fsdp.read_shard_weights(tmp_path / "cut", config)
