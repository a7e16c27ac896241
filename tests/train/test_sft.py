"""SFT: ChatML formatting, special tokens, response-only loss, and fine-tuning runs."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import run_cli, tiny_model
from test_bad_input import attnlab, error_line  # noqa: F401  (a fixture and a helper)
from test_folder_safety import snapshot
from test_untrusted import model_dir  # noqa: F401  (a fixture: a saved tiny model folder)

from attnlab.data.chat import (
    IM_END,
    IM_START,
    SHIPPED,
    SPECIAL_TOKENS,
    encode_record,
    format_chatml,
    load_jsonl,
    record_segments,
    targets,
)
from attnlab.data.corpus import SPLITS
from attnlab.data.prepare import load_dataset
from attnlab.data.tokenizer import Tokenizer
from attnlab.errors import AttnlabError
from attnlab.model import GPT
from attnlab.rundir import run_data_dir
from attnlab.train import checkpoint as ckpt
from attnlab.train import sft
from attnlab.train.checkpoint import load_pretrained

CHARS = "abcdefghijklmnopqrstuvwxyz ?.\n"
CONVERSATION = [
    {"role": "system", "content": "be brief."},
    {"role": "user", "content": "hi?"},
    {"role": "assistant", "content": "hello."},
]


def char_tokenizer() -> Tokenizer:
    tok = Tokenizer.train_char(CHARS)
    tok.add_special_tokens(SPECIAL_TOKENS)
    return tok


def test_chatml_formatting_exact_string() -> None:
    assert format_chatml(CONVERSATION) == (
        "<|im_start|>system\nbe brief.<|im_end|>\n<|im_start|>user\nhi?<|im_end|>\n"
        "<|im_start|>assistant\nhello.<|im_end|>\n"
    )
    assert format_chatml(CONVERSATION[:2], add_generation_prompt=True) == (
        "<|im_start|>system\nbe brief.<|im_end|>\n<|im_start|>user\nhi?<|im_end|>\n<|im_start|>assistant\n"
    )
    pair = {"prompt": "say hi", "response": "hi"}
    assert "".join(t for t, _ in record_segments(pair)) == "say hi\nhi<|im_end|>"
    assert "".join(t for t, _ in record_segments(pair, chat=True)) == (
        "<|im_start|>user\nsay hi<|im_end|>\n<|im_start|>assistant\nhi<|im_end|>\n"
    )


def test_special_tokens_are_single_ids(tiny_data: Path) -> None:
    char = char_tokenizer()
    assert [char.token_to_id(t) for t in SPECIAL_TOKENS] == [len(CHARS), len(CHARS) + 1]
    bpe = Tokenizer.train_bpe("to be or not to be that is the question " * 20, 60)
    bpe_ids = bpe.add_special_tokens(SPECIAL_TOKENS)
    for tok, (start, end) in (
        (char, [char.token_to_id(t) for t in SPECIAL_TOKENS]),
        (bpe, bpe_ids),
    ):
        assert tok.encode(IM_START) == [start] and tok.encode(IM_END) == [end]
        ids = tok.encode(format_chatml(CONVERSATION[1:]))
        assert ids.count(start) == 2 and ids.count(end) == 2
    assert char.decode(encode_record(char, {"messages": CONVERSATION})[0]) == format_chatml(
        CONVERSATION
    )


def test_loss_only_on_response_tokens() -> None:
    tok = char_tokenizer()
    ids, mask = encode_record(tok, {"messages": CONVERSATION})
    y = targets(ids, mask)
    # trained targets: exactly the assistant's "hello." and the <|im_end|> closing it
    trained = [t for t in y if t != -1]
    assert tok.decode(trained) == "hello.<|im_end|>"
    assert y[-1] == -1  # the newline after the last <|im_end|> is not trained on

    torch.manual_seed(0)
    model = GPT(tiny_model(vocab_size=tok.vocab_size, block_size=64)).eval()
    x = torch.tensor([ids[:-1]])

    def loss(tgt: list[int]) -> float:
        with torch.no_grad():
            return float(model(x, torch.tensor([tgt]))[1])

    base = loss(y)
    with torch.no_grad():
        logits = model(x, all_logits=True)[0][0]
    keep = torch.tensor(y) != -1
    by_hand = F.cross_entropy(logits[keep], torch.tensor(y)[keep])
    assert base == pytest.approx(float(by_hand), abs=1e-6)
    # changing what the prompt tokens "should" be leaves the loss alone ...
    prompt_changed = list(ids)
    for i, m in enumerate(mask):
        if not m:
            prompt_changed[i] = tok.token_to_id("z")
    assert loss(targets(prompt_changed, mask)) == base
    # ... changing one response token does not
    response_changed = list(ids)
    response_changed[mask.index(True)] = tok.token_to_id("z")
    assert loss(targets(response_changed, mask)) != base


def test_batches_pad_to_their_longest_example_and_the_loss_stays_the_same() -> None:
    examples = [([5, 6, 7], [-1, 7, 8]), ([5] * 11, [-1] * 6 + [9] * 5)]
    x, y = sft.pad_batch(examples, 64, "cpu")
    assert x.shape == y.shape == (2, 16)  # longest 11, rounded up to a multiple of 8
    assert x[0].tolist() == [5, 6, 7] + [0] * 13 and y[0].tolist() == [-1, 7, 8] + [-1] * 13
    assert sft.pad_batch(examples, 12, "cpu")[0].shape == (2, 12)  # never past block_size
    torch.manual_seed(0)
    model = GPT(tiny_model(vocab_size=16, block_size=64)).eval()
    with torch.no_grad():  # padded to the full block: causal attention makes the tail irrelevant
        full = model(F.pad(x, (0, 48)), F.pad(y, (0, 48), value=-1))[1]
        short = model(x, y)[1]
    torch.testing.assert_close(short, full, rtol=0, atol=1e-6)


def test_load_jsonl_validates_records(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(
        '{"prompt": "a", "response": "b"}\n\n{"messages": [{"role": "user", "content": "x"}]}\n'
    )
    with pytest.raises(AttnlabError, match=r"d\.jsonl:3: conversation has no assistant"):
        load_jsonl(path)
    path.write_text('{"prompt": "a"}\n')
    with pytest.raises(AttnlabError, match=r"d\.jsonl:1: expected \{'prompt', 'response'\}"):
        load_jsonl(path)
    path.write_text("{oops\n")
    with pytest.raises(AttnlabError, match=r"d\.jsonl:1: not valid JSON"):
        load_jsonl(path)
    shipped = {name: load_jsonl(p) for name, p in SHIPPED.items()}
    assert all("prompt" in r for r in shipped["instruct"]) and all(
        "messages" in r for r in shipped["chat"]
    )
    assert sum(p.stat().st_size for p in SHIPPED.values()) < 300_000


def test_resize_embeddings_keeps_rows_and_draws_new_ones() -> None:
    old = torch.randn(10, 4)
    sd = sft.resize_embeddings({"transformer.wte.weight": old, "x": torch.ones(2)}, 1010, seed=0)
    assert sd["transformer.wte.weight"].shape == (1010, 4)
    assert torch.equal(sd["transformer.wte.weight"][:10], old)
    assert 0.018 < float(sd["transformer.wte.weight"][10:].std()) < 0.022
    assert torch.equal(sd["x"], torch.ones(2))


def _write_pairs(path: Path) -> None:
    """Pairs over characters the tiny corpus certainly has."""
    words = ["the", "king", "and", "lord", "is", "not", "here", "go"]
    lines = [
        json.dumps(
            {"prompt": f"{words[i % 8]} {words[(i + 3) % 8]}", "response": words[(i + 5) % 8]}
        )
        for i in range(40)
    ]
    path.write_text("\n".join(lines) + "\n")


def test_sft_tiny_run_is_a_normal_resumable_run(
    train_tiny, tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog
) -> None:
    from attnlab.cli import main

    pre, _ = train_tiny(tmp_path / "pre", max_iters=2, eval_interval=2, eval_iters=1)
    data = tmp_path / "pairs.jsonl"
    _write_pairs(data)
    with data.open("a") as f:  # a character the tiny corpus has not: dropped, and said so
        f.write(json.dumps({"prompt": "\u65e5", "response": "the"}) + "\n")
    over = ["max_iters=10", "eval_interval=5", "eval_iters=2", "batch_size=4", "warmup_iters=2"]
    trainer = sft.start(tmp_path / "pre", tmp_path / "sft", data, overrides=over, quiet=True)
    dropped = "attnlab sft: dropped 1 record (1 unencodable)"  # was a Python dict
    assert [r.getMessage() for r in caplog.records if r.name == "attnlab.train.sft"] == [dropped]
    vocab = pre.model_config.vocab_size
    assert trainer.model_config.vocab_size == vocab + 2
    wte = trainer.model.transformer.wte.weight
    assert torch.equal(wte[:vocab], pre.model.transformer.wte.weight)  # pretrained rows kept
    assert trainer.model.lm_head.weight is wte  # still tied
    sampler, val_batches = sft.sft_batches(trainer)  # a fresh copy: leave the run's stream alone
    x, y = sampler.next_batch()
    # short pairs: batches are padded to a multiple of 8 above their longest, not to block 32
    assert len(val_batches) == 1 and val_batches[0][0].shape[0] == 2  # 2 of 40 records held out
    assert x.shape == y.shape and x.shape[0] == 4 and x.shape[1] in (16, 24)
    assert bool((y == -1).any()) and bool((y != -1).any())
    summary = trainer.run()
    assert summary["iters"] == 10 and summary["final_val_loss"] is not None
    # tokens/s counts the positions actually run, which vary from batch to batch here
    assert 10 * 4 * 16 <= trainer.state.tokens <= 10 * 4 * 24
    assert summary["tokens_per_s"] == trainer.state.tokens / trainer.state.train_seconds
    # the data folder records its largest id as prepare's do (load_dataset then skips a scan)
    meta = json.loads((tmp_path / "sft" / "sft_data" / "meta.json").read_text())
    bins = [np.fromfile(tmp_path / "sft" / "sft_data" / f"{s}.bin", meta["dtype"]) for s in SPLITS]
    assert meta["max_token_id"] == max(int(b.max()) for b in bins) == vocab + 1  # <|im_end|>

    interrupted = sft.start(tmp_path / "pre", tmp_path / "sft2", data, overrides=over, quiet=True)
    interrupted.run(until=5)
    resumed = sft.resume(tmp_path / "sft2", quiet=True)
    resumed.run()
    for a, b in zip(
        trainer.model.state_dict().values(), resumed.model.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b)

    model, tok = load_pretrained(tmp_path / "sft" / "latest")
    assert tok.vocab_size == vocab + 2 and tok.encode(IM_END) == [vocab + 1]
    assert model.config.vocab_size == vocab + 2
    assert main(["info", str(tmp_path / "sft")]) == 0  # info reads a run folder too
    # the grown token table plus the learned position table (block 32 x width 32)
    assert re.search(rf"embeddings +{(vocab + 2) * 32 + 32 * 32:,}\n", capsys.readouterr().out)
    with pytest.raises(AttnlabError, match="already holds a run"):
        sft.start(tmp_path / "pre", tmp_path / "sft", data, overrides=over)


# the shortest SFT run that trains, evaluates and saves a checkpoint
QUICK = ["max_iters=2", "eval_interval=2", "eval_iters=1", "batch_size=2", "warmup_iters=0"]
QUICK += ["device=cpu", "tensorboard=false"]


def _sft_run(attnlab, model_dir: Path, out: Path) -> Path:  # noqa: F811
    """A finished 2-iteration SFT run of the untrained tiny model in ``out``, through the CLI."""
    data = out.with_name("pairs.jsonl")
    _write_pairs(data)
    p = attnlab("sft", str(model_dir), "--data", str(data), "--out", str(out), *QUICK)
    assert p.returncode == 0, p.stderr
    return out


def test_a_copied_sft_run_reads_the_data_beside_it(attnlab, model_dir: Path, tmp_path: Path):  # noqa: F811
    """config.json names sft_data/ by its absolute path: a copied run was evaluated and resumed
    on the original's data, and failed once the original was gone."""
    run = _sft_run(attnlab, model_dir, tmp_path / "sft")
    copy = tmp_path / "copy"
    shutil.copytree(run, copy)
    val_loss = json.loads(attnlab("eval", str(run), "--device", "cpu").stdout)["loss"]
    shutil.rmtree(run)
    own = str((copy / "sft_data").resolve())
    assert run_data_dir(copy) == own
    p = attnlab("eval", str(copy), "--device", "cpu")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["loss"] == val_loss
    p = attnlab("sft", "--resume", str(copy), "max_iters=3")
    assert p.returncode == 0, p.stderr
    assert f"data:     {own}:" in p.stdout
    assert json.loads((copy / "config.json").read_text())["data"] == own
    # a run trained on another run's sft_data/ keeps the folder it names
    other = tmp_path / "other"
    other.mkdir()
    saved = {"model": {}, "train": {}, "data": own}
    (other / "config.json").write_text(json.dumps(saved))
    assert run_data_dir(other) == own


