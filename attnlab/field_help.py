"""One line of meaning for every backbone ModelConfig and every TrainConfig field, and the names
other tools use.

`attnlab presets --fields` prints these beside each field's type and default; a mechanism's own
fields are described in its SPEC (attnlab.model.mechanisms), and a test keeps the two tables and
the SPECs in step with the dataclasses. ALIASES maps spellings from nanoGPT's neighbours (litgpt,
transformers, Lightning) to ours, for the did-you-mean of an unknown key.
"""

from __future__ import annotations

MODEL_HELP: dict[str, str] = {
    "block_size": "context length in tokens (positions the model attends over)",
    "vocab_size": "vocabulary size; char presets take it from the data folder",
    "n_layer": "number of transformer blocks",
    "n_head": "attention heads per block",
    "n_embd": "width of the residual stream (model dimension)",
    "dropout": "dropout probability on embeddings, attention and residual branches",
    "bias": "biases in Linear layers and LayerNorms",
    "norm": "normalisation layer",
    "norm_eps": "epsilon of the norm (null: 1e-5 for layernorm, 1e-6 for rmsnorm)",
    "norm_placement": "pre: norm before each sub-layer (GPT-2); post: after the residual add",
    "pos": "position encoding: a learned table or rotary (RoPE)",
    "rope_theta": "RoPE base frequency",
    "mlp": "feed-forward type",
    "d_ffn": "feed-forward hidden width (null: 4 * n_embd)",
    "ffn_sublayers": "feed-forward sub-layers per block (2: the QKVE seed's deep SwiGLU)",
    "n_kv_head": "key/value heads (null: n_head; fewer = grouped-query attention)",
    "tie_embeddings": "share the token embedding with the output projection",
}

TRAIN_HELP: dict[str, str] = {
    "max_iters": "optimizer steps to train",
    "batch_size": "sequences per micro-batch, global: under torchrun each rank runs "
    "batch_size / world_size of them",
    "gradient_accumulation_steps": "micro-batches per optimizer step",
    "learning_rate": "peak learning rate (AdamW)",
    "min_lr": "learning rate at the end of the cosine decay",
    "warmup_iters": "steps of linear warmup from 0 to learning_rate",
    "lr_decay_iters": "step where the cosine decay reaches min_lr (null: max_iters)",
    "decay_lr": "false: constant learning_rate, no warmup or decay",
    "weight_decay": "AdamW weight decay on matrices (not on biases, norms)",
    "beta1": "AdamW beta1",
    "beta2": "AdamW beta2",
    "grad_clip": "clip the global gradient norm to this (0: no clipping)",
    "eval_interval": "steps between validation evaluations (and best checkpoints)",
    "eval_iters": "validation batches per evaluation (the same for every run)",
    "log_interval": "steps between log lines / metrics.csv rows",
    "ckpt_interval": "steps between latest/ checkpoints (null: eval_interval)",
    "seed": "seed of the model init and the training batches",
    "eval_seed": "seed of the validation batches",
    "eval_batches": "fixed: one set of validation batches drawn once (the least noisy paired "
    "comparison); fresh: new batches at each evaluation, nanoGPT's way, keyed by the iteration "
    "(every run scores the same ones at the same step; a resume draws them again)",
    "device": "auto (cuda, then mps, then cpu), or a torch device name",
    "dtype": "autocast precision (auto: bfloat16 on a GPU with native bf16, float16 with a loss "
    "scaler on older GPUs, float32 on CPU and MPS)",
    "compile": "torch.compile the model before training",
    "max_seconds": "stop after this many seconds of training (null: no limit)",
    "nan_policy": "on a non-finite loss or gradient: stop, or skip the step (under float16 "
    "an overflowing gradient is the loss scaler's to skip)",
    "max_bad_steps": "with nan_policy=skip: stop after this many bad steps in a row",
    "fsdp": "shard parameters with FSDP under torchrun (else DDP)",
    "hsdp": "with fsdp: shard each model over the ranks of one node and replicate it across "
    "nodes (HSDP), so the per-layer all-gathers stay inside a node",
    "sharded_checkpoints": "with fsdp: every rank writes its own shards of latest/ and best/ "
    "(torch.distributed.checkpoint) instead of gathering them on rank 0; they resume on any "
    "number of ranks and export as usual",
    "dist_timeout": "seconds a rank waits for its peers in a collective under torchrun before "
    "it stops the run (a hung or lost peer)",
    "tensorboard": "also write TensorBoard scalars to RUN/tb",
    "trackers": "where metric rows go, comma-separated: csv (RUN/metrics.csv, always), "
    "tensorboard, wandb, mlflow (pip install 'attnlab[track]')",
    "extra": "free-form notes stored with the run (e.g. a study's variant name)",
}

ALIASES: dict[str, str] = {
    "lr": "learning_rate",
    "min_learning_rate": "min_lr",
    "wd": "weight_decay",
    "max_steps": "max_iters",
    "steps": "max_iters",
    "iters": "max_iters",
    "num_train_steps": "max_iters",
    "warmup_steps": "warmup_iters",
    "warmup": "warmup_iters",
    "lr_decay_steps": "lr_decay_iters",
    "micro_batch_size": "batch_size",
    "per_device_train_batch_size": "batch_size",
    "bs": "batch_size",
    "grad_accum": "gradient_accumulation_steps",
    "gradient_accumulation_iters": "gradient_accumulation_steps",
    "max_grad_norm": "grad_clip",
    "gradient_clip_val": "grad_clip",
    "clip": "grad_clip",
    "eval_steps": "eval_interval",
    "logging_steps": "log_interval",
    "save_steps": "ckpt_interval",
    "n_layers": "n_layer",
    "num_layers": "n_layer",
    "num_hidden_layers": "n_layer",
    "n_heads": "n_head",
    "num_heads": "n_head",
    "num_attention_heads": "n_head",
    "n_embed": "n_embd",
    "d_model": "n_embd",
    "hidden_size": "n_embd",
    "n_query_groups": "n_kv_head",
    "num_key_value_heads": "n_kv_head",
    "intermediate_size": "d_ffn",
    "context_length": "block_size",
    "max_seq_length": "block_size",
    "seq_len": "block_size",
    "max_position_embeddings": "block_size",
    "tie_word_embeddings": "tie_embeddings",
    "rope_base": "rope_theta",
    "logger_name": "trackers",
    "loggers": "trackers",
    "report_to": "trackers",
    "wandb_log": "trackers",
}
