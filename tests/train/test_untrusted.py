"""Untrusted files: pickles that would run code are refused unrun; broken files get one clear line."""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import shlex
from pathlib import Path

import pytest
import torch
from conftest import run_cli, tiny_model

from attnlab import from_pretrained
from attnlab.data.prepare import load_dataset
from attnlab.errors import AttnlabError
from attnlab.fsutil import MANIFEST
from attnlab.model import GPT
from attnlab.train import checkpoint as ckpt
from attnlab.train.trainer import Trainer


class RunsCode:
    """Unpickling this runs ``touch MARKER``: what a malicious pytorch_model.bin does."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {shlex.quote(str(self.marker))}",)


def write_payload(path: Path, marker: Path, form: str) -> None:
    """A 'state dict' whose tensor is the payload, as a raw pickle or in torch.save's zip format."""
    obj = {"transformer.wte.weight": RunsCode(marker)}
    if form == "pickle":
        path.write_bytes(pickle.dumps(obj))
    else:
        torch.save(obj, path)


@pytest.fixture
def model_dir(tiny_data: Path, tmp_path: Path) -> Path:
    """An untrained tiny model saved as a checkpoint folder, with the tiny data's tokenizer, and
    without its manifest, as an older attnlab (or a copy of the files alone) left it: what the
    tests here tamper with is caught by the checks that hold without one. With one, the manifest
    refuses each first (test_folder_integrity)."""
    tok = load_dataset(tiny_data).tokenizer
    torch.manual_seed(0)
    model = GPT(tiny_model(vocab_size=tok.vocab_size))
    folder = ckpt.save_checkpoint(tmp_path / "model", model, tok)
    (folder / MANIFEST).unlink()
    return folder


def one_line_error(path: Path) -> str:
    with pytest.raises(AttnlabError) as err:
        from_pretrained(path)
    msg = str(err.value)
    assert "\n" not in msg
    return msg


@pytest.mark.parametrize("form", ["pickle", "torch.save"])
def test_code_running_pickle_is_refused_and_runs_nothing(model_dir: Path, tmp_path: Path, form):
    # the payload is live: an unrestricted torch.load does run it
    control = tmp_path / "control-marker"
    write_payload(tmp_path / "control.bin", control, form)
    with contextlib.suppress(RuntimeError):  # a raw pickle runs, then fails torch's magic number
        torch.load(tmp_path / "control.bin", weights_only=False)
    assert control.exists()

    marker = tmp_path / "marker"
    (model_dir / ckpt.WEIGHTS).unlink()
    write_payload(model_dir / ckpt.BIN_WEIGHTS, marker, form)
    msg = one_line_error(model_dir)
    assert msg.startswith(
        f"{model_dir / ckpt.BIN_WEIGHTS} refused: it is not a plain weights file ("
    )
    assert "weights_only" not in msg  # torch's advice to load it unsafely is not passed on
    assert not marker.exists()


def test_cli_sample_refuses_a_code_running_pickle(model_dir: Path, tmp_path: Path):
    marker = tmp_path / "marker"
    (model_dir / ckpt.WEIGHTS).unlink()
    write_payload(model_dir / ckpt.BIN_WEIGHTS, marker, "torch.save")
    p = run_cli("sample", str(model_dir), "--max-new-tokens", "2", "--device", "cpu")
    assert p.returncode == 2
    assert p.stderr.startswith(f"attnlab sample: error: {model_dir / ckpt.BIN_WEIGHTS} refused")
    assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr
    assert not marker.exists()


def test_plain_pytorch_model_bin_still_loads(model_dir: Path):
    want = ckpt.read_weights(model_dir)
    (model_dir / ckpt.WEIGHTS).unlink()
    torch.save(want, model_dir / ckpt.BIN_WEIGHTS)
    model, tok = from_pretrained(model_dir)
    assert tok is not None
    for key, value in want.items():
        assert torch.equal(model.state_dict()[key], value)


def test_code_running_trainer_state_is_refused_on_resume(train_tiny, tmp_path: Path):
    run, marker = tmp_path / "run", tmp_path / "marker"
    train_tiny(run, until=5, max_iters=10, ckpt_interval=5)
    (run / "latest" / MANIFEST).unlink()  # with it, refused unread (test_folder_integrity)
    torch.save({"optimizer": RunsCode(marker)}, run / "latest" / ckpt.TRAINER_STATE)
    with pytest.raises(AttnlabError) as err:
        Trainer.resume(run)
    path = run / "latest" / ckpt.TRAINER_STATE
    assert str(err.value).startswith(f"{path} refused: it is not a plain weights file (")
    assert not marker.exists()


