"""RoPE's defining property, that q . k depends only on i - j, checked against the papers.

The rotation and the sinusoidal table are written out here from the formulas of Su et al.
(pairs (x_2i, x_2i+1) turned by p * theta_i, theta_i = 10000^(-2i/d)) and Vaswani et al.
(PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(...)) as plain Python loops,
independent of selfattn's code. Then: the core's distance records and score grids agree
with them; equal distances give equal scores with RoPE and unequal ones with the
sinusoidal table; ``explain`` shows and writes the records; ``plot --kind rope-distance``
draws the grids.
"""

import json
import math
import os

import pytest
import torch

from selfattn import ExplainConfig
from selfattn.errors import OptionError, ShapeError
from selfattn.positional.rope import (
    DISTANCE_CHECK_PAIRS,
    DistanceScore,
    rope_distance_check,
    rope_score_grid,
    rope_scores_at,
)
from selfattn.positional.sinusoidal import sinusoidal_score_grid
from selfattn.commands.plot import ROPE_DISTANCE_POSITIONS, rope_distance_picture

F32 = {"rtol": 1e-5, "atol": 1e-5}


def paper_rotate(x: torch.Tensor, p: int) -> torch.Tensor:
    """RoFormer, eq. 13-15: pair i of x turned by the angle p * 10000^(-2i/d)."""
    d = x.shape[0]
    values = x.tolist()
    out = []
    for i in range(d // 2):
        angle = p * 10000.0 ** (-2 * i / d)
        a, b = values[2 * i], values[2 * i + 1]
        out += [a * math.cos(angle) - b * math.sin(angle), a * math.sin(angle) + b * math.cos(angle)]
    return torch.tensor(out, dtype=x.dtype)


def paper_rope_score(q: torch.Tensor, k: torch.Tensor, i: int, j: int) -> float:
    return float(paper_rotate(q, i) @ paper_rotate(k, j))


def paper_sinusoid(p: int, d: int) -> torch.Tensor:
    """Vaswani et al., section 3.5: column 2i is sin(p / 10000^(2i/d)), column 2i+1 its cosine."""
    return torch.tensor(
        [math.sin(p / 10000 ** ((c - c % 2) / d)) if c % 2 == 0 else math.cos(p / 10000 ** ((c - c % 2) / d)) for c in range(d)],
        dtype=torch.float64,
    )


def paper_sinusoidal_score(x_q: torch.Tensor, x_k: torch.Tensor, i: int, j: int) -> float:
    d = x_q.shape[0]
    return float((x_q + paper_sinusoid(i, d).to(x_q.dtype)) @ (x_k + paper_sinusoid(j, d).to(x_k.dtype)))


def random_pair(d: int, seed: int, dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(d, generator=generator, dtype=dtype), torch.randn(d, generator=generator, dtype=dtype)


def diagonal_spreads(grid: torch.Tensor) -> list[float]:
    """max - min along every diagonal i - j = offset of a square grid (offsets of one cell skipped)."""
    n = grid.shape[0]
    return [float(grid.diagonal(o).max() - grid.diagonal(o).min()) for o in range(-(n - 2), n - 1)]


# ---- the core functions against the papers -----------------------------------------


@pytest.mark.parametrize("d, seed", [(2, 0), (4, 1), (6, 2), (8, 3), (64, 4)])
def test_rope_equal_distances_give_equal_scores_by_the_paper_formula(d, seed):
    q, k = random_pair(d, seed)
    pairs = ((1, 0), (2, 1), (5, 4), (12, 11), (3, 0), (9, 6), (15, 12))
    records = rope_distance_check(q, k, pairs)
    paper = [paper_rope_score(q, k, i, j) for i, j in pairs]
    assert [(r.i, r.j, r.distance) for r in records] == [(i, j, i - j) for i, j in pairs]
    torch.testing.assert_close(torch.tensor([r.score for r in records]), torch.tensor(paper), **F32)
    one, three = paper[:4], paper[4:]
    for scores in (one, three):
        torch.testing.assert_close(torch.tensor(scores), torch.full((len(scores),), scores[0]), **F32)
    assert abs(one[0] - three[0]) > 1e-3  # another distance, another score


def test_rope_scores_at_and_the_grid_match_the_paper_at_every_pair():
    q, k = random_pair(8, 7)
    n = 10
    grid = rope_score_grid(q, k, n)
    paper = torch.tensor([[paper_rope_score(q, k, i, j) for j in range(n)] for i in range(n)])
    torch.testing.assert_close(grid, paper, **F32)
    i, j = torch.tensor([0, 3, 9, 4]), torch.tensor([0, 7, 2, 4])
    torch.testing.assert_close(rope_scores_at(q, k, i, j), paper[i, j], **F32)
    assert max(diagonal_spreads(grid)) < 1e-5
    assert grid.dtype == torch.float32


def test_rope_distance_check_defaults_and_records():
    assert DISTANCE_CHECK_PAIRS == ((1, 0), (2, 1), (5, 4), (3, 0))
    q, k = random_pair(4, 5, torch.float64)
    records = rope_distance_check(q, k)
    assert all(isinstance(r, DistanceScore) for r in records)
    assert [r.distance for r in records] == [1, 1, 1, 3]
    assert all(isinstance(r.score, float) for r in records)
    scores = [r.score for r in records]
    assert max(scores[:3]) - min(scores[:3]) < 1e-12 and abs(scores[0] - scores[3]) > 1e-3


@pytest.mark.parametrize("d, seed", [(2, 0), (3, 1), (4, 2), (8, 3)])
def test_the_same_check_fails_for_sinusoidal_codes_added_to_x(d, seed):
    x_q, x_k = random_pair(d, seed)
    pairs = ((1, 0), (2, 1), (5, 4))  # all at distance 1
    scores = [paper_sinusoidal_score(x_q, x_k, i, j) for i, j in pairs]
    assert max(scores) - min(scores) > 1e-2, scores
    n = 8
    grid = sinusoidal_score_grid(x_q, x_k, n)
    paper = torch.tensor([[paper_sinusoidal_score(x_q, x_k, i, j) for j in range(n)] for i in range(n)])
    torch.testing.assert_close(grid, paper, **F32)
    assert max(diagonal_spreads(grid)) > 1e-2


def test_sinusoidal_grid_projects_after_adding_the_table():
    x_q, x_k = random_pair(4, 9, torch.float64)
    generator = torch.Generator().manual_seed(1)
    w_q, w_k = torch.randn(4, 2, generator=generator, dtype=torch.float64), torch.randn(4, 2, generator=generator, dtype=torch.float64)
    grid = sinusoidal_score_grid(x_q, x_k, 5, w_q=w_q, w_k=w_k)
    for i, j in ((0, 0), (1, 0), (4, 2)):
        expected = ((x_q + paper_sinusoid(i, 4).double()) @ w_q) @ ((x_k + paper_sinusoid(j, 4).double()) @ w_k)
        torch.testing.assert_close(grid[i, j], expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "call, error",
    [
        (lambda: rope_distance_check(torch.zeros(3), torch.zeros(3)), ShapeError),
        (lambda: rope_distance_check(torch.zeros(4), torch.zeros(2)), ShapeError),
        (lambda: rope_distance_check(torch.zeros(2, 2), torch.zeros(2, 2)), ShapeError),
        (lambda: rope_distance_check(torch.zeros(4), torch.zeros(4), ()), OptionError),
        (lambda: rope_distance_check(torch.zeros(4), torch.zeros(4), ((1, -1),)), OptionError),
        (lambda: rope_distance_check(torch.zeros(4), torch.zeros(4), ((1.5, 0),)), OptionError),
        (lambda: rope_distance_check(torch.zeros(4), torch.zeros(4), base=0.0), OptionError),
        (lambda: rope_scores_at(torch.zeros(4), torch.zeros(4), torch.arange(3), torch.arange(2)), ShapeError),
        (lambda: rope_score_grid(torch.zeros(4), torch.zeros(4), 0), OptionError),
        (lambda: sinusoidal_score_grid(torch.zeros(4), torch.zeros(3), 4), ShapeError),
        (lambda: sinusoidal_score_grid(torch.zeros(4), torch.zeros(4), 0), OptionError),
        (lambda: sinusoidal_score_grid(torch.zeros(4), torch.zeros(4), 4, w_q=torch.zeros(4, 2)), OptionError),
        (lambda: sinusoidal_score_grid(torch.zeros(4), torch.zeros(4), 4, w_q=torch.zeros(3, 2), w_k=torch.zeros(3, 2)), ShapeError),
    ],
)
def test_bad_input_raises_a_typed_error(call, error):
    with pytest.raises(error) as caught:
        call()
    assert isinstance(caught.value, ValueError) and "\n" not in str(caught.value)


# ---- explain: the table and the JSON key ---------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["--variant", "qkv"],
        ["--variant", "gqa", "--heads", "4", "--kv-heads", "2", "--embed", "random", "--dim", "8"],
        ["--variant", "scaled", "--embed", "random", "--dim", "6", "--query", "0"],
    ],
)
def test_json_distance_check_agrees_with_the_paper_rotation_of_the_traces_vectors(run_cli, args):
    status, out, err = run_cli("explain", *args, "--positional", "rope", "--format", "json")
    assert status == 0 and err == ""
    positional = json.loads(out)["positional"]
    check = positional["distance_check"]
    assert [(r["i"], r["j"]) for r in check] == list(DISTANCE_CHECK_PAIRS)
    for row in check:
        assert set(row) == {"i", "j", "distance", "score"}
        assert all(type(row[key]) is int for key in ("i", "j", "distance")) and type(row["score"]) is float
        assert row["distance"] == row["i"] - row["j"]
    qi = 0 if "--query" in args else 1  # 'cat' by default
    key = positional["distance_check_key"]
    assert key == (0 if qi != 0 else 1)
    q = torch.tensor(positional["q_unrotated"][0][qi], dtype=torch.float64)  # head 0
    k = torch.tensor(positional["k_unrotated"][0][key], dtype=torch.float64)  # key head 0, which head 0 reads
    paper = [paper_rope_score(q, k, r["i"], r["j"]) for r in check]
    torch.testing.assert_close(torch.tensor([r["score"] for r in check]), torch.tensor(paper), rtol=1e-9, atol=1e-9)
    assert max(paper[:3]) - min(paper[:3]) < 1e-9 and abs(paper[0] - paper[3]) > 1e-6


