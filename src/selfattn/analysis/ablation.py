"""What knocking heads out does to one input: the loss before and after, token by token, and the next token.

``selfattn ablate`` reads this record: the mean next-token loss over the scored tokens (every
predicted token of a text; the second copy of the induction probe), each token's loss
before and after, and the most likely next tokens at the last position before and after.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from selfattn.analysis.decoder_roles import induction_probe_score
from selfattn.analysis.head_interventions import check_heads, knocked_out
from selfattn.analysis.next_token import Chance, next_token_losses, top_tokens
from selfattn.models.tokenizer import Encoded


@dataclass(frozen=True)
class TokenLoss:
    """One scored token: where it is, how it reads, its loss (nats) with every head and with the heads knocked out."""

    position: int
    token: str
    before: float
    after: float

    @property
    def change(self) -> float:
        """after - before."""
        return self.after - self.before


@dataclass(frozen=True)
class AblationReport:
    """One input with and without some heads.

    Attributes:
        heads: the knocked-out heads, (layer, head) pairs.
        mode: "zero" or "mean".
        readable: the input's tokens, each decoded on its own.
        tokens: every scored token's losses, in order.
        top_before: the most likely next tokens at the last position, with every head.
        top_after: the same with the heads knocked out.
        probe_before: on the induction probe, every head's induction score (layers, heads)
            with every head; None on a text.
        probe_after: the same with the heads knocked out: an induction head that reads a
            knocked-out previous-token head loses its stripe.
    """

    heads: list[tuple[int, int]]
    mode: str
    readable: list[str]
    tokens: list[TokenLoss]
    top_before: list[Chance]
    top_after: list[Chance]
    probe_before: torch.Tensor | None = None
    probe_after: torch.Tensor | None = None

    @property
    def loss_before(self) -> float:
        """The mean loss over the scored tokens with every head, nats."""
        return sum(t.before for t in self.tokens) / len(self.tokens)

    @property
    def loss_after(self) -> float:
        """The same with the heads knocked out."""
        return sum(t.after for t in self.tokens) / len(self.tokens)

    def most_changed(self, k: int = 5) -> list[TokenLoss]:
        """The k scored tokens whose loss changed most (by size), in that order."""
        return sorted(self.tokens, key=lambda t: (-abs(t.change), t.position))[:k]


def ablation_report(model, encoded: Encoded, heads, mode: str, positions: list[int], probe=None) -> AblationReport:
    """Run one input with every head and with ``heads`` knocked out.

    Args:
        model: a decoder.
        encoded: one unpadded input (``model.tokenize``).
        heads: [(layer, head), ...] to knock out.
        mode: "zero" or "mean" (see ``ablate``).
        positions: the scored tokens, as indices into next_token_losses' (seq - 1) axis.
        probe: the induction ``Probe`` the input is, or None: with it, every head's induction
            score before and after too.

    Returns:
        The ``AblationReport``.

    Raises:
        OptionError: a head or layer out of range, or an unknown mode.
    """
    chosen = check_heads(model, heads)
    ids = encoded.input_ids  # (1, seq)
    weights = probe is not None
    with torch.no_grad():
        plain = model.run(encoded, output_attentions=weights)
        with knocked_out(model, chosen, mode):
            knocked = model.run(encoded, output_attentions=weights)
    before, after = plain.logits, knocked.logits  # (1, seq, vocab)
    scores = [None, None]
    if weights:
        scores = [induction_probe_score(torch.stack([a[0] for a in out.attentions]), probe.length, probe.offset)
                  for out in (plain, knocked)]  # (layers, heads) each
    loss_before, loss_after = next_token_losses(before, ids)[0], next_token_losses(after, ids)[0]  # (seq - 1,)
    readable = model.tokenizer.readable(ids[0].tolist()) if model.tokenizer is not None else encoded.tokens[0]
    scored = [TokenLoss(p + 1, readable[p + 1], float(loss_before[p]), float(loss_after[p])) for p in positions]
    return AblationReport(chosen, mode, readable, scored, top_tokens(model, before[0, -1]), top_tokens(model, after[0, -1]),
                          *scores)
