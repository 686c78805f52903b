"""Mistral (model_type "mistral"): the Llama layout with one sliding window on every layer.

config.json's sliding_window W lets each query see its W newest keys, the same W on every
layer; null means full causal attention (Mistral 7B v0.2 and later). Biases: as the
config's attention_bias says, on q, k, v and o together; never on the feed-forward layers.
"""

from __future__ import annotations

from selfattn.models.config_fields import ConfigReader
from selfattn.models.llama_layout import LlamaShape, llama_family

KIND = "decoder"  # read without importing this file (families.family_kinds), for the command line's help

MODEL_TYPE = "mistral"


def windows(data: dict, read: ConfigReader, layers: int) -> tuple[int | None, ...]:
    """sliding_window on every layer, or no window at all when it is null or absent.

    Args:
        data: the parsed config.json.
        read: its field reader.
        layers: the number of layers.

    Returns:
        (W,) * layers, or () for full attention.
    """
    if data.get("sliding_window") is None:
        return ()
    return (read.int("sliding_window"),) * layers


SHAPE = LlamaShape(
    model_type=MODEL_TYPE,
    description="Mistral decoders: the Llama layout with one sliding window on every layer",
    sliding_windows=windows,
)
FAMILY = llama_family(SHAPE)
