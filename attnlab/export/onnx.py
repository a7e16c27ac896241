"""ONNX: the dynamo-exported graph with a KV cache, its int8 quantization, and onnxruntime.

The graph takes ``input_ids`` (int64 [batch, seq]), ``attention_mask`` (int64 [batch, past + seq],
0 = padding), ``position_ids`` (int64 [batch, seq]) and the cache as ``past_key_values.L.key`` /
``.value`` ([batch, kv_heads, past, head_dim], the names Optimum and onnxruntime-genai use), plus
whatever per-token state a mechanism caches (``.twice.value`` for Twicing's 2V - AV, ``.rM.key``
/ ``.rM.value`` for boosting round M: every name holds ``.key`` or ``.value``, which is how
Optimum finds the cache it feeds back); it returns ``logits`` for every new position and the
grown cache as ``present.L.*``. The first step passes a cache of length 0, so one graph both
prefills and decodes. A cache input may have more heads than the graph reads (it reads the
first ones): Optimum starts every model it does not know with ``num_attention_heads`` empty
heads, whatever the model's kv heads. The logits of the rows an export added (tokens the model
never trained) are -inf, so that no client samples them, suppress list or not.

onnxruntime-genai feeds back one key and one value a layer and nothing else. Where a mechanism
caches more, ``model-genai.onnx`` is the same model with each layer's cache packed into two
tensors of equal heads (``PackedCacheModel``); ``genai_config.json`` names the graph genai runs.

ONNX goes through the dynamo exporter (``torch.export``): on torch 2.13 it handles every
component (the TorchScript-based exporter has no ``aten::rms_norm``) and it proves the batch and
sequence axes symbolic instead of trusting a trace. The graph is opset 23 (onnxruntime >= 1.23):
attention, RMSNorm and RoPE become one node each, and a decoding step, a few hundred tiny nodes,
is bound by their count, not by arithmetic. For the same reason attention and RoPE take q, k and
v as [B, T, heads * D] and Attention grows the cache itself (``attend_node``): no Reshape,
Transpose or Concat around a round. Int8 is onnxruntime's dynamic quantization
(int8 weights, activations quantized per batch at run time).
"""

from __future__ import annotations

import itertools
import json
import re
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import torch
from torch import nn

from attnlab.config import ModelConfig
from attnlab.data.tokenizer import Tokenizer
from attnlab.errors import AttnlabError
from attnlab.export.trace import INPUT, OUTPUT, quiet_logger
from attnlab.fsutil import check_manifest
from attnlab.model import attention
from attnlab.model.generation import stream
from attnlab.train import checkpoint as ckpt

ONNX_FILE, INT8_FILE = "model.onnx", "model-int8.onnx"
GENAI_CONFIG = "genai_config.json"  # what onnxruntime-genai's og.Model(folder) reads
GENAI_ONNX_FILE = "model-genai.onnx"  # the packed-cache graph, for mechanisms caching more
# the ONNX protobuf limit: larger models keep their weights in a side file
PROTOBUF_LIMIT = 2**31 - 2**26


PAST, PRESENT = "past_key_values", "present"
KV_KINDS = ("key", "value")
OPSET = 23  # Attention and RMSNormalization: one kernel each instead of a dozen small nodes
MIN_ONNXRUNTIME = (1, 23)  # the first with opset 23's Attention on the CPU
# "[ONNXRuntimeError] : 7 : INVALID_PROTOBUF : Load model from X failed:Protobuf parsing failed."
_ORT_PREFIX = re.compile(r"^\[ONNXRuntimeError\] : \d+ : \w+ : (Load model from .* failed:)?")
QUANTIZED = ["MatMul", "Gather"]
MASK, POSITIONS = "attention_mask", "position_ids"
CONFIG_KEY = "attnlab.config"  # the graph's metadata entry holding its ModelConfig as JSON


def cache_slots(model: nn.Module) -> list[list[tuple[str, int]]]:
    """Per layer, each slot the KV cache fills (``r0.k``, ``r0.v``, ``r0.twice``...) and its heads."""
    cache = model.new_cache()
    with torch.no_grad():
        model(torch.zeros(1, 1, dtype=torch.long), cache=cache)
    return [[(name, buf.size(1)) for name, buf in layer.buffers.items()] for layer in cache.layers]


