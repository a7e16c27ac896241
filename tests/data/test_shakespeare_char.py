"""shakespeare_char ships in the package: nanoGPT's text and nanoGPT's bins, byte for byte."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from conftest import run_cli

from attnlab.data.corpus import NANOGPT_CHAR_MD5, nanogpt_char_text
from attnlab.data.prepare import default_data_dir, load_dataset
from attnlab.presets import PRESETS
from attnlab.train.spec import resolve


def nanogpt_bins(text: str) -> tuple[bytes, bytes, int]:
    """What nanoGPT's data/shakespeare_char/prepare.py writes, by its rule: ids by sorted
    character, the first 90 % of the characters train, the rest val, uint16."""
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    n = len(text)
    train = np.array([stoi[c] for c in text[: int(n * 0.9)]], dtype=np.uint16)
    val = np.array([stoi[c] for c in text[int(n * 0.9) :]], dtype=np.uint16)
    return train.tobytes(), val.tobytes(), len(chars)


def test_the_shipped_text_is_nanogpts() -> None:
    text = nanogpt_char_text()
    assert len(text) == 1_115_394 and len(set(text)) == 65
    assert hashlib.md5(text.encode()).hexdigest() == NANOGPT_CHAR_MD5


def test_prepare_writes_nanogpts_bins(tmp_path: Path) -> None:
    out = tmp_path / "sc"
    proc = run_cli("prepare", "--corpus", "shakespeare_char", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    train, val, vocab = nanogpt_bins(nanogpt_char_text())
    assert (out / "train.bin").read_bytes() == train
    assert (out / "val.bin").read_bytes() == val
    meta = json.loads((out / "meta.json").read_text())
    assert (meta["vocab_size"], meta["train_tokens"], meta["val_tokens"]) == (
        vocab,
        1_003_854,
        111_540,
    )
    assert meta["provenance"]["name"] == "shakespeare_char"
    assert "6f9487a6fe5b420b7ca9afb0d7c078e37c1d1b4e" in meta["provenance"]["sources"][0]


def test_it_is_prepared_alone(tmp_path: Path) -> None:
    """Its split is nanoGPT's, not per document: mixed with other sources it is refused."""
    (tmp_path / "a.txt").write_text("more text\n" * 50)
    out = tmp_path / "mixed"
    proc = run_cli(
        "prepare", "--corpus", "shakespeare_char", str(tmp_path / "a.txt"), "--out", str(out)
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "attnlab prepare: error: shakespeare_char keeps nanoGPT's own train/val split and is "
        "prepared alone; give it as the only --corpus"
    ]
    assert not out.exists()


@pytest.mark.parametrize(
    "preset", [name for name, p in PRESETS.items() if p.data.get("corpus") == "shakespeare_char"]
)
def test_the_kv_bias_presets_train_on_it(preset: str, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("ATTNLAB_HOME", str(tmp_path))
    spec = resolve(preset)
    assert spec.data_dir == default_data_dir(corpus="shakespeare_char")
    assert not spec.data_dir.exists()  # resolving writes nothing; loading prepares it
    assert load_dataset(spec.data_dir).meta["vocab_size"] == 65


def test_the_kv_bias_presets_are_the_seeds() -> None:
    """Every preset of the kv-bias seed's table uses the seed's data."""
    seeds = [n for n in PRESETS if n.startswith(("shakespeare-char", "kv-bias-"))]
    assert len(seeds) == 6
    assert all(PRESETS[n].data == {"corpus": "shakespeare_char"} for n in seeds)
