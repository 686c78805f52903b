"""What a head does on one input: where its weight goes, and how focused it is.

For one head the weights a (n, n) have one row per query and one column per key; each
row sums to 1. We read the rows of the real words only (not [CLS], [SEP] or [PAD]): the
special tokens' own rows often do something of their own, and there are only two of them.

Each key j of a word row i falls into exactly one of five parts, checked in this order:

    [CLS]/[SEP]      key j is a special token ([CLS], [SEP] or [PAD])
    self             j = i
    previous token   j = i - 1
    next token       j = i + 1
    other            any other word

Every part is averaged over the same rows, so the five shares add up to 1. The first
word's key i - 1 is [CLS] and the last word's key i + 1 is [SEP]: that weight counts under
[CLS]/[SEP], so those rows give 0 to previous and next. A text with no words at all
([CLS] [SEP]) reads every row.

One more measure overlaps the parts: how much the other words look at one single word.
For each word t, its focus share is the mean of a[i, t] over the word rows i != t; the
word with the largest focus share (the first of equals) is the head's focus.

The role is the largest of the four named parts (previous, next, self, [CLS]/[SEP]) when
it reaches ROLE_THRESHOLD (one half; ties go to the part listed first in ROLES); failing
that, "one token" when the focus share reaches the threshold; else "spread". "other"
names no role: it is weight on words further away, which "one token" reads more closely.
In a text of two words, looking at the other word is also looking at one token; the
named parts come first so that such a head stays "previous token" or "next token".

Entropy, in bits, of one row: H_i = -sum_j a_ij log2 a_ij (with 0 log 0 = 0), averaged
over the same rows. 0 bits: all weight on one key. log2 n bits: equal weight on all n
keys. The normalised entropy H / log2 n runs from 0 (one-hot) to 1 (uniform).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from selfattn.errors import ShapeError

PREVIOUS, NEXT, SELF, SPECIAL = "previous token", "next token", "self", "[CLS]/[SEP]"
ONE_TOKEN, SPREAD, OTHER = "one token", "spread", "other"
ROLES = (PREVIOUS, NEXT, SELF, SPECIAL, ONE_TOKEN, SPREAD)
PATTERNS = (PREVIOUS, NEXT, SELF, SPECIAL)  # the parts that can name a role
PARTS = (*PATTERNS, OTHER)  # every key of a word row falls in exactly one of these
ROLE_THRESHOLD = 0.5  # a pattern names the head when it takes at least half the weight
SPECIAL_TOKENS = frozenset({"[CLS]", "[SEP]", "[PAD]"})
ROW_SUM_TOLERANCE = 1e-4  # float32 softmax rows of 512 keys sum to 1 within ~1e-6


@dataclass(frozen=True)
class TokenFocus:
    """The word the other words look at most.

    Attributes:
        index: its position in the tokens, from 0.
        token: its text.
        share: the mean weight the other word rows put on it.
    """

    index: int
    token: str
    share: float


@dataclass(frozen=True)
class HeadRole:
    """One head on one input: its role, that role's share, where the weight goes, and its entropy.

    Attributes:
        role: one of ROLES.
        share: the share of ``role`` (for "one token": the focus share); for "spread", the
            largest of the four named parts' shares and the focus share.
        entropy: mean row entropy in bits.
        normalized_entropy: entropy / log2 n: 0 = one-hot, 1 = uniform.
        shares: part -> share for every part of PARTS; they add up to 1.
        focus: the word the other words look at most (None with fewer than two words).
    """

    role: str
    share: float
    entropy: float
    normalized_entropy: float
    shares: dict[str, float] = field(default_factory=dict)
    focus: TokenFocus | None = None

    @property
    def target(self) -> TokenFocus | None:
        """The single word this head looks at, for the "one token" role; None for every other role."""
        return self.focus if self.role == ONE_TOKEN else None

    @property
    def runner_up(self) -> tuple[str, float]:
        """The strongest named pattern other than the role (for "spread": the strongest of all)."""
        others = [(p, self.shares[p]) for p in PATTERNS if p != self.role]
        return max(others, key=lambda item: item[1])


def classify_head(weights, tokens: list[str]) -> HeadRole:
    """One head's role, shares and entropy.   weights: (n, n), rows = queries summing to 1; tokens: n

    Args:
        weights: one head's attention weights, (n, n), each row summing to 1.
        tokens: the n tokens, in order.

    Returns:
        The head's HeadRole.

    Raises:
        ShapeError: the weights are not a square row-stochastic matrix matching the tokens.
    """
    a = check_weights(weights, tokens)  # (n, n) float64
    n = a.shape[0]
    is_word = torch.tensor([t not in SPECIAL_TOKENS for t in tokens])  # (n,)
    rows = torch.nonzero(is_word).flatten() if bool(is_word.any()) else torch.arange(n)  # (r,) query rows read
    shares = part_shares(a, rows, is_word)
    focus = token_focus(a, rows, tokens) if bool(is_word.any()) else None
    most = math.log2(n)  # uniform rows; 0 for one key, which has nothing to spread over
    entropy = _clamp(float(row_entropy(a[rows]).mean()), most)
    normalized = entropy / most if n > 1 else 0.0
    role, share = encoder_role(shares, focus.share if focus else 0.0)
    return HeadRole(role, share, entropy, normalized, shares, focus)


def encoder_role(shares: dict[str, float], focus_share: float) -> tuple[str, float]:
    """The role an encoder head's shares name, and that role's share (the module docstring's rule).

    Args:
        shares: part -> share, for at least the four PATTERNS.
        focus_share: the focus word's share (0 without one).

    Returns:
        (role, share): the largest named part when it reaches ROLE_THRESHOLD (ties to the
            first in ROLES), else "one token" when the focus share does, else "spread" with
            the largest of them.
    """
    best = max(PATTERNS, key=lambda p: shares[p])  # max keeps the first of equals: ROLES order
    if shares[best] >= ROLE_THRESHOLD:
        return best, shares[best]
    if focus_share >= ROLE_THRESHOLD:
        return ONE_TOKEN, focus_share
    return SPREAD, max(shares[best], focus_share)


def classify_heads(attentions, tokens: list[str]) -> list[list[HeadRole]]:
    """Every head of every layer.   attentions: (layers, heads, n, n), or a sequence of (heads, n, n)

    Args:
        attentions: the weights of every head, stacked or as one tensor per layer.
        tokens: the n tokens, in order.

    Returns:
        One list per layer of one HeadRole per head.

    Raises:
        ShapeError: the layers differ in shape, or a head's weights are not valid.
    """
    if isinstance(attentions, (list, tuple)) and attentions and all(isinstance(a, torch.Tensor) for a in attentions):
        if len({tuple(a.shape) for a in attentions}) != 1:
            raise ShapeError(f"the layers' attentions differ in shape: {[tuple(a.shape) for a in attentions]}")
        attentions = torch.stack(list(attentions))  # (layers, heads, n, n)
    a = as_tensor(attentions)
    if a.dim() != 4:
        raise ShapeError(f"attentions must be (layers, heads, n, n), got shape {tuple(a.shape)}")
    return [[classify_head(a[layer, head], tokens) for head in range(a.shape[1])] for layer in range(a.shape[0])]


def part_shares(a: torch.Tensor, rows: torch.Tensor, is_word: torch.Tensor) -> dict[str, float]:
    """The five parts' shares, each averaged over the same rows.   a: (n, n); rows: (r,); is_word: (n,) bool

    Args:
        a: one head's weights, (n, n).
        rows: the query rows read, (r,).
        is_word: True for the keys that are words, False for [CLS]/[SEP]/[PAD], (n,).

    Returns:
        Part -> share for every part of PARTS.
    """
    n = a.shape[0]
    offset = torch.arange(n)[None, :] - rows[:, None]  # (r, n): key j - query i
    word = is_word[None, :].expand(len(rows), n)  # (r, n)
    masks = {
        SPECIAL: ~word,
        SELF: word & (offset == 0),
        PREVIOUS: word & (offset == -1),
        NEXT: word & (offset == 1),
    }
    masks[OTHER] = word & (offset.abs() > 1)
    w = a[rows]  # (r, n)
    return {part: _mean((w * masks[part]).sum(dim=-1)) for part in PARTS}


def token_focus(a: torch.Tensor, rows: torch.Tensor, tokens: list[str]) -> TokenFocus | None:
    """The word the other word rows look at most: argmax_t mean_{i in rows, i != t} a[i, t].

    Args:
        a: one head's weights, (n, n).
        rows: the word rows read, (r,).
        tokens: the n tokens.

    Returns:
        The focus word and its share, or None when there are fewer than two word rows.
    """
    if len(rows) < 2:
        return None
    w = a[rows][:, rows]  # (r, r): word rows onto word keys
    off_diagonal = w.sum(dim=0) - w.diagonal()  # (r,): each word key's weight from the other words
    focus = off_diagonal / (len(rows) - 1)  # (r,)
    best = int(focus.argmax())  # argmax keeps the first of equals
    index = int(rows[best])
    return TokenFocus(index, tokens[index], _clamp(float(focus[best]), 1.0))


def row_entropy(a: torch.Tensor) -> torch.Tensor:
    """H_i = -sum_j a_ij log2 a_ij, with 0 log 0 = 0.   (..., n) -> (...)

    Args:
        a: rows of weights, (..., n).

    Returns:
        Each row's entropy in bits, (...).
    """
    terms = torch.where(a > 0, a * torch.log2(a.clamp(min=1e-300)), torch.zeros_like(a))  # (..., n)
    return -terms.sum(dim=-1)


def _mean(values: torch.Tensor) -> float:
    return _clamp(float(values.mean()), 1.0) if values.numel() else 0.0


def _clamp(value: float, upper: float) -> float:
    """Into [0, upper]: float32 rows sum to 1 only within ~1e-7, which can push a share past 1."""
    return min(max(value, 0.0), upper)


def as_tensor(values) -> torch.Tensor:
    """Anything torch can read as numbers, as a float64 tensor.

    Args:
        values: a tensor, array or nested list of numbers.

    Returns:
        The values as float64.

    Raises:
        ShapeError: the values are not numbers.
    """
    try:
        return torch.as_tensor(values).to(torch.float64)
    except (TypeError, ValueError, RuntimeError) as error:
        raise ShapeError(f"attention weights must be a numeric array: {error}") from None


def check_weights(weights, tokens: list[str]) -> torch.Tensor:
    """A (n, n) row-stochastic matrix matching the tokens, as float64.

    Args:
        weights: one head's attention weights.
        tokens: the tokens, one per row.

    Returns:
        The weights as a float64 (n, n) tensor.

    Raises:
        ShapeError: the weights are not square, not n x n, negative, not finite, or a row
            does not sum to 1.
    """
    if not isinstance(tokens, (list, tuple)) or not all(isinstance(t, str) for t in tokens):
        raise ShapeError("tokens must be a list of strings, one per row of the weights")
    a = as_tensor(weights)
    if a.dim() != 2 or a.shape[0] != a.shape[1] or a.shape[0] == 0:
        raise ShapeError(f"one head's weights must be a non-empty square (n, n) matrix, got shape {tuple(a.shape)}")
    if a.shape[0] != len(tokens):
        raise ShapeError(f"the weights are {tuple(a.shape)} but there are {len(tokens)} tokens: they must match")
    if not bool(torch.isfinite(a).all()) or bool((a < 0).any()):
        raise ShapeError("attention weights must be finite and non-negative")
    sums = a.sum(dim=-1)  # (n,)
    worst = int((sums - 1).abs().argmax())
    if abs(float(sums[worst]) - 1) > ROW_SUM_TOLERANCE:
        raise ShapeError(f"each row of attention weights must sum to 1; row {worst} sums to {float(sums[worst]):.6g}")
    return a
