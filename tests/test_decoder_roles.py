"""Decoder head roles against their definitions, written out here with plain loops.

The references (``ref_*``) follow TransformerLens's head detector as its formulas read:
the previous-token diagonal, duplicates as equal ids at earlier keys, induction as the
duplicate pattern shifted one column right (then kept causal), and the "mul" score
sum(a * P) / sum(a) after zeroing the excluded weights. They use lists and math.log, not
the vectorised code under test.
"""

import doctest
import inspect
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from selfattn.errors import OptionError, ShapeError
from selfattn.analysis import decoder_roles
from selfattn.analysis.decoder_roles import (
    DECODER_PATTERNS,
    DECODER_ROLES,
    DecoderHeadRole,
    classify_decoder_heads,
    detect_score,
    duplicate_token_pattern,
    first_token_pattern,
    induction_pattern,
    induction_probe,
    induction_probe_score,
    previous_token_pattern,
)


def ref_previous(seq):
    return [[1 if j == i - 1 else 0 for j in range(seq)] for i in range(seq)]


def ref_duplicate(ids):
    n = len(ids)
    return [[1 if j < i and ids[j] == ids[i] else 0 for j in range(n)] for i in range(n)]


def ref_induction(ids):
    """TransformerLens's construction: the duplicate pattern moved one column right, column 0 empty, kept causal."""
    n, dup = len(ids), ref_duplicate(ids)
    shifted = [[dup[i][k - 1] if k >= 1 else 0 for k in range(n)] for i in range(n)]
    return [[shifted[i][k] if k <= i else 0 for k in range(n)] for i in range(n)]


def ref_induction_by_occurrence(ids):
    """The same rule read the other way: for each earlier occurrence j of ids[i], the key j + 1."""
    n = len(ids)
    p = [[0] * n for _ in range(n)]
    for i in range(n):
        for j in range(i):
            if ids[j] == ids[i]:
                p[i][j + 1] = 1
    return p


def ref_first(seq):
    return [[1 if j == 0 else 0 for j in range(seq)] for _ in range(seq)]


def ref_score(w, p, exclude_bos=False, exclude_current=False, first_row=0):
    """sum(a' * P) / sum(a') over rows first_row.., a' = a without the excluded weights; 0 when nothing is left."""
    on_pattern = total = 0.0
    for i in range(first_row, len(w)):
        for j in range(len(w)):
            if (exclude_bos and j == 0) or (exclude_current and j == i):
                continue
            on_pattern += w[i][j] * p[i][j]
            total += w[i][j]
    return on_pattern / total if total > 0 else 0.0


def ref_entropy_nats(w):
    rows = range(1, len(w))
    if not rows:
        return 0.0
    return sum(-sum(x * math.log(x) for x in w[i] if x > 0) for i in rows) / len(rows)


def ref_probe_score(w, length, offset):
    return sum(w[t][t - length + 1] for t in range(offset + length, offset + 2 * length)) / length


def as_lists(pattern):
    assert pattern.dtype == torch.bool
    return pattern.long().tolist()


def previous_token_head(seq):
    """Row 0 on itself (its only key), every other row on the key before it."""
    w = torch.zeros(seq, seq, dtype=torch.float64)
    w[0, 0] = 1.0
    for i in range(1, seq):
        w[i, i - 1] = 1.0
    return w


@st.composite
def causal_weights(draw, min_seq=1, max_seq=7, vocab=3):
    """Random non-negative rows over keys j <= i, normalised to sum 1, with some exact zeros; and random ids."""
    n = draw(st.integers(min_seq, max_seq))
    raw = draw(arrays(np.float64, (n, n), elements=st.sampled_from([0.0, 0.0, 0.25, 1.0]) | st.floats(0.0, 1.0)))
    w = np.tril(raw)
    for i in range(n):
        if w[i].sum() == 0:
            w[i, i] = 1.0
    w = w / w.sum(axis=1, keepdims=True)
    ids = draw(st.lists(st.integers(0, vocab - 1), min_size=n, max_size=n))
    return torch.tensor(w), ids


