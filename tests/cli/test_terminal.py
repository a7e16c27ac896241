"""What a researcher sees in the terminal: startup summaries, progress, help texts, CLI habits."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import ROOT


@pytest.mark.parametrize("preset", ["qkve-small", "gba-lm-twicing", "kv-bias-shakespeare-char"])
def test_info_shapes_match_a_real_build(preset: str) -> None:
    from attnlab.config import ModelConfig
    from attnlab.model import GPT
    from attnlab.model.summary import parameter_counts, shapes_only

    config = ModelConfig.preset(preset)
    fast, real = shapes_only(config), GPT(config)
    assert parameter_counts(fast) == parameter_counts(real)
    assert fast.flops_per_token() == real.flops_per_token()


def test_info_build_does_not_import_dynamo() -> None:
    """What made `info qkve-61m` take seconds: meta-device kernels pull in torch._dynamo."""
    code = (
        "import sys\n"
        "from attnlab.model.summary import shapes_only\n"
        "from attnlab.config import ModelConfig\n"
        "m = shapes_only(ModelConfig.preset('qkve-61m'))\n"
        "print(sum(p.numel() for p in m.parameters()), 'torch._dynamo' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert done.returncode == 0, done.stderr
    n, dynamo = done.stdout.split()
    assert int(n) > 60_000_000 and dynamo == "False"


def test_every_config_field_has_one_line_of_help() -> None:
    """Backbone and training fields in field_help; a mechanism's own in its SPEC (the mechanism
    contract checks those)."""
    from attnlab.config import ModelConfig, TrainConfig
    from attnlab.field_help import ALIASES, MODEL_HELP, TRAIN_HELP
    from attnlab.model import mechanisms

    owned = mechanisms.field_help()
    assert list(MODEL_HELP) == [f for f in ModelConfig.field_names() if f not in owned]
    assert list(TRAIN_HELP) == TrainConfig.field_names()
    assert all(h and "\n" not in h for h in [*MODEL_HELP.values(), *TRAIN_HELP.values()])
    fields = set(MODEL_HELP) | set(owned) | set(TRAIN_HELP)
    assert set(ALIASES.values()) <= fields and not set(ALIASES) & fields


def test_presets_fields_lists_type_default_and_meaning(capsys: pytest.CaptureFixture) -> None:
    from attnlab.cli import main
    from attnlab.commands.presets import MISSING_HELP
    from attnlab.config import ModelConfig, TrainConfig

    assert main(["presets", "--fields"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines() if line[:2] == "  "}
    assert set(rows) == set(ModelConfig.field_names()) | set(TrainConfig.field_names())
    assert MISSING_HELP not in out
    assert rows["learning_rate"].split()[1:3] == ["float", str(TrainConfig().learning_rate)]
    assert rows["lr_decay_iters"].split()[1:5] == ["int", "or", "null", "null"]
    # derived at build time: the default is null, not what null becomes at n_embd 768
    for name in ("d_ffn", "n_kv_head", "norm_eps"):
        assert rows[name].split()[3:5] == ["null", "null"], rows[name]
    assert rows["bias"].split()[1:3] == ["bool", "true"]
    assert "(layernorm | rmsnorm)" in rows["norm"]
    assert rows["n_layer"].split()[2] == str(ModelConfig().n_layer)


def test_presets_print_recipes_that_parse_back(capsys: pytest.CaptureFixture) -> None:
    """Each preset's printed model/train lines are key=value pairs giving back the preset."""
    from attnlab.cli import main
    from attnlab.config import split_overrides
    from attnlab.presets import PRESETS

    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    blocks = out.strip().split("\n\n")
    assert len(blocks) == len(PRESETS)
    for block, (name, preset) in zip(blocks, PRESETS.items(), strict=True):
        head, model, train, data = block.splitlines()
        assert head == f"{name}: {preset.description}"
        assert split_overrides(model.split()[1:]) == (preset.model, {})
        assert split_overrides(train.split()[1:]) == ({}, preset.train)
        expected = " ".join(f"{k}={v}" for k, v in preset.data.items())
        assert data == f"  data:  {expected or 'the embedded corpus, char-level'}"
    assert main(["presets", "gba-lm-fair"]) == 0
    assert capsys.readouterr().out.startswith("gba-lm-fair: ")


def _trainer(run_dir, data, quiet: bool = True, **train):
    from conftest import tiny_model, tiny_train

    from attnlab.train.trainer import Trainer

    return Trainer(run_dir, tiny_model(), tiny_train(**train), data, quiet=quiet)


