"""`attnlab train --init-from` and import-hf on the folders Hugging Face tools leave behind: an
attnlab export, and one that transformers loaded, changed and saved again (sharded)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import tiny_model
from test_bad_input import attnlab, error_line  # noqa: F401  (a fixture and a helper)

from attnlab import from_pretrained
from attnlab.data.prepare import load_dataset
from attnlab.errors import AttnlabError
from attnlab.export import export_model
from attnlab.export.hf import EOT, import_hf
from attnlab.model.gpt import GPT
from attnlab.train import checkpoint as ckpt

transformers = pytest.importorskip("transformers")

# one step at a learning rate too small to move a weight by 1e-5: the run's weights are the start's
QUICK = [
    "max_iters=1",
    "batch_size=2",
    "eval_interval=1",
    "eval_iters=1",
    "learning_rate=1e-9",
    "min_lr=0",
    "warmup_iters=0",
    "device=cpu",
    "tensorboard=false",
]


def exported(tiny_data: Path, root: Path, **overrides) -> tuple[GPT, Path]:
    """A tiny model on the tiny data's tokenizer, exported (rows grown for <|endoftext|>)."""
    tok = load_dataset(tiny_data).tokenizer
    torch.manual_seed(0)
    model = GPT(tiny_model(vocab_size=tok.vocab_size, **overrides)).eval()
    export_model(model, tok, root / "export", ["safetensors"])
    return model, root / "export"


def tuned_by_transformers(export: Path, out: Path) -> torch.Tensor:
    """Load ``export`` in transformers, change one weight as training would, save it sharded;
    returns the new embedding."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(export, trust_remote_code=True)
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(1.5)
    model.save_pretrained(out, max_shard_size="40KB")
    AutoTokenizer.from_pretrained(export, trust_remote_code=True).save_pretrained(out)
    assert (out / "model.safetensors.index.json").is_file() and not (out / ckpt.WEIGHTS).exists()
    return model.get_input_embeddings().weight.detach().clone()


def assert_weights_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert sorted(a) == sorted(b)
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=1e-5, rtol=0, msg=name)


@pytest.mark.parametrize("kind", ["remote", "gpt2"])
def test_train_init_from_an_export_tuned_by_transformers(
    attnlab,  # noqa: F811
    tiny_data: Path,
    tmp_path: Path,
    kind: str,
) -> None:
    overrides = {"twicing": True} if kind == "remote" else {}
    model, export = exported(tiny_data, tmp_path, **overrides)
    tuned = tmp_path / "tuned"
    wte = tuned_by_transformers(export, tuned)
    run = tmp_path / "run"
    p = attnlab(
        "train", "--init-from", str(tuned), "--data", str(tiny_data), "--out", str(run), *QUICK
    )
    assert p.returncode == 0, p.stderr
    assert f"initialised from {tuned}" in p.stderr
    trained, tok = from_pretrained(run / "latest")
    start = ckpt.model_state_dict(model)
    start["transformer.wte.weight"] = wte
    assert_weights_equal(ckpt.model_state_dict(trained), start)
    assert trained.config == model.config.replace(vocab_size=len(wte))
    assert tok.token_to_id(EOT) == load_dataset(tiny_data).tokenizer.vocab_size  # the folder's


def test_train_init_from_a_run_keeps_its_weights_and_refuses_model_changes(
    attnlab,  # noqa: F811
    tiny_data: Path,
    tmp_path: Path,
) -> None:
    model, export = exported(tiny_data, tmp_path)
    run = tmp_path / "run"
    args = ["train", "--init-from", str(export), "--data", str(tiny_data), "--out", str(run)]
    assert attnlab(*args, *QUICK).returncode == 0
    trained = from_pretrained(run / "latest")[0]
    grown = ckpt.model_state_dict(model)
    grown["transformer.wte.weight"] = torch.cat(
        [grown["transformer.wte.weight"], torch.zeros(2, 32)]
    )
    assert_weights_equal(ckpt.model_state_dict(trained), grown)
    # and a run folder, in turn
    again = attnlab(
        "train",
        "--init-from",
        str(run),
        "--data",
        str(tiny_data),
        "--out",
        str(tmp_path / "r2"),
        *QUICK,
    )
    assert again.returncode == 0, again.stderr
    p = attnlab(*args[:-1], str(tmp_path / "r3"), "n_layer=3", *QUICK)
    assert error_line(p, "train") == (
        "train --init-from keeps the pretrained model as it is: n_layer=3 (pretrained: 2); only "
        "dropout (and block_size with pos=rope) may change"
    )
    p = attnlab("train", "--init-from", str(export), "--resume", str(run))
    assert (
        error_line(p, "train") == "--init-from starts a new run; it does not combine with --resume"
    )


def test_train_init_from_refuses_data_of_another_tokenizer(
    attnlab,  # noqa: F811
    tiny_data: Path,
    tmp_path: Path,
) -> None:
    from attnlab.data.prepare import prepare

    _, export = exported(tiny_data, tmp_path)
    (tmp_path / "other.txt").write_text("zyx wvu\n" * 400)
    other = prepare(sources=[str(tmp_path / "other.txt")], out=tmp_path / "other")
    p = attnlab(
        "train",
        "--init-from",
        str(export),
        "--data",
        str(other),
        "--out",
        str(tmp_path / "r"),
        *QUICK,
    )
    assert "has another tokenizer than" in error_line(p, "train")
    assert not (tmp_path / "r").exists()


def test_import_hf_reads_a_sharded_remote_code_folder(tiny_data: Path, tmp_path: Path) -> None:
    model, export = exported(tiny_data, tmp_path, twicing=True)
    tuned = tmp_path / "tuned"
    wte = tuned_by_transformers(export, tuned)
    _, out, kind = import_hf(tuned, tmp_path / "imported")
    assert kind == "char"
    start = ckpt.model_state_dict(model)
    start["transformer.wte.weight"] = wte
    assert_weights_equal(ckpt.model_state_dict(from_pretrained(out)[0]), start)
    # a shard the index names but the folder lacks: one line
    index = json.loads((tuned / "model.safetensors.index.json").read_text())
    (tuned / sorted(set(index["weight_map"].values()))[0]).unlink()
    with pytest.raises(AttnlabError, match="which is not a file beside it"):
        import_hf(tuned, tmp_path / "again")