# -- patterns -------------------------------------------------------------------------


def test_patterns_on_a_hand_made_sequence():
    ids = [3, 1, 3, 3, 1]
    assert as_lists(previous_token_pattern(5)) == [
        [0, 0, 0, 0, 0],
        [1, 0, 0, 0, 0],
        [0, 1, 0, 0, 0],
        [0, 0, 1, 0, 0],
        [0, 0, 0, 1, 0],
    ]
    assert as_lists(duplicate_token_pattern(ids)) == [
        [0, 0, 0, 0, 0],
        [0, 0, 0, 0, 0],
        [1, 0, 0, 0, 0],
        [1, 0, 1, 0, 0],
        [0, 1, 0, 0, 0],
    ]
    # Row 3 (the second 3 in a row): after the 3 at 0 comes key 1, after the 3 at 2 comes key 3 itself.
    assert as_lists(induction_pattern(ids)) == [
        [0, 0, 0, 0, 0],
        [0, 0, 0, 0, 0],
        [0, 1, 0, 0, 0],
        [0, 1, 0, 1, 0],
        [0, 0, 1, 0, 0],
    ]
    assert as_lists(first_token_pattern(3)) == [[1, 0, 0], [1, 0, 0], [1, 0, 0]]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=9))
def test_patterns_follow_their_definitions(ids):
    n = len(ids)
    assert as_lists(previous_token_pattern(n)) == ref_previous(n)
    assert as_lists(first_token_pattern(n)) == ref_first(n)
    assert as_lists(duplicate_token_pattern(ids)) == ref_duplicate(ids)
    assert as_lists(induction_pattern(ids)) == ref_induction(ids) == ref_induction_by_occurrence(ids)
    assert as_lists(induction_pattern(torch.tensor(ids))) == ref_induction(ids)  # a tensor of ids reads the same
    for pattern in (previous_token_pattern(n), duplicate_token_pattern(ids), induction_pattern(ids), first_token_pattern(n)):
        assert not bool(pattern.triu(diagonal=1).any())  # causal: no key after the query


# -- detect_score -----------------------------------------------------------------------


def test_score_counts_every_row_as_transformerlens():
    uniform = torch.tensor([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [1 / 3, 1 / 3, 1 / 3]], dtype=torch.float64)
    expected = (0.5 + 1 / 3) / 3  # rows 0..2 all in the denominator, row 0 has no previous token
    assert detect_score(uniform, previous_token_pattern(3)) == pytest.approx(expected, abs=1e-12)
    assert detect_score(uniform, previous_token_pattern(3), first_row=1) == pytest.approx((0.5 + 1 / 3) / 2, abs=1e-12)
    # exclude_bos zeroes column 0 in both sums: (1/3) / (0.5 + 2/3)
    assert detect_score(uniform, previous_token_pattern(3), exclude_bos=True) == pytest.approx((1 / 3) / (0.5 + 2 / 3), abs=1e-12)


@settings(max_examples=150, deadline=None)
@given(causal_weights(), st.booleans(), st.booleans(), st.integers(0, 1))
def test_score_matches_the_loop_reference(case, exclude_bos, exclude_current, first_row):
    w, ids = case
    wl = w.tolist()
    for make, ref in (
        (lambda: previous_token_pattern(len(ids)), lambda: ref_previous(len(ids))),
        (lambda: duplicate_token_pattern(ids), lambda: ref_duplicate(ids)),
        (lambda: induction_pattern(ids), lambda: ref_induction(ids)),
        (lambda: first_token_pattern(len(ids)), lambda: ref_first(len(ids))),
    ):
        got = detect_score(w, make(), exclude_bos, exclude_current, first_row=first_row)
        assert isinstance(got, float) and 0.0 <= got <= 1.0
        assert got == pytest.approx(ref_score(wl, ref(), exclude_bos, exclude_current, first_row), abs=1e-12)


