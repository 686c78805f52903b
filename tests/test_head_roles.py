"""Head roles on constructed attention patterns whose answer is known, and on random ones.

The reference here is the definition itself, written out with plain loops and math.log2
(``reference_shares``, ``reference_focus``, ``reference_role``, ``reference_entropy``),
not the vectorised code under test.
"""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from selfattn.errors import ShapeError
from selfattn.analysis.head_roles import (
    PARTS,
    PATTERNS,
    ROLE_THRESHOLD,
    ROLES,
    HeadRole,
    TokenFocus,
    classify_head,
    classify_heads,
)

SPECIAL = {"[CLS]", "[SEP]", "[PAD]"}
SENTENCE = ["[CLS]", "the", "cat", "sat", "on", "mats", "[SEP]"]  # 5 words between the specials
WORDS = ["a", "b", "c", "d", "e", "f", "g", "h"]  # no specials at all


def word_rows(tokens):
    rows = [i for i, t in enumerate(tokens) if t not in SPECIAL]
    return rows or list(range(len(tokens)))


def reference_shares(w, tokens):
    """The five parts, straight from the definition: every key of every read row goes to one part."""
    n, rows = len(tokens), word_rows(tokens)
    totals = dict.fromkeys(["previous token", "next token", "self", "[CLS]/[SEP]", "other"], 0.0)
    for i in rows:
        for j in range(n):
            if tokens[j] in SPECIAL:
                part = "[CLS]/[SEP]"
            elif j == i:
                part = "self"
            elif j == i - 1:
                part = "previous token"
            elif j == i + 1:
                part = "next token"
            else:
                part = "other"
            totals[part] += w[i][j]
    return {part: total / len(rows) for part, total in totals.items()}


def reference_focus(w, tokens):
    """(index, share) of the word the other words give the most weight on average, or None."""
    words = [i for i, t in enumerate(tokens) if t not in SPECIAL]
    if len(words) < 2:
        return None
    best = None
    for t in words:
        share = sum(w[i][t] for i in words if i != t) / (len(words) - 1)
        if best is None or share > best[1]:  # strictly greater: the first of equals stays
            best = (t, share)
    return best


def reference_role(w, tokens):
    """The role by its rule: a named part at the threshold, else one token, else spread."""
    shares, focus = reference_shares(w, tokens), reference_focus(w, tokens)
    best = max(shares[p] for p in ["previous token", "next token", "self", "[CLS]/[SEP]"])
    if best >= ROLE_THRESHOLD:
        return next(p for p in ["previous token", "next token", "self", "[CLS]/[SEP]"] if shares[p] == best)
    return "one token" if focus and focus[1] >= ROLE_THRESHOLD else "spread"


def reference_entropy(w, tokens):
    rows = word_rows(tokens)
    return sum(-sum(p * math.log2(p) for p in w[i] if p > 0) for i in rows) / len(rows)


def shifted(n, offset):
    """Row i puts all its weight on key i + offset; rows with no such key look at themselves."""
    w = torch.zeros(n, n, dtype=torch.float64)
    for i in range(n):
        j = i + offset
        w[i, j if 0 <= j < n else i] = 1.0
    return w


def test_previous_token_head():
    role = classify_head(shifted(len(SENTENCE), -1), SENTENCE)
    # 5 words: 4 look at the word before; the first one's previous key is [CLS], under [CLS]/[SEP].
    assert role.role == "previous token" and role.share == pytest.approx(4 / 5)
    assert role.shares == pytest.approx(
        {"previous token": 4 / 5, "next token": 0.0, "self": 0.0, "[CLS]/[SEP]": 1 / 5, "other": 0.0}
    )
    assert role.entropy == 0.0 and role.normalized_entropy == 0.0
    assert role.target is None


def test_previous_token_without_specials_counts_row_zero_as_self():
    w = shifted(len(WORDS), -1)  # row 0 has no previous key and looks at itself
    role = classify_head(w, WORDS)
    assert (role.role, role.share) == ("previous token", pytest.approx(7 / 8))
    assert role.shares["self"] == pytest.approx(1 / len(WORDS))


def test_next_token_head():
    role = classify_head(shifted(len(SENTENCE), 1), SENTENCE)
    assert (role.role, role.share) == ("next token", pytest.approx(4 / 5))
    assert role.shares["[CLS]/[SEP]"] == pytest.approx(1 / 5)  # the last word looks at [SEP]


