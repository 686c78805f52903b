"""What shapes a decoder, whatever family it came from: ``DecoderConfig``.

Each family reads its config.json into one (``models/families/``, a llama2.c header in
``models/llama2c.py``); ``DecoderModel`` (``models/decoder.py``) builds its blocks from
``DecoderConfig.block(layer)``, one ``TransformerConfig`` per layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from selfattn.attention.config import BLOCK_FIELDS, TransformerConfig
from selfattn.renamed import renamed_keyword
from selfattn.errors import ConfigError

# Calls with fewer new tokens than this take the reference attention even when attn_impl is
# "flash" (AttentionConfig.flash_min_queries). Measured on the Llama-shaped model of
# bench/models.py (2 threads), the whole forward through the reference path took 0.79x the
# kernel's time for 1 token, 0.81x for 16, 0.9x for 64, about the same for 128, 1.07x for
# 192, 1.17x for 256.
FLASH_MIN_QUERIES = 128


# What a decoder's positions may be: none, a learned table the model adds to the embeddings
# (GPT-2), or RoPE inside every attention layer.
DECODER_POSITIONS = ("none", "learned", "rope")


@dataclass(frozen=True, kw_only=True)
class DecoderConfig(TransformerConfig):
    """What shapes a decoder, whatever family it came from (each family reads its config.json into this).

    A ``TransformerConfig`` (the settings every block shares, under the same names) plus
    the model's own: its vocabulary, its token ids, and what differs from layer to layer
    (``sliding_windows``, ``rope_bases``). ``block(layer)`` hands every shared field to the
    layer's block by name, so a block option reaches a decoder's blocks without a line
    here. Give every field by keyword.

    Attributes:
        model_type: the family: a decoder's name in ``selfattn.models.FAMILIES``.
        vocab_size: rows of the token embedding and of the output matrix.
        d_model: the model width.
        n_layers: the number of blocks.
        n_heads: query heads per block.
        n_kv_heads: key/value heads per block (fewer than n_heads: grouped-query).
        d_head: the width of one head (``head_dim=`` still works and warns: its old name).
        d_ff: the feed-forward network's hidden width.
        activation: "gelu_tanh", "gelu", "relu", "swiglu" or "geglu_tanh".
        norm: "layer" (LayerNorm) or "rms" (RMSNorm).
        norm_eps: every norm's epsilon.
        positional: "learned" (a table added to the embeddings, GPT-2), "rope", or "none"
            (``positions=`` still works and warns: its old name).
        max_positions: the most positions the model has (learned rows, or the context
            a RoPE model was configured for); inputs and generation stay within it.
        rope_base: RoPE's frequency base (rope_theta).
        rope_scaling: None, or Llama 3's rescaling of the frequencies.
        rope_pairs: which features RoPE turns together: "half" (default: feature i with
            i + d_head/2, the Hugging Face layout) or "interleaved" (2i with 2i + 1, as
            llama2.c's checkpoints were trained).
        rope_bases: per layer, RoPE's base; () (default): rope_base on every layer. Gemma 3
            turns its sliding and its full layers with different bases.
        sliding_windows: per layer, None (full causal attention) or the sliding window W;
            () (default): sliding_window on every layer. (``windows=`` still works and
            warns: its old name.)
        sliding_window: every layer's window when sliding_windows is (); None (default): none.
        bias: biases in the feed-forward layers and the norms (default False).
        attention_bias: biases on W_q, W_k, W_v (default False).
        out_bias: a bias on W_o (default False).
        tie_embeddings: the output matrix is the token embedding.
        bos_id: the id the tokenizer puts first, if any (informational).
        eos_ids: the ids that end generation.
        pad_id: the id that pads a batch (masked, so any id works).
        attn_impl: "reference" or "flash", for every block's attention (see
            ``AttentionConfig``); calls that ask for the weights take the reference path,
            and with "flash" so do inputs of fewer than ``flash_min_queries`` new tokens
            (decoding steps). ``load_pretrained`` chooses "flash". Not compared.
        flash_min_queries: default ``FLASH_MIN_QUERIES``.
        scale: the factor on q . k; None (default): 1 / sqrt(d_head).
        qk_norm: an RMSNorm over each head's q and k, before RoPE (Qwen3, Gemma 3).
        norm_gain: every RMSNorm's gain: "w" (default) or "1+w" (Gemma).
        sandwich_norm: norms after attention and after the feed-forward too (Gemma).
        scale_embeddings: X0 = E_tok[id] * sqrt(d_model) (Gemma); default False.
        dropout: in [0, 1), in training only (default 0).
        norm_first: pre-LN; a decoder's blocks are, so it stays True.
        causal: each token sees itself and the tokens before; stays True.

    Raises:
        ConfigError: what ``TransformerConfig`` refuses, positional is not one of
            ``DECODER_POSITIONS``, causal or norm_first is False, or sliding_windows or rope_bases
            does not list one entry per layer.
    """

    # required, though TransformerConfig has defaults for most of these (field() drops them)
    model_type: str
    vocab_size: int
    d_model: int = field()
    n_layers: int = field()
    n_heads: int = field()
    n_kv_heads: int = field()
    d_head: int = field()
    d_ff: int = field()
    activation: str = field()
    norm: str = field()
    norm_eps: float = field()
    positional: str = field()
    max_positions: int = field()
    rope_pairs: str = "half"
    sliding_windows: tuple[int | None, ...] = ()
    bias: bool = False
    attention_bias: bool = False
    out_bias: bool = False
    tie_embeddings: bool = False
    bos_id: int | None = None
    eos_ids: tuple[int, ...] = ()
    pad_id: int = 0
    attn_impl: str = field(default="reference", compare=False)
    flash_min_queries: int = FLASH_MIN_QUERIES
    causal: bool = True
    rope_bases: tuple[float, ...] = ()
    scale_embeddings: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.positional not in DECODER_POSITIONS:
            raise ConfigError(f"a decoder's positional is one of {', '.join(DECODER_POSITIONS)}, got {self.positional!r}")
        if not (self.causal and self.norm_first):
            raise ConfigError("a decoder's blocks are causal and pre-LN: causal and norm_first stay True")
        if self.rope_bases and len(self.rope_bases) != self.n_layers:
            raise ConfigError(f"rope_bases lists {len(self.rope_bases)} bases for {self.n_layers} layers")
        if self.sliding_windows and len(self.sliding_windows) != self.n_layers:
            raise ConfigError(f"sliding_windows lists {len(self.sliding_windows)} layers of {self.n_layers}")

    def block(self, layer: int) -> TransformerConfig:
        """The ``TransformerConfig`` of one block: every shared field, with the layer's own window and base.

        Args:
            layer: the block's index, 0-based.

        Returns:
            The block's ``TransformerConfig``; a learned table is the model's, not the
                block's, so its positional is "rope" or "none".
        """
        shared = {name: getattr(self, name) for name in BLOCK_FIELDS}
        return TransformerConfig(**{
            **shared,
            "positional": "rope" if self.positional == "rope" else "none",
            "rope_base": self.layer_rope_bases[layer],
            "sliding_window": self.block_window(layer),
        })

    @property
    def sliding_layers(self) -> list[int]:
        """The layers whose attention has a window."""
        return [i for i in range(self.n_layers) if self.block_window(i) is not None]

    def block_window(self, layer: int) -> int | None:
        """One layer's sliding window, or None.

        Args:
            layer: the block's index, 0-based.

        Returns:
            sliding_windows[layer] when that lists them, else sliding_window.
        """
        return self.sliding_windows[layer] if self.sliding_windows else self.sliding_window

    @property
    def layer_rope_bases(self) -> tuple[float, ...]:
        """RoPE's base of each layer: rope_bases, or rope_base on every layer."""
        return tuple(self.rope_bases) if self.rope_bases else (self.rope_base,) * self.n_layers


renamed_keyword(DecoderConfig, "head_dim", "d_head")
renamed_keyword(DecoderConfig, "positions", "positional")  # TransformerConfig's name for the same choice
renamed_keyword(DecoderConfig, "windows", "sliding_windows")  # one layer's is sliding_window, as rope_base / rope_bases
