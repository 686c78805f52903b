"""What a pretrained model returns: tokens, hidden states and every head's attention weights."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ModelOutput:
    """One forward pass over a padded batch.

    Padding keys get exactly zero weight. Rows of padding queries are computed too (they
    attend to the real tokens) but mean nothing; slice them off with ``lengths``. In
    Jupyter the output shows itself as the interactive attention explorer of its first text.

    Attributes:
        tokens: the tokens of each text as the vocabulary writes them, no padding
            (WordPiece [CLS] ... [SEP] for BERT; byte-level BPE pieces for GPT-2).
        input_ids: (batch, seq) int64 token ids, padded to the longest text (on the
            right for an encoder, on the left for a decoder).
        attention_mask: (batch, seq) int64, 1 for real tokens and 0 for padding.
        last_hidden_state: (batch, seq, d) the last layer's output.
        hidden_states: n_layers + 1 tensors (batch, seq, d): the embeddings, then each
            layer's output; None unless asked for (``output_hidden_states=True``).
        attentions: n_layers tensors (batch, heads, seq, seq), the weights of every head,
            rows = queries, columns = keys; None unless asked for (``output_attentions=True``).
        model_name: the name of the model that made it ("" when not given).
        logits: (batch, seq, vocab) next-token scores, from a decoder; None from an encoder.
    """

    tokens: list[list[str]]
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    last_hidden_state: torch.Tensor
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None
    model_name: str = ""
    logits: torch.Tensor | None = None

    @property
    def lengths(self) -> list[int]:
        """Real tokens per text, [CLS] and [SEP] included."""
        return [len(t) for t in self.tokens]

