"""Llama, Mistral and Qwen2 (model_types "llama", "mistral", "qwen2") onto our decoder.

The three share one layout: pre-RMSNorm blocks, SwiGLU feed-forwards, grouped-query
attention with RoPE pairing feature i with i + head_dim/2, no biases except where the
config says (Llama's attention_bias and mlp_bias; Qwen2 always has biases on q, k and v
but not on o). They differ in data only:

    llama    rope_scaling "llama3" in Llama 3.1 / 3.2 (``Llama3RopeScaling``); tied in 3.2 1B
    mistral  sliding_window: every layer sees the W newest keys (null: no window)
    qwen2    use_sliding_window with max_window_layers (or layer_types): which layers window

Both spellings of RoPE's settings are read: rope_theta / rope_scaling (the checkpoints on
the hub) and rope_parameters (what transformers 5 writes).
"""

from __future__ import annotations

from selfattn.errors import ModelError, OptionError
from selfattn.models.config_fields import ConfigReader
from selfattn.models.decoder import DecoderConfig
from selfattn.models.weights import WeightRule, rule
from selfattn.positional.rope_scaling import Llama3RopeScaling

FAMILIES = ("llama", "mistral", "qwen2")
# Settings of other models in these families' configs that our blocks do not compute.
REFUSED = {
    "num_experts": "a mixture of experts",
    "num_local_experts": "a mixture of experts",
    "num_experts_per_tok": "a mixture of experts",
    "moe_intermediate_size": "a mixture of experts",
    "attention_sink": "attention sinks",
    "attention_sinks": "attention sinks",
    "use_sinks": "attention sinks",
}


def read_config(data: dict) -> DecoderConfig:
    """A Llama / Mistral / Qwen2 config.json -> ``DecoderConfig``.

    Raises:
        ModelError: a required field is missing or mistyped, or the config asks for what
            these blocks do not compute (another rope scaling, partial rotation, a
            mixture of experts, attention sinks, another activation), naming the field.
    """
    family = data.get("model_type")
    read = ConfigReader(data, family)
    for name, what in REFUSED.items():
        read.refuse_true(name, what)
    if data.get("partial_rotary_factor", 1.0) != 1.0:
        raise ModelError("config.json field 'partial_rotary_factor' asks for a partial rotation, which selfattn does not compute")
    read.choice("hidden_act", {"silu": "silu"}, default="silu")
    d = read.int("hidden_size")
    heads = read.int("num_attention_heads")
    layers = read.int("num_hidden_layers")
    kv_heads = read.int("num_key_value_heads", default=heads, allow_null=True)
    if heads % kv_heads:
        raise ModelError(f"config.json: num_attention_heads ({heads}) is not divisible by num_key_value_heads ({kv_heads})")
    head_dim = read.int("head_dim", default=read.divide(d, heads, "hidden_size", "num_attention_heads"), allow_null=True)
    base, scaling = _rope(data, read)
    attention_bias = True if family == "qwen2" else read.bool("attention_bias", default=False)
    eos = read.ids("eos_token_id")
    return DecoderConfig(
        model_type=family,
        vocab_size=read.int("vocab_size"),
        d_model=d,
        n_layers=layers,
        n_heads=heads,
        n_kv_heads=kv_heads,
        head_dim=head_dim,
        d_ff=read.int("intermediate_size"),
        activation="swiglu",
        norm="rms",
        norm_eps=read.number("rms_norm_eps", default=1e-6),
        positions="rope",
        max_positions=read.int("max_position_embeddings"),
        rope_base=base,
        rope_scaling=scaling,
        windows=_windows(data, read, family, layers),
        bias=read.bool("mlp_bias", default=False) if family == "llama" else False,
        attention_bias=attention_bias,
        out_bias=False if family == "qwen2" else attention_bias,
        tie_embeddings=read.bool("tie_word_embeddings", default=False),
        bos_id=read.optional_id("bos_token_id"),
        eos_ids=eos,
        pad_id=read.optional_id("pad_token_id") or (eos[0] if eos else 0),
    )


