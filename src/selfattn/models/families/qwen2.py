"""Qwen2 (model_type "qwen2"): the Llama layout with biases on q, k and v and windows on chosen layers.

Qwen2 always has biases on the q, k and v projections and never on o or the feed-forward
layers (its config has no attention_bias). Sliding windows are off unless the config says
which layers take them: layer_types (one "full_attention" or "sliding_attention" per
layer), else use_sliding_window with max_window_layers (layers from that index on slide);
``windows_from_max_window_layers`` reads both, and Qwen3 shares it.
"""

from __future__ import annotations

from selfattn.models.gguf_layout import GgufMap
from selfattn.models.llama_layout import LlamaShape, llama_family, windows_from_max_window_layers

KIND = "decoder"  # read without importing this file (families.family_kinds), for the command line's help

MODEL_TYPE = "qwen2"

SHAPE = LlamaShape(
    model_type=MODEL_TYPE,
    description="Qwen2 decoders: the Llama layout with biases on q, k and v and sliding windows on chosen layers",
    qkv_bias=True,
    out_bias=False,
    sliding_windows=windows_from_max_window_layers,
    gguf=GgufMap("qwen2"),  # RoPE on halves in llama.cpp too: the tensors as they were
)
FAMILY = llama_family(SHAPE)
