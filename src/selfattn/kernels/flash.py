"""Flash attention: exact attention that never holds the q_len x kv_len score matrix.

    O = softmax(scale Q K^T + mask) V, computed tile by tile:
    for each block of query rows:   for each block of keys it can see:
        S = scale Q_i K_j^T (+ mask tile)      (..., bq, bk): the only score tile alive
        fold S, V_j into the online softmax (m, l, acc)      kernels/online_softmax.py
    O_i = acc / l,   lse_i = m + log l

Memory: one bq x bk tile per step, plus O and lse: linear in the length. A causal mask
is not applied as a dense mask: key blocks entirely in a row block's future are never
visited, and only tiles that cross the diagonal get a mask. The backward pass
(FlashAttention-2, Dao 2023) saves only Q, K, V, O and lse, and recomputes each tile's
probabilities from lse: P = exp(S - lse), never storing them:

    D_i = rowsum(dO_i * O_i)
    dV_j += P^T dO_i      dP = dO_i V_j^T      dS = P * (dP - D_i)
    dQ_i += scale dS K_j   dK_j += scale dS^T Q_i

Same semantics as ``selfattn.scaled_dot_product_attention``: bool masks (True = may
attend) and float masks (added), torch's ``causal_upper_left`` / ``causal_lower_right``
objects (both skip blocks), q_len != kv_len, GQA, broadcast leading axes; a row with no
visible key gives zeros and lse = -inf, with zero gradients.
"""

from __future__ import annotations

import math

import torch
from torch.autograd.function import once_differentiable

from selfattn.checks import (
    broadcast_shape,
    check_attention_inputs,
    expand_kv_heads,
    is_causal_bias,
)
from selfattn.errors import OptionError, ShapeError
from selfattn.kernels.backend import choose_backend
from selfattn.kernels.flash_backward import flash_backward
from selfattn.kernels.flash_tiles import FloatMask, flash_forward
from selfattn.kernels.tile_dropout import check_dropout, tile_dropout
from selfattn.kernels.tile_sizes import check_block_size
from selfattn.masks.rules import causal_rule
from selfattn.masks.states import EMPTY, block_bounds
from selfattn.masks.structured import StructuredMask, as_structured

# Default tile sizes, measured on this project's 2-core CPU (bench/attention.py at N = 4096,
# 8 heads, d = 64; tiles 128x256 to 1024x1024 tried): each step runs ~5-10 torch calls on
# a (heads, bq, bk) tile, so a tile must be large enough that their fixed cost (~5-10 us
# each) vanishes next to the arithmetic, yet small enough that a causal mask still skips
# most of the upper triangle. 512 x 512 was fastest without a mask (1.06-1.14x SDPA
# forward, against 1.36-1.41x for 256 x 512) and level with the others when causal.
DEFAULT_BLOCK_Q = 512
DEFAULT_BLOCK_K = 512
# The backward's row blocks. Its dK and dV sum over a tile's rows; in one float32 product over
# 256 rows that rounding reached 2.5x the error of torch's own kernel (which sums 32-64 rows at
# a time), so those two products take 64 rows at a time (flash_backward.SUM_ROWS) while the tile's
# other products take 128: 8-15% faster than 64-row tiles at N = 4096 (plain 568 -> 523 ms
# forward + backward; backward alone causal 268 -> 245, a window 106 -> 92, documents 64 -> 55).
BACKWARD_BLOCK_Q = 128


