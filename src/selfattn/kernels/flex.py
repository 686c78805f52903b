"""FlexAttention on the CPU, forward and backward: a score_mod and a block mask on our flash tile loop.

    O = softmax(score_mod(scale Q K^T) with hidden pairs at -inf) V

``score_mod(score, b, h, q_idx, kv_idx)`` rewrites the scores of a tile: score is
(B, H, r, c), b (B, 1, 1, 1), h (1, H, 1, 1), q_idx (1, 1, r, 1), kv_idx (1, 1, 1, c), all
for the tile's own rows and keys, so a function written with torch ops on those
broadcasts (ALiBi: ``score + slope[h] * (kv_idx - q_idx)``; a relative bias table:
``score + table[q_idx - kv_idx + n]``) costs one tile at a time, never N x N. The block
mask (``masks.block_mask.create_block_mask``) decides which tiles are computed at all.

The forward and backward are flash attention's (``kernels.flash_tiles``): the backward
recomputes each tile's scores from lse and runs the score_mod again under autograd, so
dS reaches the raw scores (dQ, dK) and every tensor the score_mod captures (a learnable
bias table gets its gradient) without storing any tile. PyTorch 2.13 has no backward for
its own flex_attention on the CPU.
"""

from __future__ import annotations

import threading
import types

import torch

from selfattn.errors import OptionError, ShapeError
from selfattn.kernels.flash import flash_with_offset
from selfattn.kernels.score_mod_form import adds_a_bias
from selfattn.masks.block_mask import as_block_mask, check_mod_result, mask_indices
from selfattn.masks.structured import StructuredMask


def flex_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    score_mod=None,
    block_mask=None,
    scale: float | None = None,
    enable_gqa: bool = False,
    return_lse: bool = False,
):
    """O = softmax(score_mod(scale Q K^T) + mask) V.   (B, Hq, L, E), (B, Hk, S, E), (B, Hk, S, Ev) -> (B, Hq, L, Ev)

    torch's ``flex_attention`` semantics: the scale applies before score_mod; a pair the
    block mask hides gets no weight; a row that sees no key gives zeros and lse = -inf.
    Differentiable in query, key, value and in the tensors score_mod captures (closure
    variables, defaults, globals it names, the module of a bound method).

    Args:
        query: (B, Hq, L, E), floating point.
        key: (B, Hk, S, E), query's dtype; Hk = Hq, or divides it with enable_gqa.
        value: (B, Hk, S, Ev).
        score_mod: None, or (score, b, h, q_idx, kv_idx) -> new scores, on broadcast
            tensors (module docstring); it must work element by element (torch calls it on
            one score at a time) and return floating scores that broadcast to the tile.
        block_mask: None (every pair visible), a ``BlockMask`` from
            ``selfattn.create_block_mask``, one of our structured masks, or torch's
            FlexAttention ``BlockMask`` (its mask_mod is swept again here).
        scale: the factor on Q K^T; None means 1 / sqrt(E).
        enable_gqa: grouped-query attention (Hq a multiple of Hk).
        return_lse: also return lse (B, Hq, L), log sum_j exp(score_ij) over visible keys.

    Returns:
        O (B, Hq, L, Ev) in the query's dtype, or (O, lse) with return_lse.

    Raises:
        ShapeError: the inputs are not 4-D or do not fit; the block mask is for other
            sizes or batch/head counts; score_mod returns a wrong shape or dtype.
        OptionError: score_mod is not callable, or block_mask is not a mask.

    Examples:
        >>> import selfattn as sa
        >>> import torch
        >>> q, k, v = torch.randn(3, 1, 2, 8, 4, dtype=torch.float64).unbind(0)
        >>> slopes = torch.tensor([0.5, 0.25], dtype=torch.float64)
        >>> alibi = lambda score, b, h, q_idx, kv_idx: score + slopes[h] * (kv_idx - q_idx)
        >>> causal = sa.create_block_mask(lambda b, h, q_idx, kv_idx: q_idx >= kv_idx, None, None, 8, 8)
        >>> out = sa.flex_attention(q, k, v, score_mod=alibi, block_mask=causal)
        >>> i, j = torch.arange(8)[:, None], torch.arange(8)[None, :]
        >>> bias = (slopes[:, None, None] * (j - i)).masked_fill(j > i, float("-inf"))  # (heads, 8, 8)
        >>> torch.allclose(out, sa.scaled_dot_product_attention(q, k, v, attn_mask=bias))
        True
    """
    for name, tensor in (("query", query), ("key", key), ("value", value)):
        if not isinstance(tensor, torch.Tensor) or tensor.dim() != 4:
            shown = tuple(tensor.shape) if isinstance(tensor, torch.Tensor) else type(tensor).__name__
            raise ShapeError(f"flex_attention takes (batch, heads, seq, d) tensors; {name} is {shown}")
    batch, heads, q_len, kv_len = query.shape[0], query.shape[1], query.shape[2], key.shape[2]
    mask = None if block_mask is None else _checked_mask(block_mask, batch, heads, q_len, kv_len)
    tile_mod = None
    if score_mod is not None:
        if not callable(score_mod):
            raise OptionError(f"score_mod must be a function (score, b, h, q_idx, kv_idx), got {type(score_mod).__name__}")
        tile_mod = TileScoreMod(score_mod, batch, heads)
    output, lse = flash_with_offset(query, key, value, mask, None, scale, enable_gqa, score_mod=tile_mod)
    return (output, lse) if return_lse else output


