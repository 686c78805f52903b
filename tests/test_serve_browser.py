"""The live app (``selfattn serve``) in a real browser, against the library's own numbers.

One real server (a subprocess, as a user starts it) and one headless Chromium serve the
whole module. Each test drives the page as a user would (types, picks, clicks), reads what
the page shows from its data attributes, and compares it with what the library computes in
this process: the page must show the library's numbers, not merely the server's.

Every test ends by checking that the page asked only its own server for anything and ran
without a page error or a console error.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from urllib.parse import parse_qs, urlsplit

import pytest
import torch

from browser import chromium, recorded_page
from live_server import live_server

VIEWPORT = {"width": 1280, "height": 800}
IDLE = "body[data-pending='0']"  # the page sets data-pending to the number of requests on their way
# Chromium writes every 4xx answer to the console as this line, whether or not the page handles it.
RESOURCE_STATUS = re.compile(r"^Failed to load resource: the server responded with a status of 4\d\d ")
BUSY_STATUS = re.compile(r"^Failed to load resource: the server responded with a status of 503 ")

CELLS_JS = """els => els.map(e => [Number(e.dataset.head), Number(e.dataset.row), Number(e.dataset.col),
    e.dataset.weight, e.dataset.masked === "true"])"""
PROBS_JS = "els => els.map(e => [e.dataset.token, e.dataset.p, Number(e.dataset.id), e.classList.contains('chosen')])"
IDS_JS = "els => els.map(e => Number(e.dataset.id))"
TEXTS_JS = "els => els.map(e => e.textContent)"


# ---- the server, the browser, the models ----------------------------------------------


@pytest.fixture(scope="module")
def server():
    """The base URL of a real ``selfattn serve --port 0``; stopped with SIGINT (Ctrl-C) at the end."""
    with live_server() as running:
        yield running.url


@pytest.fixture(scope="module")
def browser():
    with chromium() as launched:
        yield launched


@pytest.fixture
def page(browser, server):
    with recorded_page(browser, viewport=VIEWPORT) as recorded:
        recorded.goto(server)
        idle(recorded)
        yield recorded


_models: dict = {}


def library_model(name: str):
    """The library's own copy of a built-in model, loaded once per module."""
    if name not in _models:
        import selfattn

        _models[name] = selfattn.load_pretrained(name)
    return _models[name]


def offered(server: str) -> dict:
    with urllib.request.urlopen(server + "api/models", timeout=30) as answer:
        return {entry["name"]: entry for entry in json.load(answer)["models"]}


# ---- helpers --------------------------------------------------------------------------


def idle(page, timeout: float = 30_000) -> None:
    """Wait until no request of the page is on its way (and the page has drawn the answers)."""
    page.wait_for_selector(IDLE, state="attached", timeout=timeout)


def assert_clean(page, server: str, allowed_console=None) -> None:
    """Only the page's own server was asked for anything; no page error, no console error, no dialog."""
    origin = urlsplit(server).netloc
    for request in page.requests:
        url = request.split(" ", 1)[1]
        parts = urlsplit(url)
        assert parts.scheme == "data" or parts.netloc == origin, f"a request left the server: {request}"
    assert page.page_errors == [], page.page_errors[:5]
    console = [text for text in page.console_errors if not (allowed_console and allowed_console.match(text))]
    assert console == [], console[:5]
    assert page.dialogs == [], page.dialogs[:5]


def message(page) -> str:
    box = page.locator("[data-testid=error]")
    return box.text_content() if box.is_visible() else ""


def choose_model(page, name: str) -> None:
    page.wait_for_selector(f"[data-testid=model-select] option[value='{name}']", state="attached")
    page.select_option("[data-testid=model-select]", name)


def run_attention(page, name: str, text: str, layer: int, head) -> None:
    page.click("[data-testid=tab-attention]")
    choose_model(page, name)
    page.fill("[data-testid=text-input]", text)
    page.select_option("[data-testid=layer-select]", str(layer))
    page.select_option("[data-testid=head-select]", str(head))
    page.click("[data-testid=run]")
    idle(page)


def grid_cells(page) -> list:
    return page.eval_on_selector_all("[data-testid=attention-grid] [data-row][data-col][data-weight]", CELLS_JS)


def shown_probs(page, testid: str = "next-token-probs") -> list:
    return page.eval_on_selector_all(f"[data-testid={testid}] [data-token]", PROBS_JS)


