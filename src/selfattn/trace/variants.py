"""Trace one attention variant on a sentence: every intermediate, for the explainer.

The variants grow the seed step by step (each adds one idea):

    simple     softmax(X X^T) X                        the seed
    scaled     softmax(X X^T / sqrt(d)) X              + scaling
    qkv        softmax(Q K^T / sqrt(d_k)) V            + learned projections
    causal     ... + mask: no token sees a later one   + causal mask
    multihead  H heads side by side, concat, W_o       + heads
    gqa        H query heads share K key/value heads   + grouped-query attention
    flash      the seed, keys folded in block by block  online softmax (FlashAttention)

All the arithmetic goes through ``attention_steps`` and ``MultiHeadAttention.steps``
(and, for flash, the kernel's pieces in ``flash_trace``); this module only chooses
inputs and records what comes back. Projection weights are seeded and untrained.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import torch

from selfattn.attention.functional import attention_steps
from selfattn.trace.flash_trace import trace_flash
from selfattn.trace.record import AttentionTrace, Inputs, LayerSteps, Query
from selfattn.masks import causal_mask, combine_masks
from selfattn.errors import OptionError, did_you_mean
from selfattn.pipeline.embeddings import EmbeddingSource, check_matrix
from selfattn.pipeline.steps import attention_scores
from selfattn.pipeline.tokenize import find_query
from selfattn.positional import LearnedPositionalEmbedding, alibi_slopes, apply_rope, rope_angles
from selfattn.positional import check_positional, sinusoidal_encoding
from selfattn.positional.rope import DistanceScore
from selfattn.trace.seed import check_dot_products
from selfattn.trace.variant_names import (
    MULTI_HEAD,
    PROJECTED,
    UNSCALED,
    VARIANTS,
    default_d_k,
    default_heads,
    distance_check_key,
)
from selfattn.trace.variant_setup import (
    LEARNED_TABLE_ROWS,
    LEARNED_TABLE_SEED_OFFSET,
    alibi_for_variant,
    distance_check_for,
    seeded_attention,
)



@dataclass(frozen=True)
class PositionalSection:
    """How positions entered a variant: the encoding's name and what it made.

    Attributes:
        name: "none", "sinusoidal", "learned", "rope" or "alibi".
        encoding: (n, d), the table added to X (sinusoidal, learned); None otherwise.
        rope_angles: (n, d_k // 2), each feature pair's angle, with RoPE; None otherwise.
        alibi_slopes: (H,), each head's slope, with ALiBi; None otherwise.
        alibi_bias: (H, n, n), -slope * distance, with ALiBi; None otherwise.
        distance_check: with RoPE, one (q, k) pair placed at several position pairs; None otherwise.
        distance_check_key: the token whose key the distance check uses.
    """

    name: str
    encoding: torch.Tensor | None = None
    rope_angles: torch.Tensor | None = None
    alibi_slopes: torch.Tensor | None = None
    alibi_bias: torch.Tensor | None = None
    distance_check: tuple[DistanceScore, ...] | None = None
    distance_check_key: int = 0


@dataclass(frozen=True)
class Projections:
    """The variants' seeded, untrained projections: Q = X W_q, K = X W_k, V = X W_v."""

    w_q: torch.Tensor  # (d, H d_k)
    w_k: torch.Tensor  # (d, K d_k)
    w_v: torch.Tensor  # (d, K d_k)


@dataclass(frozen=True)
class Scaling:
    """The same softmax without the 1 / sqrt(d_k), to show what scaling changes."""

    weights_unscaled: torch.Tensor  # (H, n, n)


@dataclass(frozen=True)
class CausalMask:
    """The causal variant's mask, as its outputs name it: which rule and which alignment (the mask is the core's ``allowed``)."""

    kind: str = "causal"
    align: str = "top_left"


@dataclass(frozen=True)
class VariantRows:
    """How a variant shows the core's steps: multihead and gqa keep the heads axis; the single-head variants drop it."""

    keeps_heads_axis: bool


@dataclass(frozen=True)
class Multihead:
    """The heads side by side and the output projection: output = concat W_o."""

    concat: torch.Tensor  # (n, H d_v)
    w_o: torch.Tensor  # (H d_v, d)


VariantTrace = AttentionTrace
"""The old name of what ``trace_variant`` returns (it was a view of the record; now the record itself)."""


def trace_variant(
    tokens: list[str],
    embeddings: torch.Tensor,
    variant: str = "scaled",
    *,
    query: str | int | None = None,
    heads: int | None = None,
    kv_heads: int | None = None,
    d_k: int | None = None,
    positional: str = "none",
    seed: int = 0,
    source: EmbeddingSource | None = None,
    block_size: int | None = None,
) -> AttentionTrace:
    """Run ``variant`` on X (n, d) and record every step.   n tokens, (n, d) -> AttentionTrace

    The arithmetic is that of ``attention_steps`` and ``MultiHeadAttention.steps``;
    projection weights are untrained, drawn from N(0, 1 / fan_in) with ``seed``. X is
    detached. An unknown ``variant`` or ``positional`` name is refused; options that do
    not apply to the variant are ignored here (``ExplainConfig`` refuses them).

    Args:
        tokens: the n tokens, in sentence order.
        embeddings: X, (n, d), one row per token.
        variant: one of ``VARIANTS``; default "scaled".
        query: the query token (case-sensitive, first occurrence) or its 0-based
            position. None: position 1 (0 for a one-token sentence).
        heads: query heads, for "multihead" and "gqa". None: 2 for multihead, 4 for gqa.
        kv_heads: key/value heads, for "gqa"; must divide ``heads``. None: half the
            heads (1 if their number is odd).
        d_k: the width of each head's queries and keys, for the variants with
            projections. None: d / heads, at least 2 and, with RoPE, even.
        positional: "none" (default), "sinusoidal", "learned", "rope" or "alibi".
        seed: seeds the projection weights and the learned position table (default 0).
        source: where X came from, recorded in the trace. None: "given by the caller".
        block_size: keys per block for the flash variant. None: 2.

    Returns:
        The record (``AttentionTrace``): the variant's one layer of steps (``trace.steps``:
            q, k, v, scores, scaled, masked, weights, context per head) and its sections
            ("inputs", "positional", "scaling", and "projections", "mask", "multihead",
            "flash" where the variant has them).

    Raises:
        OptionError: ``variant`` or ``positional`` is not a known name.
        EmbeddingError: ``embeddings`` is not (n, d) with one row per token.
        QueryError: ``query`` is not a token of the sentence or out of range.
        EmbeddingError: the dot products of the inputs overflow their dtype.
        ShapeError: RoPE on an odd width, without projections (odd d).
        ConfigError: the projected heads cannot be built: ``heads`` not a multiple of
            ``kv_heads``, or RoPE with an odd ``d_k``.
        OptionError: ``block_size`` is not a positive int.

    Examples:
        >>> import selfattn as sa
        >>> tokens = sa.tokenize(sa.SEED_SENTENCE)
        >>> trace = sa.trace_variant(tokens, sa.seed_embeddings(tokens), "scaled")
        >>> round(trace.steps.scale, 4), tuple(trace.steps.weights.shape)
        (0.5774, (1, 7, 7))
        >>> trace.steps.output[1].round(decimals=4)  # "cat", with scores divided by sqrt(3)
        tensor([0.4859, 0.5813, 0.5887])
    """
    if variant not in VARIANTS:
        raise OptionError(f"unknown variant {variant!r}: choose one of {', '.join(VARIANTS)}{did_you_mean(variant, VARIANTS)}")
    check_positional(positional)
    x = check_matrix(tokens, embeddings).detach()
    n, d = x.shape
    q_index = find_query(tokens, query)
    heads, kv_heads = default_heads(variant, heads, kv_heads)
    generator = torch.Generator().manual_seed(seed)  # the projections: the same for every sentence length
    encoding = _position_encoding(positional, n, d, seed, x.dtype)
    inputs = x if encoding is None else x + encoding  # (n, d)
    check_dot_products(attention_scores(inputs, inputs), x)  # (n, n)
    causal = causal_mask(n, n) if variant == "causal" else None
    if variant in PROJECTED:
        made = _projected_heads(variant, inputs, heads, kv_heads, d_k or default_d_k(d, heads, positional), positional,
                                generator, causal is not None)
    else:
        made = _seed_form_heads(variant, inputs, positional, causal)
    flash = None
    if variant == "flash":
        flash = trace_flash(made.q, made.k, made.v, made.mask, block_size=block_size, scale=made.scale)
        made = made._replace(output=flash.output)  # flash_attention's result; the plain softmax's stays in head_outputs
    unscaled = attention_steps(made.q, made.k, made.v, attn_mask=made.mask, scale=1.0,
                               enable_gqa=made.heads != made.kv_heads)
    steps = _layer_steps(made, inputs, causal, unscaled, positional)
    sections = {
        "inputs": Inputs(variant, source or EmbeddingSource("given", False, "given by the caller"), seed),
        "positional": _positional_section(positional, made, encoding, q_index, n, x.dtype),
    }
    if made.w_q is not None:
        sections["projections"] = Projections(made.w_q, made.w_k, made.w_v)
    sections["scaling"] = Scaling(unscaled.weights.reshape(made.heads, n, n))
    if causal is not None:
        sections["mask"] = CausalMask()
    if made.concat is not None:
        sections["multihead"] = Multihead(made.concat, made.w_o)
    if flash is not None:
        sections["flash"] = flash
    sections["variant"] = VariantRows(keeps_heads_axis=variant in MULTI_HEAD)
    return AttentionTrace(list(tokens), Query(q_index, tokens[q_index]), x, (steps,), sections=sections)


class _Heads(NamedTuple):
    """What one variant's attention made: its heads' q, k, v (and before RoPE), the steps, the weights."""

    q: torch.Tensor  # (H, n, d_k)
    k: torch.Tensor  # (K, n, d_k)
    v: torch.Tensor  # (K, n, d_v)
    q_plain: torch.Tensor  # before RoPE
    k_plain: torch.Tensor
    attention: object  # attention_steps' record
    mask: torch.Tensor | None
    scale: float
    heads: int
    kv_heads: int
    d_k: int
    output: torch.Tensor  # (n, d) or the single head's (n, d_k)
    w_q: torch.Tensor | None = None  # the projections (in, out), None for the seed's own form
    w_k: torch.Tensor | None = None
    w_v: torch.Tensor | None = None
    w_o: torch.Tensor | None = None  # the output projection, multi-head variants only
    concat: torch.Tensor | None = None  # the heads side by side, multi-head variants only


def _position_encoding(positional: str, n: int, d: int, seed: int, dtype: torch.dtype) -> torch.Tensor | None:
    """The table added to X: sinusoidal, learned (seeded), or None for RoPE, ALiBi and none."""
    if positional == "sinusoidal":
        return sinusoidal_encoding(n, d, dtype=dtype)
    if positional == "learned":
        # A stream of its own, so the table cannot shift the projections' draws, and always the same
        # size, so position p gets the same row in a sentence of any length (up to 512 tokens).
        table_generator = torch.Generator().manual_seed(seed + LEARNED_TABLE_SEED_OFFSET)
        table = LearnedPositionalEmbedding(max(n, LEARNED_TABLE_ROWS), d, generator=table_generator)
        return table(n).detach().to(dtype)
    return None


def _projected_heads(variant: str, inputs: torch.Tensor, heads: int, kv_heads: int, d_k: int, positional: str,
                     generator: torch.Generator, is_causal: bool) -> _Heads:
    """The variants with W_Q, W_K, W_V (untrained, seeded): ``MultiHeadAttention.steps`` on X."""
    n = inputs.shape[0]
    module = seeded_attention(inputs.shape[1], heads, kv_heads, d_k, positional, generator)
    with torch.no_grad():
        steps = module.steps(inputs, is_causal=is_causal)
        q_plain = module.w_q(inputs).view(n, heads, d_k).transpose(0, 1)  # (n, H d_k) -> (H, n, d_k)
        k_plain = module.w_k(inputs).view(n, kv_heads, d_k).transpose(0, 1)  # (K, n, d_k)
    attention = steps.attention
    w_q, w_k, w_v, w_o = (layer.weight.detach().T for layer in (module.w_q, module.w_k, module.w_v, module.w_o))
    multi = variant in MULTI_HEAD
    return _Heads(steps.q[0], steps.k[0], steps.v[0], q_plain, k_plain, attention, steps.mask, attention.scale, heads,
                  kv_heads, d_k, output=steps.output if multi else attention.output[0, 0], w_q=w_q, w_k=w_k, w_v=w_v,
                  w_o=w_o if multi else None, concat=steps.concat if multi else None)


def _seed_form_heads(variant: str, inputs: torch.Tensor, positional: str, causal: torch.Tensor | None) -> _Heads:
    """The seed's own form: queries, keys and values are X itself, one head."""
    n, d = inputs.shape
    scale = 1.0 if variant in UNSCALED else 1.0 / math.sqrt(d)
    plain = inputs[None]  # (1, n, d)
    # An odd width (the seed's 3-d vectors) turns its leading pairs; the last feature stays put.
    q = k = apply_rope(plain, rotary_dim=d - d % 2) if positional == "rope" else plain
    mask = combine_masks(causal, alibi_for_variant(positional, 1, n, inputs.dtype), dtype=inputs.dtype)
    attention = attention_steps(q, k, plain, attn_mask=mask, scale=scale)
    return _Heads(q, k, plain, plain, plain, attention, mask, scale, 1, 1, d, output=attention.output[0])


def _layer_steps(made: _Heads, inputs: torch.Tensor, causal, unscaled, positional: str) -> LayerSteps:
    """The record's one layer, every head's steps under the record's names."""
    heads, n = made.heads, inputs.shape[0]
    attention, softmax, rope = made.attention, made.attention.softmax, positional == "rope"
    return LayerSteps(
        input=inputs,
        q=made.q,
        k=made.k,
        v=made.v,
        q_plain=made.q_plain if rope else None,
        k_plain=made.k_plain if rope else None,
        kv_head_of=tuple(h // (heads // made.kv_heads) for h in range(heads)),
        scale=made.scale,
        allowed=causal,
        scores=unscaled.scores.reshape(heads, n, n),
        scaled=attention.scores.reshape(heads, n, n),
        masked=attention.masked_scores.reshape(heads, n, n),
        row_max=softmax.shift.reshape(heads, n),
        exp=softmax.exp.reshape(heads, n, n),
        exp_sum=softmax.total.reshape(heads, n),
        weights=attention.weights.reshape(heads, n, n),
        context=attention.output.reshape(heads, n, -1),
        output=made.output,
        scores_plain=_scores_plain(made.q_plain, made.k_plain, heads // made.kv_heads) if rope else None,
    )


def _positional_section(positional: str, made: _Heads, encoding, q_index: int, n: int,
                        dtype: torch.dtype) -> PositionalSection:
    """What the positions added: the table, RoPE's angles, ALiBi's slopes and bias, the distance check."""
    d_k = made.d_k
    return PositionalSection(
        name=positional,
        encoding=encoding,
        rope_angles=rope_angles(torch.arange(n), d_k - d_k % 2).to(dtype) if positional == "rope" else None,
        alibi_slopes=alibi_slopes(made.heads).to(dtype) if positional == "alibi" else None,
        alibi_bias=alibi_for_variant(positional, made.heads, n, dtype),
        distance_check=distance_check_for(positional, made.q_plain, made.k_plain, q_index),
        distance_check_key=distance_check_key(q_index, n),
    )


def _scores_plain(q_plain: torch.Tensor, k_plain: torch.Tensor, group: int) -> torch.Tensor:
    """q . k before RoPE's turn, every query head with its key/value head.   (H, n, d_k), (K, n, d_k) -> (H, n, n)"""
    return torch.stack([attention_scores(q_plain[h], k_plain[h // group]) for h in range(q_plain.shape[0])])
