"""Property tests (hypothesis): configs, the char tokenizer, the batch sampler and top-p."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import assume, find, given, settings
from hypothesis import strategies as st

from attnlab.config import CHOICES, ROPE_THETA, ModelConfig
from attnlab.data.bins import BatchSampler
from attnlab.data.tokenizer import Tokenizer
from attnlab.errors import AttnlabError, ConfigError
from attnlab.model import mechanisms
from attnlab.model.generation import filter_logits
from attnlab.model.mechanisms import choices

FAST = settings(max_examples=40, deadline=None)
DEFAULTS = ModelConfig().to_dict()
ALL_CHOICES = {**CHOICES, **choices()}
# the model's fields with string choices (CHOICES holds the training config's too: dtype, ...)
TEXT_CHOICES = sorted(
    n
    for n, allowed in ALL_CHOICES.items()
    if n in DEFAULTS and all(isinstance(a, str) for a in allowed)
)


@st.composite
def mechanism_fields(draw) -> dict:
    """Each registered mechanism on or off; one that is on has its SPEC example with every other
    field it owns drawn (a bool either way, a choice field from its choices, an int switch from
    2 to 4)."""
    drawn: dict = {}
    for spec in mechanisms.specs():
        if not draw(st.booleans()):
            continue
        drawn.update({k: v for k, v in spec.example.items() if k in spec.fields})
        for name in spec.fields:
            default = DEFAULTS[name]
            if name in spec.choices:
                drawn[name] = draw(st.sampled_from(spec.choices[name]))
            elif isinstance(default, bool):
                drawn[name] = draw(st.booleans()) if name not in spec.switch else True
            elif isinstance(default, int) and name in spec.switch:
                drawn[name] = draw(st.integers(2, 4))
    return drawn


@st.composite
def valid_model_configs(draw) -> dict:
    """Keyword arguments of a valid ModelConfig (sizes kept small; every backbone component,
    every registered mechanism's fields)."""
    pos = draw(st.sampled_from(CHOICES["pos"]))
    n_head = draw(st.integers(1, 8))
    head_dim = draw(st.integers(1, 8)) * (2 if pos == "rope" else 1)
    kv_divisors = [d for d in range(1, n_head + 1) if n_head % d == 0]
    kwargs = dict(
        block_size=draw(st.integers(1, 4096)), vocab_size=draw(st.integers(1, 70000)),
        n_layer=draw(st.integers(1, 48)), n_head=n_head, n_embd=n_head * head_dim,
        dropout=draw(st.floats(0.0, 0.99)), bias=draw(st.booleans()),
        norm=draw(st.sampled_from(CHOICES["norm"])),
        norm_eps=draw(st.none() | st.floats(1e-8, 1e-2)),
        norm_placement=draw(st.sampled_from(CHOICES["norm_placement"])), pos=pos,
        rope_theta=draw(st.floats(1.0, 1e6)) if pos == "rope" else ROPE_THETA,
        mlp=draw(st.sampled_from(CHOICES["mlp"])),
        d_ffn=draw(st.none() | st.integers(1, 2048)),
        ffn_sublayers=draw(st.sampled_from(CHOICES["ffn_sublayers"])),
        n_kv_head=draw(st.none() | st.sampled_from(kv_divisors)),
        tie_embeddings=draw(st.booleans()),
        **draw(mechanism_fields()),
    )  # fmt: skip
    # a combination the SPECs refuse (a rule, or mechanisms that do not compose): not drawn
    try:
        mechanisms.validate(SimpleNamespace(**{**DEFAULTS, **kwargs}))
    except ConfigError:
        assume(False)
    return kwargs


@pytest.mark.parametrize("name", sorted(DEFAULTS))
def test_the_drawn_configs_set_every_field(name: str) -> None:
    """A field added to ModelConfig (a new mechanism's) is drawn, or this fails naming it."""
    find(valid_model_configs(), lambda kwargs: name in kwargs, settings=settings(database=None))


@FAST
@given(valid_model_configs())
def test_model_config_round_trips_through_json(kwargs):
    config = ModelConfig(**kwargs)
    again = ModelConfig.from_dict(json.loads(config.to_json()))
    assert again == config
    assert again.to_json() == config.to_json()
    # defaults are filled in once and survive the trip
    assert again.d_ffn == (kwargs["d_ffn"] or 4 * kwargs["n_embd"])
    assert again.n_kv_head == (kwargs["n_kv_head"] or kwargs["n_head"])


# the sizes that must be positive: the backbone's and every mechanism's integer switch
POSITIVE = ["block_size", "vocab_size", "n_layer", "n_head", "n_embd", "d_ffn", "n_kv_head"] + [
    name for spec in mechanisms.specs() for name in spec.switch if type(DEFAULTS[name]) is int
]


@st.composite
def invalid_model_configs(draw) -> tuple[dict, str]:
    """(kwargs, name of the offending field): a valid config with one field broken."""
    kwargs = draw(valid_model_configs())
    kind = draw(st.sampled_from(["not_positive", "choice", "type", "divisible", "dropout"]))
    if kind == "not_positive":
        name = draw(st.sampled_from(POSITIVE))
        kwargs[name] = draw(st.integers(-1000, 0))
    elif kind == "choice":  # every field with string choices: a misspelt one
        name = draw(st.sampled_from(TEXT_CHOICES))
        kwargs[name] = draw(
            st.text(min_size=1, max_size=8).filter(lambda s: s not in ALL_CHOICES[name])
        )
    elif kind == "type":
        name = draw(st.sampled_from(["n_layer", "block_size", "bias", "dropout"]))
        kwargs[name] = draw(st.sampled_from(["2", [2], {"x": 1}]))
    elif kind == "divisible":
        name = "n_embd"
        n_head = draw(st.integers(2, 8))
        kwargs.update(
            n_head=n_head,
            n_kv_head=None,
            pos="learned",
            n_embd=n_head * draw(st.integers(1, 8)) + draw(st.integers(1, n_head - 1)),
        )
    else:
        name = "dropout"
        kwargs[name] = draw(st.floats(1.0, 100.0) | st.floats(-100.0, -1e-6))
    return kwargs, name


@FAST
@given(invalid_model_configs())
def test_invalid_model_config_is_a_value_error_naming_the_field(case):
    kwargs, name = case
    with pytest.raises(ValueError, match=f"{name}="):
        ModelConfig(**kwargs)


@FAST
@given(st.data())
def test_char_tokenizer_round_trips_any_text_over_its_vocab(data):
    chars = data.draw(
        st.lists(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=40, unique=True)
    )
    tok = Tokenizer.from_chars(chars)
    text = data.draw(st.text(alphabet=chars, max_size=200))
    ids = tok.encode(text)
    assert ids == [chars.index(c) for c in text]
    assert tok.decode(ids) == text
    outsider = data.draw(st.characters(exclude_categories=["Cs"]).filter(lambda c: c not in chars))
    with pytest.raises(AttnlabError, match="not in the vocabulary"):
        tok.encode(text + outsider)


@FAST
@given(n=st.integers(2, 500), block=st.integers(1, 64), per_rank=st.integers(1, 3),
       world=st.integers(1, 4), seed=st.integers(0, 2**31))  # fmt: skip
def test_batch_sampler_windows_are_contiguous_and_shifted(n, block, per_rank, world, seed):
    assume(n >= block + 1)
    batch = per_rank * world
    tokens = np.arange(n, dtype=np.uint32)  # a token's value is its position
    sampler = BatchSampler(tokens, block, batch, seed)
    for _ in range(3):
        x, y = sampler.next_batch()
        assert x.shape == y.shape == (batch, block)
        starts = x[:, :1]
        assert torch.equal(x, starts + torch.arange(block))  # a contiguous slice of the data
        assert bool((starts >= 0).all()) and bool((starts + block < n).all())
        assert torch.equal(y, x + 1)  # targets are the next tokens
    # ranks split the global batch: together they draw exactly the single-process batch
    whole = BatchSampler(tokens, block, batch, seed).next_batch()[0]
    parts = [
        BatchSampler(tokens, block, batch, seed, r, world).next_batch()[0] for r in range(world)
    ]
    assert torch.equal(torch.cat(parts), whole)


@FAST
@given(n=st.integers(10, 300), block=st.integers(1, 8), k=st.integers(0, 5))
def test_batch_sampler_state_continues_the_same_stream(n, block, k):
    tokens = np.random.default_rng(n).integers(0, 50, n).astype(np.uint16)
    a = BatchSampler(tokens, block, 4, seed=7)
    for _ in range(k):
        a.next_batch()
    b = BatchSampler(tokens, block, 4, seed=99)
    b.load_state_dict(a.state_dict())
    for xa, xb in zip(a.next_batch(), b.next_batch(), strict=True):
        assert torch.equal(xa, xb)


@FAST
@given(
    logits=st.lists(st.floats(-8.0, 8.0), min_size=1, max_size=24),
    top_p=st.floats(0.01, 0.99),
)
def test_top_p_keeps_the_smallest_prefix_reaching_p(logits, top_p):
    values = torch.tensor(logits, dtype=torch.float32)
    probs = torch.softmax(values.double(), dim=-1)
    cum = torch.sort(probs, descending=True).values.cumsum(0)
    assume(bool((cum - top_p).abs().min() > 1e-5))  # float32 rounding could go either way
    want = int((cum < top_p).sum()) + 1  # tokens needed until the mass reaches top_p
    kept = torch.isfinite(filter_logits(values[None], top_p=top_p)[0])
    assert int(kept.sum()) == want
    assert float(probs[kept].sum()) >= top_p
    assert bool((probs[~kept][:, None] <= probs[kept][None, :]).all())  # the most likely ones
    assert torch.equal(filter_logits(values[None], top_p=1.0)[0], values)  # p = 1 keeps all
