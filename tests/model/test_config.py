"""ModelConfig / TrainConfig: validation messages, JSON round trips, presets, overrides, schedule."""

from __future__ import annotations

import json
import math

import pytest

from attnlab.config import ModelConfig, TrainConfig, split_overrides
from attnlab.errors import AttnlabError
from attnlab.presets import PRESETS, RENAMED


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"n_embd": 100, "n_head": 3}, "n_embd=100 must be divisible by n_head=3"),
        ({"n_layer": 0}, "n_layer=0 must be > 0"),
        ({"vocab_size": -5}, "vocab_size=-5 must be > 0"),
        (
            {"norm": "batchnorm"},
            "norm='batchnorm' is not allowed; choose one of 'layernorm', 'rmsnorm'",
        ),
        ({"mlp": "relu"}, "mlp='relu'"),
        ({"n_head": 12, "n_kv_head": 5}, "n_head=12 must be divisible by n_kv_head=5"),
        ({"dropout": 1.5}, "dropout=1.5 must be in [0, 1)"),
        ({"n_embd": "wide"}, "n_embd='wide' must be of type int"),
        ({"bias": 1}, "bias=1 must be of type bool"),
    ],
)
def test_bad_model_values_name_field_value_and_allowed(overrides: dict, message: str) -> None:
    with pytest.raises(ValueError) as info:
        ModelConfig(**overrides)
    assert message in str(info.value)


def test_json_round_trip_keeps_every_field() -> None:
    config = ModelConfig(
        n_layer=3,
        n_head=6,
        n_kv_head=2,
        n_embd=96,
        pos="rope",
        norm="rmsnorm",
        mlp="swiglu",
        d_ffn=128,
        use_m_gate=True,
        value_gate=True,
    )
    again = ModelConfig.from_dict(json.loads(config.to_json()))
    assert again == config
    assert again.norm_eps == 1e-6 and again.d_ffn == 128 and again.kv_dim == 32


def test_defaults_are_nanogpts() -> None:
    c = ModelConfig()
    assert (c.block_size, c.vocab_size, c.n_layer, c.n_head, c.n_embd, c.dropout, c.bias) == (
        1024,
        50304,
        12,
        12,
        768,
        0.0,
        True,
    )
    assert c.norm_eps == 1e-5 and c.d_ffn == 4 * 768 and c.n_kv_head == 12


def test_unknown_key_gets_a_did_you_mean() -> None:
    with pytest.raises(AttnlabError, match="did you mean 'n_embd'"):
        ModelConfig.from_dict({"n_emb": 64})
    with pytest.raises(AttnlabError, match="did you mean 'learning_rate'"):
        split_overrides(["lerning_rate=1e-3"])


def test_overrides_are_routed_and_parsed() -> None:
    model, train = split_overrides(
        ["n_layer=3", "use_m_gate=true", "learning_rate=3e-4", "device=cpu", "lr_decay_iters=none"]
    )
    assert model == {"n_layer": 3, "use_m_gate": True}
    assert train == {"learning_rate": 3e-4, "device": "cpu", "lr_decay_iters": None}


def test_presets_build_and_cite_their_source() -> None:
    for name, preset in PRESETS.items():
        config = ModelConfig.preset(name)
        assert preset.description, name
        assert TrainConfig.from_dict(preset.train).max_iters > 0
        assert config.n_embd % config.n_head == 0
    kv = ModelConfig.preset("shakespeare-char")
    assert (kv.n_layer, kv.n_head, kv.n_embd, kv.block_size, kv.bias) == (6, 4, 128, 128, False)
    assert ModelConfig.preset("kv-bias-shakespeare-char", n_layer=4).n_layer == 4
    with pytest.raises(AttnlabError, match="unknown preset"):
        ModelConfig.preset("shakespear-char")


@pytest.mark.parametrize("old, new", sorted(RENAMED.items()))
def test_former_preset_names_still_load(old: str, new: str) -> None:
    assert old not in PRESETS and new in PRESETS
    assert ModelConfig.preset(old, n_layer=2) == ModelConfig.preset(new, n_layer=2)


def test_schedule_is_nanogpts_warmup_then_cosine() -> None:
    cfg = TrainConfig(learning_rate=1e-3, min_lr=1e-4, warmup_iters=100, max_iters=3000)
    assert cfg.lr_at(0) == pytest.approx(1e-3 * 1 / 101)
    assert cfg.lr_at(99) == pytest.approx(1e-3 * 100 / 101)
    mid = 100 + (3000 - 100) // 2
    assert cfg.lr_at(mid) == pytest.approx(1e-4 + 0.5 * (1 + math.cos(math.pi * 0.5)) * 9e-4)
    assert cfg.lr_at(3000) == pytest.approx(1e-4)
    assert cfg.lr_at(5000) == 1e-4
    assert TrainConfig(decay_lr=False).lr_at(7) == TrainConfig().learning_rate


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"batch_size": 0}, "batch_size=0 must be > 0"),
        ({"beta2": 1.0}, "beta2=1.0 must be in [0, 1)"),
        ({"nan_policy": "ignore"}, "nan_policy='ignore'"),
        ({"min_lr": 1.0}, "min_lr=1.0 must not exceed"),
    ],
)
def test_bad_train_values(overrides: dict, message: str) -> None:
    with pytest.raises(ValueError) as info:
        TrainConfig(**overrides)
    assert message in str(info.value)


def test_replace_derives_dependent_fields_again() -> None:
    base = ModelConfig(n_embd=128, n_head=4)
    narrow = base.replace(n_embd=112, n_head=2)
    assert (narrow.d_ffn, narrow.n_kv_head) == (448, 2)
    assert base.replace(norm="rmsnorm").norm_eps == 1e-6
    explicit = ModelConfig(n_embd=128, n_head=4, d_ffn=300, n_kv_head=2)
    assert explicit.replace(n_embd=64).d_ffn == 300 and explicit.replace(n_layer=2).n_kv_head == 2


@pytest.mark.parametrize(
    ("preset", "overrides", "warmup", "decay"),
    [
        ("shakespeare-char", [], 100, 3000),  # the preset's own schedule
        ("shakespeare-char", ["max_iters=300"], 10, 300),  # a tenth of the run: a tenth of each
        ("shakespeare-char", ["max_iters=6000"], 200, 6000),
        ("gba-lm-boosted", ["max_iters=2000"], 150, None),  # decay None follows max_iters anyway
        ("shakespeare-char", ["max_iters=300", "warmup_iters=7"], 7, 300),  # set fields stay
        ("shakespeare-char", ["max_iters=300", "lr_decay_iters=3000"], 10, 3000),
    ],
)
def test_a_presets_schedule_scales_with_max_iters(preset, overrides, warmup, decay) -> None:
    from attnlab.train.spec import resolve

    train = resolve(preset, overrides=overrides, data="data").train
    assert (train.warmup_iters, train.lr_decay_iters) == (warmup, decay)


def test_a_presets_vocab_size_is_kept_only_for_its_own_data(tmp_path) -> None:
    from attnlab.data.prepare import default_data_dir
    from attnlab.train.spec import resolve

    own = default_data_dir("bpe", 16384)  # gba-lm's data: the embedded corpus, BPE 16,384
    assert not resolve("gba-lm-boosted", data=str(own)).vocab_from_data
    assert resolve("gba-lm-boosted", data=str(tmp_path)).vocab_from_data  # other data: its own
    assert not resolve(
        "gba-lm-boosted", overrides=["vocab_size=512"], data=str(tmp_path)
    ).vocab_from_data
    assert resolve("shakespeare-char", data=str(tmp_path)).vocab_from_data