def test_sft_resume_refuses_flags_it_cannot_honour(attnlab, model_dir: Path, tmp_path: Path):  # noqa: F811
    """`sft --resume RUN --data X --chat --out Y` trained RUN on and ignored all three."""
    run = _sft_run(attnlab, model_dir, tmp_path / "sft")
    before = snapshot(tmp_path)
    for flags, named in (
        (
            ["--data", str(tmp_path / "pairs.jsonl"), "--chat", "--out", str(tmp_path / "y")],
            "--data, --chat, --out",
        ),
        (["--chat"], "--chat"),
    ):
        p = attnlab("sft", "--resume", str(run), *flags, "max_iters=3")
        assert error_line(p, "sft") == f"{named}: a resumed run keeps its own; leave them out"
        assert snapshot(tmp_path) == before


@pytest.mark.parametrize("out", ["new/sft", "empty"], ids=["a new folder", "a folder it found"])
def test_a_refused_sft_leaves_nothing_behind(
    attnlab,  # noqa: F811
    model_dir: Path,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    out: str,
):
    """A check of the trainer's that failed left OUT/sft_data/ (and OUT) behind. A folder the
    command found (here an empty one) stays. A record it drops is reported only once the run
    has started (a second stderr line above the error, before)."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AttnlabError("refused by a check of the trainer's")

    # the trainer's own memory check, which runs after sft_data/ is written (sft's own runs first)
    monkeypatch.setattr("attnlab.train.trainer.check_fits", refuse)
    data = tmp_path / "pairs.jsonl"
    _write_pairs(data)
    with data.open("a") as f:  # a character the tiny corpus has not: dropped as unencodable
        f.write(json.dumps({"prompt": "\u65e5", "response": "the"}) + "\n")
    (tmp_path / "empty").mkdir()
    before = snapshot(tmp_path)
    p = attnlab("sft", str(model_dir), "--data", str(data), "--out", str(tmp_path / out), *QUICK)
    assert error_line(p, "sft") == "refused by a check of the trainer's"
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("race", ["lost-the-folder", "found-it-starting"])
def test_an_sft_start_that_loses_the_race_for_out_leaves_the_winner_alone(
    attnlab,  # noqa: F811
    model_dir: Path,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    race: str,
):
    """Two sft starts into one new --out: the one that created it lost the lock to the other,
    then removed the folder the other was training in (the finished run vanished, exit 0);
    one that found the other starting wrote its own sft_data/ over the other's first."""
    from attnlab.rundir import RunLock

    data, out = tmp_path / "pairs.jsonl", tmp_path / "out"
    _write_pairs(data)
    other = RunLock(out, user="trainer")
    if race == "found-it-starting":  # the other start holds the lock and has written its data
        other.acquire()
        (out / "sft_data").mkdir()
        (out / "sft_data" / "train.bin").write_bytes(b"the other start's")
    else:  # the other start takes the lock just after this one created the folder
        acquire = RunLock.acquire

        def taken_first(self: RunLock) -> None:
            if not other.held:
                acquire(other)
                (out / "sft_data" / "train.bin").write_bytes(b"the other start's")
            acquire(self)

        monkeypatch.setattr(RunLock, "acquire", taken_first)
    before = snapshot(tmp_path) if race == "found-it-starting" else None
    p = attnlab("sft", str(model_dir), "--data", str(data), "--out", str(out), *QUICK)
    assert error_line(p, "sft") == (
        f"{out} is in use by another trainer (PID {os.getpid()}); wait for it to finish or stop "
        "it, or choose another folder"
    )
    assert (out / "sft_data" / "train.bin").read_bytes() == b"the other start's"
    if before is not None:
        assert snapshot(tmp_path) == before
    other.release()


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (["n_layer=3"], "n_layer=3 (pretrained: 2)"),
        (["block_size=64"], "block_size=64 (pretrained: 32)"),  # learned positions: wpe grows
        (["n_embd=64", "n_layer=3"], "n_embd=64 (pretrained: 32), n_layer=3 (pretrained: 2)"),
        (["dropout=0.1", "use_m_gate=true"], "use_m_gate=True (pretrained: False)"),
        (["tie_embeddings=false"], "tie_embeddings=False (pretrained: True)"),
        # the same weight shapes, another meaning: heads split differently, another norm
        (["n_head=2"], "n_head=2 (pretrained: 4)"),
        (["norm=rmsnorm", "bias=false"], "norm='rmsnorm' (pretrained: 'layernorm')"),
        # the vocabulary follows the tokenizer: an override was silently ignored
        (["vocab_size=500"], "vocab_size=500 (pretrained: {vocab})"),
        (["n_layer=1000000000"], "n_layer=1000000000 (pretrained: 2)"),  # no model is built
    ],
)
def test_sft_refuses_model_overrides_that_change_the_pretrained_model(
    attnlab,  # noqa: F811
    model_dir: Path,  # noqa: F811
    tmp_path: Path,
    overrides: list[str],
    named: str,
):
    """It said "init_weights does not fit the model: missing keys: transformer.h.2...", naming
    an internal argument and weight keys, and it fine-tuned n_head=2 or norm=rmsnorm without a
    word, giving the pretrained weights another meaning."""
    data = tmp_path / "pairs.jsonl"
    _write_pairs(data)
    before = snapshot(tmp_path)
    out = str(tmp_path / "sft")
    p = attnlab("sft", str(model_dir), "--data", str(data), "--out", out, *QUICK, *overrides)
    vocab = ckpt.read_model_config(ckpt.model_folder(model_dir)).vocab_size
    assert error_line(p, "sft") == (
        f"sft keeps the pretrained model as it is: {named.format(vocab=vocab)}; only dropout (and block_size with "
        "pos=rope) may change"
    )
    assert snapshot(tmp_path) == before


