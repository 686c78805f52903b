"""What a decoder (causal) head does: previous-token, duplicate-token, induction or first-token.

One head's weights a (seq, seq) have one row per query i and one column per key j; a
causal head gives weight only to keys j <= i and each row sums to 1. All heads of a model
stack to (n_layers, n_heads, seq, seq).

A role is a pattern P (seq, seq): 1 where a head of that role puts its weight. Built from
the token ids of one sequence, with TransformerLens's definitions of the first three:

    previous token    P[i, j] = 1  iff  j = i - 1
    duplicate token   P[i, j] = 1  iff  j < i and ids[j] = ids[i]
    induction         P[i, k] = 1  iff  1 <= k <= i and ids[k - 1] = ids[i]
    first token       P[i, j] = 1  iff  j = 0

Induction is the duplicate pattern moved one column to the right: for each earlier
occurrence j of the current token, the key after it, j + 1. Since j < i, that key is at
most i; it IS i when the token repeats at once (ids[i - 1] = ids[i]), so the pattern can
then hold a 1 on the diagonal. ``exclude_current`` removes that weight when it matters.

The score of a head against a pattern is TransformerLens's "mul" score: the share of the
head's total attention that falls on the pattern, sum(a * P) / sum(a), over ALL rows, so
rows where P is empty count in the denominator and pull the score down. A perfect
previous-token head scores (seq - 1) / seq, because row 0 can only look at itself.

``classify_decoder_heads`` reads rows i >= 1 only by default, for its scores and its
entropy: row 0 has a single key, so it says nothing about the head, and counting it would
hand every head 1/seq of first-token share. There a perfect previous-token head scores 1.
With ``first_row=0`` its scores read every row and are TransformerLens's own numbers
(``selfattn heads`` shows those); the entropy still leaves row 0 out.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from selfattn.errors import OptionError, ShapeError
from selfattn.analysis.head_roles import ROW_SUM_TOLERANCE, as_tensor

PREVIOUS_TOKEN, DUPLICATE_TOKEN, INDUCTION, FIRST_TOKEN = "previous token", "duplicate token", "induction", "first token"
MIXED = "mixed"
DECODER_PATTERNS = (PREVIOUS_TOKEN, DUPLICATE_TOKEN, INDUCTION, FIRST_TOKEN)  # ties go to the first listed
DECODER_ROLES = (*DECODER_PATTERNS, MIXED)
DECODER_THRESHOLD = 0.4


def previous_token_pattern(seq: int) -> torch.Tensor:
    """P[i, j] = (j = i - 1).   seq -> (seq, seq) bool

    Args:
        seq: the sequence length, at least 1.

    Returns:
        The pattern, True at (i, i - 1) for every i >= 1.

    Raises:
        OptionError: seq is not a positive int.

    Examples:
        >>> from selfattn.analysis.decoder_roles import previous_token_pattern
        >>> previous_token_pattern(3).long()
        tensor([[0, 0, 0],
                [1, 0, 0],
                [0, 1, 0]])
    """
    n = _positive_int(seq, "seq")
    return torch.arange(n)[None, :] == torch.arange(n)[:, None] - 1  # (seq, seq): key j = query i - 1


def duplicate_token_pattern(ids) -> torch.Tensor:
    """P[i, j] = (j < i and ids[j] = ids[i]).   ids: (seq,) -> (seq, seq) bool

    Args:
        ids: the token ids of one sequence, (seq,) integers.

    Returns:
        The pattern, True at every earlier occurrence of the query's token.

    Raises:
        ShapeError: ids is not a non-empty 1-D sequence of integers.

    Examples:
        >>> from selfattn.analysis.decoder_roles import duplicate_token_pattern
        >>> duplicate_token_pattern([4, 9, 4]).long()
        tensor([[0, 0, 0],
                [0, 0, 0],
                [1, 0, 0]])
    """
    t = check_ids(ids)
    n = len(t)
    same = t[:, None] == t[None, :]  # (seq, seq): ids[i] = ids[j]
    earlier = torch.arange(n)[None, :] < torch.arange(n)[:, None]  # (seq, seq): j < i
    return same & earlier


def induction_pattern(ids) -> torch.Tensor:
    """P[i, k] = D[i, k - 1] for k >= 1, P[i, 0] = 0, with D the duplicate pattern.   ids: (seq,) -> (seq, seq) bool

    For each earlier occurrence j < i of the query's token, the key j + 1 right after it.
    j + 1 <= i always; it equals i (a 1 on the diagonal) when ids[i - 1] = ids[i].

    Args:
        ids: the token ids of one sequence, (seq,) integers.

    Returns:
        The pattern, TransformerLens's induction pattern.

    Raises:
        ShapeError: ids is not a non-empty 1-D sequence of integers.

    Examples:
        >>> from selfattn.analysis.decoder_roles import induction_pattern
        >>> induction_pattern([4, 9, 4, 9]).long()  # the second 4 looks at the first 9, the second 9 at the second 4
        tensor([[0, 0, 0, 0],
                [0, 0, 0, 0],
                [0, 1, 0, 0],
                [0, 0, 1, 0]])
    """
    duplicate = duplicate_token_pattern(ids)  # (seq, seq)
    shifted = torch.zeros_like(duplicate)
    shifted[:, 1:] = duplicate[:, :-1]  # column j -> j + 1; D's last column is empty (j < i <= seq - 1)
    return shifted


def first_token_pattern(seq: int) -> torch.Tensor:
    """P[i, j] = (j = 0).   seq -> (seq, seq) bool

    Args:
        seq: the sequence length, at least 1.

    Returns:
        The pattern, True in column 0 of every row.

    Raises:
        OptionError: seq is not a positive int.

    Examples:
        >>> from selfattn.analysis.decoder_roles import first_token_pattern
        >>> first_token_pattern(2).long()
        tensor([[1, 0],
                [1, 0]])
    """
    n = _positive_int(seq, "seq")
    return (torch.arange(n) == 0)[None, :].expand(n, n).clone()  # (seq, seq)


def detect_score(weights, pattern, exclude_bos: bool = False, exclude_current: bool = False, *, first_row: int = 0):
    """score = sum_{i >= first_row, j} a'_ij P_ij / sum_{i >= first_row, j} a'_ij.   (..., seq, seq), (seq, seq) -> (...)

    TransformerLens's "mul" detection score. a' is a with column 0 set to 0 when
    ``exclude_bos`` and the diagonal set to 0 when ``exclude_current``, in the numerator
    AND the denominator. Every row from ``first_row`` on counts, including rows where P is
    empty; with the default first_row = 0 and no exclusions the denominator is seq (the
    rows sum to 1). When nothing is left in the denominator (for example a head entirely
    on token 0 with exclude_bos) the score is 0, where TransformerLens would give nan.

    Args:
        weights: attention weights, (..., seq, seq), finite and non-negative.
        pattern: the role's pattern, (seq, seq), bool or numbers in [0, 1].
        exclude_bos: leave the weight on key 0 out of both sums.
        exclude_current: leave the weight on key i (the query itself) out of both sums.
        first_row: read only rows i >= first_row (0: all rows, as TransformerLens).

    Returns:
        A float in [0, 1] for one head (seq, seq); a float64 tensor (...) of scores otherwise.

    Raises:
        ShapeError: the weights or pattern are invalid or do not match.
        OptionError: first_row is not an int in [0, seq].

    Examples:
        >>> import torch
        >>> from selfattn.analysis.decoder_roles import detect_score, previous_token_pattern
        >>> a = torch.tensor([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])  # a previous-token head
        >>> round(detect_score(a, previous_token_pattern(3)), 4)  # row 0 can only look at itself
        0.6667
        >>> detect_score(a, previous_token_pattern(3), first_row=1)
        1.0
    """
    a = check_weights(weights)  # (..., seq, seq) float64
    n = a.shape[-1]
    p = _check_pattern(pattern, n)  # (seq, seq) float64
    if isinstance(first_row, bool) or not isinstance(first_row, int) or not 0 <= first_row <= n:
        raise OptionError(f"first_row must be an int from 0 to {n}, got {first_row!r}")
    if exclude_bos or exclude_current:
        keep = torch.ones(n, n, dtype=torch.float64)  # (seq, seq): 1 = this weight counts
        if exclude_bos:
            keep[:, 0] = 0
        if exclude_current:
            keep.fill_diagonal_(0)
        a = a * keep  # (..., seq, seq)
    score = _pattern_scores(a, [p], first_row)[..., 0]  # (...)
    return float(score) if a.dim() == 2 else score


def _pattern_scores(a: torch.Tensor, patterns, first_row: int) -> torch.Tensor:
    """detect_score of checked weights for several patterns at once.   (..., seq, seq), P of (seq, seq) -> (..., P)

    sum_ij a_ij P_ij is one matrix-vector product per pattern over the flattened rows (no
    (seq, seq) product is made), divided by sum_ij a_ij over the same rows.
    """
    rows = a[..., first_row:, :]  # (..., rows, seq)
    flat = rows.reshape(*rows.shape[:-2], -1)  # (..., rows * seq)
    on_pattern = flat @ torch.stack([p[first_row:].reshape(-1).to(flat.dtype) for p in patterns], dim=-1)  # (..., P)
    total = flat.sum(dim=-1, keepdim=True)  # (..., 1)
    safe = torch.where(total > 0, total, torch.ones_like(total))  # no 0 / 0, even in the branch not taken
    score = torch.where(total > 0, on_pattern / safe, torch.zeros_like(on_pattern))
    return score.clamp(0.0, 1.0)  # float32 weights: a subset's sum may pass the total by ~1e-16


def induction_probe(vocab_size: int, length: int, seed: int = 0, first_id: int | None = None, avoid=()) -> torch.Tensor:
    """[first_id] + r + r, r = `length` random ids.   -> (2 * length,) or (1 + 2 * length,) int64

    The ids of r come from range(vocab_size) without ``avoid`` and without first_id, drawn
    without repetition (a random permutation of those ids, seeded). Only when there are
    fewer such ids than ``length`` does r repeat: it is then several permutations one after
    another, cut at ``length``.

    Args:
        vocab_size: the number of token ids, a positive int.
        length: the length of r, at least 2.
        seed: the seed of the torch.Generator that draws r, an int >= 0.
        first_id: a token placed first (a BOS id), or None for no first token.
        avoid: ids never drawn (special tokens), ints in range(vocab_size).

    Returns:
        The probe, int64: position t and t + length of the copies hold the same id.

    Raises:
        OptionError: an argument is out of range, or fewer than 2 ids are left to draw from.

    Examples:
        >>> from selfattn.analysis.decoder_roles import induction_probe
        >>> p = induction_probe(50, 4, first_id=0)
        >>> p.shape, int(p[0]), p[1:5].tolist() == p[5:].tolist(), len(set(p[1:5].tolist()))
        (torch.Size([9]), 0, True, 4)
    """
    vocab = _positive_int(vocab_size, "vocab_size")
    n = _positive_int(length, "length")
    if n < 2:
        raise OptionError(f"length must be at least 2 (an induction head needs a token before it), got {n}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise OptionError(f"seed must be an int >= 0, got {seed!r}")
    if isinstance(avoid, (str, bytes)) or not hasattr(avoid, "__iter__"):
        raise OptionError(f"avoid must be a collection of token ids, got {avoid!r}")
    skipped = set(avoid) | ({first_id} if first_id is not None else set())
    for token in skipped:
        if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < vocab:
            raise OptionError(f"token ids (first_id, avoid) must be ints in range({vocab}), got {token!r}")
    pool = torch.tensor([t for t in range(vocab) if t not in skipped], dtype=torch.int64)  # (m,)
    if len(pool) < 2:
        raise OptionError(f"only {len(pool)} token id(s) left to draw from in range({vocab}) without first_id and avoid; need 2")
    generator = torch.Generator().manual_seed(seed)
    rounds = -(-n // len(pool))  # permutations needed to reach `length` ids
    draws = torch.cat([pool[torch.randperm(len(pool), generator=generator)] for _ in range(rounds)])[:n]  # (length,)
    head = torch.tensor([first_id], dtype=torch.int64) if first_id is not None else torch.empty(0, dtype=torch.int64)
    return torch.cat([head, draws, draws])


def induction_probe_score(weights, length: int, offset: int) -> torch.Tensor:
    """score = (1 / length) sum_{t = offset + length}^{offset + 2 length - 1} a[t, t - length + 1].   (..., seq, seq) -> (...)

    The mean weight from each token of the second copy to the token after its first
    occurrence. On a probe whose copy has no repeats (``induction_probe`` with enough ids),
    the induction pattern holds exactly these ``length`` ones and nothing else, so
    detect_score(a, induction_pattern(ids)) = score * length / seq for row-stochastic a.

    Args:
        weights: attention weights, (..., seq, seq), finite and non-negative.
        length: the length of one copy, at least 2.
        offset: the tokens before the first copy (1 with a BOS first token, else 0).

    Returns:
        The scores, float64 (...); a 0-d tensor for one head.

    Raises:
        OptionError: length is below 2 or offset is negative.
        ShapeError: the weights are invalid or shorter than offset + 2 * length.

    Examples:
        >>> import torch
        >>> from selfattn.analysis.decoder_roles import induction_probe_score
        >>> a = torch.zeros(4, 4)  # ids a b a b: the second a looks at the first b, the second b at the second a
        >>> a[0, 0] = a[1, 0] = a[2, 1] = a[3, 2] = 1.0
        >>> induction_probe_score(a, length=2, offset=0)
        tensor(1., dtype=torch.float64)
    """
    n = _positive_int(length, "length")
    if n < 2:
        raise OptionError(f"length must be at least 2, got {n}")
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise OptionError(f"offset must be an int >= 0, got {offset!r}")
    a = check_weights(weights)  # (..., seq, seq)
    if a.shape[-1] < offset + 2 * n:
        raise ShapeError(f"the weights cover {a.shape[-1]} tokens; a probe of offset {offset} and length {n} needs {offset + 2 * n}")
    queries = torch.arange(offset + n, offset + 2 * n)  # (length,): the second copy
    return a[..., queries, queries - n + 1].mean(dim=-1)  # (..., length) -> (...)


@dataclass(frozen=True)
class DecoderHeadRole:
    """One decoder head on one sequence: its four pattern scores, its entropy and its role.

    Attributes:
        role: one of DECODER_ROLES: the best-scoring pattern if it reaches the threshold, else "mixed".
        previous_token: detect_score on the previous-token pattern, rows i >= 1, in [0, 1].
        duplicate_token: the same on the duplicate-token pattern.
        induction: the same on the induction pattern.
        first_token: the same on the first-token pattern.
        entropy: mean over rows i >= 1 of -sum_j a_ij ln a_ij, in nats (0 = one key).

    Examples:
        >>> from selfattn.analysis.decoder_roles import DecoderHeadRole
        >>> DecoderHeadRole("induction", 0.1, 0.0, 0.8, 0.1, 0.5).scores["induction"]
        0.8
    """

    role: str
    previous_token: float
    duplicate_token: float
    induction: float
    first_token: float
    entropy: float

    @property
    def scores(self) -> dict[str, float]:
        """Pattern name -> score, in DECODER_PATTERNS order."""
        values = (self.previous_token, self.duplicate_token, self.induction, self.first_token)
        return dict(zip(DECODER_PATTERNS, values))


def classify_decoder_heads(
    attentions, ids, threshold: float = DECODER_THRESHOLD, *, first_row: int = 1
) -> list[list[DecoderHeadRole]]:
    """Every head's role.   attentions: (n_layers, n_heads, seq, seq) or n_layers x (n_heads, seq, seq); ids: (seq,)

    Scores are detect_score(a, P, first_row=first_row) for the four patterns built from
    ``ids``; role = argmax of the scores (the first of equals, in DECODER_PATTERNS order)
    when that score >= threshold, else "mixed". The entropy reads rows i >= 1 either way.
    With seq = 1 and first_row = 1 there are no rows to read: every score and the entropy
    are 0 and the role is "mixed".

    Args:
        attentions: the weights of every head, stacked or as one tensor per layer; rows sum to 1.
        ids: the token ids of the sequence, (seq,) integers.
        threshold: the score a pattern needs to name the head, in [0, 1].
        first_row: 1 (default): the scores leave row 0 out; 0: they read every row, as
            TransformerLens's detect_head.

    Returns:
        One list per layer of one DecoderHeadRole per head.

    Raises:
        ShapeError: the weights are not 4-D, invalid, rows do not sum to 1, or seq != len(ids).
        OptionError: threshold is not a number in [0, 1], or first_row is not 0 or 1.

    Examples:
        >>> import torch
        >>> from selfattn.analysis.decoder_roles import classify_decoder_heads
        >>> a = torch.tensor([[1.0, 0, 0, 0], [1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0]])  # previous token
        >>> head = classify_decoder_heads(a[None, None], [5, 7, 5, 7])[0][0]
        >>> head.role, head.previous_token, round(head.induction, 4), head.entropy
        ('previous token', 1.0, 0.6667, 0.0)
        >>> classify_decoder_heads(a[None, None], [5, 7, 5, 7], first_row=0)[0][0].previous_token  # row 0 counts
        0.75
    """
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 <= threshold <= 1:
        raise OptionError(f"threshold must be a number from 0 to 1, got {threshold!r}")
    if isinstance(first_row, bool) or not isinstance(first_row, int) or first_row not in (0, 1):
        raise OptionError(f"first_row must be 0 (every row) or 1 (rows after the first), got {first_row!r}")
    layers = _layers(attentions)  # n_layers x (n_heads, seq, seq), nothing copied yet
    t = check_ids(ids)
    n = len(t)
    patterns = (previous_token_pattern(n), duplicate_token_pattern(t), induction_pattern(t), first_token_pattern(n))
    heads = []
    for weights in layers:  # a layer at a time: float64 copies of one layer's weights, not of every layer's
        a = check_weights(weights[None], n)  # (1, n_heads, seq, seq) float64
        sums = a.sum(dim=-1)  # (1, n_heads, seq)
        if a.numel() and float((sums - 1).abs().max()) > ROW_SUM_TOLERANCE:
            raise ShapeError(f"each row of attention weights must sum to 1; one sums to {float(sums.flatten()[(sums - 1).abs().argmax()]):.6g}")
        scores = _pattern_scores(a, patterns, first_row)[0]  # (n_heads, 4): detect_score of each pattern
        entropy = torch.special.entr(a[..., 1:, :]).sum(dim=-1)  # (1, n_heads, seq - 1): -sum a ln a, in nats
        entropy = entropy.mean(dim=-1).clamp(min=0.0)[0] if n > 1 else torch.zeros(a.shape[1], dtype=torch.float64)
        row = []
        for head in range(a.shape[1]):
            values = [float(s) for s in scores[head]]
            role = role_of(dict(zip(DECODER_PATTERNS, values)), threshold)
            row.append(DecoderHeadRole(role, *values, float(entropy[head])))
        heads.append(row)
    return heads


def role_of(scores: dict[str, float], threshold: float = DECODER_THRESHOLD) -> str:
    """A head's role from the scores a table shows of it: the highest, if it reaches the threshold.

    The one rule every table uses (``selfattn heads`` on a sentence or the probe, ``train``'s
    summary, the shipped models' READMEs): role = the pattern of the highest score (the
    first of equals, in DECODER_PATTERNS order) when that score >= threshold, else "mixed".
    On the induction probe the induction score given is the probe's
    (``induction_probe_score``), the number those tables show for it.

    Args:
        scores: pattern name (one of DECODER_PATTERNS) -> score; patterns a table does not
            show are left out.
        threshold: the score a pattern needs to name the head.

    Returns:
        One of DECODER_ROLES.

    Raises:
        OptionError: a name that is not a pattern.

    Examples:
        >>> from selfattn.analysis.decoder_roles import role_of
        >>> role_of({"previous token": 0.47, "induction": 0.02, "first token": 0.1})
        'previous token'
        >>> role_of({"previous token": 0.27, "induction": 0.03, "first token": 0.2})
        'mixed'
    """
    unknown = [name for name in scores if name not in DECODER_PATTERNS]
    if unknown:
        raise OptionError(f"unknown pattern {unknown[0]!r}: the patterns are {', '.join(DECODER_PATTERNS)}")
    ordered = [(name, float(scores[name])) for name in DECODER_PATTERNS if name in scores]
    if not ordered:
        return MIXED
    name, best = max(ordered, key=lambda pair: pair[1])  # max keeps the first of equals
    return name if best >= threshold else MIXED


def check_ids(ids) -> torch.Tensor:
    """Token ids as a 1-D int64 tensor.   (seq,) -> (seq,)

    Args:
        ids: a non-empty 1-D tensor, array or list of integers.

    Returns:
        The ids, int64.

    Raises:
        ShapeError: the ids are not a non-empty 1-D sequence of integers.

    Examples:
        >>> from selfattn.analysis.decoder_roles import check_ids
        >>> check_ids([3, 1, 3])
        tensor([3, 1, 3])
    """
    try:
        t = torch.as_tensor(ids)
    except (TypeError, ValueError, RuntimeError) as error:
        raise ShapeError(f"token ids must be a 1-D sequence of integers: {error}") from None
    if t.dtype == torch.bool or t.is_floating_point() or t.is_complex():
        raise ShapeError(f"token ids must be integers, got {t.dtype}")
    if t.dim() != 1 or len(t) == 0:
        raise ShapeError(f"token ids must be a non-empty 1-D sequence, got shape {tuple(t.shape)}")
    return t.to(torch.int64)


def check_weights(weights, seq: int | None = None) -> torch.Tensor:
    """Attention weights (..., seq, seq) as float64, checked.

    Args:
        weights: the weights of one head or more, (..., seq, seq).
        seq: the length they must have, or None for any.

    Returns:
        The weights as float64.

    Raises:
        ShapeError: fewer than 2 axes, the last two not square or not seq, or a weight that
            is negative or not finite.

    Examples:
        >>> from selfattn.analysis.decoder_roles import check_weights
        >>> check_weights([[1, 0], [0.5, 0.5]], seq=2).dtype
        torch.float64
    """
    a = as_tensor(weights)
    if a.dim() < 2 or a.shape[-1] != a.shape[-2] or a.shape[-1] == 0:
        raise ShapeError(f"attention weights must be (..., seq, seq) with seq >= 1, got shape {tuple(a.shape)}")
    if seq is not None and a.shape[-1] != seq:
        raise ShapeError(f"the weights are {a.shape[-1]} x {a.shape[-1]} but there are {seq} token ids: they must match")
    if not bool(torch.isfinite(a).all()) or bool((a < 0).any()):
        raise ShapeError("attention weights must be finite and non-negative")
    return a


def _check_pattern(pattern, seq: int) -> torch.Tensor:
    p = as_tensor(pattern)
    if tuple(p.shape) != (seq, seq):
        raise ShapeError(f"the pattern must be ({seq}, {seq}) like the weights' last two axes, got shape {tuple(p.shape)}")
    if not bool(torch.isfinite(p).all()) or bool((p < 0).any()) or bool((p > 1).any()):
        raise ShapeError("a pattern must hold bools or numbers from 0 to 1")
    return p


def _layers(attentions) -> list[torch.Tensor]:
    """Every layer's (n_heads, seq, seq) weights, as views: one tensor per layer, or a stacked 4-D one."""
    if isinstance(attentions, (list, tuple)) and attentions and all(isinstance(a, torch.Tensor) for a in attentions):
        if len({tuple(a.shape) for a in attentions}) != 1:
            raise ShapeError(f"the layers' attentions differ in shape: {[tuple(a.shape) for a in attentions]}")
        if attentions[0].dim() != 3:
            raise ShapeError(f"attentions must be (n_layers, n_heads, seq, seq), got layers of shape {tuple(attentions[0].shape)}")
        return list(attentions)
    a = as_tensor(attentions)
    if a.dim() != 4:
        raise ShapeError(f"attentions must be (n_layers, n_heads, seq, seq), got shape {tuple(a.shape)}")
    return list(a)


def _positive_int(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise OptionError(f"{name} must be a positive int, got {value!r}")
    return value
