"""Bounded work in the live app: its gates, the rows a generation sends, a client that leaves, and a load.

- ``serve.admission.Gate`` on its own: one inside, a few queued in order, the rest refused
  with a time to come back; a queued request that gives up passes its turn on.
- ``layers`` and ``heads`` of /api/generate (FastAPI's test client): the rows sent are the
  library's rows for those layers and heads, the rest of the answer unchanged, and the size
  check counts only what is sent.
- A real ``selfattn serve`` on 127.0.0.1: a burst past a model's queue gets 503 with
  ``Retry-After``; a client that drops its connection stops its generation (the next one on
  that model is answered at once, not after the abandoned one); and 40 clients for 20 s
  (bench/live_load.py), every answer checked against the library for its own request.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("fastapi", reason="the live app needs fastapi (make run installs it)")
from fastapi.testclient import TestClient  # noqa: E402

import selfattn as sa  # noqa: E402
from selfattn.commands.live import LiveModels  # noqa: E402
from selfattn.serve.admission import Busy, Gate  # noqa: E402
from selfattn.serve.app import create_app  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import live_load  # noqa: E402

NDJSON = {"accept": "application/x-ndjson"}
LONG = {"model": "tiny-shakespeare", "text": "To be, or not", "max_new_tokens": 512, "layers": []}  # ~1 s, no EOS


# ---- the gate ----------------------------------------------------------------------------


def test_a_gate_lets_one_in_queues_two_in_order_and_refuses_the_next():
    async def scenario():
        gate = Gate("stories260K", "generation", running=1, waiting=2)
        first = await gate.enter()
        order = []

        async def queued(name):
            place = await gate.enter()
            order.append(name)
            return place

        second, third = asyncio.ensure_future(queued("second")), asyncio.ensure_future(queued("third"))
        await asyncio.sleep(0)
        with pytest.raises(Busy) as refused:
            await gate.enter()
        assert refused.value.status == 503 and refused.value.retry_after >= 1
        assert "stories260K is busy: 1 generation running and 2 waiting" in str(refused.value)
        first.leave()
        first.leave()  # a second leave changes nothing
        (await second).leave()
        (await third).leave()
        assert order == ["second", "third"]
        # A queued request that gives up (its client left) passes its turn to the next.
        holder = await gate.enter()
        quitter, patient = asyncio.ensure_future(gate.enter()), asyncio.ensure_future(gate.enter())
        await asyncio.sleep(0)
        quitter.cancel()
        holder.leave()
        (await patient).leave()
        assert quitter.cancelled()
        (await gate.enter()).leave()  # empty again: the next one is let in at once

    asyncio.run(scenario())


# ---- the rows a generation sends ---------------------------------------------------------


@pytest.fixture(scope="module")
def client():
    with TestClient(create_app(LiveModels())) as test_client:
        yield test_client


def test_layers_and_heads_send_those_rows_only(client):
    model = sa.load_pretrained("stories260K")
    body = {"model": "stories260K", "text": "Once upon a time", "max_new_tokens": 5, "temperature": 0.7, "seed": 4}
    every = client.post("/api/generate", json=body).json()
    some = client.post("/api/generate", json={**body, "layers": [4, 0], "heads": [7, 2]}).json()
    none = client.post("/api/generate", json={**body, "layers": []}).json()
    with client.stream("POST", "/api/generate", json={**body, "layers": [3], "heads": [1]}, headers=NDJSON) as answer:
        lines = [json.loads(line) for line in answer.iter_lines() if line]
    result = model.generate("Once upon a time", 5, 0.7, None, None, 4)
    with torch.no_grad():
        out = model(result.prompt_ids[0] + result.ids[0], output_attentions=True)
    prompt = len(result.prompt_ids[0])
    assert some["options"]["layers"] == [4, 0] and some["options"]["heads"] == [7, 2]
    assert every["options"]["layers"] == [0, 1, 2, 3, 4] and every["options"]["heads"] == list(range(8))
    for answer in (every, some, none):
        assert answer["ids"] == result.ids[0] and answer["text"] == result.text[0]
        assert [step["top"] for step in answer["steps"]] == [step["top"] for step in every["steps"]]
    streamed = [line for line in lines if line["event"] == "step"]
    for t, (full, picked, bare, line) in enumerate(zip(every["steps"], some["steps"], none["steps"], streamed, strict=True)):
        row = prompt + t - 1
        for got, (layers, heads) in ((picked, ([4, 0], [7, 2])), (line, ([3], [1]))):
            expected = [out.attentions[layer][0, heads, row, : row + 1] for layer in layers]
            torch.testing.assert_close(torch.tensor(got["attention"], dtype=torch.float64),
                                       torch.stack(expected).double(), atol=1e-6, rtol=0)
            assert got["cache"]["reads"] == [full["cache"]["reads"][layer] for layer in layers]
        assert bare["attention"] == [] and bare["cache"]["reads"] == []
        assert bare["cache"]["length"] == full["cache"]["length"] == row + 1


@pytest.mark.parametrize("field, value", [
    ("layers", [5]), ("layers", [0, 0]), ("layers", "some"), ("layers", [True]), ("heads", [-1]), ("heads", 3),
])
def test_a_bad_layers_or_heads_is_one_clear_line(client, field, value):
    response = client.post("/api/generate", json={"model": "stories260K", "text": "hi", field: value})
    assert response.status_code == 400
    assert response.json()["error"].startswith(f'{field} must be "all" or a list of distinct whole numbers from 0 to')


def test_the_size_of_an_answer_counts_only_the_rows_sent(client):
    body = {"model": "stories260K", "text": "hi " * 100, "max_new_tokens": 512}
    refused = client.post("/api/generate", json=body)
    assert refused.status_code == 400 and "fewer layers and heads" in refused.json()["error"]
    answer = client.post("/api/generate", json={**body, "layers": [2], "heads": [5]})
    assert answer.status_code == 200
    last = answer.json()["steps"][-1]
    assert len(last["attention"]) == 1 and len(last["attention"][0]) == 1


# ---- a real server -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def server():
    with live_load.live_server() as running:  # a traceback or a bad exit fails the module
        yield running.url, running.pid


def post(url: str, body: dict, streamed: bool = False):
    ask = live_load.Ask("generate stream" if streamed else "generate", "/api/generate", body)
    return live_load.send(url, ask)


def test_past_a_models_queue_a_generation_is_refused_with_retry_after(server):
    url, _ = server
    post(url, {**LONG, "max_new_tokens": 1})  # the model loaded
    body = {**LONG, "max_new_tokens": 256}  # about half a second each
    answers = [None] * 7
    threads = [threading.Thread(target=lambda i=i: answers.__setitem__(i, post(url, body))) for i in range(7)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    statuses = sorted(status for status, _, _ in answers)
    assert set(statuses) == {200, 503} and statuses.count(200) >= 4, statuses  # one running and three waiting
    for status, answer, headers in answers:
        if status == 503:
            assert int(headers["Retry-After"]) >= 1
            assert answer["error"] == answer["detail"] and "tiny-shakespeare is busy" in answer["error"]
        else:
            assert len(answer["ids"]) == 256
    assert post(url, {**LONG, "max_new_tokens": 2})[0] == 200  # and it serves on


def dropped(port: int, body: dict, streamed: bool) -> None:
    """Send a generation over a raw socket and close it: after its first line (streamed), or at once."""
    data = json.dumps(body).encode()
    head = (f"POST /api/generate HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\ncontent-type: application/json\r\n"
            f"{'accept: application/x-ndjson' + chr(13) + chr(10) if streamed else ''}content-length: {len(data)}\r\n\r\n")
    with socket.create_connection(("127.0.0.1", port), timeout=30) as connection:
        connection.sendall(head.encode() + data)
        received = b""
        while streamed and b'"event": "token"' not in received:  # the generation has begun
            received += connection.recv(1 << 16)
        if not streamed:
            time.sleep(0.05)  # the generation has begun


@pytest.mark.parametrize("streamed", [True, False], ids=["streamed", "one-answer"])
def test_a_client_that_leaves_stops_its_generation(server, streamed):
    url, _ = server
    port = int(url.rsplit(":", 1)[1].strip("/"))
    began = time.monotonic()
    status, whole, _ = post(url, LONG)
    alone = time.monotonic() - began  # the long generation, undisturbed
    assert status == 200 and len(whole["ids"]) == 512
    for _ in range(3):  # three left behind: had they run on, the next would wait for all three
        dropped(port, LONG, streamed)
    began = time.monotonic()
    status, answer, _ = post(url, {**LONG, "max_new_tokens": 1})
    took = time.monotonic() - began
    assert status == 200 and answer["ids"] == whole["ids"][:1]
    assert took < alone / 3, f"the next generation took {took:.2f} s; the long one alone {alone:.2f} s"


@pytest.mark.slow
def test_forty_clients_for_twenty_seconds_are_each_answered_rightly(server, record_property):
    url, pid = server
    loaded = {}
    pool = live_load.asks(lambda name: loaded.setdefault(name, sa.load_pretrained(name)))
    outcome = live_load.run_load(url, pid, pool, clients=40, seconds=20, settle=1)
    found = live_load.figures(outcome)
    print("\n".join(live_load.table(found)))
    record_property("load", found)
    assert found["problems"] == []  # every answer the library's for its own request; none lost
    assert {status for _, status, _, _ in outcome.answers} <= {200, 503}
    assert all(row["ok"] > 0 for row in found["kinds"].values()), found["kinds"]
    assert sum(row["busy"] for row in found["kinds"].values()) > 0  # the queues filled, and refused cleanly
    assert outcome.seconds < 20 + 30  # the last requests were answered soon after the time was up
    if found["rest_mb"] is not None:
        assert found["after_mb"] - found["rest_mb"] < 100, found  # memory back near its resting level
        assert found["peak_mb"] - found["rest_mb"] < 400, found
