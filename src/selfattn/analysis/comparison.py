"""One query token in two sentences: where each head looks, and how far its vector moves.

Each sentence is traced on its own with ``build_trace`` (the same run `selfattn explain`
makes), and this module only reads the traces:

    top_X(l, h)   the three keys j with the largest a_lh[q_X, j] in sentence X
    H_X(l, h)     -sum_j a_lh[q_X, j] log2 a_lh[q_X, j], the query row's entropy in bits
    cos_l         h_l(A)[q_A] . h_l(B)[q_B] / (|h_l(A)[q_A]| |h_l(B)[q_B]|)   models only,
                  l = embeddings, layer 0, ..., layer L - 1
    similarity    e_A . e_B, the sentence embeddings of `selfattn similarity`  encoders only

The toy variants have one layer (layer 0); a model has its own layers and heads, and its
own mask per layer (causal, a sliding window), read from each block's own steps
(the trace's ``masks``): a key a mask hides is never among the top keys. A causal decoder was
never trained to make one vector of a whole sentence, so it gets no similarity, only a
note that says why.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from selfattn.models.description import AttentionInfo
from selfattn.analysis.head_roles import row_entropy

TOP_TOKENS = 3  # as many as explain's "top"


@dataclass(frozen=True)
class AttendedToken:
    """A key the query attends to in one head, and its weight.

    Attributes:
        token: the key token, as the vocabulary writes it ('Ġcat', '##s').
        index: its 0-based position in its sentence's tokens (a model's special tokens
            count: [CLS] or <s> is 0).
        weight: a[q, index], the query's attention weight on it.
        readable: how a model's token reads decoded alone (' cat'); None for the toy variants.
    """

    token: str
    index: int
    weight: float
    readable: str | None = None


@dataclass(frozen=True)
class HeadComparison:
    """One head of one layer, read for the query in both sentences.

    Attributes:
        layer: the layer, from 0 (always 0 for the toy variants).
        head: the head, from 0.
        top_a: the (up to) three keys with the largest weight in sentence A, largest
            first; ties keep sentence order. Keys a mask hides are left out.
        top_b: the same in sentence B.
        entropy_a: the entropy of the query's row in sentence A, in bits (0: all the
            weight on one key; log2 n: spread evenly over n keys).
        entropy_b: the same in sentence B.
    """

    layer: int
    head: int
    top_a: tuple[AttendedToken, ...]
    top_b: tuple[AttendedToken, ...]
    entropy_a: float
    entropy_b: float


@dataclass(frozen=True)
class Comparison:
    """A query token in two sentences, every head and (for a model) every layer.

    What ``compare`` returns; renderers read it. L layers, H heads, n_a and n_b tokens.

    Attributes:
        sentences: the two sentences, A then B.
        tokens_a: the tokens of A: words for the toy variants; for a model its own
            tokens as its vocabulary writes them (WordPiece with [CLS] and [SEP],
            byte-level BPE with 'Ġ' for a space ...), special tokens included.
        tokens_b: the tokens of B.
        index_a: the query's 0-based position in ``tokens_a``.
        index_b: the query's 0-based position in ``tokens_b``.
        model: the model's name, or None for the toy variants.
        variant: the attention variant, or "model".
        positional: the positional encoding of the toy variants ("none", "sinusoidal",
            "learned", "rope" or "alibi"); a model's own: "learned" (a trained table)
            or "rope".
        source: where the vectors came from, in words.
        n_layers: L (1 for the toy variants).
        n_heads: H.
        weights_a: (L, H, n_a), the query's row of weights in every head on sentence A.
        weights_b: (L, H, n_b), the same on sentence B.
        heads: one ``HeadComparison`` per layer and head, layer by layer.
        vectors_a: (L + 1, d), the query's vector in A after the embeddings and after
            each layer; None for the toy variants.
        vectors_b: (L + 1, d), the same in B; None for the toy variants.
        token_cosine: L + 1 cosines of ``vectors_a`` and ``vectors_b``, row by row
            (embeddings first); None for the toy variants.
        similarity: the cosine of the two sentence embeddings (mean-pooled, length 1),
            as ``selfattn similarity`` prints it; None for the toy variants and for a
            causal decoder (see ``notes``).
        notes: remarks on how to read this comparison (empty when there are none).
        readable_a: a model's tokens of A each decoded alone (' cat' for 'Ġcat'); None
            for the toy variants.
        readable_b: the same for B.
        special_tokens: the model's special tokens ([CLS], <s> ...); empty for the toy variants.
        attention: a model's first layer's ``AttentionInfo`` (causal, positions, key/value
            heads); None for the toy variants.
        model_arg: the model as it was given (a name or a folder), for commands to rerun.
    """

    sentences: tuple[str, str]
    tokens_a: list[str]
    tokens_b: list[str]
    index_a: int
    index_b: int
    model: str | None
    variant: str
    positional: str
    source: str
    n_layers: int
    n_heads: int
    weights_a: torch.Tensor  # (L, H, n_a)
    weights_b: torch.Tensor  # (L, H, n_b)
    heads: tuple[HeadComparison, ...]
    vectors_a: torch.Tensor | None = None  # (L + 1, d)
    vectors_b: torch.Tensor | None = None  # (L + 1, d)
    token_cosine: tuple[float, ...] | None = None  # (L + 1,)
    similarity: float | None = None
    notes: tuple[str, ...] = ()
    readable_a: list[str] | None = None
    readable_b: list[str] | None = None
    special_tokens: frozenset[str] = frozenset()
    attention: AttentionInfo | None = None
    model_arg: str | None = None

    @property
    def token_a(self) -> str:
        """The query token as sentence A spells it, ``tokens_a[index_a]``."""
        return self.tokens_a[self.index_a]

    @property
    def token_b(self) -> str:
        """The query token as sentence B spells it, ``tokens_b[index_b]``."""
        return self.tokens_b[self.index_b]


def compare_traces(sentences, traces, indices, model: str | None = None, similarity: float | None = None) -> Comparison:
    """The ``Comparison`` of one query in two traces: per layer and head its top keys and entropy.

    Args:
        sentences: the two sentences.
        traces: their traces (both the seed's or a variant's, or both a model's).
        indices: the query's position in each.
        model: the model as the user named it; None for the toy variants.
        similarity: an encoder's sentence similarity (e_A . e_B), or None.

    Returns:
        The ``Comparison``.
    """
    rows = [_query_rows(trace, q) for trace, q in zip(traces, indices)]  # (L, H, n) each
    n_layers, n_heads = rows[0].shape[:2]
    allowed = [_allowed_keys(trace, q) for trace, q in zip(traces, indices)]  # (L, n) bool each
    models = [trace.section("model") for trace in traces]
    shown = [None if m is None else m.readable for m in models]
    heads = tuple(
        HeadComparison(
            layer=layer,
            head=head,
            top_a=_top(rows[0][layer, head], traces[0].tokens, allowed[0][layer], shown[0]),
            top_b=_top(rows[1][layer, head], traces[1].tokens, allowed[1][layer], shown[1]),
            entropy_a=_entropy(rows[0][layer, head]),
            entropy_b=_entropy(rows[1][layer, head]),
        )
        for layer in range(n_layers)
        for head in range(n_heads)
    )
    common = {
        "sentences": tuple(sentences), "tokens_a": list(traces[0].tokens), "tokens_b": list(traces[1].tokens),
        "index_a": indices[0], "index_b": indices[1], "n_layers": n_layers, "n_heads": n_heads,
        "weights_a": rows[0], "weights_b": rows[1], "heads": heads,
    }
    if model is None:
        inputs, positions = traces[0].sections["inputs"], traces[0].section("positional")
        return Comparison(model=None, variant=inputs.variant, positional="none" if positions is None else positions.name,
                          source=inputs.source.description, **common)
    # the query's vector after the embeddings and after each layer: (L + 1, d) each
    vectors = [torch.stack([h[trace.query.index] for h in m.hidden_states]) for trace, m in zip(traces, models)]
    first, name = models[0], models[0].model_name
    info = first.infos[traces[0].layer]
    notes = []
    if info.causal:
        notes.append(
            f"{name} is causal: a query sees only itself and the tokens before it, so every top key is "
            "at or before the query"
            + (" (and inside the layer's sliding window)." if any(m.infos[t.layer].window for t, m in zip(traces, models))
               else ".")
        )
        notes.append(
            f"No sentence similarity: {name} is a decoder trained to predict the next token, not to make "
            "one vector of a whole sentence, so a cosine of its mean token vectors would measure nothing it learned. "
            "The query's cosines above compare what it did learn."
        )
    return Comparison(
        model=name,
        variant="model",
        positional=info.positional,
        source=f"{name}'s own tokens, embeddings and attention",
        vectors_a=vectors[0],
        vectors_b=vectors[1],
        token_cosine=tuple(_cosines(vectors[0], vectors[1]).tolist()),
        similarity=None if info.causal else similarity,
        notes=tuple(notes),
        readable_a=list(models[0].readable),
        readable_b=list(models[1].readable),
        special_tokens=frozenset(first.special_tokens),
        attention=info,
        model_arg=str(model),
        **common,
    )


def _query_rows(trace, q: int) -> torch.Tensor:
    """The query's row of weights in every layer and head.   -> (L, H, n)

    Where the record has the seed's own walk of the query, its weights are the ones explain
    shows for the query (one row's softmax, which may round differently from the matrix's).
    """
    walk = trace.section("seed")
    if walk is not None:
        return walk.weights[None, None]  # (n,) -> (1, 1, n)
    # Only the query's row of each layer: a long text's layers rebuild it from lse, no n x n matrix.
    return torch.stack([steps.weight_rows([q])[:, 0] for steps in trace.layers])  # L of (H, n) -> (L, H, n)


def _allowed_keys(trace, q: int) -> torch.Tensor:
    """Which keys the query may see in each layer: a causal mask hides the later ones.   -> (L, n) bool"""
    n = len(trace.tokens)
    return torch.stack([torch.ones(n, dtype=torch.bool) if m is None else m[q] for m in trace.masks])  # (L, n)


def _top(row: torch.Tensor, tokens: list[str], allowed: torch.Tensor, readable: list[str] | None = None
         ) -> tuple[AttendedToken, ...]:
    """The TOP_TOKENS largest weights of one row among the keys it may see, largest first, ties in sentence order.   row: (n,)"""
    keys = [j for j in range(len(tokens)) if bool(allowed[j])]
    order = sorted(keys, key=lambda j: -float(row[j]))  # sorted is stable: equal weights keep their order
    return tuple(AttendedToken(tokens[j], j, float(row[j]), None if readable is None else readable[j])
                 for j in order[:TOP_TOKENS])


def _entropy(row: torch.Tensor) -> float:
    """H = -sum_j a_j log2 a_j in float64, as `selfattn heads` measures it.   (n,) -> float"""
    return max(float(row_entropy(row.to(torch.float64))), 0.0)  # a one-hot row gives -0.0


def _cosines(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """cos_l = a_l . b_l / (|a_l| |b_l|), row by row, in float64.   (L + 1, d), (L + 1, d) -> (L + 1,)"""
    a, b = a.to(torch.float64), b.to(torch.float64)
    return (a * b).sum(dim=-1) / (a.norm(dim=-1) * b.norm(dim=-1)).clamp(min=1e-300)
