"""The K/V-bias seed's analyses: per-position loss (B vs A) and the name-generation test."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import run_cli, tiny_model, tiny_train
from test_export import failed_line
from test_folder_safety import snapshot

from attnlab.analysis.names import (
    canonical_speakers,
    detect_style,
    extract_headers,
    header_spans,
    plot,
    run_labels,
    score_names,
)
from attnlab.analysis.per_position import (
    char_offsets,
    grouped_difference,
    header_distances,
    line_columns,
    per_position_losses,
)
from attnlab.cli import main as cli_main

GUTENBERG = (
    "ACT I.\n\nSCENE I. Rousillon. A room.\n\n"
    "COUNTESS.\nIn delivering my son from me.\n\n"
    "FIRST LORD. [Aside.]\nHe is gone.\n\n"
    "  SONG.\n  indented, a song title\n\n"
    "II.\nA sonnet numbered in roman.\n\n"
    "Not a Header.\nmixed case\n"
    "HELENA.\nnot after a blank line\n\n"
    "M. JOURDAIN.\nAsmath!\n\n"
    "LAFEU.\n"  # no speech follows: not a header
)
TINY = (
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\n"
    "All:\nSpeak, speak.\n\n"
    "DUCHESS OF YORK:\nNo.\n\n"
    "Thus he said to me:\nmid-speech line after a blank\n\n"
    "ROMEO:\n"
)


def test_gutenberg_headers() -> None:
    assert extract_headers(GUTENBERG, "dot") == ["COUNTESS", "FIRST LORD", "M. JOURDAIN"]
    assert detect_style(GUTENBERG) == "dot"
    spans = header_spans(GUTENBERG, "dot")
    assert GUTENBERG[spans[0].start : spans[0].end] == "COUNTESS."
    assert GUTENBERG[spans[1].start : spans[1].end] == "FIRST LORD. [Aside.]"


def test_tinyshakespeare_headers() -> None:
    assert extract_headers(TINY, "colon") == ["First Citizen", "All", "DUCHESS OF YORK"]
    assert extract_headers(TINY) == extract_headers(TINY, "colon")  # auto detects the colon style
    assert extract_headers(TINY, "dot") == []
    with pytest.raises(ValueError, match="style"):
        header_spans(TINY, "semicolon")


def test_score_names_counts() -> None:
    cast, style = canonical_speakers(GUTENBERG)
    assert (cast, style) == ({"COUNTESS", "FIRST LORD", "M. JOURDAIN"}, "dot")
    samples = ["\nCOUNTESS.\nyes\n\nCOUNTESS.\nno\n\nBERTRAMO.\nhm\n", "\nFIRST  LORD.\nay\n"]
    score = score_names(samples, cast, style)
    assert score["headers"] == 4 and score["canonical_headers"] == 3
    assert score["fraction_canonical"] == 0.75
    assert (score["distinct_names"], score["distinct_canonical"]) == (3, 2)
    assert score["most_common"][0] == ("COUNTESS", 2) and score["invented"] == [("BERTRAMO", 1)]
    assert score_names(["no headers here"], cast, style)["fraction_canonical"] is None


def test_two_study_runs_get_two_bars(tmp_path: Path) -> None:
    """Runs of one seed (``.../vanilla-128/seed0``, ``.../kv-bias-112/seed0``) are told apart:
    by basename both were "seed0", and the figure drew their bars on top of each other."""
    runs = [str(tmp_path / "runs" / v / "seed0") for v in ("vanilla-128", "kv-bias-112")]
    assert run_labels(runs) == ["vanilla-128/seed0", "kv-bias-112/seed0"]
    assert run_labels([runs[0], str(tmp_path / "other")]) == ["seed0", "other"]
    score = {"headers": 4, "canonical_headers": 3, "distinct_names": 3, "distinct_canonical": 2}
    report = {"runs": dict.fromkeys(runs, score), "samples": 2, "length": 9, "cast_size": 5}
    fig = plot(report, tmp_path / "names.png")
    for ax in fig.axes[:2]:
        assert [t.get_text() for t in ax.get_xticklabels()] == run_labels(runs)
        assert len({bar.get_x() for bar in ax.patches}) == 2  # one bar position per run
    assert "vanilla-128/seed0 and kv-bias-112/seed0" in fig._suptitle.get_text()


def test_columns_and_header_distances() -> None:
    text = "ab\n\nCUR.\nxy\nz"
    offsets = np.arange(len(text))
    assert line_columns(text, offsets).tolist() == [0, 1, 2, 0, 0, 1, 2, 3, 4, 0, 1, 2, 0]
    distance, in_header = header_distances(text, offsets, "dot")
    assert distance.tolist() == [-1, -1, -1, -1, 0, 1, 2, 3, 4, 5, 6, 7, 8]
    # the header line runs from "C" to its newline (the newline ends the name)
    assert in_header.tolist() == [False] * 4 + [True] * 5 + [False] * 4
    assert char_offsets(["ab", "\n", "", "cde"]).tolist() == [0, 2, 3, 3]


def test_grouped_difference_by_hand() -> None:
    keys = np.array([-1, 0, 0, 1, 5, 7])
    a = np.array([1.0, 2.0, 4.0, 1.0, 3.0, 5.0])
    b = np.array([1.0, 1.0, 1.0, 2.0, 1.0, 1.0])
    rows = grouped_difference(keys, a, b, cap=5)
    assert [r["group"] for r in rows] == ["none", "0", "1", "5+"]
    assert [r["count"] for r in rows] == [1, 2, 1, 2]
    assert [r["b_minus_a"] for r in rows] == [0.0, -2.0, 1.0, -3.0]


def test_per_position_mean_is_split_loss(tiny_data: Path) -> None:
    from attnlab.analysis.loss import split_loss
    from attnlab.data.prepare import load_dataset
    from attnlab.model import GPT

    tokens = load_dataset(tiny_data).val[:1000]
    torch.manual_seed(0)
    model = GPT(tiny_model(vocab_size=96, use_m_gate=True)).eval()
    losses = per_position_losses(model, tokens, batch_size=8)
    assert losses.shape == (999,)
    assert losses.mean() == pytest.approx(split_loss(model, tokens, batch_size=8)["loss"], rel=1e-6)
    # the first target of the second window is predicted from that window's single token
    i = model.config.block_size
    with torch.no_grad():
        logits = model(torch.tensor([[int(tokens[i])]]))[0][0, -1]
    expected = torch.nn.functional.cross_entropy(logits, torch.tensor(int(tokens[i + 1])))
    assert losses[i] == pytest.approx(float(expected), rel=1e-5)
    # a shorter window changes the contexts, hence the losses
    assert not np.allclose(per_position_losses(model, tokens, block_size=16), losses)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, tiny_data: Path) -> tuple[Path, Path]:
    """A vanilla run (A) and a K/V-bias run (B) on the tiny corpus."""
    from attnlab.train.trainer import Trainer

    root = tmp_path_factory.mktemp("kv_runs")
    for name, model in (("vanilla", {}), ("kvbias", {"use_m_gate": True})):
        Trainer(
            root / name,
            tiny_model(**model),
            tiny_train(max_iters=20, eval_interval=20),
            tiny_data,
            quiet=True,
        ).run()
    return root / "vanilla", root / "kvbias"


def test_per_position_compare(runs: tuple[Path, Path]) -> None:
    from attnlab import from_pretrained
    from attnlab.analysis.loss import split_loss
    from attnlab.analysis.per_position import compare, escape, groupings, top_positions
    from attnlab.data.prepare import load_dataset

    cmp = compare(*runs, max_tokens=2000)
    assert cmp.loss_a.shape == cmp.loss_b.shape == (2000,) and len(cmp.pieces) == 2001
    data = load_dataset(json.loads((runs[0] / "config.json").read_text())["data"])
    assert cmp.text == data.tokenizer.decode(data.val[:2001])
    model_b, _ = from_pretrained(runs[1])
    assert cmp.loss_b.mean() == pytest.approx(
        split_loss(model_b, data.val[:2001])["loss"], rel=1e-6
    )

    top = top_positions(cmp, n=5, context=6)
    gains = [r["a_minus_b"] for r in top]
    assert gains == sorted(gains, reverse=True) and gains[0] == pytest.approx(
        float((cmp.loss_a - cmp.loss_b).max())
    )
    first = top[0]
    assert first["target"] == escape(cmp.text[first["position"]])
    assert first["context"] == escape(cmp.text[max(0, first["position"] - 6) : first["position"]])

    groups = groupings(cmp)
    for name, rows in groups.items():
        assert sum(r["count"] for r in rows) == 2000, name
        mean_a = sum(r["count"] * r["loss_a"] for r in rows) / 2000
        assert mean_a == pytest.approx(float(cmp.loss_a.mean()), rel=1e-9), name
    assert {r["group"] for r in groups["by_region"]} >= {"header", "speech"}


def test_per_position_cli(runs: tuple[Path, Path], tmp_path: Path) -> None:
    out = tmp_path / "pp" / "top.csv"
    result = run_cli(
        "analyze",
        "per-position",
        *map(str, runs),
        "--top",
        "7",
        "--max-tokens",
        "1500",
        "--out",
        str(out),
        "--device",
        "cpu",
    )
    assert result.returncode == 0, result.stderr
    assert "top 7 positions where B beats A" in result.stdout and " -> " in result.stdout
    with out.open() as f:
        rows = list(csv.DictReader(f))
    assert [int(r["rank"]) for r in rows] == list(range(1, 8))
    gains = [float(r["a_minus_b"]) for r in rows]
    assert gains == sorted(gains, reverse=True)
    for name in ("by_column", "by_header_distance", "by_region"):
        with (tmp_path / "pp" / f"top_{name}.csv").open() as f:
            assert sum(int(r["count"]) for r in csv.DictReader(f)) == 1500
    assert (tmp_path / "pp" / "top.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_per_position_writes_into_run_b_by_default(runs: tuple[Path, Path], tmp_path: Path) -> None:
    """Like every analysis, into RUN/analysis/ (B's), not the working folder."""
    a, b = (shutil.copytree(r, tmp_path / f"run_{n}") for n, r in zip("ab", runs, strict=True))
    work = tmp_path / "work"
    work.mkdir()
    args = ["analyze", "per-position", str(a), str(b), "--max-tokens", "300", "--device", "cpu"]
    result = run_cli(*args, cwd=work)
    assert result.returncode == 0, result.stderr
    assert list(work.iterdir()) == []
    written = sorted(p.name for p in (b / "analysis").iterdir())
    assert written == [
        "per_position.csv",
        "per_position.png",
        "per_position_by_column.csv",
        "per_position_by_header_distance.csv",
        "per_position_by_region.csv",
    ]
    assert not (a / "analysis").exists()


@pytest.mark.parametrize("kind", ["export", "best"])
@pytest.mark.parametrize(
    "analysis", ["per-position", "attention", "entropy", "gates", "hull", "names", "sink"]
)
def test_analyses_need_out_when_run_is_a_model_folder(
    runs: tuple[Path, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    kind: str,
    analysis: str,
) -> None:
    """The output went into the model folder's analysis/: an export's, which the next
    `export --out` there refused as foreign (or deleted with --overwrite), or a run's best/,
    which the next best checkpoint replaces whole."""
    if kind == "export":
        b = tmp_path / "exported"
        assert cli_main(["export", str(runs[1]), "--formats", "safetensors", "--out", str(b)]) == 0
    else:
        b = tmp_path / "run_b"
        shutil.copytree(runs[1], b)
        b = b / "best"
    capsys.readouterr()
    before = snapshot(tmp_path)
    name = "RUN_B" if analysis == "per-position" else "RUN"
    args = [str(runs[0]), str(b)] if analysis == "per-position" else [str(b)]
    status = cli_main(["analyze", analysis, *args, "--device", "cpu"])
    assert failed_line(capsys, status, f"analyze {analysis}") == (
        f"{name} {b} is not a run folder (no {name}/analysis/ to write into); pass --out"
    )
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("where", ["data", "export", "a file"])
def test_per_position_out_is_refused_where_its_tables_would_be_lost(
    runs: tuple[Path, Path],
    tiny_data: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    where: str,
) -> None:
    """--out data/x.csv or EXPORT/x.csv wrote five files into a folder that prepare or export
    replaces whole; a file on the way to --out was a traceback after the scoring."""
    data = tmp_path / "data"
    shutil.copytree(tiny_data, data)
    export = tmp_path / "export"
    assert cli_main(["export", str(runs[1]), "--formats", "safetensors", "--out", str(export)]) == 0
    (tmp_path / "notes").write_text("mine")
    capsys.readouterr()
    folder = {"data": data, "export": export, "a file": tmp_path / "notes"}[where]
    out = folder / "x.csv"
    before = snapshot(tmp_path)
    status = cli_main(["analyze", "per-position", *map(str, runs), "--out", str(out)])
    kind = "a prepared data folder" if where == "data" else "a model folder"
    assert failed_line(capsys, status, "analyze per-position") == (
        f"cannot write {folder} (Not a directory); choose another --out"
        if where == "a file"
        else f"--out {out} would put tables into {folder}, {kind} that attnlab replaces whole; "
        "choose another --out"
    )
    assert snapshot(tmp_path) == before


def test_name_test_is_seeded(runs: tuple[Path, Path], tiny_data: Path) -> None:
    from attnlab import from_pretrained
    from attnlab.analysis.names import name_test, sample_texts, training_cast

    model, tok = from_pretrained(runs[1])
    texts = sample_texts(model, tok, samples=3, length=70, seed=5)  # block 32: three segments
    assert texts != sample_texts(model, tok, samples=3, length=70, seed=6)
    assert [len(t) for t in texts] == [71] * 3  # prompt "\n" + 70 characters
    # within one block the segmented sampler is plain cached sampling: identical to the exact window
    short = sample_texts(model, tok, samples=2, length=30, seed=1)
    assert short == sample_texts(model, tok, samples=2, length=30, seed=1, exact_window=True)

    cast, style, _ = training_cast(tiny_data)
    assert style == "dot" and {"COUNTESS", "HELENA", "CLEOPATRA"} <= cast
    report = name_test(list(runs), samples=3, length=70, seed=5)
    assert report["cast_size"] == len(cast) and report["style"] == "dot"
    # a fresh model and generator reproduce the samples scored above
    assert report["runs"][str(runs[1])] == score_names(texts, cast, style)


def test_names_refuses_a_bpe_model_folder(
    tmp_path: Path, tiny_data: Path, capsys: pytest.CaptureFixture
) -> None:
    """A model folder has no run data to check, so a bpe model was sampled from a newline that
    encodes to nothing: an IndexError traceback in sample_next."""
    from test_folder_safety import snapshot

    from attnlab.cli import main
    from attnlab.data.tokenizer import Tokenizer
    from attnlab.model import GPT
    from attnlab.train.checkpoint import save_checkpoint

    tok = Tokenizer.train_bpe("ROMEO. to be or not to be, that is the question\n" * 20, 70)
    save_checkpoint(tmp_path / "bpe", GPT(tiny_model(vocab_size=tok.vocab_size)), tok)
    before = snapshot(tmp_path)
    args = ["--samples", "1", "--length", "8", "--out", str(tmp_path / "names")]
    status = main(["analyze", "names", str(tmp_path / "bpe"), *args, "--data", str(tiny_data)])
    assert status == 2 and capsys.readouterr().err.splitlines() == [
        f"attnlab analyze names: error: {tmp_path / 'bpe'}: the name test needs a char "
        "tokenizer (bpe drops the newlines)"
    ]
    assert snapshot(tmp_path) == before


def test_names_needs_data_for_a_model_folder(
    runs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A model folder's samples were scored against the embedded corpus's 834 speakers, whatever
    the model was trained on, and the command exited 0."""
    export = tmp_path / "export"
    assert cli_main(["export", str(runs[1]), "--formats", "safetensors", "--out", str(export)]) == 0
    capsys.readouterr()
    before = snapshot(tmp_path)
    args = ["--samples", "1", "--length", "8", "--out", str(tmp_path / "names")]
    status = cli_main(["analyze", "names", str(export), *args])
    assert failed_line(capsys, status, "analyze names") == (
        f"{export} is not a run folder, so its data is unknown: pass --data"
    )
    assert snapshot(tmp_path) == before


def test_names_command(runs: tuple[Path, Path], capsys: pytest.CaptureFixture) -> None:
    from attnlab.cli import main

    args = [
        "analyze",
        "names",
        str(runs[0]),
        "--samples",
        "2",
        "--length",
        "80",
        "--seed",
        "3",
        "--device",
        "cpu",
    ]
    assert main([*args, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    written = runs[0] / "analysis"  # CSVs and the figure beside the run's other analyses
    assert (written / "names.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with (written / "names.csv").open() as f:
        (row,) = csv.DictReader(f)
    assert int(row["headers"]) == report["runs"][str(runs[0])]["headers"]
    assert list(report["runs"]) == [str(runs[0])] and report["samples"] == 2
    assert main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    found = next(line for line in lines if line.startswith("headers found"))
    assert found.split()[-1] == str(
        report["runs"][str(runs[0])]["headers"]
    )  # same seed, same count
    assert main(["analyze", "names", str(runs[0]), "--samples", "0"]) == 2
    assert "--samples and --length must be >= 1" in capsys.readouterr().err
