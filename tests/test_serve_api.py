"""The live app's API through FastAPI's test client, every endpoint against the library.

The references are independent of the server's code: ``selfattn explain --format json``'s
own output, a model loaded by ``load_pretrained`` and called directly, ``generate``, and
``ablate``. Then every kind of bad request: a 4xx with one JSON line, and the server
still answers the next request.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import socket
import subprocess
import sys

import pytest
import torch

pytest.importorskip("fastapi", reason="the live app needs fastapi (make run installs it)")
from fastapi.testclient import TestClient  # noqa: E402

import selfattn as sa  # noqa: E402
from selfattn.cli import main  # noqa: E402
from selfattn.commands.live import LiveModels  # noqa: E402
from selfattn.models.generation import sampling_probs  # noqa: E402
from selfattn.serve.app import create_app  # noqa: E402
from selfattn.serve.run import bind  # noqa: E402

STORY = "Once upon a time, there was a little girl named Lily. She loved to play"
NDJSON = {"accept": "application/x-ndjson"}


@pytest.fixture(scope="module")
def client():
    with TestClient(create_app(LiveModels())) as test_client:
        yield test_client


@pytest.fixture(scope="module")
def library():
    """The reference: each model loaded on its own, outside the server."""
    loaded = {}

    def get(name):
        if name not in loaded:
            loaded[name] = sa.load_pretrained(name)
        return loaded[name]

    return get


def cli_json(*argv: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["explain", *argv, "--format", "json"]) == 0
    return out.getvalue()


# ---- models ----------------------------------------------------------------------------

def test_models_lists_the_built_in_ones_with_their_sizes(client, library):
    listing = client.get("/api/models").json()["models"]
    by_name = {entry["name"]: entry for entry in listing}
    assert list(by_name)[:5] == ["all-MiniLM-L6-v2", "tiny-induction", "tiny-shakespeare", "stories260K",
                                 "SmolLM2-135M-Instruct"]
    for name in ("tiny-induction", "stories260K"):
        config = library(name).config
        entry = by_name[name]
        assert (entry["kind"], entry["layers"], entry["heads"], entry["kv_heads"], entry["positions"]) == (
            "decoder", config.n_layers, config.n_heads, config.n_kv_heads, config.max_positions)
    assert by_name["SmolLM2-135M-Instruct"]["chat"] is True  # its file carries a chat template
    assert by_name["stories260K"]["chat"] is False and "chat" not in by_name["all-MiniLM-L6-v2"]
    bert = library("all-MiniLM-L6-v2").config
    assert (by_name["all-MiniLM-L6-v2"]["kind"], by_name["all-MiniLM-L6-v2"]["layers"],
            by_name["all-MiniLM-L6-v2"]["heads"], by_name["all-MiniLM-L6-v2"]["positions"]) == (
        "encoder", bert.num_hidden_layers, bert.num_attention_heads, bert.max_position_embeddings)


def test_a_model_loads_on_first_use_and_stays():
    models = LiveModels()
    with TestClient(create_app(models)) as fresh:
        assert not any(entry["loaded"] for entry in fresh.get("/api/models").json()["models"])
        assert fresh.post("/api/attention", json={"model": "tiny-induction", "text": "abc", "layer": 0, "head": 0}).status_code == 200
        first = models.model("tiny-induction")
        loaded = {e["name"]: e["loaded"] for e in fresh.get("/api/models").json()["models"]}
        assert loaded == {"all-MiniLM-L6-v2": False, "tiny-induction": True, "tiny-shakespeare": False, "stories260K": False,
                          "SmolLM2-135M-Instruct": False}
        fresh.post("/api/attention", json={"model": "stories260K", "text": "Once", "layer": 0, "head": 0})
        fresh.post("/api/attention", json={"model": "tiny-shakespeare", "text": "To be", "layer": 0, "head": 0})
        assert models.model("tiny-induction") is first  # not evicted by two more models


# ---- explain ---------------------------------------------------------------------------

@pytest.mark.parametrize(
    "body, argv",
    [
        ({}, []),
        ({"query": 2, "format": "json"}, ["--query", "2"]),
        ({"text": "the dog ran home", "query": "dog", "variant": "qkv"}, ["the dog ran home", "--query", "dog", "--variant", "qkv"]),
        ({"variant": "multihead", "positional": "rope"}, ["--variant", "multihead", "--positional", "rope"]),
        ({"variant": "gqa", "heads": 4, "kv_heads": 2, "precision": 6}, ["--variant", "gqa", "--heads", "4", "--kv-heads", "2", "--precision", "6"]),
        ({"variant": "flash", "block_size": 3, "query": -1}, ["--variant", "flash", "--block-size", "3", "--query", "-1"]),
        ({"embed": "random", "dim": 5, "seed": 7, "positional": "sinusoidal"}, ["--embed", "random", "--dim", "5", "--seed", "7", "--positional", "sinusoidal"]),
        ({"model": "all-MiniLM-L6-v2", "text": "The cat sat.", "layer": 1, "head": 2, "query": "cat"},
         ["The cat sat.", "--model", "all-MiniLM-L6-v2", "--layer", "1", "--head", "2", "--query", "cat"]),
    ],
)
def test_explain_is_the_cli_json(client, body, argv):
    response = client.post("/api/explain", json=body)
    assert response.status_code == 200, response.text
    assert response.text == cli_json(*argv)


def test_variants_are_the_names_explain_takes(client):
    from selfattn.positional import POSITIONAL_NAMES
    from selfattn.trace.variant_names import VARIANTS

    names = client.get("/api/variants").json()
    assert names == {"variants": list(VARIANTS), "positional": list(POSITIONAL_NAMES)}
    for variant in names["variants"]:
        assert client.post("/api/explain", json={"variant": variant}).status_code == 200


@pytest.mark.parametrize("params, argv", [
    ({"model": "stories260K", "text": "Once upon a time", "layer": 1, "head": 3},
     ["Once upon a time", "--model", "stories260K", "--layer", "1", "--head", "3"]),
    ({"variant": "multihead", "heads": 4, "head": 3, "query": 2}, ["--variant", "multihead", "--heads", "4", "--head", "3", "--query", "2"]),
])
def test_explorer_is_the_view_page(client, tmp_path, params, argv):
    response = client.get("/explorer", params=params)
    assert response.status_code == 200
    page = tmp_path / "view.html"
    assert main(["view", *argv, "-o", str(page)]) == 0
    assert response.text == page.read_text(encoding="utf-8")


# ---- attention -------------------------------------------------------------------------

@pytest.mark.parametrize("name, text, layer, head", [
    ("tiny-induction", "abcdefgabcdefg", 1, 2),
    ("stories260K", STORY, 2, 5),
    ("all-MiniLM-L6-v2", "The cat sat on the warm mat.", 3, 7),
])
def test_attention_is_the_models_own_weights(client, library, name, text, layer, head):
    answer = client.post("/api/attention", json={"model": name, "text": text, "layer": layer, "head": head}).json()
    out = library(name)(text, output_attentions=True)
    expected = out.attentions[layer][0, head]
    assert answer["tokens"] == out.tokens[0]
    got = torch.tensor(answer["weights"], dtype=torch.float64)
    torch.testing.assert_close(got, expected.double(), atol=1e-6, rtol=0)
    assert float(expected.max(dim=-1).values.min()) > 2 / len(answer["tokens"])  # far from uniform: a real head
    for i, (start, end) in enumerate(answer["mask_ranges"]):  # the drawn mask is where the weights are 0
        assert got[i, :start].abs().sum() == 0 and got[i, end:].abs().sum() == 0
        assert got[i, start:end].sum() == pytest.approx(1, abs=1e-5)
    every = client.post("/api/attention", json={"model": name, "text": text, "layer": layer, "head": "all"}).json()
    torch.testing.assert_close(torch.tensor(every["weights"], dtype=torch.float64), out.attentions[layer][0].double(),
                               atol=1e-6, rtol=0)


def test_attention_says_which_key_value_head_each_head_reads(client, library):
    answer = client.post("/api/attention", json={"model": "stories260K", "text": "Once", "layer": 0, "head": 0}).json()
    config = library("stories260K").config
    assert answer["kv_heads"] == config.n_kv_heads == 4
    assert answer["kv_head_of"] == [h // 2 for h in range(8)]
    assert answer["positional"] == "rope" and answer["causal"] is True


# ---- generate --------------------------------------------------------------------------

def reference_steps(model, text, n, temperature=0.0, top_k=None, top_p=None, seed=0):
    """generate's ids, and each step's top-10 probabilities and attention rows from one full forward."""
    result = model.generate(text, n, temperature, top_k, top_p, seed)
    ids = result.prompt_ids[0] + result.ids[0]
    with torch.no_grad():
        out = model(ids, output_attentions=True)
    prompt = len(result.prompt_ids[0])
    steps = []
    for t in range(len(result.ids[0])):
        row = prompt + t - 1  # the query that chose token t
        logits = out.logits[0, row:row + 1]
        probs = (torch.softmax(logits.double(), -1) if temperature == 0
                 else sampling_probs(logits, temperature, top_k, top_p))[0]
        steps.append((probs, [w[0, :, row, : row + 1] for w in out.attentions]))
    return result, steps


@pytest.mark.parametrize("options", [
    {},
    {"temperature": 0.8, "top_k": 20, "seed": 3},
    {"temperature": 1.2, "top_p": 0.9, "seed": 11},
])
def test_generate_is_generate(client, library, options):
    model = library("stories260K")
    body = {"model": "stories260K", "text": "Once upon a time", "max_new_tokens": 6, **options}
    answer = client.post("/api/generate", json=body).json()
    result, steps = reference_steps(model, "Once upon a time", 6, options.get("temperature", 0.0),
                                    options.get("top_k"), options.get("top_p"), options.get("seed", 0))
    assert answer["ids"] == result.ids[0] and answer["text"] == result.text[0]
    assert answer["prompt_ids"] == result.prompt_ids[0]
    for step, (probs, rows) in zip(answer["steps"], steps, strict=True):
        top = [item["id"] for item in step["top"]]
        assert top == probs.topk(len(top)).indices.tolist()
        assert [item["p"] for item in step["top"]] == pytest.approx(probs[top].tolist(), abs=1e-6)
        assert step["p"] == pytest.approx(float(probs[step["id"]]), abs=1e-6)
        for layer, expected in enumerate(rows):
            torch.testing.assert_close(torch.tensor(step["attention"][layer], dtype=torch.float64), expected.double(),
                                       atol=1e-6, rtol=0)
        assert step["cache"]["length"] == len(answer["prompt_ids"]) + step["step"]


def test_stepping_one_token_at_a_time_repeats_the_longer_run(client):
    body = {"model": "stories260K", "text": "Lily", "temperature": 0.9, "seed": 5}
    longest = client.post("/api/generate", json={**body, "max_new_tokens": 5}).json()
    for n in range(1, 5):
        shorter = client.post("/api/generate", json={**body, "max_new_tokens": n}).json()
        assert shorter["ids"] == longest["ids"][:n]
        for step, same in zip(shorter["steps"], longest["steps"][:n], strict=True):
            assert [i["id"] for i in step["top"]] == [i["id"] for i in same["top"]]
            assert [i["p"] for i in step["top"]] == pytest.approx([i["p"] for i in same["top"]], abs=1e-6)
            assert step["cache"] == same["cache"]


def test_streaming_sends_the_same_steps_line_by_line(client):
    body = {"model": "tiny-induction", "text": "abcdefabc", "max_new_tokens": 4}
    whole = client.post("/api/generate", json=body).json()
    with client.stream("POST", "/api/generate", json=body, headers=NDJSON) as response:
        assert response.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(line) for line in response.iter_lines() if line]
    assert [line["event"] for line in lines] == ["start"] + ["token"] * 4 + ["step"] * 4 + ["done"]
    assert [line["id"] for line in lines[1:5]] == whole["ids"]  # each token as it was chosen
    assert [{k: v for k, v in line.items() if k != "event"} for line in lines[5:-1]] == whole["steps"]
    assert lines[-1]["ids"] == whole["ids"] and lines[0]["prompt_ids"] == whole["prompt_ids"]


def test_first_step_leaves_out_the_steps_the_page_has(client):
    body = {"model": "stories260K", "text": "Once upon a time", "max_new_tokens": 5, "temperature": 0.7, "seed": 2}
    every = client.post("/api/generate", json=body).json()
    later = client.post("/api/generate", json={**body, "first_step": 3}).json()
    assert later["ids"] == every["ids"] and later["text"] == every["text"]
    assert [step["step"] for step in later["steps"]] == [3, 4]
    assert later["steps"] == every["steps"][3:]
    with client.stream("POST", "/api/generate", json={**body, "first_step": 4}, headers=NDJSON) as response:
        events = [json.loads(line)["event"] for line in response.iter_lines() if line]
    assert events == ["start"] + ["token"] * 5 + ["step", "done"]


def test_a_chat_is_the_models_own_chat(client, library):
    """messages: the model's template lays the conversation out; the answer stops at its end of turn."""
    from selfattn.render.visual.token_labels import token_label

    name = "SmolLM2-135M-Instruct"
    model = library(name)
    messages = [{"role": "system", "content": "Answer in one short sentence."},
                {"role": "user", "content": "What is the capital of France?"}]
    with client.stream("POST", "/api/generate", json={"model": name, "messages": messages, "max_new_tokens": 16},
                       headers=NDJSON) as response:
        assert response.status_code == 200
        lines = [json.loads(line) for line in response.iter_lines() if line]
    start, done = lines[0], lines[-1]
    tokens = [line for line in lines if line["event"] == "token"]
    steps = [line for line in lines if line["event"] == "step"]
    result = model.chat(messages, 16)
    assert start["chat"] is True and start["prompt_ids"] == model.chat_ids(messages) == result.prompt_ids[0]
    assert done["ids"] == result.ids[0] and done["text"] == result.text[0] and "Paris" in done["text"]
    assert done["ids"][-1] in model.config.eos_ids and len(done["ids"]) < 16  # it stopped at the end of its turn
    assert "".join(token["text"] for token in tokens) == done["text"]  # each token line says the text it adds
    # The labels read as the text does ('␣Paris', not the vocabulary's 'ĠParis').
    readable = model.tokenizer.readable(start["prompt_ids"])
    assert start["prompt_labels"] == [token_label(t, r) for t, r in zip(start["prompt_tokens"], readable)]
    assert any(label == "␣France" for label in start["prompt_labels"])
    # Each step's attention covers the whole conversation: the rows of one forward over it.
    ids = result.prompt_ids[0] + result.ids[0]
    with torch.no_grad():
        out = model(ids, output_attentions=True)
    for step in (steps[0], steps[-1]):
        row = len(result.prompt_ids[0]) + step["step"] - 1
        for layer in (0, 18, 29):
            torch.testing.assert_close(torch.tensor(step["attention"][layer], dtype=torch.float64),
                                       out.attentions[layer][0, :, row, : row + 1].double(), atol=1e-5, rtol=0)
        assert step["cache"]["length"] == row + 1