class TileScoreMod:
    """A score_mod as the tile loops call it: on one tile's scores, with the tile's index tensors.

    Forward: ``mod(scores, rows, cols)`` -> new scores. Backward, per tile: ``record``
    recomputes the tile's scores, ``backward(ds)`` carries dS through the score_mod and adds
    into ``captured_grads``. A score_mod that adds a bias (``score_mod_form.adds_a_bias``,
    worked out once per call) passes dS on as it is, and runs autograd only for the captured
    tensors that want a gradient; any other is run again under autograd on every tile.
    """

    def __init__(self, fn, batch: int, heads: int) -> None:
        self.fn = fn
        self.batch, self.heads = batch, heads
        self.captured = captured_tensors(fn)
        self.adds_bias = False  # score + bias(b, h, q, kv)? worked out by ``start_backward`` (``score_mod_form``)
        self.captured_grads: list[torch.Tensor | None] = []
        self._wanted: tuple[bool, ...] = ()
        self._tile = threading.local()  # what ``record`` keeps for ``backward``: per thread, as the tiles run on several
        self._adding = threading.Lock()
        # (slopes, q positions, key positions, slope row per query or None) when the score_mod is
        # flash-attn's ALiBi, which the Triton kernel computes itself (``kernels.backend``)
        self.alibi = None

    def __call__(self, scores: torch.Tensor, rows: tuple[int, int], cols: tuple[int, int]) -> torch.Tensor:
        """The tile's new scores.   scores (B, Hq, r, c) -> (B, Hq, r, c)"""
        b, h = mask_indices(self.batch, self.heads, scores.device)
        q_idx = torch.arange(*rows, device=scores.device).view(1, 1, -1, 1)
        kv_idx = torch.arange(*cols, device=scores.device).view(1, 1, 1, -1)
        result = self.fn(scores, b, h, q_idx, kv_idx)
        if isinstance(result, torch.Tensor) and result.dim() == 0 and scores.numel() > 1:
            raise ShapeError(
                "score_mod returned one number for a whole tile: it must work element by element "
                "(no sum, mean or max over the scores)"
            )
        return check_mod_result(result, tuple(scores.shape), "score_mod", None).to(scores.dtype).expand(scores.shape)

    def start_backward(self, wanted: tuple[bool, ...], dtype: torch.dtype, device=None) -> None:
        """Zero the captured tensors' gradients; ``wanted``: which of them autograd asks for.
        Works out, once, whether the score_mod adds a bias (``adds_bias``) for scores of ``dtype``."""
        self._wanted = tuple(wanted)
        self.captured_grads = [torch.zeros_like(t) if w else None for t, w in zip(self.captured, self._wanted)]
        b, h = mask_indices(self.batch, self.heads, device)
        self.adds_bias = adds_a_bias(self.fn, b, h, dtype, device)

    def record(self, raw: torch.Tensor, shift: torch.Tensor, heads_view, r0: int, rows: tuple[int, int],
               cols: tuple[int, int]) -> torch.Tensor:
        """score_mod(raw) + shift in raw's layout (shift: -lse, one per row), with what ``backward`` needs kept.

        A bias: written into raw's own memory, and no autograd unless a captured tensor wants
        a gradient (then through the bias alone). Otherwise score_mod(raw) runs under autograd
        and the result is a new tensor."""
        wanted = any(self._wanted)
        if self.adds_bias:
            heads = heads_view(raw, r0)
            with torch.set_grad_enabled(wanted):
                modded = self(heads, rows, cols)
            self._tile.saved = (None, modded if wanted else None, heads_view, r0)
            torch.add(modded.detach(), heads_view(shift, r0), out=heads)
            return raw
        raw.requires_grad_(True)
        with torch.enable_grad():
            modded = self(heads_view(raw, r0), rows, cols)
        self._tile.saved = (raw, modded, heads_view, r0)
        result = raw.detach().clone()
        heads_view(result, r0).copy_(modded.detach())
        return result.add_(shift)

    def backward(self, ds: torch.Tensor) -> torch.Tensor:
        """dS of the modified scores -> dS of the raw ones (raw's layout); captured gradients added."""
        raw, modded, heads_view, r0 = self._tile.saved
        self._tile.saved = None
        if modded is None:  # a bias, and no captured tensor wants a gradient: d(s + bias) / ds = 1
            return ds
        wanted = [t for t, w in zip(self.captured, self._wanted) if w]
        sources = wanted if raw is None else [raw, *wanted]
        grads = list(torch.autograd.grad(modded, sources, grad_outputs=heads_view(ds, r0), allow_unused=True))
        raw_grad = ds if raw is None else grads.pop(0)  # a bias passes dS on as it is
        spots = [i for i, w in enumerate(self._wanted) if w]
        with self._adding:
            for index, grad in zip(spots, grads):
                if grad is not None:
                    self.captured_grads[index] += grad
        return raw_grad if raw_grad is not None else torch.zeros_like(raw)