def plain_cache(slots: list[list[tuple[str, int]]]) -> bool:
    """Whether every layer of ``cache_slots`` caches one key and one value (all that
    onnxruntime-genai feeds back)."""
    return all([name for name, _ in layer] == ["r0.k", "r0.v"] for layer in slots)


def slot_label(slot: str) -> str:
    """``r0.k`` -> ``key``, ``r0.twice`` -> ``twice.value``, ``r1.v`` -> ``r1.value``."""
    rnd, kind = slot.split(".", 1)
    kind = {"k": "key", "v": "value"}.get(kind, f"{kind}.value")
    return kind if rnd == "r0" else f"{rnd}.{kind}"


class GraphLayerCache:
    """A LayerCache made of graph tensors: the past comes in, the grown cache goes out."""

    def __init__(self, past: dict[str, torch.Tensor]) -> None:
        self.past = past
        self.present: dict[str, torch.Tensor] = {}

    def extend(self, name: str, x: torch.Tensor) -> torch.Tensor:
        self.present[name] = torch.cat([self.past[name], x], dim=2)
        return self.present[name]


class GraphCache:
    """What GPT.forward reads of a KVCache: per-layer caches and the past length."""

    def __init__(self, layers: list[GraphLayerCache], length: Any) -> None:
        self.layers, self.length = layers, length


class CachedLogitsModel(nn.Module):
    """``(input_ids, past) -> (logits at every new position, present)``: the traced signature;
    the logits of the ``suppressed`` ids are -inf."""

    exact_heads = False  # a past input may have more heads than its slot reads

    def __init__(self, model: nn.Module, suppressed: Sequence[int] = ()) -> None:
        super().__init__()
        self.model = model
        self.slots = cache_slots(model)
        self.suppressed = list(suppressed)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        past: list[torch.Tensor],
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        tensors = iter(past)
        layers = [
            GraphLayerCache({n: next(tensors)[:, :heads] for n, heads in names})
            for names in self.slots
        ]
        cache = GraphCache(layers, past[0].size(2))
        logits = self.model(
            input_ids,
            cache=cache,
            all_logits=True,
            attention_mask=attention_mask,
            position_ids=position_ids,
        )[0]
        if self.suppressed:
            logits = logits.index_fill(-1, torch.tensor(self.suppressed), float("-inf"))
        return logits, [layer.present[n] for layer in layers for n in layer.past]

    def past_heads(self) -> list[int]:
        """The heads of each cache input, in input order."""
        return [heads for names in self.slots for _, heads in names]

    def names(self, prefix: str) -> list[str]:
        return [
            f"{prefix}.{i}.{slot_label(n)}" for i, names in enumerate(self.slots) for n, _ in names
        ]


