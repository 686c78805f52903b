"""`selfattn compare --model` on decoders (tiny GPT-2, Llama and Mistral folders).

Reference: transformers' own models read from the same folder with eager attention, and
their fast tokenizer: every head's top keys and weights at the query's row are
transformers' attention probabilities, sorted. Mistral's sliding window (5 keys) hides
keys a plain causal mask would show, so the top keys must come from inside it.
"""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the decoder tests compare with transformers")

import selfattn as sa  # noqa: E402
from tiny_models import reference_model, reference_tokenizer, tiny_checkpoint  # noqa: E402

FAMILIES = ("gpt2", "llama", "mistral")
A = "The cat sat on the warm mat by the door."
B = "A dog and a bird and the cat ran."
WINDOW = 5  # tiny_models' Mistral sliding window


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return {family: tiny_checkpoint(family, tmp_path_factory.mktemp(family)) for family in FAMILIES}


@pytest.fixture(scope="module")
def reference(folders):
    """run(family, sentence) -> transformers' (tokens, attentions), one text, eager attention."""
    models = {family: reference_model(folder) for family, folder in folders.items()}
    tokenizers = {family: reference_tokenizer(folder) for family, folder in folders.items()}

    def run(family: str, sentence: str):
        ids = tokenizers[family](sentence, return_tensors="pt")["input_ids"]  # (1, n)
        with torch.no_grad():
            out = models[family](input_ids=ids, output_attentions=True)
        return tokenizers[family].convert_ids_to_tokens(ids[0]), out.attentions

    return run


def run_json(run_cli, *args) -> dict:
    status, out, err = run_cli("compare", *args, "--format", "json")
    assert (status, err) == (0, ""), err
    return json.loads(out)


def expected_top(attentions, layer: int, head: int, q: int, tokens: list[str], visible) -> list[tuple[str, int, float]]:
    row = attentions[layer][0, head, q]  # (n,)
    keys = sorted(visible, key=lambda j: -float(row[j]))
    return [(tokens[j], j, float(row[j])) for j in keys[:3]]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("query", ["cat", "the"])
def test_top_keys_are_transformers_weights_at_the_query_row(run_cli, folders, reference, family, query):
    data = run_json(run_cli, A, B, "--query", query, "--model", str(folders[family]))
    tokens_a, att_a = reference(family, A)
    tokens_b, att_b = reference(family, B)
    assert data["tokens"] == [tokens_a, tokens_b]
    qa, qb = tokens_a.index("Ġ" + query), tokens_b.index("Ġ" + query)  # found by the way it reads: ' cat'
    assert (data["query"]["index_a"], data["query"]["index_b"], data["query"]["token_a"]) == (qa, qb, "Ġ" + query)
    assert max(qa, qb) >= WINDOW  # far enough in for Mistral's window to hide keys
    window = WINDOW if family == "mistral" else None
    for entry in data["heads"]:
        layer, head = entry["layer"], entry["head"]
        for side, q, tokens, attentions in (("a", qa, tokens_a, att_a), ("b", qb, tokens_b, att_b)):
            visible = range(0 if window is None else max(0, q - window + 1), q + 1)
            got = [(t["token"], t["index"], t["weight"]) for t in entry[f"top_{side}"]]
            want = expected_top(attentions, layer, head, q, tokens, visible)
            assert [g[:2] for g in got] == [w[:2] for w in want], (layer, head, side)
            torch.testing.assert_close(torch.tensor([g[2] for g in got]), torch.tensor([w[2] for w in want]),
                                       atol=1e-5, rtol=0)
            assert all(t["index"] <= q for t in entry[f"top_{side}"])  # no key after the query


@pytest.mark.parametrize("family", FAMILIES)
def test_no_key_after_the_query_gets_weight(folders, reference, family):
    c = sa.compare(A, B, "cat", model=str(folders[family]))
    _, att_a = reference(family, A)
    q = c.index_a
    assert torch.all(c.weights_a[:, :, q + 1:] == 0)
    expected = torch.stack([a[0, :, q] for a in att_a])  # (L, H, n): transformers' query rows
    torch.testing.assert_close(c.weights_a, expected, atol=1e-5, rtol=0)
    assert c.similarity is None and any("No sentence similarity" in note for note in c.notes)
    second = sa.compare(A, B, "1", model=str(folders[family]))  # it sees two keys: no hidden one fills the top 3
    assert all([t.index for t in h.top_a] in ([0, 1], [1, 0]) for h in second.heads)
    assert c.positional == ("learned" if family == "gpt2" else "rope")


def test_query_by_readable_form_raw_token_or_position(folders):
    folder = str(folders["llama"])
    by_word, by_token, by_position = (sa.compare(A, B, q, model=folder) for q in ("cat", "Ġcat", "2"))
    assert (by_word.index_a, by_word.token_a) == (by_token.index_a, by_token.token_a) == (2, "Ġcat")
    assert by_position.index_a == by_position.index_b == 2
    assert by_word.heads == by_token.heads


def test_text_output_speaks_of_the_decoders_own_tokens(run_cli, folders):
    status, out, err = run_cli("compare", A, B, "--query", "cat", "--model", str(folders["llama"]))
    assert (status, err) == (0, ""), err
    prose = " ".join(out.split())
    assert "[CLS]" not in out and "WordPiece" not in out
    assert "(<s> is token 0)" in prose and "␣cat #2" in out
    assert "causal decoder" in prose and "grouped-query attention" in prose
    assert "No sentence similarity" in prose and "Sentence similarity:" not in prose
    assert f"--model {folders['llama']}" in out  # the commands to rerun name the folder given
    status, out, _ = run_cli("compare", A, B, "--query", "cat", "--model", str(folders["gpt2"]))
    assert status == 0 and "is token 0" not in out  # GPT-2 puts no special token first


@pytest.mark.parametrize(
    "args, message",
    [
        (["--query", "by"], "the query 'by' is not in sentence B"),
        (["--query", "door"], "cuts the query 'door' into 2 tokens ('do', 'or'): give one of them, e.g. 'do'"),
        (["--query", "40"], "sentence A: query position 40 is out of range"),
        (["--query", "cat", "--variant", "gqa"], "--variant does not apply with --model"),
    ],
)
def test_decoder_errors_are_one_line(run_cli, folders, args, message):
    status, out, err = run_cli("compare", A, B, "--model", str(folders["gpt2"]), *args)
    assert (status, out) == (2, "")
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert message in err, err
