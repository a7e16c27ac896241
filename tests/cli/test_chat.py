"""`attnlab chat`: history trimming and a conversation driven through a pipe."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch
from conftest import run_cli, tiny_model
from test_bad_input import attnlab, error_line  # noqa: F401  (a fixture and a helper)

from attnlab.data.chat import IM_END, SPECIAL_TOKENS, chatml_segments, encode_segments, fit_history
from attnlab.data.tokenizer import Tokenizer
from attnlab.errors import AttnlabError
from attnlab.model import GPT
from attnlab.model.generation import generate
from attnlab.train.checkpoint import save_checkpoint

CHARS = "abcdefghijklmnopqrstuvwxyz ?.\n"


def chat_tokenizer() -> Tokenizer:
    tok = Tokenizer.train_char(CHARS)
    tok.add_special_tokens(SPECIAL_TOKENS)
    return tok


def test_fit_history_drops_oldest_exchanges_and_keeps_system() -> None:
    tok = chat_tokenizer()
    system = {"role": "system", "content": "be kind."}
    texts = ["one", "uno", "two", "dos", "three?"]  # user, assistant, user, assistant, user
    turns = [{"role": ("user", "assistant")[i % 2], "content": t} for i, t in enumerate(texts)]

    def ids(messages: list[dict[str, str]]) -> list[int]:
        return encode_segments(tok, chatml_segments(messages, add_generation_prompt=True))[0]

    everything = ids([system, *turns])
    assert fit_history(tok, [system, *turns], len(everything)) == everything
    # one token short: the oldest exchange goes, the system message stays
    assert fit_history(tok, [system, *turns], len(everything) - 1) == ids([system, *turns[2:]])
    assert fit_history(tok, [system, *turns], len(ids([system, *turns[4:]]))) == ids(
        [system, *turns[4:]]
    )


def test_fit_history_cuts_the_latest_message_and_keeps_the_system_message() -> None:
    """A latest message too long for the budget was cut together with the system message."""
    tok = chat_tokenizer()
    system = {"role": "system", "content": "be kind."}
    turns = [{"role": "user", "content": "one"}, {"role": "assistant", "content": "uno"}]
    latest = {"role": "user", "content": "three?"}

    def ids(messages: list[dict[str, str]]) -> list[int]:
        return encode_segments(tok, chatml_segments(messages, add_generation_prompt=True))[0]

    # char tokens: system 1 + 7 + 8 + 1 + 1, an empty user turn 1 + 5 + 1 + 1, the open reply 11
    assert len(ids([system, {**latest, "content": ""}])) == 37
    assert len(ids([system, latest])) == 43
    # 3 tokens of room: the oldest exchange goes, then the oldest 3 of "three?"
    cut = ids([system, {**latest, "content": "ee?"}])
    assert fit_history(tok, [system, *turns, latest], 40) == cut and len(cut) == 40
    assert fit_history(tok, [system, latest], 38) == ids([system, {**latest, "content": "?"}])
    assert fit_history(tok, [latest], 20) == ids([{**latest, "content": "?"}])  # 19 of markers
    # no room for one token of the message: refused, never a prompt without its system message
    for budget in (37, 5):
        with pytest.raises(AttnlabError) as err:
            fit_history(tok, [system, *turns, latest], budget)
        assert str(err.value) == (
            "no room for the message: the system message and the ChatML markers take 37 of the "
            f"{budget} tokens the prompt may have"
        )
    with pytest.raises(AttnlabError) as err:
        fit_history(tok, [latest], 19)
    assert str(err.value) == (
        "no room for the message: the ChatML markers take 19 of the 19 tokens the prompt may have"
    )


def _greedy_reply(model: GPT, tok: Tokenizer, messages: list[dict[str, str]], max_new: int) -> str:
    ids = fit_history(tok, messages, model.config.block_size - max_new)
    out = generate(
        model, torch.tensor([ids]), max_new, temperature=0.0, eos_token_id=tok.token_to_id(IM_END)
    )
    reply = out[0, len(ids) :].tolist()
    stops = [i for i, t in enumerate(reply) if t >= len(CHARS)]  # <|im_start|> or <|im_end|>
    return tok.decode(reply[: stops[0]] if stops else reply)


def _saved_model_and_replies(folder: Path) -> tuple[str, str]:
    """Save a tiny chat model in ``folder``; its greedy replies to "who are you?" asked once, then
    again after its first reply (different, so an output shows whether history was kept)."""
    tok = chat_tokenizer()
    torch.manual_seed(0)
    model = GPT(tiny_model(vocab_size=tok.vocab_size, block_size=128)).eval()
    save_checkpoint(folder, model, tok)
    user = {"role": "user", "content": "who are you?"}
    first = _greedy_reply(model, tok, [user], 12)
    second = _greedy_reply(model, tok, [user, {"role": "assistant", "content": first}, user], 12)
    assert first != second
    return first, second


def test_chat_through_a_pipe(tmp_path: Path) -> None:
    first, second = _saved_model_and_replies(tmp_path / "model")

    proc = run_cli(
        "chat",
        str(tmp_path / "model"),
        "--temperature",
        "0",
        "--max-new-tokens",
        "12",
        input="who are you?\nwho are you?\n/reset\nwho are you?\n/exit\nnever read\n",
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"{first}\n{second}\n(history cleared)\n{first}\n"


def test_chat_needs_chatml_tokens(tmp_path: Path) -> None:
    from attnlab.cli import main

    tok = Tokenizer.train_char(CHARS)
    save_checkpoint(tmp_path / "plain", GPT(tiny_model(vocab_size=tok.vocab_size)), tok)
    assert main(["chat", str(tmp_path / "plain")]) == 2


def test_a_system_message_outside_the_vocabulary_is_refused_once(tmp_path: Path) -> None:
    """Every turn printed the vocabulary error instead of a reply, and chat exited 0."""
    tok = chat_tokenizer()
    save_checkpoint(tmp_path / "model", GPT(tiny_model(vocab_size=tok.vocab_size)), tok)
    proc = run_cli("chat", str(tmp_path / "model"), "--system", "\u65e5\u672c", input="hi\nhi\n")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines() == [
        "attnlab chat: error: --system: 2 character(s) not in the vocabulary: '\u65e5', '\u672c'"
    ]


def test_a_command_with_an_argument_gets_a_usage_hint(
    attnlab,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`/exit now` said "unknown command /exit"; quitting or clearing on a guess loses the
    conversation, so a command given an argument does nothing but say how it is used."""
    first, second = _saved_model_and_replies(tmp_path / "model")
    lines = "who are you?\n/reset all\n/exit now\n/help me\nwho are you?\n/exit\n"
    monkeypatch.setattr("sys.stdin", io.StringIO(lines))
    p = attnlab("chat", str(tmp_path / "model"), "--temperature", "0", "--max-new-tokens", "12")
    assert p.returncode == 0 and p.stderr == ""
    # "/reset all" kept the history: the second reply is the one that follows the first
    hints = "".join(f"{c} takes no arguments\n" for c in ("/reset", "/exit", "/help"))
    assert p.stdout == f"{first}\n{hints}{second}\n"


