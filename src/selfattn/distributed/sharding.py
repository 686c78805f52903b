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
    """[start, end) of ``parts`` near-equal pieces of range(seq_len); the first seq_len % parts are one longer.

    The one splitting rule behind every layout here. Nothing is checked: pieces may be
    empty when parts > seq_len.

    Args:
        seq_len: the number of positions to split, >= 0.
        parts: how many pieces, >= 1.

    Returns:
        ``parts`` pairs (start, end), in order, covering 0 .. seq_len - 1 without gaps.

    Examples:
        >>> from selfattn.distributed import chunk_bounds
        >>> chunk_bounds(10, 4)
        [(0, 3), (3, 6), (6, 8), (8, 10)]
    """
    base, extra = divmod(seq_len, parts)
    bounds, start = [], 0
    for i in range(parts):
        end = start + base + (1 if i < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


def shard_positions(seq_len: int, rank: int, world_size: int, load_balance: bool = True) -> list[tuple[int, int]]:
    """The global [start, end) ranges rank ``rank`` holds, in the order its shard stores them.

    Local position i of a shard is the i-th position of these ranges taken in order: use
    them for anything that depends on the global position (RoPE angles, a causal rule).

    Args:
        seq_len: the full sequence's length N, at least world_size.
        rank: the rank asked about, 0 <= rank < world_size.
        world_size: the number of ranks P, >= 1.
        load_balance: True: the zigzag layout, chunks rank and 2P-1-rank of 2P near-equal
            chunks (the second may be empty when N < 2P); False: one contiguous piece,
            the rank-th of P.

    Returns:
        A list of (start, end) pairs: two for zigzag, one for contiguous.

    Raises:
        OptionError: seq_len, rank or world_size is not an int, world_size < 1, or rank
            is out of range.
        ShapeError: seq_len < world_size, so some rank would hold nothing.

    Examples:
        >>> from selfattn.distributed import shard_positions
        >>> shard_positions(10, 0, 4)  # chunks 0 and 7 of 2,2,1,1,1,1,1,1
        [(0, 2), (9, 10)]
        >>> shard_positions(10, 1, 4, load_balance=False)
        [(3, 6)]
    """
    _check_layout(seq_len, rank, world_size)
    if not load_balance:
        return [chunk_bounds(seq_len, world_size)[rank]]
    chunks = chunk_bounds(seq_len, 2 * world_size)
    return [chunks[rank], chunks[2 * world_size - 1 - rank]]


def shard_lengths(seq_len: int, world_size: int, load_balance: bool = True) -> list[int]:
    """How many positions each rank holds, rank by rank.

    Args:
        seq_len: the full sequence's length N, at least world_size.
        world_size: the number of ranks P, a positive int.
        load_balance: the layout, as in ``shard_positions`` (True: zigzag).

    Returns:
        P ints, rank 0 first, summing to seq_len.

    Raises:
        OptionError: seq_len is not an int.
        ShapeError: seq_len < world_size.

    Examples:
        >>> from selfattn.distributed import shard_lengths
        >>> shard_lengths(10, 4)
        [3, 3, 2, 2]
        >>> shard_lengths(37, 4)  # zigzag chunks 5,5,5,5,5,4,4,4
        [9, 9, 9, 10]
    """
    _check_layout(seq_len, 0, world_size)  # world_size 0 would give no ranks, not an error
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

    The pieces ``shard_positions`` names, cut out along ``dim`` and concatenated in that
    order. Every rank can start from the same full tensor (a seeded generator) and keep
    only its shard.

    Args:
        x: the full sequence, (..., N, d) with the default dim.
        rank: this shard's rank; None: this process's rank in ``group``.
        world_size: the number of ranks P; None: the size of ``group``.
        load_balance: True: zigzag (the layout ``ring_attention``'s default expects);
            False: contiguous. ``ring_attention`` must be given the same value.
        dim: the sequence axis.
        group: the torch.distributed process group asked for a missing rank or
            world_size; None: the default (whole world) group.

    Returns:
        A new contiguous tensor, x with only this rank's positions along ``dim``:
            (..., ~N/P, d).

    Raises:
        OptionError: rank or world_size is missing and torch.distributed is not
            initialised, or they are not ints or out of range.
        ShapeError: x is not a tensor, dim is out of range, or x has fewer positions
            along dim than there are ranks.

    Examples:
        >>> import torch
        >>> from selfattn.distributed import shard_sequence
        >>> x = torch.arange(10.0).reshape(1, 10, 1)  # (batch, seq, d)
        >>> shard_sequence(x, rank=0, world_size=4).flatten().tolist()
        [0.0, 1.0, 9.0]
        >>> tuple(shard_sequence(x, rank=3, world_size=4).shape)
        (1, 2, 1)
    """
    rank, world_size = _place(rank, world_size, group)
    dim = _axis(x, dim)
    pieces = [x.narrow(dim, start, end - start) for start, end in shard_positions(x.shape[dim], rank, world_size, load_balance)]
    return torch.cat(pieces, dim=dim).contiguous()


def unshard_sequence(shards: Sequence[torch.Tensor], load_balance: bool = True, dim: int = -2) -> torch.Tensor:
    """The full sequence from every rank's shard, given in rank order.   P x (..., ~N/P, d) -> (..., N, d)

    The inverse of ``shard_sequence``: N is the sum of the shards' lengths and P their
    count, so every position goes back to where it came from. No communication: for
    shards already in one process (``gather_sequence`` collects them across ranks).

    Args:
        shards: every rank's shard, rank 0 first, with equal shapes apart from ``dim``.
        load_balance: the layout they were made with (True: zigzag).
        dim: the sequence axis.

    Returns:
        A new tensor (..., N, d) with the positions in their global order.

    Raises:
        ShapeError: no shards; dim out of range; or shard lengths that are not the
            layout's split of their total (such as shards made with the other
            load_balance).

    Examples:
        >>> import torch
        >>> from selfattn.distributed import shard_sequence, unshard_sequence
        >>> x = torch.arange(10.0).reshape(1, 10, 1)
        >>> shards = [shard_sequence(x, rank=r, world_size=4) for r in range(4)]
        >>> [s.shape[1] for s in shards]
        [3, 3, 2, 2]
        >>> torch.equal(unshard_sequence(shards), x)
        True
    """
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
    A collective: call it on every rank of ``group``. Shards may differ in length (they
    are padded to the longest for the all-gather), but must agree in every other axis,
    in dtype and in layout.

    Args:
        x: this rank's shard, (..., ~N/P, d) with the default dim.
        group: the torch.distributed process group; None: the default (whole world) group.
        load_balance: the layout the shards were made with (True: zigzag).
        dim: the sequence axis.

    Returns:
        The full sequence (..., N, d) in global order, the same on every rank.

    Raises:
        OptionError: torch.distributed is not initialised.
        ShapeError: dim is out of range, or the gathered lengths are not the layout's split.
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
