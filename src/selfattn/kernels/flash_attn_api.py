"""flash-attn's ``flash_attn_func`` and ``flash_attn_varlen_func`` on our kernel: its layouts, its
bottom-right causal rule and windows, its softcap and ALiBi, with the backward.

flash-attn's conventions, for seqlen_q queries over seqlen_k keys (query i sits at key
position i + seqlen_k - seqlen_q, the bottom-right alignment):

    window_size (left, right):  query i sees keys j with
                                i + seqlen_k - seqlen_q - left <= j <= i + seqlen_k - seqlen_q + right;
                                -1 is unbounded; causal is right = 0
    softcap c > 0:              s = c tanh(s / c), on the scaled scores, before ALiBi and the mask
    alibi_slopes (H,) or (B, H): s -= slope |i + seqlen_k - seqlen_q - j|

Tensors are (batch, seqlen, nheads, headdim), and nheads_k may divide nheads (GQA, MQA).
The window is a structured mask (its empty tiles are skipped) and softcap and ALiBi a
score_mod computed per tile (``kernels.flex``): no seqlen_q x seqlen_k tensor, unless
``return_attn_probs`` asks for the probabilities.
"""

from __future__ import annotations

import math

import torch

from selfattn.errors import OptionError, ShapeError
from selfattn.kernels.flash import flash_with_offset
from selfattn.kernels.flex import TileScoreMod
from selfattn.kernels.probs_from_lse import attention_probs_from_lse
from selfattn.masks import sliding_window_mask


def flash_attn_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
):
    """flash-attn's attention, in its layout.   (B, Sq, H, D), (B, Sk, Hk, D), (B, Sk, Hk, Dv) -> (B, Sq, H, Dv)

    Args:
        q: (batch, seqlen_q, nheads, headdim) queries, floating point.
        k: (batch, seqlen_k, nheads_k, headdim) keys; nheads_k divides nheads.
        v: (batch, seqlen_k, nheads_k, headdim_v) values.
        dropout_p: must be 0 for now (dropout inside the kernel is not written yet).
        softmax_scale: the factor on Q K^T; None means 1 / sqrt(headdim).
        causal: bottom-right causal, the same as window_size (left, 0).
        window_size: (left, right) keys each query sees around its own position, -1 for
            unbounded (module docstring).
        softcap: above 0, scores become softcap tanh(score / softcap); 0 switches it off.
        alibi_slopes: None, or float slopes (nheads,) or (batch, nheads):
            score -= slope |i + seqlen_k - seqlen_q - j|.
        deterministic: accepted for flash-attn's signature; our backward always is.
        return_attn_probs: also return lse (batch, nheads, seqlen_q) and the attention
            probabilities (batch, nheads, seqlen_q, seqlen_k), rebuilt exactly from lse
            (quadratic memory: for tests and inspection).

    Returns:
        out (batch, seqlen_q, nheads, headdim_v); with return_attn_probs the triple
            (out, lse, probs). A query that sees no key gives zeros (lse = -inf).

    Raises:
        ShapeError: the tensors are not 4-D in this layout or do not fit together, or the
            slopes have another shape.
        OptionError: dropout_p is not 0, a window size is below -1 or not an int, or
            softcap is negative.

    Examples:
        >>> import selfattn as sa
        >>> import torch
        >>> q, k, v = torch.randn(3, 1, 5, 2, 8, dtype=torch.float64).unbind(0)  # (batch, seq, heads, d)
        >>> out = sa.flash_attn_func(q, k, v, causal=True)
        >>> t = lambda x: x.transpose(1, 2)  # to (batch, heads, seq, d)
        >>> torch.allclose(t(out), sa.scaled_dot_product_attention(t(q), t(k), t(v), is_causal=True))
        True
    """
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        if not isinstance(tensor, torch.Tensor) or tensor.dim() != 4:
            shown = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
            raise ShapeError(f"flash_attn_func takes (batch, seqlen, nheads, headdim) tensors; {name} is {shown}")
    left, right = check_options(dropout_p, softcap, window_size, causal)
    batch, q_len, heads = q.shape[0], q.shape[1], q.shape[2]
    kv_len = k.shape[1]
    offset = kv_len - q_len  # query i sits at key position i + offset
    mask = None
    if left is not None or right is not None:
        mask = sliding_window_mask(q_len, kv_len, left=left, right=right, align="bottom_right", structured=True)
    slopes = None if alibi_slopes is None else check_slopes(alibi_slopes, batch, heads)
    score_mod = None
    if softcap or slopes is not None:
        score_mod = TileScoreMod(_modifier(float(softcap), slopes, offset), batch, heads)
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H, S, D) views
    out, lse, probs = _attend(qt, kt, vt, mask, score_mod, softmax_scale, return_attn_probs)
    out = out.transpose(1, 2).contiguous()  # (B, Sq, H, Dv)
    return (out, lse, probs) if return_attn_probs else out


