"""Attention weights after a fused pass: the exact rows and heads a user wants, from the lse.

A fused kernel never stores the q_len x kv_len weights, but the log-sum-exp it returns
(one number per row) is enough to rebuild any row exactly:

    P_ij = exp(scale q_i . k_j + mask_ij - lse_i)

since lse_i = log sum_j exp(scale q_i . k_j + mask_ij) is the softmax's denominator.
"""

from __future__ import annotations

import math

import torch

from selfattn.checks import check_attention_inputs, expand_kv_heads
from selfattn.errors import OptionError
from selfattn.kernels.flash import broadcast_leading, causal_form
from selfattn.kernels.online_softmax import NEG_INF
from selfattn.masks.structured import StructuredMask


def attention_probs_from_lse(
    query: torch.Tensor,
    key: torch.Tensor,
    lse: torch.Tensor,
    rows=None,
    heads=None,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """Exact attention weights for chosen query rows and heads, from a fused pass's lse.

    P_ij = exp(scale q_i . k_j + mask_ij - lse_i).   query (..., Hq, q_len, d), key (..., Hk, kv_len, d),
    lse (..., Hq, q_len) -> (..., len(heads), len(rows), kv_len)

    Only the chosen rows' scores are computed, so looking at a few rows of a 100k-token
    sequence costs a few 100k-long vectors, not the whole matrix. Give the same mask,
    is_causal, scale and enable_gqa as the forward call that made lse; the weights are
    exact only then.

    Args:
        query: (..., Hq, q_len, d) the queries of the forward call; (q_len, d) is enough.
        key: (..., Hk, kv_len, d) its keys; the leading axes broadcast against query's.
        lse: (..., Hq, q_len) the lse the forward call returned (``flash_attention(...,
            return_lse=True)``); its shape must be the query's without the last axis.
        rows: the query rows to rebuild: an int, a list of ints (negative ones count
            from the end; the output keeps their order), or None for every row. An int
            still gives a rows axis of length 1.
        heads: the query heads to rebuild, in the same forms; None for every head. Only
            for inputs with a heads axis.
        attn_mask: the forward call's mask: None, a bool tensor (True = may attend), a
            float tensor added to the scores, a structured mask from ``selfattn.masks``,
            or torch's ``causal_upper_left`` / ``causal_lower_right``.
        is_causal: the forward call's is_causal (top-left: row i sees keys j <= i).
        scale: the forward call's scale; None means 1 / sqrt(d).
        enable_gqa: the forward call's enable_gqa (Hq a multiple of Hk; query heads
            g G .. g G + G - 1 share key head g).

    Returns:
        P (..., len(heads), len(rows), kv_len) in the query's dtype; (len(rows), kv_len)
            for inputs (q_len, d) without a heads axis. Each row sums to 1 over
            the keys it sees, hidden keys get exactly 0, and a row that saw no key
            (lse = -inf) is all zeros.

    Raises:
        ShapeError: query and key do not fit together (dtypes, d, leading axes, GQA head
            counts), or the mask does not fit them.
        OptionError: lse has the wrong shape; rows or heads are not indices or out of
            range; heads is given for inputs without a heads axis; attn_mask and
            is_causal=True together.

    Examples:
        >>> import selfattn as sa
        >>> import torch
        >>> g = torch.Generator().manual_seed(0)
        >>> q, k, v = torch.randn(3, 1, 2, 6, 4, generator=g, dtype=torch.float64).unbind(0)  # (batch, heads, seq, d)
        >>> out, lse = sa.flash_attention(q, k, v, is_causal=True, return_lse=True)
        >>> probs = sa.attention_probs_from_lse(q, k, lse, rows=[0, 5], heads=1, is_causal=True)
        >>> tuple(probs.shape)
        (1, 1, 2, 6)
        >>> weights = sa.scaled_dot_product_attention_with_weights(q, k, v, is_causal=True).weights
        >>> torch.allclose(probs, weights[:, 1:2, [0, 5]])
        True
        >>> probs[0, 0, 0].tolist()  # row 0 sees only key 0
        [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    """
    causal_offset, attn_mask = causal_form(attn_mask, is_causal, query, key)
    structured = isinstance(attn_mask, StructuredMask)
    check_attention_inputs(query, key, key, None if structured else attn_mask, 0.0, False, enable_gqa)
    if structured:
        attn_mask.check_size(query.shape[-2], key.shape[-2])
    n_heads, q_len = query.shape[-3] if query.dim() >= 3 else 1, query.shape[-2]
    row_index = _indices("rows", rows, q_len, query.device)
    if query.dim() < 3:
        if heads is not None:
            raise OptionError("heads applies to inputs with a heads axis (..., heads, seq, d)")
        head_index = None
    else:
        head_index = _indices("heads", heads, n_heads, query.device)
    if enable_gqa:
        key, _ = expand_kv_heads(key, key, n_heads)
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])
    own_shape = query.shape[:-1]
    query, key = broadcast_leading(query, key, key, 1)[:2]
    if lse.shape not in (own_shape, query.shape[:-1]):  # flash_attention's lse has the broadcast shape
        also = f" or, broadcast against the key, {tuple(query.shape[:-1])}" if query.shape[:-1] != own_shape else ""
        raise OptionError(f"lse must have the shape of the query without its last axis, {tuple(own_shape)}{also}; got {tuple(lse.shape)}")
    lse = lse.expand(query.shape[:-1])
    if head_index is not None:
        query, key, lse = query[..., head_index, :, :], key[..., head_index, :, :], lse[..., head_index, :]
    scores = (query[..., row_index, :] * scale) @ key.transpose(-2, -1)  # (..., heads, rows, kv_len)
    if attn_mask is not None:
        mask = attn_mask.allowed(row_index, torch.arange(key.shape[-2], device=key.device)) if structured else attn_mask
        row_index_of_mask = slice(None) if structured else row_index
        if mask.dim() >= 3 and head_index is not None and mask.shape[-3] > 1:
            mask = mask[..., head_index, :, :]
        mask = mask[..., row_index_of_mask, :] if mask.dim() >= 2 and mask.shape[-2] > 1 else mask  # (kv_len,): every row
        scores = scores.masked_fill(~mask, NEG_INF) if mask.dtype == torch.bool else scores + mask.to(scores.dtype)
    if causal_offset is not None:
        visible = torch.arange(key.shape[-2], device=key.device)[None, :] <= row_index[:, None] + causal_offset
        scores = scores.masked_fill(~visible, NEG_INF)
    chosen_lse = lse[..., row_index, None]  # (..., heads, rows, 1)
    chosen_lse = torch.where(chosen_lse == NEG_INF, torch.full_like(chosen_lse, float("inf")), chosen_lse)
    return torch.exp(scores - chosen_lse)


def _indices(name: str, value, count: int, device) -> torch.Tensor:
    """None, an int, or a sequence of ints in [0, count) -> a 1-D long tensor (negative counts from the end)."""
    if value is None:
        return torch.arange(count, device=device)
    values = [value] if isinstance(value, int) and not isinstance(value, bool) else value
    try:
        index = torch.as_tensor(values, device=device)
    except (TypeError, ValueError, RuntimeError):
        raise OptionError(f"{name} must be an index or a list of indices, got {value!r}") from None
    if index.dim() != 1 or index.dtype in (torch.bool,) or index.is_floating_point() or index.is_complex():
        raise OptionError(f"{name} must be an index or a list of indices, got {value!r}")
    if len(index) and (int(index.min()) < -count or int(index.max()) >= count):
        raise OptionError(f"{name} must be from 0 to {count - 1} (or negative from the end), got {value!r}")
    return index % count if count else index
