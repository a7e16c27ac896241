"""The backbone (GPT), its layers and the pluggable attention mechanisms."""

from attnlab.model.gpt import GPT, Block

__all__ = ["GPT", "Block"]