def test_describe_names_data_model_device_and_schedule(tmp_path, tiny_data) -> None:
    import json

    import torch

    from attnlab.train.distributed import DistEnv

    trainer = _trainer(tmp_path / "run", tiny_data, gradient_accumulation_steps=2, max_seconds=60)
    data, model, device, schedule = trainer.describe("tiny")
    meta = json.loads((tiny_data / "meta.json").read_text())
    assert data == (
        f"data:     {tiny_data}: {meta['train_tokens']:,} train / {meta['val_tokens']:,} val "
        f"tokens, vocab {meta['vocab_size']} (char tokenizer)"
    )
    n = trainer.model.get_num_params(non_embedding=False)
    assert model.startswith(f"model:    tiny: {n / 1e3:.1f}K parameters, 2 layers x 32 wide")
    assert f"{trainer.model.flops_per_token() / 1e3:.1f}K FLOPs per token" in model
    assert device == f"device:   cpu, {torch.get_num_threads()} threads, float32"
    # fsdp=true in one process was recorded in config.json and did nothing, without a word
    sharded = _trainer(tmp_path / "fsdp", tiny_data, fsdp=True).describe("tiny")[2]
    assert sharded == f"{device}, fsdp=true: nothing to shard in one process"
    assert schedule == (
        "schedule: 30 iters, lr 0.003, warmup 5, cosine decay to 0.0003 at 30; batch 8 x 2 accum "
        "x 32 = 512 tokens per step; eval every 10 on 4 batches; stop after 60 s"
    )
    # under torchrun batch_size is the global batch: the ranks split it, tokens per step stay
    trainer.dist = DistEnv(rank=0, world_size=2)
    schedule = trainer.describe("tiny")[3]
    assert "; batch 8 (4 per rank x 2 ranks) x 2 accum x 32 = 512 tokens per step;" in schedule


def test_progress_lines_off_a_terminal(tmp_path, tiny_data, capsys, monkeypatch, caplog) -> None:
    """One line per log_interval and per evaluation (val loss included), and compile notes."""
    import torch

    monkeypatch.setattr(torch, "compile", lambda model: model)  # the notes, not the compiler
    trainer = _trainer(tmp_path / "run", tiny_data, quiet=False, max_iters=12, compile=True)
    with caplog.at_level("INFO", logger="attnlab"):  # the lines are log records (the CLI prints)
        trainer.run()
    _, err = capsys.readouterr()
    lines = [r.getMessage() for r in caplog.records if r.name == "attnlab.train.trainer"]
    assert [line.split(" | ")[0] for line in lines] == [f"iter {i}/12" for i in (0, 5, 10, 12)]
    assert lines[0].startswith("iter 0/12 | val_loss ") and "train_loss" not in lines[0]
    assert "val_loss" not in lines[1] and "tokens_per_s" in lines[1]
    assert "train_loss" in lines[2] and "val_loss" in lines[2]  # iters 10: log and eval
    assert "compiling the model (torch.compile)" in err and "compiled in " in err


def test_progress_bar_keeps_the_latest_val_loss(monkeypatch) -> None:
    import io

    from attnlab.train.trainer import Progress

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    screen = Terminal()
    monkeypatch.setattr("sys.stderr", screen)
    bar = Progress("run", 100, 0, enabled=True)
    bar.show({"iter": 0, "val_loss": 4.25, "lr": 1e-4})
    bar.update(10)
    bar.show({"iter": 10, "train_loss": 3.5, "lr": 1e-3, "tokens_per_s": 1234.4})
    bar.close()
    last = screen.getvalue().split("\r")[-1]
    assert "loss=3.5000" in last and "val=4.2500" in last
    assert "lr=1.00e-03" in last and "tok/s=1234" in last


TINY = [
    "n_layer=2",
    "n_head=2",
    "n_embd=32",
    "block_size=32",
    "batch_size=4",
    "eval_iters=2",
    "eval_interval=2",
    "log_interval=2",
    "device=cpu",
    "tensorboard=false",
]


