"""`attnlab import-hf` refuses a config.json it would read as another model (a context it
would change) and a tokenizer.json that is no tokenizer.

Each case asserts the exit status, the exact one-line message (no traceback) and that the
disk is as it was (the before/after listing of test_folder_safety.snapshot).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_bad_input import attnlab, error_line  # noqa: F401  (attnlab: a fixture)
from test_folder_safety import snapshot


@pytest.mark.parametrize(
    ("kind", "fields", "expected"),
    [("gpt2", {"n_ctx": 64},
      "n_ctx 64 and n_positions 32 disagree; attnlab's GPT-2 backbone has one context length "
      "(set both to it)"),
     ("llama", {"sliding_window": 8},
      "sliding_window 8 (of max_position_embeddings 32); attnlab's Llama backbone attends to "
      "the whole context")],
)  # fmt: skip
def test_import_hf_refuses_a_context_it_would_change(
    attnlab,  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    kind: str,
    fields: dict,
    expected: str,
):
    import json

    from test_import_hf import hf_model

    src = tmp_path / "hf"
    hf_model(kind).save_pretrained(src)
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, **fields}))
    capsys.readouterr()  # transformers' own progress bars while saving
    before = snapshot(tmp_path)
    p = attnlab("import-hf", str(src), "--out", str(tmp_path / "mine"))
    assert error_line(p, "import-hf") == f"{src / 'config.json'}: {expected}"
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(
    "fields",
    [{"model_type": "gpt2", "vocab_size": 8, "n_positions": 32, "n_ctx": 32},
     {"model_type": "llama", "vocab_size": 8, "hidden_size": 32, "intermediate_size": 64,
      "num_hidden_layers": 1, "num_attention_heads": 4, "max_position_embeddings": 32,
      "sliding_window": 32},  # as long as the context: the same attention
     {"model_type": "llama", "vocab_size": 8, "hidden_size": 32, "intermediate_size": 64,
      "num_hidden_layers": 1, "num_attention_heads": 4, "max_position_embeddings": 32,
      "sliding_window": 8, "use_sliding_window": False}],
)  # fmt: skip
def test_import_hf_reads_a_context_that_means_the_same(fields: dict):
    from attnlab.model.hf_map import config_from_hf

    assert config_from_hf(fields).block_size == 32


def test_import_hf_refuses_a_broken_tokenizer_json(
    attnlab,  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
):
    from test_import_hf import hf_model

    src = tmp_path / "hf"
    hf_model("gpt2").save_pretrained(src)
    (src / "tokenizer.json").write_text('{"model": ')
    capsys.readouterr()
    before = snapshot(tmp_path)
    p = attnlab("import-hf", str(src), "--out", str(tmp_path / "mine"))
    line = error_line(p, "import-hf")
    assert line.startswith(f"{src / 'tokenizer.json'}: not a valid tokenizer.json (")
    assert line.endswith("); repair it, or move it away to import the model without a tokenizer")
    assert snapshot(tmp_path) == before
