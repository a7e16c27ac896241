"""Every bad input gets one line on stderr and exit status 2, never a traceback (--debug shows it).

Most cases run the CLI's ``main`` in-process (the ``attnlab`` fixture: same code, no interpreter
start-up); a few go end to end through ``python -m attnlab`` (run_cli).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli
from test_untrusted import model_dir  # noqa: F401  (a fixture: a saved tiny model folder)

TINY = ["block_size=32", "n_layer=2", "n_head=4", "n_embd=32", "max_iters=2", "eval_iters=1",
        "batch_size=4", "device=cpu", "tensorboard=false"]  # fmt: skip


def tiny(*overrides: str) -> list[str]:
    """TINY with ``overrides`` in place of its own values (a key given twice is refused)."""
    keys = {pair.partition("=")[0] for pair in overrides}
    return [pair for pair in TINY if pair.partition("=")[0] not in keys] + list(overrides)


@pytest.fixture
def attnlab(capsys: pytest.CaptureFixture):
    """``attnlab(*args)``: the CLI's main run in this process, as a CompletedProcess."""
    from attnlab.cli import main

    def run(*args: str) -> subprocess.CompletedProcess:
        status = main(list(args))
        out = capsys.readouterr()
        return subprocess.CompletedProcess(list(args), status, out.out, out.err)

    return run


def command_name(argv: list[str]) -> str:
    """How an error names the command: ``bench export``, ``analyze hull``, ``train``."""
    return " ".join(argv[:2]) if argv[0] in ("bench", "analyze") else argv[0]


def error_line(p: subprocess.CompletedProcess, command: str) -> str:
    """The one error line of a failed command, without its ``attnlab CMD: error:`` prefix."""
    assert p.returncode == 2, p.stdout + p.stderr
    assert "Traceback" not in p.stderr
    lines = p.stderr.splitlines()
    assert len(lines) == 1, p.stderr
    prefix = f"attnlab {command}: error: "
    assert lines[0].startswith(prefix)
    return lines[0][len(prefix) :]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["n_embd=30", "n_head=4"], "n_embd=30 must be divisible by n_head=4"),
        (["n_layer=-1"], "n_layer=-1 must be > 0"),
        (["batch_size=0"], "batch_size=0 must be > 0"),
        (
            ["norm=batchnorm"],
            "norm='batchnorm' is not allowed; choose one of 'layernorm', 'rmsnorm'",
        ),
        (["pos=alibi"], "pos='alibi' is not allowed; choose one of 'learned', 'rope'"),
        (["lerning_rate=1"], "unknown config key 'lerning_rate'; did you mean 'learning_rate'?"),
        (["n_layers=2"], "unknown config key 'n_layers'; did you mean 'n_layer'?"),
        (
            ["--preset", "shakespeare-chr"],
            "unknown preset 'shakespeare-chr' (did you mean shakespeare-char",
        ),
        (["learning_rate=1e999"], "learning_rate=inf must be a finite number"),  # overflows
        (["norm_eps=NaN"], "norm_eps=nan must be a finite number"),
        (["grad_clip=Infinity"], "grad_clip=inf must be a finite number"),
        (["max_seconds=NaN"], "max_seconds=nan must be a finite number"),
        (["rope_theta=-Infinity"], "rope_theta=-inf must be a finite number"),
        (["min_lr=NaN"], "min_lr=nan must be a finite number"),
        # lower case was a string: "must be of type float", unlike the TOML file's message
        (["learning_rate=nan"], "learning_rate=nan must be a finite number"),
        (["learning_rate=-inf"], "learning_rate=-inf must be a finite number"),
        # beyond int64 was accepted (torch cannot hold it)
        (["max_iters=99999999999999999999"], "max_iters=99999999999999999999 is too large"),
        # the mechanisms' own choices and rules (their SPECs)
        (
            ["m_inject=bogus"],
            "m_inject='bogus' is not allowed; choose one of 'kv', 'output_mul', 'mlp_input'",
        ),
        (["m_gate_detached=true"], "m_gate_detached=True needs use_m_gate=True"),
        (["m_inject=mlp_input"], "m_inject='mlp_input' needs use_m_gate=True"),
        (["boost_kv_source=x"], "boost_kv_source='x' is not allowed; choose one of 'residual'"),
        (
            ["boost_rounds=2", "boost_gate=mlp", "twicing=true"],
            "boost_gate='mlp' reads the entropy of softmax weights; it does not compose with "
            "twicing=True (2A - A^2 rows can be negative)",
        ),
    ],
)
def test_bad_train_config(attnlab, tiny_data: Path, tmp_path: Path, args, expected):
    p = attnlab("train", "--data", str(tiny_data), "--out", str(tmp_path / "run"), *args)
    assert error_line(p, "train").startswith(expected)
    assert not (tmp_path / "run").exists()


EMPTY = "{} is empty; name a file or folder"
NOT_UTF8 = "{} is not valid UTF-8; name a file or folder in UTF-8"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["train", "--data", ""], EMPTY.format("--data")),  # trained on the embedded corpus
        (["train", "--config", " "], EMPTY.format("--config")),
        (["sample", ""], EMPTY.format("RUN_OR_FOLDER")),
        (["export", "RUN", "--out", ""], EMPTY.format("--out")),
        (["analyze", "per-position", "", "B"], EMPTY.format("RUN_A")),
        (["train", "--init-from", "", *TINY], EMPTY.format("--init-from")),  # trained from scratch
        (["prepare", "--corpus", ""], EMPTY.format("--corpus")),  # read the current folder
        (["study", "", "--plan"], EMPTY.format("study")),
        (["bench", "prepare", "--scratch", ""], EMPTY.format("--scratch")),  # wrote to the cwd
        # argv's byte 0xff, as Python hands it on: train made the run folder, then tensorboard
        # died encoding its path (a UnicodeEncodeError)
        (["train", "--out", "r\udcff", *TINY], NOT_UTF8.format("--out r\\xff")),
        (["sample", "a\udcffb"], NOT_UTF8.format("RUN_OR_FOLDER a\\xffb")),
    ],
)
def test_an_empty_or_undecodable_path_is_refused(
    attnlab, tmp_path: Path, monkeypatch, args, expected
):
    """An empty path meant the default (or the current folder), silently; one that is not UTF-8
    failed after writing had begun."""
    from test_folder_safety import snapshot

    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path)
    p = attnlab(*args)
    assert error_line(p, command_name(args)) == expected
    assert snapshot(tmp_path) == before


# string arguments whose help or metavar speaks of files, folders or runs but that are no path
NOT_A_PATH = {
    ("sample", "prompt"),
    ("study", "variants"),
    ("sft", "args"),
    ("export", "formats"),  # a list of format names ("gguf: llama.cpp's file")
    ("study", "trackers"),  # tracker names ("every run")
}


def test_every_argument_that_names_a_file_or_folder_is_checked_as_one():
    """A new path option gets the empty and UTF-8 checks only if it is typed ``path_arg``; one
    left untyped (``train --init-from ""`` trained from scratch) is caught here."""
    import argparse

    from attnlab.cli import build_parser
    from attnlab.commands._common import path_arg

    def actions(parser: argparse.ArgumentParser, path: tuple[str, ...]):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from actions(sub, (*path, name))
            elif isinstance(action, argparse._StoreAction | argparse._AppendAction):
                yield path, action

    untyped, typed = [], 0
    for path, action in actions(build_parser(), ()):
        words = f"{action.help or ''} {action.metavar or ''}".lower()
        names_a_path = any(w in words for w in ("folder", "file", "dir", "ckpt", "run"))
        if action.type is path_arg:
            typed += 1
        elif (
            names_a_path
            and action.type is action.choices is None
            and (path[0], action.dest) not in NOT_A_PATH
        ):
            untyped.append(f"{' '.join(path)} {action.dest}")
    assert not untyped, f"path arguments without type=path_arg: {untyped}"
    assert typed >= 50


@pytest.mark.parametrize(
    ("toml", "expected"),
    [
        (  # the flat one won, silently
            "max_iters = 5\n[train]\nmax_iters = 50\n",
            "sets max_iters twice (in [train] and the top level); keep one",
        ),
        (
            "[model]\nn_layer = 2\n[train]\nn_layer = 3\n",
            "n_layer twice (in [model] and [train]); keep one",
        ),
        # applied to the model as if it had been under [model]
        ("[train]\nn_layer = 2\n", ": n_layer belongs in [model], not [train]"),
        ("[model]\nlearning_rate = 0.1\n", ": learning_rate belongs in [train], not [model]"),
    ],
)
def test_a_config_file_key_in_two_places_or_the_wrong_table_is_refused(
    attnlab, tiny_data: Path, tmp_path: Path, toml: str, expected: str
):
    config = tmp_path / "run.toml"
    config.write_text(toml)
    p = attnlab("train", "--config", str(config), "--data", str(tiny_data),
                "--out", str(tmp_path / "run"))  # fmt: skip
    line = error_line(p, "train")
    assert line.startswith(f"config file {config}") and line.endswith(expected), line
    assert not (tmp_path / "run").exists()