def flash_attn_varlen_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    dropout_p: float = 0.0,
    softmax_scale: float | None = None,
    causal: bool = False,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    alibi_slopes: torch.Tensor | None = None,
    deterministic: bool = False,
    return_attn_probs: bool = False,
):
    """flash-attn's attention over packed sequences of different lengths.   (total_q, H, D), (total_k, Hk, D) -> (total_q, H, Dv)

    Sequence s holds queries cu_seqlens_q[s] .. cu_seqlens_q[s + 1] - 1 and keys
    cu_seqlens_k[s] .. cu_seqlens_k[s + 1] - 1, and sees only its own keys; the causal
    rule, the window and ALiBi are aligned per sequence, bottom-right, as in
    ``flash_attn_func`` (ALiBi's (batch, nheads) slopes are per sequence). The packing is
    one block mask (``create_block_mask``), so the blocks between sequences are skipped.

    Args:
        q: (total_q, nheads, headdim) every sequence's queries, one after another.
        k: (total_k, nheads_k, headdim) their keys.
        v: (total_k, nheads_k, headdim_v) their values.
        cu_seqlens_q: int (batch + 1,), the queries' start offsets, from 0 to total_q,
            non-decreasing.
        cu_seqlens_k: int (batch + 1,), the keys' offsets, from 0 to total_k.
        max_seqlen_q: at least the longest query sequence (flash-attn sizes with it).
        max_seqlen_k: at least the longest key sequence.
        dropout_p: must be 0 for now.
        softmax_scale: as ``flash_attn_func``.
        causal: as ``flash_attn_func``, per sequence.
        window_size: as ``flash_attn_func``, per sequence.
        softcap: as ``flash_attn_func``.
        alibi_slopes: (nheads,) or (batch, nheads) float slopes.
        deterministic: accepted for flash-attn's signature.
        return_attn_probs: also return lse (nheads, total_q) and the probabilities
            (nheads, total_q, total_k), zero between sequences (quadratic memory).

    Returns:
        out (total_q, nheads, headdim_v); with return_attn_probs (out, lse, probs).

    Raises:
        ShapeError: the tensors are not 3-D in this layout, or the offsets are not an int
            tensor (batch + 1,) from 0 to the totals, non-decreasing, with one batch size
            for queries and keys, or a max_seqlen is below a sequence's length.
        OptionError: as ``flash_attn_func``.
    """
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        if not isinstance(tensor, torch.Tensor) or tensor.dim() != 3:
            shown = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
            raise ShapeError(f"flash_attn_varlen_func takes (total, nheads, headdim) tensors; {name} is {shown}")
    starts_q = check_offsets(cu_seqlens_q, q.shape[0], max_seqlen_q, "q")
    starts_k = check_offsets(cu_seqlens_k, k.shape[0], max_seqlen_k, "k")
    if len(starts_q) != len(starts_k):
        raise ShapeError(f"cu_seqlens_q holds {len(starts_q) - 1} sequences and cu_seqlens_k {len(starts_k) - 1}")
    left, right = check_options(dropout_p, softcap, window_size, causal)
    batch, heads = len(starts_q) - 1, q.shape[1]
    seq_q = _sequence_of(starts_q, q.shape[0])  # (total_q,): which sequence each query belongs to
    seq_k = _sequence_of(starts_k, k.shape[0])
    # Each query's position among its sequence's keys, bottom-right: i - start_q + (len_k - len_q).
    lengths_q, lengths_k = starts_q.diff(), starts_k.diff()
    place_q = torch.arange(q.shape[0]) - starts_q[seq_q] + (lengths_k - lengths_q)[seq_q]
    place_k = torch.arange(k.shape[0]) - starts_k[seq_k]

    def packed(b, h, q_idx, kv_idx):
        distance = place_q[q_idx] - place_k[kv_idx]  # > 0: the key is before the query's position
        keep = seq_q[q_idx] == seq_k[kv_idx]
        if left is not None:
            keep = keep & (distance <= left)
        if right is not None:
            keep = keep & (-distance <= right)
        return keep

    from selfattn.masks.block_mask import create_block_mask

    mask = create_block_mask(packed, None, None, q.shape[0], k.shape[0])
    slopes = None if alibi_slopes is None else check_slopes(alibi_slopes, batch, heads)
    score_mod = None
    if softcap or slopes is not None:
        score_mod = TileScoreMod(_varlen_modifier(float(softcap), slopes, seq_q, place_q, place_k), 1, heads)
    qt, kt, vt = (t.transpose(0, 1)[None] for t in (q, k, v))  # (1, H, total, D) views
    out, lse, probs = _attend(qt, kt, vt, mask, score_mod, softmax_scale, return_attn_probs)
    out = out[0].transpose(0, 1).contiguous()  # (total_q, H, Dv)
    return (out, lse[0], probs[0]) if return_attn_probs else out