def flash_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    block_q: int | None = None,
    block_k: int | None = None,
    return_lse: bool = False,
    dropout_p: float = 0.0,
    generator: torch.Generator | None = None,
    backend: str = "auto",
):
    """O = softmax(scale Q K^T + mask) V, tile by tile.   (..., Hq, q_len, d), (..., Hk, kv_len, d), (..., Hk, kv_len, d_v)

    The result of ``selfattn.scaled_dot_product_attention``, computed over tiles of
    block_q query rows x block_k keys with the online softmax, so the q_len x kv_len
    score matrix never exists. Tiles that the mask hides entirely are not computed.
    Differentiable in query, key, value and a float mask; the backward recomputes each
    tile's weights from the lse instead of storing them, and its dropout pattern from a seed.

    Args:
        query: (..., Hq, q_len, d) queries, floating point; (q_len, d) alone is enough.
            The leading axes broadcast against those of key and value.
        key: (..., Hk, kv_len, d) keys, the dtype of query. Hk equals Hq or broadcasts
            to it, unless enable_gqa.
        value: (..., Hk, kv_len, d_v) values; its leading axes and kv_len are key's.
        attn_mask: None (every key visible), or one of: a bool tensor broadcastable to
            (..., Hq, q_len, kv_len), True = may attend; a float tensor (float32 or the
            query's dtype) of that shape, added to the scores (-inf hides a key; it may
            require grad); a structured mask from ``selfattn.masks`` (``CausalMask``,
            ``SlidingWindowMask``, ``PaddingMask``, ``DocumentMask``, ``DenseMask`` and
            their ``&`` / ``|``, e.g. ``sliding_window_mask(..., structured=True)``), whose
            batch/head axes may repeat over the inputs' but not add to them; or torch's
            ``causal_upper_left`` / ``causal_lower_right`` from
            ``torch.nn.attention.bias``. Whatever the mask, tiles it hides completely are
            skipped; structured and torch causal masks are never made dense.
        is_causal: query i sees keys j <= i, aligned top-left as torch's ``is_causal``
            (also when q_len != kv_len: row i sees keys 0 .. i). For bottom-right
            alignment (the queries are the last q_len positions) pass
            ``causal_lower_right(q_len, kv_len)`` or
            ``causal_mask(q_len, kv_len, align="bottom_right", structured=True)`` as
            attn_mask instead. Cannot be combined with attn_mask.
        scale: factor applied to Q K^T; None means 1 / sqrt(d).
        enable_gqa: grouped-query attention: key and value have Hk heads, Hq a multiple
            of Hk, and query heads g G .. g G + G - 1 (G = Hq / Hk) share key/value
            head g. K and V are not repeated, unless the mask differs between heads.
        block_q: query rows per tile, a positive int. None: without a mask, the tile fitted
            to this CPU (measured once per shape class from 2048 queries and keys on,
            ``selfattn.kernels.tile_choice`` says which and why; 512 below); with a mask the
            cheapest of 512, 256 and 128 by an estimate (visible area plus a fixed cost per
            tile). The backward fits its own tiles the same way (``tile_choice(backward=True)``);
            with a mask or a given block_q it takes at most 128 of these rows per tile.
        block_k: keys per tile, a positive int; None chooses it as for block_q.
        return_lse: also return the log-sum-exp of every row.
        dropout_p: chance of dropping each attention weight, in [0, 1); kept weights are
            divided by 1 - dropout_p (applied whenever > 0: no train/eval switch here). The
            pattern is drawn per tile from a seed taken from ``generator`` and regenerated
            by the backward, never stored; it depends on the seed, not on the block sizes
            (``kernels.tile_dropout``).
        generator: the ``torch.Generator`` the dropout seed is drawn from; None: torch's
            default one, so ``torch.manual_seed`` reproduces a call. Unused without dropout.
        backend: "auto" (default), "torch" or "triton". auto runs the Triton kernel
            (``kernels.triton_kernels``, the same tiles and steps) on CUDA tensors when
            triton is installed (``pip install 'selfattn[gpu]'``) and the call is one it
            takes (no dropout; tiles, if given, powers of two from 16); the torch kernel
            otherwise. "triton" on CPU tensors runs Triton's interpreter, and only with
            TRITON_INTERPRET=1 set before triton is imported. ``selfattn.kernels.last_backend()``
            says which ran and why.

    Returns:
        O (..., Hq, q_len, d_v) in the query's dtype, the leading axes broadcast; with
            return_lse=True the pair (O, lse), lse (..., Hq, q_len) in the same dtype, where
            lse_i = log sum_j exp(s_ij) over the keys row i sees, s_ij = scale q_i . k_j
            (+ mask_ij), natural log. It is the log of the softmax's denominator, so
            P_ij = exp(s_ij - lse_i) (``attention_probs_from_lse``), and results over
            disjoint sets of keys merge exactly; dropout does not change it. lse carries
            no gradient. A row that sees
            no key gives zeros in O, lse = -inf, and zero gradients.

    Raises:
        ShapeError: the inputs do not fit: not floating-point tensors of at least 2
            dimensions, different dtypes, d or kv_len differ, leading axes that do not
            broadcast, Hq not a multiple of Hk with enable_gqa; or the mask has another
            dtype, does not broadcast, or (structured or torch causal) is for another
            q_len x kv_len.
        OptionError: attn_mask and is_causal=True together; block_q or block_k not a
            positive int; dropout_p outside [0, 1); generator not a torch.Generator;
            backend not one of the three, or "triton" for a call it cannot run (the
            message says why).

    Examples:
        >>> import selfattn as sa
        >>> import torch
        >>> g = torch.Generator().manual_seed(0)
        >>> q, k, v = torch.randn(3, 2, 4, 7, 8, generator=g, dtype=torch.float64).unbind(0)  # (batch, heads, seq, d)
        >>> out, lse = sa.flash_attention(q, k, v, is_causal=True, block_q=3, block_k=2, return_lse=True)
        >>> tuple(out.shape), tuple(lse.shape)
        ((2, 4, 7, 8), (2, 4, 7))
        >>> torch.allclose(out, sa.scaled_dot_product_attention(q, k, v, is_causal=True))
        True
        >>> window = sa.sliding_window_mask(7, left=2, structured=True)  # a rule, never a 7 x 7 tensor
        >>> reference = sa.scaled_dot_product_attention(q, k, v, attn_mask=window.dense())
        >>> torch.allclose(sa.flash_attention(q, k, v, attn_mask=window, block_q=2, block_k=2), reference)
        True
        >>> hidden = torch.ones(7, 7, dtype=torch.bool)
        >>> hidden[3] = False  # query 3 may see no key
        >>> out, lse = sa.flash_attention(q, k, v, attn_mask=hidden, return_lse=True)
        >>> bool((out[..., 3, :] == 0).all()), lse[0, 0, 3].item()
        (True, -inf)
    """
    causal_offset, attn_mask = causal_form(attn_mask, is_causal, query, key)
    output, lse = flash_with_offset(query, key, value, attn_mask, causal_offset, scale, enable_gqa, block_q, block_k,
                                    dropout_p=dropout_p, generator=generator, backend=backend)
    return (output, lse) if return_lse else output