class PackedCacheModel(nn.Module):
    """``CachedLogitsModel`` with each layer's cache as ``.key`` and ``.value`` of equal heads,
    as onnxruntime-genai allocates and feeds them: the layer's slots concatenated on the heads
    axis (one zero head more where their count is odd) and cut in half. Genai never reads the
    tensors, so which half holds what does not matter."""

    exact_heads = True  # genai allocates exactly num_key_value_heads

    def __init__(self, inner: CachedLogitsModel) -> None:
        super().__init__()
        self.inner = inner
        self.slot_heads = [[heads for _, heads in names] for names in inner.slots]

    def layer_heads(self) -> list[int]:
        """Each layer's heads in its ``.key`` (and its ``.value``)."""
        return [(sum(heads) + 1) // 2 for heads in self.slot_heads]

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        past: list[torch.Tensor],
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        slots = []
        for i, heads in enumerate(self.slot_heads):
            packed = torch.cat(past[2 * i : 2 * i + 2], dim=1)
            bounds = [0, *itertools.accumulate(heads)]
            slots += [packed[:, a:b] for a, b in itertools.pairwise(bounds)]
        logits, present = self.inner(input_ids, attention_mask, position_ids, slots)
        packed_present = []
        layer_present = iter(present)
        for heads, half in zip(self.slot_heads, self.layer_heads(), strict=True):
            packed = torch.cat([next(layer_present) for _ in heads], dim=1)
            if 2 * half > sum(heads):
                packed = torch.cat([packed, torch.zeros_like(packed[:, :1])], dim=1)
            packed_present += [packed[:, :half], packed[:, half:]]
        return logits, packed_present

    def past_heads(self) -> list[int]:
        return [half for half in self.layer_heads() for _ in range(2)]

    def names(self, prefix: str) -> list[str]:
        return [f"{prefix}.{i}.{kind}" for i in range(len(self.slot_heads)) for kind in KV_KINDS]


def rotary_embedding_node(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int = 0
) -> torch.Tensor:
    """``attention.rotate`` as ONNX's RotaryEmbedding (rotate-half, not interleaved): the same
    arithmetic as one node instead of the six its tensor ops export as. ``x`` is [B, H, T, D],
    or [B, T, H * D] with ``heads`` given."""
    half = cos.size(-1) // 2
    if cos.dim() == 2:  # [T, D]: every row at the same positions
        cos, sin = cos.expand(x.size(0), -1, -1), sin.expand(x.size(0), -1, -1)
    else:  # [B, 1, T, D]: per-row positions
        cos, sin = cos.squeeze(1), sin.squeeze(1)
    return torch.onnx.ops.rotary_embedding(x, cos[..., :half], sin[..., :half], num_heads=heads)


_attend = attention.CausalSelfAttention.attend


def attend_node(
    self: attention.CausalSelfAttention,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    ctx: attention.Context,
    slot: str,
    need_weights: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``CausalSelfAttention.attend`` in the graph: RotaryEmbedding and Attention read q, k and v
    as [B, T, heads * D] and Attention extends the cache itself (past in, present out), so a
    round needs no Reshape, Transpose or Concat around it. A round that needs the weights or
    replaces the attention core (Twicing) keeps the four-dimensional path."""
    cache = ctx.layer_cache
    if need_weights or self.hooks["core"] or ctx.capture is not None or ctx.mask is None:
        return _attend(self, q, k, v, ctx, slot, need_weights)
    if ctx.rope is not None:
        q = rotary_embedding_node(q, *ctx.rope, heads=self.n_head)
        k = rotary_embedding_node(k, *ctx.rope, heads=self.n_kv_head)
    key, value = f"{slot}.k", f"{slot}.v"
    y, cache.present[key], cache.present[value], _ = torch.onnx.ops.attention(
        q,
        k,
        v,
        ctx.mask,
        cache.past[key],
        cache.past[value],
        q_num_heads=self.n_head,
        kv_num_heads=self.n_kv_head,
    )
    return y, None


def write_onnx(
    model: nn.Module,
    path: Path,
    config: ModelConfig | None = None,
    suppressed: Sequence[int] = (),
    packed: bool = False,
) -> None:
    """Dynamo export with symbolic batch, seq and past length; onnx.checker must pass.

    The graph records ``config`` (default: the model's; an export passes what its config.json
    reads back as) so that a loader can tell when config.json no longer describes it. The
    ``suppressed`` ids get -inf logits; ``packed``: the cache as onnxruntime-genai feeds it
    (``PackedCacheModel``).
    """
    import onnx

    cfg = model.config
    wrapper: CachedLogitsModel | PackedCacheModel = CachedLogitsModel(model, suppressed)
    if packed:
        wrapper = PackedCacheModel(wrapper)
    wrapper.eval()
    past_heads = wrapper.past_heads()
    # sizes above 1 (torch.export specialises on 0 and 1) whose sum fits the block
    seq_len = past_len = max(2, min(8, cfg.block_size // 2))
    batch = torch.export.Dim("batch", min=1)
    seq = torch.export.Dim("seq", min=1, max=cfg.block_size)
    past_dim = torch.export.Dim("past", min=0, max=cfg.block_size - 1)
    # at least the heads a slot has (the graph reads those), one symbol per count; exactly
    # those in a packed graph
    past_dims = [
        {0: batch, 2: past_dim}
        if wrapper.exact_heads
        else {0: batch, 1: torch.export.Dim(f"heads{h}", min=h), 2: past_dim}
        for h in past_heads
    ]
    ids = torch.arange(2 * seq_len).view(2, -1) % cfg.vocab_size
    mask = torch.ones(2, past_len + seq_len, dtype=torch.long)
    positions = torch.arange(past_len, past_len + seq_len).repeat(2, 1)
    past = [torch.zeros(2, heads, past_len, cfg.head_dim) for heads in past_heads]
    weight_bytes = sum(v.numel() * v.element_size() for v in ckpt.model_state_dict(model).values())
    with (
        warnings.catch_warnings(),
        quiet_logger("torch.onnx"),
        mock.patch.object(attention, "rotate", rotary_embedding_node),  # RoPE as one node
        mock.patch.object(attention.CausalSelfAttention, "attend", attend_node),
    ):
        warnings.simplefilter("ignore")  # deprecation chatter from torch.export internals
        torch.onnx.export(
            wrapper,
            (ids, mask, positions, past),
            str(path),
            dynamo=True,
            opset_version=OPSET,
            input_names=[INPUT, MASK, POSITIONS, *wrapper.names(PAST)],
            output_names=[OUTPUT, *wrapper.names(PRESENT)],
            dynamic_shapes={
                INPUT: {0: batch, 1: seq},
                MASK: {0: batch, 1: torch.export.Dim.AUTO},  # past + seq: inferred
                POSITIONS: {0: batch, 1: seq},
                "past": past_dims,
            },
            external_data=weight_bytes > PROTOBUF_LIMIT,
            verbose=False,
        )
    graph = onnx.load(str(path), load_external_data=False)
    onnx.helper.set_model_props(graph, {CONFIG_KEY: (config or cfg).to_json()})
    onnx.save(graph, str(path))
    onnx.checker.check_model(str(path))


def genai_config(
    model: nn.Module, generation: dict[str, Any], tokenizer_dir: str | None = None
) -> dict[str, Any]:
    """onnxruntime-genai's description of the graph it runs (model.onnx, or model-genai.onnx
    where the cache is not one key and value a layer), with ``generation`` (the folder's
    generation_config.json: special ids, sampling) and, where its tokenizer cannot read the
    folder's tokenizer.json, the folder holding one it reads (``tokenizer_dir``)."""
    cfg = model.config
    wrapper = CachedLogitsModel(model)
    plain = plain_cache(wrapper.slots)
    # every layer caches alike
    kv_heads = cfg.n_kv_head if plain else PackedCacheModel(wrapper).layer_heads()[0]
    names = {kind: f"{PAST}.%d.{kind}" for kind in KV_KINDS}
    tokenizer = {} if tokenizer_dir is None else {"tokenizer_dir": tokenizer_dir}
    return {
        "model": {
            **tokenizer,
            "bos_token_id": generation.get("bos_token_id"),
            "eos_token_id": generation.get("eos_token_id"),
            "pad_token_id": generation.get("pad_token_id"),
            "context_length": cfg.block_size,
            "vocab_size": cfg.vocab_size,
            # genai's plain decoder-only family: input ids, mask, positions and a KV cache
            "type": "llama",
            "decoder": {
                "filename": ONNX_FILE if plain else GENAI_ONNX_FILE,
                "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
                "head_size": cfg.head_dim,
                "hidden_size": cfg.n_embd,
                "num_attention_heads": cfg.n_head,
                "num_hidden_layers": cfg.n_layer,
                "num_key_value_heads": kv_heads,
                "inputs": {
                    "input_ids": INPUT,
                    "attention_mask": MASK,
                    "position_ids": POSITIONS,
                    "past_key_names": names["key"],
                    "past_value_names": names["value"],
                },
                "outputs": {
                    "logits": OUTPUT,
                    "present_key_names": f"{PRESENT}.%d.key",
                    "present_value_names": f"{PRESENT}.%d.value",
                },
            },
        },
        "search": {
            "do_sample": generation.get("do_sample", False),
            "temperature": generation.get("temperature", 1.0),
            "top_k": generation.get("top_k", 50),
            "top_p": 1.0,
            "max_length": cfg.block_size,
            "min_length": 0,
            "num_beams": 1,
            "num_return_sequences": 1,
            "past_present_share_buffer": False,  # the graph concatenates: present is past + new
            "repetition_penalty": 1.0,
            "length_penalty": 1.0,
            "diversity_penalty": 0.0,
            "no_repeat_ngram_size": 0,
            "early_stopping": True,
        },
    }


def check_recorded_config(path: Path, recorded: str | None, config: ModelConfig) -> None:
    """Refuse a graph whose recorded ModelConfig differs from ``config`` (its config.json):
    onnxruntime would run it anyway, with the folder's tokenizer and limits describing another
    model."""
    if recorded is None:
        raise AttnlabError(
            f"{path} does not record its model config (an older export); run `attnlab export` again"
        )
    try:
        graph = ModelConfig.from_dict(json.loads(recorded)).to_dict()
    except (AttnlabError, ValueError, TypeError) as e:
        raise AttnlabError(f"{path}: its recorded model config is unreadable ({e})") from None
    wanted = config.to_dict()
    diffs = [f"{k} {wanted[k]!r} vs {graph[k]!r}" for k in wanted if wanted[k] != graph[k]]
    if diffs:
        raise AttnlabError(
            f"{path.parent / ckpt.CONFIG} does not describe {path.name} ({', '.join(diffs)}: "
            "config.json vs the graph); export the model again"
        )


def untie_transposed_weights(graph: Any) -> None:
    """Store each weight that the graph reads through a Transpose transposed, and gather the
    embedding rows from that copy: one table either way round, no Transpose of it at run time.

    A tied LM head reads the embedding table through a Transpose. onnxruntime folds that away
    in float32, but once the table is int8 it would dequantize and transpose the whole table at
    every step and multiply in float32. Stored as [E, V], the head is an integer matmul like
    every other projection, and the embedding lookup gathers columns of the same int8 table.
    """
    from onnx import helper, numpy_helper

    weights = {w.name: w for w in graph.initializer}
    for node in list(graph.node):
        if node.op_type != "Transpose" or node.input[0] not in weights:
            continue
        name = node.input[0]
        array = numpy_helper.to_array(weights[name])
        if array.ndim != 2:
            continue
        head = node.output[0]
        graph.initializer.append(numpy_helper.from_array(array.T.copy(), head))
        graph.node.remove(node)
        for gather in [
            n for n in graph.node if n.op_type == "Gather" and n.input[:2] == [name, INPUT]
        ]:
            # rows of [V, E] are columns of [E, V]: gather [E, B, T] on axis 1, then E last
            at = list(graph.node).index(gather)
            graph.node.remove(gather)
            columns = f"{gather.output[0]}_columns"
            graph.node.insert(at, helper.make_node("Gather", [head, INPUT], [columns], axis=1))
            graph.node.insert(
                at + 1, helper.make_node("Transpose", [columns], gather.output, perm=[1, 2, 0])
            )
        if not any(name in n.input for n in graph.node):
            graph.initializer.remove(weights[name])


def write_onnx_int8(path_fp32: Path, path: Path) -> None:
    """onnxruntime dynamic quantization: MatMul and Gather (embedding) weights to QInt8."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    source: Any = onnx.load(str(path_fp32), load_external_data=False)
    if any(w.data_location == onnx.TensorProto.EXTERNAL for w in source.graph.initializer):
        source = str(path_fp32)  # too large to hold as one protobuf: quantize from the file
    else:
        untie_transposed_weights(source.graph)
    with quiet_logger(""):  # onnxruntime logs its pre-processing advice on the root logger
        # onnxruntime would take opset 23's Attention for its own contrib op of that name
        quantize_dynamic(
            source, str(path), weight_type=QuantType.QInt8, op_types_to_quantize=QUANTIZED
        )


def ort_errors() -> tuple[type[Exception], ...]:
    """What onnxruntime raises for a file it cannot load (its own classes, not RuntimeError)."""
    from onnxruntime.capi import onnxruntime_pybind11_state as state

    names = ("Fail", "InvalidArgument", "InvalidGraph", "InvalidProtobuf", "NoSuchFile")
    return tuple(getattr(state, name) for name in names if hasattr(state, name))


def load_error(path: Path, error: Exception, version: str) -> AttnlabError:
    """One line for a graph onnxruntime ``version`` cannot load: its reason, and, when that
    onnxruntime is older than the exports need, which one they need."""
    text = str(error).strip()
    reason = _ORT_PREFIX.sub("", text.splitlines()[0]) if text else type(error).__name__
    hint = ""
    if tuple(int(v) for v in re.findall(r"\d+", version)[:2]) < MIN_ONNXRUNTIME:
        hint = f"; attnlab's exports need onnxruntime >= {'.'.join(map(str, MIN_ONNXRUNTIME))}"
    return AttnlabError(f"onnxruntime {version} cannot load {path} ({reason}){hint}")


class OnnxCache:
    """The cache between onnxruntime calls: the last ``present.*`` arrays and their length."""

    def __init__(self) -> None:
        self.past: dict[str, np.ndarray] | None = None
        self.length = 0


class OnnxLM:
    """An exported ONNX graph behind the calls attnlab.model.generation makes of a model.

    ``new_cache`` and ``__call__(idx, cache=...)`` mirror GPT's, so ``stream`` decodes with the
    graph's KV cache (and recomputes the window once the context outgrows block_size).
    """

    def __init__(self, path: str | Path, config: ModelConfig, threads: int | None = None) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        if threads is not None:
            options.intra_op_num_threads = threads
        self.path, self.config = Path(path), config
        try:
            self.session = ort.InferenceSession(
                str(path), options, providers=["CPUExecutionProvider"]
            )
        except ort_errors() as e:  # a damaged file, or an onnxruntime older than the graph
            raise load_error(self.path, e, ort.__version__) from None
        metadata = self.session.get_modelmeta().custom_metadata_map
        check_recorded_config(self.path, metadata.get(CONFIG_KEY), config)
        self.past = [i for i in self.session.get_inputs() if i.name.startswith(PAST)]
        if not self.past:
            raise AttnlabError(
                f"{path} has no KV cache inputs (an older export); run `attnlab export` again"
            )
        # what __call__ feeds, by name: a graph asking for others failed in onnxruntime's run
        names = sorted(i.name for i in self.session.get_inputs())
        if set(names) != {INPUT, MASK, POSITIONS, *(i.name for i in self.past)}:
            raise AttnlabError(
                f"{path} takes the inputs {', '.join(names)}, not {INPUT}, {MASK}, {POSITIONS} "
                f"and {PAST}.*: not a graph attnlab exported; export the model with "
                "`attnlab export`"
            )

    def new_cache(self) -> OnnxCache:
        return OnnxCache()

    def __call__(
        self, idx: torch.Tensor, cache: OnnxCache | None = None
    ) -> tuple[torch.Tensor, None]:
        """Logits [B, T, V] of ids [B, T] after ``cache`` (none: from position 0), on the CPU."""
        ids = idx.detach().cpu().numpy().astype("int64")
        b, t = ids.shape
        past = cache.past if cache is not None and cache.past is not None else None
        if past is None:
            # "headsN" takes N or more (no slot has more than n_head); an older graph its own
            n_head = self.config.n_head
            past = {
                i.name: np.zeros(
                    (b, i.shape[1] if isinstance(i.shape[1], int) else n_head, 0, i.shape[3]),
                    dtype=np.float32,
                )
                for i in self.past
            }
        start = cache.length if cache is not None else 0
        feeds = {
            INPUT: ids,
            MASK: np.ones((b, start + t), dtype=np.int64),
            POSITIONS: np.tile(np.arange(start, start + t, dtype=np.int64), (b, 1)),
        }
        out = self.session.run(None, {**feeds, **past})
        if cache is not None:
            cache.past = {i.name: a for i, a in zip(self.past, out[1:], strict=True)}
            cache.length += t
        return torch.from_numpy(out[0]), None

    def logits(self, idx: torch.Tensor) -> torch.Tensor:
        """All-position logits [B, T, V] of ids [B, T], no cache."""
        return self(idx)[0]

    def generate(self, idx: torch.Tensor, max_new_tokens: int, **kwargs: Any) -> torch.Tensor:
        """Like GPT.generate (same sampling code, same KV cache use)."""
        return torch.cat([idx.cpu(), *stream(self, idx.cpu(), max_new_tokens, **kwargs)], dim=1)


def load_onnx(
    path: str | Path, int8: bool = False, threads: int | None = None
) -> tuple[OnnxLM, Any | None]:
    """(OnnxLM, tokenizer or None) from an exported folder's model.onnx (or model-int8.onnx);
    ``threads``: onnxruntime's intra-op threads (None: its default, one per physical core)."""
    folder = Path(path).expanduser()
    file = folder / (INT8_FILE if int8 else ONNX_FILE)
    if not folder.is_dir():
        raise AttnlabError(
            f"{folder} does not exist" if not folder.exists() else f"{folder} is not a folder"
        )
    if not file.is_file():
        raise AttnlabError(
            f"{folder} has no {file.name}; run `attnlab export {folder} --out DIR` first"
        )
    tokenizer = (
        Tokenizer.load(folder / ckpt.TOKENIZER) if (folder / ckpt.TOKENIZER).is_file() else None
    )
    config = ckpt.read_model_config(folder)
    # as the torch path does: onnxruntime would fail mid-generation on an id past the table
    ckpt.check_tokenizer_fits(tokenizer, config, folder / ckpt.TOKENIZER)
    model = OnnxLM(file, config, threads)
    # after the checks that say what is wrong with a graph: the rest (an int8 graph copied over
    # model.onnx, another tokenizer of the same size) is a file the export did not write
    check_manifest(folder)
    return model, tokenizer
