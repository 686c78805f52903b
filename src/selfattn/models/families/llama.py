"""Llama (model_type "llama"): the shared Llama layout as it is, onto our decoder.

Llama 1 and 2 use plain RoPE; Llama 3.1 and 3.2 rescale its frequencies ("llama3"
rope_scaling, ``Llama3RopeScaling``), and Llama 3.2 1B ties its output matrix to the token
embedding. The config's attention_bias puts biases on q, k, v and o together, and its
mlp_bias on the feed-forward layers. No layer has a sliding window.
"""

from __future__ import annotations

from selfattn.models.gguf_layout import COMMON_KEYS, GgufMap
from selfattn.models.llama_layout import LlamaShape, llama_family

KIND = "decoder"  # read without importing this file (families.family_kinds), for the command line's help

MODEL_TYPE = "llama"

SHAPE = LlamaShape(
    model_type=MODEL_TYPE,
    description="Llama 1-3 decoders: RMSNorm, SwiGLU, grouped-query attention, RoPE (with Llama 3's rescaling)",
    reads_mlp_bias=True,
    # GGUF "llama": SmolLM2, Llama 2 and 3, TinyLlama, Mistral converted as llama. llama.cpp turns
    # RoPE on interleaved pairs for this architecture, so its converter reordered q's and k's rows;
    # the head width is rope.dimension_count unless the file gives attention.key_length.
    gguf=GgufMap("llama", keys={"rope.dimension_count": "head_dim", **COMMON_KEYS}, permute_qk=True),
)
FAMILY = llama_family(SHAPE)
