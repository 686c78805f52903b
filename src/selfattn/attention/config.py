"""Frozen, validated configurations for the attention modules and transformer blocks.

An invalid configuration cannot be built: ``__post_init__`` raises ``ConfigError`` with
the numbers involved, before any parameter is allocated.
"""

from __future__ import annotations

import dataclasses
import functools
import math

from dataclasses import dataclass

from selfattn.errors import ConfigError, OptionError
from selfattn.positional import check_positional
from selfattn.positional.rope import ROPE_PAIRS
from selfattn.positional.rope_scaling import Llama3RopeScaling
from selfattn.renamed import renamed_attribute, renamed_keyword

# Selected by name. "reference": the score matrix in full (in place when no gradient is
# needed); "flash": the tiled kernel (kernels/flash.py), used wherever the weights are not
# asked for, which never holds the q_len x kv_len matrix.
ATTENTION_IMPLS = ("reference", "flash")
# "gelu" is the exact (erf) form, "gelu_tanh" its tanh approximation (GPT-2's "gelu_new"),
# "swiglu" the gated unit of Llama, Mistral and Qwen2: (silu(x W_gate) * x W_up) W_down,
# "geglu_tanh" Gemma's: the same with the tanh GELU in place of silu.
ACTIVATIONS = ("gelu", "relu", "gelu_tanh", "swiglu", "geglu_tanh")
GATED_ACTIVATIONS = ("swiglu", "geglu_tanh")
NORMS = ("layer", "rms")
# How an RMSNorm's learned gain w multiplies the normalised vector: by w itself (Llama,
# Qwen), or by 1 + w (Gemma, whose checkpoints store the gain's distance from 1).
NORM_GAINS = ("w", "1+w")


