"""The CLI end to end through subprocesses: train, sample, eval, presets, demo, errors."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
import sys
from pathlib import Path

import pytest
from conftest import ROOT, interrupt_cli, run_cli

from attnlab.cli import build_parser, config_flags_as_overrides

TINY = [
    "n_layer=2",
    "n_head=2",
    "n_embd=32",
    "block_size=32",
    "batch_size=8",
    "eval_iters=2",
    "eval_interval=10",
    "log_interval=5",
    "warmup_iters=2",
    "device=cpu",
    "tensorboard=false",
]


def test_train_sample_eval_round_trip(tmp_path: Path, tiny_data: Path) -> None:
    run = tmp_path / "run"
    done = run_cli("train", "--data", str(tiny_data), "--out", str(run), "max_iters=10", *TINY)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout[done.stdout.index("{") :])
    assert summary["iters"] == 10 and summary["final_val_loss"] > 0
    assert "iter 10/10" in done.stdout  # plain log lines when not on a TTY

    sample = run_cli(
        "sample", str(run), "--prompt", "KING", "--max-new-tokens", "20", "--seed", "1"
    )
    assert sample.returncode == 0, sample.stderr
    assert sample.stdout.startswith("KING") and len(sample.stdout.rstrip("\n")) >= 20
    again = run_cli("sample", str(run), "--prompt", "KING", "--max-new-tokens", "20", "--seed", "1")
    assert again.stdout == sample.stdout

    ev = run_cli("eval", str(run))
    assert ev.returncode == 0, ev.stderr
    result = json.loads(ev.stdout)
    assert result["checkpoint"] == str(run / "best")  # which one it scored: best/, else latest/
    assert (
        result["split"] == "val"
        and abs(result["perplexity"] - 2.718281828 ** result["loss"]) < 1e-3
    )

    resumed = run_cli("train", "--resume", str(run), "max_iters=15")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout[resumed.stdout.index("{") :])["iters"] == 15


def test_eval_of_an_export_scores_as_its_run(train_tiny, tmp_path: Path, tiny_data: Path) -> None:
    """An export adds zero rows for tokens the run never had (<|endoftext|>, <unk>): counted in
    the softmax, they made `eval` of the export report a higher loss than of its run."""
    run = tmp_path / "run"
    train_tiny(run, max_iters=4)
    assert run_cli("export", str(run), "--out", str(tmp_path / "hf")).returncode == 0
    losses = []
    for model in (run, tmp_path / "hf"):
        p = run_cli("eval", str(model), "--data", str(tiny_data), "--device", "cpu")
        assert p.returncode == 0, p.stderr
        losses.append(json.loads(p.stdout)["loss"])
    assert losses[1] == pytest.approx(losses[0], rel=1e-5)


class Terminal(io.StringIO):
    """A stderr that says it is a terminal, as a user's is."""

    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("delay", [0.0, 1e6])  # 1e6: longer than any machine takes
def test_eval_shows_progress_on_a_terminal_only_when_it_takes_a_while(
    tmp_path: Path, train_tiny, capsys, monkeypatch: pytest.MonkeyPatch, delay: float
) -> None:
    """`eval --split train` printed nothing for minutes: a bar of tokens, as training's, on a
    terminal's stderr once the evaluation outlasts the delay; a short one stays silent."""
    from attnlab.cli import main

    train_tiny(tmp_path / "run", max_iters=2)
    monkeypatch.setattr("attnlab.analysis.inputs.PROGRESS_DELAY_S", delay)
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(["eval", str(tmp_path / "run"), "--split", "train"]) == 0
    result = json.loads(capsys.readouterr().out)  # stdout stays the JSON alone
    assert result["split"] == "train"
    if delay:
        assert terminal.getvalue() == ""
    else:
        assert re.search(r"eval: +\d+%\|.*tok/s", terminal.getvalue()), terminal.getvalue()


