"""What a pretrained model returns: tokens, hidden states and every head's attention weights."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ModelOutput:
    """One forward pass over a padded batch.

    tokens: WordPiece tokens per text ([CLS] ... [SEP], no padding).
    input_ids, attention_mask: (batch, seq); attention_mask is 1 for real tokens, 0 for padding.
    last_hidden_state: (batch, seq, d).
    hidden_states: n_layers + 1 tensors (batch, seq, d): the embeddings, then each layer; or None.
    attentions: n_layers tensors (batch, heads, seq, seq), the weights of every head; or None.
    Padding keys get exactly zero weight. Rows of padding queries are computed too (they
    attend to the real tokens) but mean nothing; slice them off with ``lengths``.
    """

    tokens: list[list[str]]
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    last_hidden_state: torch.Tensor
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None
    model_name: str = ""

    @property
    def lengths(self) -> list[int]:
        """Real tokens per text, [CLS] and [SEP] included."""
        return [len(t) for t in self.tokens]

    def _repr_html_(self) -> str:
        """Jupyter: the interactive explorer for the first text, every layer and head."""
        from selfattn.viz.explorer import notebook_model_explorer

        return notebook_model_explorer(self)
