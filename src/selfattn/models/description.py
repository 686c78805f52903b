"""How a model describes itself to the one architecture-neutral trace.

Every family answers the same questions, so the walkthrough, the JSON, the plots and the
explorer read these records and never ask which family they have:

    EmbeddingStep   which vectors are summed into the first hidden state, under what formula
    AttentionInfo   one layer's attention: causal or not, how positions enter (learned table
                    or RoPE, and its base), grouped-query heads, the sliding window, the
                    factor on q . k, q/k norms, the block's norms and feed-forward
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
        feed_forward: "gelu", "relu", "gelu_tanh", "swiglu" or "geglu_tanh".
        scale: the factor on q . k before the softmax: 1 / sqrt(d_head) unless the
            family sets its own (Gemma: 1 / sqrt(query_pre_attn_scalar)).
        qk_norm: each head's q and k pass an RMSNorm (over its d_head features) before
            RoPE, so their lengths are set by learned gains and not by the input.
        norm_gain: an RMSNorm's gain: "w", or "1+w" (Gemma stores the gain minus 1).
        sandwich_norm: the attention's and the feed-forward's outputs are normalised
            too, before each is added back to the residual stream.
        rope_pairs: which features RoPE turns together: "half" (i with i + d_head/2, the
            Hugging Face layout) or "interleaved" (2i with 2i + 1, llama2.c's); None
            without RoPE.
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
    scale: float | None = None
    qk_norm: bool = False
    norm_gain: str = "w"
    sandwich_norm: bool = False
    rope_pairs: str | None = None

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
        n_kv_heads=a.n_kv_heads,
        window=a.sliding_window if layer_window is None else layer_window,
        norm=block_config.norm,
        norm_first=block_config.norm_first,
        feed_forward=block_config.activation,
        scale=a.score_scale,
        qk_norm=a.qk_norm,
        norm_gain=block_config.norm_gain,
        sandwich_norm=block_config.sandwich_norm,
        rope_pairs=a.rope_pairs if a.positional == "rope" else None,
    )