def test_no_distance_check_without_rope(run_cli):
    for positional in ("none", "sinusoidal", "alibi"):
        status, out, _ = run_cli("explain", "--variant", "qkv", "--positional", positional, "--format", "json")
        assert status == 0 and "distance_check" not in json.loads(out)["positional"]


def test_text_shows_the_distance_table_and_says_which_scores_are_equal(run_cli):
    _, data, _ = run_cli("explain", "--variant", "qkv", "--positional", "rope", "--format", "json")
    check = json.loads(data)["positional"]["distance_check"]
    status, out, err = run_cli("explain", "--variant", "qkv", "--positional", "rope")
    assert status == 0 and err == ""
    section = out.split("moved to other positions")[1].split("Step 5")[0]
    rows = [line.split() for line in section.splitlines() if line.strip()[:1].isdigit()]
    assert rows == [[str(r["i"]), str(r["j"]), str(r["distance"]), f"{r['score']:.4f}"] for r in check]
    one = f"{check[0]['score']:.4f}"
    assert f"distance 1 gives {one} at each of (1, 0), (2, 1), (5, 4)" in " ".join(section.split())
    assert f"distance 3, at (3, 0), gives {check[3]['score']:.4f}" in " ".join(section.split())


# ---- plot --kind rope-distance ---------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"variant": "qkv"},
        {"variant": "gqa", "heads": 4, "kv_heads": 2, "embed": "random", "dim": 8},
        {"variant": "multihead", "embed": "random", "dim": 8, "d_k": 4},
        {"embed": "random", "dim": 6, "seed": 3, "query": "sat"},
    ],
)
def test_picture_grids_are_constant_along_diagonals_for_rope_only(options):
    config = ExplainConfig(format="plot", **options)
    picture = rope_distance_picture(config)
    n = ROPE_DISTANCE_POSITIONS
    assert picture.rope.shape == picture.sinusoidal.shape == (n, n)
    scale = float(picture.rope.abs().max())
    assert max(diagonal_spreads(picture.rope)) < 1e-5 * max(scale, 1.0)
    assert max(diagonal_spreads(picture.sinusoidal)) > 1e-2
    assert "diagonal" in picture.titles[0] and "Sinusoidal" in picture.titles[1]
    assert f"positions 0-{n - 1}" in picture.title


