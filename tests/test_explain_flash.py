"""`selfattn explain --variant flash`: the online softmax block by block, checked against independent arithmetic.

References: the online softmax recomputed here in plain Python floats from the seed's
embeddings, the seed's printed numbers, and torch's own
``scaled_dot_product_attention`` / ``logsumexp`` / ``softmax`` in float64.
"""

import json
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from seed_reference import CAT_CONTEXT, CAT_EXP_SUM, CAT_SCORES, CAT_WEIGHTS, INPUTS, QUERY_INDEX, TOKENS, at_4_decimals
from selfattn.errors import OptionError
from selfattn.trace.variant_names import UNSCALED
from selfattn.trace.variants import trace_variant

X = torch.tensor(INPUTS, dtype=torch.float64)
TOL = dict(atol=2e-6, rtol=2e-5)  # the library computes in float32
FLASH_KEYS = {
    "block_size", "scale", "query_index", "blocks", "online_output", "online_lse", "output", "plain_output",
    "max_difference", "lse", "weights_from_lse", "weights_max_difference",
}
BLOCK_KEYS = {
    "start", "end", "tokens", "scores", "block_max", "m_before", "m_after", "rescale", "exp", "exp_sum",
    "l_before", "l_after", "acc_before", "acc_after",
}


def explain_json(run_cli, *args):
    status, out, err = run_cli("explain", "--variant", "flash", "--format", "json", *args)
    assert status == 0, err
    return json.loads(out)


def t(value):
    return torch.as_tensor(value, dtype=torch.float64)


def num(value):
    """A JSON number, or the string "-inf" back as a float."""
    return float(value)


def online_softmax_by_hand(scores, values, size):
    """The online softmax in plain Python floats, written from the FlashAttention paper's recurrence."""
    m, l, acc = -math.inf, 0.0, [0.0] * len(values[0])
    blocks = []
    for start in range(0, len(scores), size):
        end = min(start + size, len(scores))
        s = scores[start:end]
        m_new = max(m, max(s))
        r = math.exp(m - m_new)  # exp(-inf) = 0 for the first block
        e = [math.exp(x - m_new) for x in s]
        l_new = r * l + sum(e)
        acc_new = [r * a + sum(e[i] * values[start + i][c] for i in range(len(e))) for c, a in enumerate(acc)]
        blocks.append(dict(start=start, end=end, scores=s, block_max=max(s), m_before=m, m_after=m_new, rescale=r,
                           exp=e, exp_sum=sum(e), l_before=l, l_after=l_new, acc_before=acc, acc_after=acc_new))
        m, l, acc = m_new, l_new, acc_new
    return blocks, [a / l for a in acc], m + math.log(l)


@pytest.mark.parametrize("size", [1, 2, 3, 7, 8])
def test_blocks_match_arithmetic_by_hand_and_the_seed(run_cli, size):
    data = explain_json(run_cli, "--block-size", str(size))
    flash, q = data["flash"], QUERY_INDEX
    assert flash["block_size"] == size and flash["query_index"] == q and flash["scale"] == 1.0
    scores = [sum(a * b for a, b in zip(INPUTS[q], row)) for row in INPUTS]  # x_q . x_j, unscaled
    expected, output, lse = online_softmax_by_hand(scores, INPUTS, size)
    assert len(flash["blocks"]) == math.ceil(len(TOKENS) / size)
    for got, want in zip(flash["blocks"], expected):
        assert set(got) == BLOCK_KEYS
        assert (got["start"], got["end"]) == (want["start"], want["end"])
        assert got["tokens"] == TOKENS[want["start"] : want["end"]]
        assert at_4_decimals(got["scores"]) == CAT_SCORES[want["start"] : want["end"]]  # the seed's printed scores
        for key in ("scores", "block_max", "m_after", "rescale", "exp", "exp_sum", "l_before", "l_after", "acc_before", "acc_after"):
            torch.testing.assert_close(t(got[key]), t(want[key]), **TOL, msg=key)
        assert num(got["m_before"]) == pytest.approx(want["m_before"], rel=2e-6)  # -inf for the first block
    last = flash["blocks"][-1]
    final = [a / last["l_after"] for a in last["acc_after"]]
    assert at_4_decimals(final) == CAT_CONTEXT
    assert at_4_decimals(flash["output"][q]) == CAT_CONTEXT
    assert at_4_decimals(data["context"][q]) == CAT_CONTEXT
    torch.testing.assert_close(t(flash["online_output"][q]), t(output), **TOL)
    torch.testing.assert_close(t(flash["lse"][q]), t(lse), **TOL)
    # The seed printed the unshifted sum of exp(ω): its log is the lse.
    assert flash["lse"][q] == pytest.approx(math.log(CAT_EXP_SUM), abs=1e-4)
    assert at_4_decimals(flash["weights_from_lse"][q]) == CAT_WEIGHTS
    assert at_4_decimals(data["weights"][q]) == CAT_WEIGHTS