def test_sft_accepts_dropout_and_a_rotary_context() -> None:
    """Dropout, or a longer context under RoPE, still fine-tunes the pretrained weights."""
    base = tiny_model(pos="rope")
    for overrides in ({"dropout": 0.1}, {"block_size": 64}, {"n_layer": base.n_layer}):
        sft.check_model_overrides(base, overrides)


def test_sft_refuses_an_out_it_cannot_write(attnlab, model_dir: Path, tmp_path: Path):  # noqa: F811
    """A read-only --out was a PermissionError traceback from inside the data writer."""
    data = tmp_path / "pairs.jsonl"
    _write_pairs(data)
    out = "/proc/attnlab-sft/run"  # no file can be made there, even by root
    p = attnlab("sft", str(model_dir), "--data", str(data), "--out", out, *QUICK)
    assert error_line(p, "sft").startswith(f"cannot write {out} (")
    assert error_line(p, "sft").endswith("); choose another --out")


@pytest.mark.slow
def test_pretrain_sft_chat_sft_chain_on_shipped_data(tmp_path: Path) -> None:
    """The offline pipeline through the CLI: pretrain, instruction SFT, chat SFT, chat."""
    small = [
        "n_layer=2",
        "n_embd=32",
        "n_head=4",
        "n_kv_head=2",
        "block_size=64",
        "norm=rmsnorm",
        "pos=rope",
        "mlp=swiglu",
        "ffn_sublayers=2",
        "value_gate=true",
    ]
    quick = ["eval_interval=5", "eval_iters=2", "batch_size=4", "device=cpu", "tensorboard=false"]
    steps = [
        ("train", "--out", str(tmp_path / "pre"), "max_iters=5", *small, *quick),
        ("sft", str(tmp_path / "pre"), "--out", str(tmp_path / "sft"), "max_iters=5", *quick),
        (
            "sft",
            str(tmp_path / "sft"),
            "--chat",
            "--out",
            str(tmp_path / "chat"),
            "max_iters=5",
            *quick,
        ),
    ]
    for args in steps:
        proc = run_cli(*args, timeout=900)
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout[proc.stdout.index("{") :])["iters"] == 5
    proc = run_cli(
        "chat", str(tmp_path / "chat"), "--max-new-tokens", "8", input="Who speaks it?\n/exit\n"
    )
    assert proc.returncode == 0, proc.stderr
    meta = json.loads((tmp_path / "chat" / "sft_data" / "meta.json").read_text())
    assert meta["provenance"]["sft_source"] == str(SHIPPED["chat"])