def test_a_system_message_leaving_no_room_is_refused_once(
    attnlab,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The system message was cut from the prompt when a message filled the context."""
    tok = chat_tokenizer()
    save_checkpoint(tmp_path / "model", GPT(tiny_model(vocab_size=tok.vocab_size)), tok)
    monkeypatch.setattr("sys.stdin", io.StringIO("hi\nhi\n"))
    p = attnlab("chat", str(tmp_path / "model"), "--system", "be kind.")
    assert p.stdout == ""
    # block_size 32: 16 tokens for the prompt, 37 for the system message and the markers
    assert error_line(p, "chat") == (
        "no room for the message: the system message and the ChatML markers take 37 of the 16 "
        "tokens the prompt may have (a context of 32 tokens, 16 kept for the reply); shorten "
        "--system"
    )
    # without it the markers take 19: a shorter reply leaves room, and the line says how short
    monkeypatch.setattr("sys.stdin", io.StringIO("hi\n"))
    p = attnlab("chat", str(tmp_path / "model"))
    assert error_line(p, "chat") == (
        "no room for the message: the ChatML markers take 19 of the 16 tokens the prompt may "
        "have (a context of 32 tokens, 16 kept for the reply); pass --max-new-tokens 12 or fewer"
    )
    monkeypatch.setattr("sys.stdin", io.StringIO("hi\n/exit\n"))
    assert attnlab("chat", str(tmp_path / "model"), "--max-new-tokens", "12").returncode == 0


def test_sample_stops_where_a_chat_tuned_model_ends_its_text(tmp_path: Path) -> None:
    """`sample` printed <|im_end|> and went on; transformers' generate stops there (the export's
    generation_config names it the EOS), and so does sample unless --ignore-eos."""
    tok = chat_tokenizer()
    prompt, new = tok.encode("who are you?\n"), 24
    for seed in range(200):  # a tiny random model whose greedy continuation ends a turn
        torch.manual_seed(seed)
        model = GPT(tiny_model(vocab_size=tok.vocab_size, block_size=64)).eval()
        out = generate(model, torch.tensor([prompt]), new, temperature=0.0)[0, len(prompt) :]
        ends = [i for i, t in enumerate(out.tolist()) if t == tok.eos_id]
        if ends and 0 < ends[0] < new - 1:
            break
    else:
        pytest.fail("no seed ends its text within the tokens drawn")
    assert tok.eos_id == tok.token_to_id(IM_END)
    save_checkpoint(tmp_path / "model", model, tok)
    args = ("sample", str(tmp_path / "model"), "--prompt", "who are you?\n", "--temperature", "0")
    proc = run_cli(*args, "--max-new-tokens", str(new))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == tok.decode(prompt + out[: ends[0]].tolist()) + "\n"
    proc = run_cli(*args, "--max-new-tokens", str(new), "--ignore-eos")
    assert proc.stdout == tok.decode(prompt + out.tolist()) + "\n" and IM_END in proc.stdout
    # a tokenizer without an end token (plain pretraining) samples every token asked for
    assert Tokenizer.train_char(CHARS).eos_id is None