def flash_with_offset(query, key, value, attn_mask, causal_offset: int | None, scale=None, enable_gqa=False,
                      block_q=None, block_k=None, score_mod=None, dropout_p=0.0, generator=None, softcap=0.0,
                      backend="auto"):
    """``flash_attention`` with the causal rule given as a number: row i sees keys j <= i + offset
    (None: no causal rule). For callers that know their alignment, such as the modules.   -> (O, lse)

    score_mod: None, or a ``kernels.flex.TileScoreMod`` applied to every tile's scores
    (``flex_attention``); the tensors it captures receive gradients. dropout_p, generator:
    as in ``flash_attention``. softcap: c > 0 makes every score c tanh(score / c) before
    score_mod and the mask (``flash_attn_func``'s softcap), 0 leaves them. backend: as in
    ``flash_attention``; the Triton kernel takes a score_mod only when it is ALiBi (``.alibi``)."""
    if isinstance(attn_mask, StructuredMask):
        check_attention_inputs(query, key, value, None, 0.0, False, enable_gqa)
        attn_mask.check_size(query.shape[-2], key.shape[-2])
        kv_lead = (*key.shape[:-3], query.shape[-3]) if enable_gqa else tuple(key.shape[:-2])
        lead = broadcast_shape(tuple(query.shape[:-2]), kv_lead)
        if broadcast_shape(attn_mask.lead, lead) != lead:  # the mask may repeat over batch/heads, not add to them
            raise ShapeError(f"the mask's batch/head axes {attn_mask.lead} do not broadcast to the attention's {lead}")
    else:
        check_attention_inputs(query, key, value, attn_mask, 0.0, False, enable_gqa)
    block_q = check_block_size("block_q", block_q, None)
    block_k = check_block_size("block_k", block_k, None)
    check_dropout(dropout_p)
    if scale is None:
        scale = 1.0 / math.sqrt(query.shape[-1])
    group = query.shape[-3] // key.shape[-3] if enable_gqa else 1
    if group > 1 and _per_head(attn_mask):  # a different mask per query head cannot be shared by a group
        key, value = expand_kv_heads(key, value, query.shape[-3])
        group = 1
    query, key, value = broadcast_leading(query, key, value, group)
    mask = tile_mask(attn_mask, causal_offset, query.shape[-2], key.shape[-2])
    float_mask = attn_mask if isinstance(mask, FloatMask) else None
    if choose_backend(backend, query, dropout_p=dropout_p, score_mod=score_mod, block_q=block_q,
                      block_k=block_k) == "triton":
        from selfattn.kernels.triton_flash import triton_attention  # triton loads with the first Triton call

        return triton_attention(query, key, value, mask, float_mask, scale, group, softcap,
                                getattr(score_mod, "alibi", None), block_q, block_k)
    given = (block_q, block_k)  # the caller's: what the backward, with its own tiles, must keep
    if (block_q is None or block_k is None) and mask is None and query.device.type == "cpu":
        from selfattn.kernels.tile_fit import tile_choice  # tiles fitted to this CPU, measured once per shape

        chosen = tile_choice(query.shape[-2], key.shape[-2], math.prod(query.shape[:-2]), query.shape[-1], query.dtype,
                             group, block_q, block_k)
        block_q, block_k = chosen.block_q, chosen.block_k
    if block_q is None or block_k is None:
        chosen_q, chosen_k = choose_blocks(mask, query.shape[-2], key.shape[-2], math.prod(query.shape[:-2]))
        block_q, block_k = block_q or chosen_q, block_k or chosen_k
    captured = () if score_mod is None else score_mod.captured
    dropout = tile_dropout(dropout_p, generator, tuple(query.shape[:-2]), query.device)  # (..., Hq): the scores' lead
    settings = (mask, float(scale), block_q, block_k, group, given, dropout, float(softcap), score_mod)
    return _FlashAttention.apply(query, key, value, float_mask, settings, *captured)


