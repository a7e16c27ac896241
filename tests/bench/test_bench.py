"""`attnlab bench overhead|train|generate`: tiny runs end to end, and the pieces they rest on."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from conftest import ROOT, tiny_model

from attnlab.bench import timing
from attnlab.bench.generate import quarter_ratio
from attnlab.bench.overhead import bench_variants, count_params, matched_width, modern_backbone
from attnlab.cli import main
from attnlab.model import mechanisms
from attnlab.train.spec import tomllib

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def bench(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run `attnlab bench ...` in this process; return stdout after checking the exit code."""
    assert main(["bench", *argv]) == 0
    return capsys.readouterr().out


def table_rows(out: str) -> dict[str, list[str]]:
    """First cell of each table line (cells are separated by two or more spaces) -> the other cells."""
    rows = {}
    for line in out.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) > 2:
            rows[cells[0]] = cells[1:]
    return rows


def test_interleaved_rotates_order_and_takes_median_of_ratios(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [0.0]
    calls: list[str] = []
    # each variant advances a fake clock; B's cost doubles in the third repetition only
    costs = {"A": [1.0, 1.0, 1.0, 1.0], "B": [2.0, 2.0, 4.0, 2.0], "C": [3.0, 3.0, 3.0, 3.0]}

    def variant(name: str):
        def fn() -> None:
            rep = max(0, sum(c == name for c in calls) - 1)  # first call is the warm-up
            calls.append(name)
            clock[0] += costs[name][rep]

        return fn

    monkeypatch.setattr(timing.time, "perf_counter", lambda: clock[0])
    t = timing.interleaved({n: variant(n) for n in "ABC"}, "A", reps=4, warmup=1)
    assert calls == list("ABC") + list("ABC") + list("BCA") + list("CAB") + list("ABC")
    assert t["B"].seconds == [2.0, 2.0, 4.0, 2.0]
    assert t["B"].ratios == [2.0, 2.0, 4.0, 2.0]
    assert t["B"].ratio == 2.0  # the median ignores the one slow repetition
    assert t["A"].ratio == 1.0 and t["C"].ratio == 3.0
    with pytest.raises(ValueError, match="baseline"):
        timing.interleaved({"A": variant("A")}, "Z", reps=1)


def test_count_params_by_hand() -> None:
    # no biases: per block 12 E^2 (attention 4 E^2, MLP 8 E^2) + 2 norms; wte (tied), wpe, ln_f
    v, t, e, n = 65, 256, 128, 6
    vanilla = v * e + t * e + n * (12 * e * e + 2 * e) + e
    cfg = tiny_model(n_layer=n, n_embd=e, block_size=t, vocab_size=v)
    assert count_params(cfg) == vanilla
    assert (
        count_params(cfg.replace(use_m_gate=True)) == vanilla + n * 4 * e * e
    )  # W_kvm, W_gm: E -> 2E
    assert count_params(cfg.replace(value_gate=True)) == vanilla + n * e * e  # W_E: E -> E
    assert count_params(cfg.replace(twicing=True)) == vanilla


def test_kv_bias_matches_the_seed_at_112() -> None:
    """The seed pairs vanilla at 128 with K/V-bias at 112 (6 layers, 4 heads, char vocab)."""
    base = tiny_model(n_layer=6, n_embd=128, block_size=256, vocab_size=65)
    assert matched_width(base, {"use_m_gate": True}, count_params(base)) == 112
    assert matched_width(base, {"twicing": True}, count_params(base)) == 128


def test_reference_step_is_our_gpt_exactly() -> None:
    """The plain reference the train bench races against computes the same loss and gradients."""
    from attnlab.bench.train import reference_loss
    from attnlab.model import GPT

    cfg = tiny_model(bias=True)
    torch.manual_seed(0)
    model = GPT(cfg)
    x, y = (
        torch.randint(cfg.vocab_size, (2, cfg.block_size)),
        torch.randint(cfg.vocab_size, (2, cfg.block_size)),
    )
    _, ours = model(x, y)
    params = {k: v.detach().clone().requires_grad_() for k, v in model.named_parameters()}
    ref = reference_loss(params, cfg, x, y)
    assert torch.equal(ours, ref)
    ours.backward()
    ref.backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, params[name].grad, rtol=0, atol=5e-7, msg=name)


