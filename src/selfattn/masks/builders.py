"""Attention masks: named builders that return a bool mask, True = may attend.

Every builder returns a plain bool tensor that ``scaled_dot_product_attention`` takes as
``attn_mask`` and that a plot can draw. Positions: key j sits at position j; query i sits
at position i (aligned top-left, torch's ``is_causal``: every builder's default) or at
kv_len - q_len + i (``align="bottom_right"``: the queries are the newest tokens, as in
KV-cached decoding and flash-attention). With q_len == kv_len both alignments agree.
"""

from __future__ import annotations

import torch

from selfattn.errors import ShapeError
from selfattn.masks.rules import CausalMask, DocumentMask, PaddingMask, SlidingWindowMask, alignment_offset
from selfattn.masks.structured import AndMask, StructuredMask



def query_positions(q_len: int, kv_len: int, align: str = "top_left", device=None) -> torch.Tensor:
    """pos(i) = i + offset, offset 0 (top-left) or kv_len - q_len (bottom-right).   -> (q_len,)

    Args:
        q_len: number of query rows.
        kv_len: number of keys.
        align: "top_left" (default: query i sits at key i) or "bottom_right" (the queries
            are the last q_len positions of the keys).
        device: where the result lives; None is torch's default device.

    Returns:
        The key-axis position of each query row, int64 (q_len,).

    Raises:
        ShapeError: q_len or kv_len is not an integer >= 0.
        OptionError: align is not "top_left" or "bottom_right".
    """
    return torch.arange(q_len, device=device) + alignment_offset(q_len, kv_len, align)


def causal_mask(q_len: int, kv_len: int | None = None, *, align: str = "top_left", device=None, structured: bool = False):
    """M[i, j] = (j <= pos(i)): no query sees a later key.   -> (q_len, kv_len)

    With bottom-right alignment and q_len > kv_len the first q_len - kv_len rows see no
    key at all; attention gives them zeros. structured=True: the rule itself
    (``CausalMask``), which flash attention uses to skip blocks; else a bool tensor.

    Args:
        q_len: number of query rows.
        kv_len: number of keys; None means q_len.
        align: "top_left" (default, torch's is_causal: pos(i) = i) or "bottom_right"
            (pos(i) = kv_len - q_len + i: the queries are the newest tokens).
        device: where the bool tensor lives; None is torch's default device.
        structured: return a ``CausalMask`` instead of a tensor.

    Returns:
        A bool tensor (q_len, kv_len), True = may attend; or a ``CausalMask``.

    Raises:
        ShapeError: q_len or kv_len is not an integer >= 0.
        OptionError: align is not "top_left" or "bottom_right".

    Examples:
        >>> import selfattn as sa
        >>> import torch
        >>> sa.causal_mask(2, 3).int().tolist()
        [[1, 0, 0], [1, 1, 0]]
        >>> sa.causal_mask(2, 3, align="bottom_right").int().tolist()
        [[1, 1, 0], [1, 1, 1]]
    """
    mask = CausalMask(q_len, kv_len, align=align)
    return mask if structured else mask.dense(device)


def causal_top_left(q_len: int, kv_len: int | None = None, *, device=None) -> torch.Tensor:
    """torch's is_causal (and ``causal_upper_left``): M[i, j] = (j <= i).   -> (q_len, kv_len)

    Args:
        q_len: number of query rows.
        kv_len: number of keys; None means q_len.
        device: where the tensor lives; None is torch's default device.

    Returns:
        A bool tensor (q_len, kv_len), True = may attend.

    Raises:
        ShapeError: q_len or kv_len is not an integer >= 0.
    """
    return causal_mask(q_len, kv_len, align="top_left", device=device)


def causal_bottom_right(q_len: int, kv_len: int | None = None, *, device=None) -> torch.Tensor:
    """torch's ``causal_lower_right``: M[i, j] = (j <= kv_len - q_len + i).   -> (q_len, kv_len)

    Args:
        q_len: number of query rows; rows i < q_len - kv_len see no key.
        kv_len: number of keys; None means q_len.
        device: where the tensor lives; None is torch's default device.

    Returns:
        A bool tensor (q_len, kv_len), True = may attend.

    Raises:
        ShapeError: q_len or kv_len is not an integer >= 0.
    """
    return causal_mask(q_len, kv_len, align="bottom_right", device=device)