# Tile sizes tried for a mask with empty blocks, and the fixed cost of one tile counted in
# (query, key, head) triples: measured here (window, documents, causal at N = 4096, 8 heads,
# 2 threads) a tile costs about 0.45 ms on top of about 2 ns per triple, so smaller tiles
# pay off only when they skip enough area. The larger tile wins ties.
TILE_CANDIDATES = (512, 256, 128)
TILE_OVERHEAD = 200_000
# The backward's tiles have fewer rows, so its fixed cost per tile weighs less against the area
# a smaller key block skips: measured at N = 4096 (backward only, 64-row tiles), 100_000 took a
# window of 255 each side from 113 to 92 ms and 8 causal documents from 78 to 64 ms, causal
# unchanged (~240); with 128-row tiles it still beats 200_000 (window 90 against 95 ms).
BACKWARD_TILE_OVERHEAD = 100_000


def choose_blocks(mask, q_len: int, kv_len: int, heads: int, rows: int | None = None) -> tuple[int, int]:
    """(block_q, block_k) with the least estimated cost: visible area x heads + overhead per tile.

    No mask: the measured defaults (512 x 512; also best for GQA, whose tiles stack the G
    heads of a group: 512 x G rows). rows: keep this many rows per tile and choose only
    block_k (the backward, which works on at most 128 rows).
    """
    if mask is None or not q_len or not kv_len:
        return rows or DEFAULT_BLOCK_Q, DEFAULT_BLOCK_K
    best = None
    for size in TILE_CANDIDATES:
        block_q = rows or size
        states = mask.block_states(block_q, size, q_len)
        r0, r1 = block_bounds(q_len, block_q)
        c0, c1 = block_bounds(kv_len, size)
        area = ((r1 - r0)[:, None] * (c1 - c0)[None, :])[states != EMPTY]
        cost = float(area.sum()) * heads + len(area) * (TILE_OVERHEAD if rows is None else BACKWARD_TILE_OVERHEAD)
        if best is None or cost < best[0]:
            best = (cost, block_q, size)
    return best[1], best[2]


