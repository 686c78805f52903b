"""Qwen2 (model_type "qwen2"): the Llama layout with biases on q, k and v and windows on chosen layers.

Qwen2 always has biases on the q, k and v projections and never on o or the feed-forward
layers (its config has no attention_bias). Sliding windows are off unless the config says
which layers take them: layer_types (one "full_attention" or "sliding_attention" per
layer), else use_sliding_window with max_window_layers (layers from that index on slide).
"""

from __future__ import annotations

from selfattn.models.config_fields import ConfigReader
from selfattn.models.llama_layout import LlamaShape, llama_family, windows_from_layer_types

MODEL_TYPE = "qwen2"


def windows(data: dict, read: ConfigReader, layers: int) -> tuple[int | None, ...]:
    """Which layers slide, and by how much: layer_types, else use_sliding_window and max_window_layers.

    Args:
        data: the parsed config.json.
        read: its field reader.
        layers: the number of layers.

    Returns:
        Per layer, sliding_window or None; () when no layer slides.
    """
    if data.get("sliding_window") is None:
        return ()
    window = read.int("sliding_window")
    if data.get("layer_types") is not None:
        return windows_from_layer_types(data, window, layers)
    if not data.get("use_sliding_window", False):
        return ()
    first = read.int("max_window_layers", default=layers, minimum=0)
    return tuple(window if i >= first else None for i in range(layers))


SHAPE = LlamaShape(
    model_type=MODEL_TYPE,
    description="Qwen2 decoders: the Llama layout with biases on q, k and v and sliding windows on chosen layers",
    qkv_bias=True,
    out_bias=False,
    windows=windows,
)
FAMILY = llama_family(SHAPE)
