"""Head roles on constructed attention patterns whose answer is known, and on random ones.

The reference here is the definition itself, written out with plain loops and math.log2
(``reference_shares``, ``reference_entropy``), not the vectorised code under test.
"""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from selfattn.errors import ShapeError
from selfattn.models.head_roles import PATTERNS, ROLE_THRESHOLD, ROLES, HeadRole, classify_head, classify_heads

SPECIAL = {"[CLS]", "[SEP]", "[PAD]"}
SENTENCE = ["[CLS]", "the", "cat", "sat", "on", "mats", "[SEP]"]  # 5 words between the specials
WORDS = ["a", "b", "c", "d", "e", "f", "g", "h"]  # no specials at all


def word_rows(tokens):
    rows = [i for i, t in enumerate(tokens) if t not in SPECIAL]
    return rows or list(range(len(tokens)))


def reference_shares(w, tokens):
    """The four patterns, straight from the definition, one row at a time."""
    n, rows = len(tokens), word_rows(tokens)
    is_word = [t not in SPECIAL for t in tokens]

    def mean(values):
        return sum(values) / len(values) if values else 0.0

    return {
        "previous token": mean([w[i][i - 1] for i in rows if i >= 1 and is_word[i - 1]]),
        "next token": mean([w[i][i + 1] for i in rows if i + 1 < n and is_word[i + 1]]),
        "self": mean([w[i][i] for i in rows]),
        "[CLS]/[SEP]": mean([sum(w[i][j] for j in range(n) if not is_word[j]) for i in rows]),
    }


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
    assert role.role == "previous token" and role.share == 1.0
    # The first word's previous key is [CLS]: it is not a word, so that row counts under [CLS]/[SEP].
    assert role.shares["[CLS]/[SEP]"] == pytest.approx(1 / 5)
    assert role.shares["next token"] == 0.0 and role.shares["self"] == 0.0
    assert role.entropy == 0.0 and role.normalized_entropy == 0.0


def test_previous_token_without_specials_skips_row_zero():
    w = shifted(len(WORDS), -1)  # row 0 has no previous key and looks at itself
    role = classify_head(w, WORDS)
    assert (role.role, role.share) == ("previous token", 1.0)
    assert role.shares["self"] == pytest.approx(1 / len(WORDS))


def test_next_token_head():
    role = classify_head(shifted(len(SENTENCE), 1), SENTENCE)
    assert (role.role, role.share) == ("next token", 1.0)
    assert role.shares["[CLS]/[SEP]"] == pytest.approx(1 / 5)  # the last word looks at [SEP]


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
    assert role.shares == pytest.approx({"previous token": 0.0, "next token": 0.0, "self": 0.6, "[CLS]/[SEP]": 0.4})
    assert role.role == "self"


def test_a_single_token():
    role = classify_head(torch.ones(1, 1), ["solo"])
    assert (role.role, role.entropy, role.normalized_entropy) == ("self", 0.0, 0.0)


def test_ties_go_to_the_pattern_listed_first():
    # Two words looking at each other: previous for one, next for the other.
    role = classify_head(torch.tensor([[0.0, 1.0], [1.0, 0.0]]), ["x", "y"])
    assert role.shares["previous token"] == role.shares["next token"] == 1.0
    assert role.role == "previous token" == ROLES[0]


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
    assert role.role in ROLES and set(role.shares) == set(PATTERNS)
    assert all(0.0 <= s <= 1.0 for s in role.shares.values())
    assert 0.0 <= role.entropy <= math.log2(n) + 1e-12 and 0.0 <= role.normalized_entropy <= 1.0
    assert role.shares == pytest.approx(reference_shares(w.tolist(), tokens), abs=1e-12)
    assert role.entropy == pytest.approx(reference_entropy(w.tolist(), tokens), abs=1e-9)
    best = max(role.shares.values())
    assert role.share == best
    assert (role.role == "spread") == (best < ROLE_THRESHOLD)
    if role.role != "spread":
        assert role.shares[role.role] == best