def test_every_row_against_torch(run_cli):
    data = explain_json(run_cli, "--block-size", "3")
    flash = data["flash"]
    expected = F.scaled_dot_product_attention(X[None], X[None], X[None], scale=1.0)[0]
    weights = torch.softmax(X @ X.T, dim=-1)
    torch.testing.assert_close(t(flash["output"]), expected, **TOL)
    torch.testing.assert_close(t(flash["online_output"]), expected, **TOL)
    torch.testing.assert_close(t(flash["plain_output"]), expected, **TOL)
    torch.testing.assert_close(t(data["context"]), expected, **TOL)
    torch.testing.assert_close(t(flash["lse"]), torch.logsumexp(X @ X.T, dim=-1), **TOL)
    torch.testing.assert_close(t(flash["online_lse"]), torch.logsumexp(X @ X.T, dim=-1), **TOL)
    torch.testing.assert_close(t(flash["weights_from_lse"]), weights, **TOL)
    torch.testing.assert_close(t(data["weights"]), weights, **TOL)
    difference = (t(flash["output"]) - t(flash["plain_output"])).abs().max()
    assert flash["max_difference"] == pytest.approx(float(difference), abs=1e-12)
    assert flash["max_difference"] < 1e-6 and flash["weights_max_difference"] < 1e-6


def test_json_keys_and_internal_consistency(run_cli):
    data = explain_json(run_cli, "--query", "sat")
    flash, q = data["flash"], 2
    assert set(flash) == FLASH_KEYS
    for key in ("variant", "tokens", "embeddings", "embedding_source", "positional", "query", "scores", "weights", "row_sums", "context"):
        assert key in data, key
    assert data["variant"] == "flash" and "scaling" not in data and "projections" not in data
    assert flash["block_size"] == 2  # the default
    blocks = flash["blocks"]
    assert [token for block in blocks for token in block["tokens"]] == TOKENS
    assert blocks[0]["start"] == 0 and blocks[-1]["end"] == len(TOKENS)
    assert blocks[0]["m_before"] == "-inf" and blocks[0]["rescale"] == 0.0 and blocks[0]["l_before"] == 0.0
    for before, after in zip(blocks, blocks[1:]):
        assert after["start"] == before["end"]
        assert after["m_before"] == before["m_after"] and after["l_before"] == before["l_after"]
        assert after["acc_before"] == before["acc_after"]
    for block in blocks:
        assert block["scores"] == data["scores"][q][block["start"] : block["end"]]
        assert block["m_after"] == pytest.approx(max(num(block["m_before"]), block["block_max"]))
        assert block["rescale"] == pytest.approx(math.exp(num(block["m_before"]) - block["m_after"]), abs=1e-7)
        assert block["exp_sum"] == pytest.approx(sum(block["exp"]), rel=1e-6)
        assert block["l_after"] == pytest.approx(block["rescale"] * block["l_before"] + block["exp_sum"], rel=1e-6)
    # For 'sat' the second block holds a larger score than the first: m grows and r < 1 rescales.
    assert blocks[1]["m_after"] > blocks[1]["m_before"] and 0 < blocks[1]["rescale"] < 1
    last = blocks[-1]
    assert flash["lse"][q] == pytest.approx(last["m_after"] + math.log(last["l_after"]), rel=1e-6)
    torch.testing.assert_close(t(flash["online_output"][q]), t(last["acc_after"]) / last["l_after"], **TOL)
    assert data["query"]["index"] == q and data["query"]["context"] == flash["output"][q]


