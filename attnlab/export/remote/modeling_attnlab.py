"""attnlab models for transformers: ``AttnlabForCausalLM`` and
``AttnlabForSequenceClassification`` (written by ``attnlab export``).

Needs torch and transformers only. The model is attnlab's own code (attnlab/errors.py,
attnlab/config.py and attnlab/model/), embedded verbatim in SOURCES and imported under a
private package name, so its logits are attnlab's and no attnlab installation is needed.
attnlab's KV cache (keys, values and the per-token state some mechanisms keep) travels through
``generate`` as an ``AttnlabCache``.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.abc
import importlib.util
import re
import sys

import torch
from torch.utils.checkpoint import checkpoint
from transformers import GenerationMixin, PreTrainedModel
from transformers.cache_utils import Cache
from transformers.modeling_outputs import CausalLMOutputWithPast, SequenceClassifierOutputWithPast

from .configuration_attnlab import FIELDS, AttnlabConfig

SOURCES: dict = {}  # path under attnlab/ -> source text, written in by `attnlab export`
PACKAGE = "_attnlab_" + hashlib.sha256(repr(sorted(SOURCES.items())).encode()).hexdigest()[:12]
_ABSOLUTE_IMPORT = re.compile(r"^(\s*)(from|import) attnlab\b", re.MULTILINE)
# transformers 5 names the cache `cache`, transformers 4 `past_key_values`
_CACHE_FIELD = (
    "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"
)


class _Bundle(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports SOURCES as the package PACKAGE, with attnlab's absolute imports renamed to it."""

    def _path(self, fullname: str) -> str | None:
        if fullname != PACKAGE and not fullname.startswith(PACKAGE + "."):
            return None
        rel = fullname[len(PACKAGE) :].lstrip(".").replace(".", "/")
        if not rel:
            return "__init__.py"
        return next((p for p in (f"{rel}/__init__.py", f"{rel}.py") if p in SOURCES), None)

    def find_spec(self, fullname, path=None, target=None):
        found = self._path(fullname)
        if found is None:
            return None
        return importlib.util.spec_from_loader(
            fullname, self, is_package=found.endswith("__init__.py")
        )

    def create_module(self, spec):
        return None

    def exec_module(self, module) -> None:
        path = self._path(module.__name__)
        source = _ABSOLUTE_IMPORT.sub(rf"\g<1>\g<2> {PACKAGE}", SOURCES.get(path, ""))
        exec(compile(source, f"attnlab/{path}", "exec"), module.__dict__)


if not any(isinstance(finder, _Bundle) for finder in sys.meta_path):
    sys.meta_path.append(_Bundle())


def attnlab_module(name: str):
    """A module of the embedded attnlab, e.g. ``attnlab_module("model.gpt")``."""
    return importlib.import_module(f"{PACKAGE}.{name}")


class AttnlabCache(Cache):
    """attnlab's KVCache behind transformers' Cache interface (it grows in place)."""

    def __init__(self, kv) -> None:
        super().__init__(layers=[])
        self.kv = kv

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.kv.length

    @property
    def is_compileable(self) -> bool:
        return False

    @property
    def is_croppable(self) -> bool:
        return False


class CheckpointingBlock(attnlab_module("model.gpt").Block):
    """attnlab's Block that, while training with gradient checkpointing on (transformers'
    ``gradient_checkpointing_enable()`` sets the flag), keeps no activations and recomputes them
    in the backward pass."""

    gradient_checkpointing = False

    def forward(self, x, ctx):
        if not (self.gradient_checkpointing and self.training and torch.is_grad_enabled()):
            return super().forward(x, ctx)
        layer, state = ctx.layer, dict(ctx.state)

        def block(x):
            # the recomputation runs after later blocks moved ctx on: give it this block's
            ctx.layer, ctx.state = layer, dict(state)
            return super(CheckpointingBlock, self).forward(x, ctx)

        # non-reentrant: mechanism state from earlier blocks reaches the block through ctx, not
        # as an argument, and must still get its gradient
        return checkpoint(block, x, use_reentrant=False)