def tile_mask(attn_mask, causal_offset: int | None, q_len: int, kv_len: int):
    """The kernel's form of the mask: None, a structured mask (bool tensors wrapped as
    ``DenseMask``, the causal offset as a ``CausalMask``, both joined with &), or a ``FloatMask``."""
    causal = causal_rule(q_len, kv_len, causal_offset) if causal_offset is not None else None
    if attn_mask is None:
        return causal
    if isinstance(attn_mask, torch.Tensor):  # broadcast axes of length 1 stay views: (..., q_len or 1, kv_len)
        attn_mask = attn_mask.expand(*attn_mask.shape[:-2], attn_mask.shape[-2] if attn_mask.dim() >= 2 else 1, kv_len)
        if attn_mask.dtype != torch.bool:
            if causal is not None:
                raise OptionError("a float mask and a causal rule together: add the causal mask into the float mask first")
            return FloatMask(attn_mask)
    mask = as_structured(attn_mask)
    return mask if causal is None else causal & mask


def causal_form(attn_mask, is_causal: bool, query: torch.Tensor, key: torch.Tensor):
    """(causal offset or None, remaining mask): row i sees keys j <= i + offset.

    Top-left (is_causal, causal_upper_left) has offset 0; bottom-right (causal_lower_right)
    kv_len - q_len. Kept as a number, the causal mask costs nothing and lets whole blocks go.
    """
    if is_causal_bias(attn_mask):
        from torch.nn.attention.bias import CausalVariant

        if is_causal:
            raise OptionError("give either attn_mask or is_causal=True, not both (combine the masks first)")
        sizes = (attn_mask.seq_len_q, attn_mask.seq_len_kv)
        if sizes != (query.shape[-2], key.shape[-2]):
            raise ShapeError(
                f"the causal mask is for q_len x kv_len = {sizes[0]} x {sizes[1]}, but the inputs are "
                f"{query.shape[-2]} x {key.shape[-2]}"
            )
        lower_right = attn_mask.variant == CausalVariant.LOWER_RIGHT
        return (attn_mask.seq_len_kv - attn_mask.seq_len_q if lower_right else 0), None
    if is_causal:
        if attn_mask is not None:
            raise OptionError("give either attn_mask or is_causal=True, not both (combine the masks first)")
        return 0, None
    return None, attn_mask


def _per_head(attn_mask) -> bool:
    """Whether a mask differs between heads (a heads axis longer than 1). Torch's causal objects
    never get here: ``causal_form`` has turned them into an offset."""
    if attn_mask is None:
        return False
    shape = attn_mask.shape
    return len(shape) >= 3 and shape[-3] > 1


def broadcast_leading(query, key, value, group: int):
    """Expand the leading axes of q, k, v to one shape (views; autograd sums them back); with
    GQA the heads axis stays Hq for the queries and Hk for the keys and values."""
    if group == 1:
        lead = torch.broadcast_shapes(query.shape[:-2], key.shape[:-2])
        q_lead = k_lead = lead
    else:
        batch = torch.broadcast_shapes(query.shape[:-3], key.shape[:-3])
        q_lead, k_lead = (*batch, query.shape[-3]), (*batch, key.shape[-3])
    return (
        query.expand(*q_lead, *query.shape[-2:]),
        key.expand(*k_lead, *key.shape[-2:]),
        value.expand(*k_lead, *value.shape[-2:]),
    )