def test_knocked_out_heads_are_ablates(client, library):
    model = library("tiny-induction")
    heads = [[1, 0], [1, 1], [1, 2], [1, 3]]
    text = "abcdefghijklmnopabcdefg"
    answer = client.post("/api/generate", json={"model": "tiny-induction", "text": text, "max_new_tokens": 4,
                                                "ablate": heads}).json()
    plain = client.post("/api/generate", json={"model": "tiny-induction", "text": text, "max_new_tokens": 4}).json()
    with sa.ablate(model, heads):
        result, steps = reference_steps(model, text, 4)
    assert answer["ids"] == result.ids[0] and answer["ablate"] == heads
    assert plain["ids"] != answer["ids"]  # the induction heads copied "hijk"; without them the copy breaks
    for step, (probs, rows) in zip(answer["steps"], steps, strict=True):
        assert [item["p"] for item in step["top"]] == pytest.approx(probs[[i["id"] for i in step["top"]]].tolist(), abs=1e-6)
        torch.testing.assert_close(torch.tensor(step["attention"][1], dtype=torch.float64), rows[1].double(), atol=1e-6, rtol=0)
    assert plain["steps"][0]["top"][0]["token"] == "h" and plain["steps"][0]["top"][0]["p"] > 0.5


def test_generation_past_the_window_shows_what_each_step_saw(client, library):
    model = library("tiny-induction")
    text = "abcdefghijklmnopqrstuvwxyz" * 2 + "abcdefghij"  # 63 tokens with BOS; the window is 64
    answer = client.post("/api/generate", json={"model": "tiny-induction", "text": text, "max_new_tokens": 6}).json()
    result = model.generate(text, 6)
    assert answer["ids"] == result.ids[0] and answer["window_slid_at"] == result.window_slid_at is not None
    everything = result.prompt_ids[0] + result.ids[0]
    for t, step in enumerate(answer["steps"]):
        start = result.window_starts[0][t]
        seen = everything[start:len(result.prompt_ids[0]) + t]
        assert step["cache"]["start"] == start and step["cache"]["length"] == len(seen)
        with torch.no_grad():
            rows = model(seen, output_attentions=True).attentions[0][0, :, -1]
        torch.testing.assert_close(torch.tensor(step["attention"][0], dtype=torch.float64), rows.double(), atol=1e-6, rtol=0)


