"""Sampling: temperature, top-k, top-p (nucleus), EOS, and a KV cache for every mechanism.

The cache is exact because every mechanism's per-token state depends only on positions <= t.
Once the context outgrows block_size the model sees a sliding window whose absolute positions
shift every step, so from then on each step recomputes the cropped window (as nanoGPT does).
Forwards over many positions (the prompt, the window, ``use_cache=False``) always run eagerly,
even in a compiled model: see ``compile_for_decoding``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from attnlab.errors import AttnlabError, ConfigError
from attnlab.model.attention import KVCache


def check_sampling(
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    vocab_limit: int | None = None,
) -> None:
    """Refuse sampling settings that would otherwise quietly mean something else."""
    problems = [
        (
            not isinstance(max_new_tokens, int) or max_new_tokens < 0,
            f"max_new_tokens={max_new_tokens!r} must be an integer >= 0",
        ),
        (
            not isinstance(temperature, int | float)
            or not math.isfinite(temperature)
            or temperature < 0,
            f"temperature={temperature!r} must be a finite number >= 0 (0 is greedy)",
        ),
        (
            top_k is not None and (not isinstance(top_k, int) or top_k < 1),
            f"top_k={top_k!r} must be an integer >= 1",
        ),
        (
            top_p is not None
            and (not isinstance(top_p, int | float) or not 0.0 < top_p <= 1.0),  # NaN too
            f"top_p={top_p!r} must be in (0, 1]",
        ),
        (
            vocab_limit is not None and (not isinstance(vocab_limit, int) or vocab_limit < 1),
            f"vocab_limit={vocab_limit!r} must be an integer >= 1",
        ),
    ]
    for bad, message in problems:
        if bad:
            raise ConfigError(message)


def filter_logits(
    logits: torch.Tensor, top_k: int | None = None, top_p: float | None = None
) -> torch.Tensor:
    """Mask all but the top-k logits and the smallest set whose probability reaches top_p."""
    if top_k is not None and top_k > 0:
        kth = torch.topk(logits, min(top_k, logits.size(-1))).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and 0.0 < top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        # drop a token when the tokens before it already reach top_p (the first always stays)
        drop_sorted = (cum - sorted_logits.softmax(dim=-1)) >= top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def restrict_logits(
    logits: torch.Tensor, suppress_tokens: Sequence[int] = (), vocab_limit: int | None = None
) -> torch.Tensor:
    """``logits`` [B, V] with the ids that must never be drawn set to -inf: ``suppress_tokens``
    and every id >= ``vocab_limit``."""
    if suppress_tokens:
        ids = torch.tensor(suppress_tokens, device=logits.device)
        logits = logits.index_fill(-1, ids, -math.inf)
    if vocab_limit is not None and vocab_limit < logits.size(-1):
        logits = logits.clone()
        logits[..., vocab_limit:] = -math.inf
    return logits


def sample_next(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Next token ids [B, 1] from last-position logits [B, V]; temperature 0 means greedy."""
    if temperature <= 0.0:
        return logits.argmax(dim=-1, keepdim=True)
    scaled = logits / temperature
    # a temperature so small that finite logits overflowed (1e-30), one that rounds to 0 in
    # the logits' dtype (1e-300 in float32: 0/0 is NaN) or to inf (1e300: a masked -inf/inf is
    # NaN): shifted by their maximum and divided in float64 (where every positive Python float
    # is finite and nonzero) the largest logit is 0 and the rest below it, the same
    # distribution; only here: ordinary temperatures draw exactly as they always did
    if (scaled.isnan() | (scaled.isinf() & logits.isfinite())).any():
        shifted = logits.double() - logits.amax(dim=-1, keepdim=True).double()
        scaled = (shifted / temperature).to(logits.dtype)
    logits = filter_logits(scaled, top_k, top_p)
    return torch.multinomial(logits.softmax(dim=-1), num_samples=1, generator=generator)


@contextlib.contextmanager
def native_cpu_kernels(device: torch.device) -> Iterator[None]:
    """Run the block with oneDNN off on the CPU, so exact GELU takes PyTorch's own kernel.

    oneDNN's eltwise GELU pays a primitive call per op, which outweighs the work on the few
    hundred values of a decoding step (`attnlab bench generate` measures it); the native
    kernel computes the same erf formula (results may differ in the last bit). Nothing else a
    forward runs here goes through oneDNN in float32. The setting is global, so it is restored
    before control returns to the caller.
    """
    if device.type != "cpu" or not torch.backends.mkldnn.enabled:
        yield
        return
    torch.backends.mkldnn.enabled = False
    try:
        yield
    finally:
        torch.backends.mkldnn.enabled = True