def test_train_and_sft_print_what_they_run(tmp_path, tiny_data, capsys) -> None:
    """train and sft start with demo's summary: data, model, device, resolved schedule."""
    import json

    from attnlab.cli import main

    args = ["train", "--data", str(tiny_data), "--out", str(tmp_path / "pre"), *TINY]
    # the schedule set explicitly (a preset's own warmup and decay would scale with max_iters)
    assert main([*args, "max_iters=4", "warmup_iters=100", "lr_decay_iters=3000"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"data:     {tiny_data}: ")
    assert lines[1].startswith("model:    shakespeare-char: ")  # the default preset
    assert lines[2].startswith("device:   cpu, ")
    # decay over 3000 iters and warmup over 100 in a 4-iter run: the summary says what that means
    assert lines[3].startswith("schedule: 4 iters, lr 0.001, warmup 100, cosine decay to 0.0001 at")
    last_lr = 1e-3 * 4 / 101  # step 3 of the linear warmup: lr * (it + 1) / (warmup + 1)
    assert f"beyond max_iters: the last step's lr is {last_lr:.3g}" in lines[3]
    assert "batch 4 x 32 = 128 tokens per step" in lines[3]
    assert lines[4].startswith("iter 0/4 | val_loss ")

    records = tmp_path / "pairs.jsonl"
    pair = {"prompt": "Who art thou?", "response": "A friend."}
    records.write_text("".join(json.dumps(pair) + "\n" for _ in range(30)))
    over = ["max_iters=2", "eval_interval=2", "eval_iters=1", "batch_size=2", "log_interval=1",
            "warmup_iters=20"]  # fmt: skip
    sft_args = ["sft", str(tmp_path / "pre"), "--out", str(tmp_path / "sft"), "--data"]
    assert main([*sft_args, str(records), *over]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith(f"data:     {(tmp_path / 'sft' / 'sft_data').resolve()}: ")
    assert lines[1].startswith(f"model:    {tmp_path / 'pre'} (fine-tuned): ")
    assert lines[3].startswith("schedule: 2 iters, lr 0.0001, warmup 20")
    assert "x 32 = 64 tokens per step (at most: examples are padded to the longest)" in lines[3]


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, tiny_data):
    """A run trained for 4 steps: something to sample from."""
    run = tmp_path_factory.mktemp("tiny_run") / "run"
    _trainer(run, tiny_data, max_iters=4, eval_interval=4, eval_iters=1).run()
    return run


def test_sample_streams_tokens_as_they_come(tiny_run, monkeypatch) -> None:
    import io

    import torch

    from attnlab import from_pretrained
    from attnlab.cli import main
    from attnlab.model import generation

    model, tok = from_pretrained(tiny_run)
    gen = torch.Generator().manual_seed(1337)
    ids = tok.encode("KING")
    expected = model.generate(torch.tensor([ids]), 8, temperature=0.8, generator=gen)
    screen, seen = io.StringIO(), []
    real_stream = generation.stream

    def watched(*args, **kwargs):
        for token in real_stream(*args, **kwargs):
            seen.append(len(screen.getvalue()))  # what was printed before this token came
            yield token

    monkeypatch.setattr(generation, "stream", watched)
    monkeypatch.setattr("sys.stdout", screen)
    assert main(["sample", str(tiny_run), "--prompt", "KING", "--max-new-tokens", "8"]) == 0
    assert screen.getvalue() == tok.decode(expected[0].tolist()) + "\n"
    # each token's text is out before the next token is drawn (char level: one char each)
    assert seen == [len("KING") + i for i in range(8)]


def test_sample_prompt_file(tiny_run, tmp_path, capsys) -> None:
    from attnlab.cli import main

    prompt = tmp_path / "prompt.txt"
    prompt.write_text("ROMEO:\nWhat light", encoding="utf-8")
    common = ["sample", str(tiny_run), "--max-new-tokens", "5"]
    assert main([*common, "--prompt-file", str(prompt)]) == 0
    from_file = capsys.readouterr().out
    assert main([*common, "--prompt", "ROMEO:\nWhat light"]) == 0
    assert capsys.readouterr().out == from_file and from_file.startswith("ROMEO:\nWhat light")
    # as Windows Notepad saves it: the byte-order mark was refused as a character
    prompt.write_text("\ufeffROMEO:\nWhat light", encoding="utf-8")
    assert main([*common, "--prompt-file", str(prompt)]) == 0
    assert capsys.readouterr().out == from_file
    missing = tmp_path / "missing.txt"
    assert main([*common, "--prompt-file", str(missing)]) == 2
    err = capsys.readouterr().err
    assert err == (  # was Python's "[Errno 2] No such file or directory: 'missing.txt'"
        f"attnlab sample: error: --prompt-file {missing}: No such file or directory\n"
    )
    assert not missing.exists()


def test_chat_help_lists_commands_and_reaches_no_model(tmp_path, monkeypatch, capsys) -> None:
    import io

    import torch
    from conftest import tiny_model
    from test_chat import _greedy_reply, chat_tokenizer

    from attnlab.cli import main
    from attnlab.commands.chat import COMMANDS
    from attnlab.model import GPT
    from attnlab.train.checkpoint import save_checkpoint

    tok = chat_tokenizer()
    torch.manual_seed(0)
    model = GPT(tiny_model(vocab_size=tok.vocab_size, block_size=128)).eval()
    save_checkpoint(tmp_path / "model", model, tok)
    first = _greedy_reply(model, tok, [{"role": "user", "content": "who are you?"}], 12)
    monkeypatch.setattr("sys.stdin", io.StringIO("/help\n/bogus\nwho are you?\n/exit\n"))
    args = ["chat", str(tmp_path / "model"), "--temperature", "0", "--max-new-tokens", "12"]
    assert main(args) == 0
    listing = [f"  {name:<8} {what}" for name, what in COMMANDS.items()]
    expected = ["commands:", *listing, "unknown command /bogus; the commands are:", *listing]
    # the reply is the first one of a fresh conversation: neither line went to the model
    assert capsys.readouterr().out == "\n".join([*expected, first, ""])
    assert {"/help", "/reset", "/exit"} == set(COMMANDS)


def test_nanogpt_style_flags_are_overrides(tmp_path, tiny_data, capsys) -> None:
    """`--max_iters=3` works like `max_iters=3`; other unknown flags stay argparse errors."""
    import json

    from attnlab.cli import main

    out = tmp_path / "run"
    flags = [f"--{pair}" for pair in TINY]
    assert (
        main(["train", "--data", str(tiny_data), "--out", str(out), "--max-iters=3", *flags]) == 0
    )
    saved = json.loads((out / "config.json").read_text())
    assert saved["train"]["max_iters"] == 3 and saved["model"]["n_embd"] == 32
    printed = capsys.readouterr().out
    assert json.loads(printed[printed.index("\n{") :])["iters"] == 3

    assert main(["info", "qkve-small", "--n_layer=2", "n_head=4"]) == 0
    assert "  n_layer            2\n" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        main(["sample", str(out), "--max_iters=3"])  # sample takes no config fields
    assert (
        exit_.value.code == 2 and "unrecognized arguments: --max_iters=3" in capsys.readouterr().err
    )
    with pytest.raises(SystemExit):
        main(["train", "--out", str(tmp_path / "r2"), "--bogus"])  # not --key=value
    assert not (tmp_path / "r2").exists()


@pytest.mark.parametrize(
    ("key", "field"),
    [
        ("lr", "learning_rate"),
        ("max_steps", "max_iters"),
        ("n_layers", "n_layer"),
        ("learning_rat", "learning_rate"),
        ("d_model", "n_embd"),
    ],
)
def test_did_you_mean_knows_other_tools_names(tmp_path, capsys, key: str, field: str) -> None:
    from attnlab.cli import main

    out = tmp_path / "run"
    assert main(["train", "--out", str(out), f"--{key}=1"]) == 2
    err = capsys.readouterr().err
    assert err == f"attnlab train: error: unknown config key {key!r}; did you mean {field!r}?\n"
    assert not out.exists()


def _all_parsers():
    import argparse

    from attnlab.cli import build_parser

    def walk(parser, name):
        yield name, parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub, child in action.choices.items():
                    yield from walk(child, f"{name} {sub}")

    return list(walk(build_parser(), "attnlab"))


def test_every_help_shows_the_defaults() -> None:
    import argparse

    checked = 0
    for name, parser in _all_parsers():
        for action in parser._actions:
            if not action.option_strings or any(
                action.default is v for v in (None, False, argparse.SUPPRESS)
            ):
                continue
            entry = parser._get_formatter()._format_action(action)  # its lines in --help
            assert "default" in entry, f"{name} {action.option_strings}: {entry}"
            checked += 1
    assert checked > 40
    sample = dict(_all_parsers())["attnlab sample"].format_help()
    assert "(default: 500)" in " ".join(sample.split())  # --max-new-tokens, which had no help


def test_sample_compile_says_so(tiny_run, monkeypatch, capsys) -> None:
    """--compile announces that it compiles the decoding step, and how long it took."""
    from attnlab.cli import main
    from attnlab.model import generation

    asked: list[object] = []
    monkeypatch.setattr(
        generation, "compile_for_decoding", lambda model: asked.append(model) or model
    )
    assert main(["sample", str(tiny_run), "--compile", "--max-new-tokens", "2"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0] == (
        "compiling the decoding step (torch.compile; slow the first time, then served from "
        "torch's compile cache) ..."
    )
    assert err[1].startswith("compiled in ") and err[1].endswith(" s")
    assert len(asked) == 1


def test_prepare_reports_each_stage(tmp_path, capsys) -> None:
    import json
    import re

    from attnlab.cli import main
    from attnlab.data.corpus import embedded_documents

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n\n".join(t for _, t in embedded_documents()[:2])[:50_000])
    out = tmp_path / "prepared"
    assert main(["prepare", "--corpus", str(corpus), "--out", str(out)]) == 0
    meta = json.loads((out / "meta.json").read_text())
    err = capsys.readouterr().err.splitlines()
    train_kb = len(corpus.read_bytes()) * 0.9 / 1e3  # the last tenth of the document is val
    patterns = [
        rf"reading {re.escape(str(corpus))}: 1 documents, \d+ kB train \+ \d kB val text",
        rf"training the char tokenizer: {meta['vocab_size']} tokens",
        rf"encoding \((\d+) kB train \+ \d kB val\): {meta['train_tokens']:,} \+ "
        rf"{meta['val_tokens']:,} tokens",
    ]
    patterns = [p + r" \(\d+\.\d s\)" for p in patterns]
    assert len(err) == len(patterns)
    for line, pattern in zip(err, patterns, strict=True):
        assert re.fullmatch(pattern, line), (line, pattern)
    assert abs(int(re.fullmatch(patterns[2], err[2])[1]) - train_kb) <= 1


def test_chat_line_editing_turns_readline_on(monkeypatch) -> None:
    import sys

    from attnlab.commands.chat import line_editing

    monkeypatch.delitem(sys.modules, "readline", raising=False)
    line_editing()  # what chat does on a terminal: input() then edits lines and keeps history
    assert "readline" in sys.modules or sys.platform == "win32"


def test_resuming_a_finished_run_says_how_to_train_further(tiny_run, tmp_path, capsys) -> None:
    """--resume of a run at its max_iters says it has nothing to train (was 'resuming at 4 of 4')."""
    import shutil

    from attnlab.cli import main

    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    # the peak of the process that trained it (here far above this one's): a resume that trains
    # nothing replaced it with its own, much lower
    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps({**summary, "peak_memory_mb": 1e9}))
    assert main(["train", "--resume", str(run)]) == 0
    after = json.loads((run / "summary.json").read_text())
    assert after == {**summary, "peak_memory_mb": 1e9}
    captured = capsys.readouterr()
    text = captured.out + captured.err
    assert (
        "this run already finished its 4 iters: nothing to train (to train further, pass a larger max_iters=)"
        in text
    )
    assert "resuming at" not in text


def test_resuming_a_run_that_used_its_time_trains_nothing(tiny_data, tmp_path, capsys) -> None:
    """--resume of a run stopped by max_seconds took one more step each time, without a word
    (its time was already used up when it started)."""
    from attnlab.cli import main

    run = tmp_path / "run"
    trainer = _trainer(run, tiny_data, max_iters=100_000, eval_interval=50, max_seconds=0.5)
    summary = trainer.run()
    assert summary["iters"] < 100_000 and summary["train_seconds"] >= 0.5
    capsys.readouterr()
    assert main(["train", "--resume", str(run)]) == 0
    captured = capsys.readouterr()
    assert json.loads((run / "summary.json").read_text())["iters"] == summary["iters"]
    assert (
        "this run already used its max_seconds=0.5 ("
        f"{summary['train_seconds']:.1f} s trained): nothing to train (to train further, pass a "
        "larger max_seconds= or max_seconds=null)"
    ) in captured.out + captured.err


def test_sample_of_a_prompt_longer_than_the_context_echoes_what_the_model_continues(
    tiny_run, tmp_path, capsys
) -> None:
    """A 21 MB prompt file was echoed whole (and grew by one copy per token): the model sees its
    last block_size tokens, the same continuation as a prompt of those alone."""
    from attnlab.cli import main
    from attnlab.train.checkpoint import load_pretrained

    model, tok = load_pretrained(tiny_run)
    block = model.config.block_size
    text = "ROMEO:\nWhat light through yonder window breaks? " * (3 * block // 40 + 1)
    ids = tok.encode(text)
    tail = tok.decode(ids[-block:])
    (tmp_path / "long.txt").write_text(text, encoding="utf-8")
    common = ["sample", str(tiny_run), "--max-new-tokens", "5", "--temperature", "0"]
    assert main([*common, "--prompt-file", str(tmp_path / "long.txt")]) == 0
    out, err = capsys.readouterr()
    assert err.splitlines() == [
        f"note: the prompt is {len(ids):,} tokens, more than the model's context of {block:,}; "
        f"it continues the last {block:,}, shown below"
    ]
    assert main([*common, "--prompt", tail]) == 0
    assert capsys.readouterr() == (out, "") and out.startswith(tail)