@pytest.mark.parametrize("offset", [-1, 0, 1, 2, 3])
@pytest.mark.parametrize("tokens", [SENTENCE, WORDS])
def test_the_parts_add_up_to_one(offset, tokens):
    role = classify_head(shifted(len(tokens), offset), tokens)
    assert set(role.shares) == set(PARTS)
    assert sum(role.shares.values()) == pytest.approx(1.0, abs=1e-12)


def looking_at(tokens, target, on_target=1.0, rest_on=0):
    """Every row puts ``on_target`` on key ``target`` and the rest on key ``rest_on``."""
    n = len(tokens)
    w = torch.zeros(n, n, dtype=torch.float64)
    w[:, target] = on_target
    w[:, rest_on] += 1 - on_target
    return w


def test_every_word_looking_at_cat_is_a_one_token_head():
    role = classify_head(looking_at(SENTENCE, 2), SENTENCE)  # SENTENCE[2] == "cat"
    assert role.role == "one token" and role.share == 1.0
    assert role.target == TokenFocus(2, "cat", 1.0) == role.focus
    # 'the' sees cat as next, 'sat' as previous, cat itself as self; 'on' and 'mats' as other.
    assert role.shares == pytest.approx(
        {"previous token": 1 / 5, "next token": 1 / 5, "self": 1 / 5, "[CLS]/[SEP]": 0.0, "other": 2 / 5}
    )
    assert role.entropy == 0.0


def test_one_token_share_leaves_out_the_words_own_row():
    # cat's own row looks at [CLS]; the four other words put 0.6 on cat and 0.4 on [CLS].
    w = looking_at(SENTENCE, 2, on_target=0.6)
    w[2] = 0.0
    w[2, 0] = 1.0
    role = classify_head(w, SENTENCE)
    assert role.shares["[CLS]/[SEP]"] == pytest.approx((4 * 0.4 + 1) / 5)  # 0.52: a named part comes first
    assert role.role == "[CLS]/[SEP]" and role.focus == TokenFocus(2, "cat", pytest.approx(0.6))
    assert role.target is None  # only a "one token" head has a target
    w[:, 0], w[:, 2] = 0.45, 0.55  # now [CLS]/[SEP] holds 45% and cat 55%
    role = classify_head(w, SENTENCE)
    assert (role.role, role.share, role.target.token) == ("one token", pytest.approx(0.55), "cat")


def test_one_token_threshold_is_inclusive():
    # Other rows: 0.5 (or 0.499) on word 3 and the rest on themselves; word 3's own row is uniform.
    n = len(WORDS)
    for on_target, expected in [(0.5, "one token"), (0.499, "spread")]:
        w = torch.eye(n, dtype=torch.float64) * (1 - on_target)
        w[:, 3] += on_target
        w[3] = 1 / n
        role = classify_head(w, WORDS)
        assert role.role == expected and role.share == pytest.approx(on_target)
        assert role.shares["self"] < ROLE_THRESHOLD


def test_looking_at_a_special_token_is_not_one_token():
    role = classify_head(looking_at(SENTENCE, len(SENTENCE) - 1), SENTENCE)  # everyone on [SEP]
    assert role.role == "[CLS]/[SEP]" and role.focus.share == 0.0


def test_one_token_ties_go_to_the_first_word():
    # Half of every row on 'cat' (2), half on 'on' (4): equal focus, the earlier word wins.
    w = looking_at(SENTENCE, 2, on_target=0.5, rest_on=4)
    role = classify_head(w, SENTENCE)
    assert role.focus == TokenFocus(2, "cat", pytest.approx(0.5))  # 'on' also gets 0.5 from the other four


def test_self_head():
    role = classify_head(torch.eye(len(SENTENCE)), SENTENCE)
    assert (role.role, role.share, role.entropy) == ("self", 1.0, 0.0)


@pytest.mark.parametrize("column", [0, len(SENTENCE) - 1])
def test_all_weight_on_cls_or_sep(column):
    w = torch.zeros(len(SENTENCE), len(SENTENCE))
    w[:, column] = 1.0
    role = classify_head(w, SENTENCE)
    assert (role.role, role.share) == ("[CLS]/[SEP]", 1.0)
    assert role.runner_up[1] == 0.0  # [CLS] is nobody's previous word, [SEP] nobody's next


def test_weight_split_between_cls_and_sep_counts_together():
    n = len(SENTENCE)
    w = torch.zeros(n, n)
    w[:, 0], w[:, -1] = 0.3, 0.7
    assert classify_head(w, SENTENCE).shares["[CLS]/[SEP]"] == pytest.approx(1.0)