def test_eval_off_a_terminal_shows_no_progress(tmp_path: Path, train_tiny) -> None:
    """Off a terminal a bar is carriage returns in a log, and stderr is kept for the error."""
    train_tiny(tmp_path / "run", max_iters=2)
    done = run_cli("eval", str(tmp_path / "run"), "--split", "train")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert json.loads(done.stdout)["split"] == "train"


def test_errors_are_one_line_without_traceback(tmp_path: Path, tiny_data: Path) -> None:
    bad = run_cli(
        "train", "--data", str(tiny_data), "--out", str(tmp_path / "r"), "n_embd=33", "n_head=4"
    )
    assert bad.returncode != 0
    assert "n_embd=33 must be divisible by n_head=4" in bad.stderr and "Traceback" not in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
    debug = run_cli(
        "--debug", "train", "--data", str(tiny_data), "--out", str(tmp_path / "r"), "n_embd=33"
    )
    assert "Traceback" in debug.stderr


def test_presets_and_help() -> None:
    listed = run_cli("presets")
    assert listed.returncode == 0 and "kv-bias-shakespeare-char" in listed.stdout
    assert "kvbias" not in listed.stdout  # former names still load but are not listed
    helped = run_cli("--help")
    for command in ("train", "sample", "eval", "prepare", "demo"):
        assert command in helped.stdout


def test_demo_runs_short(tmp_path: Path) -> None:
    """The README's first command, shortened: prepares the embedded corpus, trains, samples."""
    done = run_cli(
        "demo",
        "--out",
        str(tmp_path / "demo"),
        "max_iters=6",
        "eval_interval=3",
        "eval_iters=2",
        "log_interval=3",
        "batch_size=8",
        "tensorboard=false",
    )
    assert done.returncode == 0, done.stderr
    assert (
        "val loss before training:" in done.stdout and "val loss after 6 iterations" in done.stdout
    )
    assert "sample:" in done.stdout
    assert "time cap" not in done.stdout


def test_demo_says_when_its_time_cap_cut_training_short(tmp_path: Path) -> None:
    """A slow machine stopped the demo at iteration 179 of 800 without a word: the gibberish
    sample read as what the full schedule gives."""
    args = ["max_iters=50", "eval_interval=25", "eval_iters=1", "batch_size=4", "max_seconds=0.01"]
    done = run_cli("demo", "--out", str(tmp_path / "demo"), *args, "tensorboard=false")
    assert done.returncode == 0, done.stderr
    assert re.search(
        r"val loss after \d+ iterations: .*tokens/s; the demo's 0\.01 s time cap stopped it "
        r"before iteration 50\n",
        done.stdout,
    ), done.stdout


@pytest.mark.slow
def test_sample_compiled_matches_eager(tmp_path: Path, train_tiny) -> None:
    train_tiny(tmp_path / "run", max_iters=10)
    greedy = ["--prompt", "KING", "--max-new-tokens", "40", "--temperature", "0", "--device", "cpu"]
    eager = run_cli("sample", str(tmp_path / "run"), *greedy)
    compiled = run_cli("sample", str(tmp_path / "run"), *greedy, "--compile")
    assert compiled.returncode == 0, compiled.stderr
    assert compiled.stdout == eager.stdout and len(eager.stdout) > 40


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (
            RuntimeError("[enforce fail] DefaultCPUAllocator: can't allocate memory: you tried"),
            "out of memory ([enforce fail] DefaultCPUAllocator: can't allocate memory: you "
            "tried); ask for less",
        ),
        (MemoryError(), "out of memory (MemoryError); ask for less"),
    ],
)
def test_an_allocation_that_fails_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys, error: BaseException, expected: str
) -> None:
    """`bench export --prompts 100000000` ended in torch's allocator traceback."""
    from attnlab.cli import main
    from attnlab.commands.bench import export

    def run(args):
        raise error

    monkeypatch.setattr(export, "run", run)
    assert main(["bench", "export"]) == 2
    assert capsys.readouterr().err.splitlines() == [f"attnlab bench export: error: {expected}"]