def backward_tiles(mask, q, k, block_q: int, block_k: int, group: int, given: tuple) -> tuple[int, int]:
    """The backward's (rows, keys) per tile.

    Without a mask on the CPU they are fitted to the machine (``tile_choice(backward=True)``:
    128 or 256 rows); otherwise the rows are the forward's, at most BACKWARD_BLOCK_Q, and
    the keys come from the cost model. What the caller gave is kept (rows capped the same way).

    Args:
        mask: the kernel's mask (None, structured or ``FloatMask``).
        q: the queries (..., Hq, q_len, d).
        k: the keys (..., Hk, kv_len, d).
        block_q: the forward's rows per tile.
        block_k: the forward's keys per tile.
        group: query heads per key/value head.
        given: the caller's (block_q, block_k), None where not given.

    Returns:
        (rows, keys) per backward tile.
    """
    given_q, given_k = given
    rows = min(block_q, BACKWARD_BLOCK_Q)
    if given_q is not None and given_k is not None:
        return rows, block_k
    if mask is None and q.device.type == "cpu":
        from selfattn.kernels.tile_fit import tile_choice

        chosen = tile_choice(q.shape[-2], k.shape[-2], math.prod(q.shape[:-2]), q.shape[-1], q.dtype, group,
                             None if given_q is None else rows, given_k, backward=True)
        return chosen.block_q, chosen.block_k
    if given_k is None:
        block_k = choose_blocks(mask, q.shape[-2], k.shape[-2], math.prod(q.shape[:-2]), rows)[1]
    return rows, block_k


class _FlashAttention(torch.autograd.Function):
    """Saves Q, K, V, O and lse only; the backward recomputes every tile."""

    @staticmethod
    def forward(ctx, q, k, v, float_mask, settings, *captured):
        mask, scale, block_q, block_k, group, _, dropout, softcap, score_mod = settings
        # The backward makes every tile's scores again and must round them as the forward did, but a
        # product's rounding follows its operands' memory layout: from flash-attn's (B, S, H, D) views the
        # forward's products took another path than the backward's (on contiguous copies), and with
        # softcap 16 dV reached 7.8x PyTorch's float32 error. So both passes read one contiguous copy, with
        # or without gradients (the output does not depend on them); none is made for contiguous inputs,
        # and V's layout does not touch the scores.
        q, k = q.contiguous(), k.contiguous()
        # lse's remainder, for the backward only: none without one, and none in float64, whose
        # own lse loses nothing the backward would see
        low = q.dtype != torch.float64 and any(ctx.needs_input_grad)
        output, lse, *lse_low = flash_forward(q, k, v, mask, scale, block_q, block_k, group, score_mod=score_mod,
                                              dropout=dropout, softcap=softcap, lse_low=low)
        ctx.save_for_backward(q, k, v, output, lse, float_mask, *lse_low)
        ctx.settings = settings
        ctx.mark_non_differentiable(lse)
        return output, lse

    @staticmethod
    @once_differentiable  # the backward is not itself differentiable: say so instead of failing inside it
    def backward(ctx, grad_out, _grad_lse):
        q, k, v, output, lse, float_mask, *lse_low = ctx.saved_tensors
        mask, scale, block_q, block_k, group, given, dropout, softcap, score_mod = ctx.settings
        mask_grad = None
        if float_mask is not None and ctx.needs_input_grad[3]:
            mask_grad = torch.zeros(float_mask.shape, dtype=float_mask.dtype, device=float_mask.device)
        rows, block_k = backward_tiles(mask, q, k, block_q, block_k, group, given)
        if score_mod is not None:
            score_mod.start_backward(ctx.needs_input_grad[5:], q.dtype, q.device)
        dq, dk, dv = flash_backward(
            grad_out.contiguous(), q, k, v, output, lse, mask, scale, rows, block_k, group, mask_grad, score_mod=score_mod,
            dropout=dropout, softcap=softcap, lse_low=lse_low[0] if lse_low else None,
        )
        captured = () if score_mod is None else score_mod.captured_grads
        return (dq, dk, dv, mask_grad, None, *captured)
