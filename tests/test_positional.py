"""Positional encodings against independent references: the papers' formulas written
out as plain Python loops, complex-number arithmetic, and hand-computed slope lists."""

import cmath
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from selfattn.errors import ConfigError, OptionError, ShapeError
from selfattn.positional import (
    ADDITIVE,
    BIASED,
    POSITIONAL_NAMES,
    ROTARY,
    LearnedPositionalEmbedding,
    alibi_bias,
    alibi_slopes,
    apply_rope,
    check_positional,
    rope_angles,
    sinusoidal_encoding,
)

EXACT64 = dict(rtol=0.0, atol=1e-12)


# ---- sinusoidal -------------------------------------------------------------------


def sinusoid_loop(n: int, d: int, offset: int = 0, base: float = 10000.0) -> torch.Tensor:
    rows = []
    for pos in range(offset, offset + n):
        row = []
        for col in range(d):
            angle = pos / base ** ((col - col % 2) / d)
            row.append(math.sin(angle) if col % 2 == 0 else math.cos(angle))
        rows.append(row)
    return torch.tensor(rows, dtype=torch.float64).reshape(n, d)


@pytest.mark.parametrize("n, d", [(1, 1), (5, 4), (7, 5), (16, 9), (3, 64), (0, 6)])
def test_sinusoidal_matches_the_paper_formula(n, d):
    torch.testing.assert_close(sinusoidal_encoding(n, d, dtype=torch.float64), sinusoid_loop(n, d), **EXACT64)
    torch.testing.assert_close(sinusoidal_encoding(n, d), sinusoid_loop(n, d).float(), rtol=0.0, atol=1e-7)


def test_sinusoidal_float32_stays_accurate_at_large_positions():
    table = sinusoidal_encoding(4, 6, offset=1_000_000)
    assert table.dtype == torch.float32
    torch.testing.assert_close(table.double(), sinusoid_loop(4, 6, offset=1_000_000), rtol=0.0, atol=1e-7)


def test_sinusoidal_offset_is_a_slice_of_a_longer_table():
    full = sinusoidal_encoding(20, 7, base=500.0, dtype=torch.float64)
    torch.testing.assert_close(sinusoidal_encoding(6, 7, base=500.0, offset=11, dtype=torch.float64), full[11:17])


def test_sinusoidal_values_lie_in_minus_one_to_one():
    table = sinusoidal_encoding(300, 33)
    assert table.abs().max().item() <= 1.0