def generated_ids(page) -> list[int]:
    return page.eval_on_selector_all("[data-testid=tokens] [data-generated]", IDS_JS)


def expected_top(model, ids: list[int], temperature: float, top_k, top_p) -> list[tuple[int, str, float]]:
    """The 10 likeliest tokens after ``ids`` (a plain forward), as the page should list them."""
    from selfattn.models.generation import sampling_probs

    with torch.no_grad():
        logits = model(ids).logits[0, -1:]
    if temperature == 0:
        probs = torch.softmax(logits.double(), dim=-1)[0]
    else:
        probs = sampling_probs(logits, temperature, top_k, top_p)[0]
    values, order = probs.topk(10)
    return [(int(i), model.tokenizer.token(int(i)), float(p)) for p, i in zip(values.tolist(), order.tolist()) if p > 0]


def assert_probs(shown: list, expected: list, chosen: int) -> None:
    assert [entry[2] for entry in shown] == [i for i, _, _ in expected]
    for (token, p, token_id, marked), (i, expected_token, expected_p) in zip(shown, expected):
        assert token == expected_token
        assert abs(float(p) - expected_p) <= 1e-6, (token, p, expected_p)
        assert marked == (token_id == chosen)


# ---- (a) a model's attention ----------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "text", "layer", "head"),
    [
        ("tiny-induction", "abcdefgabcdefg", 1, 2),
        ("tiny-induction", "hello world hello", 0, "all"),
        ("stories260K", "Once upon a time, there was a little dog named Spot.", 1, 5),
    ],
)
def test_attention_grid_shows_the_library_weights(page, server, name, text, layer, head):
    run_attention(page, name, text, layer, head)
    assert message(page) == ""
    model = library_model(name)
    with torch.no_grad():
        attentions = model(text, output_attentions=True).attentions[layer][0]  # (heads, n, n)
    heads = list(range(attentions.shape[0])) if head == "all" else [head]
    n = attentions.shape[-1]
    cells = grid_cells(page)
    assert len(cells) == len(heads) * n * n  # a short text: every cell of every head shown
    assert {(h, i, j) for h, i, j, _, _ in cells} == {(h, i, j) for h in heads for i in range(n) for j in range(n)}
    for h, i, j, weight, masked in cells:
        assert abs(float(weight) - attentions[h, i, j].item()) <= 1e-6, (h, i, j, weight)
        assert masked == (j > i)  # a decoder's causal mask, drawn apart
    if head == "all":
        shown_heads = page.eval_on_selector_all("[data-testid=attention-grid] .head-grid", "els => els.map(e => Number(e.dataset.head))")
        assert shown_heads == heads
    facts = page.locator("[data-testid=attention-facts]").text_content()
    assert "Causal mask" in facts
    if name == "stories260K":
        assert "RoPE (base 10000" in facts
        assert "Head 5 reads key/value head 2, shared with heads 4–5." in facts
        # The arrows of a clicked query: one line per key it reads, its weight on the line.
        page.click("[data-testid=attention-grid] .row-label[data-row='6']")
        lines = page.eval_on_selector_all(
            "[data-testid=arrows] .attention-line",
            "els => els.map(e => [Number(e.dataset.query), Number(e.dataset.key), e.dataset.weight])",
        )
        row = attentions[head, 6]
        assert [(q, k) for q, k, _ in lines] == [(6, k) for k in range(n) if row[k] > 0]
        for _, k, weight in lines:
            assert abs(float(weight) - row[k].item()) <= 1e-6
        # The explorer, in a frame, for this text, layer, head and query.
        page.click("[data-testid=open-explorer]")
        frame = page.locator("[data-testid=explorer-frame]")
        fields = parse_qs(urlsplit(frame.get_attribute("src")).query)
        assert fields == {"model": [name], "text": [text], "layer": [str(layer)], "head": [str(head)], "query": ["6"]}
        page.frame_locator("[data-testid=explorer-frame]").locator("#head-view .token").first.wait_for(state="attached")
    assert_clean(page, server)


# ---- (b) generation, one step at a time -----------------------------------------------