@settings(max_examples=40, deadline=None)
@given(st.lists(causal_weights(min_seq=4, max_seq=4), min_size=6, max_size=6))
def test_score_of_stacked_heads_is_each_heads_score(cases):
    stacked = torch.stack([w for w, _ in cases]).reshape(2, 3, 4, 4).to(torch.float32)  # (layers, heads, seq, seq)
    pattern = induction_pattern(cases[0][1])
    scores = detect_score(stacked, pattern, exclude_current=True)
    assert scores.shape == (2, 3)
    expected = torch.tensor([ref_score(w.to(torch.float32).tolist(), pattern.long().tolist(), False, True) for w, _ in cases])
    torch.testing.assert_close(scores, expected.reshape(2, 3).to(torch.float64), rtol=0, atol=1e-6)


def test_nothing_left_to_count_scores_zero_not_nan():
    on_first = torch.zeros(3, 3)
    on_first[:, 0] = 1.0
    assert detect_score(on_first, first_token_pattern(3)) == 1.0
    assert detect_score(on_first, first_token_pattern(3), exclude_bos=True) == 0.0
    assert detect_score(on_first, first_token_pattern(3), first_row=3) == 0.0


# -- exact heads ------------------------------------------------------------------------


def test_a_previous_token_head():
    ids = [5, 7, 5, 7, 5]
    w = previous_token_head(5)
    assert detect_score(w, previous_token_pattern(5)) == pytest.approx(4 / 5, abs=1e-15)  # TransformerLens: all rows
    head = classify_decoder_heads(w[None, None], ids)[0][0]
    assert head.role == "previous token"
    assert head.previous_token == 1.0
    assert head.induction == pytest.approx(3 / 4, abs=1e-15)  # rows 2, 3, 4: ids[i - 2] = ids[i]
    assert head.duplicate_token == 0.0  # no token repeats at once
    assert head.first_token == pytest.approx(1 / 4, abs=1e-15)  # row 1's previous token is token 0
    assert head.entropy == 0.0


def test_a_first_token_head():
    ids = [0, 4, 4, 2, 4, 1]
    w = torch.zeros(6, 6)
    w[:, 0] = 1.0
    assert detect_score(w, first_token_pattern(6)) == 1.0
    head = classify_decoder_heads(w[None, None], ids)[0][0]
    assert head.role == "first token" and head.first_token == 1.0
    assert head.previous_token == pytest.approx(1 / 5, abs=1e-7)  # row 1 only
    assert head.duplicate_token == 0.0 and head.induction == 0.0 and head.entropy == 0.0


def test_a_uniform_head_is_mixed_with_the_entropy_of_its_rows():
    seq = 6
    w = torch.tril(torch.ones(seq, seq))
    w = w / w.sum(dim=-1, keepdim=True)
    head = classify_decoder_heads(w[None, None], list(range(seq)))[0][0]
    assert head.role == "mixed"
    assert head.entropy == pytest.approx(sum(math.log(i + 1) for i in range(1, seq)) / (seq - 1), abs=1e-6)


def test_one_token_has_nothing_to_read():
    head = classify_decoder_heads(torch.ones(1, 1, 1, 1), [7])[0][0]
    assert head == DecoderHeadRole("mixed", 0.0, 0.0, 0.0, 0.0, 0.0)