@torch.inference_mode()  # no autograd bookkeeping at all: cheaper per decoding step
def stream(
    model: torch.nn.Module,
    idx: torch.Tensor,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_token_id: int | None = None,
    use_cache: bool = True,
    generator: torch.Generator | None = None,
    suppress_tokens: Sequence[int] = (),
    vocab_limit: int | None = None,
) -> Iterator[torch.Tensor]:
    """Yield each new token column [B, 1]; stops early once every row has produced EOS.

    ``suppress_tokens`` are never drawn (an export's added rows: tokens the model never trained),
    nor is any id >= ``vocab_limit``: pass the tokenizer's vocabulary size when the ids are
    decoded, since a model's vocab_size may be padded above it (as nanoGPT pads GPT-2's 50257 to
    50304) and a padded id decodes to nothing. Both are masked before temperature, top-k, top-p.
    """
    check_sampling(max_new_tokens, temperature, top_k, top_p, vocab_limit)
    block_size = model.config.block_size
    cache: KVCache | None = None
    done = torch.zeros(idx.size(0), dtype=torch.bool, device=idx.device)
    for _ in range(max_new_tokens):
        with native_cpu_kernels(idx.device):
            if use_cache and idx.size(1) <= block_size and cache is not None:
                # the one step a compiled model compiles
                logits, _ = model(idx[:, -1:], cache=cache)
            else:
                with torch.compiler.set_stance("force_eager"):
                    if use_cache and idx.size(1) <= block_size:
                        cache = model.new_cache()
                        logits, _ = model(idx, cache=cache)  # the prompt
                    else:
                        cache = None
                        logits, _ = model(idx[:, -block_size:])  # the whole (cropped) context
        last = restrict_logits(logits[:, -1, :], suppress_tokens, vocab_limit)
        nxt = sample_next(last, temperature, top_k, top_p, generator)
        if eos_token_id is not None:
            nxt = torch.where(done[:, None], torch.full_like(nxt, eos_token_id), nxt)
            done |= nxt[:, 0] == eos_token_id
        idx = torch.cat([idx, nxt], dim=1)
        yield nxt
        if eos_token_id is not None and bool(done.all()):
            return


def compile_for_decoding(model: torch.nn.Module) -> torch.nn.Module:
    """Compile ``model`` in place (``nn.Module.compile``) for decoding, warm it up, and return it.

    Eager decoding of a small model is bound by per-op dispatch, not arithmetic: Inductor fuses
    the elementwise ops and drops the module overhead. That pays for the one-token KV-cached
    step, which is all that is compiled: ``dynamic=True`` lets one graph serve every cache
    length from position 1 on. A forward over many positions (the prompt, the sliding window
    past block_size, ``use_cache=False``) is bound by its matmuls, and ``stream`` runs it
    eagerly, so a generation never waits for a second graph. Graphs land in torch's on-disk
    compile cache, so later runs of the same model start much faster.
    """
    # a decoding step's elementwise kernels work on one position, too few values for SIMD to
    # pay: compiling them scalar shortens the C++ compile and loses no speed (the matmuls
    # are library calls either way); over many positions scalar kernels would be slower than
    # eager ones, which is one more reason those forwards stay eager
    model.compile(dynamic=True, options={"cpp.vec_isa_ok": False})
    device = next(model.parameters()).device
    try:
        idx = torch.zeros((1, 1), dtype=torch.long, device=device)
        generate(model, idx, 3, temperature=0.0)  # steps at cache lengths 1 and 2 (0 and 1 are
        # specialised by the compiler, so this covers the generic graph)
    except Exception as e:  # inductor needs a C++ compiler on CPU, triton on GPU
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise AttnlabError(
            f"torch.compile failed ({type(e).__name__}: {first}); run without --compile"
        ) from e
    return model


def generate(
    model: torch.nn.Module,
    idx: torch.Tensor,
    max_new_tokens: int,
    on_token: Callable[[torch.Tensor], None] | None = None,
    **kwargs: Any,
) -> torch.Tensor:
    """The prompt followed by up to max_new_tokens sampled tokens (see ``stream`` for options)."""
    check_sampling(
        max_new_tokens,
        kwargs.get("temperature", 1.0),
        kwargs.get("top_k"),
        kwargs.get("top_p"),
        kwargs.get("vocab_limit"),
    )
    was_training = model.training
    model.eval()
    try:
        out = [idx]
        for nxt in stream(model, idx, max_new_tokens, **kwargs):
            out.append(nxt)
            if on_token is not None:
                on_token(nxt)
        return torch.cat(out, dim=1)
    finally:
        model.train(was_training)