@pytest.mark.parametrize(("temperature", "top_k", "top_p", "seed"), [(0.0, None, None, 0), (0.8, 20, None, 3)])
def test_generation_steps_match_the_library(page, server, temperature, top_k, top_p, seed):
    prompt = "Once upon a time"
    model = library_model("stories260K")
    page.click("[data-testid=tab-generate]")
    choose_model(page, "stories260K")
    page.fill("[data-testid=prompt-input]", prompt)
    page.fill("[data-testid=temperature]", str(temperature))
    page.fill("[data-testid=top-k]", "" if top_k is None else str(top_k))
    page.fill("[data-testid=seed]", str(seed))
    first_list = None
    for k in range(1, 6):
        page.click("[data-testid=generate-step]")
        idle(page)
        expected = model.generate(prompt, k, temperature, top_k, top_p, seed)
        ids = expected.ids[0]
        assert generated_ids(page) == ids
        prompt_ids = page.eval_on_selector_all("[data-testid=tokens] [data-index]:not([data-generated])", IDS_JS)
        assert prompt_ids == expected.prompt_ids[0]
        top = expected_top(model, expected.prompt_ids[0] + ids[: k - 1], temperature, top_k, top_p)
        shown = shown_probs(page)
        assert_probs(shown, top, ids[-1])
        if k == 1:
            first_list = shown
        cache = page.locator("[data-testid=cache-note]").text_content()
        entries = len(expected.prompt_ids[0]) + k - 1
        assert cache.startswith(f"cache: {entries} entries; the new query reads {entries}")
        assert page.locator("[data-testid=cache] .cache-box").count() == entries
    assert message(page) == ""
    # Looking back: the first new token shows its own step again.
    page.click("[data-testid=tokens] [data-generated][data-step='0']")
    looked_back = shown_probs(page)
    # The same list as after the first click (the numbers may differ in the 8th digit: the
    # server works a request's steps out in one forward over all its tokens).
    assert [entry[0] for entry in looked_back] == [entry[0] for entry in first_list]
    assert all(abs(float(a[1]) - float(b[1])) <= 1e-6 for a, b in zip(looked_back, first_list))
    assert page.locator("[data-testid=cache] .cache-box").count() == len(expected.prompt_ids[0])
    if temperature == 0:
        # The same five tokens streamed, one NDJSON line per step.
        page.fill("[data-testid=generate-count]", "5")
        page.click("[data-testid=generate-run]")
        idle(page)
        assert generated_ids(page) == ids
        assert_probs(shown_probs(page), top, ids[-1])
    assert_clean(page, server)


# ---- (c) knocked-out heads --------------------------------------------------------------


def test_knocked_out_head_changes_the_probabilities_as_the_library_says(page, server):
    import selfattn

    prompt, steps, knocked = "Once upon a time", 3, (1, 2)
    model = library_model("stories260K")
    page.click("[data-testid=tab-generate]")
    choose_model(page, "stories260K")
    page.fill("[data-testid=prompt-input]", prompt)
    for _ in range(steps):
        page.click("[data-testid=generate-step]")
        idle(page)
    before_click = shown_probs(page)
    assert not page.locator("[data-testid=next-token-probs-before]").is_visible()
    asked = []  # the bodies of the generations the tick starts
    page.on("request", lambda request: asked.append(request.post_data_json) if request.url.endswith("/api/generate") else None)
    page.check(f"[data-testid=ablate-heads] input[data-layer='{knocked[0]}'][data-head='{knocked[1]}']")
    idle(page)  # the box re-runs the current number of steps, with and without the head
    # The page asks for the rows it draws: every layer and head with the head knocked out (the
    # strips), none without it (only its tokens and probabilities are shown).
    assert sorted((body["ablate"], body["layers"], body.get("heads")) for body in asked) == [
        ([], [], "all"), ([list(knocked)], "all", "all")]

    baseline = model.generate(prompt, steps, 0.0, None, None, 0)
    before = expected_top(model, baseline.prompt_ids[0] + baseline.ids[0][:-1], 0.0, None, None)
    with selfattn.ablate(model, [knocked]):
        ablated = model.generate(prompt, steps, 0.0, None, None, 0)
        after = expected_top(model, ablated.prompt_ids[0] + ablated.ids[0][:-1], 0.0, None, None)
    assert generated_ids(page) == ablated.ids[0]
    assert_probs(shown_probs(page), after, ablated.ids[0][-1])
    assert_probs(shown_probs(page, "next-token-probs-before"), before, baseline.ids[0][-1])
    assert shown_probs(page, "next-token-probs-before") == before_click
    # The knock-out moved the numbers, and the page shows both generations.
    assert max(abs(a[2] - b[2]) for a, b in zip(after, before) if a[0] == b[0]) > 1e-6
    assert page.locator("[data-testid=text-before]").text_content() == prompt + baseline.text[0]
    assert page.locator("[data-testid=text-after]").text_content() == prompt + ablated.text[0]
    # Unticking goes back to the plain generation.
    page.click("[data-testid=ablate-clear]")
    idle(page)
    assert_probs(shown_probs(page), before, baseline.ids[0][-1])
    assert not page.locator("[data-testid=next-token-probs-before]").is_visible()
    assert message(page) == ""
    assert_clean(page, server)


