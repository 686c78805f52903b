"""`selfattn compare` and ``selfattn.compare``: one query token in two sentences.

References: two separate runs of `selfattn explain --format json` on the same sentences
(the weights of the query's row, with the top three and the entropy worked out here with
plain Python loops), and for the model transformers' own BertModel (hidden states and
mean-pooled sentence embeddings), which shares nothing with our code but the weights.
"""

import json
import math

import pytest
import torch
from minilm_reference import MODEL, needs_model, run_reference

import selfattn as sa
from selfattn.errors import OptionError, QueryError, SentenceError

A, B = "I sat by the river bank", "I paid at the bank"
TOY_A, TOY_B = "the cat saw the dog", "a dog saw the cat today"
RANDOM = ["--embed", "random", "--dim", "8"]
TOY_CASES = [
    ("simple", []),
    ("scaled", []),
    ("qkv", ["--d-k", "3"]),
    ("causal", []),
    ("multihead", ["--heads", "2"]),
    ("gqa", ["--heads", "4", "--kv-heads", "2", "--positional", "rope"]),
    ("flash", ["--block-size", "2"]),
]
MODEL_HEADS = [(0, 0), (2, 5), (5, 11), (3, 7)]


def run_json(run_cli, *args):
    status, out, err = run_cli(*args, "--format", "json")
    assert (status, err) == (0, ""), err
    return json.loads(out)


def expected_top(row, tokens, allowed=None):
    """The three largest weights, largest first, ties in sentence order; masked keys left out."""
    keys = [j for j in range(len(row)) if allowed is None or allowed[j]]
    best = []
    for _ in range(min(3, len(keys))):
        pick = None
        for j in keys:  # the first of equal weights wins
            if j not in best and (pick is None or row[j] > row[pick]):
                pick = j
        best.append(pick)
    return [{"token": tokens[j], "index": j, "weight": row[j]} for j in best]


def entropy_bits(row):
    return -sum(p * math.log2(p) for p in row if p > 0)


def assert_head_matches(entry, side, row, tokens, allowed=None):
    expected = expected_top(row, tokens, allowed)
    got = entry[f"top_{side}"]
    assert [(e["token"], e["index"]) for e in got] == [(e["token"], e["index"]) for e in expected], (entry, expected)
    torch.testing.assert_close(torch.tensor([e["weight"] for e in got], dtype=torch.float64),
                               torch.tensor([e["weight"] for e in expected], dtype=torch.float64), rtol=0, atol=1e-12)
    assert entry[f"entropy_{side}"] == pytest.approx(entropy_bits(row), abs=1e-9)


# ---------------------------------------------------------------- toy variants


@pytest.mark.parametrize("variant, extra", TOY_CASES, ids=[c[0] for c in TOY_CASES])
def test_toy_variants_match_two_explain_runs(run_cli, variant, extra):
    options = ["--variant", variant, *RANDOM, *extra]
    data = run_json(run_cli, "compare", TOY_A, TOY_B, "--query", "cat", *options)
    runs = [run_json(run_cli, "explain", s, "--query", "cat", *options) for s in (TOY_A, TOY_B)]
    assert data["sentences"] == [TOY_A, TOY_B]
    assert data["query"]["token"] == "cat"
    assert (data["query"]["index_a"], data["query"]["index_b"]) == (1, 4) == tuple(r["query"]["index"] for r in runs)
    n_heads = 4 if variant == "gqa" else 2 if variant == "multihead" else 1
    assert [(h["layer"], h["head"]) for h in data["heads"]] == [(0, h) for h in range(n_heads)]
    assert "token_cosine" not in data and "similarity" not in data
    for side, run in zip("ab", runs):
        rows = run["query"]["weights"]
        rows = rows if n_heads > 1 else [rows]  # single-head variants drop the heads axis
        allowed = run["mask"]["allowed"][run["query"]["index"]] if "mask" in run else None
        for entry, row in zip(data["heads"], rows):
            assert_head_matches(entry, side, row, run["tokens"], allowed)


def test_causal_leaves_out_the_keys_the_mask_hides(run_cli):
    data = run_json(run_cli, "compare", TOY_A, TOY_B, "--query", "cat", "--variant", "causal", *RANDOM)
    assert [e["index"] for e in data["heads"][0]["top_a"]] in ([0, 1], [1, 0])  # 'cat' sees 'the' and itself
    assert len(data["heads"][0]["top_b"]) == 3


