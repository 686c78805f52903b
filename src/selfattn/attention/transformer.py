"""Where attention lives in a transformer: a block is attention plus a feed-forward network.

The seed places self-attention inside a larger layer. Each layer has two parts: the
attention sub-layer, where every token looks at the others, and a small dense network
that works on each position on its own. Both parts are wrapped in a residual sum and a
layer norm, and the layer is repeated N times. Two orders of "add" and "normalise":

    pre-LN  (norm_first=True):   x = x + Drop(Attn(LN1(x)));   x = x + Drop(FFN(LN2(x)))
    post-LN (norm_first=False):  x = LN1(x + Drop(Attn(x)));   x = LN2(x + Drop(FFN(x)))
    sandwich (Gemma 2 and 3):    x = x + Drop(LN3(Attn(LN1(x))));   x = x + Drop(LN4(FFN(LN2(x))))

    FFN(x) = act(x W_1 + b_1) W_2 + b_2,   act = GELU (exact, erf) or ReLU
    gated:   FFN(x) = (act(x W_gate) * x W_up) W_down   (``GatedFeedForward``)

Post-LN is the original paper's order (and BERT's); pre-LN keeps a clean residual path
and is what GPT-2 and most later models use, with one more LN after the last layer.
Both orders match ``torch.nn.TransformerEncoderLayer`` with the same weights.

Shapes: x is (batch, seq, d_model), or (seq, d_model) without a batch axis. The
attention math itself lives in ``MultiHeadAttention``; nothing here scores or softmaxes.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from selfattn.attention.config import GATED_ACTIVATIONS, TransformerConfig
from selfattn.attention.kv_cache import KVCache
from selfattn.attention.modules import MultiHeadAttention, MultiHeadSteps
from selfattn.attention.points import LayerPoints, PointCall
from selfattn.checks import check_width
from selfattn.attention.norm_and_mlp import GatedFeedForward, make_norm
from selfattn.errors import ConfigError, ShapeError
from selfattn.positional import LearnedPositionalEmbedding, sinusoidal_encoding

_ACTIVATIONS = {  # F.gelu's default is the exact erf form; GPT-2's "gelu_new" is the tanh form
    "gelu": F.gelu,
    "relu": F.relu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
}


class FeedForward(nn.Module):
    """FFN(x) = act(x W_1 + b_1) W_2 + b_2, applied to each position on its own.

    (..., d_model) -> (..., d_model), through a hidden width d_ff. Dropout acts on the
    hidden activations in training only. ``linear1`` / ``linear2`` carry the names of
    ``torch.nn.TransformerEncoderLayer`` so weights copy one to one.

    Args:
        d_model: width of the input and the output.
        d_ff: hidden width (the columns of W_1).
        activation: "gelu" (default, the exact erf form), "gelu_tanh" (its tanh
            approximation, GPT-2's) or "relu". The gated "swiglu" is ``GatedFeedForward``.
        dropout: chance of dropping each hidden activation in training, in [0, 1).
        bias: whether both linear layers have biases (default True).

    Raises:
        ConfigError: a width is not a positive integer, the activation is unknown, or
            dropout is outside [0, 1).
    """

    def __init__(self, d_model: int, d_ff: int, activation: str = "gelu", dropout: float = 0.0, bias: bool = True) -> None:
        """Create the two linear layers; the class docstring describes the arguments."""
        super().__init__()
        TransformerConfig(d_model, 1, d_ff=d_ff, activation=activation, dropout=dropout, bias=bias)  # validates
        if activation not in _ACTIVATIONS:
            raise ConfigError(f"FeedForward takes {', '.join(_ACTIVATIONS)}; {', '.join(GATED_ACTIVATIONS)} are GatedFeedForward's")
        self.activation = activation
        self.linear1 = nn.Linear(d_model, d_ff, bias=bias)
        self.dropout = nn.Dropout(dropout)
        self.linear2 = nn.Linear(d_ff, d_model, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """FFN(x) = act(x W_1 + b_1) W_2 + b_2.   (..., d_model) -> (..., d_model)

        Args:
            x: (..., d_model), any number of leading axes.

        Returns:
            FFN(x), (..., d_model).
        """
        hidden = _ACTIVATIONS[self.activation](self.linear1(x))  # (..., d_ff)
        return self.linear2(_dropped(self.dropout, hidden))  # (..., d_ff) -> (..., d_model)

    def extra_repr(self) -> str:
        return f"activation={self.activation!r}"


def _dropped(dropout: nn.Dropout, x: torch.Tensor) -> torch.Tensor:
    """dropout(x), skipping the module call where it would hand x back (p = 0 or evaluation):
    a training step calls three per layer, and on small models the calls add up."""
    return dropout(x) if dropout.training and dropout.p > 0 else x


class TransformerBlock(nn.Module):
    """One layer: self-attention and a feed-forward network, each with a residual and a LayerNorm.

    (batch, seq, d_model) -> (batch, seq, d_model), or (seq, d_model) -> (seq, d_model).
    Pre-LN:  x = x + Drop(Attn(LN1(x))); x = x + Drop(FFN(LN2(x))).
    Post-LN: x = LN1(x + Drop(Attn(x))); x = LN2(x + Drop(FFN(x))).
    With sandwich_norm (pre-LN): x = x + Drop(LN3(Attn(LN1(x)))); x = x + Drop(LN4(FFN(LN2(x)))).
    The parts are ``attention`` (``MultiHeadAttention``), ``feed_forward``, ``norm1``,
    ``norm2``, ``dropout1`` and ``dropout2``; with sandwich_norm also
    ``post_attention_norm`` (LN3) and ``post_feedforward_norm`` (LN4), else None.

    Args:
        config: the block's settings; norm_first picks pre-LN or post-LN.
    """

    def __init__(self, config: TransformerConfig) -> None:
        """Create the block's layers; the class docstring describes the argument."""
        super().__init__()
        self.config = config
        d = config.d_model
        self.attention = MultiHeadAttention.from_config(config.attention)
        if config.activation in GATED_ACTIVATIONS:
            self.feed_forward = GatedFeedForward(d, config.ff_size, config.bias, config.activation)
        else:
            self.feed_forward = FeedForward(d, config.ff_size, config.activation, config.dropout, config.bias)
        self.norm1 = make_norm(config)
        self.norm2 = make_norm(config)
        self.post_attention_norm = make_norm(config) if config.sandwich_norm else None
        self.post_feedforward_norm = make_norm(config) if config.sandwich_norm else None
        self.dropout1 = nn.Dropout(config.dropout)
        self.dropout2 = nn.Dropout(config.dropout)
        self.points: LayerPoints | None = None  # hooks on the residual stream's points (``attention.points``)

    def forward(
        self,
        x: torch.Tensor,
        *,
        attn_mask: torch.Tensor | None = None,
        is_causal: bool | None = None,
        cache: KVCache | None = None,
        need_weights: bool = False,
        positions: torch.Tensor | None = None,
        real_tokens: torch.Tensor | None = None,
    ):
        """x', or (x', weights (batch, H, q_len, kv_len)) with need_weights=True.

        Args:
            x: (batch, seq, d_model), or (seq, d_model) without a batch axis.
            attn_mask: None, bool (True = may attend) or float (added to the scores),
                broadcastable to (batch, H, q_len, kv_len); kv_len counts cached keys.
            is_causal: hide later keys; None (default) means config.causal. The mask is
                aligned bottom-right, so with a cache the new tokens see every cached one.
            cache: a ``KVCache`` for this layer, extended in place with this call's keys
                and values.
            need_weights: also return the attention weights.
            positions: with RoPE, the new tokens' positions, (seq,) or (batch, seq); see
                ``MultiHeadAttention.forward``.
            real_tokens: (batch, seq) bool, a padded batch's real tokens, for the hooks of
                the intervention points (``attention.points``); None: all real.

        Returns:
            x', the shape of x; with need_weights=True the pair (x', weights), weights
                (batch, H, q_len, kv_len), or (H, q_len, kv_len) for unbatched input.

        Raises:
            ShapeError: x is not (batch, seq, d_model) or (seq, d_model), or the mask or the
                cache does not fit.
        """
        check_width(x, self.config.d_model, "x")
        causal = self.config.causal if is_causal is None else is_causal
        points = self.points
        call = None if points is None else PointCall(real_tokens, 0 if cache is None else cache.length)
        if call is not None:
            x = points.apply("resid_pre", x, call)

        def attend(h: torch.Tensor):
            options = dict(attn_mask=attn_mask, is_causal=causal, cache=cache, positions=positions)
            if real_tokens is not None:
                options["real_tokens"] = real_tokens
            if need_weights:
                out, weights = self.attention(h, **options, need_weights=True)  # weights (batch, H, q_len, kv_len)
            else:
                out, weights = self.attention(h, **options), None
            if self.post_attention_norm is not None:
                out = self.post_attention_norm(out)  # (..., seq, d_model)
            out = _dropped(self.dropout1, out)
            return (out if call is None else points.apply("attn_out", out, call)), weights

        def transform(h: torch.Tensor) -> torch.Tensor:
            out = self.feed_forward(h)  # (..., seq, d_model)
            if self.post_feedforward_norm is not None:
                out = self.post_feedforward_norm(out)
            out = _dropped(self.dropout2, out)
            return out if call is None else points.apply("mlp_out", out, call)

        if self.config.norm_first:
            attended, weights = attend(self.norm1(x))
            x = x + attended
            x = x + transform(self.norm2(x))
        else:
            attended, weights = attend(x)
            x = self.norm1(x + attended)
            x = self.norm2(x + transform(x))
        if call is not None:
            x = points.apply("resid_post", x, call)
        if not need_weights:
            return x
        if x.dim() == 2 and weights.dim() == 4:
            weights = weights[0]  # (1, H, q_len, kv_len) -> (H, q_len, kv_len)
        return x, weights


    def attention_steps(self, x: torch.Tensor, **options) -> MultiHeadSteps:
        """The block's attention on x with every intermediate (for tracing).   (batch, seq, d_model) -> MultiHeadSteps

        The attention sees what it sees inside ``forward``: LN1(x) in a pre-LN block, x
        itself in a post-LN one.

        Args:
            x: the block's input, (batch, seq, d_model).
            options: ``MultiHeadAttention.steps``'s keywords (attn_mask, is_causal, cache,
                positions); is_causal defaults to config.causal.

        Returns:
            The ``MultiHeadSteps`` of the block's attention.
        """
        options.setdefault("is_causal", self.config.causal)
        return self.attention.steps(self.norm1(x) if self.config.norm_first else x, **options)


class TransformerOutput(NamedTuple):
    """What ``Transformer`` returns. Without a batch axis in the input, none in the output.

    Attributes:
        last_hidden_state: (batch, seq, d_model), the last layer's output, after the final
            LayerNorm in a pre-LN stack.
        hidden_states: with output_hidden_states=True, n_layers + 1 tensors (batch, seq,
            d_model): the input with its positions added, then each layer's output (before
            the final norm); else None.
        attentions: with output_attentions=True, n_layers tensors (batch, H, q_len, kv_len),
            each layer's attention weights; else None.
    """

    last_hidden_state: torch.Tensor  # (batch, seq, d_model): after the final norm (pre-LN)
    hidden_states: tuple[torch.Tensor, ...] | None  # n_layers + 1 of (batch, seq, d_model)
    attentions: tuple[torch.Tensor, ...] | None  # n_layers of (batch, H, q_len, kv_len)


class Transformer(nn.Module):
    """A stack of n_layers ``TransformerBlock``s over embeddings that are already given.

    (batch, seq, d_model) -> TransformerOutput. positional "sinusoidal" adds
    PE[past .. past + seq - 1] and "learned" adds rows of a trained table to the input
    once, at the bottom; "rope" and "alibi" act inside every attention layer. Pre-LN
    stacks end with a LayerNorm ``norm`` (as GPT-2); post-LN stacks already end normalised.
    hidden_states: the input after the positions were added, then each layer's output
    (before ``norm``). With ``caches`` (one KVCache per layer, see ``new_caches``) the
    input continues a sequence of caches[0].length earlier tokens.

    Args:
        config: the stack's settings (layers, widths, norm order, positions, causal).

    Examples:
        >>> import selfattn as sa
        >>> import torch
        >>> model = sa.Transformer(sa.TransformerConfig(d_model=8, n_heads=2, n_layers=2, causal=True))
        >>> out = model(torch.randn(1, 5, 8), output_attentions=True)
        >>> tuple(out.last_hidden_state.shape), len(out.attentions), tuple(out.attentions[0].shape)
        ((1, 5, 8), 2, (1, 2, 5, 5))
        >>> out.hidden_states is None
        True
        >>> caches = model.new_caches()  # decode piece by piece: a prompt, then one token
        >>> _ = model(torch.randn(1, 4, 8), caches=caches)
        >>> tuple(model(torch.randn(1, 1, 8), caches=caches).last_hidden_state.shape), caches[0].length
        ((1, 1, 8), 5)
    """

    def __init__(self, config: TransformerConfig) -> None:
        """Create the layers; the class docstring describes the argument."""
        super().__init__()
        self.config = config
        self.position_embedding = (
            LearnedPositionalEmbedding(config.max_positions, config.d_model) if config.positional == "learned" else None
        )
        self.layers = nn.ModuleList(TransformerBlock(config) for _ in range(config.n_layers))
        self.norm = make_norm(config) if config.norm_first else None

    def new_caches(self) -> list[KVCache]:
        """One empty KVCache per layer, for decoding a sequence piece by piece.

        Returns:
            A list of n_layers empty ``KVCache`` objects, to pass as ``caches``.
        """
        return [KVCache() for _ in self.layers]

    def forward(
        self,
        x: torch.Tensor,
        *,
        attn_mask: torch.Tensor | None = None,
        is_causal: bool | None = None,
        caches: list[KVCache] | None = None,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
        real_tokens: torch.Tensor | None = None,
    ) -> TransformerOutput:
        """Run every block over x (positions added first).   (batch, seq, d_model) -> TransformerOutput

        Args:
            x: the embeddings, (batch, seq, d_model) or (seq, d_model).
            attn_mask: None, bool (True = may attend) or float (added), broadcastable to
                (batch, H, seq, kv_len), the same for every layer; kv_len = past + seq.
            is_causal: hide later keys (bottom-right); None (default) means config.causal.
            caches: None, or one ``KVCache`` per layer (``new_caches``), all of the same
                length; each is extended in place, and x continues the cached sequence.
            output_attentions: also return each layer's attention weights.
            output_hidden_states: also return the hidden states between the layers.
            real_tokens: (batch, seq) bool, a padded batch's real tokens, for the hooks of
                the intervention points (``attention.points``); None: all real.

        Returns:
            A ``TransformerOutput``; shapes lose the batch axis when x has none.

        Raises:
            ShapeError: x is not (batch, seq, d_model) or (seq, d_model); caches is not a
                list of one KVCache per layer, or they hold different lengths; a learned
                positional table is too short for the positions; the mask does not fit.
        """
        check_width(x, self.config.d_model, "x")
        past = self._past_length(caches)
        unbatched = x.dim() == 2
        if unbatched:
            x = x[None]  # (seq, d_model) -> (1, seq, d_model)
        x = x + self._positions(x.shape[1], past, x)  # (batch, seq, d_model) + (seq, d_model)

        hidden_states, attentions = [x], []
        extra = {} if real_tokens is None else {"real_tokens": real_tokens}
        for i, layer in enumerate(self.layers):
            cache = None if caches is None else caches[i]
            if output_attentions:
                x, weights = layer(x, attn_mask=attn_mask, is_causal=is_causal, cache=cache, need_weights=True, **extra)
                attentions.append(weights)  # (batch, H, q_len, kv_len)
            else:
                x = layer(x, attn_mask=attn_mask, is_causal=is_causal, cache=cache, **extra)
            hidden_states.append(x)  # (batch, seq, d_model)
        last = x if self.norm is None else self.norm(x)  # (batch, seq, d_model)

        if unbatched:
            last = last[0]
            hidden_states = [h[0] for h in hidden_states]  # each (seq, d_model)
            attentions = [a[0] for a in attentions]  # each (H, q_len, kv_len)
        return TransformerOutput(
            last,
            tuple(hidden_states) if output_hidden_states else None,
            tuple(attentions) if output_attentions else None,
        )

    def _positions(self, seq: int, past: int, x: torch.Tensor) -> torch.Tensor | int:
        """The additive position codes for positions past .. past + seq - 1.   -> (seq, d_model), or 0"""
        if self.config.positional == "sinusoidal":
            return sinusoidal_encoding(seq, self.config.d_model, offset=past, dtype=x.dtype, device=x.device)
        if self.position_embedding is not None:
            return self.position_embedding(seq, offset=past)  # (seq, d_model)
        return 0  # "none", or positions that act inside attention (rope, alibi)

    def _past_length(self, caches: list[KVCache] | None) -> int:
        if caches is None:
            return 0
        n_layers = len(self.layers)
        if not isinstance(caches, (list, tuple)) or len(caches) != n_layers:
            got = len(caches) if isinstance(caches, (list, tuple)) else f"a {type(caches).__name__}"
            raise ShapeError(
                f"caches must be a list of one KVCache per layer ({n_layers}), got {got}; "
                f"use Transformer.new_caches()"
            )
        lengths = [cache.length for cache in caches]
        if len(set(lengths)) > 1:
            raise ShapeError(f"the caches hold different lengths {lengths}; every layer must have seen the same tokens")
        return lengths[0]

