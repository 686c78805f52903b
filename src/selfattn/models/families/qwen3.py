"""Qwen3 (model_type "qwen3"): the Llama layout with a norm on every head's queries and keys.

Qwen3 passes each head's query and key through an RMSNorm over its head_dim features
(``q_norm`` and ``k_norm``, one gain per feature shared by the heads) after the projection
and before RoPE, so the scores no longer grow with the size of the input. Its config
gives head_dim explicitly (128 in the released models, not hidden_size / heads). Unlike
Qwen2 there are no biases on q, k and v unless attention_bias says so (then on o too).
Sliding windows are read as Qwen2's: layer_types, else use_sliding_window with
max_window_layers. The mixture-of-experts models are another model_type; a config here
that names experts is refused.
"""

from __future__ import annotations

from selfattn.models.gguf_layout import GgufMap
from selfattn.models.llama_layout import REFUSED, LlamaShape, llama_family, windows_from_max_window_layers

KIND = "decoder"  # read without importing this file (families.family_kinds), for the command line's help

MODEL_TYPE = "qwen3"

SHAPE = LlamaShape(
    model_type=MODEL_TYPE,
    description="Qwen3 decoders: the Llama layout with an RMSNorm on each head's q and k before RoPE",
    sliding_windows=windows_from_max_window_layers,
    options={"qk_norm": True},
    refused=dict(REFUSED, decoder_sparse_step="a mixture of experts", mlp_only_layers="a mixture of experts"),
    gguf=GgufMap("qwen3"),  # q_norm and k_norm are attn_q_norm and attn_k_norm there
)
FAMILY = llama_family(SHAPE)
