"""The one backbone: nanoGPT's GPT, with components chosen by config and mechanisms as plug-ins.

With every mechanism off and nanoGPT's components (LayerNorm, learned positions, GELU MLP,
Pre-LN) the modules are created in nanoGPT's order and initialised with its scheme, so under the
same ``torch.manual_seed`` the state_dict, logits, loss and gradients are bit-identical to
karpathy/nanoGPT's model.py (tests/model/test_nanogpt_fixtures.py checks this against its own numbers).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from attnlab.config import ModelConfig
from attnlab.model.attention import CausalSelfAttention, Context, KVCache, padding_mask
from attnlab.model.generation import generate
from attnlab.model.layers import Linear, Rotary, make_mlp, make_norm
from attnlab.model.mechanisms import attach, attention_passes


class Block(nn.Module):
    """Attention then one or two feed-forward sub-layers, each with its own residual."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.pre_norm = config.norm_placement == "pre"
        self.ln_1 = make_norm(config)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = make_norm(config)
        self.mlp = make_mlp(config)
        self.deep = config.ffn_sublayers == 2  # the QKVE seed's "deep SwiGLU"
        if self.deep:
            self.ln_3 = make_norm(config)
            self.mlp2 = make_mlp(config)
        self.hooks = attach(self, config, "block")
        # a block without them skips the call (one Python call fewer per layer and decoded token)
        self.ffn_hooks = bool(self.hooks["mlp_input"] or self.hooks["state"])

    def _ffn_input(self, h: torch.Tensor, ctx: Context) -> torch.Tensor:
        """Run the block-level hooks on the FFN input h: injections read the state, then it updates."""
        updated = h
        for part in self.hooks["mlp_input"]:
            # back in the dtype it was given, as every attention hook's (attention.as_given)
            updated = part.adjust_mlp_input(updated, ctx).to(updated.dtype)
        for part in self.hooks["state"]:
            part.update_state(h, ctx)
        return updated

    def forward(self, x: torch.Tensor, ctx: Context) -> torch.Tensor:
        m = self._modules  # m["attn"] is self.attn without a failed lookup first (see layers.py)
        if self.pre_norm:
            x = x + m["attn"](m["ln_1"](x), ctx)
            h = m["ln_2"](x)
            x = x + m["mlp"](self._ffn_input(h, ctx) if self.ffn_hooks else h)
            if self.deep:
                x = x + m["mlp2"](m["ln_3"](x))
            return x
        # Post-LN (original Transformer): normalise after each residual add
        x = m["ln_1"](x + m["attn"](x, ctx))
        x = m["ln_2"](x + m["mlp"](self._ffn_input(x, ctx) if self.ffn_hooks else x))
        if self.deep:
            x = m["ln_3"](x + m["mlp2"](x))
        return x