def sliding_window_mask(
    q_len: int,
    kv_len: int | None = None,
    *,
    left: int,
    right: int = 0,
    align: str = "top_left",
    device=None,
    structured: bool = False,
):
    """M[i, j] = (pos(i) - left <= j <= pos(i) + right).   -> (q_len, kv_len)

    left = w - 1, right = 0 is the causal sliding window of size w (Mistral, Longformer's
    local attention); right > 0 lets a query also see that many later keys.
    structured=True: the rule (``SlidingWindowMask``) instead of a bool tensor.

    Args:
        q_len: number of query rows.
        kv_len: number of keys; None means q_len.
        left: how many earlier keys each query sees, an integer >= 0 (None: no limit).
        right: how many later keys each query sees (default 0; None: no limit).
        align: "top_left" (default, as ``causal_mask`` and torch's is_causal: pos(i) = i)
            or "bottom_right" (pos(i) = kv_len - q_len + i: the queries are the newest
            tokens, as in KV-cached decoding and flash-attn). With q_len == kv_len both agree.
        device: where the bool tensor lives; None is torch's default device.
        structured: return a ``SlidingWindowMask`` instead of a tensor.

    Returns:
        A bool tensor (q_len, kv_len), True = may attend; or a ``SlidingWindowMask``.

    Raises:
        OptionError: left or right is not an integer >= 0 (or None), or align is unknown.
        ShapeError: q_len or kv_len is not an integer >= 0.

    Examples:
        >>> import selfattn as sa
        >>> import torch
        >>> sa.sliding_window_mask(4, left=1).int().tolist()  # a causal window of 2 keys
        [[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]]
        >>> sa.sliding_window_mask(3, 5, left=1).int().tolist()  # top-left: query i at key i
        [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 1, 1, 0, 0]]
        >>> sa.sliding_window_mask(3, 5, left=1, align="bottom_right").int().tolist()  # the 3 newest keys' windows
        [[0, 1, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 0, 1, 1]]
    """
    mask = SlidingWindowMask(q_len, kv_len, left=left, right=right, align=align)
    return mask if structured else mask.dense(device)


def padding_mask(key_lengths, kv_len: int | None = None, *, device=None, structured: bool = False):
    """M[b, 0, 0, j] = (j < length_b): padded keys are hidden.   (batch,) -> (batch, 1, 1, kv_len)

    The shape broadcasts over heads and query rows. Padded query rows still see the real
    keys; their outputs are usually ignored. structured=True: a ``PaddingMask``.

    Args:
        key_lengths: the number of real keys of each batch element, a 1-D sequence or
            tensor of integers >= 0, (batch,).
        kv_len: the padded length; None means the longest of key_lengths.
        device: where the lengths (and so the mask) live; None keeps a tensor's device,
            or torch's default device.
        structured: return a ``PaddingMask`` instead of a tensor.

    Returns:
        A bool tensor (batch, 1, 1, kv_len), True = a real key; or a ``PaddingMask``.

    Raises:
        ShapeError: key_lengths is not a 1-D list of integers >= 0, kv_len is not an
            integer >= 0, or a length exceeds kv_len.

    Examples:
        >>> import selfattn as sa
        >>> import torch
        >>> mask = sa.padding_mask([2, 3])
        >>> tuple(mask.shape), mask.int().tolist()
        ((2, 1, 1, 3), [[[[1, 1, 0]]], [[[1, 1, 1]]]])
        >>> tuple(sa.padding_mask([2, 3], 4).shape)
        (2, 1, 1, 4)
    """
    mask = PaddingMask(key_lengths, kv_len, device=device)
    return mask if structured else mask.dense(mask.lengths.device)


def document_mask(lengths, kv_lengths=None, *, device=None, structured: bool = False):
    """Packed sequences: M[i, j] = (document(i) == document(j)).   -> (q_len, kv_len), block diagonal

    Args:
        lengths: each document's length, in order; they tile the query axis.
        kv_lengths: each document's number of keys, in the same order; None means lengths.
        device: where the bool tensor lives; None is torch's default device.
        structured: return a ``DocumentMask`` instead of a tensor.

    Returns:
        A bool tensor (q_len, kv_len), q_len = sum(lengths), kv_len = sum(kv_lengths),
            True = same document; or a ``DocumentMask``.

    Raises:
        ShapeError: lengths or kv_lengths is not a non-empty 1-D list of integers >= 0, or
            the two list different numbers of documents.

    Examples:
        >>> import selfattn as sa
        >>> import torch
        >>> from selfattn.masks import document_mask
        >>> document_mask([2, 1]).int().tolist()
        [[1, 1, 0], [1, 1, 0], [0, 0, 1]]
    """
    mask = DocumentMask(lengths, kv_lengths)
    return mask if structured else mask.dense(device)