@pytest.mark.parametrize("n", [3, 5, 8])  # with 2 tokens, 1/2 on the other one already reaches the threshold
def test_uniform_head_is_spread_with_normalized_entropy_one(n):
    tokens = WORDS[:n]
    role = classify_head(torch.full((n, n), 1 / n), tokens)
    assert role.role == "spread"
    assert role.entropy == pytest.approx(math.log2(n), abs=1e-12)
    assert role.normalized_entropy == pytest.approx(1.0, abs=1e-12)
    assert role.share == pytest.approx(1 / n)


def mixed(n, on_self):
    """Each row: ``on_self`` on itself, the rest spread evenly over the other keys."""
    w = torch.full((n, n), (1 - on_self) / (n - 1), dtype=torch.float64)
    w.fill_diagonal_(on_self)
    return w


def test_mix_below_threshold_is_spread():
    role = classify_head(mixed(len(WORDS), 0.45), WORDS)
    assert role.role == "spread" and role.share == pytest.approx(0.45)
    assert role.runner_up == ("self", pytest.approx(0.45))  # for spread: the strongest pattern


def test_threshold_is_inclusive():
    assert ROLE_THRESHOLD == 0.5
    assert classify_head(mixed(len(WORDS), 0.5), WORDS).role == "self"
    assert classify_head(mixed(len(WORDS), 0.499), WORDS).role == "spread"


def test_entropy_matches_the_formula_on_a_known_row():
    # Every word row is (1/2, 1/4, 1/4, 0, ...): H = 1/2 + 2 * 1/4 * 2 = 1.5 bits.
    n = len(WORDS)
    w = torch.zeros(n, n)
    for i in range(n):
        w[i, i], w[i, (i + 1) % n], w[i, (i + 2) % n] = 0.5, 0.25, 0.25
    role = classify_head(w, WORDS)
    assert role.entropy == pytest.approx(1.5, abs=1e-6)
    assert role.normalized_entropy == pytest.approx(1.5 / 3, abs=1e-6)  # log2 8 = 3


def test_special_rows_are_not_read():
    # Words attend to themselves; [CLS] and [SEP] rows are uniform. Only the word rows count.
    n = len(SENTENCE)
    w = torch.eye(n)
    w[0], w[-1] = 1 / n, 1 / n
    role = classify_head(w, SENTENCE)
    assert (role.role, role.share, role.entropy) == ("self", 1.0, 0.0)


def test_text_without_words_uses_every_row():
    role = classify_head(torch.tensor([[0.5, 0.5], [0.2, 0.8]]), ["[CLS]", "[SEP]"])
    assert role.role == "[CLS]/[SEP]" and role.share == pytest.approx(1.0)
    assert role.shares["previous token"] == 0.0 and role.shares["next token"] == 0.0
    assert role.entropy == pytest.approx(reference_entropy([[0.5, 0.5], [0.2, 0.8]], ["[CLS]", "[SEP]"]))


def test_one_word_has_no_previous_or_next():
    role = classify_head(torch.tensor([[1.0, 0, 0], [0.1, 0.6, 0.3], [0, 0, 1.0]]), ["[CLS]", "cat", "[SEP]"])
    assert role.shares == pytest.approx(
        {"previous token": 0.0, "next token": 0.0, "self": 0.6, "[CLS]/[SEP]": 0.4, "other": 0.0}
    )
    assert role.role == "self" and role.focus is None  # one word: no other words to look at it


def test_a_single_token():
    role = classify_head(torch.ones(1, 1), ["solo"])
    assert (role.role, role.entropy, role.normalized_entropy) == ("self", 0.0, 0.0)


def test_ties_go_to_the_pattern_listed_first():
    # Two words looking at each other: previous for one, next for the other.
    role = classify_head(torch.tensor([[0.0, 1.0], [1.0, 0.0]]), ["x", "y"])
    assert role.shares["previous token"] == role.shares["next token"] == 0.5
    assert role.role == "previous token" == ROLES[0]
    assert role.focus.share == 1.0  # also "one token", but the named parts come first


def test_float32_rounding_never_gives_a_share_above_one():
    w = torch.zeros(3, 3, dtype=torch.float32)
    w[:, 0] = 1.0000001  # a float32 softmax row can sum to a hair over 1
    role = classify_head(w, ["[CLS]", "x", "[SEP]"])
    assert role.share == 1.0 and role.entropy == 0.0


