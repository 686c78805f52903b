"""The variants with projections say their weights are untrained, and how close to uniform they came out.

Reference: the query's row of weights in the JSON (over the tokens the mask lets it see),
its minimum and maximum, 1 / the number of those tokens, and its entropy against ln of
that number, computed here.
"""

import json
import math
import re

import pytest
import torch

NOTE = re.compile(
    r"These projections are untrained \(seed (\d+)\), (so the weights came out close to uniform|yet the weights are not close "
    r"to uniform): for '(\S+)' every weight(?: in both heads| in all \d+ heads)? is between (\d\.\d+) and (\d\.\d+), where uniform"
    r"(?: over the (\d+) tokens it may see)? would be (\d\.\d+) \(entropy (at least )?(\d+)% of the maximum"
)
TRAINED = "A trained model's heads are far from uniform"


def explain(run_cli, args, fmt):
    status, out, err = run_cli("explain", *args, "--format", fmt)
    assert status == 0 and err == "", err
    return out


def query_rows(data):
    """The query's weights in every head over the tokens it may see: (H, seen)."""
    qi = data["query"]["index"]
    weights = torch.tensor(data["weights"], dtype=torch.float64)
    weights = weights if weights.dim() == 3 else weights[None]  # (H, n, n)
    allowed = torch.tensor(data["mask"]["allowed"][qi]) if "mask" in data else torch.ones(weights.shape[-1], dtype=torch.bool)
    return weights[:, qi][:, allowed]


def entropy_share(row):
    w = row[row > 0]
    return float(-(w * w.log()).sum()) / math.log(len(row))


@pytest.mark.parametrize(
    "args",
    [
        ["--variant", "qkv"],
        ["--variant", "qkv", "--seed", "3", "--d-k", "2"],
        ["--variant", "causal"],
        ["--variant", "causal", "--query", "mat"],
        ["--variant", "multihead"],
        ["--variant", "multihead", "--heads", "1"],
        ["--variant", "gqa"],
        ["--variant", "qkv", "--embed", "random", "--dim", "64", "--d-k", "64"],
        ["--variant", "multihead", "--heads", "4", "--positional", "alibi", "--embed", "random", "--dim", "8"],
    ],
)
def test_the_note_gives_the_weights_range_uniform_and_entropy(run_cli, args):
    text = " ".join(explain(run_cli, args, "text").split())
    data = json.loads(explain(run_cli, args, "json"))
    match = NOTE.search(text)
    assert match, text[-3000:]
    seed, verdict, token, low, high, seen, uniform, at_least, percent = match.groups()
    rows = query_rows(data)
    shares = [entropy_share(row) for row in rows]
    assert int(seed) == data["projections"]["seed"] and token == data["query"]["token"]
    assert float(low) == pytest.approx(float(rows.min()), abs=5e-4)
    assert float(high) == pytest.approx(float(rows.max()), abs=5e-4)
    assert float(uniform) == pytest.approx(1 / rows.shape[1], abs=5e-4)
    assert (seen is not None) == ("mask" in data) and (seen is None or int(seen) == rows.shape[1])
    assert (at_least is not None) == (rows.shape[0] > 1)
    assert int(percent) == math.floor(100 * min(shares))
    assert ("close to uniform" in verdict and "not" not in verdict) == (min(shares) >= 0.95)
    assert TRAINED in text and "selfattn explain --model all-MiniLM-L6-v2 --layer 0 --head 2" in text


def test_the_seed_default_is_close_to_uniform(run_cli):
    """The issue's case: seeded projections on the seed's vectors give every weight near 1/7."""
    text = " ".join(explain(run_cli, ["--variant", "qkv"], "text").split())
    assert "so the weights came out close to uniform" in text
    assert "uniform would be 0.143" in text


def test_a_query_that_sees_only_itself(run_cli):
    text = " ".join(explain(run_cli, ["--variant", "causal", "--query", "The"], "text").split())
    assert "These projections are untrained (seed 0). 'The' may see only itself, so its one weight is 1" in text


@pytest.mark.parametrize("variant", ["simple", "scaled", "flash"])
def test_variants_without_projections_have_no_note(run_cli, variant):
    text = explain(run_cli, ["--variant", variant], "text")
    assert "These projections are untrained" not in text and TRAINED not in text
