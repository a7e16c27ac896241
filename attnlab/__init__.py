"""attnlab: transformer attention with a fourth signal, trained, compared and shipped."""

from attnlab.config import ModelConfig, TrainConfig
from attnlab.errors import AttnlabError
from attnlab.model import GPT

__version__ = "0.1.0"


def from_pretrained(path, device="cpu"):
    """Load a model folder (HF-style export or a run's checkpoint) as ``(model, tokenizer)``."""
    from attnlab.train.checkpoint import load_pretrained

    return load_pretrained(path, device=device)


__all__ = ["GPT", "AttnlabError", "ModelConfig", "TrainConfig", "from_pretrained"]