def _positive_int(name: str, value, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")


def _positive_number(name: str, value, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{name} must be a positive number, got {value!r}")


def _probability(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise ConfigError(f"{name} must be a number in [0, 1), got {value!r}")


@dataclass(frozen=True)
class AttentionConfig:
    """Multi-head attention: d_model = width of the input, n_heads query heads of width d_head.

    n_kv_heads < n_heads gives grouped-query attention (1 = multi-query). d_head
    defaults to d_model / n_heads, which must then divide evenly. kdim / vdim are the
    widths of the key and value inputs of cross-attention (default d_model).
    positional: only "rope" and "alibi" act inside attention; "sinusoidal" and "learned"
    are added to the embeddings by the model and are accepted here as no-ops.

    Attributes:
        d_model: width of the query input and of the output, a positive integer.
        n_heads: number of query heads (default 1).
        n_kv_heads: number of key/value heads; it must divide n_heads. None (default)
            means n_heads (plain multi-head attention), resolved to that number when the
            config is built; 1 is multi-query attention. (``.n_kv_heads`` still reads it
            and warns: its old name.)
        d_head: width of each head; None (the default) means d_model // n_heads, which
            then must divide evenly, and is resolved to that number when the config is
            built. Give it to use heads of another width. (``head_dim=`` still works and
            warns: it is the old name.)
        bias: whether the four projections W_q, W_k, W_v, W_o have biases (default True).
        dropout: chance of dropping each attention weight in training, in [0, 1).
        kdim: width of the key input (cross-attention); None means d_model.
        vdim: width of the value input (cross-attention); None means d_model.
        positional: "none" (default), "sinusoidal", "learned", "rope" or "alibi". With
            "rope" d_head must be even.
        rope_base: the RoPE frequency base, a number > 1 (default 10000).
        attn_impl: "reference" (default: the full score matrix) or "flash" (the tiled
            kernel, used where the weights are not asked for; it drops weights per tile).
        rope_pairs: how RoPE pairs features: "interleaved" (default, 2i with 2i+1) or
            "half" (i with i + d_head/2, as Llama, Mistral and Qwen2 checkpoints).
        rope_scaling: None, or a ``Llama3RopeScaling`` of RoPE's frequencies.
        sliding_window: None, or W: a query sees only the W newest keys up to its own
            position (itself included), as Mistral's window; acts together with causal.
        out_bias: whether W_o has a bias; None (default) means ``bias`` (Qwen2 has
            biases on W_q, W_k, W_v only).
        flash_min_queries: with attn_impl="flash", calls with fewer new queries than this
            take the reference path (the kernel's fixed cost per call is not earned back by
            a few queries: a decoding step); default 1, always the kernel.
        scale: the factor on Q K^T; None (default) means 1 / sqrt(d_head). Gemma's
            checkpoints set 1 / sqrt(query_pre_attn_scalar).
        qk_norm: an RMSNorm over each head's d_head features of q and of k, after the
            projection and before RoPE (Qwen3, Gemma 3); its gains are the parameters
            ``q_norm`` and ``k_norm`` of the module. Default False.
        norm_eps: that RMSNorm's epsilon (default 1e-6; ``qk_norm_eps=`` still works and
            warns: its old name, from before the block's spelling was used here too).
        norm_gain: how its gain w applies: "w" (default) or "1+w" (Gemma); the old name
            ``qk_norm_gain=`` warns.

    Raises:
        ConfigError: a size is not a positive integer, d_model is not divisible by n_heads
            (without d_head), n_heads is not divisible by n_kv_heads, dropout is outside
            [0, 1), bias is not a bool, positional, attn_impl, rope_pairs or norm_gain
            is unknown, RoPE gets an odd d_head, rope_base <= 1, or scale or norm_eps
            is not a positive number.

    Examples:
        >>> import selfattn as sa
        >>> import torch
        >>> config = sa.AttentionConfig(d_model=8, n_heads=4, n_kv_heads=2)
        >>> config.d_head, config.n_kv_heads, config.group_size
        (2, 2, 2)
    """

    d_model: int
    n_heads: int = 1
    n_kv_heads: int | None = None
    d_head: int | None = None
    bias: bool = True
    dropout: float = 0.0
    kdim: int | None = None
    vdim: int | None = None
    positional: str = "none"
    rope_base: float = 10000.0
    attn_impl: str = "reference"
    rope_pairs: str = "interleaved"
    rope_scaling: Llama3RopeScaling | None = None
    sliding_window: int | None = None
    out_bias: bool | None = None
    flash_min_queries: int = 1
    scale: float | None = None
    qk_norm: bool = False
    norm_eps: float = 1e-6
    norm_gain: str = "w"

    def __post_init__(self) -> None:
        _positive_int("d_model", self.d_model)
        _positive_number("scale", self.scale, allow_none=True)
        _positive_number("norm_eps", self.norm_eps)
        if not isinstance(self.qk_norm, bool):
            raise ConfigError(f"qk_norm must be True or False, got {self.qk_norm!r}")
        if self.norm_gain not in NORM_GAINS:
            raise ConfigError(f"unknown norm gain {self.norm_gain!r}: choose one of {', '.join(NORM_GAINS)}")
        _positive_int("flash_min_queries", self.flash_min_queries)
        _positive_int("sliding_window", self.sliding_window, allow_none=True)
        if self.rope_pairs not in ROPE_PAIRS:
            raise ConfigError(f"unknown RoPE pairing {self.rope_pairs!r}: choose one of {', '.join(ROPE_PAIRS)}")
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, Llama3RopeScaling):
            raise ConfigError(f"rope_scaling must be None or a Llama3RopeScaling, got {type(self.rope_scaling).__name__}")
        if self.out_bias is not None and not isinstance(self.out_bias, bool):
            raise ConfigError(f"out_bias must be True, False or None, got {self.out_bias!r}")
        _positive_int("n_heads", self.n_heads)
        _positive_int("n_kv_heads", self.n_kv_heads, allow_none=True)
        _positive_int("d_head", self.d_head, allow_none=True)
        _positive_int("kdim", self.kdim, allow_none=True)
        _positive_int("vdim", self.vdim, allow_none=True)
        if self.d_head is None and self.d_model % self.n_heads:
            raise ConfigError(
                f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads}), "
                f"or give d_head explicitly"
            )
        if self.d_head is None:  # the default width, resolved once: d_head is always a number afterwards
            object.__setattr__(self, "d_head", self.d_model // self.n_heads)
        if self.n_kv_heads is None:  # likewise: n_kv_heads is always a number afterwards
            object.__setattr__(self, "n_kv_heads", self.n_heads)
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(
                f"n_heads ({self.n_heads}) must be divisible by n_kv_heads ({self.n_kv_heads}): "
                f"each key/value head serves a whole group of query heads"
            )
        _probability("dropout", self.dropout)
        if not isinstance(self.bias, bool):
            raise ConfigError(f"bias must be True or False, got {self.bias!r}")
        try:
            check_positional(self.positional)
        except OptionError as error:
            raise ConfigError(str(error)) from None
        if self.positional == "rope" and self.d_head % 2:
            raise ConfigError(f"RoPE rotates pairs of features, so d_head must be even, got {self.d_head}")
        if not isinstance(self.rope_base, (int, float)) or isinstance(self.rope_base, bool) or self.rope_base <= 1:
            raise ConfigError(f"rope_base must be a number > 1, got {self.rope_base!r}")
        if self.attn_impl not in ATTENTION_IMPLS:
            raise ConfigError(f"unknown attention implementation {self.attn_impl!r}: choose one of {', '.join(ATTENTION_IMPLS)}")

    @property
    def group_size(self) -> int:
        """Query heads per key/value head: 1 for multi-head, n_heads for multi-query."""
        return self.n_heads // self.n_kv_heads

    @property
    def output_bias(self) -> bool:
        """Whether W_o has a bias: out_bias, or bias when that is None."""
        return self.bias if self.out_bias is None else self.out_bias

    @property
    def score_scale(self) -> float:
        """The factor on Q K^T: scale, or 1 / sqrt(d_head) when that is None."""
        return self.d_head ** -0.5 if self.scale is None else float(self.scale)


@dataclass(frozen=True)
class TransformerConfig:
    """A stack of transformer blocks: attention + feed-forward, each with a residual and LayerNorm.

    norm_first=True is pre-LN (x + f(LN(x)), GPT-2 and most modern models);
    False is post-LN (LN(x + f(x)), the original transformer and BERT).
    positional: "sinusoidal" / "learned" are added to the input once, at the bottom of
    the stack; "rope" / "alibi" act in every attention layer. bias switches the biases
    of every linear layer and LayerNorm (as torch's ``bias`` does).

    Attributes:
        d_model: width of the hidden states, a positive integer.
        n_heads: query heads per attention layer.
        n_layers: number of blocks in the stack (default 1).
        n_kv_heads: key/value heads per layer; None (default) means n_heads.
        d_ff: hidden width of the feed-forward network; None means 4 * d_model.
        dropout: in [0, 1); drops attention weights, the feed-forward hidden activations
            and both sub-layer outputs, in training only.
        bias: biases in every linear layer and LayerNorm (default True).
        norm_first: True (default) for pre-LN, False for post-LN.
        activation: the feed-forward activation, "gelu" (exact, default), "relu",
            "gelu_tanh", or a gated unit: "swiglu" or "geglu_tanh" (``GatedFeedForward``).
        norm_eps: every norm's epsilon (LayerNorm or RMSNorm), a positive number (default 1e-5).
        positional: "none" (default), "sinusoidal", "learned", "rope" or "alibi".
        max_positions: rows of the learned positional table, the longest sequence (with any
            cached tokens) it covers (default 512; used only with "learned").
        causal: whether the blocks mask later keys when a call gives no is_causal
            (default False; the mask is aligned bottom-right).
        d_head: width of each head; None means d_model // n_heads.
        rope_base: the RoPE frequency base, a number > 1 (default 10000).
        attn_impl: "reference" (default) or "flash"; see ``AttentionConfig``.
        norm: "layer" (default, LayerNorm) or "rms" (RMSNorm, no centring and no bias).
        attention_bias: biases on W_q, W_k, W_v; None (default) means ``bias``.
        out_bias: a bias on W_o; None (default) means attention_bias.
        rope_pairs: RoPE's pairing of features, "interleaved" (default) or "half"; see
            ``AttentionConfig``.
        rope_scaling: None, or a ``Llama3RopeScaling`` (``AttentionConfig``).
        sliding_window: None, or each query's window of W newest keys (``AttentionConfig``).
        flash_min_queries: with "flash", fewer new queries than this take the reference
            path (``AttentionConfig``); default 1.
        scale: the factor on Q K^T; None (default) means 1 / sqrt(d_head).
        qk_norm: an RMSNorm over each head's q and k before RoPE (``AttentionConfig``),
            with norm_eps and norm_gain; default False.
        norm_gain: how every RMSNorm's gain w applies, "w" (default) or "1+w" (Gemma);
            "1+w" needs norm="rms".
        sandwich_norm: one more norm on the attention's output and one on the
            feed-forward's output, before each is added back (Gemma 2 and 3):
            x = x + N3(Attn(N1(x))); x = x + N4(FFN(N2(x))). Pre-LN only; default False.

    Raises:
        ConfigError: n_layers, d_ff or max_positions is not a positive integer, the activation,
            norm or norm gain is unknown, "1+w" comes without RMSNorm, sandwich_norm
            without pre-LN, norm_eps <= 0, norm_first, causal, qk_norm or
            sandwich_norm is not a bool, or the attention part is invalid (see
            ``AttentionConfig``).
    """

    d_model: int
    n_heads: int
    n_layers: int = 1
    n_kv_heads: int | None = None
    d_ff: int | None = None  # default 4 * d_model
    dropout: float = 0.0
    bias: bool = True
    norm_first: bool = True
    activation: str = "gelu"
    norm_eps: float = 1e-5
    positional: str = "none"
    max_positions: int = 512  # longest sequence a learned positional table covers (config.json's max_position_embeddings)
    causal: bool = False
    d_head: int | None = None  # default d_model / n_heads
    rope_base: float = 10000.0
    attn_impl: str = "reference"  # or "flash": see ATTENTION_IMPLS
    norm: str = "layer"
    attention_bias: bool | None = None
    out_bias: bool | None = None
    rope_pairs: str = "interleaved"
    rope_scaling: Llama3RopeScaling | None = None
    sliding_window: int | None = None
    flash_min_queries: int = 1
    scale: float | None = None
    qk_norm: bool = False
    norm_gain: str = "w"
    sandwich_norm: bool = False

    def __post_init__(self) -> None:
        _positive_int("n_layers", self.n_layers)
        if self.norm_gain not in NORM_GAINS:
            raise ConfigError(f"unknown norm gain {self.norm_gain!r}: choose one of {', '.join(NORM_GAINS)}")
        if self.norm_gain != "w" and self.norm != "rms":
            raise ConfigError(f"norm_gain {self.norm_gain!r} is a gain of RMSNorm: give norm='rms' with it")
        if self.norm not in NORMS:
            raise ConfigError(f"unknown norm {self.norm!r}: choose one of {', '.join(NORMS)}")
        if self.attention_bias is not None and not isinstance(self.attention_bias, bool):
            raise ConfigError(f"attention_bias must be True, False or None, got {self.attention_bias!r}")
        _positive_int("d_ff", self.d_ff, allow_none=True)
        _positive_int("max_positions", self.max_positions)
        if self.activation not in ACTIVATIONS:
            raise ConfigError(f"unknown activation {self.activation!r}: choose one of {', '.join(ACTIVATIONS)}")
        if not isinstance(self.norm_eps, (int, float)) or self.norm_eps <= 0:
            raise ConfigError(f"norm_eps must be a positive number, got {self.norm_eps!r}")
        for name in ("norm_first", "causal", "sandwich_norm"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.sandwich_norm and not self.norm_first:
            raise ConfigError("sandwich_norm adds norms to a pre-LN block: give norm_first=True with it")
        self.attention  # validates the attention part

    @functools.cached_property
    def attention(self) -> AttentionConfig:
        """The ``AttentionConfig`` that every layer's attention is built from.

        Every field the two records share passes by its name, so an attention option
        added to both reaches the module without a line here; only the projections' bias
        is the block's own choice (attention_bias, else bias).
        """
        shared = {name: getattr(self, name) for name in _SHARED_FIELDS}
        shared["bias"] = self.bias if self.attention_bias is None else self.attention_bias
        return AttentionConfig(**shared)

    @property
    def ff_size(self) -> int:
        """Hidden width of the feed-forward network: d_ff, or 4 * d_model when that is None."""
        return 4 * self.d_model if self.d_ff is None else self.d_ff


BLOCK_FIELDS = tuple(f.name for f in dataclasses.fields(TransformerConfig))
"""Every ``TransformerConfig`` field, in order: what ``DecoderConfig.block`` hands on by name."""
_SHARED_FIELDS = tuple(name for name in BLOCK_FIELDS if name in {f.name for f in dataclasses.fields(AttentionConfig)})

renamed_keyword(AttentionConfig, "head_dim", "d_head")
renamed_keyword(AttentionConfig, "qk_norm_eps", "norm_eps")  # the block's spelling: one epsilon name for every norm
renamed_keyword(AttentionConfig, "qk_norm_gain", "norm_gain")


renamed_attribute(AttentionConfig, "head_size", "d_head")
renamed_attribute(AttentionConfig, "kv_heads", "n_kv_heads")  # resolved when built, as d_head: one name
renamed_keyword(TransformerConfig, "head_dim", "d_head")
renamed_keyword(TransformerConfig, "max_len", "max_positions")  # DecoderConfig's name for the same number
renamed_keyword(TransformerConfig, "layer_norm_eps", "norm_eps")  # one epsilon for LayerNorm and RMSNorm, as DecoderConfig
