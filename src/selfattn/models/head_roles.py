"""What a head does on one input: the attention pattern it mostly follows, and how focused it is.

For one head the weights a (n, n) have one row per query and one column per key; each
row sums to 1. We read the rows of the real words only (not [CLS], [SEP] or [PAD]): the
special tokens' own rows often do something of their own, and there are only two of them.

Four patterns, each a share of the weight, averaged over the word rows that have it:

    previous token   a[i, i-1]             rows whose key i-1 is a word (not [CLS])
    next token       a[i, i+1]             rows whose key i+1 is a word (not [SEP])
    self             a[i, i]               every word row
    [CLS]/[SEP]      sum_j special a[i, j] every word row: all the weight on special keys

Within one row the four key sets do not overlap, so a share of at least ROLE_THRESHOLD
(one half) means that pattern takes most of the head's weight. The role is the pattern
with the largest share when that share reaches the threshold, else "spread" (ties go to
the pattern listed first in ROLES). A pattern no row has (no previous word for a
one-word text) has share 0. A text with no words at all ([CLS] [SEP]) uses every row.

Entropy, in bits, of one row: H_i = -sum_j a_ij log2 a_ij (with 0 log 0 = 0), averaged
over the same rows. 0 bits: all weight on one key. log2 n bits: equal weight on all n
keys. The normalised entropy H / log2 n runs from 0 (one-hot) to 1 (uniform).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from selfattn.errors import ShapeError

PREVIOUS, NEXT, SELF, SPECIAL, SPREAD = "previous token", "next token", "self", "[CLS]/[SEP]", "spread"
ROLES = (PREVIOUS, NEXT, SELF, SPECIAL, SPREAD)
PATTERNS = ROLES[:-1]  # the roles with a share of their own
ROLE_THRESHOLD = 0.5  # a pattern names the head when it takes at least half the weight
SPECIAL_TOKENS = frozenset({"[CLS]", "[SEP]", "[PAD]"})
ROW_SUM_TOLERANCE = 1e-4  # float32 softmax rows of 512 keys sum to 1 within ~1e-6


@dataclass(frozen=True)
class HeadRole:
    """One head on one input: its role, that pattern's share, and its entropy."""

    role: str  # one of ROLES
    share: float  # the share of ``role``'s pattern; for "spread", the largest share
    entropy: float  # mean row entropy in bits
    normalized_entropy: float  # entropy / log2 n: 0 = one-hot, 1 = uniform
    shares: dict[str, float] = field(default_factory=dict)  # pattern -> share, for every pattern

    @property
    def runner_up(self) -> tuple[str, float]:
        """The strongest pattern other than the role (for "spread": the strongest of all)."""
        others = [(p, s) for p, s in self.shares.items() if p != self.role]
        return max(others, key=lambda item: item[1])


def classify_head(weights, tokens: list[str]) -> HeadRole:
    """One head's role and entropy.   weights: (n, n), rows = queries summing to 1; tokens: n"""
    a = check_weights(weights, tokens)  # (n, n) float64
    n = a.shape[0]
    is_word = torch.tensor([t not in SPECIAL_TOKENS for t in tokens])  # (n,)
    rows = torch.nonzero(is_word).flatten() if bool(is_word.any()) else torch.arange(n)  # (r,) query rows read
    shares = pattern_shares(a, rows, is_word)
    best = max(PATTERNS, key=lambda p: shares[p])  # max keeps the first of equals: ROLES order
    most = math.log2(n)  # uniform rows; 0 for one key, which has nothing to spread over
    entropy = _clamp(float(row_entropy(a[rows]).mean()), most)
    normalized = entropy / most if n > 1 else 0.0
    role = best if shares[best] >= ROLE_THRESHOLD else SPREAD
    return HeadRole(role, shares[best], entropy, normalized, shares)


def classify_heads(attentions, tokens: list[str]) -> list[list[HeadRole]]:
    """Every head of every layer.   attentions: (layers, heads, n, n), or a sequence of (heads, n, n)"""
    if isinstance(attentions, (list, tuple)) and attentions and all(isinstance(a, torch.Tensor) for a in attentions):
        if len({tuple(a.shape) for a in attentions}) != 1:
            raise ShapeError(f"the layers' attentions differ in shape: {[tuple(a.shape) for a in attentions]}")
        attentions = torch.stack(list(attentions))  # (layers, heads, n, n)
    a = as_tensor(attentions)
    if a.dim() != 4:
        raise ShapeError(f"attentions must be (layers, heads, n, n), got shape {tuple(a.shape)}")
    return [[classify_head(a[layer, head], tokens) for head in range(a.shape[1])] for layer in range(a.shape[0])]


def pattern_shares(a: torch.Tensor, rows: torch.Tensor, is_word: torch.Tensor) -> dict[str, float]:
    """The four patterns' shares.   a: (n, n); rows: (r,) query rows read; is_word: (n,) bool"""
    n = a.shape[0]
    in_rows = torch.zeros(n, dtype=torch.bool)
    in_rows[rows] = True
    i = torch.arange(n)
    has_previous = in_rows[1:] & is_word[:-1]  # (n-1,): row i+1 reads key i
    has_next = in_rows[:-1] & is_word[1:]  # (n-1,): row i reads key i+1
    return {
        PREVIOUS: _mean(a[i[1:], i[:-1]][has_previous]),  # a[i, i-1]
        NEXT: _mean(a[i[:-1], i[1:]][has_next]),  # a[i, i+1]
        SELF: _mean(a.diagonal()[rows]),  # a[i, i]
        SPECIAL: _mean(a[rows][:, ~is_word].sum(dim=-1)),  # (r,): weight on [CLS]/[SEP] keys
    }


def row_entropy(a: torch.Tensor) -> torch.Tensor:
    """H_i = -sum_j a_ij log2 a_ij, with 0 log 0 = 0.   (..., n) -> (...)"""
    terms = torch.where(a > 0, a * torch.log2(a.clamp(min=1e-300)), torch.zeros_like(a))  # (..., n)
    return -terms.sum(dim=-1)


def _mean(values: torch.Tensor) -> float:
    return _clamp(float(values.mean()), 1.0) if values.numel() else 0.0


def _clamp(value: float, upper: float) -> float:
    """Into [0, upper]: float32 rows sum to 1 only within ~1e-7, which can push a share past 1."""
    return min(max(value, 0.0), upper)


def as_tensor(values) -> torch.Tensor:
    """Anything torch can read as numbers -> float64 tensor; anything else is a ShapeError."""
    try:
        return torch.as_tensor(values).to(torch.float64)
    except (TypeError, ValueError, RuntimeError) as error:
        raise ShapeError(f"attention weights must be a numeric array: {error}") from None


def check_weights(weights, tokens: list[str]) -> torch.Tensor:
    """A (n, n) row-stochastic matrix matching the tokens, as float64, or a ShapeError."""
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