def test_unknown_key_end_to_end(tiny_data: Path, tmp_path: Path):
    p = run_cli("train", "--data", str(tiny_data), "--out", str(tmp_path / "run"), "lerning_rate=1")
    assert (
        error_line(p, "train") == "unknown config key 'lerning_rate'; did you mean 'learning_rate'?"
    )


def test_a_mechanism_rule_end_to_end(tiny_data: Path, tmp_path: Path):
    """A fresh interpreter refuses a mechanism's bad field before the run folder exists."""
    p = run_cli(
        "train", "--data", str(tiny_data), "--out", str(tmp_path / "run"), "value_gate_init=off"
    )
    assert (
        error_line(p, "train")
        == "value_gate_init='off' is not allowed; choose one of 'normal', 'zero'"
    )
    assert not (tmp_path / "run").exists()


def test_debug_shows_the_traceback(tiny_data: Path, tmp_path: Path):
    p = run_cli(
        "--debug",
        "train",
        "--data",
        str(tiny_data),
        "--out",
        str(tmp_path / "run"),
        "lerning_rate=1",
    )
    assert p.returncode != 0
    assert "Traceback (most recent call last)" in p.stderr
    assert p.stderr.splitlines()[-1] == (
        "attnlab.errors.AttnlabError: unknown config key 'lerning_rate'; did you mean 'learning_rate'?"
    )


def _missing(tmp_path: Path) -> tuple[Path, str]:
    return tmp_path / "missing.txt", "{path}: no such file or folder"


def _empty(tmp_path: Path) -> tuple[Path, str]:
    path = tmp_path / "empty.txt"
    path.write_text("\n\n")
    return path, "{path}: empty corpus (no text)"


def _latin1(tmp_path: Path) -> tuple[Path, str]:
    path = tmp_path / "latin1.txt"
    path.write_bytes("Fair Verona, caf\u00e9\n".encode("latin-1"))
    return path, "{path}: not UTF-8 text (byte 0xe9 at offset 16)"


@pytest.mark.parametrize("make", [_missing, _empty, _latin1])
def test_bad_corpus(attnlab, tmp_path: Path, make):
    path, expected = make(tmp_path)
    p = attnlab("prepare", "--corpus", str(path), "--out", str(tmp_path / "data"))
    assert error_line(p, "prepare") == expected.format(path=path)
    assert not (tmp_path / "data").exists()


def test_a_prompt_of_undecodable_bytes(model_dir: Path):  # noqa: F811
    """Bytes the terminal could not decode reach Python as lone surrogates: a traceback
    (UnicodeEncodeError) in the tokenizer."""
    p = run_cli("sample", str(model_dir), "--prompt", "ab\udced", "--max-new-tokens", "2")
    assert error_line(p, "sample") == (
        "the text holds '\\udced' at position 2, which is no character (undecodable bytes?)"
    )


def test_prompt_outside_the_char_vocabulary(model_dir: Path):  # noqa: F811
    p = run_cli(
        "sample",
        str(model_dir),
        "--prompt",
        "To be \u20ac or \u2603",
        "--device",
        "cpu",
        "--max-new-tokens",
        "2",
    )
    assert error_line(p, "sample") == "2 character(s) not in the vocabulary: '\u20ac', '\u2603'"


def _bpe_run(attnlab, tmp_path: Path) -> tuple[Path, Path]:
    """(data folder, run folder): a tiny run on a bpe corpus, whose tokenizer has no newline."""
    from attnlab.data.prepare import prepare

    (tmp_path / "corpus.txt").write_text("to be or not to be, that is the question\n" * 40)
    data = prepare([str(tmp_path / "corpus.txt")], "bpe", 40, tmp_path / "data")
    run = tmp_path / "run"
    assert attnlab("train", "--data", str(data), "--out", str(run), *TINY).returncode == 0
    return data, run


def test_sample_without_a_prompt_starts_a_bpe_run_where_demo_does(attnlab, tmp_path: Path):
    """The default prompt, a newline, encoded to no tokens with a bpe tokenizer (whitespace is
    no token there): sample refused every bpe run unless given --prompt."""
    from attnlab import from_pretrained
    from attnlab.data.prepare import load_dataset
    from attnlab.train.checkpoint import write_model_folder

    data, run = _bpe_run(attnlab, tmp_path)
    p = attnlab("sample", str(run), "--max-new-tokens", "2", "--device", "cpu")
    assert p.returncode == 0, p.stderr
    dataset = load_dataset(data)
    assert p.stdout.startswith(dataset.tokenizer.decode([int(dataset.val[0])]))
    # a model folder keeps no data to start from: one line that names the way out
    folder = tmp_path / "model"
    folder.mkdir()
    write_model_folder(folder, *from_pretrained(run))
    p = attnlab("sample", str(folder), "--max-new-tokens", "2", "--device", "cpu")
    assert error_line(p, "sample") == (
        f"the tokenizer of {folder} has no token for a newline, the default prompt, and no run "
        "data to start from; give --prompt"
    )


@pytest.mark.parametrize("damage", ["moved", "val.bin deleted", "val.bin empty"])
def test_sample_without_a_prompt_says_a_prompt_needs_no_data(attnlab, tmp_path: Path, damage):
    """Once a bpe run's data folder had moved, the error named the missing meta.json alone, not
    that --prompt samples without it; an empty val.bin was an IndexError traceback."""
    from test_folder_safety import snapshot

    data, run = _bpe_run(attnlab, tmp_path)
    data = data.resolve()  # as the run's config.json names it
    if damage == "moved":
        data.rename(tmp_path / "moved")
        reason = f"{data / 'meta.json'}: not found (run `attnlab prepare` first)"
    elif damage == "val.bin deleted":
        (data / "val.bin").unlink()
        reason = f"{data / 'val.bin'}: token file not found"
    else:
        (data / "val.bin").write_bytes(b"")
        reason = f"{data / 'val.bin'}: no tokens to start from"
    before = snapshot(tmp_path)
    args = ["sample", str(run), "--max-new-tokens", "2", "--device", "cpu"]
    assert error_line(attnlab(*args), "sample") == (
        f"{reason}; give --prompt TEXT to sample without {run}'s data "
        "(only the default prompt reads it)"
    )
    assert snapshot(tmp_path) == before
    p = attnlab(*args, "--prompt", "to be")  # the way out it names
    assert p.returncode == 0 and p.stdout.startswith("to be"), p.stderr


@pytest.fixture
def short_data(tmp_path: Path) -> Path:
    """A prepared folder of 300 characters in 30 lines (270 train, 30 val tokens)."""
    from attnlab.data.prepare import prepare

    (tmp_path / "short.txt").write_text("abcdefghi\n" * 30)
    return prepare(sources=[str(tmp_path / "short.txt")], out=tmp_path / "short")


@pytest.mark.parametrize(("block", "split"), [(64, "val"), (512, "train")])
def test_data_shorter_than_a_block(attnlab, short_data: Path, tmp_path: Path, block, split):
    n = json.loads((short_data / "meta.json").read_text())[f"{split}_tokens"]
    assert n < block + 1
    p = attnlab(
        "train",
        "--data",
        str(short_data),
        "--out",
        str(tmp_path / "run"),
        *tiny(f"block_size={block}"),
    )
    assert error_line(p, "train") == (
        f"{short_data / f'{split}.bin'}: {n} tokens, too few for block_size={block} "
        f"(need at least {block + 1})"
    )


