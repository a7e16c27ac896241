"""nanoGPT import: a train.py checkpoint built here with nanoGPT's layout becomes an attnlab folder."""

from __future__ import annotations

import argparse
import io
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import tiny_model

from attnlab import from_pretrained
from attnlab.cli import main as cli_main
from attnlab.errors import AttnlabError
from attnlab.model import GPT
from attnlab.train.nanogpt import import_nanogpt, nanogpt_weights, read_meta

CHARS = sorted(set("First Citizen:\nBefore we proceed any further, hear me speak.\n!?;'-&$3"))


def nanogpt_checkpoint(path: Path, compiled: bool = True, mask_buffers: bool = True) -> GPT:
    """Write ``path`` the way nanoGPT's train.py does; returns the model whose weights it holds.

    With bias=True and nanoGPT's components our state_dict keys are nanoGPT's own; torch.compile
    adds ``_orig_mod.``; without flash attention nanoGPT also keeps the causal mask ``attn.bias``.
    """
    model_args = dict(
        n_layer=2, n_head=4, n_embd=32, block_size=32, bias=True, vocab_size=len(CHARS), dropout=0.0
    )
    torch.manual_seed(3)
    model = GPT(tiny_model(**model_args))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)  # away from the init, so a misplaced tensor changes the logits
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)  # its state is saved too
    model(torch.zeros(1, 4, dtype=torch.long), torch.zeros(1, 4, dtype=torch.long))[1].backward()
    optimizer.step()
    sd = dict(model.state_dict())  # wte and lm_head: one tensor under two names, as nanoGPT saves
    if mask_buffers:
        for i in range(2):
            sd[f"transformer.h.{i}.attn.bias"] = torch.tril(torch.ones(32, 32)).view(1, 1, 32, 32)
    if compiled:
        sd = {f"_orig_mod.{k}": v for k, v in sd.items()}
    torch.save(
        {
            "model": sd,
            "optimizer": optimizer.state_dict(),
            "model_args": model_args,
            "iter_num": 250,
            "best_val_loss": torch.tensor(1.4697),
            "config": {
                "dataset": "shakespeare_char",
                "compile": compiled,
                "learning_rate": 1e-3,
                "dtype": "bfloat16",
            },
        },
        path,
    )
    return model.eval()


def write_meta(path: Path) -> None:
    stoi = {c: i for i, c in enumerate(CHARS)}
    path.write_bytes(
        pickle.dumps({"vocab_size": len(CHARS), "itos": dict(enumerate(CHARS)), "stoi": stoi})
    )