# ---- (c2) a chat with the real LLM --------------------------------------------------------


def conversation(page) -> list[str]:
    return page.eval_on_selector_all("[data-testid=conversation] li", TEXTS_JS)


def test_chat_mode_answers_over_the_whole_conversation(page, server):
    import selfattn

    name = "SmolLM2-135M-Instruct"
    model = library_model(name)
    page.click("[data-testid=tab-generate]")
    choose_model(page, "stories260K")  # no chat template: the box stays off and says why
    assert page.locator("[data-testid=chat-mode]").is_disabled()
    assert "tuned for chat" in page.locator("[data-testid=chat-note]").text_content()
    choose_model(page, name)
    page.check("[data-testid=chat-mode]")
    assert page.input_value("[data-testid=generate-count]") == "48"  # room for an answer, not the prompt's 8
    assert page.locator("[data-testid=generate-run]").text_content() == "Send (answer streamed)"
    page.fill("[data-testid=generate-count]", "12")
    first = [{"role": "user", "content": "What is the capital of France?"}]
    page.fill("[data-testid=prompt-input]", first[0]["content"])
    page.click("[data-testid=generate-run]")
    idle(page, 120_000)
    assert message(page) == ""
    answer = model.chat(first, 12)
    assert "Paris" in answer.text[0]
    assert generated_ids(page) == answer.ids[0]
    prompt_ids = page.eval_on_selector_all("[data-testid=tokens] [data-index]:not([data-generated])", IDS_JS)
    assert prompt_ids == model.chat_ids(first)  # the whole conversation, laid out by the model's template
    assert conversation(page) == [f"user:{first[0]['content']}", f"assistant:{answer.text[0]}"]
    # Every head's strip reads the whole conversation: the last step's keys are all its tokens.
    strips = page.locator("[data-testid=attention-strips]")
    assert strips.is_visible()
    # A second message: the first exchange joins the conversation the model reads.
    second = first + [{"role": "assistant", "content": answer.text[0]},
                      {"role": "user", "content": "And the capital of Germany?"}]
    page.fill("[data-testid=generate-count]", "6")
    page.fill("[data-testid=prompt-input]", second[-1]["content"])
    page.click("[data-testid=generate-run]")
    idle(page, 120_000)
    reply = model.chat(second, 6)
    assert generated_ids(page) == reply.ids[0]
    prompt_ids = page.eval_on_selector_all("[data-testid=tokens] [data-index]:not([data-generated])", IDS_JS)
    assert prompt_ids == model.chat_ids(second)
    assert len(conversation(page)) == 4
    # Knocking a head out answers the same conversation again, with and without it.
    knocked = (18, 6)
    page.check(f"[data-testid=ablate-heads] input[data-layer='{knocked[0]}'][data-head='{knocked[1]}']")
    idle(page, 120_000)
    with selfattn.ablate(model, [knocked]):
        ablated = model.chat(second, 6)
    assert generated_ids(page) == ablated.ids[0]
    assert page.locator("[data-testid=text-before]").text_content() == reply.text[0]
    assert page.locator("[data-testid=text-after]").text_content() == ablated.text[0]
    assert len(conversation(page)) == 4  # the same exchange, not a new one
    assert message(page) == ""
    assert_clean(page, server)


# ---- (d) the seed's walkthrough -----------------------------------------------------------


def explained(**options) -> dict:
    from selfattn.commands.explain_options import ExplainConfig
    from selfattn.commands.traces import build_trace
    from selfattn.render.text.json_out import render_json

    return json.loads(render_json(build_trace(ExplainConfig(format="json", **options))))


def texts(page, selector: str) -> list[str]:
    return page.eval_on_selector_all(selector, TEXTS_JS)


