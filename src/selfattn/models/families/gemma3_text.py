"""Gemma 3's text decoder (model_type "gemma3_text"): the Llama layout with Gemma's differences.

    X0 = E_tok[id] * sqrt(d)                          the embeddings scaled up by the width
    x  = x + N3(Attn(N1(x)));  x = x + N4(FFN(N2(x)))   a norm before and after each part
    N(x) = x / rms(x) * (1 + w)                       every RMSNorm's gain is stored as w = g - 1
    FFN(x) = (gelu_tanh(x W_gate) * x W_up) W_down    GeGLU instead of SwiGLU
    scores = q . k / sqrt(query_pre_attn_scalar)      not / sqrt(head_dim)

Each head's q and k pass an RMSNorm (gain 1 + w) before RoPE, as in Qwen3. The layers
alternate between sliding-window attention (a query sees its sliding_window newest keys)
and full attention, as layer_types lists them (older configs: every
sliding_window_pattern-th layer is full, the rest slide), and each kind turns q and k with
its own RoPE base: rope_parameters holds one entry per kind (transformers 5); older
configs give rope_theta for the full layers and rope_local_base_freq for the sliding ones.
Settings these blocks do not compute are refused by name: a tanh cap on the scores or the
logits (attn_logit_softcapping, final_logit_softcapping; transformers' Gemma 3 applies
only the second), bidirectional attention, and any RoPE scaling.
"""

from __future__ import annotations

from selfattn.errors import ModelError
from selfattn.models.config_fields import ConfigReader
from selfattn.models.gguf_layout import COMMON_KEYS, GgufMap
from selfattn.models.llama_layout import REFUSED, LlamaShape, llama_family, windows_from_layer_types

KIND = "decoder"  # read without importing this file (families.family_kinds), for the command line's help

MODEL_TYPE = "gemma3_text"
SLIDING, FULL = "sliding_attention", "full_attention"
DEFAULT_BASES = {SLIDING: 10_000.0, FULL: 1_000_000.0}  # transformers' defaults for configs that name none
OLD_BASE_FIELDS = {SLIDING: "rope_local_base_freq", FULL: "rope_theta"}


def layer_types(data: dict, read: ConfigReader, layers: int) -> list[str]:
    """Each layer's kind, "sliding_attention" or "full_attention": layer_types, else the pattern.

    Args:
        data: the parsed config.json.
        read: its field reader.
        layers: the number of layers.

    Returns:
        One kind per layer.

    Raises:
        ModelError: layer_types is malformed, or sliding_window_pattern is not a whole number.
    """
    if data.get("layer_types") is not None:
        windows = windows_from_layer_types(data, 1, layers)  # checks the list
        return [SLIDING if w is not None else FULL for w in windows]
    pattern = read.int("sliding_window_pattern", default=6)
    return [FULL if (i + 1) % pattern == 0 else SLIDING for i in range(layers)]


def windows(data: dict, read: ConfigReader, layers: int) -> tuple[int | None, ...]:
    """sliding_window on the sliding layers, None on the full ones.

    Args:
        data: the parsed config.json.
        read: its field reader.
        layers: the number of layers.

    Returns:
        Per layer, the window W or None.

    Raises:
        ModelError: a layer slides but sliding_window is not a whole number.
    """
    kinds = layer_types(data, read, layers)
    window = read.int("sliding_window") if SLIDING in kinds else None
    return tuple(window if kind == SLIDING else None for kind in kinds)