def test_default_picture_turns_the_first_pair_of_the_seeds_three_features_and_keeps_the_third():
    from selfattn import build_trace

    picture = rope_distance_picture(ExplainConfig(format="plot"))
    x = build_trace(ExplainConfig()).embeddings.double()  # the seed's (7, 3) table; query 'cat', key 'The'
    q, k = x[1], x[0]
    kept = float(q[2] * k[2])  # the third feature has no partner: it adds the same amount everywhere
    paper = torch.tensor([[paper_rope_score(q[:2], k[:2], i, j) + kept for j in range(4)] for i in range(4)], dtype=torch.float64)
    torch.testing.assert_close(picture.rope[:4, :4].double(), paper, **F32)
    paper_sin = torch.tensor([[paper_sinusoidal_score(q, k, i, j) for j in range(4)] for i in range(4)], dtype=torch.float64)
    torch.testing.assert_close(picture.sinusoidal[:4, :4].double(), paper_sin, **F32)
    assert "'cat' (query) and 'The' (key)" in picture.title and "turns features 0-1 and keeps feature 2" in picture.title


def test_projected_picture_reads_the_traces_unrotated_q_and_k_of_the_chosen_head():
    from selfattn import build_trace

    options = {"variant": "gqa", "heads": 4, "kv_heads": 2, "embed": "random", "dim": 8, "d_k": 4}
    trace = build_trace(ExplainConfig(positional="rope", **options))
    picture = rope_distance_picture(ExplainConfig(format="plot", **options), head=3)
    steps = trace.steps  # with RoPE: q_plain, k_plain are q and k before the turn
    assert steps.kv_head_of[3] == 1
    q, k = steps.q_plain[3, 1], steps.k_plain[1, 0]  # head 3 reads key head 1
    paper = torch.tensor([[paper_rope_score(q, k, i, j) for j in range(5)] for i in range(5)])
    torch.testing.assert_close(picture.rope[:5, :5], paper, **F32)
    assert "head 3" in picture.title


