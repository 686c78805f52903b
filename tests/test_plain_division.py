"""Why softmax: plain division omega_j / sum omega beside it, against the formula, where it breaks."""

import json
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import selfattn as sa
from selfattn.pipeline import plain_division
from seed_reference import INPUTS


def from_json(value):
    """JSON's strings for non-finite numbers back to floats."""
    return [float(v) for v in value]


def reference(scores: list[float]) -> list[float]:
    """omega_j / sum omega, written out in plain Python (IEEE division by zero spelled out)."""
    total = math.fsum(scores)
    if total != 0:
        return [s / total for s in scores]
    return [math.nan if s == 0 else math.copysign(math.inf, s) for s in scores]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-50, 50, allow_subnormal=False, width=32), min_size=1, max_size=9))
def test_plain_division_is_the_formula(scores):
    got = plain_division(torch.tensor(scores, dtype=torch.float64)).tolist()
    total = math.fsum(scores)
    if abs(total) > 1e-6:  # away from zero, where float64 rounding of the sum decides the sign
        np.testing.assert_allclose(got, reference(scores), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize(
    ("scores", "expected"),
    [
        ([1.0, -1.0, 0.0], [math.inf, -math.inf, math.nan]),  # a zero sum
        ([0.0, 0.0], [math.nan, math.nan]),
        ([-1.0, -3.0], [0.25, 0.75]),  # a negative sum: the lowest score gets the most
        ([2.0, -1.0], [2.0, -1.0]),  # a negative weight
    ],
)
def test_plain_division_edge_cases(scores, expected):
    np.testing.assert_array_equal(plain_division(torch.tensor(scores)).numpy(), np.array(expected, dtype=np.float32))


def test_plain_division_along_an_axis():
    scores = torch.tensor([[1.0, 3.0], [2.0, 2.0]])
    torch.testing.assert_close(plain_division(scores, dim=0), scores / scores.sum(0, keepdim=True))


def test_seed_json_and_text_show_plain_division(run_cli):
    status, out, _ = run_cli("explain", "--format", "json")
    assert status == 0
    query = json.loads(out)["query"]
    x = np.array(INPUTS, dtype=np.float64)
    scores = x @ x[1]
    np.testing.assert_allclose(from_json(query["plain_division"]), scores / scores.sum(), rtol=1e-6)
    assert query["plain_division_fails"] == []
    assert math.isclose(query["scores_sum"], scores.sum(), rel_tol=1e-6)

    status, out, _ = run_cli("explain")
    step4 = out[out.index("Step 4") : out.index("The stable form")]
    assert "ω / Σω" in step4
    # cat's row: its plain-division weight (1.3581 / 7.1505) beside its softmax weight
    assert "0.1919   0.1899" in step4
    assert "sum of ω      = 7.1505" in step4
    assert "negative weight" in step4 and "divides by zero" in step4


def write_table(tmp_path, table: dict) -> str:
    path = tmp_path / "table.json"
    path.write_text(json.dumps(table))
    return str(path)


@pytest.mark.parametrize(
    ("table", "query", "fails"),
    [
        ({"up": [1, 0], "down": [-1, 0], "left": [0, 1], "right": [0, -1]}, "up", ["zero sum"]),
        ({"up": [1, 0], "down": [-1, 0.5], "left": [-0.5, -1], "right": [0.2, 1]}, "up", ["negative weight", "negative sum"]),
        ({"up": [1, 0], "down": [-1, 0.5], "left": [-0.5, -1], "right": [0.2, 1]}, "down", ["negative weight"]),
        ({"a": [1, 0], "b": [-1, 0], "c": [-2, 0]}, "b", ["negative weight"]),
    ],
)
def test_constructed_failures(run_cli, tmp_path, table, query, fails):
    path = write_table(tmp_path, table)
    sentence = " ".join(table)
    status, out, _ = run_cli("explain", sentence, "--embeddings", path, "--query", query, "--format", "json")
    assert status == 0
    data = json.loads(out)["query"]
    x = np.array(list(table.values()), dtype=np.float64)
    scores = list(x @ x[list(table).index(query)])
    expected = reference(scores)
    got = from_json(data["plain_division"])
    np.testing.assert_allclose(got, expected, rtol=1e-6)  # nan == nan, inf == inf here
    assert all(isinstance(v, str) for v, e in zip(data["plain_division"], expected) if not math.isfinite(e))
    assert data["plain_division_fails"] == fails

    status, out, _ = run_cli("explain", sentence, "--embeddings", path, "--query", query)
    step4 = out[out.index("Step 4") : out.index("The stable form")]
    assert "On these scores plain division breaks" in step4
    if "zero sum" in fails:
        assert "inf, -inf or nan" in step4 and "-inf" in step4
    if "negative sum" in fails:
        assert "< 0" in step4
    # softmax's weights stay positive and sum to 1 whatever plain division does
    weights = np.array(data["weights"])
    assert (weights > 0).all() and math.isclose(weights.sum(), 1, rel_tol=1e-6)


def test_trace_records_plain_division():
    tokens = sa.tokenize("a b")
    trace = sa.trace_self_attention(tokens, torch.tensor([[1.0, 0.0], [-1.0, 0.0]]), query="a")
    walk = trace.sections["seed"]
    assert walk.plain_division_fails == ["zero sum"]
    assert float(walk.scores_sum) == 0