def _truncated(data: bytes) -> bytes:
    return data[: len(data) // 2]


def _header_length_garbage(data: bytes) -> bytes:
    return b"\xff" * 8 + data[8:]


def _header_not_json(data: bytes) -> bytes:
    n = int.from_bytes(data[:8], "little")
    return data[:8] + b"#" * n + data[8 + n :]


@pytest.mark.parametrize(
    "damage", [_truncated, _header_length_garbage, _header_not_json, lambda d: b""]
)
def test_damaged_safetensors_gets_one_line_naming_the_file(model_dir: Path, damage):
    path = model_dir / ckpt.WEIGHTS
    path.write_bytes(damage(path.read_bytes()))
    assert one_line_error(model_dir).startswith(f"{path} is truncated or corrupted (")


def test_flipped_weight_byte_is_caught_by_the_digest(model_dir: Path):
    path = model_dir / ckpt.WEIGHTS
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x01  # one bit of the last tensor's data: still a well-formed file
    path.write_bytes(bytes(data))
    assert one_line_error(model_dir) == (
        f"{path} is corrupted: its weights do not match their sha256"
    )


def test_safetensors_without_a_digest_still_load(model_dir: Path):
    """Files from other tools have no attnlab.sha256 entry: they load, unchecked."""
    from safetensors.torch import load_file, save_file

    path = model_dir / ckpt.WEIGHTS
    want = load_file(str(path))
    save_file(want, str(path), metadata={"format": "pt"})
    model, _ = from_pretrained(model_dir)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in want.items())


def test_cli_names_a_truncated_safetensors(model_dir: Path):
    path = model_dir / ckpt.WEIGHTS
    path.write_bytes(_truncated(path.read_bytes()))
    p = run_cli("sample", str(model_dir), "--device", "cpu")
    assert p.returncode == 2
    assert p.stderr.startswith(f"attnlab sample: error: {path} is truncated or corrupted (")
    assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda c: "{not json", "cannot read config {path}: Expecting property name"),
        # not UTF-8 at all: a UnicodeDecodeError traceback in info, eval and sample
        (lambda c: b"\xff\xfe", "cannot read config {path}: 'utf-8' codec can't decode byte 0xff"),
        (lambda c: json.dumps([c]), "config {path} must hold a JSON object, not list"),
        (lambda c: json.dumps({**c, "n_layers": 2}),
         "{path}: unknown ModelConfig key 'n_layers'; did you mean 'n_layer'?"),
        (lambda c: json.dumps({**c, "n_head": 5}), "{path}: n_embd=32 must be divisible by n_head=5"),
        (lambda c: json.dumps({**c, "n_layer": "two"}),
         "{path}: n_layer='two' must be of type int"),
        (lambda c: json.dumps({**c, "n_layer": -2}), "{path}: n_layer=-2 must be > 0"),
        (lambda c: json.dumps({**c, "norm_eps": float("nan")}),
         "{path}: norm_eps=nan must be a finite number"),
        (lambda c: json.dumps({**c, "rope_theta": float("inf")}),
         "{path}: rope_theta=inf must be a finite number"),
        (lambda c: json.dumps({**c, "norm": "batchnorm"}),
         "{path}: norm='batchnorm' is not allowed; choose one of 'layernorm', 'rmsnorm'"),
    ],
)  # fmt: skip
def test_bad_config_json_gets_one_clear_line(model_dir: Path, edit, expected):
    path = model_dir / ckpt.CONFIG
    text = edit(json.loads(path.read_text()))
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    assert one_line_error(model_dir).startswith(expected.format(path=path))


