"""The Llama layout, shared by every Llama-shaped family: its config reader and its weight table.

Pre-RMSNorm blocks, gated feed-forwards, grouped-query attention with RoPE pairing
feature i with i + d_head/2, and the tensor names ``model.layers.{i}.self_attn.q_proj``
and so on. The families built on it differ only in data, stated in their own files as a
``LlamaShape``:

    qkv_bias      None: the config's attention_bias says; True: always (q, k and v)
    out_bias      None: as q, k and v; False: never on o
    reads_mlp_bias  whether the config's mlp_bias is read (else no feed-forward biases)
    sliding_windows  how the config's sliding windows are read: which layers, how wide
    rope          how RoPE's base (one, or one per layer) and scaling are read
    activation_field, activations   the config field naming the gated unit, and the
                  names it may hold
    options       ``DecoderConfig`` fields the family always sets, by their own names:
                  qk_norm (q_norm / k_norm before RoPE), Gemma's norm_gain "1+w",
                  sandwich_norm (then pre_feedforward_layernorm and
                  post_feedforward_layernorm join, and post_attention_layernorm is the
                  norm after attention), scale_embeddings
    read_options  (config, its reader) -> more ``DecoderConfig`` fields the family reads
                  itself (Gemma: the score scale from query_pre_attn_scalar)

A block option reaches the blocks by its name: the family's file puts it in ``options``
or ``read_options``; ``DecoderConfig`` (a ``TransformerConfig``) carries it and
``DecoderConfig.block`` hands it on, so nothing here lists it.

Both spellings of RoPE's settings are read: rope_theta / rope_scaling (the checkpoints on
the hub) and rope_parameters (what transformers 5 writes); the Llama 3 rescaling
("llama3") is the one scaling computed.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from selfattn.errors import ModelError, OptionError
from selfattn.models.config_fields import ConfigReader
from selfattn.models.decoder_config import DecoderConfig
from selfattn.models.family import Family
from selfattn.models.weights import WeightRule, rule
from selfattn.positional.rope_scaling import Llama3RopeScaling

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

# (config.json, its reader, layers) -> per layer the sliding window or None; () for none.
Windows = Callable[[dict, ConfigReader, int], tuple[int | None, ...]]
# (config.json, its reader, layers) -> (RoPE's base, its scaling or None, per layer the base or ()).
RopeReader = Callable[[dict, ConfigReader, int], tuple[float, Llama3RopeScaling | None, tuple[float, ...]]]
# (config.json, its reader) -> DecoderConfig fields by name.
OptionsReader = Callable[[dict, ConfigReader], dict[str, Any]]


def no_options(data: dict, read: ConfigReader) -> dict[str, Any]:
    """No field read beyond the shared layout's.

    Args:
        data: the parsed config.json.
        read: its field reader.

    Returns:
        {}.
    """
    return {}


def no_windows(data: dict, read: ConfigReader, layers: int) -> tuple[int | None, ...]:
    """Full causal attention on every layer, whatever the config says about windows.

    Args:
        data: the parsed config.json.
        read: its field reader.
        layers: the number of layers.

    Returns:
        (): no layer has a window.
    """
    return ()


def windows_from_layer_types(data: dict, window: int, layers: int) -> tuple[int | None, ...]:
    """Each layer's window from the config's layer_types list ("full_attention" / "sliding_attention").

    Args:
        data: the parsed config.json, which holds layer_types.
        window: the width W of every sliding layer.
        layers: the number of layers, which layer_types must list.

    Returns:
        Per layer, W for a sliding layer and None for a full one.

    Raises:
        ModelError: layer_types is not a list of those two names, one per layer.
    """
    types = data.get("layer_types")
    if not isinstance(types, list) or len(types) != layers or set(types) - {"full_attention", "sliding_attention"}:
        raise ModelError(
            f"config.json field 'layer_types' must list 'full_attention' or 'sliding_attention' for each of the {layers} layers"
        )
    return tuple(window if t == "sliding_attention" else None for t in types)


def one_rope(data: dict, read: ConfigReader, layers: int) -> tuple[float, Llama3RopeScaling | None, tuple[float, ...]]:
    """One RoPE base and scaling for every layer, from rope_parameters or rope_theta / rope_scaling.

    Args:
        data: the parsed config.json.
        read: its field reader.
        layers: the number of layers.

    Returns:
        (base, scaling or None, ()): no base per layer.

    Raises:
        ModelError: the fields are malformed, or ask for a scaling other than "llama3".
    """
    base, scaling = rope_settings(data)
    return base, scaling, ()


def windows_from_max_window_layers(data: dict, read: ConfigReader, layers: int) -> tuple[int | None, ...]:
    """Qwen's windows: layer_types, else use_sliding_window with max_window_layers (layers from it on slide).

    Args:
        data: the parsed config.json.
        read: its field reader.
        layers: the number of layers.

    Returns:
        Per layer, sliding_window or None; () when no layer slides (sliding_window null).
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