@settings(max_examples=100, deadline=None)
@given(causal_weights(), st.sampled_from([0.0, 0.25, 0.4, 0.9]))
def test_classify_follows_the_definition(case, threshold):
    w, ids = case
    wl, n = w.tolist(), len(ids)
    refs = [ref_previous(n), ref_duplicate(ids), ref_induction(ids), ref_first(n)]
    expected = [ref_score(wl, p, first_row=1) for p in refs]
    layers = classify_decoder_heads([w[None], w[None]], ids, threshold=threshold)  # 2 layers of 1 head
    assert len(layers) == 2 and all(len(layer) == 1 for layer in layers)
    head = layers[1][0]
    assert list(head.scores) == list(DECODER_PATTERNS)
    assert list(head.scores.values()) == pytest.approx(expected, abs=1e-12)
    assert head.entropy == pytest.approx(ref_entropy_nats(wl), abs=1e-9) and head.entropy >= 0.0
    assert head.role in DECODER_ROLES
    best = max(expected)
    if n > 1 and abs(best - threshold) > 1e-9:
        if best < threshold:
            assert head.role == "mixed"
        else:
            assert head.scores[head.role] == pytest.approx(best, abs=1e-12)  # equal scores may pick either


# -- the probe ---------------------------------------------------------------------------


@pytest.mark.parametrize("first_id", [None, 0, 17])
@pytest.mark.parametrize("length", [2, 5, 12])
def test_probe_structure(first_id, length):
    avoid = (1, 2)
    probe = induction_probe(40, length, seed=3, first_id=first_id, avoid=avoid)
    offset = 0 if first_id is None else 1
    assert probe.dtype == torch.int64 and probe.shape == (offset + 2 * length,)
    if first_id is not None:
        assert int(probe[0]) == first_id
    half = probe[offset : offset + length].tolist()
    assert probe[offset + length :].tolist() == half
    assert len(set(half)) == length  # 40 ids are plenty: no repeats
    assert all(0 <= t < 40 and t not in avoid and t != first_id for t in half)


def test_probe_is_seeded():
    assert torch.equal(induction_probe(100, 8, seed=5), induction_probe(100, 8, seed=5))
    others = [induction_probe(100, 8, seed=s) for s in range(1, 6)]
    assert any(not torch.equal(induction_probe(100, 8, seed=0), o) for o in others)


def test_probe_repeats_only_when_the_ids_run_out():
    probe = induction_probe(5, 8, seed=0, avoid=(0,))  # 4 ids for 8 places: two permutations
    half = probe[:8].tolist()
    assert probe[8:].tolist() == half
    assert sorted(half[:4]) == [1, 2, 3, 4] and sorted(half[4:]) == [1, 2, 3, 4]


def test_a_perfect_induction_head_scores_one_on_the_probe():
    length = 5
    ids = induction_probe(30, length, seed=1, first_id=0)
    seq = len(ids)
    w = torch.zeros(seq, seq)
    w[:, 0] = 1.0  # everything outside the second copy rests on the first token
    for t in range(1 + length, seq):
        w[t] = 0.0
        w[t, t - length + 1] = 1.0
    assert float(induction_probe_score(w, length, offset=1)) == 1.0
    # On the probe the induction pattern is exactly these ones: the pattern score is length / seq of it.
    assert detect_score(w, induction_pattern(ids)) == pytest.approx(length / seq, abs=1e-7)
    head = classify_decoder_heads(w[None, None], ids)[0][0]
    assert head.role == "induction"  # 5 of the 10 rows from 1 on each: the tie goes to induction, listed first
    assert head.induction == pytest.approx(0.5, abs=1e-7) and head.first_token == pytest.approx(0.5, abs=1e-7)
    assert classify_decoder_heads(w[None, None], ids, threshold=0.5)[0][0].role == "induction"  # reaching it is enough
    assert classify_decoder_heads(w[None, None], ids, threshold=0.51)[0][0].role == "mixed"


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 4), st.integers(0, 2**16), st.booleans(), st.data())
def test_probe_score_matches_loops_and_the_pattern_score(length, seed, with_first, data):
    ids = induction_probe(20, length, seed=seed, first_id=19 if with_first else None)
    offset, seq = int(with_first), len(ids)
    raw = data.draw(arrays(np.float64, (2, seq, seq), elements=st.floats(0.01, 1.0)))
    w = torch.tensor(np.tril(raw))
    w = w / w.sum(dim=-1, keepdim=True)  # (heads, seq, seq)
    scores = induction_probe_score(w, length, offset)
    assert scores.shape == (2,)
    for h in range(2):
        assert float(scores[h]) == pytest.approx(ref_probe_score(w[h].tolist(), length, offset), abs=1e-12)
        assert detect_score(w[h], induction_pattern(ids)) * seq == pytest.approx(float(scores[h]) * length, abs=1e-9)


