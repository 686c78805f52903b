"""`selfattn explain --variant ...`: every number in the JSON checked against an independent reference.

References: the seed's printed numbers, torch.nn.functional.scaled_dot_product_attention
fed with the projection weights the JSON reports, the sinusoidal and ALiBi formulas
written out here, and complex-number rotation for RoPE.
"""

import cmath
import json
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from seed_reference import ALL_SCORES, CAT_WEIGHTS, INPUTS, TOKENS, at_4_decimals

X = torch.tensor(INPUTS, dtype=torch.float64)
TOL = dict(atol=2e-6, rtol=2e-5)  # the library computes in float32


def explain_json(run_cli, *args):
    status, out, err = run_cli("explain", "--format", "json", *args)
    assert status == 0, err
    return json.loads(out)


def t(value):
    return torch.as_tensor(value, dtype=torch.float64)


def assert_close(actual, expected, **tol):
    torch.testing.assert_close(t(actual), expected.to(torch.float64), **(tol or TOL))


def sdpa_from_json(data, is_causal=False):
    """Q, K, V rebuilt from the reported weights, then torch's attention: an independent path."""
    x = t(data["embeddings"])
    if data["positional"]["name"] in ("sinusoidal", "learned"):
        x = x + t(data["positional"]["encoding"])
    proj = data["projections"]
    d_k = proj["d_k"]
    q = (x @ t(proj["w_q"])).unflatten(-1, (-1, d_k)).transpose(0, 1)  # (H, n, d_k)
    k = (x @ t(proj["w_k"])).unflatten(-1, (-1, d_k)).transpose(0, 1)  # (K, n, d_k)
    v = (x @ t(proj["w_v"])).unflatten(-1, (-1, d_k)).transpose(0, 1)
    return q, k, v, F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, enable_gqa=q.shape[0] != k.shape[0])


def test_scaled_variant_without_scaling_is_the_seed(run_cli):
    data = explain_json(run_cli, "--variant", "scaled")
    assert data["variant"] == "scaled" and data["tokens"] == TOKENS
    # Unscaled, the variant reproduces the seed's printed numbers.
    assert at_4_decimals(data["scaling"]["scores_unscaled"]) == ALL_SCORES
    assert at_4_decimals(data["query"]["weights_unscaled"]) == CAT_WEIGHTS
    assert data["scaling"]["scale"] == pytest.approx(1 / math.sqrt(3))
    expected = torch.softmax(X @ X.T / math.sqrt(3), dim=-1)
    assert_close(data["weights"], expected)
    assert_close(data["context"], expected @ X)
    # Scaling by 1/sqrt(3) < 1 flattens the softmax: the top weight of every row drops.
    assert data["scaling"]["query_max_weight_scaled"] < data["scaling"]["query_max_weight_unscaled"]
    assert data["scaling"]["query_max_weight_unscaled"] == pytest.approx(max(CAT_WEIGHTS), abs=1e-4)
    assert all(max(s) < max(u) for s, u in zip(data["weights"], data["scaling"]["weights_unscaled"]))


def test_qkv_variant_matches_torch_with_the_reported_weights(run_cli):
    data = explain_json(run_cli, "--variant", "qkv", "--d-k", "2", "--seed", "5")
    proj = data["projections"]
    assert proj["untrained"] is True and proj["seed"] == 5 and proj["d_k"] == 2
    q, k, v, out = sdpa_from_json(data)
    assert_close(proj["q"], q)
    assert_close(data["scores"], (q @ k.transpose(-2, -1) / math.sqrt(2))[0])
    assert_close(data["context"], out[0])
    assert_close(data["query"]["context"], out[0, 1])
    assert "mask" not in data and "multihead" not in data


def test_causal_variant_masks_the_future(run_cli):
    data = explain_json(run_cli, "--variant", "causal", "--query", "sat")
    _, _, _, out = sdpa_from_json(data, is_causal=True)
    assert_close(data["context"], out[0])
    allowed = torch.tensor(data["mask"]["allowed"])
    assert torch.equal(allowed, torch.ones(7, 7, dtype=torch.bool).tril())
    masked = data["mask"]["masked_scores"]
    assert all(masked[i][j] == "-inf" for i in range(7) for j in range(i + 1, 7))
    weights = t(data["weights"])
    assert torch.all(weights.triu(1) == 0)
    assert_close(weights.sum(-1), torch.ones(7, dtype=torch.float64))
    assert data["query"]["token"] == "sat" and data["query"]["weights"][3:] == [0.0] * 4


