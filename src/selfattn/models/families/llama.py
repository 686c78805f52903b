"""Llama (model_type "llama"): the shared Llama layout as it is, onto our decoder.

Llama 1 and 2 use plain RoPE; Llama 3.1 and 3.2 rescale its frequencies ("llama3"
rope_scaling, ``Llama3RopeScaling``), and Llama 3.2 1B ties its output matrix to the token
embedding. The config's attention_bias puts biases on q, k, v and o together, and its
mlp_bias on the feed-forward layers. No layer has a sliding window.
"""

from __future__ import annotations

from selfattn.errors import ModelError, OptionError
from selfattn.models.gguf_layout import COMMON_KEYS, GgufMap
from selfattn.models.llama_layout import LlamaShape, llama_family
from selfattn.positional.rope_scaling import Llama3RopeScaling

KIND = "decoder"  # read without importing this file (families.family_kinds), for the command line's help

MODEL_TYPE = "llama"


def gguf_rope_scaling(metadata: dict, data: dict) -> dict:
    """A llama GGUF file's other RoPE scalings (linear, YaRN: llama.rope.scaling.type) are refused by name;
    Llama 3's comes as the tensor rope_freqs instead (``rope_freqs``)."""
    kind = metadata.get("llama.rope.scaling.type", "none")
    if kind != "none" and not (kind == "linear" and metadata.get("llama.rope.scaling.factor", 1.0) == 1.0):
        raise ModelError(f"llama.rope.scaling.type is {kind!r}: selfattn runs a llama file's RoPE unscaled, "
                         "or rescaled by its rope_freqs tensor (Llama 3.1 / 3.2)")
    return {}


def rope_freqs(divisors: list[float], data: dict) -> dict:
    """llama.cpp's rope_freqs tensor (Llama 3.1 / 3.2 files): one divisor per RoPE pair, the frequency used
    being theta_i / divisor_i. The file keeps no other trace of the llama3 scaling, so its settings are read
    back from the divisors (``Llama3RopeScaling.from_divisors``) into config.json's rope_scaling."""
    width = data.get("head_dim")
    if width is None and data.get("hidden_size") and data.get("num_attention_heads"):
        width = data["hidden_size"] // data["num_attention_heads"]
    base = data.get("rope_theta", 10000.0)
    if not isinstance(width, int) or not isinstance(base, (int, float)) or base <= 1:
        return {}  # the config reader names what is wrong with these
    try:
        scaling = Llama3RopeScaling.from_divisors(divisors, width, base)
    except OptionError as error:
        raise ModelError(f"tensor rope_freqs.weight: {error}") from None
    if scaling is None:
        return {}
    return {"rope_scaling": {"rope_type": "llama3", "factor": scaling.factor,
                             "low_freq_factor": scaling.low_freq_factor, "high_freq_factor": scaling.high_freq_factor,
                             "original_max_position_embeddings": scaling.original_max_position_embeddings}}


SHAPE = LlamaShape(
    model_type=MODEL_TYPE,
    description="Llama 1-3 decoders: RMSNorm, SwiGLU, grouped-query attention, RoPE (with Llama 3's rescaling)",
    reads_mlp_bias=True,
    # GGUF "llama": SmolLM2, Llama 2 and 3, TinyLlama, Mistral converted as llama. llama.cpp turns
    # RoPE on interleaved pairs for this architecture, so its converter reordered q's and k's rows;
    # the head width is rope.dimension_count unless the file gives attention.key_length.
    gguf=GgufMap("llama", keys={"rope.dimension_count": "head_dim", **COMMON_KEYS}, permute_qk=True,
                 extra=gguf_rope_scaling, setting_tensors={"rope_freqs.weight": rope_freqs}),
)
FAMILY = llama_family(SHAPE)