def logits(model: GPT, x: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        return model(x, all_logits=True)[0].numpy()


def test_import_cli_round_trip(tmp_path: Path, capsys) -> None:
    model = nanogpt_checkpoint(tmp_path / "ckpt.pt")
    write_meta(tmp_path / "meta.pkl")
    assert (
        cli_main(
            [
                "import-nanogpt",
                str(tmp_path / "ckpt.pt"),
                "--meta",
                str(tmp_path / "meta.pkl"),
                "--out",
                str(tmp_path / "out"),
            ]
        )
        == 0
    )
    assert f"vocab {len(CHARS)}" in capsys.readouterr().out
    loaded, tok = from_pretrained(tmp_path / "out")
    x = torch.randint(0, len(CHARS), (3, 32), generator=torch.Generator().manual_seed(0))
    np.testing.assert_array_equal(logits(loaded, x), logits(model, x))
    assert loaded.config.tie_embeddings and loaded.lm_head.weight is loaded.transformer.wte.weight
    assert tok.encode("hear me") == [CHARS.index(c) for c in "hear me"]
    assert tok.decode(tok.encode("First Citizen:\n")) == "First Citizen:\n"


def test_import_without_meta_or_prefix(tmp_path: Path) -> None:
    model = nanogpt_checkpoint(tmp_path / "ckpt.pt", compiled=False, mask_buffers=False)
    imported, tok = import_nanogpt(tmp_path / "ckpt.pt", tmp_path / "out")
    assert tok is None and not (tmp_path / "out" / "tokenizer.json").exists()
    x = torch.randint(0, len(CHARS), (2, 9), generator=torch.Generator().manual_seed(1))
    np.testing.assert_array_equal(logits(imported, x), logits(model, x))
    np.testing.assert_array_equal(logits(from_pretrained(tmp_path / "out")[0], x), logits(model, x))


def test_untied_head_is_kept() -> None:
    wte = torch.randn(5, 4)
    sd, tied = nanogpt_weights(
        {
            "_orig_mod.transformer.wte.weight": wte,
            "_orig_mod.lm_head.weight": wte + 1,
            "_orig_mod.transformer.h.0.attn.bias": torch.ones(1, 1, 2, 2),
            "_orig_mod.transformer.h.0.attn.c_attn.bias": torch.zeros(12),
        }
    )
    assert not tied
    assert sorted(sd) == [
        "lm_head.weight",
        "transformer.h.0.attn.c_attn.bias",
        "transformer.wte.weight",
    ]
    assert nanogpt_weights({"transformer.wte.weight": wte, "lm_head.weight": wte.clone()})[1]


def test_wrong_shape_names_the_keys(tmp_path: Path) -> None:
    nanogpt_checkpoint(tmp_path / "ckpt.pt")
    saved = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    saved["model_args"]["n_layer"] = 3
    torch.save(saved, tmp_path / "three.pt")
    with pytest.raises(AttnlabError, match=r"missing keys: transformer\.h\.2\.attn\.c_attn\.bias"):
        import_nanogpt(tmp_path / "three.pt", tmp_path / "out")
    torch.save({"state_dict": saved["model"]}, tmp_path / "other.pt")
    with pytest.raises(AttnlabError, match="not a nanoGPT checkpoint"):
        import_nanogpt(tmp_path / "other.pt", tmp_path / "out")


def test_checkpoint_with_objects_is_refused(tmp_path: Path, capsys) -> None:
    nanogpt_checkpoint(tmp_path / "ckpt.pt")
    saved = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    saved["config"]["args"] = argparse.Namespace(
        lr=1.0
    )  # an arbitrary class: weights_only refuses it
    torch.save(saved, tmp_path / "ckpt.pt")
    assert (
        cli_main(["import-nanogpt", str(tmp_path / "ckpt.pt"), "--out", str(tmp_path / "out")]) == 2
    )
    err = capsys.readouterr().err
    assert "refused: it is not a plain weights file" in err and len(err.strip().splitlines()) == 1


def test_a_meta_pkl_error_with_a_line_break_is_one_line(tmp_path: Path, capsys) -> None:
    """pickle's "A load persistent id instruction was encountered,\nbut no persistent_load ..."
    reached the terminal as two lines: the CLI joins an error's lines."""

    class PersistentIds(pickle.Pickler):
        def persistent_id(self, obj: object) -> str | None:
            return "storage" if obj == "tensor" else None

    nanogpt_checkpoint(tmp_path / "ckpt.pt")
    buffer = io.BytesIO()
    PersistentIds(buffer).dump({"itos": "tensor"})
    (tmp_path / "meta.pkl").write_bytes(buffer.getvalue())
    args = ["import-nanogpt", str(tmp_path / "ckpt.pt"), "--meta", str(tmp_path / "meta.pkl")]
    assert cli_main([*args, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].endswith(
        "refused: not a plain char meta.pkl (A load persistent id instruction was encountered, "
        "but no persistent_load function was specified.)"
    )
    assert not (tmp_path / "out").exists()


class _Payload:
    """Unpickling this calls os.mkdir: proof that a pickle ran code."""

    def __init__(self, target: str) -> None:
        self.target = target

    def __reduce__(self):
        return os.mkdir, (self.target,)


def test_meta_pickle_cannot_run_code(tmp_path: Path) -> None:
    target = tmp_path / "pwned"
    evil = {
        "vocab_size": 2,
        "itos": {0: "a", 1: "b"},
        "stoi": {"a": 0, "b": 1},
        "x": _Payload(str(target)),
    }
    (tmp_path / "meta.pkl").write_bytes(pickle.dumps(evil))
    with pytest.raises(
        AttnlabError,
        match=r"refused: not a plain char meta\.pkl \(global \w+\.mkdir is not allowed",
    ):
        read_meta(tmp_path / "meta.pkl")
    assert not target.exists()
    (tmp_path / "bad.pkl").write_bytes(pickle.dumps({"vocab_size": 3, "itos": {0: "a", 1: "b"}}))
    with pytest.raises(AttnlabError, match="vocab_size=3 but itos has 2"):
        read_meta(tmp_path / "bad.pkl")


ITOS_ERROR = "{path}: expected a dict with 'itos' mapping ids 0..n-1 to characters"


@pytest.mark.parametrize(
    ("meta", "expected"),
    [
        ({"itos": {0: "a", "1": "b"}}, ITOS_ERROR),  # keys of two types: not sortable
        ({"itos": {0: "a", 2: "b"}}, ITOS_ERROR),
        ({"itos": ["a", "b"]}, ITOS_ERROR),
        ([1, 2], ITOS_ERROR),
        ({"itos": {0: "a", 1: "b"}, "stoi": ["a", "b"]}, "{path}: stoi and itos disagree"),
        ({"itos": {0: "a", 1: "b"}, "stoi": {"a": 1, "b": 0}}, "{path}: stoi and itos disagree"),
        ({"itos": {0: "a", 1: "bc"}}, "{path}: char vocabulary must be distinct single characters"),
        ({"itos": {0: "a", 1: 7}}, "{path}: char vocabulary must be distinct single characters"),
        ({"itos": {0: "a", 1: "a"}}, "{path}: char vocabulary must be distinct single characters"),
        (  # a TypeError from the tokenizers library
            {"itos": {0: "a", 1: "\ud800"}},
            "{path}: char vocabulary holds U+D800, a lone surrogate UTF-8 cannot encode",
        ),
    ],
)
def test_odd_meta_pkl_gets_one_line(tmp_path: Path, meta, expected) -> None:
    path = tmp_path / "meta.pkl"
    path.write_bytes(pickle.dumps(meta))
    with pytest.raises(AttnlabError) as err:
        read_meta(path)
    assert str(err.value) == expected.format(path=path)


@pytest.mark.parametrize(
    ("model", "odd"),
    [({"transformer.wte.weight": 3}, "'transformer.wte.weight'"),
     ({"lm_head.weight": [1.0], 7: torch.zeros(1)}, "'lm_head.weight', 7")],
)  # fmt: skip
def test_ckpt_holding_non_tensors_gets_one_line(tmp_path: Path, model, odd) -> None:
    path = tmp_path / "ckpt.pt"
    torch.save({"model": model, "model_args": {"n_layer": 1}}, path)
    with pytest.raises(AttnlabError) as err:
        import_nanogpt(path, tmp_path / "out")
    assert str(err.value) == f"{path}: 'model' must map parameter names to tensors; not: {odd}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt"]


@pytest.mark.parametrize(
    ("make", "expected"),
    [(lambda d: d / "missing.pt", "{path} does not exist"),
     (lambda d: d, "{path} is a folder, not a weights file")],
)  # fmt: skip
def test_a_ckpt_path_that_is_no_file_gets_one_line(tmp_path: Path, make, expected) -> None:
    path = make(tmp_path)
    with pytest.raises(AttnlabError) as err:
        import_nanogpt(path, tmp_path / "out")
    assert str(err.value) == expected.format(path=path)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("case", ["missing-meta", "short-meta", "empty-ckpt"])
def test_import_nanogpt_odd_inputs_get_one_line(tmp_path: Path, case: str) -> None:
    """A missing meta.pkl and an empty ckpt.pt were tracebacks; a meta.pkl of another dataset
    (fewer characters than the model's ids) imported, and sampling died mid-stream."""
    ckpt = tmp_path / "ckpt.pt"
    meta = tmp_path / "meta.pkl"
    if case == "empty-ckpt":
        ckpt.write_bytes(b"")
        expected = f"{ckpt} is truncated or corrupted (EOFError: empty file?)"
    else:
        nanogpt_checkpoint(ckpt)
        if case == "short-meta":
            itos = dict(enumerate("abcdefghij"))
            meta.write_bytes(pickle.dumps({"itos": itos, "stoi": {c: i for i, c in itos.items()}}))
            expected = (
                f"{meta} has 10 characters, the model {len(CHARS)} ids: not this checkpoint's "
                "meta.pkl"
            )
        else:
            expected = f"{meta}: No such file or directory"
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(AttnlabError) as err:
        import_nanogpt(ckpt, tmp_path / "out", meta=None if case == "empty-ckpt" else meta)
    assert str(err.value) == expected
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_a_ckpt_with_nan_weights_is_refused(tmp_path: Path) -> None:
    """It imported, and then no command could load the folder it wrote."""
    nanogpt_checkpoint(tmp_path / "ckpt.pt")
    saved = torch.load(tmp_path / "ckpt.pt", weights_only=True)
    saved["model"]["_orig_mod.transformer.h.1.mlp.c_fc.weight"][0, 0] = float("nan")
    torch.save(saved, tmp_path / "nan.pt")
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(AttnlabError) as err:
        import_nanogpt(tmp_path / "nan.pt", tmp_path / "out")
    assert str(err.value) == (
        f"{tmp_path / 'nan.pt'}: tensor _orig_mod.transformer.h.1.mlp.c_fc.weight holds NaN or "
        "infinite values"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_eval_of_a_folder_without_a_tokenizer_says_what_it_cannot_check(
    tmp_path: Path, capsys
) -> None:
    """Without meta.pkl the folder has no tokenizer: eval checked only that the data's ids fit,
    and scored another vocabulary's ids without a word."""
    from attnlab.data.prepare import prepare

    nanogpt_checkpoint(tmp_path / "ckpt.pt")
    import_nanogpt(tmp_path / "ckpt.pt", tmp_path / "model")
    (tmp_path / "corpus.txt").write_text("".join(CHARS) * 200)
    data = prepare(sources=[str(tmp_path / "corpus.txt")], out=tmp_path / "data")
    capsys.readouterr()
    argv = ["eval", str(tmp_path / "model"), "--data", str(data), "--device", "cpu"]
    assert cli_main(argv) == 0
    out, err = capsys.readouterr()
    assert err.splitlines() == [
        f"note: {tmp_path / 'model'} has no tokenizer, so nothing checks that {data}'s token ids "
        "are the ones it was trained on"
    ]
    assert out.startswith("{")
