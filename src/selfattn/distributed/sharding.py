"""Which positions of a sequence each rank holds, and moving between full and sharded form.

Two layouts of a sequence of N positions over P ranks:

- contiguous (``load_balance=False``): rank r holds one piece, the r-th of P.
- zigzag (``load_balance=True``, also called head-tail): cut the sequence into 2P chunks;
  rank r holds chunk r and chunk 2P-1-r, in that order. Under a causal mask the work of a
  row grows with its position, so contiguous pieces leave rank 0 with almost nothing to
  do while rank P-1 does the most; pairing an early chunk with a late one gives every rank
  the same number of visible (query, key) pairs.

Pieces are as equal as they can be: with N = 10 and 4 ranks the zigzag chunks are
2,2,1,1,1,1,1,1, so the ranks hold 3,3,2,2 positions. Every function here follows the
same rule, so ``unshard_sequence`` inverts ``shard_sequence`` exactly.
"""

from __future__ import annotations

from typing import Sequence

import torch

from selfattn.errors import OptionError, ShapeError


def chunk_bounds(seq_len: int, parts: int) -> list[tuple[int, int]]:
    """[start, end) of ``parts`` near-equal pieces of range(seq_len); the first seq_len % parts are one longer."""
    base, extra = divmod(seq_len, parts)
    bounds, start = [], 0
    for i in range(parts):
        end = start + base + (1 if i < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


def shard_positions(seq_len: int, rank: int, world_size: int, load_balance: bool = True) -> list[tuple[int, int]]:
    """The global [start, end) ranges rank ``rank`` holds, in the order its shard stores them."""
    _check_layout(seq_len, rank, world_size)
    if not load_balance:
        return [chunk_bounds(seq_len, world_size)[rank]]
    chunks = chunk_bounds(seq_len, 2 * world_size)
    return [chunks[rank], chunks[2 * world_size - 1 - rank]]


def shard_lengths(seq_len: int, world_size: int, load_balance: bool = True) -> list[int]:
    """How many positions each rank holds, rank by rank."""
    return [sum(end - start for start, end in shard_positions(seq_len, r, world_size, load_balance)) for r in range(world_size)]


def shard_sequence(
    x: torch.Tensor,
    rank: int | None = None,
    world_size: int | None = None,
    load_balance: bool = True,
    dim: int = -2,
    group=None,
) -> torch.Tensor:
    """This rank's part of a full sequence along ``dim``.   (..., N, d) -> (..., ~N/P, d), a copy

    rank / world_size default to this process's place in ``group`` (torch.distributed).
    """
    rank, world_size = _place(rank, world_size, group)
    dim = _axis(x, dim)
    pieces = [x.narrow(dim, start, end - start) for start, end in shard_positions(x.shape[dim], rank, world_size, load_balance)]
    return torch.cat(pieces, dim=dim).contiguous()


def unshard_sequence(shards: Sequence[torch.Tensor], load_balance: bool = True, dim: int = -2) -> torch.Tensor:
    """The full sequence from every rank's shard, given in rank order.   P x (..., ~N/P, d) -> (..., N, d)"""
    if not shards:
        raise ShapeError("unshard_sequence needs the shards of every rank, got none")
    world_size = len(shards)
    dim = _axis(shards[0], dim)
    seq_len = sum(s.shape[dim] for s in shards)
    expected = shard_lengths(seq_len, world_size, load_balance)
    got = [s.shape[dim] for s in shards]
    if got != expected:
        raise ShapeError(
            f"shards of lengths {got} are not a {layout_name(load_balance)} split of {seq_len} positions over "
            f"{world_size} ranks (that gives {expected}); were they made with the same load_balance?"
        )
    pieces: list[tuple[int, torch.Tensor]] = []
    for rank, shard in enumerate(shards):
        local = 0
        for start, end in shard_positions(seq_len, rank, world_size, load_balance):
            pieces.append((start, shard.narrow(dim, local, end - start)))
            local += end - start
    return torch.cat([piece for _, piece in sorted(pieces, key=lambda item: item[0])], dim=dim)


def gather_sequence(x: torch.Tensor, group=None, load_balance: bool = True, dim: int = -2) -> torch.Tensor:
    """Every rank's shard, all-gathered and put back in order: the full sequence on every rank.

    For checks and small outputs; the point of ring attention is never to need this.
    """
    import torch.distributed as dist

    rank, world_size = _place(None, None, group)
    dim = _axis(x, dim)
    lengths = torch.tensor([x.shape[dim]], dtype=torch.int64, device=x.device)
    all_lengths = [torch.zeros_like(lengths) for _ in range(world_size)]
    dist.all_gather(all_lengths, lengths, group=group)
    sizes = [int(n) for n in all_lengths]
    padded_shape = list(x.shape)
    padded_shape[dim] = max(sizes)
    padded = x.new_zeros(padded_shape)  # all_gather needs equal sizes: pad the shorter shards
    padded.narrow(dim, 0, x.shape[dim]).copy_(x)
    gathered = [torch.empty_like(padded) for _ in range(world_size)]
    dist.all_gather(gathered, padded, group=group)
    return unshard_sequence([g.narrow(dim, 0, n) for g, n in zip(gathered, sizes)], load_balance, dim)


def layout_name(load_balance: bool) -> str:
    """How the error messages name a layout."""
    return "zigzag (load_balance=True)" if load_balance else "contiguous (load_balance=False)"


def _check_layout(seq_len: int, rank: int, world_size: int) -> None:
    for name, value in (("seq_len", seq_len), ("rank", rank), ("world_size", world_size)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise OptionError(f"{name} must be an integer, got {value!r}")
    if world_size < 1:
        raise OptionError(f"world_size must be at least 1, got {world_size}")
    if not 0 <= rank < world_size:
        raise OptionError(f"rank must be in [0, {world_size}), got {rank}")
    if seq_len < world_size:
        raise ShapeError(f"a sequence of {seq_len} positions cannot give each of {world_size} ranks at least one")


def _place(rank: int | None, world_size: int | None, group) -> tuple[int, int]:
    if rank is not None and world_size is not None:
        return rank, world_size
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise OptionError("give rank and world_size, or initialise torch.distributed first (init_process_group / torchrun)")
    return (dist.get_rank(group) if rank is None else rank), (dist.get_world_size(group) if world_size is None else world_size)


def _axis(x: torch.Tensor, dim: int) -> int:
    if not isinstance(x, torch.Tensor):
        raise ShapeError(f"expected a tensor, got {type(x).__name__}")
    if not -x.dim() <= dim < x.dim():
        raise ShapeError(f"dim {dim} is out of range for a tensor of shape {tuple(x.shape)}")
    return dim % x.dim()
