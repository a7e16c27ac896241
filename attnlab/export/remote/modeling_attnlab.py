"""An attnlab model for transformers: ``AttnlabForCausalLM`` (written by ``attnlab export``).

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
from transformers import GenerationMixin, PreTrainedModel
from transformers.cache_utils import Cache
from transformers.modeling_outputs import CausalLMOutputWithPast

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


class AttnlabForCausalLM(PreTrainedModel, GenerationMixin):
    """attnlab's GPT (with its mechanisms) as a transformers causal language model."""

    config_class = AttnlabConfig
    base_model_prefix = "transformer"
    main_input_name = "input_ids"
    _tied_weights_keys = {"lm_head.weight": "transformer.wte.weight"}  # noqa: RUF012

    def __init__(self, config: AttnlabConfig) -> None:
        super().__init__(config)
        model_config = attnlab_module("config").ModelConfig
        fields = {name: getattr(config, name) for name in FIELDS}
        self.gpt_class = attnlab_module("model.gpt").GPT
        gpt = self.gpt_class(model_config.from_dict(fields))
        # GPT's own modules, so parameter names (and model.safetensors) are attnlab's
        self.transformer, self.lm_head, self.rotary = gpt.transformer, gpt.lm_head, gpt.rotary
        self.post_init()

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

    def get_output_embeddings(self):
        return self.lm_head

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        use_cache: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        """Logits of every position; a cache (``cache`` or ``past_key_values``) continues it."""
        cache = kwargs.pop("cache", None)
        if cache is None:  # an empty Cache is falsy: no `or` here
            cache = kwargs.pop("past_key_values", None)
        if attention_mask is not None and bool(attention_mask.all()):
            attention_mask = position_ids = None  # no padding: attnlab's plain causal path
        elif attention_mask is not None and position_ids is None:
            positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
            position_ids = positions[:, -input_ids.size(1) :]
        use_cache = getattr(self.config, "use_cache", True) if use_cache is None else use_cache
        if cache is None and use_cache:
            cache = AttnlabCache(self.gpt_class.new_cache(self))
        kv = cache.kv if isinstance(cache, AttnlabCache) else None
        logits, _ = self.gpt_class.forward(
            self,
            input_ids,
            cache=kv,
            all_logits=True,
            attention_mask=attention_mask,
            position_ids=position_ids,
        )
        loss = None
        if labels is not None:
            loss = torch.nn.functional.cross_entropy(
                logits[:, :-1].reshape(-1, logits.size(-1)),
                labels[:, 1:].reshape(-1),
                ignore_index=-100,
            )
        return CausalLMOutputWithPast(loss=loss, logits=logits, **{_CACHE_FIELD: cache})