# ---- bad requests ----------------------------------------------------------------------

BAD = [
    ("/api/attention", {"model": "gpt-5", "text": "hi", "layer": 0, "head": 0}, 404, "unknown model"),
    ("/api/attention", {"model": "/etc", "text": "hi", "layer": 0, "head": 0}, 404, "unknown model"),
    ("/api/attention", {"model": "../models/trained/tiny-induction", "text": "hi"}, 404, "unknown model"),
    ("/api/attention", {"model": "tiny-induction", "text": "hi", "layer": 2, "head": 0}, 400, "layer 2 is out of range"),
    ("/api/attention", {"model": "tiny-induction", "text": "hi", "layer": 0, "head": 4}, 400, "head 4 is out of range"),
    ("/api/attention", {"model": "tiny-induction", "text": "hi", "layer": -1, "head": 0}, 400, "layer must be"),
    ("/api/attention", {"model": "tiny-induction", "text": "hi", "layer": 0.5, "head": 0}, 400, "layer must be"),
    ("/api/attention", {"model": "tiny-induction", "text": "a" * 80, "layer": 0, "head": 0}, 400, "64 positions"),
    ("/api/attention", {"model": "tiny-induction", "text": "", "layer": 0, "head": 0}, 400, "text is empty"),
    ("/api/attention", {"model": "tiny-induction", "text": 5, "layer": 0, "head": 0}, 400, "text must be a string"),
    ("/api/attention", {"model": "tiny-induction", "text": "x" * 30_000}, 400, "at most 20000"),
    ("/api/attention", {"model": "tiny-induction", "text": "hi", "path": "/tmp"}, 400, 'no field "path"'),
    ("/api/generate", {"model": "all-MiniLM-L6-v2", "text": "hi"}, 400, "is an encoder"),
    ("/api/generate", {"model": "stories260K", "text": "hi", "max_new_tokens": 0}, 400, "max_new_tokens must be"),
    ("/api/generate", {"model": "stories260K", "text": "hi", "max_new_tokens": 100_000}, 400, "max_new_tokens must be"),
    ("/api/generate", {"model": "stories260K", "text": "hi", "temperature": -1}, 400, "temperature must be"),
    ("/api/generate", {"model": "stories260K", "text": "hi", "temperature": 1e9}, 400, "temperature must be"),
    ("/api/generate", {"model": "stories260K", "text": "hi", "top_k": 0}, 400, "top_k must be"),
    ("/api/generate", {"model": "stories260K", "text": "hi", "top_p": 0}, 400, "top_p must be"),
    ("/api/generate", {"model": "stories260K", "text": "hi", "top_p": 1.5}, 400, "top_p must be"),
    ("/api/generate", {"model": "stories260K", "text": "hi", "seed": -3}, 400, "seed must be"),
    ("/api/generate", {"model": "stories260K", "text": "hi", "seed": True}, 400, "seed must be"),
    ("/api/generate", {"model": "stories260K", "text": "hi", "first_step": -1}, 400, "first_step must be"),
    ("/api/generate", {"model": "stories260K", "text": "hi", "ablate": [[5, 0]]}, 400, "layer 5 is out of range"),
    ("/api/generate", {"model": "stories260K", "text": "hi", "ablate": [[0, 8]]}, 400, "head 8 is out of range"),
    ("/api/generate", {"model": "stories260K", "text": "hi", "ablate": "0.1"}, 400, "ablate must be"),
    ("/api/generate", {"model": "stories260K", "text": "hi " * 600}, 400, "512 positions"),
    ("/api/generate", {"model": "stories260K", "text": "hi " * 100, "max_new_tokens": 512}, 400, "one answer holds at most"),
    ("/api/generate", ["stories260K"], 400, "takes a JSON object"),
    ("/api/generate", {"model": "stories260K", "messages": [{"role": "user", "content": "hi"}]}, 400, "has no chat template"),
    ("/api/generate", {"model": "SmolLM2-135M-Instruct", "messages": []}, 400, "messages must be a non-empty list"),
    ("/api/generate", {"model": "SmolLM2-135M-Instruct", "messages": "hi"}, 400, "messages must be a non-empty list"),
    ("/api/generate", {"model": "SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": "hi", "name": "x"}]}, 400,
     "message 0 is"),
    ("/api/generate", {"model": "SmolLM2-135M-Instruct", "messages": [{"role": "bot", "content": "hi"}]}, 400, 'role "bot"'),
    ("/api/generate", {"model": "SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": 5}]}, 400, "content must be a string"),
    ("/api/generate", {"model": "SmolLM2-135M-Instruct", "text": "hi", "messages": [{"role": "user", "content": "hi"}]}, 400, "not both"),
    ("/api/generate", {"model": "SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]},
     400, "the last message must be the user's"),
    ("/api/generate", {"model": "SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": "x" * 30_000}]}, 400,
     "the messages have 30000 characters"),
    ("/api/explain", {"embeddings": "/etc/passwd"}, 400, "never reads"),
    ("/api/explain", {"format": "markdown"}, 400, 'format must be "json"'),
    ("/api/attention", {"model": "all-MiniLM-L6-v2", "text": "word " * 600, "layer": 0, "head": 0}, 400, "512 positions"),
    ("/api/explain", {"variant": "quantum"}, 400, "unknown variant"),
    ("/api/explain", {"query": "dog"}, 400, "dog"),
    ("/api/explain", {"precision": 99}, 400, "precision must be"),
    ("/api/explain", {"model": "/work"}, 404, "unknown model"),
    ("/api/explain", {"text": "x " * 600}, 400, "at most 512"),
    # In the API's words: the field's name (never a CLI flag), JSON's types and values, "all" where it is taken.
    ("/api/explain", {"variant": "multihead", "heads": 0}, 400, "heads must be a whole number from 1 to 16, got 0"),
    ("/api/explain", {"variant": "multihead", "kv_heads": 2}, 400, "kv_heads applies to variant gqa, not multihead"),
    ("/api/explain", {"variant": "gqa", "heads": 3, "kv_heads": 2}, 400, "heads (3) must be a multiple of kv_heads (2)"),
    ("/api/explain", {"block_size": 2}, 400, "block_size applies to variant flash"),
    ("/api/explain", {"d_k": 300}, 400, "d_k must be a whole number from 1 to 256, got 300"),
    ("/api/explain", {"dim": 0}, 400, "dim must be a whole number from 1 to 1024, got 0"),
    ("/api/explain", {"layer": 1}, 400, "layer and head choose a layer and head of a pretrained model"),
    ("/api/explain", {"model": "tiny-induction", "dim": 3}, 400, "dim does not apply with model"),
    ("/api/explain", {"model": "tiny-induction", "layer": 7}, 400, "layer must be from 0 to 1 for this model, got 7"),
    ("/api/explain", {"positional": "rope", "dim": 1}, 400, "(give dim 2 or more)"),
    ("/api/explain", {"variant": 3}, 400, "variant must be a string, got number"),
    ("/api/explain", {"seed": True}, 400, "seed must be a whole number from 0 to 9223372036854775807, got true"),
    ("/api/explain", {"variant": "qkv", "seed": 2**70}, 400, "seed must be a whole number from 0 to"),  # was a 500
    ("/api/explain", {"query": [1]}, 400, "query must be a token (a string) or a position (a whole number), got [1]"),
    ("/api/explain", {"embeddings": "x.txt"}, 400, 'use embed "seed" or "random"'),
    ("/api/attention", 5, 400, "attention takes a JSON object, got number"),
    ("/api/generate", "stories260K", 400, "generate takes a JSON object, got string"),
    ("/api/explain", [], 400, "explain takes a JSON object, got array"),
    ("/api/attention", {"model": "tiny-induction", "text": "hi", "head": "ALL"}, 400,
     'head must be "all" or a whole number from 0, got "ALL"'),
    ("/api/attention", {"model": "tiny-induction", "text": "hi", "layer": {"a": 1}}, 400, 'layer must be a whole number from 0, got {"a": 1}'),
    ("/api/attention", {"model": "tiny-induction", "text": None}, 400, "text must be a string, got null"),
    ("/api/attention", {"model": "tiny-induction"}, 400, "text is missing: send it as a string"),
    ("/api/attention", {"model": None, "text": "hi"}, 404, "unknown model null"),
    ("/api/generate", {"model": "stories260K", "text": "hi", "top_k": False}, 400, "top_k must be a whole number from 1, got false"),
    ("/api/generate", {"model": "stories260K", "text": "hi", "layers": "ALL"}, 400, 'layers must be "all" or a list'),
    ("/api/generate", {"model": "stories260K", "text": "hi", "ablate": [[0, None]]}, 400, "pairs of whole numbers, got [[0, null]]"),
    ("/api/generate", {"model": "SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": None}]}, 400,
     "message 0's content must be a string, got null"),
    ("/api/generate", {"model": "SmolLM2-135M-Instruct", "messages": [{"role": True, "content": "hi"}]}, 400,
     "message 0 has role true"),
]

