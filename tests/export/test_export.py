"""Export: every format round-trips, ONNX matches PyTorch, int8 keeps a trained model's predictions."""

from __future__ import annotations

import json
import math
import re
import shutil
import string
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import compatible_sets, mechanism_examples, tiny_model
from test_bad_input import command_name, error_line

from attnlab import from_pretrained
from attnlab.cli import main as cli_main
from attnlab.errors import AttnlabError
from attnlab.export import FILES, FORMATS, OnnxLM, export, export_model, load_onnx, parse_formats
from attnlab.export import onnx as onnx_export
from attnlab.fsutil import MANIFEST
from attnlab.model import GPT
from attnlab.train.checkpoint import save_checkpoint

# every registered mechanism at once, on the QKVE backbone (GQA, RoPE, RMSNorm, deep SwiGLU):
# label -> fields of each largest set that composes ({"all": ...} while nothing refuses another)
ALL_MECHANISMS = compatible_sets(norm="rmsnorm", mlp="swiglu", ffn_sublayers=2, bias=True)
COMPOSED = next(iter(ALL_MECHANISMS))  # the largest set, where one model stands for them all
# a plain model, each registered mechanism alone (its SPEC example), and the paper variants
# whose graphs differ most (an MLP-gated boosted model with biases)
CONFIGS = {
    "vanilla": dict(),
    **mechanism_examples(),
    "boosted-mlp-gate": dict(boost_rounds=3, boost_gate="mlp", bias=True),
}
# the QKVE-style attention: GQA, RoPE and the value gate, two layers
GQA_VALUE_GATE = dict(value_gate=True, n_kv_head=2, pos="rope", norm="rmsnorm", mlp="swiglu")
# shapes other than the [2, 8] the graphs are traced with, up to the full block
SHAPES = [(1, 1), (1, 5), (3, 32), (4, 13)]