def _poison_bin(data: Path, split: str) -> tuple[int, int]:
    """Put the id vocab_size + 7 into the middle of ``split``.bin; return (id, vocab_size)."""
    meta = json.loads((data / "meta.json").read_text())
    tokens = np.fromfile(data / f"{split}.bin", dtype=meta["dtype"])
    bad = meta["vocab_size"] + 7
    tokens[len(tokens) // 2] = bad
    tokens.tofile(data / f"{split}.bin")
    return bad, meta["vocab_size"]


def test_out_of_range_token_id_in_train_bin(attnlab, tiny_data: Path, tmp_path: Path):
    data = Path(shutil.copytree(tiny_data, tmp_path / "data"))
    bad, vocab = _poison_bin(data, "train")
    p = attnlab("train", "--data", str(data), "--out", str(tmp_path / "run"), *TINY)
    assert error_line(p, "train") == f"{data / 'train.bin'}: token id {bad} >= vocab size {vocab}"


def test_out_of_range_token_id_in_eval_data(model_dir: Path, tiny_data: Path, tmp_path: Path):  # noqa: F811
    data = Path(shutil.copytree(tiny_data, tmp_path / "data"))
    bad, vocab = _poison_bin(data, "val")
    p = run_cli("eval", str(model_dir), "--data", str(data), "--device", "cpu")
    assert error_line(p, "eval") == f"{data / 'val.bin'}: token id {bad} >= vocab size {vocab}"


def test_resume_of_a_folder_that_is_not_a_run(attnlab, model_dir: Path, tmp_path: Path):  # noqa: F811
    p = attnlab("train", "--resume", str(tmp_path / "nowhere"))
    assert (
        error_line(p, "train") == f"cannot resume {tmp_path / 'nowhere'}: there is no such folder"
    )
    (tmp_path / "empty").mkdir()
    p = attnlab("train", "--resume", str(tmp_path / "empty"))
    assert error_line(p, "train") == (
        f"cannot resume {tmp_path / 'empty'}: no config.json (is it a run folder?)"
    )
    assert sorted(q.name for q in (tmp_path / "empty").iterdir()) == []
    # a model folder has a config.json too, but not a run's
    p = attnlab("train", "--resume", str(model_dir))
    assert error_line(p, "train") == (
        f"cannot resume {model_dir}: its config.json is not a run's "
        "(a model folder? resume the run folder above it)"
    )


@pytest.mark.parametrize("name", ["../../../x", "a/b", "..", ".hidden", "a\\b", "c:x", ""])
def test_study_variant_names_cannot_escape_out(attnlab, tmp_path: Path, name):
    from test_folder_safety import snapshot

    spec = tmp_path / "study.toml"
    spec.write_text(
        f'[variants.{json.dumps(name)}]\npreset = "shakespeare-char"\n[scale.ci]\nseeds = 1\n'
    )
    before = snapshot(tmp_path.parent)
    p = attnlab("study", str(spec), "--preset", "ci", "--out", str(tmp_path / "out"))
    assert error_line(p, "study") == (
        f"{spec}: variant name {name!r} cannot be a folder name (no '/', '\\', ':' or leading '.')"
    )
    assert snapshot(tmp_path.parent) == before


@pytest.mark.parametrize(
    "overrides",
    [{}, {"pos": "rope", "norm": "rmsnorm", "mlp": "swiglu"}, {"tie_embeddings": False},
     {"n_kv_head": 2, "ffn_sublayers": 2, "d_ffn": 48}],
)  # fmt: skip
def test_parameter_estimate_is_the_backbone_without_norms(overrides):
    from conftest import tiny_model

    from attnlab.model import GPT
    from attnlab.model.memory import parameter_count

    config = tiny_model(**overrides)
    norms = (config.n_layer * (1 + config.ffn_sublayers) + 1) * config.n_embd
    assert parameter_count(config) == GPT(config).get_num_params(non_embedding=False) - norms


GIB8 = 8 * 2**30


def _needs(params: int, gib: float, task: str, batch: bool) -> str:
    return (
        f"cannot fit: more than {params:,} parameters need at least {gib:,.1f} GiB {task}, "
        "and cpu has 8.0 GiB; make it smaller (n_layer, n_embd, block_size, vocab_size"
        + (", batch_size)" if batch else ")")
    )


def _tiny_params(n_layer: int, vocab: int) -> int:
    """TINY's model (width 32, block 32, tied, learned positions, GELU) without its norms."""
    return vocab * 32 + 32 * 32 + n_layer * (4 * 32 * 32 + 8 * 32 * 32)


@pytest.mark.parametrize("n_layer", [10**9, 99999999999999999999999])
def test_a_model_too_large_for_memory_is_refused_before_allocating(
    attnlab, tiny_data: Path, tmp_path: Path, monkeypatch, n_layer
):
    monkeypatch.setattr("attnlab.model.memory.device_memory", lambda device: GIB8)
    vocab = json.loads((tiny_data / "meta.json").read_text())["vocab_size"]
    params = _tiny_params(n_layer, vocab)
    # weights, gradients and two AdamW moments, plus activations of 4 x 32 positions
    need = 4 * (4 * params + 4 * 32 * (n_layer * (2 * 32 + 128) + 2 * vocab))
    p = attnlab("train", "--data", str(tiny_data), "--out", str(tmp_path / "run"),
                *tiny(f"n_layer={n_layer}"))  # fmt: skip
    assert error_line(p, "train") == "the model " + _needs(
        params, need / 2**30, "to train with batch_size=4", True
    )
    assert list(tmp_path.iterdir()) == []
    p = attnlab("info", "shakespeare-char", f"n_layer={n_layer}")
    assert error_line(p, "info").startswith("shakespeare-char cannot fit: ")


def test_sample_info_and_import_refuse_a_model_too_large_for_memory(
    attnlab,
    model_dir: Path,  # noqa: F811
    tmp_path: Path,
    monkeypatch,
):
    from test_folder_safety import snapshot

    monkeypatch.setattr("attnlab.model.memory.device_memory", lambda device: GIB8)
    config = json.loads((model_dir / "config.json").read_text())
    huge = {**config, "n_layer": 10**9}
    params = _tiny_params(10**9, config["vocab_size"])
    (model_dir / "config.json").write_text(json.dumps(huge))
    weights = _needs(params, 4 * params / 2**30, "for the weights", False)
    p = attnlab("sample", str(model_dir), "--device", "cpu", "--max-new-tokens", "1")
    assert error_line(p, "sample") == f"{model_dir} {weights}"
    p = attnlab("info", str(model_dir))  # the estimate leaves out norms: "at least", not exact
    assert error_line(p, "info") == f"{model_dir} {weights}"
    ckpt = tmp_path / "ckpt.pt"
    import torch

    torch.save({"model": {}, "model_args": huge}, ckpt)
    before = snapshot(tmp_path)
    p = attnlab("import-nanogpt", str(ckpt), "--out", str(tmp_path / "imported"))
    assert error_line(p, "import-nanogpt") == f"{ckpt} {weights}"
    assert snapshot(tmp_path) == before


DEVICE_COMMANDS = {
    "train": lambda m, d, o, dev: ["train", "--data", d, "--out", o, *tiny(f"device={dev}")],
    "sft": lambda m, d, o, dev: ["sft", m, "--out", o, "max_iters=1", f"device={dev}"],
    "sample": lambda m, d, o, dev: ["sample", m, "--device", dev, "--max-new-tokens", "1"],
    "eval": lambda m, d, o, dev: ["eval", m, "--data", d, "--device", dev],
    "chat": lambda m, d, o, dev: ["chat", m, "--device", dev],
    "bench": lambda m, d, o, dev: ["bench", "train", "--device", dev],
}
DEVICES = {
    "bogus": "device='bogus' is not a device; choose one of: auto, cpu",
    "cuda": "device='cuda': no CUDA GPU is available here; choose one of: auto, cpu",
    "cuda:3": "device='cuda:3': no CUDA GPU is available here; choose one of: auto, cpu",
    "mps": "device='mps': Apple's MPS is not available here; choose one of: auto, cpu",
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("command", DEVICE_COMMANDS)
def test_a_device_this_machine_lacks_gets_one_line(
    attnlab,
    model_dir: Path,  # noqa: F811
    tiny_data: Path,
    tmp_path: Path,
    monkeypatch,
    command,
    device,
):
    import torch
    from test_folder_safety import snapshot

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the same on a GPU machine
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    before = snapshot(tmp_path)
    args = DEVICE_COMMANDS[command](str(model_dir), str(tiny_data), str(tmp_path / "o"), device)
    assert error_line(attnlab(*args), command_name(args)) == DEVICES[device]
    assert snapshot(tmp_path) == before


def _a_folder(tmp_path: Path) -> tuple[Path, str]:
    return tmp_path, "config file {path}: Is a directory; --config takes a TOML file"


def _not_utf8(tmp_path: Path) -> tuple[Path, str]:
    path = tmp_path / "run.toml"
    path.write_bytes(b"max_iters = 3 # caf\xe9\n")
    return path, "config file {path} is not UTF-8 text"


def _no_such(tmp_path: Path) -> tuple[Path, str]:
    return tmp_path / "no.toml", "config file {path} does not exist"


@pytest.mark.parametrize("make", [_a_folder, _not_utf8, _no_such])
def test_a_config_that_is_not_a_toml_file(attnlab, tiny_data: Path, tmp_path: Path, make):
    from test_folder_safety import snapshot

    path, expected = make(tmp_path)
    before = snapshot(tmp_path)
    p = attnlab("train", "--config", str(path), "--data", str(tiny_data), "--out",
                str(tmp_path / "run"), *TINY)  # fmt: skip
    assert error_line(p, "train") == expected.format(path=path)
    assert snapshot(tmp_path) == before


SAMPLING = [
    (["--temperature", "-1"], "temperature=-1.0 must be a finite number >= 0 (0 is greedy)"),
    (["--temperature", "nan"], "temperature=nan must be a finite number >= 0 (0 is greedy)"),
    (["--top-p", "0"], "top_p=0.0 must be in (0, 1]"),
    (["--top-p", "1.5"], "top_p=1.5 must be in (0, 1]"),
    (["--top-p", "nan"], "top_p=nan must be in (0, 1]"),
    (["--top-k", "0"], "top_k=0 must be an integer >= 1"),
    (["--max-new-tokens", "-1"], "max_new_tokens=-1 must be an integer >= 0"),
    (["--num-samples", "0"], "num_samples=0 must be >= 1"),
]


@pytest.mark.parametrize(
    ("command", "args", "expected"),
    [("sample", *case) for case in SAMPLING]
    + [
        ("chat", *case)
        for case in SAMPLING
        if case[0][0] not in ("--num-samples", "--max-new-tokens")
    ],
)
def test_invalid_sampling_values_are_refused(attnlab, model_dir: Path, command, args, expected):  # noqa: F811
    assert error_line(attnlab(command, str(model_dir), *args), command) == expected


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [({"temperature": -1.0}, "temperature=-1.0 must be a finite number >= 0 (0 is greedy)"),
     ({"top_p": 2.0}, "top_p=2.0 must be in (0, 1]"),
     ({"top_k": 0}, "top_k=0 must be an integer >= 1"),
     ({"max_new_tokens": -3}, "max_new_tokens=-3 must be an integer >= 0")],
)  # fmt: skip
def test_generate_refuses_invalid_sampling_values(kwargs, expected):
    import torch
    from conftest import tiny_model

    from attnlab.errors import ConfigError
    from attnlab.model import GPT

    model = GPT(tiny_model())
    options = {"max_new_tokens": 2, **kwargs}
    with pytest.raises(ConfigError) as err:
        model.generate(torch.zeros((1, 1), dtype=torch.long), **options)
    assert str(err.value) == expected


def test_sample_into_a_closed_pipe_ends_quietly(model_dir: Path):  # noqa: F811
    import os
    import sys

    from conftest import ROOT

    proc = subprocess.Popen(
        [sys.executable, "-m", "attnlab", "sample", str(model_dir), "--device", "cpu",
         "--max-new-tokens", "20000", "--num-samples", "50"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert len(proc.stdout.read(10)) == 10  # what `| head -c 10` reads
    proc.stdout.close()
    assert proc.wait(timeout=120) == 0
    assert proc.stderr.read() == b""


def test_chat_reads_invalid_utf8_with_replacement_characters(tmp_path: Path):
    import os
    import sys

    from conftest import ROOT, tiny_model
    from test_chat import chat_tokenizer

    from attnlab.model import GPT
    from attnlab.train.checkpoint import save_checkpoint

    tok = chat_tokenizer()
    save_checkpoint(tmp_path / "m", GPT(tiny_model(vocab_size=tok.vocab_size, block_size=64)), tok)
    p = subprocess.run(
        [sys.executable, "-m", "attnlab", "chat", str(tmp_path / "m"), "--max-new-tokens", "2"],
        input=b"caf\xe9 \xff\n/exit\n", capture_output=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    # U+FFFD is not in the char model's vocabulary: that line is refused, the chat goes on
    assert p.stderr.decode() == "attnlab chat: 1 character(s) not in the vocabulary: '\ufffd'\n"


@pytest.fixture
def other_data(tmp_path: Path) -> Path:
    """A char data folder whose characters (and so ids) differ from the tiny data's."""
    from attnlab.data.prepare import prepare

    (tmp_path / "other.txt").write_text("xyz \u00e9\u00e8\n" * 400)
    return prepare(sources=[str(tmp_path / "other.txt")], out=tmp_path / "other")


@pytest.fixture
def wide_data(tmp_path: Path) -> Path:
    """A char data folder of 301 distinct characters: more than the tiny model's vocabulary."""
    from attnlab.data.prepare import prepare

    (tmp_path / "wide.txt").write_text(("".join(chr(0x100 + i) for i in range(300)) + "\n") * 20)
    return prepare(sources=[str(tmp_path / "wide.txt")], out=tmp_path / "wide")


FIX = "pass the data the model was trained on with --data"


@pytest.mark.parametrize("command", [["eval"], ["analyze", "gates"]])
def test_model_and_data_must_share_a_tokenizer(
    attnlab,
    model_dir: Path,  # noqa: F811
    other_data: Path,
    wide_data: Path,
    tmp_path: Path,
    command,
):
    name = command_name(command)
    if command[0] == "analyze":  # a model folder has no RUN/analysis/ to write into
        command = [*command, "--out", str(tmp_path / "analysis")]
    p = attnlab(*command, str(model_dir), "--device", "cpu")
    assert error_line(p, name) == (
        f"{model_dir} is not a run folder, so its data is unknown: pass --data"
    )
    p = attnlab(*command, str(model_dir), "--data", str(other_data), "--device", "cpu")
    message = error_line(p, name)
    assert message.startswith(f"{model_dir} has another tokenizer than {other_data} (")
    assert message.endswith(f"); {FIX}")
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    p = attnlab(*command, str(model_dir), "--data", str(wide_data), "--device", "cpu")
    assert error_line(p, name) == (
        f"{wide_data} has 301 tokens, more than the vocab_size={vocab} of {model_dir}; {FIX}"
    )


def test_resume_keeps_its_own_data_preset_and_config(train_tiny, attnlab, other_data, tmp_path):
    from test_folder_safety import snapshot

    run = tmp_path / "run"
    train_tiny(run, until=5, max_iters=10, ckpt_interval=5)
    before = snapshot(run)
    p = attnlab("train", "--resume", str(run), "--data", str(other_data))
    assert error_line(p, "train") == (
        f"cannot resume {run}: {other_data} does not hold the data it was trained on (its "
        "tokenizer differs from the checkpoint's); pass --data with the folder that holds it"
    )
    p = attnlab("train", "--resume", str(run), "--preset", "qkve-small", "--config", "x.toml")
    assert error_line(p, "train") == (
        "--preset, --config: a resumed run keeps its own; leave them out"
    )
    # seed=5 went into config.json while the weights and batches stayed seed 1337's; another
    # eval_iters or eval_seed switched the validation batches mid-run (best/ compared both)
    p = attnlab("train", "--resume", str(run), "seed=5", "eval_iters=1", "max_iters=12")
    assert error_line(p, "train") == (
        "cannot change on resume: eval_iters=1 (the run's: 4), seed=5 (the run's: 1337); a run "
        "keeps the seed and batch size its weights and batches came from, and the validation "
        "batches its val losses and best/ compare (to score other batches: attnlab eval)"
    )
    p = attnlab("train", "--resume", str(run), "batch_size=4")  # was: "sampler state has ..."
    assert error_line(p, "train").startswith(
        "cannot change on resume: batch_size=4 (the run's: 8); a run keeps the seed and batch "
    )
    assert snapshot(run) == before
    assert attnlab("train", "--resume", str(run), "seed=1337", "eval_seed=2024").returncode == 0


def test_a_run_resumes_from_its_data_where_it_is_now(tiny_data, attnlab, tmp_path):
    """A run copied to another machine, or whose data folder moved, could not resume: its data
    was "not found (run attnlab prepare first)", and --data was refused although the run's
    fingerprint of its data proves the moved folder holds the same."""
    import shutil

    from conftest import tiny_model, tiny_train
    from test_folder_safety import snapshot

    from attnlab.train.trainer import Trainer

    run, own, moved = tmp_path / "run", tmp_path / "data", tmp_path / "moved"
    shutil.copytree(tiny_data, own)
    cfg = tiny_train(max_iters=10, ckpt_interval=5)
    Trainer(run, tiny_model(), cfg, own, quiet=True).run(until=5)
    own.rename(moved)
    before = snapshot(run)
    p = attnlab("train", "--resume", str(run))
    assert error_line(p, "train") == (
        f"cannot resume {run}: its data folder {own} is gone (moved, or the run was copied from "
        "another machine?); pass --data with the folder that holds that data now"
    )
    assert snapshot(run) == before
    assert attnlab("train", "--resume", str(run), "--data", str(moved)).returncode == 0
    assert json.loads((run / "config.json").read_text())["data"] == str(moved.resolve())
    assert json.loads((run / "summary.json").read_text())["iters"] == 10


def test_a_preset_trained_on_other_data_takes_the_data_vocabulary(
    attnlab, tiny_data: Path, tmp_path: Path
):
    small = ["n_layer=1", "n_head=4", "n_embd=32", "block_size=32", "batch_size=2",
             "eval_iters=1", "max_iters=1", "device=cpu", "tensorboard=false"]  # fmt: skip
    run = tmp_path / "run"
    p = attnlab("train", "--preset", "gba-lm-boosted", "--data", str(tiny_data), "--out", str(run),
                *small)  # fmt: skip
    assert p.returncode == 0, p.stderr
    vocab = json.loads((tiny_data / "meta.json").read_text())["vocab_size"]
    assert json.loads((run / "config.json").read_text())["model"]["vocab_size"] == vocab
    assert (
        f"vocab_size {vocab:,}: the data's (gba-lm-boosted's 16,384 is for its own data; "
        "set vocab_size= to keep it)"
    ) in p.stderr.splitlines()


def test_info_of_a_char_preset_describes_what_train_builds(attnlab, tmp_path: Path):
    from attnlab.config import ModelConfig
    from attnlab.data.prepare import prepare
    from attnlab.model import GPT

    data = prepare(out=tmp_path / "embedded")  # what `train --preset qkve-small` trains on
    vocab = json.loads((data / "meta.json").read_text())["vocab_size"]
    p = attnlab("info", "qkve-small")
    assert p.returncode == 0, p.stderr
    assert f"  vocab_size         {vocab}" in p.stdout.splitlines()
    params = GPT(ModelConfig.preset("qkve-small", vocab_size=vocab)).get_num_params(False)
    assert any(line.split()[-1] == f"{params:,}" for line in p.stdout.splitlines()
               if line.strip().startswith("total"))  # fmt: skip


def test_info_of_an_onnx_only_export_shows_its_config(
    attnlab,
    model_dir: Path,  # noqa: F811
    tmp_path: Path,
):
    """It said the folder "holds no checkpoint"; info reads no weights, only config.json."""
    from test_folder_safety import snapshot

    full, onnx_only = tmp_path / "full", tmp_path / "onnx-only"
    for out, formats in ((full, "safetensors"), (onnx_only, "onnx")):
        done = attnlab("export", str(model_dir), "--out", str(out), "--formats", formats)
        assert done.returncode == 0, done.stderr
    before = snapshot(tmp_path)
    p, described = attnlab("info", str(onnx_only)), attnlab("info", str(full))
    assert p.returncode == 0 and p.stderr == "", p.stderr
    lines = p.stdout.splitlines()
    assert lines[:2] == [
        str(onnx_only),
        "  an export of model.onnx only, no PyTorch weights: shown from its config.json; "
        f"`attnlab sample {onnx_only} --backend onnxruntime` runs it",
    ]
    assert lines[2:] == described.stdout.splitlines()[1:]  # what the weights' export shows
    assert snapshot(tmp_path) == before


def _metrics_garbage(run: Path) -> str:
    with (run / "metrics.csv").open("a") as f:
        f.write(
            "abc"
            + "," * (len((run / "metrics.csv").read_text().splitlines()[0].split(",")) - 1)
            + "\n"
        )
    n = len((run / "metrics.csv").read_text().splitlines())
    return f"{run / 'metrics.csv'}: line {n} is not a metrics row (its iter is 'abc'); repair or remove that line to resume"


def _config_not_objects(run: Path) -> str:
    config = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**config, "model": 1}))
    return f"cannot resume {run}: {run / 'config.json'} is damaged (its model and train must be JSON objects)"


def _config_bad_field(run: Path) -> str:
    config = json.loads((run / "config.json").read_text())
    config["model"]["n_layer"] = "two"
    (run / "config.json").write_text(json.dumps(config))
    return f"cannot resume {run}: {run / 'config.json'}: n_layer='two' must be of type int"


def _config_bad_mechanism_field(run: Path) -> str:
    config = json.loads((run / "config.json").read_text())
    config["model"]["boost_gate"] = "tanh"
    (run / "config.json").write_text(json.dumps(config))
    return (
        f"cannot resume {run}: {run / 'config.json'}: boost_gate='tanh' is not allowed; "
        "choose one of 'none', 'scalar', 'linear', 'mlp'"
    )


def _latest_tokenizer_emptied(run: Path) -> str:
    """It blamed the data folder ("no longer holds the data it was trained on")."""
    (run / "latest" / "tokenizer.json").write_text("")
    return (
        f"{run / 'latest' / 'tokenizer.json'}: not a valid tokenizer.json (EOF while parsing a "
        "value at line 1 column 0)"
    )


def _metrics_header_text(run: Path) -> str:
    """Accepted: the rows written under that header lost every value."""
    (run / "metrics.csv").write_text("hello world\nfoo,bar\n")
    return (
        f"{run / 'metrics.csv'} is not a metrics table (its header is 'hello world', not "
        "iter,...,val_loss,...); repair or remove it to resume"
    )


def _config_lost_train_field(run: Path) -> str:
    """Accepted: the default warmup filled in, and written back as the run's."""
    config = json.loads((run / "config.json").read_text())
    del config["train"]["warmup_iters"]
    (run / "config.json").write_text(json.dumps(config))
    return (
        f"cannot resume {run}: {run / 'config.json'} has no train warmup_iters (latest/ trained "
        "with 5); restore it as the run wrote it"
    )


@pytest.mark.parametrize(
    "damage",
    [_metrics_garbage, _metrics_header_text, _config_not_objects, _config_bad_field,
     _config_bad_mechanism_field, _config_lost_train_field, _latest_tokenizer_emptied],
)  # fmt: skip
def test_resume_of_a_damaged_run_gets_one_line(attnlab, train_tiny, tmp_path: Path, damage):
    from test_folder_safety import snapshot

    run = tmp_path / "run"
    train_tiny(run, until=5, max_iters=10, ckpt_interval=5)
    expected = damage(run)
    before = snapshot(run)
    assert error_line(attnlab("train", "--resume", str(run)), "train") == expected
    assert snapshot(run) == before


@pytest.mark.parametrize(
    ("toml", "expected"),
    [("model = 3\n", "model must be a table, not 3"),
     ("train = 'fast'\n", "train must be a table, not 'fast'"),
     ("preset = 5\n", "preset must be a name, not 5"),
     ("data = 5\n", "data must be a folder path, not 5")],
)  # fmt: skip
def test_a_toml_config_of_the_wrong_shape(attnlab, tiny_data: Path, tmp_path: Path, toml, expected):
    path = tmp_path / "run.toml"
    path.write_text(toml)
    p = attnlab(
        "train", "--config", str(path), "--data", str(tiny_data), "--out", str(tmp_path / "run")
    )
    assert error_line(p, "train") == f"config file {path}: {expected}"
    assert sorted(q.name for q in tmp_path.iterdir()) == ["run.toml"]


def test_ctrl_c_in_chat_stops_the_reply_then_quits_at_the_prompt(
    attnlab, tmp_path: Path, monkeypatch
):
    import io
    import sys

    import torch
    from conftest import tiny_model
    from test_chat import chat_tokenizer

    from attnlab.model import GPT, generation
    from attnlab.train.checkpoint import save_checkpoint

    tok = chat_tokenizer()
    save_checkpoint(tmp_path / "m", GPT(tiny_model(vocab_size=tok.vocab_size, block_size=64)), tok)
    a, b = tok.encode("a")[0], tok.encode("b")[0]
    calls = []

    def stream(*args, **kwargs):  # the first reply is interrupted after one token
        calls.append(args[1][0].tolist())
        yield torch.tensor([[a]])
        if len(calls) == 1:
            raise KeyboardInterrupt
        yield torch.tensor([[b]])

    class Stdin(io.StringIO):  # two messages, then Ctrl-C at the prompt
        def readline(self, *args):
            line = super().readline(*args)
            if not line:
                raise KeyboardInterrupt
            return line

    monkeypatch.setattr(generation, "stream", stream)
    monkeypatch.setattr(sys, "stdin", Stdin("hi\nhi\n"))
    p = attnlab("chat", str(tmp_path / "m"), "--device", "cpu")
    assert p.returncode == 0, p.stderr
    assert p.stdout == "a\n(stopped)\nab\n\n"
    assert calls[0] == calls[1]  # the stopped reply did not join the history


SEED = "must be a whole number from 0 to 4294967295"
BIG = "99999999999999999999"  # past 64 bits: torch.manual_seed overflowed with a traceback


@pytest.mark.parametrize(
    ("argv", "name", "value"),
    [(["train", "--data", "{data}", "--out", "{out}", f"seed={BIG}"], "seed", BIG),
     (["train", "--data", "{data}", "--out", "{out}", "eval_seed=-1"], "eval_seed", "-1"),
     (["sample", "{model}", "--seed", "4294967296"], "seed", "4294967296"),
     (["chat", "{model}", "--seed", "-1"], "seed", "-1"),
     (["analyze", "names", "{model}", "--out", "{out}", "--seed", BIG], "seed", BIG),
     (["retrieval", "--seed", BIG], "seed", BIG)],
)  # fmt: skip
def test_a_seed_out_of_range_gets_one_line(
    attnlab,
    model_dir: Path,  # noqa: F811
    tiny_data: Path,
    tmp_path: Path,
    argv,
    name,
    value,
):
    from test_folder_safety import snapshot

    before = snapshot(tmp_path)
    args = [a.format(data=tiny_data, out=tmp_path / "run", model=model_dir) for a in argv]
    assert error_line(attnlab(*args), command_name(argv)) == f"{name}={value} {SEED}"
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(
    "argv",
    [["sample", "{model}", "--max-new-tokens", "1"],
     ["bench", "generate", "--quick", "--out", "{out}"],
     ["bench", "export", "--model", "{model}", "--no-compile"]],
)  # fmt: skip
def test_more_threads_than_cpus_gets_one_line(attnlab, model_dir: Path, tmp_path: Path, argv):  # noqa: F811
    """Past 2**63 torch.set_num_threads overflowed with a traceback; past the CPUs it only
    slows every op down."""
    import os

    from test_folder_safety import snapshot

    before = snapshot(tmp_path)
    args = [a.format(model=model_dir, out=tmp_path / "g.png") for a in argv]
    for threads in (BIG, str(os.cpu_count() + 1)):
        assert error_line(attnlab(*args, "--threads", threads), command_name(argv)) == (
            f"--threads {threads} is more than the {os.cpu_count()} CPUs here"
        )
    assert snapshot(tmp_path) == before


def _per_position_outs(tmp_path: Path) -> list[tuple[Path, str]]:
    """(--out, the error) for outs that per-position must not write (it overwrote a .txt)."""
    (tmp_path / "notes.txt").write_text("my notes\n")
    (tmp_path / "mine.csv").write_text("a,b\n1,2\n")
    (tmp_path / "folder").mkdir()
    (tmp_path / "fig.png").write_bytes(b"\x89PNG not ours")
    csv = "must name a .csv file (the grouped tables and the PNG go next to it)"
    foreign = (
        "exists and is not one of analyze per-position's files; choose another --out or move it"
    )
    return [
        (tmp_path / "notes.txt", f"--out {tmp_path / 'notes.txt'} {csv}"),
        (tmp_path / "folder", f"--out {tmp_path / 'folder'} {csv}"),
        (tmp_path / "mine.csv", f"{tmp_path / 'mine.csv'} {foreign}"),
        (tmp_path / "fig.csv", f"{tmp_path / 'fig.png'} {foreign}"),
    ]


def test_per_position_refuses_an_out_it_did_not_write(
    attnlab,
    model_dir: Path,  # noqa: F811
    tiny_data: Path,
    tmp_path: Path,
):
    from test_folder_safety import snapshot

    work, other = tmp_path / "work", tmp_path / "other"
    work.mkdir()
    shutil.copytree(model_dir, other)
    cases = _per_position_outs(work)
    argv = ["analyze", "per-position", str(model_dir), str(other), "--data", str(tiny_data),
            "--device", "cpu", "--max-tokens", "100"]  # fmt: skip
    before = snapshot(tmp_path)
    same = [*argv[:3], str(model_dir), *argv[4:], "--out", str(work / "pp.csv")]
    assert error_line(attnlab(*same), "analyze per-position") == (  # compared a run with itself
        f"RUN_A and RUN_B are both {model_dir}; compare two different runs"
    )
    for out, expected in cases:
        assert error_line(attnlab(*argv, "--out", str(out)), "analyze per-position") == expected
    for flags, got in ((["--top", "0"], "0 and 12"), (["--context", "-1"], "20 and -1")):
        p = attnlab(*argv, "--out", str(work / "pp.csv"), *flags)
        assert error_line(p, "analyze per-position") == (
            f"--top must be >= 1 and --context >= 0, got {got}"
        )
    assert snapshot(tmp_path) == before
    # its own files are replaced, and a context longer than the text is the whole text
    for _ in range(2):
        p = attnlab(*argv, "--out", str(work / "pp.csv"), "--context", "99999999999999999999")
        assert p.returncode == 0, p.stderr
    assert (work / "pp.csv").read_text().startswith("rank,position,context,")


@pytest.fixture
def boosted_dir(tiny_data: Path, tmp_path: Path) -> Path:
    """An untrained 2-layer boosted (M=2) model folder with the tiny data's tokenizer."""
    import torch
    from conftest import tiny_model

    from attnlab.data.prepare import load_dataset
    from attnlab.model import GPT
    from attnlab.train.checkpoint import save_checkpoint

    tok = load_dataset(tiny_data).tokenizer
    torch.manual_seed(0)
    model = GPT(tiny_model(vocab_size=tok.vocab_size, boost_rounds=2))
    return save_checkpoint(tmp_path / "boosted", model, tok)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [(["attention", "--top", "0"], "--top and --window must be >= 1, got 0 and 16"),
     (["attention", "--window", "-1"], "--top and --window must be >= 1, got 2 and -1"),
     # an out-of-range layer was clamped: --layer 7 silently showed layer 1
     (["attention", "--layer", "7"], "--layer 7 is out of range: the model has layers 0..1"),
     (["attention", "--layer", "-1"], "--layer -1 is out of range: the model has layers 0..1"),
     (["hull", "--positions", "0"], "--positions must be >= 1, got 0"),
     # was "the split has N tokens: fewer than one window", however long the split
     (["gates", "--sequences", "0"], "--sequences must be >= 1, got 0"),
     (["entropy", "--sequences", "-2"], "--sequences must be >= 1, got -2")],
)  # fmt: skip
def test_analysis_counts_out_of_range_get_one_line(
    attnlab, boosted_dir: Path, tiny_data: Path, tmp_path: Path, argv, expected
):
    from test_folder_safety import snapshot

    before = snapshot(tmp_path)
    p = attnlab("analyze", argv[0], str(boosted_dir), "--data", str(tiny_data), "--sequences",
                "1", *argv[1:], "--out", str(tmp_path / "out"))  # fmt: skip
    assert error_line(p, f"analyze {argv[0]}") == expected
    assert snapshot(tmp_path) == before


