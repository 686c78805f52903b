"""How a model describes itself to the one architecture-neutral trace.

Every family answers the same questions, so the walkthrough, the JSON, the plots and the
explorer read these records and never ask which family they have:

    EmbeddingStep   which vectors are summed into the first hidden state, under what formula
    AttentionInfo   one layer's attention: causal or not, how positions enter (learned table
                    or RoPE), grouped-query heads, the sliding window, the block's norm and
                    feed-forward
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class EmbeddingPart:
    """One summand of a model's first hidden state.

    Attributes:
        name: what it is: "word", "position" or "type".
        label: its formula, e.g. "E_word[id]" or "E_pos[i]".
        vectors: (n, d), one row per token (a part that is the same for every token,
            BERT's type embedding, is repeated).
    """

    name: str
    label: str
    vectors: torch.Tensor


@dataclass(frozen=True)
class EmbeddingStep:
    """How token ids become the first hidden state X0 of one text.

    Attributes:
        parts: the summands, in the order the model adds them.
        formula: X0 as a formula, e.g. "LN(E_word[id] + E_type[0] + E_pos[i])".
        normalised: whether a LayerNorm follows the sum (BERT); pre-LN decoders
            normalise inside each block instead.
        note: one sentence on where positions enter, for the walkthrough.
    """

    parts: tuple[EmbeddingPart, ...]
    formula: str
    normalised: bool
    note: str

    def part(self, name: str) -> EmbeddingPart | None:
        """The part called ``name``, or None."""
        return next((p for p in self.parts if p.name == name), None)


@dataclass(frozen=True)
class AttentionInfo:
    """One layer's attention, as the renderers need to explain it.

    Attributes:
        family: the model_type, one of the families in ``selfattn.models.FAMILIES``.
        causal: each token sees only itself and earlier tokens (decoders).
        positional: "learned" (a table added to the embeddings) or "rope" (q and k
            turned by position inside attention).
        rope_base: RoPE's frequency base (rope_theta); None without RoPE.
        rope_scaling: a short description of the frequencies' rescaling, or None.
        n_heads: query heads.
        n_kv_heads: key/value heads (fewer: grouped-query attention).
        window: this layer's sliding window W (a query sees its W newest keys), or None.
        norm: "layer" or "rms".
        norm_first: pre-LN (the attention reads LN(x)) or post-LN.
        feed_forward: "gelu", "gelu_tanh" or "swiglu".
    """

    family: str
    causal: bool
    positional: str
    rope_base: float | None
    rope_scaling: str | None
    n_heads: int
    n_kv_heads: int
    window: int | None
    norm: str
    norm_first: bool
    feed_forward: str

    @property
    def group_size(self) -> int:
        """Query heads per key/value head."""
        return self.n_heads // self.n_kv_heads

    def kv_head(self, head: int) -> int:
        """The key/value head that query head ``head`` reads: head // group_size."""
        return head // self.group_size


def attention_info(family: str, block_config, layer_window: int | None = None) -> AttentionInfo:
    """An ``AttentionInfo`` from a block's ``TransformerConfig``."""
    a = block_config.attention
    scaling = None
    if a.rope_scaling is not None:
        s = a.rope_scaling
        scaling = (
            f"llama3: factor {s.factor:g}, low/high frequency factors {s.low_freq_factor:g}/{s.high_freq_factor:g}, "
            f"original context {s.original_max_position_embeddings}"
        )
    return AttentionInfo(
        family=family,
        causal=block_config.causal,
        positional="rope" if a.positional == "rope" else "learned",
        rope_base=a.rope_base if a.positional == "rope" else None,
        rope_scaling=scaling,
        n_heads=a.n_heads,
        n_kv_heads=a.kv_heads,
        window=a.sliding_window if layer_window is None else layer_window,
        norm=block_config.norm,
        norm_first=block_config.norm_first,
        feed_forward=block_config.activation,
    )
