"""What shapes a decoder, whatever family it came from: ``DecoderConfig``.

Each family reads its config.json into one (``models/families/``, a llama2.c header in
``models/llama2c.py``); ``DecoderModel`` (``models/decoder.py``) builds its blocks from
``DecoderConfig.block(layer)``, one ``TransformerConfig`` per layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from selfattn.attention.config import TransformerConfig
from selfattn.renamed import renamed_keyword
from selfattn.errors import ConfigError
from selfattn.positional.rope_scaling import Llama3RopeScaling

# Calls with fewer new tokens than this take the reference attention even when attn_impl is
# "flash" (AttentionConfig.flash_min_queries). Measured on the Llama-shaped model of
# bench/models.py (2 threads), the whole forward through the reference path took 0.79x the
# kernel's time for 1 token, 0.81x for 16, 0.9x for 64, about the same for 128, 1.07x for
# 192, 1.17x for 256.
FLASH_MIN_QUERIES = 128


@dataclass(frozen=True)
class DecoderConfig:
    """What shapes a decoder, whatever family it came from (each family reads its config.json into this).

    Attributes:
        model_type: the family: a decoder's name in ``selfattn.models.FAMILIES``.
        vocab_size: rows of the token embedding and of the output matrix.
        d_model: the model width.
        n_layers: the number of blocks.
        n_heads: query heads per block.
        n_kv_heads: key/value heads per block (fewer than n_heads: grouped-query).
        d_head: the width of one head (``head_dim=`` still works and warns: its old name).
        d_ff: the feed-forward network's hidden width.
        activation: "gelu_tanh", "gelu", "relu" or "swiglu".
        norm: "layer" (LayerNorm) or "rms" (RMSNorm).
        norm_eps: every norm's epsilon.
        positions: "learned" (a table added to the embeddings, GPT-2) or "rope".
        max_positions: the most positions the model has (learned rows, or the context
            a RoPE model was configured for); inputs and generation stay within it.
        rope_base: RoPE's frequency base (rope_theta).
        rope_scaling: None, or Llama 3's rescaling of the frequencies.
        rope_pairs: which features RoPE turns together: "half" (feature i with
            i + d_head/2, the Hugging Face layout) or "interleaved" (2i with 2i + 1, as
            llama2.c's checkpoints were trained).
        rope_bases: per layer, RoPE's base; () (default): rope_base on every layer. Gemma 3
            turns its sliding and its full layers with different bases.
        windows: per layer, None (full causal attention) or the sliding window W.
        bias: biases in the feed-forward layers and the norms.
        attention_bias: biases on W_q, W_k, W_v.
        out_bias: a bias on W_o.
        tie_embeddings: the output matrix is the token embedding.
        bos_id: the id the tokenizer puts first, if any (informational).
        eos_ids: the ids that end generation.
        pad_id: the id that pads a batch (masked, so any id works).
        attn_impl: "reference" or "flash", for every block's attention (see
            ``AttentionConfig``); calls that ask for the weights take the reference path,
            and with "flash" so do inputs of fewer than ``FLASH_MIN_QUERIES`` new tokens
            (decoding steps). ``load_pretrained`` chooses "flash".
        scale: the factor on q . k; None (default): 1 / sqrt(d_head).
        qk_norm: an RMSNorm over each head's q and k, before RoPE (Qwen3, Gemma 3).
        norm_gain: every RMSNorm's gain: "w" (default) or "1+w" (Gemma).
        sandwich_norm: norms after attention and after the feed-forward too (Gemma).
        scale_embeddings: X0 = E_tok[id] * sqrt(d_model) (Gemma); default False.
    """

    model_type: str
    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_head: int
    d_ff: int
    activation: str
    norm: str
    norm_eps: float
    positions: str
    max_positions: int
    rope_base: float = 10000.0
    rope_scaling: Llama3RopeScaling | None = None
    rope_pairs: str = "half"
    windows: tuple[int | None, ...] = ()
    bias: bool = False
    attention_bias: bool = False
    out_bias: bool = False
    tie_embeddings: bool = False
    bos_id: int | None = None
    eos_ids: tuple[int, ...] = ()
    pad_id: int = 0
    attn_impl: str = field(default="reference", compare=False)
    rope_bases: tuple[float, ...] = ()
    scale: float | None = None
    qk_norm: bool = False
    norm_gain: str = "w"
    sandwich_norm: bool = False
    scale_embeddings: bool = False

    def __post_init__(self) -> None:
        if self.rope_bases and len(self.rope_bases) != self.n_layers:
            raise ConfigError(f"rope_bases lists {len(self.rope_bases)} bases for {self.n_layers} layers")
        if self.windows and len(self.windows) != self.n_layers:
            raise ConfigError(f"windows lists {len(self.windows)} layers of {self.n_layers}")

    def block(self, layer: int) -> TransformerConfig:
        """The ``TransformerConfig`` of one block: pre-LN, causal, its own window.

        Args:
            layer: the block's index, 0-based.

        Returns:
            The block's ``TransformerConfig``.
        """
        return TransformerConfig(
            d_model=self.d_model,
            n_heads=self.n_heads,
            n_kv_heads=self.n_kv_heads,
            d_head=self.d_head,
            d_ff=self.d_ff,
            bias=self.bias,
            attention_bias=self.attention_bias,
            out_bias=self.out_bias,
            norm_first=True,
            norm=self.norm,
            activation=self.activation,
            norm_eps=self.norm_eps,
            positional="rope" if self.positions == "rope" else "none",
            rope_base=self.layer_rope_bases[layer],
            rope_pairs=self.rope_pairs,
            rope_scaling=self.rope_scaling,
            sliding_window=self.windows[layer] if self.windows else None,
            causal=True,
            attn_impl=self.attn_impl,
            flash_min_queries=FLASH_MIN_QUERIES,
            scale=self.scale,
            qk_norm=self.qk_norm,
            norm_gain=self.norm_gain,
            sandwich_norm=self.sandwich_norm,
        )

    @property
    def sliding_layers(self) -> list[int]:
        """The layers whose attention has a window."""
        return [i for i, w in enumerate(self.windows) if w is not None]

    @property
    def layer_rope_bases(self) -> tuple[float, ...]:
        """RoPE's base of each layer: rope_bases, or rope_base on every layer."""
        return tuple(self.rope_bases) if self.rope_bases else (self.rope_base,) * self.n_layers


renamed_keyword(DecoderConfig, "head_dim", "d_head")