# What a refusal never says: a CLI flag, a Python type's name, Python's None, True or False, or 'x' (JSON writes "x").
NOT_API_WORDS = re.compile(r"(?<![\w-])--[a-z]|NoneType|\bgot (int|float|str|list|dict|bool|tuple|nothing)\b|\b(None|True|False)\b|got '")


@pytest.mark.parametrize("path, body, status, words", BAD, ids=[f"{p}-{w}" for p, _, _, w in BAD])
def test_bad_requests_get_one_clear_line(client, path, body, status, words):
    response = client.post(path, json=body)
    assert response.status_code == status, response.text
    message = response.json()["error"]
    assert words in message and "\n" not in message and "Traceback" not in message
    assert response.json()["detail"] == message
    assert not NOT_API_WORDS.search(message), message
    # ... and the server keeps serving.
    assert client.post("/api/attention", json={"model": "tiny-induction", "text": "ab", "layer": 0, "head": 0}).status_code == 200


def test_an_answer_too_big_for_a_browser_says_how_many_tokens_fit(client):
    from selfattn.commands.live_generate_request import MAX_STEP_NUMBERS

    body = {"model": "stories260K", "text": "hi " * 100, "max_new_tokens": 512}
    message = client.post("/api/generate", json=body).json()["error"]
    fits = int(message.split("ask for at most ")[1].split()[0])
    prompt = len(client.post("/api/generate", json={**body, "max_new_tokens": 1}).json()["prompt_ids"])
    assert fits * 40 * (prompt + fits) <= MAX_STEP_NUMBERS < (fits + 1) * 40 * (prompt + fits + 1)
    assert client.post("/api/generate", json={**body, "max_new_tokens": fits + 1}).status_code == 400
    later = client.post("/api/generate", json={**body, "first_step": 500})  # the steps the page has are left out
    assert later.status_code == 200