# -- bad input ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        lambda: induction_probe(0, 3),
        lambda: induction_probe(10, 1),
        lambda: induction_probe(10, True),
        lambda: induction_probe(10, 3.0),
        lambda: induction_probe(10, 3, seed=-1),
        lambda: induction_probe(10, 3, first_id=10),
        lambda: induction_probe(10, 3, avoid=(11,)),
        lambda: induction_probe(10, 3, avoid="ab"),
        lambda: induction_probe(3, 3, first_id=0, avoid=(1,)),  # only one id left
        lambda: induction_probe_score(torch.eye(4), 1, 0),
        lambda: induction_probe_score(torch.eye(4), 2, -1),
        lambda: previous_token_pattern(0),
        lambda: first_token_pattern(2.5),
        lambda: detect_score(torch.eye(3), first_token_pattern(3), first_row=4),
        lambda: classify_decoder_heads(torch.eye(3)[None, None], [1, 2, 3], threshold=1.5),
    ],
)
def test_bad_options_raise_option_error(call):
    with pytest.raises(OptionError) as error:
        call()
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    "call",
    [
        lambda: detect_score(torch.ones(3), first_token_pattern(3)),  # not 2-D
        lambda: detect_score(torch.ones(3, 4), first_token_pattern(3)),  # not square
        lambda: detect_score(torch.eye(3), first_token_pattern(4)),  # pattern of another length
        lambda: detect_score(torch.eye(3) * -1, first_token_pattern(3)),  # negative
        lambda: detect_score(torch.full((3, 3), float("nan")), first_token_pattern(3)),  # not finite
        lambda: detect_score(torch.eye(3), torch.full((3, 3), 2.0)),  # pattern above 1
        lambda: detect_score([["a"]], [[1]]),  # not numbers
        lambda: induction_probe_score(torch.eye(5), 3, 0),  # too short for the probe
        lambda: classify_decoder_heads(torch.eye(3)[None, None], [1, 2]),  # weights 3 x 3, 2 ids
        lambda: classify_decoder_heads(torch.eye(3)[None], [1, 2, 3]),  # not 4-D
        lambda: classify_decoder_heads(torch.ones(1, 1, 3, 3), [1, 2, 3]),  # rows sum to 3
        lambda: classify_decoder_heads([torch.eye(3)[None], torch.eye(2)[None]], [1, 2, 3]),  # layers differ
        lambda: duplicate_token_pattern([1.0, 2.0]),  # not integers
        lambda: duplicate_token_pattern([[1, 2]]),  # not 1-D
        lambda: induction_pattern([]),  # empty
    ],
)
def test_bad_tensors_raise_shape_error(call):
    with pytest.raises(ShapeError) as error:
        call()
    assert "\n" not in str(error.value)


# -- documentation -----------------------------------------------------------------------


def test_the_docstring_examples_run():
    results = doctest.testmod(decoder_roles, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert results.attempted >= 10 and results.failed == 0


def test_every_public_function_documents_its_arguments():
    pytest.importorskip("griffe", reason="the docs tools are not installed: pip install -e '.[docs]'")
    from test_docstrings import check_function

    public = [f for name, f in vars(decoder_roles).items() if inspect.isfunction(f) and not name.startswith("_") and f.__module__ == decoder_roles.__name__]
    assert len(public) >= 10
    problems = [p for f in public for p in check_function(f, f.__name__)]
    assert not problems, "\n".join(problems)
    assert inspect.getdoc(DecoderHeadRole.scores) and "Attributes:" in inspect.getdoc(DecoderHeadRole)
    for f in public:
        assert "Examples:" in inspect.getdoc(f), f.__name__