def test_bench_labels_are_the_mechanisms_names() -> None:
    """One name per mechanism: the labels are the SPECs' (in registry order), and the overhead
    study names none by hand, so it times every registered variant."""
    labels = list(bench_variants())
    assert len(labels) == len(set(labels))
    own = [spec.label for spec in mechanisms.specs()]  # each mechanism benched under its name
    assert [label for label in labels if label in own] == own
    spec = tomllib.loads((ROOT / "attnlab/studies/specs/overhead.toml").read_text())
    assert "mechanisms" not in {**spec["params"], **spec["scale"]["ci"]["params"]}


def test_quarter_ratio_by_hand() -> None:
    assert quarter_ratio([1.0, 3.0, 5.0, 5.0, 5.0, 5.0, 4.0, 8.0]) == pytest.approx(6.0 / 2.0)


def test_the_modern_backbone_rows_follow_the_specs(monkeypatch: pytest.MonkeyPatch) -> None:
    """A mechanism is timed on the QKVE-style backbone because its SPEC says so: with the flag
    moved from the value gate to K/V-bias, K/V-bias has the modern row and the value gate none."""
    from dataclasses import replace

    from attnlab.bench import overhead

    for name, on in (("kv_bias", True), ("value_gate", False)):
        module = mechanisms.module(name)
        monkeypatch.setattr(module, "SPEC", replace(module.SPEC, bench_on_modern=on))
    rows, _ = overhead.measure(
        [32], layers=1, batch=2, block=16, reps=1, mechanisms=["kv-bias", "value-gate"]
    )
    modern = modern_backbone(tiny_model(n_layer=1, n_embd=32, block_size=16, vocab_size=65))
    found = {(r.variant, r.params) for r in rows if r.match == "modern"}
    assert found == {("kv-bias", count_params(modern.replace(**bench_variants()["kv-bias"])))}


