"""The configuration of an attnlab model for transformers (written by ``attnlab export``).

Every field of attnlab's ModelConfig is an attribute (FIELDS holds them with their defaults);
transformers' standard names (hidden_size, num_hidden_layers, ...) map onto them.
"""

from transformers import PretrainedConfig

FIELDS: dict = {}  # attnlab's ModelConfig fields and defaults, written in by `attnlab export`


class AttnlabConfig(PretrainedConfig):
    """attnlab's ModelConfig as a transformers config."""

    model_type = "attnlab"
    attribute_map = {  # noqa: RUF012  (transformers reads these class attributes as they are)
        "hidden_size": "n_embd",
        "num_hidden_layers": "n_layer",
        "num_attention_heads": "n_head",
        "num_key_value_heads": "n_kv_head",
        "max_position_embeddings": "block_size",
    }

    def __init__(self, **kwargs) -> None:
        for name, default in FIELDS.items():
            setattr(self, name, kwargs.pop(name, default))
        kwargs.setdefault("tie_word_embeddings", self.tie_embeddings)
        super().__init__(**kwargs)