def _rope(data: dict, read: ConfigReader) -> tuple[float, Llama3RopeScaling | None]:
    """RoPE's base and scaling from rope_parameters (transformers 5) or rope_theta / rope_scaling."""
    params = data.get("rope_parameters")
    field = "rope_parameters"
    if params is None:
        params, field = data.get("rope_scaling"), "rope_scaling"
    if params is not None and not isinstance(params, dict):
        raise ModelError(f"config.json field {field!r} must be an object, got {params!r}")
    params = params or {}
    base = params.get("rope_theta", data.get("rope_theta", 10000.0))
    if isinstance(base, bool) or not isinstance(base, (int, float)) or base <= 1:
        raise ModelError(f"config.json field 'rope_theta' must be a number above 1, got {base!r}")
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        return float(base), None
    if kind != "llama3":
        raise ModelError(
            f"config.json field {field!r} asks for rope_type {kind!r}: selfattn supports 'default' and 'llama3'"
        )
    try:
        scaling = Llama3RopeScaling(
            float(params["factor"]), float(params["low_freq_factor"]), float(params["high_freq_factor"]),
            int(params["original_max_position_embeddings"]),
        )
    except KeyError as missing:
        raise ModelError(f"config.json field {field!r}: llama3 scaling lacks {missing}") from None
    except (TypeError, ValueError, OptionError) as error:
        raise ModelError(f"config.json field {field!r}: {error}") from None
    return float(base), scaling


def _windows(data: dict, read: ConfigReader, family: str, layers: int) -> tuple[int | None, ...]:
    """Each layer's sliding window, or None for full causal attention."""
    if family == "llama":
        return ()
    window = data.get("sliding_window")
    if window is None:
        return ()
    window = read.int("sliding_window")
    if family == "mistral":
        return (window,) * layers
    types = data.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != layers or set(types) - {"full_attention", "sliding_attention"}:
            raise ModelError(
                f"config.json field 'layer_types' must list 'full_attention' or 'sliding_attention' for each of the {layers} layers"
            )
        return tuple(window if t == "sliding_attention" else None for t in types)
    if not data.get("use_sliding_window", False):
        return ()
    first = read.int("max_window_layers", default=layers, minimum=0)
    return tuple(window if i >= first else None for i in range(layers))


def weight_rules(config: DecoderConfig) -> list[WeightRule]:
    """The shared tensor names -> ours."""
    rules = [rule("model.embed_tokens.weight", "embed.weight")]
    for i in range(config.n_layers):
        theirs, ours = f"model.layers.{i}.", f"layers.{i}."
        attention = [("q_proj", "w_q"), ("k_proj", "w_k"), ("v_proj", "w_v"), ("o_proj", "w_o")]
        for name, mine in attention:
            rules.append(rule(f"{theirs}self_attn.{name}.weight", f"{ours}attention.{mine}.weight"))
            if config.attention_bias if mine != "w_o" else config.out_bias:
                rules.append(rule(f"{theirs}self_attn.{name}.bias", f"{ours}attention.{mine}.bias"))
        for name in ("gate", "up", "down"):
            rules.append(rule(f"{theirs}mlp.{name}_proj.weight", f"{ours}feed_forward.{name}.weight"))
            if config.bias:
                rules.append(rule(f"{theirs}mlp.{name}_proj.bias", f"{ours}feed_forward.{name}.bias"))
        rules.append(rule(f"{theirs}input_layernorm.weight", f"{ours}norm1.weight"))
        rules.append(rule(f"{theirs}post_attention_layernorm.weight", f"{ours}norm2.weight"))
    rules.append(rule("model.norm.weight", "norm.weight"))
    if not config.tie_embeddings:
        rules.append(rule("lm_head.weight", "lm_head.weight"))
    return rules


def ignored(config: DecoderConfig):
    """Known and unused: RoPE's saved frequencies (older checkpoints), a stored copy of a tied output."""
    def check(name: str) -> bool:
        if name == "lm_head.weight":
            return config.tie_embeddings
        return name.endswith("rotary_emb.inv_freq")

    return check
