"""`attnlab chat`: history trimming and a conversation driven through a pipe."""

from __future__ import annotations

from pathlib import Path

import torch
from conftest import run_cli, tiny_model

from attnlab.data.chat import IM_END, SPECIAL_TOKENS, chatml_segments, encode_segments, fit_history
from attnlab.data.tokenizer import Tokenizer
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
    # the latest message alone too long: its oldest tokens are cut
    assert fit_history(tok, [system, *turns], 5) == everything[-5:]


def _greedy_reply(model: GPT, tok: Tokenizer, messages: list[dict[str, str]], max_new: int) -> str:
    ids = fit_history(tok, messages, model.config.block_size - max_new)
    out = generate(
        model, torch.tensor([ids]), max_new, temperature=0.0, eos_token_id=tok.token_to_id(IM_END)
    )
    reply = out[0, len(ids) :].tolist()
    stops = [i for i, t in enumerate(reply) if t >= len(CHARS)]  # <|im_start|> or <|im_end|>
    return tok.decode(reply[: stops[0]] if stops else reply)


def test_chat_through_a_pipe(tmp_path: Path) -> None:
    tok = chat_tokenizer()
    torch.manual_seed(0)
    model = GPT(tiny_model(vocab_size=tok.vocab_size, block_size=128)).eval()
    save_checkpoint(tmp_path / "model", model, tok)
    user = {"role": "user", "content": "who are you?"}
    first = _greedy_reply(model, tok, [user], 12)
    second = _greedy_reply(model, tok, [user, {"role": "assistant", "content": first}, user], 12)
    assert first != second  # the history matters, so the check below can tell it was kept

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
