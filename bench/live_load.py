"""A load on a real ``selfattn serve`` on 127.0.0.1: many clients at once, every answer checked against the library.

    clients   threads, each sending one request after another until the time is up (no pause
              between them): attention (one head, or a layer's heads), explain (the seed's
              walkthrough, or a model's head), generate (one JSON answer, or streamed as
              NDJSON, some asking for a few layers and heads only). Each request is one of a
              few texts and settings, so that an answer sent to the wrong request shows.
    checks    a 200's answer is what the library computes for that very request: attention
              weights and a generation's last step to 1e-5, generated ids and text exactly,
              explain's JSON as ``selfattn explain --format json`` prints it. A 503 must carry
              ``Retry-After`` (whole seconds); its client waits that long (at most the time left).
    figures   per kind: requests, 200s, 503s, p50 and p95 seconds of the 200s; the server's
              resident memory at rest (every request sent once, one at a time), its peak during the load
              (sampled every 50 ms) and after it, once the server has been idle a while (3 s).

bench/live.py prints the figures; tests/test_serve_load.py asserts them. Linux only for the
memory (``/proc``); elsewhere those figures are None.
"""

from __future__ import annotations

import contextlib
import io
import json
import random
import math
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from email.message import Message
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from live_server import live_server  # noqa: E402,F401  (tests/: the one way the suite starts a server)

KINDS = ("attention", "explain", "generate", "generate stream")
SHARES = (0.35, 0.25, 0.2, 0.2)  # how often each kind is picked
TOLERANCE = 1e-5


@dataclass(frozen=True)
class Ask:
    """One request a client may send, and what the library says its answer must be."""

    kind: str
    path: str
    body: dict
    expected: object = None


@dataclass
class Outcome:
    """Everything a load saw: one (kind, status, seconds, problem) per request; the server's memory."""

    answers: list = field(default_factory=list)
    rest_mb: float | None = None
    peak_mb: float | None = None
    after_mb: float | None = None
    seconds: float = 0.0


# ---- the server -------------------------------------------------------------------------


def resident_mb(pid: int) -> float | None:
    """The process's resident memory in MiB (None where /proc is not there)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def send(url: str, ask: Ask, timeout: float = 120) -> tuple[int, dict | list, Message]:
    """(status, the answer parsed: a JSON object, or the NDJSON lines; the headers, any case)."""
    streamed = ask.kind == "generate stream"
    headers = {"content-type": "application/json", **({"accept": "application/x-ndjson"} if streamed else {})}
    request = urllib.request.Request(url + ask.path.lstrip("/"), json.dumps(ask.body).encode(), headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            data = response.read()
            status, answer_headers = response.status, response.headers
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read()), error.headers
    answer = [json.loads(line) for line in data.splitlines() if line] if streamed else json.loads(data)
    return status, answer, answer_headers


# ---- the requests and the library's answers ----------------------------------------------

TEXTS = {
    "tiny-induction": ["abcdefabcde", "qrstuvqrst", "mnopmnopmn", "xyzabxyza"],
    "stories260K": ["Once upon a time", "Lily had a red ball.", "The sun was warm and", "Tom saw a big dog"],
}
SENTENCES = ["the cat sat on the mat", "a dog ran in the park", "birds sing at dawn", "abcdeabcd"]


def asks(models) -> list[Ask]:
    """Every request of the load with its expected answer; ``models(name)`` is the library's copy."""
    from selfattn.cli import main

    pool = []
    for name, texts in TEXTS.items():
        model = models(name)
        layers, heads = model.config.n_layers, model.config.n_heads
        for i, text in enumerate(texts):
            with torch.no_grad():
                out = model(text, output_attentions=True)
            n = len(out.tokens[0])
            layer, head = i % layers, (i * 3) % heads
            weights = out.attentions[layer][0, :, -n:, -n:]  # (heads, n, n)
            pool.append(Ask("attention", "/api/attention", {"model": name, "text": text, "layer": layer, "head": head},
                            (out.tokens[0], weights[head])))
            pool.append(Ask("attention", "/api/attention", {"model": name, "text": text, "layer": layer, "head": "all"},
                            (out.tokens[0], weights)))
            new, temperature = 6 + 2 * i, 0.0 if i % 2 else 0.8
            shown = ({}, {"layers": [layers - 1], "heads": [0, heads - 1]}, {"layers": []}, {"heads": [1]})[i]
            result = model.generate(text, new, temperature, None, None, i)
            everything = result.prompt_ids[0] + result.ids[0]
            with torch.no_grad():  # the last step's query: the token before the last new one
                rows = model(everything[:-1], output_attentions=True).attentions
            asked_layers = shown.get("layers", list(range(layers)))
            asked_heads = shown.get("heads", list(range(heads)))
            last = [rows[l][0, asked_heads, -1, :] for l in asked_layers]  # [layers asked] (heads asked, keys)
            body = {"model": name, "text": text, "max_new_tokens": new, "temperature": temperature, "seed": i, **shown}
            for kind in ("generate", "generate stream"):
                pool.append(Ask(kind, "/api/generate", body, (result.ids[0], result.text[0], last)))
    for i, sentence in enumerate(SENTENCES):
        if i < 3:  # a variant of the seed's walkthrough
            variant = ("simple", "scaled", "multihead")[i]
            argv, body = [sentence, "--variant", variant], {"text": sentence, "variant": variant}
        else:  # a model's head, for a text that model reads
            argv = [sentence, "--model", "tiny-induction", "--layer", "1", "--head", "2"]
            body = {"text": sentence, "model": "tiny-induction", "layer": 1, "head": 2}
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            assert main(["explain", *argv, "--format", "json"]) == 0
        pool.append(Ask("explain", "/api/explain", body, json.loads(printed.getvalue())))
    return pool