def test_bench_overhead_quick(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "overhead.png"
    out = bench(capsys, "overhead", "--quick", "--out", str(png))
    rows = table_rows(out)
    for width in (16, 32):
        assert rows[f"vanilla @{width}"][1] == "equal"
        assert rows[f"vanilla @{width}"][2].replace(",", "") == str(
            count_params(tiny_model(n_layer=1, n_embd=width, block_size=16, vocab_size=65))
        )
        assert rows[f"vanilla @{width}"][4] == "1.000"  # every ratio to itself is exactly 1
        for name in bench_variants():
            assert rows[f"{name} @{width}"][1] == "equal"
    # the parameter-matched partner of 32 (widths step by 8 so that none pays for an odd shape)
    assert rows["kv-bias @24"][:2] == ["32", "params"]

    # the GBA paper's pairing: boosted at 32 against a vanilla widened to its parameter count
    def count(width: int, **overrides) -> int:
        return count_params(
            tiny_model(n_layer=1, n_embd=width, block_size=16, vocab_size=65, **overrides)
        )

    # the mechanisms whose SPEC asks for it on the QKVE-style backbone (GQA, RoPE, RMSNorm, deep
    # SwiGLU) against that backbone, and no other
    modern = modern_backbone(tiny_model(n_layer=1, n_embd=32, block_size=16, vocab_size=65))
    on_modern = mechanisms.modern_bench_variants()
    assert on_modern and {n.split(" @")[0] for n in rows if n.endswith("(modern)")} == set(
        on_modern
    )
    for name in on_modern:
        assert rows[f"{name} @32 (modern)"][1] == "modern"
        assert rows[f"{name} @32 (modern)"][2].replace(",", "") == str(
            count_params(modern.replace(**bench_variants()[name]))
        )
    wide = int(rows["boosted @32 (fair)"][0])
    assert rows["boosted @32 (fair)"][1] == "fair" and wide > 32
    target = count(32, boost_rounds=2)
    for other in (wide - 8, wide + 8):  # no other width step gets closer
        assert abs(count(wide) - target) <= abs(count(other) - target)
    assert png.read_bytes()[:8] == PNG_MAGIC


def test_bench_train_quick(capsys: pytest.CaptureFixture[str]) -> None:
    out = bench(capsys, "train", "--quick")
    rows = table_rows(out)
    assert set(rows) >= {"attnlab GPT", "plain reference"}
    assert rows["attnlab GPT"][3] == "1.000"
    assert "speed relative to the plain reference" in out
    assert "76,992" not in out  # quick mode runs a tiny model, not the full preset


def test_bench_generate_quick(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "generate.png"
    out = bench(capsys, "generate", "--quick", "--out", str(png))
    rows = table_rows(out)
    for name in ["vanilla", *bench_variants()]:
        assert rows[name][-1] == "yes", f"{name}: cached greedy decoding differs from recompute"
    assert png.read_bytes()[:8] == PNG_MAGIC


def test_bench_threads_applied_and_reported(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--threads sets torch's intra-op threads for the run and the header says how many."""
    monkeypatch.setattr(
        torch, "set_num_threads", lambda n: monkeypatch.setattr(torch, "get_num_threads", lambda: n)
    )
    out = bench(capsys, "generate", "--quick", "--threads", "1", "--out", str(tmp_path / "g.png"))
    assert ", 1 CPU threads" in out.splitlines()[1]
    before = sorted(tmp_path.iterdir())
    assert (
        main(["bench", "generate", "--quick", "--threads", "0", "--out", str(tmp_path / "x.png")])
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["attnlab bench generate: error: --threads must be at least 1, got 0"]
    assert sorted(tmp_path.iterdir()) == before


@pytest.mark.slow
def test_bench_generate_compiled_quick(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = bench(capsys, "generate", "--quick", "--compile", "--out", str(tmp_path / "g.png"))
    assert ", compiled" in out
    rows = table_rows(out)
    for name in ["vanilla", *bench_variants()]:
        assert rows[name][-1] == "yes", f"{name}: compiled cached decoding differs from recompute"


class Measured(Exception):
    """Raised by a stand-in for a benchmark's measure(), once it has recorded its sizes."""


QUICK_OVERHEAD = dict(widths=[16, 32], layers=1, batch=1, block=16, reps=1, n_head=4)
FULL_OVERHEAD = dict(widths=[128, 256, 384, 512, 640, 768], layers=6, batch=8, block=256, reps=5)


def sizes_measured(benchmark: str, args: tuple, kwargs: dict) -> dict | tuple:
    """What a benchmark's measure() was asked to run: overhead's sizes; generate's width, tokens
    and reps; train's width, batch and steps."""
    if benchmark == "overhead":
        return {k: kwargs[k] for k in QUICK_OVERHEAD}
    cfg, *counts = args[:3]
    return (cfg.n_embd, *counts)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["overhead", "--quick"], QUICK_OVERHEAD),
        (  # a size given beside --quick is kept; the others are --quick's
            ["overhead", "--quick", "--reps", "3", "--widths", "8,24", "--heads", "2"],
            {**QUICK_OVERHEAD, "widths": [8, 24], "reps": 3, "n_head": 2},
        ),
        (["overhead", "--layers", "2"], {**FULL_OVERHEAD, "layers": 2, "n_head": 4}),
        (["generate", "--quick"], (16, 12, 1)),
        (["generate", "--quick", "--tokens", "20", "--reps", "2"], (16, 20, 2)),
        (["train", "--quick"], (16, 2, 2)),
        (["train", "--quick", "--steps", "7"], (16, 2, 7)),
    ],
)
def test_bench_quick_keeps_the_sizes_given_beside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, argv: list[str], expected: dict | tuple
) -> None:
    benchmark, seen = argv[0], []

    def measure(*args, **kwargs):
        seen.append(sizes_measured(benchmark, args, kwargs))
        raise Measured

    monkeypatch.setattr(f"attnlab.bench.{benchmark}.measure", measure)
    out = [] if benchmark == "train" else ["--out", str(tmp_path / "bench.png")]
    with pytest.raises(Measured):
        main(["bench", *argv, *out])
    assert seen == [expected] and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("case", ["foreign-png", "file-in-path", "proc"])
def test_bench_figure_out_is_checked_before_measuring(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    """A PNG attnlab did not write was replaced; an unwritable --out failed with a traceback
    after the whole benchmark had run."""
    from test_folder_safety import snapshot

    png = {
        "foreign-png": tmp_path / "mine.png",
        "file-in-path": tmp_path / "notes" / "g.png",
        "proc": Path("/proc/attnlab-bench-test.png"),
    }[case]
    if case == "proc" and not Path("/proc/self").is_dir():
        pytest.skip("needs Linux's /proc")
    if case == "foreign-png":
        png.write_bytes(PNG_MAGIC + b"a figure for my paper")
    if case == "file-in-path":
        (tmp_path / "notes").write_text("my notes")
    before = snapshot(tmp_path)
    assert main(["bench", "generate", "--quick", "--out", str(png)]) == 2
    out, err = capsys.readouterr()
    assert out == ""  # refused before measuring anything
    assert len(err.strip().splitlines()) == 1
    line = err.strip().removeprefix("attnlab bench generate: error: ")
    if case == "foreign-png":
        assert (
            line
            == f"{png} exists and was not written by attnlab; choose another --out or remove it"
        )
    else:  # the reason depends on the file system and the user
        assert re.fullmatch(
            rf"cannot write {png.parent} \([A-Z][\w ]+\); choose another --out", line
        )
    assert snapshot(tmp_path) == before


def test_a_figure_attnlab_wrote_may_be_replaced(tmp_path: Path) -> None:
    from attnlab.plotting import check_figure_out, pyplot, save_figure

    png = tmp_path / "fig.png"
    save_figure(pyplot().figure(), png)
    check_figure_out(png)  # its mark says it is attnlab's: no error


@pytest.mark.parametrize("case", ["file", "foreign-page", "own-report"])
def test_bench_gpu_out_is_checked_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    """A file as --out gave a traceback after the whole run; a user's gpu_check.md was
    replaced. The report bench gpu wrote itself is replaced without a word."""
    from test_folder_safety import snapshot

    from attnlab.bench import gpu

    out = tmp_path / "gpu"
    if case == "file":
        out.write_text("my notes")
    else:
        out.mkdir()
        (out / "multi_gpu.txt").write_text("what gpu_check.sh writes beside the report")
        (out / gpu.REPORT_MD).write_text("# my own GPU notes\n")
    ran = []
    report = {"passed": True}
    monkeypatch.setattr(gpu, "run", lambda *a, **k: ran.append(1) or report)
    monkeypatch.setattr(gpu, "markdown", lambda r: f"# page of {sorted(r)}\n")
    if case == "own-report":
        gpu.write(report, out)
    before = snapshot(tmp_path)
    status = main(["bench", "gpu", "--smoke", "--device", "cpu", "--out", str(out)])
    printed, err = capsys.readouterr()
    if case == "own-report":
        assert status == 0 and ran == [1] and (out / "multi_gpu.txt").is_file()
        return
    assert status == 2 and ran == [] and printed == ""
    assert err.strip().splitlines() == [
        "attnlab bench gpu: error: "
        + {
            "file": f"{out} exists and is not a folder; choose another --out",
            "foreign-page": f"{out} holds a gpu_check.json or gpu_check.md that bench gpu did "
            "not write; move it, or choose another --out",
        }[case]
    ]
    assert snapshot(tmp_path) == before


def test_a_benchmark_model_leaves_the_callers_random_stream_alone() -> None:
    """The benchmarks build their models from a seed of their own: the caller's global stream
    (a study's run about to start, a notebook's) draws the same numbers after as before."""
    from attnlab.bench.timing import seeded_model, train_step
    from attnlab.model import GPT

    cfg = tiny_model()
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    model = seeded_model(cfg, seed=5)
    train_step(cfg, 2)
    assert torch.equal(torch.rand(3), expected)
    torch.manual_seed(5)
    built = GPT(cfg).parameters()
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), built, strict=True))