def test_other_runtime_errors_still_show_their_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    from attnlab.cli import main
    from attnlab.commands import info

    def run(args):
        raise RuntimeError("a bug")

    monkeypatch.setattr(info, "run", run)
    with pytest.raises(RuntimeError, match="a bug"):
        main(["info", "x"])


def test_an_interrupted_demo_says_it_is_discarded(tmp_path: Path) -> None:
    """Ctrl-C (or SIGTERM) in a demo said "saved runs/.demo.tmp-PID/latest; continue with:
    attnlab train --resume runs/.demo.tmp-PID", a temporary folder removed as the demo stopped."""
    import signal

    out = tmp_path / "demo"
    args = ["max_iters=100000", "max_seconds=600", "eval_interval=100000", "log_interval=1",
            "batch_size=4", "tensorboard=false"]  # fmt: skip
    code, err = interrupt_cli(
        ["demo", "--out", str(out), *args],
        lambda: any(len(m.read_text().splitlines()) > 3 for m in tmp_path.glob(".demo.*/*.csv")),
        signal.SIGINT,
    )
    assert code == 130, err
    line = next(x for x in err.splitlines() if x.startswith("interrupted at iter"))
    assert line.endswith(": the unfinished demo is discarded (run `attnlab demo` again)")
    assert list(tmp_path.iterdir()) == []  # neither the demo nor its temporary folder


def _documents() -> list[Path]:
    """The README and every page it sends a reader to: docs/ and the full results table."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "results/README.md"]


def _shell_commands(text: str) -> list[str]:
    """Every `attnlab ...` line of ``text``'s shell code blocks, continuation lines joined and
    leading VAR=value assignments dropped."""
    commands: list[str] = []
    block: list[str] | None = None  # the shell block's lines so far; None outside one
    fenced = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            block = [] if fenced and line.strip()[3:] in ("", "bash", "sh") else None
            continue
        if block is None:
            continue
        if block and block[-1].endswith("\\"):
            block[-1] = block[-1][:-1] + " " + line.strip()
        else:
            block.append(line.strip())
        joined = re.sub(r"^(\w+=\S+\s+)*", "", block[-1])
        if joined.startswith("attnlab ") and not joined.endswith("\\"):
            commands.append(joined)
    return commands


def test_every_documented_command_parses_and_every_link_resolves() -> None:
    """A renamed flag or command, or a moved results or test file, leaves the README's or a docs
    page's examples wrong with nothing failing: each one goes through the real parser here
    (nothing runs), each relative link must resolve from the page that holds it, and each test
    file a page cites must exist."""
    documents = _documents()
    assert len(documents) >= 12  # the README, the docs index and its pages, the results table
    parser = build_parser()
    counted = 0
    for page in documents:
        commands = _shell_commands(page.read_text())
        counted += len(commands)
        for command in commands:
            argv = shlex.split(command, comments=True)[1:]
            argv = argv[: next((i for i, a in enumerate(argv) if a in ("|", "&&", ">")), len(argv))]
            err = io.StringIO()
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                try:
                    args, extra = parser.parse_known_args(argv)
                    if extra:
                        config_flags_as_overrides(parser, args, extra)
                except SystemExit as e:
                    where = page.relative_to(ROOT)
                    assert e.code in (0, None), f"{where}: {command}: {err.getvalue().strip()}"
    assert counted >= 50  # the extraction still finds the documented examples
    links = [
        (page, target)
        for page in documents
        for target in re.findall(r"\]\(([^)#\s]+)", page.read_text())
        if not re.match(r"[a-z]+:", target)
    ]
    assert len(links) >= 30  # the README's links to docs/ and results/ at least
    broken = [f"{p.relative_to(ROOT)}: {t}" for p, t in links if not (p.parent / t).exists()]
    assert broken == []
    # test files the pages cite as evidence, by their path from the repository's root
    cited = {t for page in documents for t in re.findall(r"\btests/[\w/]+\.py\b", page.read_text())}
    assert len(cited) >= 5 and sorted(t for t in cited if not (ROOT / t).exists()) == []