class AttnlabPreTrainedModel(PreTrainedModel):
    """attnlab's GPT backbone (``transformer``, ``rotary``) under transformers' conventions:
    hidden states, gradient checkpointing, padding masks."""

    config_class = AttnlabConfig
    base_model_prefix = "transformer"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True

    def _build(self, config: AttnlabConfig):
        """attnlab's GPT for ``config``; its own modules become ours, so parameter names (and
        model.safetensors) are attnlab's."""
        model_config = attnlab_module("config").ModelConfig
        fields = {name: getattr(config, name) for name in FIELDS}
        self.gpt_class = attnlab_module("model.gpt").GPT
        gpt = self.gpt_class(model_config.from_dict(fields))
        self.transformer, self.rotary = gpt.transformer, gpt.rotary
        for block in self.transformer.h:
            block.__class__ = CheckpointingBlock
        return gpt

    @property
    def _checkpointing(self) -> bool:
        return any(block.gradient_checkpointing for block in self.transformer.h)

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the forward pass makes an AttnlabCache instead

    def _init_weights(self, module) -> None:
        """Rebuild RoPE tables (non-persistent buffers); every weight comes from the file."""
        rotary_class = attnlab_module("model.layers").Rotary
        if isinstance(module, rotary_class):
            fresh = rotary_class(module.cos.size(-1), module.cos.size(0), self.config.rope_theta)
            module.cos, module.sin = (
                fresh.cos.to(module.cos.device),
                fresh.sin.to(module.sin.device),
            )

    def get_input_embeddings(self):
        return self.transformer.wte

    def set_input_embeddings(self, value) -> None:
        self.transformer.wte = value

    def _backbone(self, input_ids, attention_mask, position_ids, cache, output_hidden_states):
        """(GPT.forward's output of every position, hidden states or None): the input of each
        block and the final norm's output, as transformers' GPT-2 returns them."""
        if attention_mask is not None and bool(attention_mask.all()):
            attention_mask = position_ids = None  # no padding: attnlab's plain causal path
        elif attention_mask is not None and position_ids is None:
            positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
            position_ids = positions[:, -input_ids.size(1) :]
        hidden: list[torch.Tensor] = []
        hooks = []
        if output_hidden_states:
            hooks = [
                block.register_forward_pre_hook(lambda _, args: hidden.append(args[0]))
                for block in self.transformer.h
            ]
            hooks.append(
                self.transformer.ln_f.register_forward_hook(lambda *a: hidden.append(a[2]))
            )
        try:
            out, _ = self.gpt_class.forward(
                self,
                input_ids,
                cache=cache.kv if isinstance(cache, AttnlabCache) else None,
                all_logits=True,
                attention_mask=attention_mask,
                position_ids=position_ids,
            )
        finally:
            for hook in hooks:
                hook.remove()
        return out, tuple(hidden) if output_hidden_states else None


class AttnlabForCausalLM(AttnlabPreTrainedModel, GenerationMixin):
    """attnlab's GPT (with its mechanisms) as a transformers causal language model."""

    _tied_weights_keys = {"lm_head.weight": "transformer.wte.weight"}  # noqa: RUF012

    def __init__(self, config: AttnlabConfig) -> None:
        super().__init__(config)
        self.lm_head = self._build(config).lm_head
        self.post_init()

    def get_output_embeddings(self):
        return self.lm_head

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        use_cache: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        logits_to_keep: int = 0,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        """Logits of every position (the last ``logits_to_keep`` when that is not 0); a cache
        (``cache`` or ``past_key_values``) continues it."""
        cache = kwargs.pop("cache", None)
        if cache is None:  # an empty Cache is falsy: no `or` here
            cache = kwargs.pop("past_key_values", None)
        logits_to_keep = kwargs.pop("num_logits_to_keep", logits_to_keep)  # transformers 4.4x
        if output_hidden_states is None:
            output_hidden_states = getattr(self.config, "output_hidden_states", False)
        use_cache = getattr(self.config, "use_cache", True) if use_cache is None else use_cache
        if self._checkpointing and self.training:
            use_cache = False  # a recomputed block would extend the cache a second time
        if cache is None and use_cache:
            cache = AttnlabCache(self.gpt_class.new_cache(self))
        logits, hidden = self._backbone(
            input_ids, attention_mask, position_ids, cache, output_hidden_states
        )
        if logits_to_keep:
            logits = logits[:, -logits_to_keep:]
        loss = None
        if labels is not None:
            loss = torch.nn.functional.cross_entropy(
                logits[:, :-1].reshape(-1, logits.size(-1)),
                labels[:, 1:].reshape(-1),
                ignore_index=-100,
            )
        return CausalLMOutputWithPast(
            loss=loss, logits=logits, hidden_states=hidden, **{_CACHE_FIELD: cache}
        )


class AttnlabForSequenceClassification(AttnlabPreTrainedModel):
    """The backbone with a linear ``score`` head on the last real token (GPT-2's recipe: the
    last token that is not ``pad_token_id``; ``AutoModelForSequenceClassification``)."""

    def __init__(self, config: AttnlabConfig) -> None:
        super().__init__(config)
        self._build(config)
        self.lm_head = torch.nn.Identity()  # GPT.forward then returns the final hidden states
        self.num_labels = config.num_labels
        self.score = torch.nn.Linear(config.n_embd, config.num_labels, bias=False)
        self.post_init()

    def _init_weights(self, module) -> None:
        super()._init_weights(module)
        if module is getattr(self, "score", None):  # the one weight no causal LM file holds
            torch.nn.init.normal_(module.weight, std=0.02)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> SequenceClassifierOutputWithPast:
        """Scores [batch, num_labels]; ``labels`` give the loss (regression for one label,
        cross-entropy otherwise, as transformers' default problem types)."""
        hidden_last, hidden = self._backbone(
            input_ids, attention_mask, position_ids, None, bool(output_hidden_states)
        )
        scores = self.score(hidden_last)
        pad = self.config.pad_token_id
        if pad is None:
            last = torch.full((input_ids.size(0),), input_ids.size(1) - 1, device=input_ids.device)
        else:  # the rightmost real token, whichever side the padding is on
            positions = torch.arange(input_ids.size(1), device=input_ids.device)
            last = ((input_ids != pad).long() * positions).argmax(-1)
        pooled = scores[torch.arange(input_ids.size(0), device=scores.device), last]
        loss = None
        if labels is not None:
            if self.num_labels == 1:
                loss = torch.nn.functional.mse_loss(pooled.squeeze(-1), labels.to(pooled.dtype))
            else:
                loss = torch.nn.functional.cross_entropy(pooled, labels.view(-1))
        return SequenceClassifierOutputWithPast(loss=loss, logits=pooled, hidden_states=hidden)