def close(got, expected, path: str = "") -> str | None:
    """Where two JSON values differ beyond ``TOLERANCE`` (None: nowhere)."""
    if isinstance(expected, float) or isinstance(got, float):
        ok = isinstance(got, (int, float)) and abs(got - expected) <= TOLERANCE
        return None if ok else f"{path}: {got!r} != {expected!r}"
    if isinstance(expected, dict):
        if not isinstance(got, dict) or set(got) != set(expected):
            return f"{path}: keys differ"
        return next((d for k in expected if (d := close(got[k], expected[k], f"{path}.{k}"))), None)
    if isinstance(expected, list):
        if not isinstance(got, list) or len(got) != len(expected):
            return f"{path}: lengths differ"
        return next((d for i, (a, b) in enumerate(zip(got, expected)) if (d := close(a, b, f"{path}[{i}]"))), None)
    return None if got == expected else f"{path}: {got!r} != {expected!r}"


def problem(ask: Ask, answer) -> str | None:
    """What is wrong with a 200's answer to ``ask`` (None: it is the library's)."""
    if ask.kind == "explain":
        return close(answer, ask.expected)
    if ask.kind == "attention":
        tokens, weights = ask.expected
        if answer["tokens"] != tokens:
            return f"tokens {answer['tokens']} != {tokens}"
        return close(answer["weights"], weights.tolist())
    ids, text, last = ask.expected
    if ask.kind == "generate stream":
        events = [line["event"] for line in answer]
        if events != ["start"] + ["token"] * len(ids) + ["step"] * len(ids) + ["done"]:
            return f"events {events}"
        answer = {**answer[-1], "steps": answer[1 + len(ids):-1]}
    if answer["ids"] != ids or answer["text"] != text:
        return f"ids {answer['ids']} != {ids}"
    return close(answer["steps"][-1]["attention"], [row.tolist() for row in last], "attention")


# ---- the load ----------------------------------------------------------------------------


def run_load(url: str, pid: int, pool: list[Ask], clients: int = 40, seconds: float = 20.0, seed: int = 0,
             settle: float = 3.0) -> Outcome:
    """``clients`` threads sending requests from ``pool`` for ``seconds``; every answer checked; the
    memory ``settle`` seconds after the last answer."""
    for ask in pool:  # every request once, one at a time: the models loaded, the server warm and at rest
        status, answer, _ = send(url, ask)
        assert status == 200 and problem(ask, answer) is None, (ask, status, problem(ask, answer))
    time.sleep(1)
    outcome = Outcome(rest_mb=resident_mb(pid))
    outcome.peak_mb = outcome.rest_mb
    by_kind = {kind: [ask for ask in pool if ask.kind == kind] for kind in KINDS}
    lock, finished = threading.Lock(), threading.Event()
    start = time.monotonic()
    end = start + seconds

    def client(index: int) -> None:
        pick = random.Random(seed * 1000 + index)
        while time.monotonic() < end:
            ask = pick.choice(by_kind[pick.choices(KINDS, SHARES)[0]])
            began = time.monotonic()
            try:
                status, answer, headers = send(url, ask)
            except Exception as error:  # noqa: BLE001 - a lost request is a figure, not a crash
                status, answer, headers = None, None, Message()
                wrong = f"no answer: {type(error).__name__}: {error}"
            else:
                wrong = (problem(ask, answer) if status == 200 else
                         None if status == 503 and str(headers.get("Retry-After", "")).isdigit() else
                         f"status {status} {headers.get('Retry-After')!r}: {answer}")
            took = time.monotonic() - began
            with lock:
                outcome.answers.append((ask.kind, status, took, wrong))
            if status == 503:
                time.sleep(max(0.0, min(int(headers.get("Retry-After", 1)), end - time.monotonic())))

    def watch_memory() -> None:
        while not finished.wait(0.05):
            now = resident_mb(pid)
            if now is not None:
                outcome.peak_mb = max(outcome.peak_mb, now)

    watcher = threading.Thread(target=watch_memory, daemon=True)
    watcher.start()
    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    outcome.seconds = time.monotonic() - start
    finished.set()
    watcher.join()
    time.sleep(settle)
    outcome.after_mb = resident_mb(pid)
    return outcome