@dataclass(frozen=True)
class LlamaShape:
    """How one Llama-shaped family differs from the shared layout (see the module docstring).

    Attributes:
        model_type: config.json's model_type.
        description: one line for the registry.
        qkv_bias: True: q, k and v always have biases; None: the config's attention_bias
            (default false).
        out_bias: False: o never has one; None: the same as q, k and v.
        reads_mlp_bias: read the config's mlp_bias (default false); False: no
            feed-forward biases.
        sliding_windows: (config, its reader, layers) -> per layer the sliding window or None;
            () for full attention everywhere.
        refused: config.json field -> what it asks for that our blocks do not compute.
        rope: (config, its reader, layers) -> (base, scaling, per-layer bases or ());
            default ``one_rope``.
        activation_field: the config field that names the feed-forward's activation.
        activations: the names it may hold -> our gated activation; the first is the
            default when the field is absent.
        options: ``DecoderConfig`` fields this family always sets, by name (qk_norm,
            norm_gain, sandwich_norm, scale_embeddings, ...).
        read_options: (config, its reader) -> ``DecoderConfig`` fields the family reads
            from config.json itself; default ``no_options``.
        gguf: the family's ``gguf_layout.GgufMap``, or None: it reads no GGUF file.
    """

    model_type: str
    description: str
    qkv_bias: bool | None = None
    out_bias: bool | None = None
    reads_mlp_bias: bool = False
    sliding_windows: Windows = no_windows
    refused: Mapping[str, str] = field(default_factory=lambda: dict(REFUSED), compare=False)
    rope: RopeReader = one_rope
    activation_field: str = "hidden_act"
    activations: Mapping[str, str] = field(default_factory=lambda: {"silu": "swiglu"})
    options: Mapping[str, Any] = field(default_factory=dict)
    read_options: OptionsReader = no_options
    gguf: Any = None

    def read_config(self, data: dict) -> DecoderConfig:
        """A config.json of this family -> ``DecoderConfig``.

        Args:
            data: the parsed config.json.

        Returns:
            The decoder's config.

        Raises:
            ModelError: a required field is missing or mistyped, or the config asks for
                what these blocks do not compute (another rope scaling, partial rotation,
                a mixture of experts, attention sinks, another activation, what the
                family's ``refused`` lists), naming the field.
        """
        read = ConfigReader(data, self.model_type)
        for name, what in self.refused.items():
            read.refuse_true(name, what)
        if data.get("partial_rotary_factor", 1.0) != 1.0:
            raise ModelError("config.json field 'partial_rotary_factor' asks for a partial rotation, which selfattn does not compute")
        activation = read.choice(self.activation_field, self.activations, default=next(iter(self.activations)))
        d = read.int("hidden_size")
        heads = read.int("num_attention_heads")
        layers = read.int("num_hidden_layers")
        kv_heads = read.int("num_key_value_heads", default=heads, allow_null=True)
        if heads % kv_heads:
            raise ModelError(f"config.json: num_attention_heads ({heads}) is not divisible by num_key_value_heads ({kv_heads})")
        d_head = read.int("head_dim", default=read.divide(d, heads, "hidden_size", "num_attention_heads"), allow_null=True)
        base, scaling, bases = self.rope(data, read, layers)
        attention_bias = self.qkv_bias if self.qkv_bias is not None else read.bool("attention_bias", default=False)
        eos = read.ids("eos_token_id")
        return DecoderConfig(
            model_type=self.model_type,
            vocab_size=read.int("vocab_size"),
            d_model=d,
            n_layers=layers,
            n_heads=heads,
            n_kv_heads=kv_heads,
            d_head=d_head,
            d_ff=read.int("intermediate_size"),
            activation=activation,
            norm="rms",
            norm_eps=read.number("rms_norm_eps", default=1e-6),
            positional="rope",
            max_positions=read.int("max_position_embeddings"),
            rope_base=base,
            rope_scaling=scaling,
            sliding_windows=self.sliding_windows(data, read, layers),
            bias=read.bool("mlp_bias", default=False) if self.reads_mlp_bias else False,
            attention_bias=attention_bias,
            out_bias=self.out_bias if self.out_bias is not None else attention_bias,
            tie_embeddings=read.bool("tie_word_embeddings", default=False),
            bos_id=read.optional_id("bos_token_id"),
            eos_ids=eos,
            pad_id=read.optional_id("pad_token_id") or (eos[0] if eos else 0),
            rope_bases=bases,
            **self.options,
            **self.read_options(data, read),
        )