def test_walkthrough_shows_the_numbers_explain_prints(page, server):
    from selfattn.formatting import number_text

    def fmt(values):
        return [number_text(v, 4) if isinstance(v, (int, float)) else v for v in values]

    page.locator("[data-testid=walk-tokens] button", has_text=re.compile(r"^sat")).click()
    idle(page)
    assert page.get_attribute("[data-testid=walk-tokens] button[aria-pressed=true]", "data-index") == "2"
    data = explained(query=2)
    q = data["query"]
    assert texts(page, "[data-testid=walk-heads] td[data-col=weight]") == fmt(q["weights"])
    assert texts(page, "[data-testid=walk-heads] td[data-col=score]") == fmt(q["scores"])
    assert texts(page, "[data-testid=walk-heads] td[data-col=exp]") == fmt(q["exp"])
    assert texts(page, "[data-testid=walk-heads] [data-col=exp_sum]") == fmt([q["exp_sum"]])
    assert texts(page, "[data-testid=walk-context] [data-col=context] span") == fmt(q["context"])
    embeddings = texts(page, "[data-testid=walk-embeddings] td")
    assert embeddings == fmt([x for row in data["embeddings"] for x in row])
    assert page.get_attribute("[data-testid=walk-heads] tr.query", "data-key") == "2"

    # Several heads: one table per head, and the combined context.
    page.select_option("[data-testid=walk-variant]", "multihead")
    idle(page)
    page.select_option("[data-testid=walk-positional]", "rope")
    idle(page)
    data = explained(query=2, variant="multihead", positional="rope")
    q = data["query"]
    for h, weights in enumerate(q["weights"]):
        assert texts(page, f"[data-testid=walk-heads] td[data-col=weight][data-head='{h}']") == fmt(weights)
        assert texts(page, f"[data-testid=walk-heads] td[data-col=score][data-head='{h}']") == fmt(q["scores"][h])
        shown = texts(page, f"[data-testid=walk-context] [data-col=head_context][data-head='{h}'] span")
        assert shown == fmt(q["head_context"][h])
    assert texts(page, "[data-testid=walk-context] [data-col=context] span") == fmt(q["context"])
    assert message(page) == ""
    assert_clean(page, server)


# ---- (e) a long text ----------------------------------------------------------------------


def test_long_text_stays_usable(page, server):
    name = "all-MiniLM-L6-v2"
    entry = offered(server).get(name)
    if entry is None or "error" in entry:
        pytest.skip(f"{name} is not available here: {entry and entry.get('error')}")
    words = ["the", "cat", "sat", "on", "a", "warm", "mat", "while", "small", "birds", "sang", "about", "rain",
             "and", "sun", "in", "an", "old", "garden"]
    text = " ".join(words[(k * 7) % len(words)] for k in range(390))
    start = time.monotonic()
    run_attention(page, name, text, 2, 3)
    took = time.monotonic() - start
    assert message(page) == ""
    assert took < 20, f"the run took {took:.1f} s"
    model = library_model(name)
    with torch.no_grad():
        weights = model(text, output_attentions=True).attentions[2][0, 3]
    n = weights.shape[-1]
    assert 380 <= n <= 512
    assert page.get_attribute("[data-testid=attention-grid]", "data-n") == str(n)
    cells = grid_cells(page)
    assert 0 < len(cells) < 5000
    for _, i, j, weight, masked in cells:
        assert not masked  # an encoder masks nothing
        assert abs(float(weight) - weights[i, j].item()) <= 1e-6
    # The overview moves the window of cells; every move is quick.
    start = time.monotonic()
    page.locator("[data-testid=overview]").first.click(position={"x": 200, "y": 230})
    page.click("[data-testid=window-down]")
    page.click("[data-testid=window-right]")
    assert time.monotonic() - start < 5
    moved = grid_cells(page)
    assert 0 < len(moved) < 5000
    assert min(i for _, i, _, _, _ in moved) > 100  # the window went down the text
    for _, i, j, weight, _ in moved[:200]:
        assert abs(float(weight) - weights[i, j].item()) <= 1e-6
    assert_clean(page, server)


# ---- (g) what the server refuses is shown, not thrown -----------------------------------