@pytest.mark.parametrize(
    "damage",
    [
        lambda text: "\x00\x01 not json at all",
        lambda text: text[: len(text) // 2],
        lambda text: json.dumps({"hello": 1}),
        lambda text: text.replace('"WordLevel"', '"NoSuchModel"'),
    ],
)
def test_corrupted_tokenizer_json_gets_one_clear_line(model_dir: Path, damage):
    path = model_dir / "tokenizer.json"
    path.write_text(damage(path.read_text()))
    assert one_line_error(model_dir).startswith(f"{path}: not a valid tokenizer.json (")


class Calls:
    """Unpickling this calls ``func(*args)``."""

    def __init__(self, func, *args) -> None:
        self.func, self.args = func, args

    def __reduce__(self):
        return self.func, self.args


@pytest.mark.parametrize(
    ("payload", "name"),
    [
        (Calls(os.system, "true"), f"{os.system.__module__}.system"),
        (Calls(exec, "1"), "builtins.exec"),
        (Calls(eval, "1"), "builtins.eval"),
        (Calls(__import__, "os"), "builtins.__import__"),
    ],
)
def test_refusal_names_the_global_and_gives_no_unsafe_advice(model_dir: Path, payload, name):
    path = model_dir / ckpt.BIN_WEIGHTS
    (model_dir / ckpt.WEIGHTS).unlink()
    torch.save({"transformer.wte.weight": payload}, path)
    assert one_line_error(model_dir) == (
        f"{path} refused: it is not a plain weights file (it imports {name}, which could run code)"
    )


def _norm_eps(text: str) -> str:  # the one-bit change: 1e-05 -> 1e-01 loads silently
    return text.replace('"norm_eps": 1e-05', '"norm_eps": 0.1')


def _vocab_entry(text: str) -> str:  # two characters swap ids: same size, other text
    return text.replace('"a": ', '"a_": ').replace('"b": ', '"a": ').replace('"a_": ', '"b": ')


@pytest.mark.parametrize(
    ("name", "edit"), [("config.json", _norm_eps), ("tokenizer.json", _vocab_entry)]
)
def test_a_changed_config_or_tokenizer_is_caught_by_its_digest(model_dir: Path, name, edit):
    path = model_dir / name
    text = path.read_text()
    assert edit(text) != text
    path.write_text(edit(text))
    assert one_line_error(model_dir) == (
        f"{path} does not match the sha256 recorded in {ckpt.WEIGHTS}: one of them was edited or "
        "replaced after the model was saved"
    )


def test_weights_of_another_model_are_caught_by_the_digests(model_dir: Path, tmp_path: Path):
    """Another model's (intact) model.safetensors in the folder was reported as an edited
    config.json."""
    config = ckpt.read_model_config(model_dir).replace(dropout=0.1)  # same shapes
    other = ckpt.save_checkpoint(tmp_path / "other", GPT(config), None)
    (model_dir / ckpt.WEIGHTS).write_bytes((other / ckpt.WEIGHTS).read_bytes())
    assert one_line_error(model_dir) == (
        f"{model_dir / ckpt.CONFIG} does not match the sha256 recorded in {ckpt.WEIGHTS}: one of "
        "them was edited or replaced after the model was saved"
    )


def test_a_missing_tokenizer_is_caught_by_its_digest(model_dir: Path):
    (model_dir / ckpt.TOKENIZER).unlink()
    assert one_line_error(model_dir) == (
        f"{model_dir / ckpt.TOKENIZER} is missing; {ckpt.WEIGHTS} was saved with it"
    )


@pytest.mark.parametrize(
    ("contents", "expected"),
    [
        ([1, 2], "{path} holds a list, not a dict of tensors"),
        ({"transformer.wte.weight": 3}, "{path}: entry 'transformer.wte.weight' is a int, not a tensor"),
        ({"transformer.wte.weight": torch.tensor([1.0, float("nan")])},
         "{path}: tensor transformer.wte.weight holds NaN or infinite values"),
        ({"transformer.wte.weight": torch.tensor([float("inf")])},
         "{path}: tensor transformer.wte.weight holds NaN or infinite values"),
    ],
)  # fmt: skip
def test_odd_or_non_finite_weights_get_one_line(model_dir: Path, contents, expected):
    path = model_dir / ckpt.BIN_WEIGHTS
    (model_dir / ckpt.WEIGHTS).unlink()
    torch.save(contents, path)
    assert one_line_error(model_dir) == expected.format(path=path)


def test_a_tokenizer_larger_than_the_vocabulary_is_refused(model_dir: Path):
    from safetensors.torch import load_file, save_file

    config = json.loads((model_dir / ckpt.CONFIG).read_text())
    config["vocab_size"] = 8
    (model_dir / ckpt.CONFIG).write_text(json.dumps(config))
    sd = {
        k: v[:8] if v.shape[0] != 32 else v for k, v in load_file(model_dir / ckpt.WEIGHTS).items()
    }
    save_file(sd, str(model_dir / ckpt.WEIGHTS))  # another tool's file: no digests
    n = len(json.loads((model_dir / ckpt.TOKENIZER).read_text())["model"]["vocab"])
    assert one_line_error(model_dir) == (
        f"{model_dir / ckpt.TOKENIZER}: {n} tokens, more than the model's vocab_size=8"
    )


def _a_list(state: dict) -> object:
    return [state]


def _no_optimizer(state: dict) -> dict:
    return {k: v for k, v in state.items() if k != "optimizer"}


def _rng_not_a_tensor(state: dict) -> dict:
    return {**state, "torch_rng": "seed"}


def _unknown_state_field(state: dict) -> dict:
    return {**state, "state": {**state["state"], "epoch": 3}}


def _foreign_optimizer(state: dict) -> dict:
    optimizer = state["optimizer"]
    return {**state, "optimizer": {**optimizer, "param_groups": optimizer["param_groups"][:1]}}


@pytest.mark.parametrize(
    ("tamper", "expected"),
    [
        (_a_list, "{path} is not an attnlab trainer state (missing or odd: optimizer, sampler, "
         "torch_rng, state)"),
        (_no_optimizer, "{path} is not an attnlab trainer state (missing or odd: optimizer)"),
        (_rng_not_a_tensor, "{path} is not an attnlab trainer state (missing or odd: torch_rng)"),
        (_unknown_state_field, "{path} does not fit this run ("),
        (_foreign_optimizer, "{path} does not fit this run ("),
    ],
)  # fmt: skip
def test_a_tampered_trainer_state_gets_one_line(train_tiny, tmp_path: Path, tamper, expected):
    run = tmp_path / "run"
    train_tiny(run, until=5, max_iters=10, ckpt_interval=5)
    (run / "latest" / MANIFEST).unlink()  # with it, refused unread (test_folder_integrity)
    path = run / "latest" / ckpt.TRAINER_STATE
    torch.save(tamper(torch.load(path, weights_only=True)), path)
    with pytest.raises(AttnlabError) as err:
        Trainer.resume(run)
    assert str(err.value).startswith(expected.format(path=path))
    assert "\n" not in str(err.value)
