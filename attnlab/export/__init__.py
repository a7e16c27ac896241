"""Ship a model as one Hugging Face-style folder, and run its exported graphs back.

- ``folder``: the folder writer (``export``, ``export_model``) and its formats;
- ``hf``: what transformers reads (config, remote code, tokenizer, chat template) and
  ``import_hf`` for the way back;
- ``torchscript`` and ``onnx``: the traced graphs, and onnxruntime behind attnlab's sampler.
"""

from attnlab.export.folder import FILES, FORMATS, export, export_model, parse_formats
from attnlab.export.onnx import OnnxLM, load_onnx

__all__ = ["FILES", "FORMATS", "OnnxLM", "export", "export_model", "load_onnx", "parse_formats"]
