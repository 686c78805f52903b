"""Attention masks: named builders that return a bool mask, True = may attend.

Every builder returns a plain bool tensor that ``scaled_dot_product_attention`` takes as
``attn_mask`` and that a plot can draw. Positions: key j sits at position j; query i sits
at position i (aligned top-left, torch's ``is_causal``) or at kv_len - q_len + i
(aligned bottom-right: the queries are the newest tokens, as in KV-cached decoding and
flash-attention). With q_len == kv_len both alignments agree.
"""

from __future__ import annotations

import torch

from selfattn.errors import ShapeError
from selfattn.masks.rules import CausalMask, DocumentMask, PaddingMask, SlidingWindowMask, alignment_offset
from selfattn.masks.structured import AndMask, StructuredMask



def query_positions(q_len: int, kv_len: int, align: str = "top_left", device=None) -> torch.Tensor:
    """The key-axis position of each query row.   -> (q_len,)"""
    return torch.arange(q_len, device=device) + alignment_offset(q_len, kv_len, align)


def causal_mask(q_len: int, kv_len: int | None = None, *, align: str = "top_left", device=None, structured: bool = False):
    """M[i, j] = (j <= pos(i)): no query sees a later key.   -> (q_len, kv_len)

    With bottom-right alignment and q_len > kv_len the first q_len - kv_len rows see no
    key at all; attention gives them zeros. structured=True: the rule itself
    (``CausalMask``), which flash attention uses to skip blocks; else a bool tensor.
    """
    mask = CausalMask(q_len, kv_len, align=align)
    return mask if structured else mask.dense(device)


def causal_top_left(q_len: int, kv_len: int | None = None, *, device=None) -> torch.Tensor:
    """torch's is_causal (and ``causal_upper_left``): M[i, j] = (j <= i).   -> (q_len, kv_len)"""
    return causal_mask(q_len, kv_len, align="top_left", device=device)


def causal_bottom_right(q_len: int, kv_len: int | None = None, *, device=None) -> torch.Tensor:
    """torch's ``causal_lower_right``: M[i, j] = (j <= kv_len - q_len + i).   -> (q_len, kv_len)"""
    return causal_mask(q_len, kv_len, align="bottom_right", device=device)


def sliding_window_mask(
    q_len: int,
    kv_len: int | None = None,
    *,
    left: int,
    right: int = 0,
    align: str = "bottom_right",
    device=None,
    structured: bool = False,
):
    """M[i, j] = (pos(i) - left <= j <= pos(i) + right).   -> (q_len, kv_len)

    left = w - 1, right = 0 is the causal sliding window of size w (Mistral, Longformer's
    local attention); right > 0 lets a query also see that many later keys.
    structured=True: the rule (``SlidingWindowMask``) instead of a bool tensor.
    """
    mask = SlidingWindowMask(q_len, kv_len, left=left, right=right, align=align)
    return mask if structured else mask.dense(device)


def padding_mask(key_lengths, kv_len: int | None = None, *, device=None, structured: bool = False):
    """M[b, 0, 0, j] = (j < length_b): padded keys are hidden.   (batch,) -> (batch, 1, 1, kv_len)

    The shape broadcasts over heads and query rows. Padded query rows still see the real
    keys; their outputs are usually ignored. structured=True: a ``PaddingMask``.
    """
    mask = PaddingMask(key_lengths, kv_len, device=device)
    return mask if structured else mask.dense(mask.lengths.device)


def document_mask(lengths, kv_lengths=None, *, device=None, structured: bool = False):
    """Packed sequences: M[i, j] = (document(i) == document(j)).   -> (q_len, kv_len), block diagonal

    lengths: each document's length, in order. structured=True: a ``DocumentMask``.
    """
    mask = DocumentMask(lengths, kv_lengths)
    return mask if structured else mask.dense(device)


def user_mask(mask, q_len: int | None = None, kv_len: int | None = None) -> torch.Tensor:
    """Any mask given by the user, as bool (True = may attend), checked against the lengths.

    Accepts bool, or 0/1 integers (1 = may attend). The last two axes must be
    (q_len, kv_len) where those are given.
    """
    try:
        tensor = torch.as_tensor(mask)
    except (TypeError, ValueError, RuntimeError):
        raise ShapeError(
            f"a user mask must be bool or 0/1 integers (1 = may attend), got {type(mask).__name__}"
        ) from None
    if tensor.dtype != torch.bool:
        if (
            tensor.is_floating_point()
            or tensor.is_complex()
            or not bool(((tensor == 0) | (tensor == 1)).all())
        ):
            raise ShapeError(
                f"a user mask must be bool or 0/1 integers (1 = may attend), "
                f"got {str(tensor.dtype).removeprefix('torch.')}"
            )
        tensor = tensor.bool()
    if tensor.dim() < 2:
        raise ShapeError(f"a mask needs at least 2 dimensions (q_len, kv_len), got shape {tuple(tensor.shape)}")
    expected = (q_len if q_len is not None else tensor.shape[-2], kv_len if kv_len is not None else tensor.shape[-1])
    if tuple(tensor.shape[-2:]) != expected:
        raise ShapeError(f"the mask's last two axes are {tuple(tensor.shape[-2:])}, expected (q_len, kv_len) = {expected}")
    return tensor


def to_additive(mask: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A bool mask as a float mask: 0 where allowed, -inf where hidden.   same shape"""
    if mask.dtype != torch.bool:
        return mask.to(dtype)
    zeros = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return zeros.masked_fill(~mask, float("-inf"))


def combine_masks(*masks: torch.Tensor | None, dtype: torch.dtype = torch.float32) -> torch.Tensor | None:
    """One mask that allows only what every mask allows; float masks (biases) add up.

    All bool: their logical and (stays bool); with a structured mask among them, an
    ``AndMask`` (still structured). Any float: each bool becomes 0 / -inf and
    everything is summed in ``dtype``. None entries are skipped; no masks gives None.
    """
    present = [mask for mask in masks if mask is not None]
    if not present:
        return None
    if any(isinstance(mask, StructuredMask) for mask in present):
        if not all(isinstance(mask, StructuredMask) or mask.dtype == torch.bool for mask in present):
            raise ShapeError("a float mask cannot join a structured mask: densify it with .dense() first")
        return present[0] if len(present) == 1 else AndMask(*present)
    if all(mask.dtype == torch.bool for mask in present):
        combined = present[0]
        for mask in present[1:]:
            combined = combined & mask  # broadcasts
        return combined
    total = to_additive(present[0], dtype)
    for mask in present[1:]:
        total = total + to_additive(mask, dtype)
    return total