class GPT(nn.Module):
    """A decoder-only language model; ``forward(idx, targets)`` returns ``(logits, loss)``."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        modules: dict[str, nn.Module] = {"wte": nn.Embedding(config.vocab_size, config.n_embd)}
        if config.pos == "learned":
            modules["wpe"] = nn.Embedding(config.block_size, config.n_embd)
        modules["drop"] = nn.Dropout(config.dropout)
        modules["h"] = nn.ModuleList([Block(config) for _ in range(config.n_layer)])
        modules["ln_f"] = make_norm(config)
        self.transformer = nn.ModuleDict(modules)
        self.lm_head = Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_embeddings:
            # nanoGPT ties this way round; its init then draws wte's values a second time via lm_head
            self.transformer.wte.weight = self.lm_head.weight
        self.rotary = (
            Rotary(config.head_dim, config.block_size, config.rope_theta)
            if config.pos == "rope"
            else None
        )
        self.apply(self._init_weights)
        # GPT-2's scaled init of the projections that write into the residual stream
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))
        for module in self.modules():
            if hasattr(module, "init_weights"):
                module.init_weights()

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def get_num_params(self, non_embedding: bool = True) -> int:
        """Parameter count (shared tensors once); nanoGPT subtracts the position table by default."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding and "wpe" in self.transformer:
            n -= self.transformer.wpe.weight.numel()
        return n

    def forward(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        *,
        cache: KVCache | None = None,
        stats: dict[str, torch.Tensor] | None = None,
        capture: dict[str, Any] | None = None,
        all_logits: bool = False,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logits for every position when ``targets`` are given (or ``all_logits``), else the last.

        ``cache`` continues a KV-cached sequence; ``stats`` collects mechanism statistics;
        ``capture`` collects attention weights and per-round outputs for analyses.
        Padded batches (transformers, ONNX) pass ``attention_mask`` [B, cached + T] (0 = padding)
        and ``position_ids`` [B, T]; without them positions run on from the cache length.
        """
        _, t = idx.size()
        start = cache.length if cache is not None else 0
        if start + t > self.config.block_size:
            raise ValueError(
                f"cannot forward {start + t} positions, block_size is {self.config.block_size}"
            )
        tr = self.transformer  # one submodule lookup instead of five (each costs a dict miss)
        x = tr.wte(idx)
        if "wpe" in tr:
            wpe = tr.wpe
            # consecutive positions are a slice of the table: the lookup without an index tensor
            x = x + (wpe.weight[start : start + t] if position_ids is None else wpe(position_ids))
        if self.training:  # dropout is the identity in eval mode
            x = tr.drop(x)
        rope = self.rotary(start, t, position_ids) if self.rotary is not None else None
        ctx = Context(start=start, cache=cache, rope=rope, stats=stats, capture=capture)
        if attention_mask is not None:
            ctx.mask = padding_mask(attention_mask, t)
        for i, block in enumerate(tr.h):
            ctx.layer = i
            x = block(x, ctx)
        if cache is not None:
            cache.length += t
        x = tr.ln_f(x)
        if targets is not None:
            logits = self.lm_head(x)
            loss = F.cross_entropy(
                logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1
            )
            return logits, loss
        # inference: only the last position's logits unless asked (a view, no copy: a decoding
        # step already has one position)
        return self.lm_head(x if all_logits or t == 1 else x[:, -1:, :]), None

    def materialise(self, device: str | torch.device) -> GPT:
        """Storage on ``device`` for a model built on the meta device (values undefined until
        loaded), with the embedding tie and the non-persistent rotary tables restored: the
        tables are derived from the config, so no state_dict carries them."""
        self.to_empty(device=device)
        if self.config.tie_embeddings and self.lm_head.weight is not self.transformer.wte.weight:
            self.transformer.wte.weight = self.lm_head.weight
        if self.rotary is not None:
            c = self.config
            self.rotary = Rotary(c.head_dim, c.block_size, c.rope_theta).to(device)
        return self

    def unreachable_parameters(self) -> list[str]:
        """Names of the parameters no loss reaches (they never get a gradient): the last block's
        purpose gate, say, whose M no block reads. Found by one two-token forward and backward
        in eval mode (no dropout draws from the global RNG); ``.grad`` is left untouched.
        DDP must be told of them, or it waits for their gradients at the next step."""
        named = [(n, p) for n, p in self.named_parameters() if p.requires_grad]
        was_training = self.training
        self.eval()
        try:
            device = named[0][1].device
            idx = torch.zeros((1, min(2, self.config.block_size)), dtype=torch.long, device=device)
            _, loss = self(idx, idx)
            grads = torch.autograd.grad(loss, [p for _, p in named], allow_unused=True)
        finally:
            self.train(was_training)
        return [n for (n, _), g in zip(named, grads, strict=True) if g is None]

    def new_cache(self) -> KVCache:
        return KVCache(self.config.n_layer, self.config.block_size)

    def configure_optimizers(
        self,
        weight_decay: float,
        learning_rate: float,
        betas: tuple[float, float],
        device_type: str,
    ) -> torch.optim.AdamW:
        """AdamW with nanoGPT's groups: matrices and embeddings decay, biases and norms don't."""
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]
        fused = device_type == "cuda" and "fused" in inspect.signature(torch.optim.AdamW).parameters
        return torch.optim.AdamW(
            groups, lr=learning_rate, betas=betas, **({"fused": True} if fused else {})
        )

    def flops_per_token(self, seq_len: int | None = None) -> float:
        """Training FLOPs per token: 6N for the matmuls plus 12 L H T Dh for attention (PaLM app. B).

        Mechanisms that run attention more than once per layer (boosting's rounds, twicing's two
        passes, each round twiced when both) multiply the attention term (their SPEC says by what).
        """
        cfg = self.config
        t = seq_len or cfg.block_size
        attn = 12 * cfg.n_layer * cfg.n_head * cfg.head_dim * t * attention_passes(cfg)
        return 6 * self.get_num_params(non_embedding=True) + attn

    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        eos_token_id: int | None = None,
        use_cache: bool = True,
        generator: torch.Generator | None = None,
        suppress_tokens: Sequence[int] = (),
        vocab_limit: int | None = None,
    ) -> torch.Tensor:
        """The prompt ``idx`` [B, T] followed by up to max_new_tokens sampled tokens.

        temperature 0 is greedy; top_k / top_p filter before sampling; rows that produce
        ``eos_token_id`` stop (and are padded with it until every row has); the KV cache gives
        the same tokens as recomputing the whole context (see attnlab.model.generation);
        ``suppress_tokens`` are never drawn, nor ids from ``vocab_limit`` up (a vocabulary
        padded beyond its tokenizer's).
        """
        return generate(
            self,
            idx,
            max_new_tokens,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            eos_token_id=eos_token_id,
            use_cache=use_cache,
            generator=generator,
            suppress_tokens=suppress_tokens,
            vocab_limit=vocab_limit,
        )