def make_model(**overrides) -> GPT:
    """A tiny model whose weights are large enough (std 0.2) that activations are far from zero."""
    torch.manual_seed(0)
    model = GPT(tiny_model(vocab_size=64, **overrides)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    return model


def chat_tokenizer():
    from attnlab.data.chat import IM_END, IM_START
    from attnlab.data.tokenizer import Tokenizer

    tok = Tokenizer.from_chars(sorted(string.ascii_letters + " \n.,"))
    tok.add_special_tokens([IM_START, IM_END])
    return tok


def torch_logits(model: GPT, x: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        return model(x, all_logits=True)[0].numpy()


def check_onnx_parity(model: GPT, folder: Path) -> float:
    """Largest |onnxruntime - PyTorch| logit over SHAPES; the graph's interface is checked too."""
    import onnx

    graph = onnx.load(str(folder / FILES["onnx"])).graph
    onnx.checker.check_model(str(folder / FILES["onnx"]))
    dims = lambda v: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]  # noqa: E731
    cfg = model.config
    kv, dh = cfg.n_kv_head, cfg.head_dim
    slots = [("key", kv), ("value", kv)]
    if cfg.twicing:
        slots.append(("twice.value", cfg.n_head))
    for m in range(1, cfg.boost_rounds):
        slots += [(f"r{m}.key", kv), (f"r{m}.value", kv)]
        if cfg.twicing:
            slots.append((f"r{m}.twice.value", cfg.n_head))
    past = [(f"{i}.{name}", heads) for i in range(cfg.n_layer) for name, heads in slots]
    assert [(v.name, v.type.tensor_type.elem_type, dims(v)) for v in graph.input] == [
        ("input_ids", onnx.TensorProto.INT64, ["batch", "seq"]),
        ("attention_mask", onnx.TensorProto.INT64, ["batch", dims(graph.input[1])[1]]),
        ("position_ids", onnx.TensorProto.INT64, ["batch", "seq"]),
        *[
            # at least h heads: Optimum starts with num_attention_heads of them
            (f"past_key_values.{n}", onnx.TensorProto.FLOAT, ["batch", f"heads{h}", "past", dh])
            for n, h in past
        ],
    ]
    assert [(v.name, dims(v)) for v in graph.output] == [
        ("logits", ["batch", "seq", 64]),
        *[(f"present.{n}", ["batch", h, "past + seq", dh]) for n, h in past],
    ]
    lm, _ = load_onnx(folder)
    gen = torch.Generator().manual_seed(1)
    worst = 0.0
    for shape in SHAPES:
        x = torch.randint(0, 64, shape, generator=gen)
        ref = torch_logits(model, x)
        assert ref.std() > 0.1  # a parity test on near-zero logits would prove little
        worst = max(worst, float(np.abs(lm.logits(x).numpy() - ref).max()))
        # the same positions through the cache: a prefill, then one token at a time
        cache, t = lm.new_cache(), max(1, shape[1] - 3)
        steps = [lm(x[:, :t], cache=cache)[0]]
        steps += [lm(x[:, i : i + 1], cache=cache)[0] for i in range(t, shape[1])]
        assert cache.length == shape[1]
        worst = max(worst, float(np.abs(torch.cat(steps, dim=1).numpy() - ref).max()))
    return worst


@pytest.fixture(scope="module", params=list(ALL_MECHANISMS))
def exported(tmp_path_factory: pytest.TempPathFactory, request) -> tuple[GPT, Path]:
    """Each all-mechanisms model saved as a checkpoint and exported in every format."""
    root = tmp_path_factory.mktemp("export")
    model = make_model(**ALL_MECHANISMS[request.param])
    save_checkpoint(root / "ckpt", model, chat_tokenizer())
    export(root / "ckpt", root / "out")
    return model, root / "out"


def test_parse_formats() -> None:
    assert parse_formats("all") == list(FORMATS)
    assert parse_formats("onnx-int8, bin") == ["bin", "onnx", "onnx-int8"]
    with pytest.raises(AttnlabError, match=r"unknown format.*tflite"):
        parse_formats("onnx,tflite")


def test_folder_metadata(exported: tuple[GPT, Path]) -> None:
    import tokenizers

    from attnlab.data.chat import IM_END, IM_START

    model, out = exported
    tok = tokenizers.Tokenizer.from_file(str(out / "tokenizer.json"))
    start, end = tok.token_to_id(IM_START), tok.token_to_id(IM_END)
    assert (start, end) == (56, 57)  # after the 56 characters
    assert json.loads((out / "generation_config.json").read_text()) == {
        "bos_token_id": start,
        "eos_token_id": end,
        "pad_token_id": end,
        "do_sample": True,
        "temperature": 0.8,
        "top_k": 200,
    }
    assert json.loads((out / "special_tokens_map.json").read_text()) == {
        "bos_token": IM_START,
        "eos_token": IM_END,
        "pad_token": IM_END,
        "unk_token": "<unk>",  # char tokenizers get one (id 58: the model has 64 rows)
    }
    cfg = json.loads((out / "tokenizer_config.json").read_text())
    assert cfg["tokenizer_class"] == "PreTrainedTokenizerFast" and cfg["model_max_length"] == 32
    assert cfg["added_tokens_decoder"][str(end)]["content"] == IM_END
    assert cfg["added_tokens_decoder"][str(end)]["special"] is True
    hf_keys = {"model_type", "architectures", "auto_map", "tie_word_embeddings", "torch_dtype"}
    config = json.loads((out / "config.json").read_text())
    assert {
        k: v for k, v in config.items() if k in model.config.to_dict()
    } == model.config.to_dict()
    assert set(config) - set(model.config.to_dict()) == hf_keys | {
        "attnlab_version",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
    }
    # the state_dict formats: no tied lm_head, tensors only (loads with weights_only=True)
    sd = torch.load(out / FILES["bin"], weights_only=True)
    assert set(sd) == set(model.state_dict()) - {"lm_head.weight"}
    assert all(torch.equal(sd[k], v) for k, v in model.state_dict().items() if k in sd)


def test_from_pretrained_prefers_safetensors_then_bin(
    exported: tuple[GPT, Path], tmp_path: Path
) -> None:
    model, out = exported
    x = torch.randint(0, 64, (2, 11), generator=torch.Generator().manual_seed(2))
    loaded, tok = from_pretrained(out)
    assert tok is not None and tok.vocab_size == 59  # 56 characters, ChatML's two, <unk>
    np.testing.assert_array_equal(torch_logits(loaded, x), torch_logits(model, x))
    only_bin = tmp_path / "only_bin"
    shutil.copytree(out, only_bin)
    (only_bin / FILES["safetensors"]).unlink()
    loaded, _ = from_pretrained(only_bin)
    np.testing.assert_array_equal(torch_logits(loaded, x), torch_logits(model, x))
    # safetensors wins when both are there: a corrupted .bin beside it is never read (its
    # manifest names it first; attnlab.fsutil.check_manifest)
    both = tmp_path / "both"
    shutil.copytree(out, both)
    (both / FILES["bin"]).write_bytes(b"not a pickle")
    with pytest.raises(AttnlabError, match=r"pytorch_model\.bin has 12 bytes where attnlab wrote"):
        from_pretrained(both)
    (both / MANIFEST).unlink()  # as an older export: unread
    loaded, _ = from_pretrained(both)
    np.testing.assert_array_equal(torch_logits(loaded, x), torch_logits(model, x))


def test_onnx_parity_all_mechanisms(exported: tuple[GPT, Path]) -> None:
    model, out = exported
    assert check_onnx_parity(model, out) < 1e-4


def test_onnx_left_padding_matches_unpadded(exported: tuple[GPT, Path]) -> None:
    """attention_mask and position_ids: a padded row's logits are those it has alone."""
    model, out = exported
    session = load_onnx(out)[0].session
    gen = torch.Generator().manual_seed(6)
    short, long = (
        torch.randint(0, 64, (1, 4), generator=gen),
        torch.randint(0, 64, (1, 10), generator=gen),
    )
    ids = torch.cat([torch.cat([torch.zeros(1, 6, dtype=torch.long), short], 1), long]).numpy()
    mask = np.ones((2, 10), dtype=np.int64)
    mask[0, :6] = 0
    feeds = {
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": (mask.cumsum(-1) - 1).clip(0),
    }
    for i in session.get_inputs()[3:]:  # n_head empty heads, as Optimum passes them
        feeds[i.name] = np.zeros((2, model.config.n_head, 0, i.shape[3]), dtype=np.float32)
    logits = session.run(["logits"], feeds)[0]
    np.testing.assert_allclose(logits[0, 6:], torch_logits(model, short)[0], atol=1e-4, rtol=0)
    np.testing.assert_allclose(logits[1], torch_logits(model, long)[0], atol=1e-4, rtol=0)


def test_onnx_attention_rmsnorm_and_rope_are_one_node_each(
    exported: tuple[GPT, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Opset 23: each attention call is one Attention node, each RMSNorm one RMSNormalization and
    each RoPE rotation one RotaryEmbedding (as tensor ops they were a dozen small nodes apiece,
    and a decoding step pays per node); int8 quantizes the matmuls and leaves these alone."""
    import onnx

    from attnlab.model import attention
    from attnlab.model.layers import RMSNorm

    model, out = exported
    calls = {"sdpa": 0, "rotate": 0}

    def counted(name: str, fn):
        def run(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)

        return run

    sdpa = torch.nn.functional.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", counted("sdpa", sdpa))
    monkeypatch.setattr(attention, "rotate", counted("rotate", attention.rotate))
    with torch.no_grad():
        model(torch.zeros(1, 3, dtype=torch.long))
    norms = sum(isinstance(m, RMSNorm) for m in model.modules())
    for fmt in ("onnx", "onnx-int8"):
        graph = onnx.load(str(out / FILES[fmt]))
        ops = [n.op_type for n in graph.graph.node]
        assert [(o.domain, o.version) for o in graph.opset_import] == [("", onnx_export.OPSET)]
        found = [ops.count(op) for op in ("Attention", "RMSNormalization", "RotaryEmbedding")]
        assert found == [calls["sdpa"], norms, calls["rotate"]]
    # 2 layers x 2 rounds: q and k rotated once a round, attention called twice (Twicing)
    assert calls == {"sdpa": 8, "rotate": 8} and norms == 7


def test_onnx_plain_attention_has_no_reshape_transpose_or_concat(tmp_path: Path) -> None:
    """RotaryEmbedding and Attention read q, k, v as [B, T, heads * D] and Attention grows the
    cache itself, so a plain round is three nodes (eight Reshape, Transpose and Concat nodes
    surrounded them)."""
    import onnx

    model = make_model(**GQA_VALUE_GATE)
    export_model(model, None, tmp_path / "out", ["onnx"])
    ops = [n.op_type for n in onnx.load(str(tmp_path / "out" / FILES["onnx"])).graph.node]
    found = [ops.count(op) for op in ("Transpose", "Reshape", "Concat", "Attention")]
    assert found == [0, 0, 0, 2] and ops.count("RotaryEmbedding") == 4
    assert check_onnx_parity(model, tmp_path / "out") < 1e-4


def test_int8_graph_runs(exported: tuple[GPT, Path]) -> None:
    import onnx

    model, out = exported
    ops = {n.op_type for n in onnx.load(str(out / FILES["onnx-int8"])).graph.node}
    assert "DynamicQuantizeLinear" in ops or "MatMulInteger" in ops
    lm, _ = load_onnx(out, int8=True)
    x = torch.randint(0, 64, (3, 9), generator=torch.Generator().manual_seed(3))
    q, ref = lm.logits(x).numpy(), torch_logits(model, x)
    assert q.shape == ref.shape == (3, 9, 64)
    # int8 weights move logits, but far less than the logits themselves vary
    assert np.abs(q - ref).mean() < 0.2 * ref.std()


def test_int8_tied_head_is_an_integer_matmul(tmp_path: Path) -> None:
    """A tied head read its int8 table through DequantizeLinear and Transpose at every step and
    multiplied in float32 (the exporter keeps the Transpose of a table over 8192 values)."""
    import onnx

    model = make_model(n_layer=1, n_embd=160)  # a 64 x 160 table
    export_model(model, None, tmp_path / "out", ["onnx-int8"])
    graph = onnx.load(str(tmp_path / "out" / FILES["onnx-int8"])).graph
    weights = {w.name for w in graph.initializer}
    whole = [
        n.op_type
        for n in graph.node
        if n.op_type in ("DequantizeLinear", "Transpose") and n.input[0] in weights
    ]
    assert model.config.tie_embeddings and whole == []
    logits = next(n for n in graph.node if n.output[0] == "logits")
    assert logits.op_type == "Mul"  # the integer matmul's float scale, not a float MatMul
    x = torch.randint(0, 64, (2, 7), generator=torch.Generator().manual_seed(5))
    q, ref = load_onnx(tmp_path / "out", int8=True)[0].logits(x).numpy(), torch_logits(model, x)
    assert np.abs(q - ref).mean() < 0.2 * ref.std()


def test_torchscript_loads_without_attnlab(exported: tuple[GPT, Path], tmp_path: Path) -> None:
    model, out = exported
    x = torch.randint(0, 64, (3, 20), generator=torch.Generator().manual_seed(4))
    np.save(tmp_path / "x.npy", x.numpy())
    script = (
        "import sys, numpy as np, torch\n"
        f"m = torch.jit.load({str(out / FILES['torchscript'])!r})\n"
        "y = m(torch.from_numpy(np.load('x.npy')))\n"
        "np.save('y.npy', y.detach().numpy())\n"
        "assert not any(k.startswith('attnlab') for k in sys.modules), 'attnlab was imported'\n"
    )
    # -I: isolated mode, no PYTHONPATH, no cwd or user site on sys.path; cwd outside the repo
    proc = subprocess.run(
        [sys.executable, "-I", "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    np.testing.assert_allclose(
        np.load(tmp_path / "y.npy"), torch_logits(model, x), atol=1e-5, rtol=0
    )


@pytest.fixture
def sessions(monkeypatch: pytest.MonkeyPatch) -> list:
    """The onnxruntime session of every OnnxLM made while the test runs, in order."""
    made = []

    class Recorded(OnnxLM):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            made.append(self.session)

    monkeypatch.setattr(onnx_export, "OnnxLM", Recorded)  # load_onnx makes them all
    return made


def test_sample_onnxruntime_backend_matches_torch(
    exported: tuple[GPT, Path], capsys, sessions: list
) -> None:
    _, out = exported
    texts = {}
    for backend in ("torch", "onnxruntime"):
        greedy = ["--temperature", "0", "--max-new-tokens", "40", "--device", "cpu"]
        args = ["sample", str(out), "--backend", backend, "--prompt", "To be", *greedy]
        assert cli_main(args) == 0
        texts[backend] = capsys.readouterr().out
    assert texts["onnxruntime"].startswith("To be") and len(texts["onnxruntime"]) > 40
    # greedy decoding: the windowed ONNX recompute past block 32 and the torch path agree token for token
    assert texts["onnxruntime"] == texts["torch"]
    int8 = ["sample", str(out), "--backend", "onnxruntime", "--int8", "--prompt", "To be", *greedy]
    assert cli_main([*int8, "--threads", "1"]) == 0
    assert capsys.readouterr().out.startswith("To be")
    assert [s.get_session_options().intra_op_num_threads for s in sessions] == [0, 1]  # 0: ORT's


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--backend", "onnxruntime", "--compile"], "--compile: not available with --backend"),
        (["--backend", "onnxruntime", "--device", "cuda"], "--device cuda: not available"),
        (["--int8"], "add --backend onnxruntime"),
        (["--threads", "0"], "--threads must be at least 1, got 0"),
    ],
)
def test_sample_refuses_flags_its_backend_ignores(
    exported: tuple[GPT, Path], capsys, flags: list[str], message: str
) -> None:
    assert cli_main(["sample", str(exported[1]), *flags]) == 2
    assert message in capsys.readouterr().err


def test_bench_export_table(exported: tuple[GPT, Path], capsys, sessions: list) -> None:
    """One row per backend, eager's greedy tokens from fp32, and --threads for both runtimes."""
    _, out = exported
    args = [
        "bench",
        "export",
        "--model",
        str(out),
        "--tokens",
        "4",
        "--prompts",
        "2",
        "--reps",
        "1",
        "--no-compile",
        "--threads",
        "1",
    ]
    assert cli_main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert ", 1 threads, 1 reps" in lines[0]
    assert [s.get_session_options().intra_op_num_threads for s in sessions] == [1, 1]
    rows = {
        line.split("  ")[0]: line.split()
        for line in lines
        if line.startswith(("pytorch", "onnxruntime"))
    }
    assert list(rows) == ["pytorch eager", "onnxruntime fp32", "onnxruntime int8"]
    assert rows["pytorch eager"][-2:] == ["1.00x", "100%"]
    assert rows["onnxruntime fp32"][-2:] == ["1.00x", "100%"]  # eager's greedy tokens
    int8_vs_eager, int8_vs_fp32 = (float(v.rstrip("x")) for v in rows["onnxruntime int8"][-3:-1])
    fp32_vs_eager = float(rows["onnxruntime fp32"][-3].rstrip("x"))
    # one repetition: the ratio to fp32 is the quotient of the two ratios to eager, each
    # printed to 2 decimals (so off by up to 0.005 apiece, and the shown ratio by 0.005 too)
    quotient = int8_vs_eager / fp32_vs_eager
    rounding = quotient * (0.005 / int8_vs_eager + 0.005 / fp32_vs_eager) + 0.005
    assert int8_vs_fp32 == pytest.approx(quotient, abs=rounding)


def test_bench_export_of_a_native_bias_free_model(tmp_path: Path, capsys) -> None:
    """GPT-2's config.json says biases (zero ones), so the graph's recorded config reads
    bias=True; bench export compared it with the in-memory model's bias=False and refused."""
    save_checkpoint(tmp_path / "ckpt", make_model(), None)
    args = ["bench", "export", "--model", str(tmp_path / "ckpt"), "--tokens", "2"]
    assert cli_main([*args, "--prompts", "1", "--reps", "1", "--no-compile"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("onnx")]
    assert len(rows) == 2 and rows[0].endswith("100%"), rows  # fp32: eager's tokens


def test_export_cli_progress_and_errors(tmp_path: Path, capsys) -> None:
    save_checkpoint(tmp_path / "ckpt", make_model(), None)
    args = ["export", str(tmp_path / "ckpt"), "--formats", "safetensors,bin"]
    assert cli_main([*args, "--out", str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert [line.split()[1] for line in out.splitlines() if line.startswith("export:")] == [
        "safetensors",
        "bin",
    ]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        ".attnlab-manifest.json",  # what export wrote (attnlab.fsutil)
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "pytorch_model.bin",
    ]
    assert cli_main(["export", str(tmp_path / "nowhere"), "--out", str(tmp_path / "x")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert cli_main(["sample", str(tmp_path / "out"), "--backend", "onnxruntime"]) == 2
    assert "has no model.onnx" in capsys.readouterr().err


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_a_damaged_onnx_file_is_one_line(
    exported: tuple[GPT, Path], tmp_path: Path, capsys, damage: str
) -> None:
    """onnxruntime's own exceptions (InvalidProtobuf...) reached the user as a traceback."""
    import onnxruntime
    from test_folder_safety import snapshot

    folder = tmp_path / "exported"
    shutil.copytree(exported[1], folder)
    graph = folder / FILES["onnx"]
    data = graph.read_bytes()
    graph.write_bytes(b"not a graph" if damage == "garbage" else data[: len(data) // 2])
    before = snapshot(tmp_path)
    status = cli_main(["sample", str(folder), "--backend", "onnxruntime", "--prompt", "a"])
    p = subprocess.CompletedProcess([], status, "", capsys.readouterr().err)
    assert error_line(p, "sample") == (
        f"onnxruntime {onnxruntime.__version__} cannot load {graph} (Protobuf parsing failed.)"
    )
    assert snapshot(tmp_path) == before


def test_an_onnxruntime_too_old_for_the_graph_is_named() -> None:
    error = Exception("[ONNXRuntimeError] : 1 : FAIL : Load model from m.onnx failed:opset 23")
    assert str(onnx_export.load_error(Path("m.onnx"), error, "1.20.1")) == (
        "onnxruntime 1.20.1 cannot load m.onnx (opset 23); attnlab's exports need "
        "onnxruntime >= 1.23"
    )
    assert str(onnx_export.load_error(Path("m.onnx"), error, "1.23.0")) == (
        "onnxruntime 1.23.0 cannot load m.onnx (opset 23)"
    )


def failed_line(capsys, status: int, command: str) -> str:
    """The one error line of an in-process CLI call that must have failed with status 2."""

    return error_line(subprocess.CompletedProcess([], status, "", capsys.readouterr().err), command)


@pytest.mark.parametrize(
    ("field", "value", "int8"),
    [("n_layer", 3, False), ("n_embd", 64, True), ("vocab_size", 65, False)],
)
def test_onnxruntime_refuses_a_config_json_that_does_not_describe_the_graph(
    exported: tuple[GPT, Path], tmp_path: Path, capsys, field: str, value: int, int8: bool
) -> None:
    """An edited config.json ran silently under onnxruntime (the torch path refused it)."""
    from test_folder_safety import snapshot

    folder = tmp_path / "exported"
    shutil.copytree(exported[1], folder)
    config = json.loads((folder / "config.json").read_text())
    was = config[field]
    (folder / "config.json").write_text(json.dumps({**config, field: value}))
    before = snapshot(tmp_path)
    args = ["sample", str(folder), "--backend", "onnxruntime", "--prompt", "a"]
    status = cli_main([*args, "--int8"] if int8 else args)
    graph = FILES["onnx-int8" if int8 else "onnx"]
    assert failed_line(capsys, status, "sample") == (
        f"{folder / 'config.json'} does not describe {graph} ({field} {value} vs {was}: "
        "config.json vs the graph); export the model again"
    )
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("int8", [False, True])
def test_onnxruntime_refuses_a_tokenizer_larger_than_the_model(
    exported: tuple[GPT, Path], tmp_path: Path, capsys, int8: bool
) -> None:
    """A tokenizer.json with ids past the embedding table was a 28-line onnxruntime traceback
    mid-generation (the torch path refused it in one line)."""
    from test_folder_safety import snapshot

    from attnlab.data.tokenizer import Tokenizer

    folder = tmp_path / "exported"
    shutil.copytree(exported[1], folder)
    Tokenizer.from_chars([chr(0x100 + i) for i in range(100)]).save(folder / "tokenizer.json")
    before = snapshot(tmp_path)
    args = ["sample", str(folder), "--backend", "onnxruntime", "--prompt", "\u0100"]
    status = cli_main([*args, "--int8"] if int8 else args)
    assert failed_line(capsys, status, "sample") == (
        f"{folder / 'tokenizer.json'}: 100 tokens, more than the model's vocab_size=64"
    )
    assert snapshot(tmp_path) == before


def test_onnxruntime_refuses_a_graph_without_its_config_record(
    exported: tuple[GPT, Path], tmp_path: Path, capsys
) -> None:
    import onnx

    folder = tmp_path / "exported"
    shutil.copytree(exported[1], folder)
    graph = onnx.load(str(folder / FILES["onnx"]))
    del graph.metadata_props[:]
    onnx.save(graph, str(folder / FILES["onnx"]))
    status = cli_main(["sample", str(folder), "--backend", "onnxruntime", "--prompt", "a"])
    assert failed_line(capsys, status, "sample") == (
        f"{folder / FILES['onnx']} does not record its model config (an older export); "
        "run `attnlab export` again"
    )


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"n_embd": "x"}, "n_embd must be an integer, not 'x'"),
        ({"n_layer": 2.5}, "n_layer must be an integer, not 2.5"),
        ({"n_head": True}, "n_head must be an integer, not True"),
        ({"tie_word_embeddings": "no"}, "tie_word_embeddings must be true or false, not 'no'"),
        ({"model_type": "llama"}, "hidden_size is missing"),
        (
            {"scale_attn_weights": False},
            ("scale_attn_weights=false; attnlab's GPT-2 backbone computes scale_attn_weights=true"),
        ),
    ],
)
def test_a_malformed_native_config_json_is_one_line(
    tmp_path: Path, capsys, edit: dict, message: str
) -> None:
    """``int("x")`` / a missing Llama key in an edited GPT-2 config.json were tracebacks."""
    from test_folder_safety import snapshot

    save_checkpoint(tmp_path / "ckpt", make_model(), chat_tokenizer())
    folder = tmp_path / "gpt2"
    assert (
        cli_main(
            ["export", str(tmp_path / "ckpt"), "--formats", "safetensors", "--out", str(folder)]
        )
        == 0
    )
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "gpt2"
    (folder / "config.json").write_text(json.dumps({**config, **edit}))
    before = snapshot(tmp_path)
    capsys.readouterr()
    for command in (
        ["sample", str(folder), "--prompt", "a"],
        ["bench", "export", "--model", str(folder)],
    ):
        status = cli_main(command)
        assert (
            failed_line(capsys, status, command_name(command))
            == f"{folder / 'config.json'}: {message}"
        )
    assert snapshot(tmp_path) == before


def round_trip(model: GPT, folder: Path) -> dict[str, float]:
    """Max |logit difference| of each exported format against ``model``."""
    x = torch.randint(0, 64, (3, 17), generator=torch.Generator().manual_seed(5))
    ref = torch_logits(model, x)
    diffs = {"safetensors": float(np.abs(torch_logits(from_pretrained(folder)[0], x) - ref).max())}
    only_bin = folder.parent / f"{folder.name}-bin"
    shutil.copytree(folder, only_bin)
    (only_bin / FILES["safetensors"]).unlink()
    diffs["bin"] = float(np.abs(torch_logits(from_pretrained(only_bin)[0], x) - ref).max())
    traced = torch.jit.load(str(folder / FILES["torchscript"]))
    diffs["torchscript"] = float(np.abs(traced(x).detach().numpy() - ref).max())
    diffs["onnx"] = check_onnx_parity(model, folder)
    return diffs


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_round_trip_every_format(name: str, tmp_path: Path) -> None:
    model = make_model(**CONFIGS[name])
    save_checkpoint(tmp_path / "ckpt", model, chat_tokenizer())
    export(tmp_path / "ckpt", tmp_path / "out")
    diffs = round_trip(model, tmp_path / "out")
    assert diffs["safetensors"] == diffs["bin"] == 0.0
    assert diffs["torchscript"] < 1e-5 and diffs["onnx"] < 1e-4, diffs


def int8_agreement(model: GPT, folder: Path, tokens: np.ndarray) -> tuple[float, float, float]:
    """(top-1 agreement, fp32 val loss, int8 val loss) over consecutive validation windows."""
    from attnlab.data.bins import sequential_windows

    lm, _ = load_onnx(folder, int8=True)
    agree = count = 0
    nll = {"fp32": 0.0, "int8": 0.0}
    for x, y in sequential_windows(tokens, model.config.block_size, 64):
        logits = {"fp32": torch.from_numpy(torch_logits(model, x)), "int8": lm.logits(x)}
        keep = y != -1
        agree += int((logits["fp32"].argmax(-1) == logits["int8"].argmax(-1))[keep].sum())
        count += int(keep.sum())
        for k, v in logits.items():
            nll[k] += float(torch.nn.functional.cross_entropy(v[keep], y[keep], reduction="sum"))
    return agree / count, nll["fp32"] / count, nll["int8"] / count


def test_int8_keeps_trained_predictions(train_tiny, tmp_path: Path) -> None:
    trainer, _ = train_tiny(tmp_path / "run", max_iters=120, eval_interval=120)
    export(tmp_path / "run", tmp_path / "out", ["onnx-int8"])
    agreement, loss32, loss8 = int8_agreement(
        trainer.model.eval(), tmp_path / "out", trainer.data.val
    )
    assert loss32 < 0.7 * math.log(trainer.model.config.vocab_size)  # well below uniform: trained
    assert agreement >= 0.95
    assert abs(loss8 - loss32) / loss32 < 0.02


@pytest.mark.slow
def test_int8_size_qkve_61m(tmp_path: Path) -> None:
    """Randomly initialised QKVE-61M: int8 ONNX at most 30 % of fp32 (the seed ships ~64 MB)."""
    from attnlab.config import ModelConfig
    from attnlab.export import export_model

    torch.manual_seed(0)
    model = GPT(ModelConfig.preset("qkve-61m"))
    export_model(model, None, tmp_path, ["onnx-int8"])
    fp32, int8 = ((tmp_path / FILES[f]).stat().st_size for f in ("onnx", "onnx-int8"))
    assert fp32 > 4 * 61_000_000  # every fp32 weight is in the file, once
    assert int8 / fp32 <= 0.30, (fp32, int8)


@pytest.mark.parametrize("command", ["export", "import-hf", "import-nanogpt"])
def test_model_folder_writers_refuse_a_runs_checkpoint_as_out(
    train_tiny, tmp_path: Path, capsys, command: str
) -> None:
    """`export RUN --out RUN/latest --overwrite` replaced the resume checkpoint with an export
    (no trainer state, GPT-2 layout): train --resume then refused the run. import-hf and
    import-nanogpt, which write model folders of their own, did the same."""
    from test_folder_safety import snapshot
    from test_import_hf import hf_model
    from test_import_nanogpt import nanogpt_checkpoint

    train_tiny(tmp_path / "run", max_iters=2, eval_interval=2, eval_iters=1)
    source = {"export": tmp_path / "run", "import-hf": tmp_path / "hf"}.get(
        command, tmp_path / "ckpt.pt"
    )
    if command == "import-hf":
        hf_model("gpt2").save_pretrained(source)
    elif command == "import-nanogpt":
        nanogpt_checkpoint(source)
    before = snapshot(tmp_path)
    capsys.readouterr()  # save_pretrained's progress bar
    for name in ("latest", "best"):
        out = tmp_path / "run" / name
        status = cli_main([command, str(source), "--out", str(out), "--overwrite"])
        assert failed_line(capsys, status, command) == (
            f"--out {out} is a checkpoint of the run {tmp_path / 'run'} (resume and eval read "
            "it); choose another --out"
        )
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize(
    "argv",
    [
        ["export", "{run}"],
        ["import-hf", "{run}"],
        ["import-nanogpt", "ckpt.pt"],
        ["sft", "{run}"],
        ["train", "--data", "{run}"],
        ["analyze", "entropy", "{run}"],
        ["analyze", "per-position", "{run}", "{run}"],
        ["study", "spec.toml"],
        ["prepare"],
    ],
    ids=lambda argv: " ".join(a for a in argv if "{" not in a),
)
@pytest.mark.parametrize("inside", ["latest/sub", "best/x/y.csv"])
def test_no_command_writes_inside_a_runs_checkpoint(
    train_tiny, tmp_path: Path, capsys, argv: list[str], inside: str
) -> None:
    """An --out inside RUN/latest or RUN/best was accepted (an analysis, an sft run, an import
    written there), and the next `train --resume` deleted it without a word: each checkpoint
    save replaces those folders whole."""
    from test_folder_safety import snapshot

    run = tmp_path / "run"
    train_tiny(run, max_iters=2, eval_interval=2, eval_iters=1)
    before = snapshot(tmp_path)
    out = run / inside
    argv = [a.format(run=run) for a in argv]
    status = cli_main([*argv, "--out", str(out)])
    checkpoint = run / inside.split("/")[0]
    assert failed_line(capsys, status, command_name(argv)) == (
        f"--out {out} is inside {checkpoint}, a checkpoint of the run {run} (each save "
        "replaces it whole); choose another --out"
    )
    assert snapshot(tmp_path) == before


def tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_export_out_refuses_foreign_folder_and_swaps(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    save_checkpoint(tmp_path / "ckpt", make_model(), None)
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("my notes")
    args = ["export", str(tmp_path / "ckpt"), "--formats", "safetensors", "--out", str(foreign)]
    assert cli_main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"attnlab export: error: {foreign} is not empty and is not a model folder exported by attnlab; "
        "pass --overwrite to replace it, or choose another --out"
    ]
    assert tree(foreign) == {"notes.txt": b"my notes"}
    # an earlier export is replaced without --overwrite
    out = tmp_path / "out"
    assert cli_main([*args[:-1], str(out)]) == 0
    assert cli_main([*args[:-1], str(out)]) == 0
    before = tree(out)
    assert set(before) == {
        ".attnlab-manifest.json",  # what export wrote (attnlab.fsutil)
        "config.json",
        "generation_config.json",
        "model.safetensors",
    }

    # a failure mid-export leaves the previous export whole, and no temporary folder behind
    def fail(*_args, **_kwargs) -> None:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr("attnlab.export.folder.write_bin", fail)
    with pytest.raises(RuntimeError, match="disk on fire"):
        export(tmp_path / "ckpt", out, ["safetensors", "bin"])
    assert tree(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "mine", "out"]
    # --overwrite replaces the foreign folder whole
    assert cli_main([*args, "--overwrite"]) == 0
    assert set(tree(foreign)) == set(before)


@pytest.mark.parametrize(
    "case",
    [
        "hf-folder",
        "extra-file",
        "subfolder",
        "source",
        "run-inside",
        "checkpoint",
        "proc",
        "link",
        "empty",
    ],
)
def test_export_never_replaces_what_it_did_not_write(tmp_path: Path, capsys, case: str) -> None:
    """Any folder whose config.json had n_layer counted as an export: a Hugging Face GPT-2
    folder, an export with notes beside it, the run being exported, all replaced whole."""
    from test_folder_safety import snapshot

    run = tmp_path / "run"
    save_checkpoint(run / "best", make_model(), None)
    args = ["export", str(run), "--formats", "safetensors"]
    earlier = tmp_path / "earlier"
    assert cli_main([*args, "--out", str(earlier)]) == 0
    out, extra = {
        "hf-folder": (tmp_path / "hf", []),
        "extra-file": (earlier, []),
        "subfolder": (earlier, []),
        "source": (run, ["--overwrite"]),
        "run-inside": (tmp_path, ["--overwrite"]),
        "checkpoint": (run / "best", ["--overwrite"]),
        "proc": (Path("/proc/attnlab-export-test"), []),
        # the swap replaced the link with a folder and left a hidden link behind for good
        "link": (tmp_path / "link", []),
        "empty": (Path(""), []),  # said "--out . would replace the source"
    }[case]
    if case == "link":
        out.symlink_to(earlier)
    if case == "hf-folder":
        shutil.copytree(earlier, out)  # GPT-2's own config.json: n_layer, no attnlab_version
        config = json.loads((out / "config.json").read_text())
        del config["attnlab_version"]
        (out / "config.json").write_text(json.dumps(config))
    elif case == "extra-file":
        (earlier / "README.md").write_text("my model card")
    elif case == "subfolder":
        (earlier / "eval").mkdir()
    if case == "proc" and not Path("/proc/self").is_dir():
        pytest.skip("needs Linux's /proc")
    before = snapshot(tmp_path)
    capsys.readouterr()
    status = cli_main([*args, "--out", str(out), *extra])
    if case in ("source", "run-inside", "checkpoint"):
        source = run / "best" if case == "checkpoint" else run
        expected = f"--out {out} would replace the source {source}; choose another --out"
    elif case == "empty":
        expected = "--out '.' must name a folder, not the current or parent one"
    elif case == "link":
        expected = f"{out} is a symlink to {earlier}; give that folder as --out instead"
    elif case == "proc":  # the reason depends on the user (root: ENOENT, others: EACCES)
        line = failed_line(capsys, status, "export")
        assert re.fullmatch(rf"cannot write {out} \([A-Z][\w ]+\); choose another --out", line)
        assert snapshot(tmp_path) == before
        return
    elif case == "hf-folder":
        expected = (
            f"{out} is not empty and is not a model folder exported by attnlab; pass "
            "--overwrite to replace it, or choose another --out"
        )
    else:  # its own output, with something else beside: named (its manifest: attnlab.fsutil)
        expected = (
            f"{out} holds {'README.md' if case == 'extra-file' else 'eval/'}, which attnlab did "
            "not write there; move them out, or pass --overwrite to delete them with the model "
            "folder exported by attnlab"
        )
    assert failed_line(capsys, status, "export") == expected
    assert snapshot(tmp_path) == before


def test_a_refused_export_prints_nothing_before_its_error(tmp_path: Path, capsys) -> None:
    """The tokenizer's "added <|endoftext|> (id 54) ..." line came before the refusal of --out,
    as if the export had begun."""
    from test_folder_safety import snapshot

    from attnlab.data.tokenizer import Tokenizer

    tok = Tokenizer.from_chars(sorted(string.ascii_letters + " \n."))
    save_checkpoint(tmp_path / "ckpt", GPT(tiny_model(vocab_size=tok.vocab_size)), tok)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("my notes")
    before = snapshot(tmp_path)
    args = ["export", str(tmp_path / "ckpt"), "--formats", "safetensors", "--out"]
    assert cli_main([*args, str(tmp_path / "mine")]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1
    assert snapshot(tmp_path) == before
    assert cli_main([*args, str(tmp_path / "out")]) == 0  # an export it makes says so
    assert re.search(r"^export: tokenizer +added <\|endoftext\|>", capsys.readouterr().out, re.M)