def rank(ordered: list[float], share: float) -> float | None:
    """The nearest-rank percentile of sorted values (share 0.95: the p95); None for none."""
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)] if ordered else None


def figures(outcome: Outcome) -> dict:
    """Per kind: counts of 200 and 503, p50 and p95 seconds of the 200s; the memory; the problems."""
    rows = {}
    for kind in KINDS:
        mine = [answer for answer in outcome.answers if answer[0] == kind]
        took = sorted(seconds for _, status, seconds, _ in mine if status == 200)
        rows[kind] = {"requests": len(mine), "ok": len(took), "busy": sum(status == 503 for _, status, _, _ in mine),
                      "p50": rank(took, 0.5), "p95": rank(took, 0.95)}
    every = sorted(seconds for _, status, seconds, _ in outcome.answers if status == 200)
    return {"kinds": rows, "seconds": outcome.seconds, "requests": len(outcome.answers),
            "p95": rank(every, 0.95),
            "rest_mb": outcome.rest_mb, "peak_mb": outcome.peak_mb, "after_mb": outcome.after_mb,
            "problems": [f"{kind}: {wrong}" for kind, _, _, wrong in outcome.answers if wrong]}


def table(found: dict) -> list[str]:
    """The figures as a markdown table and a line on memory."""
    seconds = lambda value: "-" if value is None else f"{value:.2f}"  # noqa: E731
    lines = ["| kind | requests | 200 | 503 | p50 s | p95 s |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for kind, row in found["kinds"].items():
        lines.append(f"| {kind} | {row['requests']} | {row['ok']} | {row['busy']} | {seconds(row['p50'])} | "
                     f"{seconds(row['p95'])} |")
    megabytes = lambda value: "?" if value is None else f"{value:.0f} MB"  # noqa: E731
    lines.append(f"{found['requests']} requests in {found['seconds']:.1f} s, p95 of the 200s {seconds(found['p95'])} s; "
                 f"server memory at rest {megabytes(found['rest_mb'])}, peak {megabytes(found['peak_mb'])}, "
                 f"after {megabytes(found['after_mb'])}; {len(found['problems'])} wrong or lost")
    return lines


def burst(url: str, pid: int, count: int = 20, tokens: int = 200) -> dict:
    """``count`` generations of ``tokens`` tokens (stories260K, every row) sent at once: how many were
    answered and refused, their seconds and sizes, and the server's memory before, at peak and after."""
    ask = Ask("generate", "/api/generate", {"model": "stories260K", "text": "Once upon a time", "max_new_tokens": tokens})
    send(url, Ask("generate", "/api/generate", {**ask.body, "max_new_tokens": 1}))  # loaded
    rest = peak = resident_mb(pid)
    answers: list = [None] * count
    finished = threading.Event()

    def one(index: int) -> None:
        began = time.monotonic()
        request = urllib.request.Request(url + "api/generate", json.dumps(ask.body).encode(),
                                         {"content-type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=300) as response:
                answers[index] = (response.status, time.monotonic() - began, len(response.read()))
        except urllib.error.HTTPError as error:
            answers[index] = (error.code, time.monotonic() - began, len(error.read()))

    def watch_memory() -> None:
        nonlocal peak
        while rest is not None and not finished.wait(0.02):
            peak = max(peak, resident_mb(pid) or 0)

    watcher = threading.Thread(target=watch_memory, daemon=True)
    watcher.start()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    finished.set()
    watcher.join()
    time.sleep(2)
    ok = [answer for answer in answers if answer[0] == 200]
    return {"ok": len(ok), "busy": sum(answer[0] == 503 for answer in answers),
            "seconds": (min(a[1] for a in ok), max(a[1] for a in ok)) if ok else None,
            "mb_each": max(a[2] for a in ok) / 1e6 if ok else None,
            "rest_mb": rest, "peak_mb": peak, "after_mb": resident_mb(pid)}
