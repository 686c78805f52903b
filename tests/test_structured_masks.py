"""Structured masks (rules, DenseMask, & and |) against references written here from their definitions.

- dense(): entry-by-entry Python loops over (i, j) for causal, sliding window, padding and
  document masks, both alignments, q_len != kv_len, unlimited sides, empty documents;
- block_states(): a loop over the blocks of the reference mask (EMPTY: nothing visible in
  any batch/head element, FULL: everything visible in all of them), for single masks and
  for & / | combinations, block sizes of 1, not dividing the length, larger than it;
- the builders (dense and structured=True), combine_masks, and the typed errors.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from selfattn.errors import OptionError, SelfAttnError, ShapeError
from selfattn.masks import (
    EMPTY,
    FULL,
    PARTIAL,
    AndMask,
    CausalMask,
    DenseMask,
    DocumentMask,
    OrMask,
    PaddingMask,
    SlidingWindowMask,
    causal_mask,
    combine_masks,
    document_mask,
    padding_mask,
    sliding_window_mask,
)
from selfattn.masks.rules import causal_rule

ALIGNS = ["top_left", "bottom_right"]


# References, written from the definitions one entry at a time.


def window_loop(q_len, kv_len, left, right, offset):
    """M[i][j] = (pos - left <= j <= pos + right), pos = i + offset; None: that side unlimited."""
    rows = [
        [(left is None or j >= i + offset - left) and (right is None or j <= i + offset + right) for j in range(kv_len)]
        for i in range(q_len)
    ]
    return torch.tensor(rows, dtype=torch.bool).reshape(q_len, kv_len)


def offset_of(q_len, kv_len, align):
    return 0 if align == "top_left" else kv_len - q_len


def padding_loop(lengths, kv_len):
    """M[b][0][0][j] = (j < lengths[b])."""
    rows = [[[[j < n for j in range(kv_len)]]] for n in lengths]
    return torch.tensor(rows, dtype=torch.bool).reshape(len(lengths), 1, 1, kv_len)


def document_loop(lengths, kv_lengths=None):
    """M[i][j] = (document of query i == document of key j); documents laid out in order."""
    kv_lengths = lengths if kv_lengths is None else kv_lengths
    q_doc = [d for d, n in enumerate(lengths) for _ in range(n)]
    kv_doc = [d for d, n in enumerate(kv_lengths) for _ in range(n)]
    rows = [[q_doc[i] == kv_doc[j] for j in range(len(kv_doc))] for i in range(len(q_doc))]
    return torch.tensor(rows, dtype=torch.bool).reshape(len(q_doc), len(kv_doc))


def states_loop(dense, q_len, block_q, block_k):
    """EMPTY / FULL / PARTIAL of each (row block, key block), over every batch/head element at once."""
    dense = dense.expand(*dense.shape[:-2], q_len, dense.shape[-1])
    kv_len = dense.shape[-1]
    states = []
    for r0 in range(0, q_len, block_q):
        row = []
        for c0 in range(0, kv_len, block_k):
            block = dense[..., r0:r0 + block_q, c0:c0 + block_k]
            row.append(EMPTY if not block.any() else FULL if block.all() else PARTIAL)
        states.append(row)
    return torch.tensor(states, dtype=torch.int8).reshape(len(states), -(-kv_len // block_k))


def assert_same(actual, expected):
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    torch.testing.assert_close(actual, expected, atol=0, rtol=0)


# One hypothesis strategy for every mask and combination: (name, mask, reference dense, q_len).

SIDE = st.one_of(st.none(), st.integers(0, 5))
KINDS = [
    "causal", "window", "padding", "documents", "causal&window", "documents&causal", "padding&window",
    "(window|causal)&padding", "dense&window", "dense|causal",
]


@st.composite
def mask_cases(draw, kinds=tuple(KINDS), max_len=9, min_len=1):
    """(kind, structured mask, its reference bool tensor from the loops, q_len)."""
    kind = draw(st.sampled_from(kinds))
    if "documents" in kind:
        lengths = draw(st.lists(st.integers(0, 4), min_size=1, max_size=4).filter(lambda x: sum(x) >= min_len))
        same_count = st.lists(st.integers(0, 4), min_size=len(lengths), max_size=len(lengths))
        kv_lengths = draw(st.one_of(st.none(), same_count))
        kv_lengths = kv_lengths if kv_lengths is None or sum(kv_lengths) >= min_len else None
        q_len, kv_len = sum(lengths), sum(kv_lengths or lengths)
    else:
        q_len, kv_len = draw(st.integers(min_len, max_len)), draw(st.integers(min_len, max_len))

    def causal():
        align = draw(st.sampled_from(ALIGNS))
        ref = window_loop(q_len, kv_len, None, 0, offset_of(q_len, kv_len, align))
        return CausalMask(q_len, kv_len, align=align), ref

    def window():
        left, right, align = draw(SIDE), draw(SIDE), draw(st.sampled_from(ALIGNS))
        mask = SlidingWindowMask(q_len, kv_len, left=left, right=right, align=align)
        return mask, window_loop(q_len, kv_len, left, right, offset_of(q_len, kv_len, align))

    def padding():
        lengths = draw(st.lists(st.integers(0, kv_len), min_size=1, max_size=3))
        return PaddingMask(lengths, kv_len), padding_loop(lengths, kv_len)

    def dense():
        seed, heads = draw(st.integers(0, 2**16)), draw(st.sampled_from([(), (2, 1), (1, 3)]))
        bits = torch.rand(*heads, q_len, kv_len, generator=torch.Generator().manual_seed(seed)) < 0.7
        return DenseMask(bits), bits.clone()

    if kind == "causal":
        mask, ref = causal()
    elif kind == "window":
        mask, ref = window()
    elif kind == "padding":
        mask, ref = padding()
    elif kind == "documents":
        mask, ref = DocumentMask(lengths, kv_lengths), document_loop(lengths, kv_lengths)
    elif kind == "causal&window":
        (a, ra), (b, rb) = causal(), window()
        mask, ref = a & b, ra & rb
    elif kind == "documents&causal":
        (b, rb) = causal()
        mask, ref = DocumentMask(lengths, kv_lengths) & b, document_loop(lengths, kv_lengths) & rb
    elif kind == "padding&window":
        (a, ra), (b, rb) = padding(), window()
        mask, ref = a & b, ra & rb
    elif kind == "(window|causal)&padding":
        (a, ra), (b, rb), (c, rc) = window(), causal(), padding()
        mask, ref = (a | b) & c, (ra | rb) & rc
    elif kind == "dense&window":
        (a, ra), (b, rb) = dense(), window()
        mask, ref = a & b, ra & rb
    else:
        (a, ra), (b, rb) = dense(), causal()
        mask, ref = a | b, ra | rb
    return kind, mask, ref, q_len


# dense() against the loops.


@pytest.mark.parametrize("align", ALIGNS)
@pytest.mark.parametrize("q_len,kv_len", [(1, 1), (4, 4), (3, 7), (7, 3), (1, 6), (6, 1), (0, 3), (3, 0)])
def test_causal_dense_against_loop(q_len, kv_len, align):
    expected = window_loop(q_len, kv_len, None, 0, offset_of(q_len, kv_len, align))
    assert_same(CausalMask(q_len, kv_len, align=align).dense(), expected)
    if q_len == kv_len:
        assert_same(CausalMask(q_len).dense(), expected)  # kv_len defaults to q_len


@settings(max_examples=80, deadline=None)
@given(q_len=st.integers(0, 9), kv_len=st.integers(0, 9), left=SIDE, right=SIDE, align=st.sampled_from(ALIGNS))
def test_sliding_window_dense_against_loop(q_len, kv_len, left, right, align):
    mask = SlidingWindowMask(q_len, kv_len, left=left, right=right, align=align)
    assert_same(mask.dense(), window_loop(q_len, kv_len, left, right, offset_of(q_len, kv_len, align)))


def test_sliding_window_zero_sides_is_the_diagonal_and_default_alignment_is_top_left():
    assert_same(SlidingWindowMask(3, 5, left=0, right=0).dense(), torch.eye(3, 5, dtype=torch.bool))
    assert_same(SlidingWindowMask(3, 5, left=0, right=0, align="bottom_right").dense(), window_loop(3, 5, 0, 0, 2))
    assert_same(SlidingWindowMask(4, left=0).dense(), torch.eye(4, dtype=torch.bool))
    assert_same(SlidingWindowMask(4, 6, left=None, right=None).dense(), torch.ones(4, 6, dtype=torch.bool))


@pytest.mark.parametrize("offset", [-3, -1, 0, 2, 5])
def test_causal_rule_any_offset_against_loop(offset):
    assert_same(causal_rule(4, 6, offset).dense(), window_loop(4, 6, None, 0, offset))


@pytest.mark.parametrize("lengths,kv_len", [([0, 3, 5], 5), ([5], 5), ([0], 4), ([2, 2], 3), ([1, 0, 4, 2], None)])
def test_padding_dense_against_loop(lengths, kv_len):
    mask = PaddingMask(lengths, kv_len)
    expected = padding_loop(lengths, kv_len or max(lengths))
    assert mask.shape == expected.shape
    assert_same(mask.dense(), expected)


@settings(max_examples=80, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 4), min_size=1, max_size=5),
    kv_extra=st.one_of(st.none(), st.lists(st.integers(0, 4), min_size=5, max_size=5)),
)
def test_document_dense_against_loop(lengths, kv_extra):
    kv_lengths = None if kv_extra is None else kv_extra[: len(lengths)]
    mask = DocumentMask(lengths, kv_lengths)
    expected = document_loop(lengths, kv_lengths)
    assert (mask.q_len, mask.kv_len) == tuple(expected.shape)
    assert_same(mask.dense(), expected)


def test_document_dense_with_empty_and_single_token_documents():
    # documents of lengths 1, 0, 2, 1, 0: queries/keys 0 | - | 1, 2 | 3 | -
    expected = torch.tensor([[1, 0, 0, 0], [0, 1, 1, 0], [0, 1, 1, 0], [0, 0, 0, 1]], dtype=torch.bool)
    assert_same(DocumentMask([1, 0, 2, 1, 0]).dense(), expected)
    # keys and queries differ per document: doc 0 has 1 query / 2 keys, doc 1 none / 1, doc 2 2 / 0
    assert_same(DocumentMask([1, 0, 2], [2, 1, 0]).dense(), torch.tensor([[1, 1, 0], [0, 0, 0], [0, 0, 0]]).bool())


# block_states against a loop over the blocks of the reference.


@settings(max_examples=200, deadline=None)
@given(case=mask_cases(), block_q=st.integers(1, 12), block_k=st.integers(1, 12))
def test_block_states_and_dense_against_loops(case, block_q, block_k):
    kind, mask, ref, q_len = case
    assert_same(mask.dense(), ref.expand(mask.shape))
    states = mask.block_states(block_q, block_k, q_len)
    assert states.dtype == torch.int8
    assert_same(states, states_loop(ref, q_len, block_q, block_k))


@pytest.mark.parametrize(
    "mask,ref",
    [
        (SlidingWindowMask(9, 9, left=2), window_loop(9, 9, 2, 0, 0)),
        (CausalMask(5, 8, align="bottom_right") & SlidingWindowMask(5, 8, left=1, right=1, align="bottom_right"),
         window_loop(5, 8, 1, 0, 3)),
        (DocumentMask([3, 1, 0, 4]) & CausalMask(8), document_loop([3, 1, 0, 4]) & window_loop(8, 8, None, 0, 0)),
        (PaddingMask([0, 8, 3], 8) | CausalMask(8), padding_loop([0, 8, 3], 8) | window_loop(8, 8, None, 0, 0)),
    ],
)
@pytest.mark.parametrize("block_q,block_k", [(1, 1), (3, 3), (2, 5), (8, 8), (20, 3), (64, 64)])
def test_block_states_fixed_sizes(mask, ref, block_q, block_k):
    """Block sizes 1, not dividing the lengths, equal to them and larger than them."""
    q_len = ref.shape[-2] if ref.shape[-2] > 1 else 8
    assert_same(mask.block_states(block_q, block_k, q_len), states_loop(ref, q_len, block_q, block_k))


def test_block_states_of_a_band_name_the_three_kinds():
    states = SlidingWindowMask(6, 6, left=1, align="top_left").block_states(2, 2)
    expected = torch.tensor(
        [[PARTIAL, EMPTY, EMPTY], [PARTIAL, PARTIAL, EMPTY], [EMPTY, PARTIAL, PARTIAL]], dtype=torch.int8
    )
    assert_same(states, expected)
    assert_same(CausalMask(4).block_states(2, 2), torch.tensor([[PARTIAL, EMPTY], [FULL, PARTIAL]], dtype=torch.int8))


def test_dense_mask_states_need_every_batch_and_head_element():
    """A block is EMPTY only if it is empty for every element, FULL only if full for all."""
    bits = torch.zeros(2, 4, 4, dtype=torch.bool)
    bits[0, :2, :2] = True  # element 0: block (0, 0) full, element 1: empty -> PARTIAL
    bits[:, 2:, 2:] = True  # full in both -> FULL
    expected = torch.tensor([[PARTIAL, EMPTY], [EMPTY, FULL]], dtype=torch.int8)
    assert_same(DenseMask(bits).block_states(2, 2), expected)


@settings(max_examples=40, deadline=None)
@given(case=mask_cases(), data=st.data())
def test_tile_and_apply_against_the_reference(case, data):
    kind, mask, ref, q_len = case
    kv_len = ref.shape[-1]
    r0 = data.draw(st.integers(0, q_len - 1))
    r1 = data.draw(st.integers(r0 + 1, q_len))
    c0 = data.draw(st.integers(0, kv_len - 1))
    c1 = data.draw(st.integers(c0 + 1, kv_len))
    ref = ref.expand(*ref.shape[:-2], q_len, kv_len)[..., r0:r1, c0:c1]
    tile = mask.tile((r0, r1), (c0, c1))
    assert_same(tile.expand(ref.shape), ref)
    scores = torch.zeros(torch.broadcast_shapes(ref.shape, (r1 - r0, c1 - c0)), dtype=torch.float64)
    expected = torch.zeros_like(scores).masked_fill(~ref.expand(scores.shape), float("-inf"))
    torch.testing.assert_close(mask.apply(scores, (r0, r1), (c0, c1)), expected, atol=0, rtol=0)


# Builders: the old tensors unchanged, structured=True the rule with the same dense form.


@pytest.mark.parametrize("align", ALIGNS)
@pytest.mark.parametrize("q_len,kv_len", [(5, 5), (3, 6), (6, 3)])
def test_builders_dense_and_structured(q_len, kv_len, align):
    offset = offset_of(q_len, kv_len, align)
    causal_ref = window_loop(q_len, kv_len, None, 0, offset)
    assert_same(causal_mask(q_len, kv_len, align=align), causal_ref)
    rule = causal_mask(q_len, kv_len, align=align, structured=True)
    assert isinstance(rule, CausalMask)
    assert_same(rule.dense(), causal_ref)

    window_ref = window_loop(q_len, kv_len, 2, 1, offset)
    assert_same(sliding_window_mask(q_len, kv_len, left=2, right=1, align=align), window_ref)
    rule = sliding_window_mask(q_len, kv_len, left=2, right=1, align=align, structured=True)
    assert isinstance(rule, SlidingWindowMask)
    assert_same(rule.dense(), window_ref)


# One default alignment: every builder and rule puts query i at key i (top-left) unless told otherwise.

ALIGNED_BUILDERS = {  # name: (build(q_len, kv_len, **align), left, right of the rule)
    "causal_mask": (lambda q, k, **a: causal_mask(q, k, **a), None, 0),
    "causal_mask structured": (lambda q, k, **a: causal_mask(q, k, structured=True, **a), None, 0),
    "CausalMask": (lambda q, k, **a: CausalMask(q, k, **a), None, 0),
    "sliding_window_mask": (lambda q, k, **a: sliding_window_mask(q, k, left=2, **a), 2, 0),
    "sliding_window_mask structured": (lambda q, k, **a: sliding_window_mask(q, k, left=1, right=1, structured=True, **a), 1, 1),
    "SlidingWindowMask": (lambda q, k, **a: SlidingWindowMask(q, k, left=2, right=None, **a), 2, None),
}


def band_at(q_len, kv_len, left, right, position):
    """M[i][j] = (position(i) - left <= j <= position(i) + right), one entry at a time; None: no limit."""
    rows = [
        [(left is None or j >= position(i) - left) and (right is None or j <= position(i) + right) for j in range(kv_len)]
        for i in range(q_len)
    ]
    return torch.tensor(rows, dtype=torch.bool).reshape(q_len, kv_len)


@pytest.mark.parametrize("name", ALIGNED_BUILDERS)
@pytest.mark.parametrize("q_len,kv_len", [(3, 7), (1, 6), (7, 3), (6, 2)])
def test_every_builder_aligns_top_left_by_default_and_bottom_right_when_asked(name, q_len, kv_len):
    build, left, right = ALIGNED_BUILDERS[name]
    top_left = band_at(q_len, kv_len, left, right, lambda i: i)
    bottom_right = band_at(q_len, kv_len, left, right, lambda i: kv_len - q_len + i)
    assert not torch.equal(top_left, bottom_right)  # the case tells the two apart
    for mask, expected in [(build(q_len, kv_len), top_left), (build(q_len, kv_len, align="top_left"), top_left),
                           (build(q_len, kv_len, align="bottom_right"), bottom_right)]:
        if isinstance(mask, torch.Tensor):
            assert_same(mask, expected)
        else:  # the rule: its dense form and the blocks a kernel would skip
            assert_same(mask.dense(), expected)
            assert_same(mask.block_states(2, 3), states_loop(expected, q_len, 2, 3))


def test_padding_and_document_builders_dense_and_structured():
    assert_same(padding_mask([2, 0, 4], 5), padding_loop([2, 0, 4], 5))
    assert_same(padding_mask(torch.tensor([2, 0, 4])), padding_loop([2, 0, 4], 4))
    rule = padding_mask([2, 0, 4], 5, structured=True)
    assert isinstance(rule, PaddingMask)
    assert_same(rule.dense(), padding_loop([2, 0, 4], 5))

    assert_same(document_mask([2, 1, 0, 3]), document_loop([2, 1, 0, 3]))
    assert_same(document_mask([2, 1], [1, 3]), document_loop([2, 1], [1, 3]))
    rule = document_mask([2, 1], [1, 3], structured=True)
    assert isinstance(rule, DocumentMask)
    assert_same(rule.dense(), document_loop([2, 1], [1, 3]))


def test_combine_masks_with_structured_masks_stays_structured():
    causal, padding = CausalMask(4, 6, align="bottom_right"), PaddingMask([3, 6], 6)
    combined = combine_masks(causal, None, padding)
    assert isinstance(combined, AndMask)
    assert_same(combined.dense(), window_loop(4, 6, None, 0, 2) & padding_loop([3, 6], 6))

    bits = torch.rand(4, 6, generator=torch.Generator().manual_seed(3)) < 0.5
    with_tensor = combine_masks(bits, causal)
    assert isinstance(with_tensor, AndMask)
    assert_same(with_tensor.dense(), bits & window_loop(4, 6, None, 0, 2))
    assert combine_masks(causal) is causal
    assert combine_masks(None, None) is None

    plain = combine_masks(causal_mask(4, 6), padding_mask([3, 6], 6))  # tensors only: still a tensor
    assert isinstance(plain, torch.Tensor)
    assert_same(plain, window_loop(4, 6, None, 0, 0) & padding_loop([3, 6], 6))


def test_or_and_operators_accept_bool_tensors_on_either_side():
    bits = torch.eye(3, dtype=torch.bool)
    causal = CausalMask(3)
    assert isinstance(causal | bits, OrMask) and isinstance(bits & causal, AndMask)
    assert_same((causal | bits).dense(), window_loop(3, 3, None, 0, 0) | bits)
    assert_same((bits & causal).dense(), bits)


# Errors: typed (SelfAttnError subclasses) with a message that names the problem.


@pytest.mark.parametrize(
    "build,error,words",
    [
        (lambda: SlidingWindowMask(4, left=-1), OptionError, "left size must be an integer >= 0"),
        (lambda: SlidingWindowMask(4, left=1.5), OptionError, "left size must be an integer >= 0"),
        (lambda: SlidingWindowMask(4, left=2, right=-1), OptionError, "right size must be an integer >= 0"),
        (lambda: SlidingWindowMask(4, left=True), OptionError, "left size"),
        (lambda: CausalMask(4, align="middle"), OptionError, "unknown causal alignment 'middle'"),
        (lambda: CausalMask(-1), ShapeError, "q_len must be an integer >= 0"),
        (lambda: CausalMask(3, 2.0), ShapeError, "kv_len must be an integer >= 0"),
        (lambda: PaddingMask([[1, 2]]), ShapeError, "1-D sequence of integers"),
        (lambda: PaddingMask([1.5]), ShapeError, "1-D sequence of integers"),
        (lambda: PaddingMask([2, -1]), ShapeError, "key lengths must be >= 0"),
        (lambda: PaddingMask([5, 2], 3), ShapeError, "a key length (5) exceeds kv_len (3)"),
        (lambda: DocumentMask(torch.tensor([], dtype=torch.long)), ShapeError, "at least one document"),
        (lambda: DocumentMask([2, -1]), ShapeError, "length >= 0"),
        (lambda: DocumentMask([1.0, 2.0]), ShapeError, "lengths must be a 1-D list"),
        (lambda: DocumentMask("ab"), ShapeError, "lengths must be a list of document lengths"),
        (lambda: DocumentMask([1, 2], [3]), ShapeError, "same documents: 2 and 1"),
        (lambda: CausalMask(3, 4) & CausalMask(3, 5), ShapeError, "different sizes"),
        (lambda: CausalMask(3) | DocumentMask([1, 1]), ShapeError, "different sizes"),
        (lambda: CausalMask(3) & 5, ShapeError, "only with other masks or bool tensors, got int"),
        (lambda: CausalMask(3) & torch.zeros(3, 3), ShapeError, "got Tensor"),
        (lambda: PaddingMask([1, 2], 4) & DenseMask(torch.ones(3, 1, 4, 4, dtype=torch.bool)), ShapeError,
         "do not broadcast"),
        (lambda: DenseMask(torch.ones(3, 3)), ShapeError, "bool tensor"),
        (lambda: combine_masks(CausalMask(3), torch.zeros(3, 3)), ShapeError, "float mask cannot join"),
        (lambda: PaddingMask([1, 2], 4).block_states(2, 2), OptionError, "give q_len"),
    ],
)
def test_errors_are_typed_and_clear(build, error, words):
    with pytest.raises(error) as caught:
        build()
    assert isinstance(caught.value, SelfAttnError) and isinstance(caught.value, ValueError)
    assert words in str(caught.value)
    assert "\n" not in str(caught.value)


def test_check_size_refuses_other_lengths():
    CausalMask(3, 5).check_size(3, 5)
    PaddingMask([2, 4], 5).check_size(7, 5)  # the same for every query row: any q_len fits
    for mask, sizes in ((CausalMask(3, 5), (5, 3)), (DocumentMask([2, 2]), (4, 5)), (PaddingMask([1], 5), (2, 4))):
        with pytest.raises(ShapeError, match="the mask is for q_len x kv_len"):
            mask.check_size(*sizes)
