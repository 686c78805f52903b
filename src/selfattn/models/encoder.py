"""A BERT encoder built from our own modules: embeddings, post-LN blocks, mean pooling.

    X0 = LN(E_word[ids] + E_pos[0 .. n-1] + E_type[0])        embeddings   (batch, seq, d)
    X_l = PostLN-Block_l(X_{l-1}),  l = 1 .. L                 our TransformerBlock (post-LN, GELU)
    sentence = normalise(mean of X_L over the real tokens)     sentence-transformers' pooling

Attention inside each block is our ``MultiHeadAttention`` (through ``attention_steps``);
padding keys are masked with ``masks.padding_mask``, so they get exactly zero weight.
This module is the network and its sizes (``BertConfig``); reading config.json, the
checkpoint's tensor names and the loader belong to the BERT family's own file in
``models/families/``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from selfattn.attention.config import TransformerConfig
from selfattn.attention.transformer import Transformer
from selfattn.errors import ModelError, SentenceError, ShapeError
from selfattn.masks import padding_mask
from selfattn.models.description import AttentionInfo, EmbeddingPart, EmbeddingStep, attention_info
from selfattn.models.model_output import ModelOutput
from selfattn.models.registry import decoder_names, one_of
from selfattn.models.tokenizer import Encoded, WordPieceTokenizer, as_text_list


@dataclass(frozen=True)
class BertConfig:
    """The fields of a BERT config.json that shape the network.

    Attributes:
        model_type: config.json's model_type, the family's name in the registry.
        vocab_size: rows of the word embedding table.
        hidden_size: d, the model width.
        num_hidden_layers: L, the number of encoder blocks.
        num_attention_heads: heads per block (d_head = d / heads).
        intermediate_size: the feed-forward network's hidden width.
        max_position_embeddings: learned positions, so the most tokens a text may have.
        type_vocab_size: rows of the token type (sentence A / B) table.
        layer_norm_eps: the epsilon of every LayerNorm.
        hidden_act: the activation; only "gelu" (exact, erf) is accepted.
        pad_token_id: the id that pads a batch.
    """

    model_type: str
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int
    layer_norm_eps: float
    hidden_act: str = "gelu"
    pad_token_id: int = 0

    @property
    def transformer(self) -> TransformerConfig:
        """The ``TransformerConfig`` of the encoder: post-LN blocks with exact GELU."""
        return TransformerConfig(
            d_model=self.hidden_size,
            n_heads=self.num_attention_heads,
            n_layers=self.num_hidden_layers,
            d_ff=self.intermediate_size,
            norm_first=False,  # BERT is post-LN
            activation="gelu",  # exact (erf) GELU, as BERT's "gelu"
            norm_eps=self.layer_norm_eps,
        )


class BertEmbeddings(nn.Module):
    """X0 = LN(E_word[ids] + E_pos[0 .. seq-1] + E_type[0]).   (batch, seq) int -> (batch, seq, d)"""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        d = config.hidden_size
        self.word = nn.Embedding(config.vocab_size, d)
        self.position = nn.Embedding(config.max_position_embeddings, d)  # learned, one row per position
        self.token_type = nn.Embedding(config.type_vocab_size, d)  # sentence A / B; one text is all A
        self.norm = nn.LayerNorm(d, eps=config.layer_norm_eps)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)  # (seq,)
        # Summed in the reference's order (word + type, then position), so rounding matches it.
        summed = self.word(input_ids) + self.token_type.weight[0] + self.position(positions)  # (batch, seq, d)
        return self.norm(summed)


class BertModel(nn.Module):
    """A pretrained BERT encoder: texts in, hidden states and every head's attention out.

    ``model(texts, output_attentions=True, output_hidden_states=True)`` -> ModelOutput;
    ``model.encode(texts)`` -> (batch, d) sentence embeddings. Parameters are frozen
    (requires_grad False) after loading; call ``requires_grad_(True)`` to train.

    Usually made by ``load_pretrained``. Built directly, its weights are torch's random
    initialisation (and trainable); ``load_pretrained`` copies in the checkpoint's and
    freezes them.

    Args:
        config: the network's sizes, read from the checkpoint's config.json by the
            family's ``read_config``.
        tokenizer: turns texts into padded ids; None: only ``run`` on ready ``Encoded``
            input works, and texts raise ModelError.
        name: the model's name, copied into every ``ModelOutput.model_name``; None: the
            config's model_type.
    """

    def __init__(self, config: BertConfig, tokenizer: WordPieceTokenizer | None = None, name: str | None = None) -> None:
        super().__init__()
        self.config = config
        self.name = config.model_type if name is None else name
        self.tokenizer = tokenizer
        self.embeddings = BertEmbeddings(config)
        self.encoder = Transformer(config.transformer)

    def forward(self, texts, output_attentions: bool = False, output_hidden_states: bool = False) -> ModelOutput:
        """Tokenise ``texts`` and run the encoder.   texts -> ModelOutput, last_hidden_state (batch, seq, d)

        Args:
            texts: a string, or a non-empty list or tuple of strings: one batch, padded to
                its longest text.
            output_attentions: also return every layer's attention weights, one
                (batch, heads, seq, seq) tensor per layer.
            output_hidden_states: also return the embeddings and every layer's output,
                (batch, seq, d) each.

        Returns:
            A ``ModelOutput``: the tokens, input_ids and attention_mask (batch, seq), the
                last hidden state (batch, seq, d), and hidden_states / attentions when
                asked for (else None).

        Raises:
            ModelError: the model was built without a tokenizer.
            SentenceError: texts is not a string or a non-empty list of strings, a text is
                not valid UTF-8, or a text has more tokens ([CLS] and [SEP] included) than
                the model has positions (512 for all-MiniLM-L6-v2).
        """
        encoded = self.tokenize(texts)
        return self.run(encoded, output_attentions, output_hidden_states)

    def tokenize(self, texts) -> Encoded:
        """Texts -> padded token ids with the model's own tokenizer.   -> input_ids, attention_mask (batch, seq)

        Args:
            texts: a string, or a non-empty list or tuple of strings.

        Returns:
            An ``Encoded``: the WordPiece tokens of each text ([CLS] ... [SEP], no
                padding), input_ids (batch, seq) int64 padded with the pad id to the
                longest text, and attention_mask (batch, seq) int64, 1 for real tokens and
                0 for padding.

        Raises:
            ModelError: the model was built without a tokenizer.
            SentenceError: as for ``forward``.
        """
        if self.tokenizer is None:
            raise ModelError("this model was built without a tokenizer: give input ids to run()")
        return self.tokenizer.encode(texts)

    def run(self, encoded: Encoded, output_attentions: bool = False, output_hidden_states: bool = False) -> ModelOutput:
        """The encoder on already tokenised input.   input_ids, attention_mask: (batch, seq)

        X0 = embeddings(input_ids), then every post-LN block; padding keys are masked
        (``padding_mask``) so they get exactly zero weight, and with no padding there is
        no mask at all.

        Args:
            encoded: an ``Encoded`` as ``tokenize`` makes it: input_ids (batch, seq) int64,
                attention_mask (batch, seq) with each row's real tokens (1) first and its
                padding (0) after them (the mask is rebuilt from each row's count of
                ones), seq at most the model's positions. Its tokens are passed through.
            output_attentions: also return every layer's attention weights, one
                (batch, heads, seq, seq) tensor per layer.
            output_hidden_states: also return the embeddings and every layer's output,
                (batch, seq, d) each.

        Returns:
            A ``ModelOutput`` for the batch, as from ``forward``.

        Raises:
            SentenceError: seq is longer than the model's positions.
            ShapeError: input_ids and attention_mask differ in shape, or a row of the
                mask has padding before a real token.
        """
        ids, real = encoded.input_ids, encoded.attention_mask
        check_encoded(ids, real, self.config.max_position_embeddings)
        x = self.embeddings(ids)  # (batch, seq, d)
        keys = None  # without padding there is nothing to mask
        if not bool(real.all()):
            keys = padding_mask(real.sum(dim=1), ids.shape[1], device=ids.device)  # (batch, 1, 1, seq): True = real
        out = self.encoder(
            x, attn_mask=keys, output_attentions=output_attentions, output_hidden_states=output_hidden_states,
            real_tokens=None if keys is None else real.bool(),
        )
        return ModelOutput(
            tokens=encoded.tokens,
            input_ids=ids,
            attention_mask=real,
            last_hidden_state=out.last_hidden_state,
            hidden_states=out.hidden_states,
            attentions=out.attentions,
            model_name=self.name,
        )

    def encode(self, texts, normalize: bool = True, batch_size: int = 32) -> torch.Tensor:
        """Sentence embeddings: mean of the last hidden states over real tokens, then L2-normalised.   -> (batch, d)

        s = sum_i m_i h_i / sum_i m_i over the last hidden states h_i and the real-token
        mask m_i, then s / |s| (``mean_pool``): sentence-transformers' pooling for
        all-MiniLM-L6-v2.

        Args:
            texts: a string, or a non-empty list or tuple of strings.
            normalize: divide each embedding by its length, so that dot products are
                cosine similarities; False: the plain mean.
            batch_size: texts per forward pass, each pass padded only to its own
                longest text. Every text is tokenised first, so a text that is too long
                is refused before anything runs.

        Returns:
            (len(texts), d) float32, one row per text in the order given (d = 384 for
                all-MiniLM-L6-v2).

        Raises:
            ModelError: batch_size is not a positive int, or the model has no tokenizer.
            SentenceError: as for ``forward``.
        """
        texts = as_text_list(texts)
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ModelError(f"batch_size must be a positive integer, got {batch_size!r}")
        encoded = self.tokenize(texts)  # all at once, so a length error names the right text
        pooled = []
        for start in range(0, len(texts), batch_size):
            tokens = encoded.tokens[start : start + batch_size]
            longest = max(len(t) for t in tokens)  # each chunk padded only to its own longest text
            chunk = Encoded(
                tokens,
                encoded.input_ids[start : start + batch_size, :longest],
                encoded.attention_mask[start : start + batch_size, :longest],
            )
            out = self.run(chunk)
            pooled.append(mean_pool(out.last_hidden_state, out.attention_mask, normalize))
        return torch.cat(pooled)  # (batch, d)

    @property
    def blocks(self):
        """The encoder's ``TransformerBlock``s, in order."""
        return self.encoder.layers

    def embedding_step(self, input_ids: torch.Tensor) -> EmbeddingStep:
        """The summands of X0 for one text, (1, n) ids -> ``EmbeddingStep`` (for the trace).

        Args:
            input_ids: one text's ids, (1, n).

        Returns:
            word, type and position vectors (n, d) each, and the formula.
        """
        emb = self.embeddings
        n = input_ids.shape[1]
        parts = (
            EmbeddingPart("word", "E_word[id]", emb.word(input_ids)[0]),
            EmbeddingPart("type", "E_type[0]", emb.token_type.weight[0].expand(n, -1).clone()),
            EmbeddingPart("position", "E_pos[i]", emb.position(torch.arange(n))),
        )
        note = "a learned position vector is added to each token before the first layer"
        return EmbeddingStep(parts, "LN(E_word[id] + E_type[0] + E_pos[i])", True, note)

    def attention_info(self, layer: int) -> AttentionInfo:
        """Layer ``layer``'s attention described for the trace (post-LN, bidirectional).

        Args:
            layer: the layer, 0-based.

        Returns:
            Its ``AttentionInfo``.
        """
        return attention_info(self.config.model_type, self.encoder.layers[layer].config)

    def trace_options(self) -> dict:
        """Keywords for a block's ``attention_steps`` on one text: none (no mask, no positions).

        Returns:
            An empty dict.
        """
        return {}

    def generate(self, *args, **kwargs):
        """Refused: an encoder has no next-token head.

        Args:
            args: ignored; the arguments of ``DecoderModel.generate``.
            kwargs: ignored.

        Returns:
            Nothing: it always raises.

        Raises:
            ModelError: always; generation needs a decoder (the families in
                selfattn.models.FAMILIES whose kind is "decoder", listed in the message).
        """
        raise ModelError(
            f"{self.name} is an encoder (BERT): it has no next-token head to generate with; "
            f"generate takes a decoder ({one_of(decoder_names())})"
        )


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor, normalize: bool = True) -> torch.Tensor:
    """s = sum_i m_i h_i / sum_i m_i, then s / |s| if normalize.   (batch, seq, d), (batch, seq) -> (batch, d)

    Args:
        hidden: (batch, seq, d) hidden states.
        attention_mask: (batch, seq), 1 for real tokens and 0 for padding.
        normalize: divide each mean by its L2 norm (at least 1e-12, as ``F.normalize``).

    Returns:
        (batch, d) the mean over real tokens (a row without any is 0), normalised if asked.
    """
    weights = attention_mask.to(hidden.dtype)[..., None]  # (batch, seq, 1): 1 for real tokens
    pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)  # (batch, d)
    if not normalize:
        return pooled
    return pooled / pooled.norm(dim=-1, keepdim=True).clamp(min=1e-12)  # as torch's F.normalize


def check_encoded(ids: torch.Tensor, real: torch.Tensor, positions: int) -> None:
    """ids and mask (batch, seq) that ``run`` can read: within the positions, padding on the right."""
    if ids.dim() != 2 or ids.shape != real.shape:
        raise ShapeError(f"input_ids and attention_mask must both be (batch, seq): {tuple(ids.shape)} and {tuple(real.shape)}")
    if ids.shape[1] > positions:
        raise SentenceError(f"the input has {ids.shape[1]} tokens; this model has {positions} positions, so at most {positions}")
    lengths = real.sum(dim=1, keepdim=True)  # (batch, 1)
    if not torch.equal(real.bool(), torch.arange(ids.shape[1], device=real.device) < lengths):
        raise ShapeError("attention_mask must hold each row's real tokens (1) first and its padding (0) after them")