def rope(data: dict, read: ConfigReader, layers: int) -> tuple[float, None, tuple[float, ...]]:
    """RoPE's base for each kind of layer; no scaling.

    Args:
        data: the parsed config.json.
        read: its field reader.
        layers: the number of layers.

    Returns:
        (the full layers' base, None, per layer its kind's base).

    Raises:
        ModelError: rope_parameters is not one object per kind of layer, a base is not a
            number above 1, or a kind asks for a RoPE scaling.
    """
    params = data.get("rope_parameters")
    if params is not None and (not isinstance(params, dict) or not set(params) <= {SLIDING, FULL}):
        raise ModelError(f"config.json field 'rope_parameters' must hold one object per kind of layer ({SLIDING}, {FULL})")
    bases = {}
    for kind in (SLIDING, FULL):
        if params is not None:  # transformers 5: {"sliding_attention": {...}, "full_attention": {...}}
            entry, scaling_field = params.get(kind) or {}, "rope_parameters"
        else:  # older configs: rope_scaling applies to the full layers
            entry, scaling_field = (data.get("rope_scaling") if kind == FULL else None) or {}, "rope_scaling"
        if not isinstance(entry, dict):
            raise ModelError(f"config.json field {scaling_field!r} must give an object for the {kind} layers, got {entry!r}")
        rope_type = entry.get("rope_type", entry.get("type", "default"))
        if rope_type != "default":
            raise ModelError(
                f"config.json field {scaling_field!r} asks for rope_type {rope_type!r} on the {kind} layers: "
                "selfattn computes Gemma 3's plain RoPE only"
            )
        # The base: in the kind's own entry, or (older configs) in a field of its own per kind.
        holder, key, base_field = (entry, "rope_theta", "rope_parameters") if params is not None else (
            data, OLD_BASE_FIELDS[kind], OLD_BASE_FIELDS[kind])
        base = holder.get(key, DEFAULT_BASES[kind])
        if isinstance(base, bool) or not isinstance(base, (int, float)) or base <= 1:
            raise ModelError(
                f"config.json field {base_field!r}: the {kind} layers' RoPE base must be a number above 1, got {base!r}"
            )
        bases[kind] = float(base)
    return bases[FULL], None, tuple(bases[kind] for kind in layer_types(data, read, layers))


def score_scale(data: dict, read: ConfigReader) -> dict:
    """Gemma's scores are scaled by 1 / sqrt(query_pre_attn_scalar), not by 1 / sqrt(head_dim).

    Args:
        data: the parsed config.json.
        read: its field reader.

    Returns:
        {"scale": query_pre_attn_scalar ** -0.5}.

    Raises:
        ModelError: query_pre_attn_scalar is missing or not a positive number.
    """
    return {"scale": read.number("query_pre_attn_scalar") ** -0.5}


def gguf_extra(metadata: dict, data: dict) -> dict:
    """What a gemma3 GGUF file does not say: the score scale. llama.cpp scales by 1 / sqrt(head width)
    (attention.key_length), which is query_pre_attn_scalar for Gemma 3 up to 12B; the sliding layers'
    pattern (every sixth full) and RoPE base (10000) are this family's own defaults."""
    width = data.get("head_dim")
    if width is None and data.get("hidden_size") and data.get("num_attention_heads"):
        width = data["hidden_size"] // data["num_attention_heads"]
    return {} if width is None else {"query_pre_attn_scalar": width}


SHAPE = LlamaShape(
    model_type=MODEL_TYPE,
    description="Gemma 3 text decoders: sandwich RMSNorms (gain 1 + w), GeGLU, q/k norms, sliding and full layers",
    sliding_windows=windows,
    rope=rope,
    activation_field="hidden_activation",
    activations={"gelu_pytorch_tanh": "geglu_tanh"},
    options={"qk_norm": True, "norm_gain": "1+w", "sandwich_norm": True, "scale_embeddings": True},
    read_options=score_scale,
    refused=dict(
        REFUSED,
        attn_logit_softcapping="a tanh cap on the attention scores",
        final_logit_softcapping="a tanh cap on the logits",
        use_bidirectional_attention="bidirectional attention",
    ),
    # GGUF "gemma3": llama.cpp's converter stored every norm's gain as 1 + w (ggml multiplies by the gain
    # as it is), so -1 gives the checkpoint's w back; its sandwich norms are post_attention_norm and post_ffw_norm.
    gguf=GgufMap("gemma3", keys={**COMMON_KEYS, "attention.sliding_window": "sliding_window"}, sandwich_norm=True,
                 norm_offset=-1.0, extra=gguf_extra),
)
FAMILY = llama_family(SHAPE)