def _attend(qt, kt, vt, mask, score_mod, softmax_scale, return_probs: bool):
    """The kernel on (B, H, S, D) tensors; lse and (when asked) the probabilities too."""
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(qt.shape[-1])
    gqa = kt.shape[1] != qt.shape[1]
    out, lse = flash_with_offset(qt, kt, vt, mask, None, scale, gqa, score_mod=score_mod)
    if not return_probs:
        return out, lse, None
    with torch.no_grad():
        if score_mod is None:
            probs = attention_probs_from_lse(qt, kt, lse, attn_mask=None if mask is None else mask.dense(), scale=scale,
                                             enable_gqa=gqa)
        else:
            probs = _modded_probs(qt, kt, lse, mask, scale, score_mod)
    return out, lse, probs


def check_offsets(offsets, total: int, longest, name: str) -> torch.Tensor:
    """cu_seqlens: int (batch + 1,), 0 first, ``total`` last, non-decreasing, no sequence above ``longest``."""
    label = f"cu_seqlens_{name}"
    if not isinstance(offsets, torch.Tensor) or offsets.dim() != 1 or offsets.is_floating_point() or len(offsets) < 2:
        raise ShapeError(f"{label} must be an int tensor (batch + 1,) of start offsets, got {offsets!r}"[:200])
    offsets = offsets.to(torch.int64).cpu()
    if int(offsets[0]) != 0 or int(offsets[-1]) != total:
        raise ShapeError(f"{label} must run from 0 to total_{name} = {total}, got {offsets[0].item()} to {offsets[-1].item()}")
    if bool((offsets.diff() < 0).any()):
        raise ShapeError(f"{label} must not decrease: {offsets.tolist()[:12]}")
    if isinstance(longest, bool) or not isinstance(longest, int) or longest < int(offsets.diff().max()):
        raise ShapeError(f"max_seqlen_{name} must be an int of at least the longest sequence, "
                         f"{int(offsets.diff().max())}, got {longest!r}")
    return offsets