def test_longer_sentences_widen_the_position_range():
    sentence = " ".join(f"w{i}" for i in range(20))
    picture = rope_distance_picture(ExplainConfig(sentence=sentence, format="plot", embed="random", dim=4))
    assert picture.rope.shape == (20, 20)


@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_plot_writes_the_picture(run_cli, tmp_path, suffix):
    path = tmp_path / f"rope-distance{suffix}"
    status, out, err = run_cli("plot", "--kind", "rope-distance", "-o", str(path))
    assert status == 0 and err == "" and str(path) in out
    data = path.read_bytes()
    if suffix == ".png":
        assert data.startswith(b"\x89PNG\r\n\x1a\n")
    else:
        text = data.decode("utf-8")
        assert "<svg" in text and "RoPE" in text and "diagonal" in text


@pytest.mark.parametrize(
    "args, message",
    [
        (["--dim", "1"], "at least 2"),
        (["--positional", "alibi"], "--positional alibi does not apply"),
        (["--variant", "qkv", "--d-k", "3"], "even"),
        (["--head", "1"], "--head 1 is out of range"),
        (["--variant", "multihead", "--head", "2"], "--head 2 is out of range"),
        (["--layer", "1"], "--layer 1 is out of range"),
        (["--mask", "causal"], "--mask applies to --kind mask"),
        (["--query", "dog"], "dog"),
        (["--model", "all-MiniLM-L6-v2"], "has no RoPE"),
    ],
)
def test_bad_plot_input_is_one_line_exit_2_and_leaves_no_file(run_cli, tmp_path, args, message):
    status, out, err = run_cli("plot", "--kind", "rope-distance", *args, "-o", str(tmp_path / "out.png"))
    assert status == 2 and out == "" and err.count("\n") == 1, err
    assert message in err, err
    assert os.listdir(tmp_path) == []


def test_an_odd_width_turns_its_leading_pairs_and_keeps_the_last_feature(run_cli):
    """The seed's 3-d vectors under RoPE: pair 0 turns by p radians, the third feature stays (partial rotation)."""
    status, out, _ = run_cli("explain", "--positional", "rope", "--format", "json")
    assert status == 0
    data = json.loads(out)
    x = torch.tensor(data["embeddings"], dtype=torch.float64)
    q_index = data["query"]["index"]
    turned = torch.stack([torch.cat((paper_rotate(x[p, :2], p), x[p, 2:])) for p in range(x.shape[0])])
    scores = torch.tensor(data["scores"], dtype=torch.float64)  # the simple variant: unscaled q . k
    torch.testing.assert_close(scores.reshape(turned.shape[0], -1), turned @ turned.T, **F32)
    key = data["positional"]["distance_check_key"]
    for record in data["positional"]["distance_check"]:
        i, j = record["i"], record["j"]
        expected = paper_rope_score(x[q_index, :2], x[key, :2], i, j) + float(x[q_index, 2] * x[key, 2])
        assert math.isclose(record["score"], expected, rel_tol=1e-5, abs_tol=1e-6)
    status, out, _ = run_cli("explain", "--positional", "rope")
    assert status == 0 and "the last feature has no partner" in " ".join(out.split())


@pytest.mark.parametrize("rotary_dim", [2, 4])
def test_partial_rotation_turns_the_leading_features_only(rotary_dim):
    from selfattn import apply_rope

    x = torch.randn(5, 7, dtype=torch.float64, generator=torch.Generator().manual_seed(3))  # 5 positions, width 7
    turned = apply_rope(x, rotary_dim=rotary_dim)
    for p in range(5):
        expected = torch.cat((paper_rotate(x[p, :rotary_dim], p), x[p, rotary_dim:]))
        torch.testing.assert_close(turned[p], expected)


@pytest.mark.parametrize("rotary_dim", [0, 3, 8, True, 2.0])
def test_partial_rotation_refuses_a_bad_width(rotary_dim):
    from selfattn import apply_rope

    with pytest.raises(ShapeError, match="rotary_dim"):
        apply_rope(torch.ones(3, 7), rotary_dim=rotary_dim)