def test_any_sentence_and_block_sizes_that_do_not_divide_it(run_cli):
    data = explain_json(run_cli, "one two three four five six seven eight nine", "--embed", "random", "--dim", "5",
                        "--block-size", "4", "--query", "six")
    x = t(data["embeddings"])
    assert [(b["start"], b["end"]) for b in data["flash"]["blocks"]] == [(0, 4), (4, 8), (8, 9)]
    torch.testing.assert_close(t(data["flash"]["output"]), F.scaled_dot_product_attention(x[None], x[None], x[None], scale=1.0)[0], **TOL)
    scores = (x[5] @ x.T).tolist()
    _, output, lse = online_softmax_by_hand(scores, x.tolist(), 4)
    torch.testing.assert_close(t(data["flash"]["online_output"][5]), t(output), **TOL)
    torch.testing.assert_close(t(data["flash"]["lse"][5]), t(lse), **TOL)


@pytest.mark.parametrize("positional", ["alibi", "sinusoidal"])
def test_positional_encodings_go_through_the_blocks(run_cli, positional):
    data = explain_json(run_cli, "--positional", positional, "--block-size", "3")
    scores = t(data["scores"])  # the softmax input, with the bias added for ALiBi
    x = t(data["positional"].get("input", data["embeddings"]))
    torch.testing.assert_close(t(data["flash"]["output"]), torch.softmax(scores, dim=-1) @ x, **TOL)
    torch.testing.assert_close(t(data["flash"]["lse"]), torch.logsumexp(scores, dim=-1), **TOL)
    for block in data["flash"]["blocks"]:
        assert block["scores"] == data["scores"][1][block["start"] : block["end"]]


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 9), d=st.integers(1, 6), size=st.integers(1, 10), seed=st.integers(0, 2**16))
def test_library_trace_matches_torch(n, d, size, seed):
    x = torch.randn(n, d, generator=torch.Generator().manual_seed(seed))
    trace = trace_variant([f"t{i}" for i in range(n)], x, "flash", query=0, block_size=size)
    flash = trace.sections["flash"]
    expected = F.scaled_dot_product_attention(x[None].double(), x[None].double(), x[None].double(), scale=1.0)[0]
    torch.testing.assert_close(flash.output.double(), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(flash.online_output, flash.output, atol=1e-6, rtol=1e-6)
    assert len(flash.blocks) == math.ceil(n / size)
    assert trace.steps.scale == 1.0 and trace.sections["inputs"].variant in UNSCALED  # no 1 / sqrt(d_k)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--variant", "flash", "--block-size", "0"], "--block-size must be a positive integer, got 0"),
        (["--variant", "flash", "--block-size", "-3"], "--block-size must be a positive integer, got -3"),
        (["--variant", "scaled", "--block-size", "2"], "--block-size applies to --variant flash, not scaled"),
        (["--block-size", "2"], "--block-size applies to --variant flash, not simple"),
        (["--variant", "flash", "--block-size", "two"], "invalid int value: 'two'"),
        (["--variant", "flash", "--block-size", "1.5"], "invalid int value: '1.5'"),
    ],
)
def test_option_errors_are_one_line_and_exit_2(run_cli, args, message):
    status, out, err = run_cli("explain", *args)
    assert status == 2 and out == ""
    assert err.count("\n") == 1 and message in err, err