@pytest.mark.parametrize("content", [b"{bad json", b"", b"\xff\xfe", b'{"model": "stories260K", "text": "hi", "temperature": NaN}'])
def test_a_body_that_is_not_usable_json_is_refused(client, content):
    response = client.post("/api/generate", content=content, headers={"content-type": "application/json"})
    assert 400 <= response.status_code < 500 and response.json()["error"]


def test_unknown_routes_and_assets_are_json_404s(client):
    for path in ("/nothing", "/assets/../../etc/passwd", "/assets/secrets.txt", "/explorer?model=/etc&text=hi"):
        response = client.get(path)
        assert response.status_code == 404 and response.json()["error"]


def test_the_page_names_nothing_but_its_own_server(client):
    response = client.get("/")
    assert response.status_code == 200
    policy = response.headers["content-security-policy"]
    assert "default-src 'none'" in policy and "connect-src 'self'" in policy and "http" not in policy
    from selfattn.render.visual.live_page import ASSET_TYPES

    for name in ASSET_TYPES:  # every file the page loads: its style and all its script modules
        asset = client.get(f"/assets/{name}")
        assert asset.status_code == 200 and "http://" not in asset.text and "https://" not in asset.text
    assert "http://" not in response.text and "https://" not in response.text


# ---- the command -----------------------------------------------------------------------

