"""Attention masks, True = may attend.

    builders.py     named builders returning bool tensors (causal, sliding window, padding,
                    documents, a user's mask, combining, to additive)
    rules.py        the same masks as rules (``CausalMask``, ``SlidingWindowMask``,
                    ``PaddingMask``, ``DocumentMask``) that never build q_len x kv_len
    states.py       the block states (EMPTY, FULL, PARTIAL) and their helpers: the leaf
    structured.py   what every structured mask answers (allowed pairs, block states for a
                    tiled kernel, the dense form), ``DenseMask``, and ``&`` / ``|`` of
                    structured masks (``AndMask``, ``OrMask``)
    dense_states.py a mask tensor's block states, reduced once per call
    block_mask.py   FlexAttention's mask_mod and its block map (``create_block_mask``)
    packed.py       a window counted within each packed sequence (varlen)
"""

from selfattn.masks.builders import (
    causal_bottom_right,
    causal_mask,
    causal_top_left,
    check_mask_kind,
    combine_masks,
    document_mask,
    padding_mask,
    query_positions,
    sliding_window_mask,
    to_additive,
    user_mask,
)
from selfattn.masks.dense_states import states_of_dense
from selfattn.masks.rules import ALIGNMENTS, CausalMask, DocumentMask, PaddingMask, SlidingWindowMask
from selfattn.masks.states import BLOCK_STATE_NAMES, EMPTY, FULL, PARTIAL
from selfattn.masks.structured import AndMask, DenseMask, OrMask, StructuredMask

__all__ = [
    "ALIGNMENTS", "AndMask", "BLOCK_STATE_NAMES", "CausalMask", "DenseMask", "DocumentMask", "EMPTY", "FULL", "OrMask",
    "PARTIAL", "PaddingMask", "SlidingWindowMask", "StructuredMask", "causal_bottom_right", "causal_mask",
    "causal_top_left", "check_mask_kind", "combine_masks", "document_mask", "padding_mask", "query_positions", "sliding_window_mask",
    "states_of_dense", "to_additive", "user_mask",
]