def test_library_refuses_bad_block_sizes():
    from selfattn.commands.explain_options import ExplainConfig

    for value in (0, True, 2.0):
        with pytest.raises(OptionError, match="--block-size"):
            ExplainConfig(variant="flash", block_size=value)
        with pytest.raises(OptionError, match="--block-size"):
            trace_variant(TOKENS, X.float(), "flash", block_size=value)
    with pytest.raises(OptionError, match="--block-size does not apply with --model"):
        ExplainConfig(model="all-MiniLM-L6-v2", block_size=2)


def test_text_walkthrough_shows_the_blocks(run_cli):
    status, out, err = run_cli("explain", "--variant", "flash", "--block-size", "2")
    assert status == 0 and err == ""
    assert "Step 4 · The online softmax, block by block, for 'cat'" in out
    assert "4 blocks, numbered 0 to 3 like the keys" in " ".join(out.split())
    assert "Block 0: keys 0-1 (The, cat)" in out and "Block 3, the last: key 6 (mat)" in out
    assert "Block 4" not in out
    assert "m'   = max(-inf, 1.3581) = 1.3581" in out
    assert "l'   = 1.0000 · 1.5016 + 1.4720 = 2.9736" in out
    # The seed's context vector, from acc / l, from the kernel and from the plain softmax.
    assert "= [2.5871, 3.2046, 3.0298] / 5.2118 = [0.4964, 0.6149, 0.5813]" in out
    assert "flash_attention (block_k = 2): z = [0.4964, 0.6149, 0.5813]" in out
    assert "plain softmax(s) V:            z = [0.4964, 0.6149, 0.5813]" in out
    assert "The two agree to the last digit printed (4 decimals)." in out
    assert "lse = m + log l = 1.3581 + log 5.2118 = 3.0090" in out
    assert "every later r is exactly 1" in " ".join(out.split())  # 'cat' has its largest score in the first block


def test_text_block_size_one_and_one_block(run_cli):
    _, every_key, _ = run_cli("explain", "--variant", "flash", "--block-size", "1")
    assert "Block 6, the last: key 6 (mat)" in every_key and "Block 7" not in every_key
    # 'cat' raises m from 0.6682 (The) to 1.3581: r = exp(0.6682 - 1.3581) = 0.5016, the seed's exp ratio.
    assert f"r    = exp(0.6682 - 1.3581) = {math.exp(0.6682 - 1.3581):.4f}" in every_key
    _, one_block, _ = run_cli("explain", "--variant", "flash", "--block-size", "100")
    assert "Block 0: keys 0-6 (The, cat, sat, on, the, warm, mat)" in one_block and "a single block, block 0" in one_block
    assert "With a single block the online softmax is the plain one" in one_block


def test_markdown_and_precision(run_cli):
    status, out, err = run_cli("explain", "--variant", "flash", "--format", "markdown", "--precision", "6", "--query", "sat")
    assert status == 0 and err == ""
    assert "## Step 4 · The online softmax, block by block, for 'sat'" in out
    assert "**Block 0: keys 0-1 (The, cat)**" in out
    assert "| sat | 1.478600 |" in out  # x_sat . x_sat = 0.33² + 0.76² + 0.89²
    assert "**After each block**" in out and "| block | keys | block max | m | r | l | acc |" in out
    assert "| 0 | The, cat |" in out and "| 3 | mat |" in out  # blocks count from 0, like the keys


def test_plot_and_view(run_cli, tmp_path):
    from selfattn.render.visual.explorer import page_data

    for kind in ("heatmap", "arrows"):
        target = tmp_path / f"{kind}.png"
        status, _, err = run_cli("plot", "--variant", "flash", "--block-size", "3", "--kind", kind, "-o", str(target))
        assert status == 0 and err == "" and target.stat().st_size > 1000
    page = tmp_path / "f.html"
    status, _, err = run_cli("view", "--variant", "flash", "--block-size", "2", "-o", str(page))
    assert status == 0 and err == ""
    data = page_data(page.read_text())
    assert data["variant"] == "flash" and data["flash"]["block_size"] == 2 and len(data["flash"]["blocks"]) == 4