def test_sft_starts_from_a_native_gpt2_export(train_tiny, tmp_path: Path) -> None:
    """SFT read an export's weights in GPT-2's names and layouts ("shape mismatches"), although
    sample and eval accept the folder."""
    from attnlab.export import export

    pre, _ = train_tiny(tmp_path / "pre", max_iters=2, eval_interval=2, eval_iters=1)
    export(tmp_path / "pre", tmp_path / "gpt2", ["safetensors"])
    assert json.loads((tmp_path / "gpt2" / "config.json").read_text())["model_type"] == "gpt2"
    data = tmp_path / "pairs.jsonl"
    _write_pairs(data)
    over = ["max_iters=1", "eval_interval=1", "eval_iters=1", "batch_size=2", "warmup_iters=0"]
    trainer = sft.start(tmp_path / "gpt2", tmp_path / "sft", data, overrides=over, quiet=True)
    vocab = pre.model_config.vocab_size
    for name, weight in pre.model.state_dict().items():
        got = trainer.model.state_dict()[name]
        assert torch.equal(got[:vocab] if "wte" in name or "lm_head" in name else got, weight)


@pytest.mark.parametrize("pos", ["learned", "rope"])
def test_sft_chat_refuses_a_context_too_short_for_chatml(
    attnlab,  # noqa: F811
    tiny_data: Path,
    tmp_path: Path,
    pos: str,
):
    """It trained a model that `attnlab chat` then refused: ChatML's markers fill the context."""
    from attnlab.data.chat import framing_tokens

    tok = load_dataset(tiny_data).tokenizer
    model = GPT(tiny_model(vocab_size=tok.vocab_size, block_size=8, pos=pos))
    folder = ckpt.save_checkpoint(tmp_path / "model", model, tok)
    tok.add_special_tokens(SPECIAL_TOKENS)
    need = framing_tokens(tok, []) + 2
    before = snapshot(tmp_path)
    p = attnlab("sft", str(folder), "--chat", "--out", str(tmp_path / "sft"), *QUICK)
    fix = (
        f"pass block_size={need} or more"
        if pos == "rope"
        else f"start from a model with a context of {need} tokens or more"
    )
    assert error_line(p, "sft") == (
        f"sft --chat: a context of 8 tokens cannot hold a ChatML turn (the markers, a message "
        f"and a reply need {need}); {fix}"
    )
    assert snapshot(tmp_path) == before
    if pos == "rope":  # the fix it names works
        p = attnlab("sft", str(folder), "--chat", "--out", str(tmp_path / "sft"), *QUICK,
                    f"block_size={need}")  # fmt: skip
        assert p.returncode == 0, p.stderr