GOOD_SPEC = '[variants.a]\npreset = "shakespeare-char"\n[scale.ci]\nseeds = 1\n'


def _spec_not_utf8(tmp_path: Path) -> tuple[list[str], str]:
    spec = tmp_path / "study.toml"
    spec.write_bytes(b"# caf\xe9\n" + GOOD_SPEC.encode())
    return [str(spec)], f"study spec {spec} is not UTF-8 text"


def _spec_bad_value(tmp_path: Path) -> tuple[list[str], str]:
    spec = tmp_path / "study.toml"
    spec.write_text(GOOD_SPEC + '[scale.ci.model]\nn_layer = "two"\n')
    return [str(spec)], f"{spec}: variant 'a' at ci: n_layer='two' must be of type int"


def _study_data_missing(tmp_path: Path) -> tuple[list[str], str]:
    spec = tmp_path / "study.toml"
    spec.write_text(GOOD_SPEC)
    data = tmp_path / "nowhere"
    return [str(spec), "--data", str(data)], (
        f"{data / 'meta.json'}: not found (run `attnlab prepare` first)"
    )


@pytest.mark.parametrize("make", [_spec_not_utf8, _spec_bad_value, _study_data_missing])
def test_a_study_that_cannot_run_writes_no_folder(attnlab, tmp_path: Path, make):
    """These made the study folder, failed every run (a non-UTF-8 spec: a traceback) and
    exited 1 with the reason only inside report.md."""
    from test_folder_safety import snapshot

    args, expected = make(tmp_path)
    before = snapshot(tmp_path)
    p = attnlab("study", *args, "--preset", "ci", "--out", str(tmp_path / "out"))
    assert error_line(p, "study") == expected
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(
    ("args", "expected"),
    [(["--sigma", "nan"], "sigma=nan must be a finite number > 0"),  # every method scored 0%
     (["--sigma", "inf"], "sigma=inf must be a finite number > 0"),
     (["--sigma", "0"], "sigma=0.0 must be a finite number > 0"),
     (["--methods", ","], "no methods given; choose from random, bayes, one-step, "
      "converged-backprop, converged-deq, boosted"),  # was a traceback after the header
     (["--gate", "tanh"], "unknown gate 'tanh'; allowed: none, scalar, linear, mlp")],
)  # fmt: skip
def test_retrieval_refuses_meaningless_settings(attnlab, args, expected):
    p = attnlab("retrieval", "--steps", "1", "--queries", "10", *args)
    assert error_line(p, "retrieval") == expected
    assert p.stdout == ""