def test_refusals_show_the_servers_line(page, server):
    page.click("[data-testid=tab-attention]")
    choose_model(page, "stories260K")
    page.fill("[data-testid=text-input]", "")
    page.click("[data-testid=run]")
    idle(page)
    assert message(page) == "A model's attention: text is empty: type some text"
    # A layer the model lacks, as if the page had sent it: the server's line again.
    page.evaluate("""() => {
        const option = document.createElement("option");
        option.value = "9";
        option.textContent = "layer 9";
        document.querySelector("[data-testid=layer-select]").append(option);
    }""")
    page.fill("[data-testid=text-input]", "Once upon a time")
    page.select_option("[data-testid=layer-select]", "9")
    page.click("[data-testid=run]")
    idle(page)
    assert message(page) == "A model's attention: layer 9 is out of range: this model has 5 layers, 0 to 4"
    # A good run clears it.
    page.select_option("[data-testid=layer-select]", "1")
    page.click("[data-testid=run]")
    idle(page)
    assert message(page) == ""
    # An encoder cannot generate: the page says why and keeps its buttons off.
    entry = offered(server).get("all-MiniLM-L6-v2")
    if entry is not None and "error" not in entry:
        page.click("[data-testid=tab-generate]")
        choose_model(page, "all-MiniLM-L6-v2")
        assert "is an encoder" in page.locator("[data-testid=generate-disabled]").text_content()
        assert page.locator("[data-testid=generate-step]").is_disabled()
    # The walkthrough with an empty sentence.
    page.click("[data-testid=tab-walkthrough]")
    page.fill("[data-testid=walk-sentence]", "   ")
    idle(page)
    assert message(page) == "The seed's walkthrough: text is empty: type some text"
    assert_clean(page, server, allowed_console=RESOURCE_STATUS)


# ---- (h) a busy server: the page waits its Retry-After and asks again --------------------


def test_a_full_queue_is_waited_out_not_shown(page, server):
    import threading

    busy_body = {"model": "tiny-shakespeare", "text": "To be, or not", "max_new_tokens": 512, "layers": []}
    post = lambda body: urllib.request.urlopen(urllib.request.Request(  # noqa: E731
        server + "api/generate", json.dumps(body).encode(), {"content-type": "application/json"}), timeout=120)
    post({**busy_body, "max_new_tokens": 1}).read()  # the model loaded
    statuses = []
    page.on("response", lambda r: statuses.append(r.status) if r.url.endswith("/api/generate") else None)
    page.click("[data-testid=tab-generate]")
    choose_model(page, "tiny-shakespeare")
    page.fill("[data-testid=prompt-input]", "To be")
    # Eight clients keep the model's queue full (one generation runs and three wait, about a
    # second each; the other clients ask again every 10 ms), until the page has found it
    # full; then it drains within seconds.
    stop = threading.Event()

    def keep_busy():
        while not stop.is_set():
            try:
                post(busy_body).read()
            except urllib.error.HTTPError as refused:
                assert refused.code == 503
                time.sleep(0.01)

    fillers = [threading.Thread(target=keep_busy) for _ in range(8)]
    for filler in fillers:
        filler.start()
    busy = "() => document.getElementById('status').textContent.startsWith('the server is busy: asking again in')"
    try:
        deadline = time.monotonic() + 60
        while True:  # full once another request is refused
            try:
                post({**busy_body, "max_new_tokens": 1}).read()
            except urllib.error.HTTPError as refused:
                assert refused.code == 503 and int(refused.headers["Retry-After"]) >= 1
                break
            assert time.monotonic() < deadline, "the generation queue never filled"
        for _ in range(3):  # a place may come free in the moment the page asks: then it asks again
            page.click("[data-testid=generate-step]")
            try:
                page.wait_for_function(busy, timeout=10_000)
                break
            except Exception:  # noqa: BLE001 -- Playwright's timeout: the page got in at once
                idle(page)
                page.click("[data-testid=generate-reset]")
        else:
            pytest.fail("the page never found the queue full")
    finally:
        stop.set()
        for filler in fillers:
            filler.join()
    idle(page)
    expected = library_model("tiny-shakespeare").generate("To be", 1, 0.0, None, None, 0)
    first = statuses.index(503)  # the attempt that found the queue full, and its retries
    assert statuses[-1] == 200 and set(statuses[first:-1]) == {503}, statuses
    assert generated_ids(page) == expected.ids[0]
    assert message(page) == ""
    assert_clean(page, server, allowed_console=BUSY_STATUS)