def captured_tensors(fn, seen: set[int] | None = None) -> tuple[torch.Tensor, ...]:
    """The tensors needing gradients that ``fn`` can reach: closure cells, defaults, the
    globals its code names, the module or object of a bound method, and the same in the
    functions it calls through those (``and_masks``-style compositions).   -> unique, in order found

    Args:
        fn: a function or callable object.
        seen: ids already visited (for the recursion).

    Returns:
        The tensors with requires_grad, each once.
    """
    seen = set() if seen is None else seen
    found: dict[int, torch.Tensor] = {}

    def visit(value, depth: int) -> None:
        if id(value) in seen or depth > 4:
            return
        seen.add(id(value))
        if isinstance(value, torch.Tensor):
            if value.requires_grad:
                found.setdefault(id(value), value)
        elif isinstance(value, torch.nn.Module):
            for tensor in (*value.parameters(), *value.buffers()):
                visit(tensor, depth + 1)
        elif isinstance(value, types.MethodType):
            visit(value.__self__, depth + 1)
            visit(value.__func__, depth + 1)
        elif isinstance(value, types.FunctionType):
            for cell in value.__closure__ or ():
                try:
                    visit(cell.cell_contents, depth + 1)
                except ValueError:  # an empty cell
                    pass
            for default in (*(value.__defaults__ or ()), *(value.__kwdefaults__ or {}).values()):
                visit(default, depth + 1)
            for name in value.__code__.co_names:
                if name in value.__globals__:
                    visit(value.__globals__[name], depth + 1)
        elif isinstance(value, (list, tuple)):
            for item in value:
                visit(item, depth + 1)
        elif isinstance(value, dict):
            for item in value.values():
                visit(item, depth + 1)
        elif callable(value) and not isinstance(value, type) and hasattr(value, "__dict__"):
            visit(vars(value), depth + 1)  # a callable object: its attributes

    visit(fn, 0)
    return tuple(found.values())


def _checked_mask(block_mask, batch: int, heads: int, q_len: int, kv_len: int):
    """Our structured masks (a BlockMask among them) as they are; torch's BlockMask converted; sizes checked."""
    if not isinstance(block_mask, StructuredMask):
        block_mask = as_block_mask(block_mask)
    if block_mask.q_len is not None and (block_mask.q_len, block_mask.kv_len) != (q_len, kv_len):
        raise ShapeError(
            f"the block mask is for Q_LEN x KV_LEN = {block_mask.q_len} x {block_mask.kv_len}, "
            f"but the inputs are {q_len} x {kv_len}"
        )
    lead = getattr(block_mask, "lead", ())
    if lead and (lead[0] not in (1, batch) or (len(lead) > 1 and lead[1] not in (1, heads))):
        raise ShapeError(f"the block mask is for B, H = {lead}, but the inputs have batch {batch} and {heads} heads")
    return block_mask