@pytest.mark.parametrize(
    ("argv", "out", "expected"),
    [(["analyze", "entropy", "{model}", "--data", "{data}", "--sequences", "1"], "notes.txt",
      "{out} exists and is not a folder; choose another --out"),  # a traceback after the analysis
     (["analyze", "names", "{model}", "--data", "{data}"], "notes.txt",
      "{out} exists and is not a folder; choose another --out"),
     # matplotlib wrote a folder --out's figure beside it as FOLDER.png
     (["bench", "generate", "--quick"], "folder", "--out {out} must name a .png file to write"),
     (["bench", "overhead", "--quick"], "notes.txt", "--out {out} must name a .png file to write")],
)  # fmt: skip
def test_an_out_of_the_wrong_kind_is_refused_before_the_work(
    attnlab,
    model_dir: Path,  # noqa: F811
    tiny_data: Path,
    tmp_path: Path,
    argv,
    out,
    expected,
):
    from test_folder_safety import snapshot

    (tmp_path / "notes.txt").write_text("my notes\n")
    (tmp_path / "folder").mkdir()
    before = snapshot(tmp_path)
    args = [a.format(model=model_dir, data=tiny_data) for a in argv]
    p = attnlab(*args, "--out", str(tmp_path / out))
    assert error_line(p, command_name(argv)) == expected.format(out=tmp_path / out)
    assert p.stdout == ""
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(
    ("tokenizer", "vocab", "expected"),
    [("bytebpe", BIG, f"BPE vocab size must be at most 4,294,967,296, got {int(BIG):,}"),  # traceback
     ("bpe", "0", "BPE vocab size must be at least 2, got 0"),
     ("bytebpe", "256", "byte-level BPE vocab size must exceed its 256 byte tokens, got 256")],
)  # fmt: skip
def test_a_bpe_vocab_size_is_checked_before_the_corpus_is_read(
    attnlab, tmp_path: Path, tokenizer, vocab, expected
):
    from test_folder_safety import snapshot

    (tmp_path / "corpus.txt").write_text("to be or not to be\n" * 50)
    before = snapshot(tmp_path)
    p = attnlab("prepare", "--corpus", str(tmp_path / "corpus.txt"), "--tokenizer", tokenizer,
                "--vocab-size", vocab, "--out", str(tmp_path / "data"))  # fmt: skip
    assert error_line(p, "prepare") == expected  # the one line: no "reading ..." before it
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("text", [b"hi\n", b"rank,position\n1,2\n"])  # KeyError, IndexError
def test_a_text_file_given_as_a_checkpoint_gets_one_line(attnlab, tmp_path: Path, text):
    from test_folder_safety import snapshot

    ckpt = tmp_path / "ckpt.pt"
    ckpt.write_bytes(text)
    before = snapshot(tmp_path)
    p = attnlab("import-nanogpt", str(ckpt), "--out", str(tmp_path / "model"))
    assert error_line(p, "import-nanogpt") == (
        f"{ckpt} is not a PyTorch checkpoint (its bytes are neither a zip nor a pickle)"
    )
    assert snapshot(tmp_path) == before