def test_classify_heads_covers_every_layer_and_head():
    n = len(SENTENCE)
    patterns = [shifted(n, -1), shifted(n, 1), torch.eye(n, dtype=torch.float64)]
    stack = torch.stack([torch.stack(patterns), torch.stack(patterns[::-1])])  # (2, 3, n, n)
    roles = classify_heads(stack, SENTENCE)
    assert [[r.role for r in layer] for layer in roles] == [
        ["previous token", "next token", "self"],
        ["self", "next token", "previous token"],
    ]
    assert classify_heads(list(stack), SENTENCE) == roles  # a tuple of per-layer tensors, as ModelOutput gives
    assert all(isinstance(r, HeadRole) for layer in roles for r in layer)


@pytest.mark.parametrize(
    "weights, tokens, message",
    [
        (torch.ones(2, 3) / 3, ["a", "b"], "square"),
        (torch.ones(1, 2, 2) / 2, ["a", "b"], "square"),
        (torch.zeros(0, 0), [], "non-empty"),
        (torch.eye(3), ["a", "b"], "2 tokens"),
        (torch.ones(2, 2), ["a", "b"], "sum to 1"),
        (torch.tensor([[1.5, -0.5], [0.0, 1.0]]), ["a", "b"], "non-negative"),
        (torch.tensor([[float("nan"), 1.0], [0.0, 1.0]]), ["a", "b"], "finite"),
        ("not numbers", ["a"], "numeric"),
        (torch.eye(2), "ab", "list of strings"),
    ],
)
def test_bad_weights_are_refused(weights, tokens, message):
    with pytest.raises(ShapeError, match=message):
        classify_head(weights, tokens)


def test_bad_stacks_are_refused():
    with pytest.raises(ShapeError, match="layers, heads"):
        classify_heads(torch.eye(3)[None], ["a", "b", "c"])  # (1, 3, 3): no heads axis
    with pytest.raises(ShapeError, match="differ in shape"):
        classify_heads([torch.eye(2)[None], torch.eye(3)[None]], ["a", "b"])
    assert issubclass(ShapeError, ValueError)


@st.composite
def attention_and_tokens(draw):
    n = draw(st.integers(1, 10))
    raw = draw(arrays(np.float64, (n, n), elements=st.floats(0, 1) | st.just(0.0)))
    raw[raw.sum(axis=1) == 0] = 1.0  # an all-zero row becomes uniform before normalising
    tokens = draw(st.lists(st.sampled_from(["[CLS]", "[SEP]", "w", "x", "##y"]), min_size=n, max_size=n))
    return raw / raw.sum(axis=1, keepdims=True), tokens


@settings(max_examples=200, deadline=None)
@given(attention_and_tokens())
def test_random_heads_follow_the_definition(case):
    w, tokens = case
    role = classify_head(w, tokens)
    n = len(tokens)
    assert role.role in ROLES and set(role.shares) == set(PARTS)
    assert all(0.0 <= s <= 1.0 for s in role.shares.values())
    assert sum(role.shares.values()) == pytest.approx(1.0, abs=1e-9)
    assert 0.0 <= role.entropy <= math.log2(n) + 1e-12 and 0.0 <= role.normalized_entropy <= 1.0
    assert role.shares == pytest.approx(reference_shares(w.tolist(), tokens), abs=1e-12)
    assert role.entropy == pytest.approx(reference_entropy(w.tolist(), tokens), abs=1e-9)
    focus = reference_focus(w.tolist(), tokens)
    if focus is None:
        assert role.focus is None
    else:
        assert role.focus.share == pytest.approx(focus[1], abs=1e-12)
        assert role.focus.token == tokens[role.focus.index]
        if role.focus.index != focus[0]:  # only a float tie may pick another word
            assert abs(reference_focus_share(w.tolist(), tokens, role.focus.index) - focus[1]) < 1e-12
    expected = reference_role(w.tolist(), tokens)
    best = max(role.shares[p] for p in PATTERNS)
    if abs(best - ROLE_THRESHOLD) > 1e-12 and (focus is None or abs(focus[1] - ROLE_THRESHOLD) > 1e-12):
        if expected in PATTERNS:  # two parts equal up to float rounding may swap
            assert role.role in PATTERNS and role.shares[role.role] == pytest.approx(best, abs=1e-12)
        else:
            assert role.role == expected
    if role.role in PATTERNS:
        assert role.share == role.shares[role.role] == best
    elif role.role == "one token":
        assert role.share == role.focus.share and role.target == role.focus
    else:
        assert role.share == pytest.approx(max(best, role.focus.share if role.focus else 0.0))


def reference_focus_share(w, tokens, t):
    words = [i for i, tok in enumerate(tokens) if tok not in SPECIAL]
    return sum(w[i][t] for i in words if i != t) / (len(words) - 1)