@pytest.mark.parametrize("fmt", ["text", "markdown", "json"])
@pytest.mark.parametrize("variant", ["simple", "scaled", "multihead", "gqa"])
def test_toy_variants_in_every_format(run_cli, variant, fmt):
    status, out, err = run_cli("compare", TOY_A, TOY_B, "--query", "dog", "--variant", variant, "--format", fmt)
    assert (status, err) == (0, ""), err
    if fmt == "json":
        data = json.loads(out)
        assert data["variant"] == variant and data["query"]["index_a"] == 4 and data["query"]["index_b"] == 1
        return
    assert "\x1b" not in out
    prose = " ".join(out.replace("\\_", "_").split())  # markdown escapes the underscores
    for heading in ("top 3 in A", "top 3 in B", "H_A", "H_B"):
        assert heading in prose
    assert "count from 0" in prose and "dog #4" in out and "dog #1" in out
    if fmt == "markdown":
        assert out.startswith("# Comparing 'dog' in two sentences\n")
        assert "| layer | head | top 3 in A | top 3 in B | H\\_A | H\\_B |" in out


def test_text_rows_show_the_json_numbers(run_cli):
    args = ["compare", TOY_A, TOY_B, "--query", "cat", "--variant", "multihead", *RANDOM]
    data = run_json(run_cli, *args)
    status, out, _ = run_cli(*args, "--precision", "3")
    assert status == 0
    for h in data["heads"]:
        top = ", ".join(f"{e['token']} #{e['index']} {e['weight']:.3f}" for e in h["top_a"])
        line = next(line for line in out.splitlines() if top in line)
        assert line.split()[:2] == ["0", str(h["head"])]
        assert line.split()[-2:] == [f"{h['entropy_a']:.3f}", f"{h['entropy_b']:.3f}"]


def test_both_sentences_share_one_embedding_table(run_cli):
    """'auto' on its own would take the seed's table for A and random vectors for B."""
    data = run_json(run_cli, "compare", "The cat sat on the mat", "The cat saw a dog", "--query", "cat")
    assert data["embedding_source"].startswith("seeded random")
    seed = run_json(run_cli, "compare", "The cat sat on the mat", "the warm cat", "--query", "cat")
    assert seed["embedding_source"] == "the seed's hand-made 3-dimensional table"


def test_a_position_picks_that_position_in_both(run_cli):
    data = run_json(run_cli, "compare", TOY_A, TOY_B, "--query", "2")
    assert data["query"] == {"token": "saw", "index_a": 2, "index_b": 2, "token_a": "saw", "token_b": "saw"}
    data = run_json(run_cli, "compare", TOY_A, TOY_B, "--query", "1")
    assert (data["query"]["token_a"], data["query"]["token_b"]) == ("cat", "dog")


def test_python_api_returns_the_record():
    c = sa.compare(TOY_A, TOY_B, "cat", variant="gqa", heads=4, kv_heads=2, embed="random", dim=8)
    assert isinstance(c, sa.Comparison) and isinstance(c.heads[0], sa.HeadComparison)
    assert (c.n_layers, c.n_heads, c.index_a, c.index_b, c.token_a, c.token_b) == (1, 4, 1, 4, "cat", "cat")
    assert c.weights_a.shape == (1, 4, 5) and c.weights_b.shape == (1, 4, 6)
    torch.testing.assert_close(c.weights_a.sum(-1), torch.ones(1, 4))
    assert c.token_cosine is None and c.similarity is None and c.vectors_a is None
    with pytest.raises(OptionError, match="precision"):
        sa.compare(TOY_A, TOY_B, "cat", precision=3)
    with pytest.raises(SentenceError, match="sentence B is empty"):
        sa.compare(TOY_A, " ", "cat")


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize(
    "args, message",
    [
        ([TOY_A, "a dog ran", "--query", "cat"], "the query 'cat' is not in sentence B"),
        (["a dog ran", TOY_A, "--query", "cat"], "the query 'cat' is not in sentence A"),
        ([TOY_A, TOY_B, "--query", "Cat"], "the query 'Cat' is not in sentence A"),
        ([TOY_A, "a dog", "--query", "4"], "sentence B: query position 4 is out of range"),
        ([TOY_A, "", "--query", "cat"], "sentence B is empty"),
        ([TOY_A, TOY_B, "--query", "cat", "--precision", "11"], "--precision must be an integer from 0 to 10"),
        ([TOY_A, TOY_B, "--query", "cat", "--variant", "nope"], "unknown variant 'nope'"),
        ([TOY_A, TOY_B, "--query", "cat", "--heads", "3"], "--heads applies to --variant multihead or gqa"),
        ([TOY_A, TOY_B, "--query", "cat", "--embed", "seed"], "sentence A:"),
        ([TOY_A, "\udcff", "--query", "cat"], "sentence B is not UTF-8"),
        ([TOY_A, TOY_B], "the following arguments are required: --query"),
    ],
)
def test_user_errors_are_one_line(run_cli, args, message):
    status, out, err = run_cli("compare", *args)
    assert (status, out) == (2, "")
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert message in err, err


# ---------------------------------------------------------------- the model


