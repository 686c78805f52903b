"""What a response of the live app (``selfattn serve``) costs, against the library doing the same work.

Through FastAPI's test client (the whole app: routing, checking, JSON; no socket), for each
built-in model:

    load            the first request that needs the model, on a fresh server (the model loads)
                    peer: ``load_pretrained(name)`` alone
    attention       POST /api/attention, one head, the model loaded
                    peer: ``model(text, output_attentions=True)``
    one step        POST /api/generate, max_new_tokens 1 (a decoder)
                    peer: ``model.generate(text, 1)`` and one forward with attentions
    20 steps        POST /api/generate, max_new_tokens 20, per step
                    peer: ``model.generate(text, 20)`` and one forward with attentions, per step

and once per round, a real server from a cold start (a new process, over HTTP on 127.0.0.1):

    cold start      ``selfattn serve --port 0`` until it prints its address, then GET /,
                    GET /api/models and POST /api/generate (stories260K, one token: it loads)
                    peer: a new Python process that imports selfattn, loads stories260K and
                    generates one token

Server and peer are timed in alternating rounds (the order swapped each round), so that a
busy machine slows both alike; the ratio is server / peer. Prints the machine first
(bench/machine.py: the CPU, its caches and vector units, torch's threads).

Then the server under load (bench/live_load.py, the load tests/test_serve_load.py runs):

    burst           20 generations of 200 tokens (stories260K, every row) sent at once:
                    answered and refused, seconds, MB each, the server's memory
    40 clients      for 20 s, mixing attention, explain and generate (streamed or not) on
                    tiny-induction, stories260K and the seed's walkthrough, every answer
                    checked against the library: per kind the 200s, the 503s, p50 and p95
                    seconds; the server's memory at rest, at peak and after

    .venv/bin/python bench/live.py                # ~50 s on 2 cores
    .venv/bin/python bench/live.py --rounds 9
    .venv/bin/python bench/live.py --seconds 0    # no load
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from fastapi.testclient import TestClient

import selfattn as sa
from selfattn.commands.live import LiveModels
from selfattn.serve.app import create_app
import live_load  # bench/, the script's own folder
from machine import machine_line

TEXTS = {
    "all-MiniLM-L6-v2": "The cat sat on the warm mat because the sun had been on it all morning.",
    "tiny-induction": "abcdefghijklmnopabcdefgh",
    "tiny-shakespeare": "To be, or not to be, that is the question:",
    "stories260K": "Once upon a time, there was a little girl named Lily. She loved to play",
}


def timed(action) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


def alternate(rounds: int, server, peer) -> tuple[float, float]:
    """Median seconds of each side over ``rounds`` rounds, the order swapped every round."""
    ours, theirs = [], []
    for r in range(rounds):
        if r % 2:
            theirs.append(timed(peer))
            ours.append(timed(server))
        else:
            ours.append(timed(server))
            theirs.append(timed(peer))
    return statistics.median(ours), statistics.median(theirs)


def line(label: str, ours: float, theirs: float, per: int = 1) -> None:
    print(f"  {label:<12} server {ours / per * 1000:9.1f} ms   library {theirs / per * 1000:9.1f} ms   "
          f"ratio {ours / theirs:5.2f}")


def cold_server() -> dict[str, float]:
    """Seconds from a new ``selfattn serve`` process to its address line and to each first answer."""
    import json
    import urllib.request

    start = time.perf_counter()
    with live_load.live_server() as server:
        url = server.url
        marks = {"address": time.perf_counter() - start}
        urllib.request.urlopen(url, timeout=60).read()
        marks["page"] = time.perf_counter() - start
        urllib.request.urlopen(url + "api/models", timeout=60).read()
        marks["models"] = time.perf_counter() - start
        body = json.dumps({"model": "stories260K", "text": "Once upon a time", "max_new_tokens": 1}).encode()
        request = urllib.request.Request(url + "api/generate", body, {"content-type": "application/json"})
        urllib.request.urlopen(request, timeout=60).read()
        marks["generate"] = time.perf_counter() - start
    return marks


def cold_library() -> float:
    import subprocess
    import sys

    script = "import selfattn; selfattn.load_pretrained('stories260K').generate('Once upon a time', 1)"
    return timed(lambda: subprocess.run([sys.executable, "-c", script], check=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--clients", type=int, default=40, help="clients of the load (default 40)")
    parser.add_argument("--seconds", type=float, default=20, help="how long the load lasts (default 20; 0: none)")
    args = parser.parse_args()
    print(f"{machine_line()}; {args.rounds} rounds, medians")
    for name, text in TEXTS.items():
        print(f"{name}:")
        decoder = name != "all-MiniLM-L6-v2"
        body = {"model": name, "text": text, "layer": 0, "head": 0}

        def first_request():
            with TestClient(create_app(LiveModels())) as fresh:
                assert fresh.post("/api/attention", json=body).status_code == 200

        line("load", *alternate(args.rounds, first_request, lambda: sa.load_pretrained(name)))
        model = sa.load_pretrained(name)
        with TestClient(create_app(LiveModels())) as client:
            client.post("/api/attention", json=body)  # loaded
            with torch.no_grad():
                line("attention", *alternate(args.rounds, lambda: client.post("/api/attention", json=body),
                                             lambda: model(text, output_attentions=True)))
            if not decoder:
                continue
            for steps in (1, 20):
                request = {"model": name, "text": text, "max_new_tokens": steps}

                def peer(steps=steps):
                    result = model.generate(text, steps)
                    with torch.no_grad():
                        model(result.prompt_ids[0] + result.ids[0], output_attentions=True)

                label = "one step" if steps == 1 else f"{steps} steps"
                ours, theirs = alternate(args.rounds, lambda: client.post("/api/generate", json=request), peer)
                line(label + ("" if steps == 1 else "/1"), ours, theirs, per=steps)
    print("a real server from a cold start (seconds since the process began):")
    rounds = [(cold_server(), cold_library()) if r % 2 == 0 else tuple(reversed((cold_library(), cold_server())))
              for r in range(args.rounds)]
    marks = {key: statistics.median(server[key] for server, _ in rounds) for key in rounds[0][0]}
    library = statistics.median(peer for _, peer in rounds)
    print(f"  address printed {marks['address']:.2f} s, page {marks['page']:.2f} s, /api/models {marks['models']:.2f} s, "
          f"first generate (stories260K loads) {marks['generate']:.2f} s")
    print(f"  library in a new process (import, load, one token) {library:.2f} s; "
          f"ratio {marks['generate'] / library:.2f}")
    if args.seconds > 0:
        under_load(args.clients, args.seconds)


def under_load(clients: int, seconds: float) -> None:
    """A burst of generations, then ``clients`` clients for ``seconds``, against one real server."""
    models: dict = {}
    pool = live_load.asks(lambda name: models.setdefault(name, sa.load_pretrained(name)))
    with live_load.live_server() as server:
        url, pid = server.url, server.pid
        found = live_load.burst(url, pid)
        took = found["seconds"]
        print(f"a burst of 20 generations of 200 tokens at once (stories260K): {found['ok']} answered "
              f"({took[0]:.1f}-{took[1]:.1f} s, {found['mb_each']:.1f} MB each), {found['busy']} refused with 503; "
              f"server memory {found['rest_mb']:.0f} MB, peak {found['peak_mb']:.0f} MB, after {found['after_mb']:.0f} MB")
        print(f"{clients} clients for {seconds:g} s (every answer checked against the library):")
        for line in live_load.table(live_load.figures(live_load.run_load(url, pid, pool, clients, seconds))):
            print("  " + line)


if __name__ == "__main__":
    main()