@pytest.mark.parametrize("heads,kv_heads", [(2, None), (3, None), (4, 2), (4, 1), (6, 3)])
def test_multihead_and_gqa_match_torch(run_cli, heads, kv_heads):
    variant = "multihead" if kv_heads is None else "gqa"
    args = ["--variant", variant, "--heads", str(heads), "--embed", "random", "--dim", "6"]
    if kv_heads is not None:
        args += ["--kv-heads", str(kv_heads)]
    data = explain_json(run_cli, *args)
    q, k, v, out = sdpa_from_json(data)
    info = data["multihead"]
    assert info["n_heads"] == heads and info["n_kv_heads"] == (kv_heads or heads)
    assert len(data["heads"]) == heads
    assert [h["kv_head"] for h in data["heads"]] == [h // (heads // (kv_heads or heads)) for h in range(heads)]
    assert_close(data["weights"], torch.softmax(q @ k.repeat_interleave(q.shape[0] // k.shape[0], 0).transpose(-2, -1) / math.sqrt(q.shape[-1]), -1))
    concat = out.transpose(0, 1).flatten(1)  # (n, H d_k)
    assert_close(info["concat"], concat)
    assert_close(data["context"], concat @ t(info["w_o"]))
    assert t(data["context"]).shape == (len(data["tokens"]), 6)


def test_sinusoidal_positions_follow_the_formula(run_cli):
    data = explain_json(run_cli, "--variant", "scaled", "--positional", "sinusoidal")
    enc = data["positional"]["encoding"]
    for pos in range(7):
        for i in range(3):
            angle = pos / 10000 ** ((i - i % 2) / 3)
            assert enc[pos][i] == pytest.approx(math.sin(angle) if i % 2 == 0 else math.cos(angle), abs=1e-6)
    x = X + t(enc)
    assert_close(data["positional"]["input"], x)
    assert_close(data["context"], torch.softmax(x @ x.T / math.sqrt(3), -1) @ x)


def test_alibi_bias_follows_the_paper(run_cli):
    data = explain_json(run_cli, "--variant", "multihead", "--heads", "4", "--positional", "alibi", "--embed", "random", "--dim", "8")
    slopes = [2 ** (-8 * (h + 1) / 4) for h in range(4)]
    assert data["positional"]["slopes"] == pytest.approx(slopes)
    bias = t(data["positional"]["bias"])
    for h in range(4):
        for i in range(7):
            for j in range(7):
                assert float(bias[h, i, j]) == pytest.approx(-slopes[h] * abs(i - j))
    q, k, v, _ = sdpa_from_json(data)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    assert_close([[row for row in head["output"]] for head in data["heads"]], out)


def test_rope_rotates_each_pair_like_a_complex_number(run_cli):
    data = explain_json(run_cli, "--variant", "qkv", "--d-k", "4", "--positional", "rope")
    before, after = data["positional"]["q_unrotated"][0], data["projections"]["q"][0]
    for pos in range(7):
        for i in range(2):
            z = complex(before[pos][2 * i], before[pos][2 * i + 1]) * cmath.exp(1j * pos * 10000 ** (-2 * i / 4))
            assert after[pos][2 * i] == pytest.approx(z.real, abs=1e-5)
            assert after[pos][2 * i + 1] == pytest.approx(z.imag, abs=1e-5)


def test_learned_positions_are_labelled_untrained_and_seeded(run_cli):
    first = explain_json(run_cli, "--variant", "qkv", "--positional", "learned", "--seed", "3")
    again = explain_json(run_cli, "--variant", "qkv", "--positional", "learned", "--seed", "3")
    other = explain_json(run_cli, "--variant", "qkv", "--positional", "learned", "--seed", "4")
    assert first["positional"]["untrained"] is True
    assert first["positional"]["encoding"] == again["positional"]["encoding"] != other["positional"]["encoding"]


def test_simple_with_a_positional_encoding_is_unscaled(run_cli):
    data = explain_json(run_cli, "--positional", "sinusoidal")
    x = X + t(data["positional"]["encoding"])
    assert data["variant"] == "simple" and "scaling" not in data
    assert_close(data["weights"], torch.softmax(x @ x.T, -1))


@pytest.mark.parametrize(
    "args,words",
    [
        (["--variant", "scaled"], ["÷ √3", "α unscaled", "entropy", "Why divide by √d_k", "corrects for width, not for size"]),
        (["--variant", "qkv"], ["Q = X W_q", "untrained", "seed 0"]),
        (["--variant", "causal"], ["Causal mask", "-inf", "✓"]),
        (["--variant", "multihead"], ["head 1", "concat(head_0, head_1) W_o", "Heads are numbered"]),
        (["--variant", "gqa"], ["key/value head 1", "Grouped-query"]),
        (["--variant", "qkv", "--positional", "rope"], ["RoPE", "Angles"]),
        (["--variant", "scaled", "--positional", "alibi"], ["ALiBi", "slopes"]),
        (["--variant", "scaled", "--positional", "sinusoidal"], ["X + P"]),
    ],
)
def test_text_shows_each_extra_step(run_cli, args, words):
    status, out, err = run_cli("explain", *args)
    assert status == 0 and err == ""
    for word in words:
        assert word in out, word
    status, md, _ = run_cli("explain", "--format", "markdown", *args)
    assert status == 0 and md.startswith("#") or "Variant" in md


@pytest.mark.parametrize(
    "args,message",
    [
        (["--variant", "sparse"], "unknown variant 'sparse'"),
        (["--positional", "xpos"], "unknown positional encoding 'xpos'"),
        (["--variant", "qkv", "--heads", "2"], "--heads applies to"),
        (["--variant", "multihead", "--kv-heads", "1"], "--kv-heads applies to --variant gqa"),
        (["--variant", "gqa", "--heads", "6", "--kv-heads", "4"], "multiple of --kv-heads"),
        (["--variant", "gqa", "--heads", "2", "--kv-heads", "4"], "multiple of --kv-heads"),
        (["--variant", "scaled", "--d-k", "2"], "--d-k applies"),
        (["--variant", "qkv", "--d-k", "0"], "--d-k must be"),
        (["--variant", "multihead", "--heads", "99"], "--heads must be"),
        (["--variant", "qkv", "--positional", "rope", "--d-k", "3"], "even"),
        (["--variant", "scaled", "--positional", "rope", "--embed", "random", "--dim", "1"], "at least 2"),
        (["--variant", "multihead", "--heads", "16", "--embed", "random", "--dim", "2", "--format", "json",
          " ".join(["w"] * 513)], "at most 512"),
    ],
)
def test_bad_variant_options_are_one_line_exit_2(run_cli, args, message):
    status, out, err = run_cli("explain", *args)
    assert status == 2 and out == ""
    assert message in err and err.count("\n") == 1


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    variant=st.sampled_from(["simple", "scaled", "qkv", "causal", "multihead", "gqa"]),
    positional=st.sampled_from(["none", "sinusoidal", "learned", "rope", "alibi"]),
    heads=st.one_of(st.none(), st.integers(0, 17)),
    kv_heads=st.one_of(st.none(), st.integers(0, 9)),
    d_k=st.one_of(st.none(), st.integers(0, 9)),
    dim=st.integers(1, 6),
    output=st.sampled_from(["text", "json"]),
)
def test_any_variant_options_end_in_output_or_one_error_line(run_cli, variant, positional, heads, kv_heads, d_k, dim, output):
    args = ["explain", "the cat saw the dog", "--embed", "random", "--dim", str(dim), "--format", output]
    args += ["--variant", variant, "--positional", positional]
    for flag, value in (("--heads", heads), ("--kv-heads", kv_heads), ("--d-k", d_k)):
        if value is not None:
            args += [flag, str(value)]
    status, out, err = run_cli(*args)
    assert (status, err) == (0, "") and out or (status == 2 and out == "" and err.count("\n") == 1), err
    if status == 0 and output == "json":
        data = json.loads(out)
        assert data["variant"] == variant
        rows = t(data["row_sums"])
        assert_close(rows, torch.ones_like(rows), atol=1e-5, rtol=0)