def llama_family(shape: LlamaShape) -> Family:
    """The registry's record of a Llama-shaped family.

    Args:
        shape: how the family differs from the shared layout.

    Returns:
        A decoder ``Family`` reading configs with ``shape.read_config`` and weights with
            the shared ``weight_table``.
    """
    return Family(
        model_type=shape.model_type,
        kind="decoder",
        description=shape.description,
        read_config=shape.read_config,
        weight_table=weight_table,
        refused=shape.refused,
        gguf=shape.gguf,
    )


def rope_settings(data: dict) -> tuple[float, Llama3RopeScaling | None]:
    """RoPE's base and scaling from rope_parameters (transformers 5) or rope_theta / rope_scaling.

    Args:
        data: the parsed config.json, or a part of it holding these fields.

    Returns:
        (base, scaling): rope_theta (default 10000), and None or the "llama3" scaling.

    Raises:
        ModelError: the fields are malformed, or ask for another rope_type, naming the field.
    """
    params = data.get("rope_parameters")
    field_name = "rope_parameters"
    if params is None:
        params, field_name = data.get("rope_scaling"), "rope_scaling"
    if params is not None and not isinstance(params, dict):
        raise ModelError(f"config.json field {field_name!r} must be an object, got {params!r}")
    params = params or {}
    base = params.get("rope_theta", data.get("rope_theta", 10000.0))
    if isinstance(base, bool) or not isinstance(base, (int, float)) or base <= 1:
        raise ModelError(f"config.json field 'rope_theta' must be a number above 1, got {base!r}")
    kind = params.get("rope_type", params.get("type", "default"))
    if kind == "default":
        return float(base), None
    if kind != "llama3":
        raise ModelError(
            f"config.json field {field_name!r} asks for rope_type {kind!r}: selfattn supports 'default' and 'llama3'"
        )
    try:
        scaling = Llama3RopeScaling(
            float(params["factor"]), float(params["low_freq_factor"]), float(params["high_freq_factor"]),
            int(params["original_max_position_embeddings"]),
        )
    except KeyError as missing:
        raise ModelError(f"config.json field {field_name!r}: llama3 scaling lacks {missing}") from None
    except (TypeError, ValueError, OptionError) as error:
        raise ModelError(f"config.json field {field_name!r}: {error}") from None
    return float(base), scaling


def weight_table(config: DecoderConfig, names: Collection[str]) -> tuple[list[WeightRule], Callable[[str], bool]]:
    """The shared tensor names -> ours, and the names known and unused.

    Args:
        config: the decoder's config (its layers, biases, tied output).
        names: the checkpoint's tensor names (the layout does not depend on them).

    Returns:
        (rules, ignored), as ``copy_weights`` takes them; ignored are RoPE's saved
            frequencies (older checkpoints) and a stored copy of a tied output matrix.
    """
    return weight_rules(config), ignored(config)


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
        if config.qk_norm:
            rules.append(rule(f"{theirs}self_attn.q_norm.weight", f"{ours}attention.q_norm.weight"))
            rules.append(rule(f"{theirs}self_attn.k_norm.weight", f"{ours}attention.k_norm.weight"))
        for name in ("gate", "up", "down"):
            rules.append(rule(f"{theirs}mlp.{name}_proj.weight", f"{ours}feed_forward.{name}.weight"))
            if config.bias:
                rules.append(rule(f"{theirs}mlp.{name}_proj.bias", f"{ours}feed_forward.{name}.bias"))
        rules.append(rule(f"{theirs}input_layernorm.weight", f"{ours}norm1.weight"))
        if config.sandwich_norm:  # post_attention_layernorm is then the norm AFTER attention
            rules.append(rule(f"{theirs}post_attention_layernorm.weight", f"{ours}post_attention_norm.weight"))
            rules.append(rule(f"{theirs}pre_feedforward_layernorm.weight", f"{ours}norm2.weight"))
            rules.append(rule(f"{theirs}post_feedforward_layernorm.weight", f"{ours}post_feedforward_norm.weight"))
        else:  # the norm before the feed-forward, named for where it sits: after the attention's residual sum
            rules.append(rule(f"{theirs}post_attention_layernorm.weight", f"{ours}norm2.weight"))
    rules.append(rule("model.norm.weight", "norm.weight"))
    if not config.tie_embeddings:
        rules.append(rule("lm_head.weight", "lm_head.weight"))
    return rules


def ignored(config: DecoderConfig) -> Callable[[str], bool]:
    """Known and unused: RoPE's saved frequencies (older checkpoints), a stored copy of a tied output."""
    def check(name: str) -> bool:
        if name == "lm_head.weight":
            return config.tie_embeddings
        return name.endswith("rotary_emb.inv_freq")

    return check
