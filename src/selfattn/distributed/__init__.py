"""Attention across processes: exact ring attention on torch.distributed.

    ring_attention       attention of this rank's queries over the whole sequence (ring.py)
    shard_sequence       this rank's part of a full sequence (zigzag or contiguous)
    unshard_sequence     the full sequence from every rank's part
    gather_sequence      the full sequence on every rank (all-gather; for checks)
    shard_positions      the global positions a rank holds, e.g. for position encodings

``python -m selfattn.distributed.demo`` under torchrun runs it on P processes.
"""

from selfattn.distributed.ring import ring_attention
from selfattn.distributed.sharding import (
    chunk_bounds,
    gather_sequence,
    shard_lengths,
    shard_positions,
    shard_sequence,
    unshard_sequence,
)

__all__ = [
    "ring_attention",
    "shard_sequence",
    "unshard_sequence",
    "gather_sequence",
    "shard_positions",
    "shard_lengths",
    "chunk_bounds",
]