def user_mask(mask, q_len: int | None = None, kv_len: int | None = None) -> torch.Tensor:
    """Any mask given by the user, as bool (True = may attend), checked against the lengths.

    Accepts bool, or 0/1 integers (1 = may attend). The last two axes must be
    (q_len, kv_len) where those are given.

    Args:
        mask: a tensor, nested list or array of bool or 0/1 integers, (..., q_len, kv_len).
        q_len: the expected number of rows; None accepts any.
        kv_len: the expected number of columns; None accepts any.

    Returns:
        The mask as a bool tensor of the same shape (the input itself if it already was one).

    Raises:
        ShapeError: the mask is not bool or 0/1 integers, has fewer than 2 axes, or its last
            two axes are not (q_len, kv_len).

    Examples:
        >>> import selfattn as sa
        >>> import torch
        >>> sa.user_mask([[1, 0], [1, 1]]).tolist()
        [[True, False], [True, True]]
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
    """B[..] = 0 where M is True, -inf where False: a bool mask as a float mask.   same shape

    Args:
        mask: a bool mask (True = may attend); any other dtype is only converted to dtype.
        dtype: the float dtype of the result (default float32).

    Returns:
        The additive mask, the shape of mask, to add to the scores.

    Examples:
        >>> import selfattn as sa
        >>> import torch
        >>> from selfattn.masks import to_additive
        >>> to_additive(torch.tensor([True, False])).tolist()
        [0.0, -inf]
    """
    if mask.dtype != torch.bool:
        return mask.to(dtype)
    zeros = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return zeros.masked_fill(~mask, float("-inf"))


def check_mask_kind(mask, what: str = "attn_mask") -> None:
    """``mask`` must be a structured mask, or a bool (True = may attend) or float tensor.

    Args:
        mask: the mask to check.
        what: how the message names it.

    Raises:
        ShapeError: it is anything else, an integer tensor included.
    """
    if isinstance(mask, StructuredMask):
        return
    if not isinstance(mask, torch.Tensor):
        raise ShapeError(f"{what} must be a tensor or a mask from selfattn.masks, got {type(mask).__name__}")
    if mask.dtype != torch.bool and not mask.is_floating_point():
        # Added as a bias, a 0/1 mask would hide nothing: refuse it rather than guess.
        raise ShapeError(
            f"{what} must be bool (True = may attend) or float (added to the scores), got "
            f"{str(mask.dtype).removeprefix('torch.')}: for a 0/1 mask pass mask.bool()"
        )


def combine_masks(*masks: torch.Tensor | None, dtype: torch.dtype = torch.float32) -> torch.Tensor | None:
    """One mask that allows only what every mask allows; float masks (biases) add up.

    All bool: their logical and (stays bool); with a structured mask among them, an
    ``AndMask`` (still structured). Any float: each bool becomes 0 / -inf and
    everything is summed in ``dtype``. None entries are skipped; no masks gives None.

    Args:
        *masks: bool masks (True = may attend), float masks (added to the scores),
            structured masks or None, broadcastable to one shape.
        dtype: the float dtype of the sum when any mask is float (default float32).

    Returns:
        A bool tensor, a float tensor, a structured mask, or None, broadcast to the common
            shape (a single mask comes back as it is).

    Raises:
        ShapeError: a mask is neither a bool or float tensor nor a structured mask (an
            integer 0/1 mask would be summed as a bias, hiding nothing); a float mask is
            combined with a structured one, or structured masks of different sizes are
            combined.

    Examples:
        >>> import selfattn as sa
        >>> import torch
        >>> sa.combine_masks(sa.causal_mask(3), sa.padding_mask([2], 3)).int().tolist()
        [[[[1, 0, 0], [1, 1, 0], [1, 1, 0]]]]
        >>> sa.combine_masks(sa.causal_mask(2), torch.tensor([[0.5, 0.0], [0.0, 0.0]])).tolist()
        [[0.5, -inf], [0.0, 0.0]]
    """
    present = [mask for mask in masks if mask is not None]
    for mask in present:
        check_mask_kind(mask, "each mask")
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
