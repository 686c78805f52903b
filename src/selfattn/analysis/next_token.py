"""What a decoder says next: each token's loss, the most likely next tokens, one token named by the user.

    loss_t = -log softmax(logits_t)[ids_{t+1}]     the cost of predicting token t + 1 after reading 0 .. t

A text of n tokens has n - 1 predicted tokens (the first has nothing before it; with a
BOS token the first word is predicted from BOS). The induction probe scores only its
second copy after the first token of it: tokens offset + R + 1 .. offset + 2R - 1, the
ones an induction head can predict (``probe_positions``), as the training runs' probe does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from selfattn.errors import OptionError, SentenceError
from selfattn.models.generation import top_chances

TOP = 5  # the most likely next tokens a report lists


def next_token_losses(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """loss[b, t] = -log softmax(logits[b, t])[ids[b, t + 1]].   (batch, seq, vocab), (batch, seq) -> (batch, seq - 1)

    Args:
        logits: next-token scores at every position.
        ids: the tokens that were read.

    Returns:
        The loss in nats of each predicted token, float32 or wider.

    Examples:
        >>> import torch
        >>> from selfattn.analysis.next_token import next_token_losses
        >>> logits = torch.zeros(1, 3, 4)  # uniform over 4 tokens
        >>> round(float(next_token_losses(logits, torch.tensor([[0, 1, 2]]))[0, 0]), 4)  # ln 4
        1.3863
    """
    log_probs = logits[:, :-1].float().log_softmax(dim=-1)  # (batch, seq - 1, vocab)
    return -log_probs.gather(-1, ids[:, 1:, None])[..., 0]  # (batch, seq - 1)


def probe_positions(length: int, offset: int) -> list[int]:
    """The predicted tokens the probe's loss reads, as indices into next_token_losses' (seq - 1) axis.

    Index t predicts token t + 1: offset + R .. offset + 2R - 2 predict the second copy
    from its second token on (its first token follows the end of the first copy, which
    nothing in the text announces).

    Args:
        length: R, the tokens in one copy (at least 2).
        offset: tokens before the first copy (1 with BOS).

    Returns:
        The R - 1 indices.
    """
    return list(range(offset + length, offset + 2 * length - 1))


def text_positions(n_tokens: int) -> list[int]:
    """Every predicted token of a text of n tokens: indices 0 .. n - 2.

    Raises:
        SentenceError: fewer than two tokens, so nothing is predicted.
    """
    if n_tokens < 2:
        raise SentenceError(
            f"the text has {n_tokens} token: a loss needs at least two (one read, one predicted); give a longer text")
    return list(range(n_tokens - 1))


@dataclass(frozen=True)
class Chance:
    """One candidate next token: its id, how the vocabulary writes it, how it reads, its probability."""

    id: int
    token: str
    text: str
    p: float


def top_tokens(model, logits: torch.Tensor, k: int = TOP) -> list[Chance]:
    """The k most likely next tokens.   logits: (vocab,) -> k Chances, most likely first

    Args:
        model: the decoder (its tokenizer spells the tokens; without one they show as ids).
        logits: one position's next-token scores.
        k: how many.

    Returns:
        The k tokens with the highest softmax(logits).
    """
    ids, values = top_chances(logits[None], k)  # (1, k) each
    tokenizer = model.tokenizer
    chances = []
    for p, i in zip(values[0].tolist(), ids[0].tolist()):
        token = tokenizer.token(i) if tokenizer is not None else f"<id {i}>"
        text = tokenizer.readable([i])[0] if tokenizer is not None else token
        chances.append(Chance(i, token, text, p))
    return chances


def target_id(model, target) -> int:
    """The token id the user means by ``target``: an id, a vocabulary string, or a text of one token.

    A string is first looked up as the vocabulary writes its tokens ("Ġcat", "▁cat"); else
    it is tokenised as text, specials dropped, and must give exactly one token (" cat" in
    GPT-2, "cat" in a SentencePiece vocabulary that adds the leading space itself).

    Args:
        model: a decoder with a tokenizer (an int target needs none).
        target: an int id, or a string.

    Returns:
        The id.

    Raises:
        OptionError: an id outside the vocabulary, an empty string, a string that is not
            one token, or a string for a model without a tokenizer.
    """
    vocab = model.config.vocab_size
    if isinstance(target, int) and not isinstance(target, bool):
        if not 0 <= target < vocab:
            raise OptionError(f"the target id {target} is outside the vocabulary 0 .. {vocab - 1}")
        return target
    if not isinstance(target, str) or not target:
        raise OptionError(f"the target must be a token (a non-empty string) or a token id, got {target!r}")
    tokenizer = model.tokenizer
    if tokenizer is None:
        raise OptionError("this model has no tokenizer: give the target as a token id")
    known = tokenizer.token_to_id(target)
    if known is not None and 0 <= known < vocab:
        return known
    specials = {tokenizer.token_to_id(t) for t in tokenizer.special_tokens}
    ids = [int(i) for i in tokenizer.encode(target).input_ids[0].tolist() if int(i) not in specials]
    if len(ids) != 1:
        pieces = " | ".join(tokenizer.readable(ids)) if ids else "nothing"
        close = one_token_words(model, target)
        hint = f"; one-token words close to it: {', '.join(repr(w) for w in close)}" if close else ""
        raise OptionError(
            f"the target {target!r} is {len(ids)} tokens for {model.name} ({pieces}), not one: give a single token, "
            f"as the vocabulary writes it or as text{hint}")
    return ids[0]


def one_token_words(model, target: str, count: int = 3) -> list[str]:
    """Up to ``count`` texts of one token each that read like ``target`` (its spelling with and without
    a leading space, then the closest of the vocabulary's words), for a refusal's hint."""
    import difflib

    tokenizer, vocab = model.tokenizer, model.config.vocab_size
    words = {}
    for i in range(vocab):
        text = tokenizer.readable([i])[0]
        if text.strip().isalpha():
            words.setdefault(text, i)
    found = [w for w in (" " + target.strip(), target.strip()) if w in words]
    stripped = {w.strip(): w for w in words}
    close = [stripped[w] for w in difflib.get_close_matches(target.strip(), list(stripped), n=3 * count, cutoff=0.6)]
    # Whole words (a leading space, as a word after another reads) and the same first letter first.
    first = target.strip()[:1].lower()
    close.sort(key=lambda w: (not w.startswith(" "), w.strip()[:1].lower() != first))
    return list(dict.fromkeys(found + close))[:count]


SMALL_GAP = 0.1  # nats: a clean answer this little above the corrupted one leaves little to recover


def gap_warning(lp_clean: float, lp_corrupted: float) -> str | None:
    """A line saying why the recovered fractions mean little, or None when the inputs are a fair pair."""
    gap = lp_clean - lp_corrupted
    if gap <= 0:
        return (f"the clean input gives the target a log-probability no higher than the corrupted one "
                f"({lp_clean:.2f} against {lp_corrupted:.2f} nats): the fractions measure a way back to a worse "
                "answer; swap the inputs, or choose a corrupted input that lowers the target")
    if gap < SMALL_GAP:
        return (f"the clean input gives the target only {gap:.3f} nats more than the corrupted one: every fraction "
                "divides by that small gap, so small changes look large")
    return None