def test_a_busy_port_is_one_line_and_status_2(capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        assert main(["serve", "--port", str(port), "--no-browser"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("selfattn: error: cannot listen on 127.0.0.1:") and err.count("\n") == 1
    for port in ("-1", "70000"):
        assert main(["serve", "--port", port, "--no-browser"]) == 2
    with pytest.raises(sa.OptionError):
        bind("no-such-host.invalid", 0)


def test_an_unknown_extra_model_stops_the_server_before_it_starts(capsys):
    assert main(["serve", "--model", "no-such-model", "--port", "0", "--no-browser"]) == 2
    assert "unknown model 'no-such-model'" in capsys.readouterr().err


def test_serve_says_where_it_listens_and_stops_on_ctrl_c(tmp_path):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "selfattn", "serve", "--host", "0.0.0.0", "--port", "0", "--no-browser",
               "--model", "tiny-induction"]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        first = server.stdout.readline()
        assert first.startswith("selfattn serve: http://0.0.0.0:")
        assert "tiny-induction" in server.stdout.readline()
        assert "not only this machine" in server.stdout.readline()
        port = int(first.split(":")[3].split("/")[0])
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/models", timeout=10) as response:
            names = [m["name"] for m in json.load(response)["models"]]
        assert names == ["all-MiniLM-L6-v2", "tiny-induction", "tiny-shakespeare", "stories260K",
                         "SmolLM2-135M-Instruct"]  # no duplicate
        server.send_signal(signal.SIGINT)
        out, err = server.communicate(timeout=20)
    finally:
        server.kill()
    assert server.returncode == 0 and "Traceback" not in err
    assert "stopped" in out


# ---- models brought with --model ---------------------------------------------------------

@pytest.fixture(scope="module")
def brought(tmp_path_factory):
    """A server offering two tiny random checkpoints beside the built-in models: Gemma 3 (a
    sliding layer of window 5, then a full one) and Mistral (window 5, GQA)."""
    pytest.importorskip("transformers", reason="the tiny checkpoints are written by transformers")
    from tiny_models import tiny_checkpoint

    root = tmp_path_factory.mktemp("brought")
    folders = {family: str(tiny_checkpoint(family, root / family)) for family in ("gemma3_text", "mistral")}
    with TestClient(create_app(LiveModels(list(folders.values())))) as test_client:
        yield test_client, folders


def test_a_brought_model_is_offered_and_drawn_with_its_window(brought):
    from tiny_models import reference_model

    client, folders = brought
    names = [entry["name"] for entry in client.get("/api/models").json()["models"]]
    assert names[5:] == list(folders.values())
    for family, folder in folders.items():
        model = sa.load_pretrained(folder)
        text = model.tokenizer.decode(list(range(5, 17)))
        ids = model.tokenize(text).input_ids  # (1, n): what the server's model reads too
        with torch.no_grad():
            expected = reference_model(folder)(ids, output_attentions=True).attentions
        answer = client.post("/api/attention", json={"model": folder, "text": text, "layer": 0, "head": "all"}).json()
        n = len(answer["tokens"])
        assert n == ids.shape[1] >= 8
        torch.testing.assert_close(torch.tensor(answer["weights"], dtype=torch.float64), expected[0][0].double(),
                                   atol=1e-5, rtol=0)
        assert answer["window"] == 5 and answer["mask_ranges"][-1] == [n - 5, n]
        steps = client.post("/api/generate", json={"model": folder, "text": text, "max_new_tokens": 2}).json()["steps"]
        reads = steps[-1]["cache"]["reads"]
        length = steps[-1]["cache"]["length"]
        assert reads[0] == [length - 5, length]  # the sliding layer reads its 5 newest entries
        if family == "gemma3_text":
            assert reads[1] == [0, length]  # the full layer reads them all
        assert all(w == 0 for w in steps[-1]["attention"][0][0][: length - 5])


class _Terminal(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


@pytest.mark.parametrize("asked, tty, environ, platform, opens", [
    (True, True, {"DISPLAY": ":0"}, "linux", True),
    (True, True, {"WAYLAND_DISPLAY": "wayland-0"}, "linux", True),
    (True, True, {}, "darwin", True),
    (False, True, {"DISPLAY": ":0"}, "linux", False),  # --no-browser
    (True, False, {"DISPLAY": ":0"}, "linux", False),  # output piped: no terminal
    (True, True, {}, "linux", False),  # no display: webbrowser would start a text browser here
])
def test_the_browser_opens_only_when_asked_in_a_terminal_with_a_display(monkeypatch, asked, tty, environ, platform, opens):
    from selfattn.serve.run import opens_browser

    monkeypatch.setattr(sys.stdin, "isatty", lambda: True)
    assert opens_browser(asked, _Terminal(tty), environ, platform) is opens


@pytest.mark.parametrize("query, words", [
    ("variant=multihead&heads=0", "heads must be a whole number from 1 to 16, got 0"),
    ("text=ab&head=3", "head 3 is out of range: this input has 1 head"),
    ("model=tiny-induction&text=ab&layer=5", "layer must be from 0 to 1 for this model, got 5"),
    ("model=tiny-induction&head=-1", "head must be a whole number from 0, got -1"),
    ("model=tiny-induction&head=ALL", 'head must be a whole number, got "ALL"'),
])
def test_the_explorers_refusals_name_its_fields(client, query, words):
    response = client.get(f"/explorer?{query}")
    assert response.status_code == 400 and words in response.json()["error"], response.text
    assert not NOT_API_WORDS.search(response.json()["error"])


def test_a_null_body_is_named_as_json_names_it(client):
    response = client.post("/api/generate", content=b"null", headers={"content-type": "application/json"})
    assert response.status_code == 400 and response.json()["error"] == "generate takes a JSON object, got null"
