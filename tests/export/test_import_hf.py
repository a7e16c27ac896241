"""`attnlab import-hf`: tiny random GPT-2 and Llama models made by transformers itself, no download."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from test_export import failed_line
from test_folder_safety import snapshot
from tokenizers import decoders

from attnlab import from_pretrained
from attnlab.cli import main as cli_main
from attnlab.data.tokenizer import Tokenizer

transformers = pytest.importorskip("transformers")

GPT2 = dict(
    vocab_size=320,
    n_positions=32,
    n_embd=32,
    n_layer=2,
    n_head=4,
    activation_function="gelu",
    bos_token_id=0,
    eos_token_id=0,  # GPT-2's 50256 lies outside this vocabulary: a warning
)
LLAMA = dict(
    vocab_size=320,  # room for the byte-level tokenizer below
    hidden_size=32,
    intermediate_size=80,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=32,
)


def hf_model(kind: str, **overrides) -> torch.nn.Module:
    """A random transformers model with weights large enough that logits differ visibly."""
    torch.manual_seed(0)
    if kind == "gpt2":
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**{**GPT2, **overrides}))
    else:
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**LLAMA, **overrides}))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    return model.eval()


@pytest.mark.parametrize(
    ("kind", "overrides", "safe"),
    [
        ("gpt2", {}, True),
        (
            "gpt2",
            dict(activation_function="gelu_new", tie_word_embeddings=False),
            True,
        ),  # GPT-2's own
        ("llama", {}, True),
        ("llama", dict(tie_word_embeddings=True, attention_bias=True, mlp_bias=True), False),
    ],
)
def test_import_hf_logits_equal(
    tmp_path: Path, capsys, kind: str, overrides: dict, safe: bool
) -> None:
    model = hf_model(kind, **overrides)
    model.save_pretrained(tmp_path / "hf")
    # a byte-level BPE tokenizer (GPT-2's kind) comes along; a Metaspace one (Llama's) does not
    tok = Tokenizer.train_byte_bpe("to be or not to be, that is the question\n" * 20, 300)
    if kind == "llama":
        tok.hf.decoder = decoders.Metaspace()
    tok.save(tmp_path / "hf" / "tokenizer.json")
    if not safe:  # the older format: a pickled state_dict (read with weights_only=True)
        from safetensors.torch import load_file

        weights = tmp_path / "hf" / "model.safetensors"
        torch.save(load_file(weights), tmp_path / "hf" / "pytorch_model.bin")
        weights.unlink()
    assert cli_main(["import-hf", str(tmp_path / "hf"), "--out", str(tmp_path / "mine")]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith(f"import-hf: {'GPT-2' if kind == 'gpt2' else 'Llama'}")
    kept = kind == "gpt2"
    assert ("bytebpe tokenizer" in printed) == kept and ("no tokenizer" in printed) != kept
    ours, ours_tok = from_pretrained(tmp_path / "mine")
    assert (ours_tok is not None) == kept
    x = torch.randint(0, 64, (3, 17), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model(x).logits.numpy()
        got = ours(x, all_logits=True)[0].numpy()
    assert ref.std() > 0.1
    np.testing.assert_allclose(got, ref, atol=1e-5, rtol=0)
    assert json.loads((tmp_path / "mine" / "config.json").read_text())["n_layer"] == 2


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"model_type": "bert"}, "model_type 'bert'; import-hf reads gpt2 and llama folders"),
        (
            {"model_type": "gpt2", "vocab_size": 64, "activation_function": "relu"},
            "activation_function 'relu'; attnlab's GPT-2 backbone has 'gelu', 'gelu_new'",
        ),
        (None, "has no config.json"),
        ([{"model_type": "gpt2"}], "config.json is not a JSON object; expected a Hugging Face"),
        ({"model_type": "llama", "hidden_size": 32}, "config.json: num_attention_heads is missing"),
        ({"model_type": "llama", **GPT2}, "config.json: hidden_size is missing"),
        ({"model_type": "gpt2", **GPT2, "n_embd": "32"}, "n_embd must be an integer, not '32'"),
        ({"model_type": "gpt2", **GPT2, "n_layer": 2.5}, "n_layer must be an integer, not 2.5"),
        (
            {"model_type": "llama", **LLAMA, "rope_scaling": "linear"},
            "config.json: rope_scaling must be an object, not 'linear'",
        ),
        # GPT-2 options that change its arithmetic were imported as if absent
        *(
            (
                {"model_type": "gpt2", **GPT2, name: value},
                f"{name}={json.dumps(value)}; attnlab's GPT-2 backbone computes "
                f"{name}={json.dumps(not value)}",
            )
            for name, value in [
                ("scale_attn_weights", False),
                ("scale_attn_by_inverse_layer_idx", True),
                ("add_cross_attention", True),
            ]
        ),
    ],
)
def test_import_hf_refuses_what_it_cannot_convert(
    tmp_path: Path, capsys, config: dict | list | None, message: str
) -> None:
    src = tmp_path / "hf"
    src.mkdir()
    if config is not None:
        (src / "config.json").write_text(json.dumps(config))
    before = sorted(p.name for p in tmp_path.rglob("*"))
    assert cli_main(["import-hf", str(src), "--out", str(tmp_path / "mine")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


# Llama 3.1's rope_scaling as its config.json ships it
LLAMA3_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


LINEAR = {"type": "linear", "factor": 2.0}
HAS = "attnlab's Llama backbone has"


@pytest.mark.parametrize(
    ("overrides", "raw", "message"),
    [
        # transformers writes these into rope_parameters (5.x) or rope_scaling (4.x)
        (dict(rope_scaling=LLAMA3_SCALING), False, f"rope type 'llama3'; {HAS} plain RoPE"),
        (dict(rope_scaling={"rope_type": "linear", "factor": 2.0}), False,
         f"rope type 'linear'; {HAS} plain RoPE"),
        # a config.json as shipped, whatever transformers would rewrite it to
        (dict(rope_scaling=LLAMA3_SCALING), True, f"rope type 'llama3'; {HAS} plain RoPE"),
        (dict(rope_scaling=LINEAR), True, f"rope type 'linear'; {HAS} plain RoPE"),
        (dict(hidden_act="gelu"), True, f"hidden_act 'gelu'; {HAS} SwiGLU (silu)"),
        (dict(hidden_act="gelu", rope_scaling=LINEAR), True,
         f"hidden_act 'gelu', rope type 'linear'; {HAS} SwiGLU (silu) and plain RoPE"),
    ],
)  # fmt: skip
def test_import_hf_names_only_what_the_llama_backbone_lacks(
    tmp_path: Path, capsys, overrides: dict, raw: bool, message: str
) -> None:
    """A scaled RoPE was refused with the accepted hidden_act 'silu' named beside it."""
    src = tmp_path / "hf"
    if raw:
        src.mkdir()
        (src / "config.json").write_text(json.dumps({"model_type": "llama", **LLAMA, **overrides}))
    else:
        transformers.LlamaConfig(**{**LLAMA, **overrides}).save_pretrained(src)
    before = snapshot(tmp_path)
    status = cli_main(["import-hf", str(src), "--out", str(tmp_path / "mine")])
    assert failed_line(capsys, status, "import-hf") == f"{src / 'config.json'}: {message}"
    assert snapshot(tmp_path) == before


def tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


@pytest.mark.parametrize("case", ["source", "inside", "hf-folder", "extra-file", "subfolder"])
def test_import_hf_never_replaces_what_it_did_not_write(tmp_path: Path, capsys, case: str) -> None:
    """A folder with config.json + model.safetensors counted as an import's own output: a
    Hugging Face folder, an import with a README beside it, or import-hf's own source were
    replaced whole, without --overwrite."""
    src = tmp_path / "hf"
    hf_model("gpt2").save_pretrained(src)
    mine = tmp_path / "mine"
    assert cli_main(["import-hf", str(src), "--out", str(mine)]) == 0
    out, extra = {
        "source": (src, []),
        "inside": (tmp_path, ["--overwrite"]),  # --overwrite or not: the source is in there
        "hf-folder": (tmp_path / "hf2", []),
        "extra-file": (mine, []),
        "subfolder": (mine, []),
    }[case]
    if case == "hf-folder":
        shutil.copytree(src, out)
    elif case == "extra-file":
        (mine / "README.md").write_text("my notes")
    elif case == "subfolder":
        (mine / "eval").mkdir()
        (mine / "eval" / "scores.csv").write_text("1,2")
    before = tree(tmp_path)
    capsys.readouterr()
    assert cli_main(["import-hf", str(src), "--out", str(out), *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    if case in ("source", "inside"):
        expected = f"--out {out} would replace the source {src}; choose another --out"
    elif case == "hf-folder":
        expected = (
            f"{out} is not empty and is not a model folder written by import-hf; pass "
            "--overwrite to replace it, or choose another --out"
        )
    else:  # its own output, with something else beside: named (its manifest: attnlab.fsutil)
        expected = (
            f"{out} holds {'README.md' if case == 'extra-file' else 'eval/'}, which attnlab did "
            "not write there; move them out, or pass --overwrite to delete them with the model "
            "folder written by import-hf"
        )
    assert err == [f"attnlab import-hf: error: {expected}"]
    assert tree(tmp_path) == before
    # its own earlier output is still replaced without --overwrite
    if case == "hf-folder":
        assert cli_main(["import-hf", str(src), "--out", str(mine)]) == 0
        assert sorted(p.name for p in mine.iterdir()) == [
            ".attnlab-manifest.json",  # what import-hf wrote (attnlab.fsutil)
            "config.json",
            "model.safetensors",
        ]


def test_import_hf_names_the_source_when_a_weight_is_missing(tmp_path: Path, capsys) -> None:
    """The strict load ran on the temporary output, so the error named `.mine.tmp-PID`."""
    from safetensors.torch import load_file, save_file

    src = tmp_path / "hf"
    hf_model("gpt2").save_pretrained(src)
    sd = load_file(src / "model.safetensors")
    del sd["transformer.ln_f.bias"]
    save_file(sd, src / "model.safetensors", metadata={"format": "pt"})
    before = tree(tmp_path)
    capsys.readouterr()  # transformers' progress bars
    assert cli_main(["import-hf", str(src), "--out", str(tmp_path / "mine")]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"attnlab import-hf: error: {src} does not fit the model: missing keys: "
        "transformer.ln_f.bias"
    ]
    assert tree(tmp_path) == before


def test_import_hf_refuses_an_out_holding_what_the_source_links_to(tmp_path: Path, capsys) -> None:
    """Hugging Face's cache keeps a snapshot as symlinks into a blobs folder: --out blobs
    --overwrite replaced the blobs, leaving the snapshot's links dangling."""
    hf_model("gpt2").save_pretrained(tmp_path / "hf")
    blobs, snapshot = tmp_path / "cache" / "blobs", tmp_path / "cache" / "snapshot"
    blobs.mkdir(parents=True)
    snapshot.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(tmp_path / "hf" / name, blobs / f"blob-{name}")
        (snapshot / name).symlink_to(f"../blobs/blob-{name}")
    before = tree(tmp_path)
    capsys.readouterr()
    assert cli_main(["import-hf", str(snapshot), "--out", str(blobs), "--overwrite"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"attnlab import-hf: error: --out {blobs} would replace the source {snapshot}; "
        "choose another --out"
    ]
    assert tree(tmp_path) == before


@pytest.mark.parametrize("case", ["tied-but-different", "tokenizer-too-large"])
def test_import_hf_refuses_a_folder_that_contradicts_itself(
    tmp_path: Path, capsys, case: str
) -> None:
    """A config that ties the output layer to the embedding while the file holds another
    lm_head imported as a different model (attnlab tied them); a tokenizer with more tokens
    than the model has ids imported, and every later command refused the folder."""
    src = tmp_path / "hf"
    if case == "tied-but-different":
        hf_model("llama").save_pretrained(src)  # untied: lm_head differs from embed_tokens
        config = json.loads((src / "config.json").read_text())
        (src / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": True}))
        expected = (
            f"{src}: the config ties the output layer to the embedding (tie_embeddings / "
            "tie_word_embeddings), but its lm_head.weight differs from it"
        )
    else:
        hf_model("gpt2", vocab_size=64).save_pretrained(src)
        tokenizer = Tokenizer.train_byte_bpe("to be or not to be, that is the question\n" * 20, 300)
        tokenizer.save(src / "tokenizer.json")
        expected = (
            f"{src / 'tokenizer.json'}: {tokenizer.vocab_size:,} tokens, more than the model's "
            "vocab_size=64"
        )
    before = tree(tmp_path)
    capsys.readouterr()
    assert cli_main(["import-hf", str(src), "--out", str(tmp_path / "mine")]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"attnlab import-hf: error: {expected}"]
    assert tree(tmp_path) == before


def test_a_gpt2_export_of_a_bias_free_model_reads_back_bias_free(tmp_path: Path, capsys) -> None:
    """GPT-2 has no bias=False: the export's zero biases read back as bias=True, a model with
    other parameters whose fine-tunes trained biases the source never had."""
    from attnlab.config import ModelConfig
    from attnlab.export import export_model
    from attnlab.model import GPT

    torch.manual_seed(0)
    config = ModelConfig(block_size=32, vocab_size=64, n_layer=2, n_head=4, n_embd=32, bias=False)
    source = GPT(config).eval()
    export_model(source, None, tmp_path / "export", ["safetensors"])
    assert json.loads((tmp_path / "export" / "config.json").read_text())["attnlab_bias"] is False
    idx = torch.randint(0, 64, (1, 16), generator=torch.Generator().manual_seed(0))
    capsys.readouterr()
    assert cli_main(["import-hf", str(tmp_path / "export"), "--out", str(tmp_path / "back")]) == 0
    for folder in ("export", "back"):
        model, _ = from_pretrained(tmp_path / folder)
        assert model.config == config
        assert model.get_num_params() == source.get_num_params()
        torch.testing.assert_close(model(idx)[0], source(idx)[0], rtol=0, atol=0)
    # trained in transformers since: its biases are weights now, and never dropped silently
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "export").eval()
    with torch.no_grad():
        hf.transformer.h[1].mlp.c_fc.bias.fill_(0.5)
    hf.save_pretrained(tmp_path / "tuned")
    before = tree(tmp_path)
    capsys.readouterr()
    assert cli_main(["import-hf", str(tmp_path / "tuned"), "--out", str(tmp_path / "x")]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"attnlab import-hf: error: {tmp_path / 'tuned' / 'config.json'}: attnlab_bias is false "
        "but transformer.h.1.mlp.c_fc.bias is not zero (trained since the export?); delete "
        "attnlab_bias from it to load the biases"
    ]
    assert tree(tmp_path) == before
    data = json.loads((tmp_path / "tuned" / "config.json").read_text())
    del data["attnlab_bias"]
    (tmp_path / "tuned" / "config.json").write_text(json.dumps(data))
    assert cli_main(["import-hf", str(tmp_path / "tuned"), "--out", str(tmp_path / "x")]) == 0
    model, _ = from_pretrained(tmp_path / "x")
    assert model.config.bias is True
    with torch.no_grad():
        torch.testing.assert_close(model(idx)[0], hf(idx).logits[:, -1:], rtol=1e-5, atol=1e-5)


def test_import_hf_of_an_attnlab_model_folder_says_it_needs_none(tmp_path: Path, capsys) -> None:
    """It said "model_type None; import-hf reads gpt2 and llama folders"."""
    from conftest import tiny_model

    from attnlab.model import GPT
    from attnlab.train.checkpoint import save_checkpoint

    folder = save_checkpoint(tmp_path / "model", GPT(tiny_model()), None)
    before = snapshot(tmp_path)
    assert cli_main(["import-hf", str(folder), "--out", str(tmp_path / "mine")]) == 2
    assert capsys.readouterr().err == (
        f"attnlab import-hf: error: {folder} is an attnlab model folder already: every command "
        "reads it as it is (import-hf converts Hugging Face gpt2 and llama folders)\n"
    )
    assert snapshot(tmp_path) == before
