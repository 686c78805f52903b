"""How the tables write a number: fixed decimals, scientific notation where fixed would run wide.

Checked against the seed's printout (every number it prints keeps its fixed form), Python's
own float formatting, and the exponentials of the seed's scores times 100 (embeddings ten
times larger), computed here with math.exp.
"""

import json
import math
import re

import pytest
import torch

from seed_reference import ALL_SCORES, CAT_CONTEXT, CAT_EXP, CAT_EXP_SUM, CAT_SCORES, CAT_WEIGHTS, INPUTS, TOKENS
from selfattn.render.text.document import fmt
from selfattn.formatting import SCIENTIFIC_BELOW, SCIENTIFIC_FROM, number_text

LONG_INTEGER_PART = re.compile(r"\d{11,}\.")  # more than 10 digits before a decimal point


def test_the_seeds_printed_numbers_keep_their_fixed_form():
    printed = CAT_SCORES + CAT_EXP + CAT_WEIGHTS + CAT_CONTEXT + [CAT_EXP_SUM] + [v for row in ALL_SCORES + INPUTS for v in row]
    for value in printed:
        assert number_text(value, 4) == f"{value:.4f}"
        assert fmt(value, 4) == number_text(value, 4)  # the walkthroughs' fmt is this formatter


@pytest.mark.parametrize(
    "value, precision, text",
    [
        (104606934461309001593761300480.0, 4, "1.0461e+29"),  # exp(66.82): 30 digits in fixed notation
        (-2.5e12, 2, "-2.50e+12"),
        (SCIENTIFIC_FROM, 4, "1.0000e+10"),
        (9999999999.0, 4, "9999999999.0000"),  # ten digits before the point still read in fixed notation
        (4.2e-31, 4, "4.2000e-31"),  # not zero, so not written 0.0000
        (-1.5e-11, 3, "-1.500e-11"),
        (SCIENTIFIC_BELOW, 4, "0.0000"),  # from 1e-10 up a number smaller than the precision rounds to 0, as asked
        (0.00005, 4, "0.0001"),
        (0.000049, 4, "0.0000"),
        (-0.000049, 4, "0.0000"),  # no "-0.0000"
        (0.0, 4, "0.0000"),
        (-0.0, 4, "0.0000"),
        (0.3, 0, "0"),
        (float("inf"), 4, "inf"),
        (float("-inf"), 4, "-inf"),
        (float("nan"), 4, "nan"),
    ],
)
def test_number_text(value, precision, text):
    assert number_text(value, precision) == text
    if math.isfinite(value) and "e" in text:
        assert float(text) == pytest.approx(value, rel=10 ** -precision)  # the same number, only written shorter


@pytest.fixture
def ten_times_the_seed(tmp_path):
    path = tmp_path / "seed-x10.json"
    path.write_text(json.dumps({token: [10 * v for v in row] for token, row in zip(TOKENS, INPUTS)}))
    return path


@pytest.mark.parametrize("output", ["text", "markdown"])
def test_huge_exponentials_print_in_scientific_notation(run_cli, ten_times_the_seed, output):
    status, out, err = run_cli("explain", "--embeddings", str(ten_times_the_seed), "--format", output)
    assert (status, err) == (0, "")
    assert not LONG_INTEGER_PART.search(out), LONG_INTEGER_PART.search(out).group(0)
    # Ten times the embeddings is 100 times every score: 'cat' scores 'The' 66.82, 'on' 76.40, 'the' 66.60.
    for token, score in (("The", CAT_SCORES[0]), ("on", CAT_SCORES[3]), ("the", CAT_SCORES[4])):
        row = next(line for line in out.splitlines() if re.match(rf"\W*{token}\W+{100 * score:.4f}\W", line))
        assert f"{math.exp(100 * score):.4e}" in row, row
    assert "1.0461e+29" in out  # exp(66.82)
    # The stable form's weight of 'The' is exp(66.82 - 135.81) / 1.0910: below 1e-10, not zero, so not 0.0000.
    stable = math.exp(100 * (CAT_SCORES[0] - CAT_SCORES[1])) / sum(math.exp(100 * (s - CAT_SCORES[1])) for s in CAT_SCORES)
    assert f"{stable:.4e}"[:4] == "1.00" and f"{stable:.4e}" in out


def _plain_by_the_rule(value, precision=None):
    """plain's rule written out one float at a time: non-finite as text, rounded with a precision, no -0.0."""
    if isinstance(value, torch.Tensor):
        value = value.tolist()
    if isinstance(value, list):
        return [_plain_by_the_rule(v, precision) for v in value]
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        if precision is None:
            return value
        value = round(value, precision)
        return 0.0 if value == 0 else value
    return value


@pytest.mark.parametrize("shape", [(), (5,), (3, 4), (2, 3, 4), (0,), (2, 0, 3)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32, torch.float64])
@pytest.mark.parametrize("precision", [None, 0, 2, 4, 10])
def test_plain_writes_every_float_of_a_tensor_by_the_rule(shape, dtype, precision):
    from selfattn.formatting import plain

    values = (torch.randn(shape, generator=torch.Generator().manual_seed(len(shape))) * 10).to(dtype)
    if values.numel() > 3:
        values.view(-1)[:4] = torch.tensor([math.nan, -math.inf, -0.0, math.inf], dtype=dtype)
    assert repr(plain(values, precision)) == repr(_plain_by_the_rule(values, precision))  # repr: -0.0 differs from 0.0
    assert plain(torch.tensor([1, 2])) == [1, 2] and plain(torch.tensor([True])) == [True]  # ints and bools as they are