def _sequence_of(starts: torch.Tensor, total: int) -> torch.Tensor:
    """(total,): the sequence each packed position belongs to."""
    return torch.bucketize(torch.arange(total), starts[1:], right=True)


def _varlen_modifier(softcap: float, slopes, seq_q, place_q, place_k):
    """softcap, then ALiBi with each sequence's own positions and slopes."""
    def modify(score, b, h, q_idx, kv_idx):
        if softcap:
            score = softcap * torch.tanh(score / softcap)
        if slopes is not None:
            rows = seq_q[q_idx] if slopes.shape[0] > 1 else torch.zeros_like(q_idx)  # (1, 1, r, 1)
            per = slopes[rows, h].to(score.dtype)  # (1, H, r, 1)
            score = score - per * (place_q[q_idx] - place_k[kv_idx]).abs()
        return score

    return modify


def check_options(dropout_p, softcap, window_size, causal: bool) -> tuple[int | None, int | None]:
    """flash-attn's options checked; the window's (left, right), None unbounded, right 0 when causal."""
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)) or not 0 <= dropout_p < 1:
        raise OptionError(f"dropout_p must be a number in [0, 1), got {dropout_p!r}")
    if dropout_p:
        raise OptionError("dropout inside selfattn's kernel is not written yet: use dropout_p=0")
    if isinstance(softcap, bool) or not isinstance(softcap, (int, float)) or softcap < 0:
        raise OptionError(f"softcap must be a number >= 0 (0: off), got {softcap!r}")
    left, right = check_window(window_size)
    return left, 0 if causal else right


def check_window(window_size) -> tuple[int | None, int | None]:
    """(left, right) with -1 as None (unbounded); anything else must be an int >= 0."""
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2:
        raise OptionError(f"window_size must be a (left, right) pair, got {window_size!r}")
    sides = []
    for value in window_size:
        if isinstance(value, bool) or not isinstance(value, int) or value < -1:
            raise OptionError(f"window sizes must be whole numbers >= -1 (-1: unbounded), got {window_size!r}")
        sides.append(None if value == -1 else value)
    return sides[0], sides[1]


def check_slopes(slopes, batch: int, heads: int) -> torch.Tensor:
    """ALiBi slopes as (B or 1, H): flash-attn takes (nheads,) or (batch, nheads)."""
    if not isinstance(slopes, torch.Tensor) or not slopes.is_floating_point():
        raise ShapeError(f"alibi_slopes must be a float tensor (nheads,) or (batch, nheads), got {type(slopes).__name__}")
    if tuple(slopes.shape) == (heads,):
        return slopes[None]
    if tuple(slopes.shape) == (batch, heads):
        return slopes
    raise ShapeError(f"alibi_slopes must be ({heads},) or ({batch}, {heads}), got {tuple(slopes.shape)}")


def _modifier(softcap: float, slopes: torch.Tensor | None, offset: int):
    """The score_mod of flash-attn's softcap, then ALiBi."""
    def modify(score, b, h, q_idx, kv_idx):
        if softcap:
            score = softcap * torch.tanh(score / softcap)
        if slopes is not None:
            per = slopes[b if slopes.shape[0] > 1 else torch.zeros_like(b), h].to(score.dtype)  # (B or 1, H, 1, 1)
            score = score - per * (q_idx + offset - kv_idx).abs()
        return score

    return modify


def _modded_probs(q, k, lse, mask, scale, score_mod) -> torch.Tensor:
    """P = exp(score_mod(scale Q K^T) - lse), 0 where hidden: the whole matrix, for return_attn_probs."""
    if k.shape[1] != q.shape[1]:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    scores = score_mod(q @ k.transpose(-2, -1) * scale, (0, q.shape[-2]), (0, k.shape[-2]))  # (B, H, Sq, Sk)
    if mask is not None:
        scores = scores.masked_fill(~mask.dense(), float("-inf"))
    lse_safe = torch.where(torch.isneginf(lse), torch.full_like(lse, float("inf")), lse)
    return torch.exp(scores - lse_safe[..., None])