def test_sft_names_a_record_value_of_the_wrong_type(attnlab, model_dir: Path, tmp_path: Path):  # noqa: F811
    """It said "expected {'prompt', 'response'} ... got keys ['prompt', 'response']"."""
    from test_folder_safety import snapshot

    data = tmp_path / "pairs.jsonl"
    data.write_text('{"prompt": "a", "response": "b"}\n{"prompt": 1, "response": "b"}\n')
    before = snapshot(tmp_path)
    p = attnlab("sft", str(model_dir), "--data", str(data), "--out", str(tmp_path / "sft"),
                "max_iters=1", "device=cpu")  # fmt: skip
    assert error_line(p, "sft") == f"{data}:2: prompt and response must be text, got int and str"
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("name", ["shakespeare-chr", ""])
def test_presets_fields_with_a_name_is_refused(attnlab, name):
    """It printed every field and ignored the name (so a typo in it went unnoticed)."""
    assert error_line(attnlab("presets", "--fields", name), "presets") == (
        f"--fields lists the fields of every preset; drop {name!r} (or drop --fields to "
        "show that preset)"
    )


@pytest.mark.parametrize("name", ["", " "])
def test_presets_with_an_empty_name_matches_nothing(attnlab, name):
    """An empty name listed every preset, as if none had been given."""
    from attnlab.presets import PRESETS

    p = attnlab("presets", name)
    assert error_line(p, "presets") == f"unknown preset {name!r} (known: {', '.join(PRESETS)})"
    assert p.stdout == ""


