"""The single-process parts of distributed attention, against independent references.

- chunk_bounds / shard_positions / shard_sequence against ``torch.tensor_split``, whose
  documented rule (the first N % parts pieces one longer) is the split we promise;
- unshard_sequence inverting shard_sequence exactly, over lengths, world sizes and axes;
- the causal work per rank counted from the positions: zigzag balanced, contiguous not;
- merge_partial_attention against a float64 softmax over the concatenated keys,
  including rows with no visible key on one or both sides.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from selfattn.distributed import (
    chunk_bounds,
    gather_sequence,
    shard_lengths,
    shard_positions,
    shard_sequence,
    unshard_sequence,
)
from selfattn.errors import OptionError, ShapeError
from selfattn.kernels.online_softmax import merge_partial_attention

NEG_INF = float("-inf")


def split_rows(n: int, rank: int, world: int, load_balance: bool) -> torch.Tensor:
    """The positions a rank holds, from torch.tensor_split: one piece, or chunks rank and 2P-1-rank of 2P."""
    if not load_balance:
        return torch.tensor_split(torch.arange(n), world)[rank]
    chunks = torch.tensor_split(torch.arange(n), 2 * world)
    return torch.cat([chunks[rank], chunks[2 * world - 1 - rank]])


@given(st.integers(0, 300), st.integers(1, 40))
def test_chunk_bounds_are_tensor_split(seq_len, parts):
    sizes = [len(piece) for piece in torch.tensor_split(torch.arange(seq_len), parts)]
    starts = [sum(sizes[:i]) for i in range(parts)]
    assert chunk_bounds(seq_len, parts) == [(start, start + size) for start, size in zip(starts, sizes)]


def test_documented_examples():
    assert [e - s for s, e in chunk_bounds(10, 8)] == [2, 2, 1, 1, 1, 1, 1, 1]
    assert shard_lengths(10, 4) == [3, 3, 2, 2]
    assert shard_positions(10, 0, 4) == [(0, 2), (9, 10)]
    assert shard_positions(10, 3, 4) == [(5, 6), (6, 7)]
    assert shard_lengths(37, 4) == [9, 9, 9, 10] and shard_lengths(37, 4, load_balance=False) == [10, 9, 9, 9]
    assert shard_positions(37, 1, 4, load_balance=False) == [(10, 19)]
    assert shard_positions(5, 0, 4) == [(0, 1), (5, 5)]  # N = P + 1: chunks 5, 6, 7 are empty
    assert shard_lengths(5, 4) == [1, 1, 1, 2] and shard_lengths(4, 4) == [1, 1, 1, 1]


@settings(max_examples=150)
@given(st.integers(1, 12).flatmap(lambda p: st.tuples(st.just(p), st.integers(p, 200))), st.booleans())
def test_every_position_is_held_once(world_and_len, load_balance):
    world, seq_len = world_and_len
    held = []
    for rank in range(world):
        ranges = shard_positions(seq_len, rank, world, load_balance)
        assert len(ranges) == (2 if load_balance else 1)
        rows = [i for start, end in ranges for i in range(start, end)]
        assert rows == split_rows(seq_len, rank, world, load_balance).tolist()
        assert len(rows) >= 1
        held += rows
    assert sorted(held) == list(range(seq_len))
    assert shard_lengths(seq_len, world, load_balance) == [len(split_rows(seq_len, r, world, load_balance)) for r in range(world)]


@settings(max_examples=100)
@given(
    st.integers(1, 8).flatmap(lambda p: st.tuples(st.just(p), st.integers(p, 40))),
    st.lists(st.integers(1, 3), min_size=0, max_size=2),
    st.integers(0, 3),
    st.booleans(),
    st.booleans(),
)
def test_shard_then_unshard_is_the_identity(world_and_len, other_sizes, axis, negative_axis, load_balance):
    world, seq_len = world_and_len
    shape = list(other_sizes) + [2]  # a trailing feature axis, like (..., seq, d)
    axis = axis % (len(shape) + 1)
    shape.insert(axis, seq_len)
    x = torch.arange(math.prod(shape), dtype=torch.float64).reshape(shape)
    dim = axis - len(shape) if negative_axis else axis
    shards = [shard_sequence(x, rank, world, load_balance, dim=dim) for rank in range(world)]
    for rank, shard in enumerate(shards):
        assert torch.equal(shard, x.index_select(axis, split_rows(seq_len, rank, world, load_balance)))
    assert torch.equal(unshard_sequence(shards, load_balance, dim=dim), x)


def test_shard_sequence_default_axis_is_the_sequence():
    x = torch.randn(2, 3, 11, 4, generator=torch.Generator().manual_seed(0))
    assert torch.equal(shard_sequence(x, 1, 2), x[:, :, split_rows(11, 1, 2, True), :])
    assert torch.equal(shard_sequence(x, 1, 2, load_balance=False), x[:, :, 6:, :])


@pytest.mark.parametrize(
    "args, error, match",
    [
        ((8, -1, 4), OptionError, r"rank must be in \[0, 4\), got -1"),
        ((8, 4, 4), OptionError, r"rank must be in \[0, 4\), got 4"),
        ((8, 0, 0), OptionError, "world_size must be at least 1"),
        ((8, 0, 1.5), OptionError, "world_size must be an integer"),
        ((8, True, 2), OptionError, "rank must be an integer"),
        ((3, 0, 4), ShapeError, "a sequence of 3 positions cannot give each of 4 ranks at least one"),
    ],
)
def test_bad_layouts_are_refused(args, error, match):
    with pytest.raises(error, match=match):
        shard_positions(*args)


def test_shard_sequence_errors():
    x = torch.zeros(2, 3, 8)
    with pytest.raises(ShapeError, match="cannot give each of 4 ranks"):
        shard_sequence(torch.zeros(1, 3, 4), 0, 4)  # N = 3 < P = 4
    with pytest.raises(ShapeError, match=r"dim 3 is out of range for a tensor of shape \(2, 3, 8\)"):
        shard_sequence(x, 0, 2, dim=3)
    with pytest.raises(ShapeError, match="expected a tensor, got list"):
        shard_sequence([[1.0]], 0, 1)
    with pytest.raises(OptionError, match="give rank and world_size, or initialise torch.distributed"):
        shard_sequence(x)  # no process group in this process
    with pytest.raises(OptionError, match="initialise torch.distributed"):
        gather_sequence(x)


def test_unshard_sequence_errors():
    x = torch.arange(37.0)[:, None]  # (37, 1)
    zigzag = [shard_sequence(x, rank, 4) for rank in range(4)]  # lengths 9, 9, 9, 10
    with pytest.raises(ShapeError, match=r"shards of lengths \[9, 9, 9, 10\] are not a contiguous .* gives \[10, 9, 9, 9\]"):
        unshard_sequence(zigzag, load_balance=False)
    with pytest.raises(ShapeError, match=r"lengths \[9, 9, 10, 9\] are not a zigzag"):
        unshard_sequence([zigzag[0], zigzag[1], zigzag[3], zigzag[2]])
    with pytest.raises(ShapeError, match="got none"):
        unshard_sequence([])
    with pytest.raises(ShapeError, match="out of range"):
        unshard_sequence(zigzag, dim=2)


def causal_work(seq_len: int, rank: int, world: int, load_balance: bool) -> int:
    """Visible (query, key) pairs of a rank's queries under a causal mask: query i sees keys 0..i."""
    return sum((end * (end + 1) - start * (start + 1)) // 2 for start, end in shard_positions(seq_len, rank, world, load_balance))


@settings(max_examples=60)
@given(st.integers(2, 8).flatmap(lambda p: st.tuples(st.just(p), st.integers(64 * p, 4000))))
def test_zigzag_balances_causal_work_and_contiguous_does_not(world_and_len):
    world, seq_len = world_and_len
    zigzag = [causal_work(seq_len, r, world, True) for r in range(world)]
    contiguous = [causal_work(seq_len, r, world, False) for r in range(world)]
    assert sum(zigzag) == sum(contiguous) == seq_len * (seq_len + 1) // 2
    assert max(zigzag) / min(zigzag) <= 1.1
    if seq_len % (2 * world) == 0:  # equal chunks: exactly equal work
        assert max(zigzag) == min(zigzag)
    assert max(contiguous) / min(contiguous) >= world  # the last rank does about 2P-1 times the first's


def reference_partial(scores: torch.Tensor, values: torch.Tensor):
    """softmax(scores) V and logsumexp(scores) in float64; rows with no finite score give 0 and -inf."""
    scores, values = scores.double(), values.double()
    lse = torch.logsumexp(scores, dim=-1)  # (..., rows)
    seen = lse > NEG_INF
    weights = torch.where(seen[..., None], torch.exp(scores - torch.where(seen, lse, 0.0)[..., None]), 0.0)
    return weights @ values, lse


def masked_scores(rows, keys, keep, gen, magnitude):
    scores = torch.randn(rows, keys, generator=gen, dtype=torch.float64) * magnitude
    return scores.masked_fill(~keep, NEG_INF)


@settings(max_examples=80, deadline=None)
@given(
    st.integers(1, 9),
    st.integers(0, 7),
    st.integers(0, 7),
    st.integers(1, 4),
    st.sampled_from([torch.float64, torch.float32]),
    st.sampled_from([1.0, 30.0]),
    st.integers(0, 2**16),
)
def test_merge_is_the_softmax_over_all_keys(rows, keys_a, keys_b, d_v, dtype, magnitude, seed):
    gen = torch.Generator().manual_seed(seed)
    keep = torch.rand(rows, keys_a + keys_b, generator=gen) < 0.6
    keep[0] = False  # a row that sees nothing on either side
    if rows > 1:
        keep[1, :keys_a] = False  # one that sees nothing in A
    scores = masked_scores(rows, keys_a + keys_b, keep, gen, magnitude)
    values = torch.randn(keys_a + keys_b, d_v, generator=gen, dtype=torch.float64)
    want_out, want_lse = reference_partial(scores, values)
    out_a, lse_a = reference_partial(scores[:, :keys_a], values[:keys_a])
    out_b, lse_b = reference_partial(scores[:, keys_a:], values[keys_a:])
    out, lse = merge_partial_attention(out_a.to(dtype), lse_a.to(dtype), out_b.to(dtype), lse_b.to(dtype))
    assert out.dtype == lse.dtype == dtype
    assert not out.isnan().any() and not lse.isnan().any()
    tol = dict(atol=1e-12, rtol=1e-12) if dtype == torch.float64 else dict(atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.double(), want_out, **tol)
    torch.testing.assert_close(lse.double(), want_lse, **tol)  # equal infinities count as close
    assert (lse[0] == NEG_INF).all() and (out[0] == 0).all()


def test_merge_of_rows_masked_on_one_or_both_sides():
    out_a = torch.tensor([[1.0, 2.0], [0.0, 0.0], [0.0, 0.0], [3.0, -1.0]], dtype=torch.float64)
    lse_a = torch.tensor([0.5, NEG_INF, NEG_INF, 800.0], dtype=torch.float64)
    out_b = torch.tensor([[0.0, 0.0], [5.0, 6.0], [0.0, 0.0], [1.0, 1.0]], dtype=torch.float64)
    lse_b = torch.tensor([NEG_INF, -2.0, NEG_INF, 800.0 + math.log(3.0)], dtype=torch.float64)
    out, lse = merge_partial_attention(out_a, lse_a, out_b, lse_b)
    # row 3: B holds 3 times A's weight, exp(800) would overflow if formed
    want = torch.tensor([[1.0, 2.0], [5.0, 6.0], [0.0, 0.0], [0.25 * 3.0 + 0.75, 0.25 * -1.0 + 0.75]], dtype=torch.float64)
    torch.testing.assert_close(out, want, atol=1e-12, rtol=1e-12)  # exp(lse - merged) loses ~800 eps
    torch.testing.assert_close(lse, torch.tensor([0.5, -2.0, NEG_INF, 800.0 + math.log(4.0)], dtype=torch.float64))


@pytest.mark.parametrize("world_size", [0, -1, 2.0, True])
def test_shard_lengths_refuses_a_world_without_ranks(world_size):
    with pytest.raises(OptionError, match="world_size"):
        shard_lengths(8, world_size)