@pytest.fixture(scope="module")
def reference():
    """transformers' BertModel (eager) and its tokenizer, offline; skips without them."""
    from minilm_reference import reference as load_reference

    model, _, fast = load_reference()
    return model, fast


def reference_hidden(reference, sentence):
    tokens, out = run_reference(*reference, sentence, output_hidden_states=True)
    return tokens, [h[0].double() for h in out.hidden_states]


@needs_model
def test_model_heads_match_explain_for_chosen_layers_and_heads(run_cli):
    data = run_json(run_cli, "compare", A, B, "--query", "bank", "--model", MODEL)
    assert data["query"] == {"token": "bank", "index_a": 6, "index_b": 5, "token_a": "bank", "token_b": "bank"}
    assert [(h["layer"], h["head"]) for h in data["heads"]] == [(layer, head) for layer in range(6) for head in range(12)]
    for layer, head in MODEL_HEADS:
        entry = data["heads"][layer * 12 + head]
        for side, sentence in zip("ab", (A, B)):
            run = run_json(run_cli, "explain", sentence, "--model", MODEL, "--layer", str(layer), "--head", str(head),
                           "--query", "bank")
            row = run["weights"][run["query"]["index"]]
            assert_head_matches(entry, side, row, run["tokens"])
            assert entry[f"top_{side}"] == run["top"]  # explain's own top three, to the last digit


@needs_model
def test_model_cosines_and_similarity_match_transformers(run_cli, reference):
    data = run_json(run_cli, "compare", A, B, "--query", "BANK", "--model", MODEL)  # any case
    (tokens_a, hidden_a), (tokens_b, hidden_b) = (reference_hidden(reference, s) for s in (A, B))
    assert data["tokens"] == [tokens_a, tokens_b]
    qa, qb = tokens_a.index("bank"), tokens_b.index("bank")
    expected = [float(torch.nn.functional.cosine_similarity(ha[qa], hb[qb], dim=0)) for ha, hb in zip(hidden_a, hidden_b)]
    assert len(data["token_cosine"]) == 7
    torch.testing.assert_close(torch.tensor(data["token_cosine"]), torch.tensor(expected), rtol=0, atol=1e-5)
    model, tokenizer = reference
    encoded = tokenizer([A, B], return_tensors="pt", padding=True)
    with torch.no_grad():
        last = model(**encoded).last_hidden_state.double()  # (2, seq, d)
    mask = encoded["attention_mask"].double()[..., None]
    pooled = torch.nn.functional.normalize((last * mask).sum(1) / mask.sum(1), dim=-1)
    assert data["similarity"] == pytest.approx(float(pooled[0] @ pooled[1]), abs=1e-5)
    similarity = run_json(run_cli, "similarity", A, B)
    assert data["similarity"] == pytest.approx(similarity["similarity"][0][1], abs=1e-12)  # the same number


@needs_model
def test_model_text_output(run_cli):
    status, out, err = run_cli("compare", A, B, "--query", "bank", "--model", MODEL)
    assert (status, err) == (0, ""), err
    prose = " ".join(out.split())
    assert out.startswith(f"Comparing 'bank' in two sentences with {MODEL}\n")
    assert "([CLS] is token 0)" in prose and "count from 0" in prose
    assert " after " in out and " embeddings " in out and " layer 5 " in out
    assert "Sentence similarity: 0." in prose
    assert sum(line.split()[:1] in (["0"], ["5"]) for line in out.splitlines()) >= 24  # layers 0 and 5, 12 heads each
    c = sa.compare(A, B, "bank", model=MODEL)
    assert c.vectors_a.shape == c.vectors_b.shape == (7, 384)
    assert f"{c.token_cosine[-1]:.3f}" in out


@needs_model
@pytest.mark.parametrize(
    "args, message",
    [
        (["--query", "river"], "the query 'river' is not in sentence B"),
        (["--query", "paid"], "the query 'paid' is not in sentence A"),
        (["--query", "embeddings"], "cuts the query 'embeddings' into 4 tokens ('em', '##bed', '##ding', '##s')"),
        (["--query", "8"], "sentence A: query position 8 is out of range"),
        (["--query", "bank", "--dim", "4"], "--dim does not apply with --model"),
        (["--query", "bank", "--variant", "gqa"], "--variant does not apply with --model"),
    ],
)
def test_model_errors_are_one_line(run_cli, args, message):
    status, out, err = run_cli("compare", A, B, "--model", MODEL, *args)
    assert (status, out) == (2, "")
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert message in err, err


@needs_model
def test_a_word_the_tokenizer_rewrites_is_found():
    c = sa.compare("a café by the bank", "the Café was shut", "Café", model=MODEL)
    assert (c.token_a, c.index_a, c.index_b) == ("cafe", 2, 2)
    with pytest.raises(QueryError, match="sentence B"):
        sa.compare("a café by the bank", "a shop", "Café", model=MODEL)