@pytest.mark.parametrize("argv", [["presets", "--fields"], ["study", "--list"]])
def test_a_closed_stdout_ends_quietly_with_sigpipes_status(argv):
    """`attnlab presets --fields | head -1` was a BrokenPipeError traceback."""
    import os
    import sys

    from conftest import ROOT

    proc = subprocess.Popen(
        [sys.executable, "-m", "attnlab", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    proc.stdout.close()  # before the interpreter is up: its first write finds no reader
    assert proc.wait(timeout=120) == 141  # 128 + SIGPIPE
    assert proc.stderr.read() == b""


def test_a_huge_jobs_count_runs_no_more_processes_than_items():
    """study --jobs 99999999999999999999 was an OverflowError traceback from the process pool."""
    import operator

    from attnlab.studies.jobs import run_all

    done = []
    # work(item, threads): item * threads, and each process has one thread of the CPUs
    run_all(operator.mul, [5, 7], int(BIG), lambda i, result, _s: done.append((i, result)))
    assert sorted(done) == [(0, 5), (1, 7)]


def test_a_run_trained_on_relative_data_finds_it_from_another_folder(
    attnlab, tiny_data: Path, tmp_path: Path, monkeypatch
):
    """config.json kept --data as typed ("data"): eval, analyze and --resume from another working
    directory read that folder's "data" instead, or none."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    shutil.copytree(tiny_data, tmp_path / "a" / "data")
    monkeypatch.chdir(tmp_path / "a")
    p = attnlab("train", "--data", "data", "--out", "run", *TINY)
    assert p.returncode == 0, p.stderr
    saved = json.loads((tmp_path / "a" / "run" / "config.json").read_text())["data"]
    assert saved == str((tmp_path / "a" / "data").resolve())
    monkeypatch.chdir(tmp_path / "b")
    p = attnlab("eval", str(tmp_path / "a" / "run"), "--device", "cpu")
    assert p.returncode == 0, p.stderr


def test_bench_export_refuses_a_prompt_longer_than_the_block(attnlab):
    """It was clipped to the block quietly, after a slow export."""
    p = attnlab("bench", "export", "--prompt-len", "300", "--no-compile")
    assert error_line(p, "bench export") == (
        "--prompt-len 300 is longer than the model's block_size 128"
    )
    assert p.stdout == ""


@pytest.mark.parametrize("length", ["0", "-3"])  # 0 ran with the default, -3 was a traceback
def test_bench_export_refuses_a_prompt_length_below_one(attnlab, tmp_path: Path, length):
    p = attnlab("bench", "export", "--prompt-len", length, "--no-compile")
    assert error_line(p, "bench export") == (
        "--tokens, --prompts, --prompt-len and --reps must be at least 1"
    )
    assert p.stdout == ""


@pytest.mark.parametrize(
    ("argv", "expected"),
    [(["train", "--steps", "0"], "--steps must be at least 1, got 0"),  # it said "--reps 0"
     (["overhead", "--batch", "0"], "--batch must be at least 1, got 0"),  # timed empty batches
     (["generate", "--warmup", "-1"], "--warmup must be at least 0, got -1"),  # ran as 0
     # refused by the timer, after the progress lines
     (["overhead", "--quick", "--reps", "0"], "--reps must be at least 1, got 0"),
     (["overhead", "--quick", "--widths", ""],  # wrote an empty table
      "--widths must be comma-separated integers >= 1, got ''"),
     (["overhead", "--quick", "--widths", "0,16"],  # printed the smoke-test line first
      "--widths must be comma-separated integers >= 1, got '0,16'"),
     (["overhead", "--widths", "16,x"],
      "--widths must be comma-separated integers >= 1, got '16,x'"),
     (["generate", "--quick", "--tokens", "2"],  # printed the smoke-test line first
      "--tokens must be at least 4 (to compare quarters), got 2")],
)  # fmt: skip
def test_bench_counts_below_their_least_get_one_line(attnlab, tmp_path: Path, argv, expected):
    from test_folder_safety import snapshot

    before = snapshot(tmp_path)
    out = ["--out", str(tmp_path / "b.png")] if argv[0] != "train" else []
    p = attnlab("bench", *argv, *out)
    assert error_line(p, f"bench {argv[0]}") == expected
    assert p.stdout == ""
    assert snapshot(tmp_path) == before


def test_a_killed_writers_temporary_folder_is_removed_by_the_next(attnlab, tmp_path: Path):
    """SIGKILL mid-prepare left .data.tmp-PID (as large as the data) for good."""
    import os
    import sys

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / "corpus.txt").write_text("to be or not to be\n" * 50)
    stale = tmp_path / f".data.tmp-{dead.pid}"
    live = tmp_path / f".data.tmp-{os.getppid()}"  # a running process's: still being written
    aside = tmp_path / f".data.old-{os.getppid()}-0"  # a running swap's: the old data, aside
    for folder in (stale, live, aside):
        folder.mkdir()
        (folder / "train.bin").write_bytes(b"\0" * 8)
    p = attnlab(
        "prepare", "--corpus", str(tmp_path / "corpus.txt"), "--out", str(tmp_path / "data")
    )
    assert p.returncode == 0, p.stderr
    assert not stale.exists()
    assert (live / "train.bin").is_file() and (aside / "train.bin").is_file()


def _half_run_on_a_copy(tiny_data: Path, tmp_path: Path) -> tuple[Path, Path]:
    """(DATA, RUN): a copy of the tiny data and a run on it stopped at 5 of 10 iterations."""
    from conftest import tiny_model, tiny_train

    from attnlab.train.trainer import Trainer

    data, run = tmp_path / "data", tmp_path / "run"
    shutil.copytree(tiny_data, data)
    trainer = Trainer(run, tiny_model(), tiny_train(max_iters=10, ckpt_interval=5), data,
                      quiet=True)  # fmt: skip
    trainer.run(5)
    trainer.close()
    return data, run


def test_resume_refuses_data_prepared_again_with_another_tokenizer(
    attnlab, tiny_data: Path, other_data: Path, tmp_path: Path
):
    """`prepare --out DATA` replaces a data folder: --resume then trained on the new text with
    the old ids (silently, when the vocabulary sizes allowed it)."""
    from test_folder_safety import snapshot

    data, run = _half_run_on_a_copy(tiny_data, tmp_path)
    shutil.rmtree(data)
    shutil.copytree(other_data, data)  # what `prepare --corpus other.txt --out DATA` leaves
    before = snapshot(run)
    assert error_line(attnlab("train", "--resume", str(run)), "train") == (
        f"cannot resume {run}: {data.resolve()} no longer holds the data it was trained on (its "
        "tokenizer differs from the checkpoint's); restore that data, or train a new run"
    )
    assert snapshot(run) == before


def test_resume_refuses_data_prepared_again_with_another_split(
    attnlab, tiny_data: Path, tmp_path: Path
):
    """The same corpus prepared again with another --val-fraction keeps the tokenizer: --resume
    then trained on other text and measured on another validation set, silently."""
    from test_folder_safety import snapshot

    from attnlab.data.prepare import prepare
    from attnlab.rundir import RunDir

    data, run = _half_run_on_a_copy(tiny_data, tmp_path)
    then = json.loads((data / "meta.json").read_text())
    assert RunDir(run).read_config().data_splits["val_tokens"] == then["val_tokens"]
    prepare(sources=[str(tiny_data.parent / "corpus.txt")], out=data, val_fraction=0.2)
    now = json.loads((data / "meta.json").read_text())
    assert now["vocab_size"] == then["vocab_size"]  # the tokenizer check alone let it through
    assert error_line(attnlab("eval", str(run)), "eval") == (  # it scored the new text
        f"{data.resolve()} no longer holds the data {run} was trained on (its train and val "
        f"tokens differ: {then['train_tokens']:,} train / {then['val_tokens']:,} val then, "
        f"{now['train_tokens']:,} / {now['val_tokens']:,} now); restore that data, or pass --data"
    )
    before = snapshot(run)
    assert error_line(attnlab("train", "--resume", str(run)), "train") == (
        f"cannot resume {run}: {data.resolve()} no longer holds the data it was trained on (its "
        f"train and val tokens differ: {then['train_tokens']:,} train / {then['val_tokens']:,} "
        f"val then, {now['train_tokens']:,} / {now['val_tokens']:,} now); restore that data, or "
        "train a new run"
    )
    assert snapshot(run) == before


def test_study_variants_that_name_none_are_refused(attnlab, tmp_path: Path):
    """`--variants ,` ran every variant of the study (hours at --preset cpu)."""
    from test_folder_safety import snapshot

    spec = tmp_path / "study.toml"
    spec.write_text(GOOD_SPEC)
    before = snapshot(tmp_path)
    p = attnlab("study", str(spec), "--variants", ",", "--out", str(tmp_path / "out"))
    assert error_line(p, "study") == "--variants names none; choose from a"
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(
    ("spec", "args", "expected"),
    [("overhead", ["--data", "DATA"],  # ran the benchmark, --data unread
      "--data: kind = 'overhead' studies train on no data folder; leave it out"),
     ("gba-retrieval", ["--data", "DATA"],
      "--data: kind = 'retrieval' studies train on no data folder; leave it out"),
     ('kind = "retrieval"\n' + GOOD_SPEC, [],  # its variants and comparisons were dropped
      "study.toml: kind = 'retrieval' takes no variants or comparisons (those are for kind = 'lm')")],
)  # fmt: skip
def test_a_study_refuses_what_its_kind_does_not_read(attnlab, tmp_path: Path, spec, args, expected):
    """These ran with exit 0 and said "0 runs" (or ran the wrong kind of work)."""
    from test_folder_safety import snapshot

    if "\n" in spec:
        (tmp_path / "study.toml").write_text(spec)
        spec = str(tmp_path / "study.toml")
    (tmp_path / "data").mkdir()
    args = [str(tmp_path / "data") if a == "DATA" else a for a in args]
    before = snapshot(tmp_path)
    p = attnlab("study", spec, *args, "--out", str(tmp_path / "out"))
    line = error_line(p, "study")
    assert line == expected or line.endswith(expected), line
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("damage", ["max-iters-below", "metrics-not-text"])
def test_a_resume_that_would_contradict_the_run_is_refused(
    attnlab, tiny_data: Path, tmp_path: Path, damage: str
):
    """max_iters below the iterations run rewrote config.json to say fewer than were run
    (exit 0); a damaged metrics.csv was a UnicodeDecodeError after config.json was rewritten."""
    from test_folder_safety import snapshot

    run = tmp_path / "run"
    p = attnlab("train", "--data", str(tiny_data), "--out", str(run), *tiny("max_iters=4"))
    assert p.returncode == 0, p.stderr
    if damage == "metrics-not-text":
        (run / "metrics.csv").write_bytes(b"garbage\x00\xff\n")
        expected = re.compile(
            rf"{re.escape(str(run / 'metrics.csv'))} is not a metrics table \(.+\); repair or "
            "remove it to resume"
        )
        extra = ["max_iters=6"]
    else:
        expected = re.compile(
            re.escape(f"cannot resume {run} with max_iters=2: it has run 4 iterations already")
        )
        extra = ["max_iters=2"]
    before = snapshot(tmp_path)
    p = attnlab("train", "--resume", str(run), *extra)
    assert expected.fullmatch(error_line(p, "train")), p.stderr
    assert snapshot(tmp_path) == before


def test_train_out_that_cannot_be_written_is_one_line(attnlab, tmp_path: Path):
    if not Path("/proc/self").is_dir():
        pytest.skip("needs Linux's /proc")
    p = attnlab("train", "--out", "/proc/attnlab-train-test", *TINY)
    assert re.fullmatch(
        r"cannot write /proc/attnlab-train-test \([A-Z][\w ]+\); choose another --out",
        error_line(p, "train"),
    )


def test_analysis_out_holding_a_users_files_is_refused(
    attnlab, boosted_dir: Path, tiny_data: Path, tmp_path: Path
):
    """A user's gates.csv in --out was replaced without a word."""
    from test_folder_safety import snapshot

    out = tmp_path / "mine"
    out.mkdir()
    (out / "gates.csv").write_text("my,own\n1,2\n")
    before = snapshot(tmp_path)
    args = ["analyze", "gates", str(boosted_dir), "--data", str(tiny_data), "--sequences", "1"]
    p = attnlab(*args, "--out", str(out))
    assert error_line(p, "analyze gates") == (
        f"{out} is not empty and is not an attnlab analysis folder; choose another --out"
    )
    assert snapshot(tmp_path) == before
    # its own output folder is written again
    assert attnlab(*args, "--out", str(tmp_path / "ours")).returncode == 0
    assert attnlab(*args, "--out", str(tmp_path / "ours")).returncode == 0


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["train", "--bogus"], "attnlab train: error: unrecognized arguments: --bogus"),
        (["bench", "export", "--x", "1"], "attnlab bench export: error: unrecognized arguments: --x 1"),
        (["sample"], "attnlab sample: error: the following arguments are required: RUN_OR_FOLDER"),
    ],
)  # fmt: skip
def test_a_usage_error_is_one_line(args: list[str], expected: str):
    """argparse printed its usage block (eleven lines for sample) above the error."""
    p = run_cli(*args)
    assert p.returncode == 2
    assert p.stderr == f"{expected} (see attnlab {command_name(args)} --help)\n"


@pytest.mark.parametrize("n", ["0", "-1"])
def test_chat_refuses_max_new_tokens_below_one(attnlab, tmp_path: Path, n: str):
    """`chat --max-new-tokens 0` replied with one token anyway (sample generates none); -1 got
    sampling's ">= 0" rule instead of chat's own."""
    p = attnlab("chat", str(tmp_path / "none"), "--max-new-tokens", n)
    assert error_line(p, "chat") == f"--max-new-tokens must be >= 1 for a reply, got {n}"