@pytest.mark.parametrize("shift", [1, 3, 17])
def test_sinusoidal_shift_is_a_rotation_of_each_frequency_pair(shift):
    d = 8
    table = sinusoidal_encoding(40, d, dtype=torch.float64)
    for i in range(d // 2):
        omega = 10000.0 ** (-2 * i / d)
        c, s = math.cos(shift * omega), math.sin(shift * omega)
        # (sin, cos) at pos + k = [[cos kw, sin kw], [-sin kw, cos kw]] (sin, cos) at pos
        rotation = torch.tensor([[c, s], [-s, c]], dtype=torch.float64)
        pairs = table[:, 2 * i : 2 * i + 2]  # (40, 2)
        torch.testing.assert_close(pairs[shift:], pairs[:-shift] @ rotation.T, **EXACT64)


# ---- learned ----------------------------------------------------------------------


def test_learned_shape_offset_and_init_scale():
    table = LearnedPositionalEmbedding(2000, 16, generator=torch.Generator().manual_seed(0))
    assert table.weight.shape == (2000, 16)
    assert table(5).shape == (5, 16)
    torch.testing.assert_close(table(4, offset=10), table.weight[10:14], rtol=0.0, atol=0.0)
    assert abs(table.weight.std().item() - 0.02) < 0.001
    assert abs(table.weight.mean().item()) < 0.001


def test_learned_seeded_generator_is_reproducible():
    a = LearnedPositionalEmbedding(8, 4, generator=torch.Generator().manual_seed(7))
    b = LearnedPositionalEmbedding(8, 4, generator=torch.Generator().manual_seed(7))
    c = LearnedPositionalEmbedding(8, 4, generator=torch.Generator().manual_seed(8))
    torch.testing.assert_close(a.weight, b.weight, rtol=0.0, atol=0.0)
    assert not torch.equal(a.weight, c.weight)


def test_learned_rejects_positions_beyond_max_positions():
    table = LearnedPositionalEmbedding(8, 4)
    assert table(8).shape == (8, 4)
    with pytest.raises(ShapeError, match="max_positions is 8"):
        table(3, offset=6)


def test_learned_gradient_reaches_exactly_the_used_rows():
    table = LearnedPositionalEmbedding(6, 3)
    table(3, offset=2).sum().backward()
    expected = torch.zeros(6, 3)
    expected[2:5] = 1.0
    torch.testing.assert_close(table.weight.grad, expected, rtol=0.0, atol=0.0)


# ---- RoPE -------------------------------------------------------------------------


def rope_complex_loop(x: torch.Tensor, positions: list[float], base: float = 10000.0) -> torch.Tensor:
    """One token at a time: z_i = x_2i + 1j x_2i+1 times exp(1j p base^(-2i/d))."""
    seq, d = x.shape
    out = torch.empty(seq, d, dtype=torch.float64)
    for t in range(seq):
        for i in range(d // 2):
            z = complex(x[t, 2 * i].item(), x[t, 2 * i + 1].item())
            z *= cmath.exp(1j * positions[t] * base ** (-2 * i / d))
            out[t, 2 * i], out[t, 2 * i + 1] = z.real, z.imag
    return out


def rope_view_as_complex(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    d = x.shape[-1]
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    turn = torch.polar(torch.ones(len(positions), d // 2, dtype=torch.float64), positions.double()[:, None] * theta)
    z = torch.view_as_complex(x.double().reshape(*x.shape[:-1], d // 2, 2).contiguous())
    return torch.view_as_real(z * turn).reshape(x.shape)


@pytest.mark.parametrize("seq, d, base", [(1, 2, 10000.0), (5, 8, 10000.0), (7, 6, 100.0)])
def test_rope_matches_complex_multiplication(seq, d, base):
    x = torch.randn(seq, d, dtype=torch.float64, generator=torch.Generator().manual_seed(seq * d))
    positions = [3.0 * t + 1 for t in range(seq)]
    got = apply_rope(x, torch.tensor(positions), base=base)
    torch.testing.assert_close(got, rope_complex_loop(x, positions, base), **EXACT64)


def test_rope_with_leading_batch_and_head_axes_keeps_float32():
    x = torch.randn(2, 3, 9, 16, generator=torch.Generator().manual_seed(1))
    got = apply_rope(x, torch.arange(4000, 4009))
    assert got.dtype == torch.float32 and got.shape == x.shape
    torch.testing.assert_close(got.double(), rope_view_as_complex(x, torch.arange(4000, 4009)), rtol=0.0, atol=1e-5)
    torch.testing.assert_close(apply_rope(x), rope_view_as_complex(x, torch.arange(9)).float(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("difference", [-4, 0, 3, 250])
def test_rope_score_depends_only_on_relative_position(difference):
    g = torch.Generator().manual_seed(difference + 10)
    q, k = torch.randn(1, 8, dtype=torch.float64, generator=g), torch.randn(1, 8, dtype=torch.float64, generator=g)
    scores = []
    for n in (0, 5, 300, 10_000):
        m = n + difference
        q_rot = apply_rope(q, torch.tensor([m]))
        k_rot = apply_rope(k, torch.tensor([n]))
        scores.append((q_rot @ k_rot.T).item())  # (1, 8) @ (8, 1) -> (1, 1)
    # Re sum_i q_i conj(k_i) exp(1j (m - n) theta_i), with no absolute position in it
    expected = sum(
        (complex(q[0, 2 * i], q[0, 2 * i + 1]) * complex(k[0, 2 * i], -k[0, 2 * i + 1])
         * cmath.exp(1j * difference * 10000.0 ** (-2 * i / 8))).real
        for i in range(4)
    )
    scores = torch.tensor(scores, dtype=torch.float64)
    torch.testing.assert_close(scores, torch.full((4,), expected, dtype=torch.float64), rtol=0.0, atol=1e-10)


@settings(max_examples=25, deadline=None)
@given(half=st.integers(1, 16), n=st.integers(1, 12), seed=st.integers(0, 2**16))
def test_rope_score_grid_is_the_complex_formula_at_every_position_pair(half, n, seed):
    """S[i, j] = Re sum_p q_p conj(k_p) exp(1j (i - j) theta_p): a function of i - j alone."""
    from selfattn.positional.rope import rope_score_grid

    d = 2 * half
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(d, dtype=torch.float64, generator=g), torch.randn(d, dtype=torch.float64, generator=g)
    expected = torch.tensor([[
        sum((complex(q[2 * p], q[2 * p + 1]) * complex(k[2 * p], -k[2 * p + 1])
             * cmath.exp(1j * (i - j) * 10000.0 ** (-2 * p / d))).real for p in range(half))
        for j in range(n)] for i in range(n)], dtype=torch.float64)
    torch.testing.assert_close(rope_score_grid(q, k, n), expected, rtol=0.0, atol=1e-10)


def test_rope_preserves_norms_and_position_zero_is_identity():
    x = torch.randn(3, 11, 10, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(apply_rope(x).norm(dim=-1), x.norm(dim=-1), **EXACT64)
    torch.testing.assert_close(apply_rope(x, torch.zeros(11)), x, rtol=0.0, atol=0.0)


def test_rope_angles_follow_the_formula():
    angles = rope_angles(torch.tensor([0, 1, 7]), 6, base=50.0)
    expected = torch.tensor([[p * 50.0 ** (-2 * i / 6) for i in range(3)] for p in (0, 1, 7)], dtype=torch.float64)
    assert angles.dtype == torch.float64
    torch.testing.assert_close(angles, expected, **EXACT64)
    assert rope_angles(torch.arange(3), 4, dtype=torch.float32).dtype == torch.float32


def test_rope_gradcheck_in_float64():
    x = torch.randn(2, 5, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(3), requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: apply_rope(t, torch.arange(2, 7)), (x,))


# ---- ALiBi ------------------------------------------------------------------------

HAND_SLOPES = {
    1: [1 / 256],
    2: [1 / 16, 1 / 256],
    4: [1 / 4, 1 / 16, 1 / 64, 1 / 256],
    8: [1 / 2, 1 / 4, 1 / 8, 1 / 16, 1 / 32, 1 / 64, 1 / 128, 1 / 256],
    16: [2 ** (-k / 2) for k in range(1, 17)],
    # Non-powers of two: the m = 2^floor(log2 n) list, then odd-numbered slopes of the 2m list.
    3: [1 / 16, 1 / 256, 1 / 4],
    5: [1 / 4, 1 / 16, 1 / 64, 1 / 256, 1 / 2],
    6: [1 / 4, 1 / 16, 1 / 64, 1 / 256, 1 / 2, 1 / 8],
    12: [2.0**-k for k in range(1, 9)] + [2 ** -0.5, 2 ** -1.5, 2 ** -2.5, 2 ** -3.5],
}


@pytest.mark.parametrize("n", sorted(HAND_SLOPES))
def test_alibi_slopes_match_hand_computed_values(n):
    torch.testing.assert_close(alibi_slopes(n), torch.tensor(HAND_SLOPES[n], dtype=torch.float64), **EXACT64)


def slopes_as_powers(n: int) -> list[float]:
    """The same rule as powers of one base (the form BLOOM's code uses)."""
    m = 2 ** (n.bit_length() - 1)
    base, extra_base = 2.0 ** (-8 / m), 2.0 ** (-4 / m)
    return [base**k for k in range(1, m + 1)] + [extra_base**k for k in range(1, 2 * (n - m), 2)]


@settings(max_examples=64, deadline=None)
@given(st.integers(1, 64))
def test_alibi_slopes_are_distinct_in_zero_one_and_decrease_within_each_block(n):
    slopes = alibi_slopes(n)
    m = 2 ** (n.bit_length() - 1)
    torch.testing.assert_close(slopes, torch.tensor(slopes_as_powers(n), dtype=torch.float64), rtol=1e-12, atol=0.0)
    assert ((slopes > 0) & (slopes <= 1)).all()
    assert len(set(slopes.tolist())) == n
    assert (slopes[: m][1:] < slopes[: m][:-1]).all() and (slopes[m:][1:] < slopes[m:][:-1]).all()


def alibi_loop(slopes: list[float], q_len: int, kv_len: int) -> torch.Tensor:
    return torch.tensor(
        [[[-s * abs((kv_len - q_len + i) - j) for j in range(kv_len)] for i in range(q_len)] for s in slopes],
        dtype=torch.float64,
    ).reshape(len(slopes), q_len, kv_len)


@pytest.mark.parametrize("heads, q_len, kv_len", [(1, 1, 1), (4, 5, 5), (3, 2, 7), (8, 1, 9), (2, 6, 4), (2, 0, 3)])
def test_alibi_bias_matches_the_distance_formula(heads, q_len, kv_len):
    bias = alibi_bias(heads, q_len, kv_len, dtype=torch.float64)
    assert bias.shape == (heads, q_len, kv_len)
    torch.testing.assert_close(bias, alibi_loop(HAND_SLOPES[heads], q_len, kv_len), **EXACT64)


def test_alibi_causal_part_is_slope_times_j_minus_i_and_diagonal_is_zero():
    bias = alibi_bias(4, 6, 6)
    for h, slope in enumerate(HAND_SLOPES[4]):
        for i in range(6):
            assert bias[h, i, i].item() == 0.0
            for j in range(i + 1):
                torch.testing.assert_close(bias[h, i, j].item(), slope * (j - i), rtol=0.0, atol=1e-7)


def test_alibi_queries_align_bottom_right_with_a_cache():
    full = alibi_bias(2, 9, 9)
    torch.testing.assert_close(alibi_bias(2, 3, 9), full[:, 6:], rtol=0.0, atol=0.0)
    last_row = alibi_bias(2, 1, 9)[:, 0]
    torch.testing.assert_close(last_row[:, -1], torch.zeros(2), rtol=0.0, atol=0.0)


def test_alibi_bias_accepts_custom_slopes():
    slopes = torch.tensor([0.5, 2.0])
    torch.testing.assert_close(alibi_bias(2, 3, 4, slopes=slopes, dtype=torch.float64),
                               alibi_loop([0.5, 2.0], 3, 4), **EXACT64)


# ---- names and bad input ----------------------------------------------------------


def test_check_positional_names():
    assert POSITIONAL_NAMES == ("none", "sinusoidal", "learned", "rope", "alibi")
    assert set(ADDITIVE) | {ROTARY, BIASED, "none"} == set(POSITIONAL_NAMES)
    assert [check_positional(name) for name in POSITIONAL_NAMES] == list(POSITIONAL_NAMES)
    assert check_positional(None) == "none"
    with pytest.raises(OptionError, match="'xpos'.*none, sinusoidal, learned, rope, alibi"):
        check_positional("xpos")


@pytest.mark.parametrize(
    "call, error",
    [
        (lambda: sinusoidal_encoding(-1, 4), ShapeError),
        (lambda: sinusoidal_encoding(3, 0), ShapeError),
        (lambda: sinusoidal_encoding(3, 4, offset=-2), OptionError),
        (lambda: sinusoidal_encoding(3, 4, base=0.0), OptionError),
        (lambda: LearnedPositionalEmbedding(0, 4), ConfigError),
        (lambda: LearnedPositionalEmbedding(4, 0), ConfigError),
        (lambda: LearnedPositionalEmbedding(4, 2)(-1), ShapeError),
        (lambda: LearnedPositionalEmbedding(4, 2)(1, offset=-1), ShapeError),
        (lambda: apply_rope(torch.zeros(3, 5)), ShapeError),
        (lambda: apply_rope(torch.zeros(3, 4), torch.arange(4)), ShapeError),
        (lambda: apply_rope(torch.zeros(4)), ShapeError),
        (lambda: rope_angles(torch.zeros(2, 2, 2), 4), ShapeError),
            (lambda: apply_rope(torch.zeros(2, 3, 4), torch.zeros(2, 3)), ShapeError),
        (lambda: rope_angles(torch.arange(3), 4, base=-1.0), OptionError),
        (lambda: alibi_slopes(0), ShapeError),
        (lambda: alibi_bias(0, 2, 2), ShapeError),
        (lambda: alibi_bias(2, -1, 2), ShapeError),
        (lambda: alibi_bias(2, 2, 2, slopes=torch.ones(3)), ShapeError),
    ],
)
def test_bad_input_raises_a_typed_error(call, error):
    with pytest.raises(error) as caught:
        call()
    assert isinstance(caught.value, ValueError) and str(caught.value)


def test_untrained_learned_positions_do_not_depend_on_the_sentence_length():
    """Position p gets one row, and the projections one set of weights, whatever the sentence's length."""
    from selfattn.trace.variants import trace_variant

    tokens = ["a", "b", "c", "d", "e"]
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(1))
    long = trace_variant(tokens, x, "qkv", positional="learned")
    short = trace_variant(tokens[:3], x[:3], "qkv", positional="learned")
    long_w, short_w = long.sections["projections"], short.sections["projections"]
    assert torch.equal(long_w.w_q, short_w.w_q) and torch.equal(long_w.w_k, short_w.w_k)
    assert torch.equal(long.sections["positional"].encoding[:3], short.sections["positional"].encoding)
    plain = trace_variant(tokens, x, "qkv")
    assert torch.equal(plain.sections["projections"].w_q, long_w.w_q)  # the table draws from its own stream


def test_max_len_is_max_positions_old_name_and_warns():
    """One name for the positions a model holds (config.json's max_position_embeddings): max_positions.
    The old max_len keeps working for one release, with a DeprecationWarning, and means the same table."""
    from selfattn.attention.config import TransformerConfig

    with pytest.warns(DeprecationWarning, match=r"LearnedPositionalEmbedding\(max_len=\.\.\.\) is now max_positions"):
        old = LearnedPositionalEmbedding(max_len=8, d_model=4, generator=torch.Generator().manual_seed(7))
    new = LearnedPositionalEmbedding(8, 4, generator=torch.Generator().manual_seed(7))
    assert torch.equal(old.weight, new.weight) and old.max_positions == 8
    with pytest.warns(DeprecationWarning, match=r"\.max_len is now \.max_positions"):
        assert new.max_len == 8
    with pytest.raises(ConfigError, match="max_positions only"), pytest.warns(DeprecationWarning):
        LearnedPositionalEmbedding(8, 4, max_len=8)
    with pytest.warns(DeprecationWarning, match=r"TransformerConfig\(max_len=\.\.\.\) is now max_positions"):
        config = TransformerConfig(d_model=8, n_heads=2, max_len=6)
    assert config.max_positions == 6
    with pytest.warns(DeprecationWarning, match=r"TransformerConfig\.max_len is now \.max_positions"):
        assert config.max_len == 6
    with pytest.warns(DeprecationWarning, match=r"TransformerConfig\(layer_norm_eps=\.\.\.\) is now norm_eps"):
        assert TransformerConfig(d_model=8, n_heads=2, layer_norm_eps=1e-3).norm_eps == 1e-3
