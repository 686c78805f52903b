"""ONE record of attention on a sentence: the seed, every variant, flash and every model alike.

    AttentionTrace
        tokens, query (index, token), embeddings X
        layers: per layer, every head's steps, the same names for every kind:
            q, k, v (after positions)  q_plain, k_plain (before RoPE)  kv_head_of  scale
            scores = q . k   scaled = scale scores   masked (+ bias, -inf where hidden)
            row_max  exp  exp_sum  weights  context = weights V   allowed (the mask)  output
            (a model's long text: the chosen layer so, every other one as ``LayerRows``:
            q, k, v, context and the softmax's lse, no n x n matrix)
        layer, head: the ones chosen to explain
        sections: what a kind has more, by name, in the order the outputs show them:
            "inputs"      a toy trace's variant, embeddings' source and seed
            "seed"        the seed's walk of one query: terms, loops, the naive softmax, plain division
            "positional"  the encoding: its table, RoPE's angles and distance check, ALiBi's slopes
            "projections" the variants' seeded W_q, W_k, W_v
            "scaling"     the same softmax without 1 / sqrt(d_k)
            "mask"        the causal variant's rule and alignment (the mask itself is ``allowed``)
            "multihead"   the heads side by side and W_o
            "flash"       the online softmax, key block by key block (``FlashTrace``)
            "variant"     how a variant shows the core's steps (with or without the heads axis)
            "model"       a model's name, tokens as they read, embedding step, layers' descriptions,
                          hidden states

Plain data: it imports no renderer and computes nothing once built, but for one thing: a
layer kept as ``LayerRows`` rebuilds the rows of its weights asked for, exactly, from its q,
k and the softmax's log-sum-exp (``attention_probs_from_lse``, the kernels' own). The functions that
fill it are ``trace_self_attention`` (seed.py), ``trace_variant`` (variants.py) and
``trace_model`` (model_trace.py), which return it; ``Trace``, ``VariantTrace`` and
``ModelTrace`` are its old names (aliases), and the names their views gave its fields
still read for one release, with a warning (``old_views.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from selfattn.kernels.probs_from_lse import attention_probs_from_lse
from selfattn.pipeline.embeddings import EmbeddingSource


@dataclass(frozen=True)
class Query:
    """The query a walkthrough follows: its 0-based position and its token."""

    index: int
    token: str


@dataclass(frozen=True)
class Inputs:
    """Where a toy trace's X came from: the variant that ran, the embeddings' source, the seed of its weights.

    Attributes:
        variant: the variant's name ("simple" for the seed).
        source: the embeddings' source (``EmbeddingSource``).
        seed: the seed of the untrained weights; None for the seed's own attention.
    """

    variant: str
    source: EmbeddingSource
    seed: int | None = None


@dataclass(frozen=True)
class LayerSteps:
    """One layer's attention on the sentence, every head.   H query heads, K key/value heads, n tokens.

    Attributes:
        input: (n, d), what the attention reads (X + P, or a block's normed input).
        q: (H, n, d_head), the queries, after RoPE where there is RoPE.
        k: (K, n, d_head), the keys, after RoPE.
        v: (K, n, d_v), the values.
        q_plain: (H, n, d_head), the queries before RoPE; None without RoPE.
        k_plain: (K, n, d_head), the keys before RoPE; None without RoPE.
        kv_head_of: for each query head, the key/value head it reads.
        scale: the factor on q . k (1 / sqrt(d_head), or 1 for the seed's own scores).
        scores: (H, n, n), q_i . k_j.
        scaled: (H, n, n), scale * q_i . k_j.
        masked: (H, n, n), the softmax's input: the scaled scores plus any bias, -inf where hidden.
        row_max: (H, n), m, the stable softmax's shift per row.
        exp: (H, n, n), exp(masked - m).
        exp_sum: (H, n), each row of exp summed.
        weights: (H, n, n), the attention weights; each row sums to 1.
        context: (H, n, d_v), weights @ V per head.
        allowed: (n, n) bool, True = may attend; None: every key.
        scores_plain: (H, n, n), q_plain . k_plain: the scores RoPE's turn started from; None without RoPE.
        output: (n, d_out), the layer's result (after W_o, or the block's output); None when
            the kind has none of its own.
    """

    input: torch.Tensor
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    q_plain: torch.Tensor | None
    k_plain: torch.Tensor | None
    kv_head_of: tuple[int, ...]
    scale: float
    scores: torch.Tensor
    scaled: torch.Tensor
    masked: torch.Tensor
    row_max: torch.Tensor
    exp: torch.Tensor
    exp_sum: torch.Tensor
    weights: torch.Tensor
    context: torch.Tensor
    allowed: torch.Tensor | None = None
    output: torch.Tensor | None = None
    scores_plain: torch.Tensor | None = None

    @property
    def n_heads(self) -> int:
        """H, the query heads."""
        return int(self.weights.shape[0])

    def weight_rows(self, rows: list[int]) -> torch.Tensor:
        """The weights of the queries ``rows`` (0-based positions), every head.   -> (H, len(rows), n)"""
        return self.weights[:, list(rows)]  # (H, rows, n)


@dataclass(frozen=True)
class LayerRows:
    """One layer's attention kept without any n x n matrix (a long text's other layers).   H, K heads, n tokens.

    What the tiled kernel leaves: q, k, v, each head's output and each row's log-sum-exp
    of the softmax's input, lse_i = log sum_j exp(s_ij), s_ij = scale q_i . k_j where
    ``allowed`` lets query i see key j, -inf elsewhere (the layer's whole mask: no bias).
    Any row of the weights follows exactly from them, P_ij = exp(s_ij - lse_i): ``weight_rows``
    computes the rows asked for, ``weights`` all of them (n x n per head: one layer at a
    time, not the whole model's at once).

    Attributes:
        input, q, k, v, q_plain, k_plain, kv_head_of, scale, context, allowed, output: as in
            ``LayerSteps``.
        lse: (H, n), log sum_j exp(s_ij) over the keys row i may see.
    """

    input: torch.Tensor
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    q_plain: torch.Tensor | None
    k_plain: torch.Tensor | None
    kv_head_of: tuple[int, ...]
    scale: float
    lse: torch.Tensor
    context: torch.Tensor
    allowed: torch.Tensor | None = None
    output: torch.Tensor | None = None

    @property
    def n_heads(self) -> int:
        """H, the query heads."""
        return int(self.q.shape[0])

    def weight_rows(self, rows: list[int]) -> torch.Tensor:
        """The weights of the queries ``rows``, every head: P_ij = exp(s_ij - lse_i).   -> (H, len(rows), n)

        Args:
            rows: 0-based query positions (negative ones count from the end).
        """
        return attention_probs_from_lse(
            self.q, self.k, self.lse, rows=list(rows), attn_mask=self.allowed, scale=self.scale,
            enable_gqa=self.q.shape[0] != self.k.shape[0],
        )  # (H, n, d_head), (K, n, d_head), (H, n) -> (H, rows, n)

    @property
    def weights(self) -> torch.Tensor:
        """Every row of the weights, rebuilt from lse.   -> (H, n, n)"""
        return self.weight_rows(range(self.q.shape[1]))


@dataclass(frozen=True)
class AttentionTrace:
    """Attention on one sentence with every intermediate: the one record every renderer reads.

    Attributes:
        tokens: the n tokens (a model's as its vocabulary writes them).
        query: the query followed (index, token).
        embeddings: (n, d), X: the table's vectors, or a model's first hidden state.
        layers: per layer, every head's steps (``LayerSteps``); on a model's long text every
            layer but the chosen one as ``LayerRows``.
        layer: the layer chosen to explain, from 0.
        head: the head chosen to explain, from 0.
        sections: what this kind has more, by name (see the module's docstring), in the
            order the outputs show them.
    """

    tokens: list[str]
    query: Query
    embeddings: torch.Tensor
    layers: tuple[LayerSteps | LayerRows, ...]
    layer: int = 0
    head: int = 0
    sections: dict[str, Any] = field(default_factory=dict)

    @property
    def n_layers(self) -> int:
        """The number of layers traced."""
        return len(self.layers)

    @property
    def n_heads(self) -> int:
        """H, the query heads of a layer."""
        return self.layers[0].n_heads

    @property
    def steps(self) -> LayerSteps:
        """The chosen layer's steps."""
        return self.layers[self.layer]

    @property
    def all_weights(self) -> torch.Tensor:
        """Every layer's and head's weights.   -> (layers, heads, n, n)

        Layers kept as ``LayerRows`` are rebuilt here, one at a time, but the result holds
        them all: L x H x n x n numbers. For a few rows, ``weight_rows`` of each layer.
        """
        return torch.stack([steps.weights for steps in self.layers])

    @property
    def masks(self) -> tuple[torch.Tensor | None, ...]:
        """Every layer's (n, n) bool mask, True = may attend; None: every key."""
        return tuple(steps.allowed for steps in self.layers)

    def __getattr__(self, name: str) -> Any:
        """An old view's name (``trace.weights``, ``trace.q``, ...), read as the view read it, with a warning.

        Called only for names the record does not have; ``old_views`` holds them for one release.
        """
        if name.startswith("__"):
            raise AttributeError(name)
        from selfattn.trace.old_views import read_old_name

        return read_old_name(self, name)

    def section(self, name: str) -> Any:
        """The section called ``name``, or None when this kind has none.

        Args:
            name: the section's name ("seed", "positional", "flash", "model", ...).

        Returns:
            The section's record, or None.
        """
        return self.sections.get(name)


def record_of(trace: Any) -> AttentionTrace:
    """The record, checked: what every renderer's entry point is handed.

    Args:
        trace: an ``AttentionTrace`` (what ``trace_self_attention``, ``trace_variant``,
            ``trace_model`` and ``build_trace`` return).

    Returns:
        The same ``AttentionTrace``.

    Raises:
        TypeError: ``trace`` is something else (a bug of the caller's, not a user's input).
    """
    if not isinstance(trace, AttentionTrace):
        raise TypeError(f"expected an AttentionTrace, got {type(trace).__name__}")
    return trace
