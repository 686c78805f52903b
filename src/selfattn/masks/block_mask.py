"""FlexAttention's masks: a ``mask_mod`` function and the block map it gives, never an N x N tensor.

    mask_mod(b, h, q_idx, kv_idx) -> bool          True = query q_idx may see key kv_idx

A mask_mod is written with torch ops and called on broadcast index tensors: b (B, 1, 1, 1),
h (1, H, 1, 1), q_idx (1, 1, r, 1), kv_idx (1, 1, 1, c), for a tile of r rows and c keys
at a time. ``create_block_mask`` sweeps it block by block and records each block as
EMPTY (no pair visible: never computed), FULL (every pair visible: no mask applied) or
PARTIAL (the mask_mod is evaluated on that tile). The result, a ``BlockMask``, is one of
our structured masks, so ``flash_attention`` and ``flex_attention`` both take it and
skip its empty blocks.

    causal = lambda b, h, q, kv: q >= kv
    window = lambda b, h, q, kv: (q - kv).abs() <= 255
    mask = create_block_mask(and_masks(causal, window), None, None, 4096, 4096)
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from selfattn.errors import OptionError, ShapeError
from selfattn.masks.dense_states import BASE_ROWS, block_reduce, coarsen_states
from selfattn.masks.states import EMPTY, FULL, PARTIAL, states_from
from selfattn.masks.structured import StructuredMask

MaskMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
CHUNK = 1 << 18  # (batch x heads x rows x keys) pairs evaluated per call while sweeping the blocks (at N = 2048 1/16 of N x N)


class BlockMask(StructuredMask):
    """A mask_mod with its block map: EMPTY / FULL / PARTIAL per (row block, key block).

    Made by ``create_block_mask``. Its dense form is (B or 1, H or 1, Q_LEN, KV_LEN),
    with a broadcast axis (None when created) left out of ``lead``.

    Attributes:
        mask_mod: the function, (b, h, q_idx, kv_idx) -> bool.
        batch: B, or None for every batch element alike.
        heads: H, or None for every head alike.
        q_len: Q_LEN, the query rows.
        kv_len: KV_LEN, the keys.
        block_size: (rows, keys) of a block of the map.
        states: int8 (ceil(Q_LEN / rows), ceil(KV_LEN / keys)), the map, over all b and h.
    """

    def __init__(self, mask_mod: MaskMod, batch: int | None, heads: int | None, q_len: int, kv_len: int,
                 block_size: tuple[int, int]) -> None:
        self.mask_mod = mask_mod
        self.batch, self.heads = batch, heads
        self.q_len, self.kv_len = q_len, kv_len
        self.block_size = block_size
        self.lead = () if batch is None and heads is None else (batch or 1, heads or 1)
        self._states: dict[tuple[int, int], torch.Tensor] = {}
        self.states = self.block_states(*block_size)

    def allowed(self, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """mask_mod at query positions ``rows`` (r,) and key positions ``cols`` (c,).   -> bool (*lead, r, c)

        Args:
            rows: query indices, int64 (r,).
            cols: key indices, int64 (c,).

        Returns:
            The mask, True = may attend.

        Raises:
            ShapeError: the mask_mod returned something other than a bool tensor that
                broadcasts to (B, H, r, c).
        """
        b, h = mask_indices(self.batch, self.heads, rows.device)
        result = self.mask_mod(b, h, rows.view(1, 1, -1, 1), cols.view(1, 1, 1, -1))
        shape = (b.shape[0], h.shape[1], rows.shape[0], cols.shape[0])
        checked = check_mod_result(result, shape, "mask_mod", torch.bool)
        full = checked.expand(shape)
        return (full[0, 0] if not self.lead else full).contiguous()  # its own memory: callers may change it in place

    def block_states(self, block_q: int, block_k: int, q_len: int | None = None) -> torch.Tensor:
        """EMPTY / FULL / PARTIAL per block of block_q rows x block_k keys, over every b and h.

        Multiples of the mask's own block size are read off its map; other sizes sweep
        the mask_mod again, a chunk of rows at a time.

        Args:
            block_q: query rows per block.
            block_k: keys per block.
            q_len: ignored (the mask has its own Q_LEN).

        Returns:
            int8 (ceil(Q_LEN / block_q), ceil(KV_LEN / block_k)).
        """
        key = (block_q, block_k)
        if key not in self._states:
            base_q, base_k = self._base
            if key != self._base and block_q % base_q == 0 and block_k % base_k == 0:
                self._states[key] = coarsen_states(self.block_states(base_q, base_k), block_q // base_q, block_k // base_k)
            else:
                self._states[key] = self._sweep(block_q, block_k)
        return self._states[key]

    @property
    def _base(self) -> tuple[int, int]:
        """The finest map swept: BASE_ROWS rows (a divisor of every row block the kernel chooses) where the block size allows, its keys."""
        rows, keys = self.block_size
        return (BASE_ROWS if rows % BASE_ROWS == 0 else rows), keys

    def _sweep(self, block_q: int, block_k: int) -> torch.Tensor:
        n_r, n_c = -(-self.q_len // block_q), -(-self.kv_len // block_k)
        empty = torch.ones(n_r, n_c, dtype=torch.bool)
        full = torch.ones(n_r, n_c, dtype=torch.bool)
        per_row = max(1, math.prod(self.lead or (1,)) * self.kv_len)
        step = max(block_q, (CHUNK // per_row) // block_q * block_q)  # whole row blocks per call
        cols = torch.arange(self.kv_len)
        for r0 in range(0, self.q_len, step):
            rows = torch.arange(r0, min(r0 + step, self.q_len))
            tile = self.allowed(rows, cols)  # (*lead, r, kv_len)
            visible = tile.reshape(-1, *tile.shape[-2:]).any(dim=0)  # over b and h: (r, kv_len)
            complete = tile.reshape(-1, *tile.shape[-2:]).all(dim=0)
            blocks = slice(r0 // block_q, -(-(r0 + len(rows)) // block_q))  # r0 is a multiple of block_q
            empty[blocks] = ~block_reduce(visible, block_q, block_k, len(rows), any_=True)
            full[blocks] = block_reduce(complete, block_q, block_k, len(rows), any_=False)
        return states_from(empty, full)

    def to_dense(self) -> torch.Tensor:
        """The whole mask, (B or 1, H or 1, Q_LEN, KV_LEN) bool, as torch's ``BlockMask.to_dense`` (for tests).

        Returns:
            The bool tensor, True = may attend.
        """
        dense = self.dense()
        return dense if self.lead else dense[None, None]

    def __repr__(self) -> str:
        counts = {name: int((self.states == state).sum()) for name, state in (("empty", EMPTY), ("full", FULL), ("partial", PARTIAL))}
        return (f"BlockMask(B={self.batch}, H={self.heads}, Q_LEN={self.q_len}, KV_LEN={self.kv_len}, "
                f"BLOCK_SIZE={self.block_size}, blocks={counts})")


def create_block_mask(
    mask_mod: MaskMod, B: int | None, H: int | None, Q_LEN: int, KV_LEN: int, BLOCK_SIZE: int | tuple[int, int] = 128,
    device=None,
) -> BlockMask:
    """The block map of a mask_mod, swept chunk by chunk (no Q_LEN x KV_LEN tensor).   -> BlockMask

    torch's ``create_block_mask`` semantics on the CPU: B or H None means the mask is the
    same for every batch element or head (the mask_mod then sees b = 0 or h = 0).

    Args:
        mask_mod: (b, h, q_idx, kv_idx) -> bool, on broadcast index tensors (see the
            module docstring); True = may attend.
        B: the batch size, or None to broadcast.
        H: the number of heads, or None to broadcast.
        Q_LEN: query rows, a positive int.
        KV_LEN: keys, a positive int.
        BLOCK_SIZE: rows and keys per block, an int or a (rows, keys) pair (default 128).
        device: accepted for torch's signature; the map lives on the CPU.

    Returns:
        A ``BlockMask``, for ``flex_attention(..., block_mask=...)`` or ``flash_attention``'s attn_mask.

    Raises:
        OptionError: a size is not a positive int (B, H may be None), or mask_mod is not callable.
        ShapeError: the mask_mod does not return a bool tensor broadcasting to its tile.

    Examples:
        >>> from selfattn.masks.block_mask import create_block_mask
        >>> mask = create_block_mask(lambda b, h, q, kv: q >= kv, None, None, 6, 6, BLOCK_SIZE=2)
        >>> mask.states.tolist()  # 0 EMPTY, 1 FULL, 2 PARTIAL
        [[2, 0, 0], [1, 2, 0], [1, 1, 2]]
        >>> mask.to_dense().shape
        torch.Size([1, 1, 6, 6])
    """
    if not callable(mask_mod):
        raise OptionError(f"mask_mod must be a function (b, h, q_idx, kv_idx) -> bool, got {type(mask_mod).__name__}")
    for name, value, optional in (("B", B, True), ("H", H, True), ("Q_LEN", Q_LEN, False), ("KV_LEN", KV_LEN, False)):
        if value is None and optional:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise OptionError(f"{name} must be a positive integer{' or None' if optional else ''}, got {value!r}")
    sizes = (BLOCK_SIZE, BLOCK_SIZE) if isinstance(BLOCK_SIZE, int) else tuple(BLOCK_SIZE)
    if len(sizes) != 2 or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes):
        raise OptionError(f"BLOCK_SIZE must be a positive int or a (rows, keys) pair of them, got {BLOCK_SIZE!r}")
    return BlockMask(mask_mod, B, H, Q_LEN, KV_LEN, sizes)


def and_masks(*mask_mods: MaskMod) -> MaskMod:
    """The mask_mod that allows a pair when every one of ``mask_mods`` does (all of none: every pair).

    Args:
        mask_mods: mask_mod functions.

    Returns:
        Their conjunction, a mask_mod.
    """
    def both(b, h, q_idx, kv_idx):
        result = torch.ones((), dtype=torch.bool)
        for mod in mask_mods:
            result = result & mod(b, h, q_idx, kv_idx)
        return result

    return both


def or_masks(*mask_mods: MaskMod) -> MaskMod:
    """The mask_mod that allows a pair when any of ``mask_mods`` does (any of none: no pair).

    Args:
        mask_mods: mask_mod functions.

    Returns:
        Their disjunction, a mask_mod.
    """
    def either(b, h, q_idx, kv_idx):
        result = torch.zeros((), dtype=torch.bool)
        for mod in mask_mods:
            result = result | mod(b, h, q_idx, kv_idx)
        return result

    return either


def as_block_mask(mask, batch: int | None = None, heads: int | None = None) -> BlockMask:
    """A ``BlockMask`` from ours (structured masks), or from torch's FlexAttention BlockMask.

    Args:
        mask: a ``BlockMask`` (returned as it is), a structured mask of ``selfattn.masks``,
            or a ``torch.nn.attention.flex_attention.BlockMask`` (its mask_mod and sizes are
            read, and its map is swept again here).
        batch: for a structured mask, B (None: its own lead or broadcast).
        heads: for a structured mask, H.

    Returns:
        The ``BlockMask``.

    Raises:
        OptionError: ``mask`` is none of these.
    """
    if isinstance(mask, BlockMask):
        return mask
    if isinstance(mask, StructuredMask):
        if mask.q_len is None:
            raise OptionError("this mask is the same for every query row (no q_len): give it to flash_attention instead")
        lead = mask.lead

        def from_rule(b, h, q_idx, kv_idx):
            allowed = mask.allowed(q_idx.reshape(-1), kv_idx.reshape(-1))  # (*lead, r, c)
            return allowed if lead else allowed[None, None]

        return BlockMask(from_rule, lead[0] if lead else batch, lead[1] if len(lead) > 1 else heads,
                         mask.q_len, mask.kv_len, (128, 128))
    torch_mask = _torch_block_mask(mask)
    if torch_mask is not None:
        b, h, q_len, kv_len = torch_mask.shape
        rows, keys = torch_mask.BLOCK_SIZE if isinstance(torch_mask.BLOCK_SIZE, tuple) else (torch_mask.BLOCK_SIZE,) * 2
        return create_block_mask(torch_mask.mask_mod, b, h, q_len, kv_len, (rows, keys))
    raise OptionError(f"block_mask must be a BlockMask (create_block_mask) or one of our structured masks, got {type(mask).__name__}")


def mask_indices(batch: int | None, heads: int | None, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The b and h index tensors a mask_mod or score_mod sees: (B or 1, 1, 1, 1) and (1, H or 1, 1, 1)."""
    b = torch.arange(batch or 1, device=device).view(-1, 1, 1, 1)
    h = torch.arange(heads or 1, device=device).view(1, -1, 1, 1)
    return b, h


def check_mod_result(result, shape: tuple[int, ...], name: str, dtype: torch.dtype | None) -> torch.Tensor:
    """A mod's result must be a tensor broadcasting to ``shape`` (and of ``dtype`` / floating for a score)."""
    if not isinstance(result, torch.Tensor):
        raise ShapeError(f"{name} must return a tensor, got {type(result).__name__}")
    if dtype is not None and result.dtype != dtype:
        raise ShapeError(f"{name} must return a {dtype} tensor, got {result.dtype}")
    if dtype is None and not result.is_floating_point():
        raise ShapeError(f"{name} must return floating-point scores, got {result.dtype}")
    try:
        if torch.broadcast_shapes(result.shape, shape) != torch.Size(shape):
            raise RuntimeError
    except RuntimeError:
        raise ShapeError(f"{name} returned shape {tuple(result.shape)}, which does not broadcast to its tile {shape}") from None
    return result


def _torch_block_mask(mask):
    """torch's FlexAttention BlockMask, if ``mask`` is one (imported only when torch has it)."""
    try:
        from torch.nn.attention.flex_attention import BlockMask as TorchBlockMask
    except ImportError:
        return None
    return mask if isinstance(mask, TorchBlockMask) else None
