"""The live app answers only its own page and clients with no origin: probes against a real server.

One ``selfattn serve --port 0 --no-browser`` on 127.0.0.1 (a subprocess, as a user starts
it), asked with raw HTTP so every header is the probe's own: a foreign Host (DNS
rebinding), a foreign Origin and a cross-site Sec-Fetch-Site (CSRF), bodies that are not
JSON, a CORS preflight, a body too long by its Content-Length or by its chunks. Each
refusal is one JSON line with its status, and beside each the same request as the page or
curl sends it still works. Every response carries nosniff, no-referrer and a
Content-Security-Policy, and none an Access-Control-Allow-* header.
"""

from __future__ import annotations

import http.client
import json
import time
from urllib.parse import urlsplit

import pytest

from live_server import live_server
from selfattn.serve.guard import LOOPBACK_NAMES, MAX_BODY_BYTES, allowed_hosts, host_names

ATTENTION = {"model": "tiny-induction", "text": "abcabc", "layer": 1, "head": 0}


@pytest.fixture(scope="module")
def port():
    with live_server() as server:
        yield server.port


def ask(port: int, method: str, path: str, headers: dict | None = None, body: bytes | None = None):
    """(status, headers, body) of one request with exactly these headers (Host included when given)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.putrequest(method, path, skip_host="Host" in (headers or {}), skip_accept_encoding=True)
        for name, value in (headers or {}).items():
            connection.putheader(name, value)
        if body is not None and "Content-Length" not in (headers or {}) and "Transfer-Encoding" not in (headers or {}):
            connection.putheader("Content-Length", str(len(body)))
        connection.endheaders()
        if body is not None and (headers or {}).get("Transfer-Encoding") != "chunked":
            connection.send(body)
        elif body is not None:
            for start in range(0, len(body), 65536):
                piece = body[start:start + 65536]
                connection.send(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            connection.send(b"0\r\n\r\n")
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


def post(port: int, path: str, body: dict, **headers):
    return ask(port, "POST", path, {"Content-Type": "application/json", **headers}, json.dumps(body).encode())


def refused(answer, status: int, *words: str) -> None:
    got, headers, body = answer
    assert got == status, (got, body[:300])
    assert headers["content-type"].startswith("application/json")
    message = json.loads(body)
    assert message["error"] == message["detail"] and "\n" not in message["error"]
    for word in words:
        assert word in message["error"], message["error"]


def test_a_foreign_host_is_refused_and_the_servers_own_names_are_answered(port):
    for method, path, body in (("GET", "/", None), ("GET", "/api/models", None),
                               ("POST", "/api/generate", {"model": "tiny-induction", "text": "ab", "max_new_tokens": 2})):
        data = None if body is None else json.dumps(body).encode()
        kind = {} if body is None else {"Content-Type": "application/json"}
        refused(ask(port, method, path, {"Host": f"evil.example:{port}", **kind}, data), 421, "evil.example")
        refused(ask(port, method, path, {"Host": "127.0.0.1:1", **kind}, data), 421)  # another port
        for name in LOOPBACK_NAMES:
            assert ask(port, method, path, {"Host": f"{name}:{port}", **kind}, data)[0] == 200


def test_work_from_another_origin_is_refused_and_the_pages_own_is_done(port):
    own = f"http://127.0.0.1:{port}"
    refused(post(port, "/api/attention", ATTENTION, Origin="http://evil.example"), 403, "http://evil.example")
    refused(post(port, "/api/attention", ATTENTION, Origin=f"http://localhost:{port}"), 403)  # not the Host's origin
    refused(post(port, "/api/attention", ATTENTION, Origin="null"), 403)  # a sandboxed frame or a file
    assert post(port, "/api/attention", ATTENTION, Origin=own)[0] == 200  # the page
    assert post(port, "/api/attention", ATTENTION)[0] == 200  # curl, Python: no Origin at all
    refused(post(port, "/api/attention", ATTENTION, **{"Sec-Fetch-Site": "cross-site"}), 403, "cross-site")
    refused(post(port, "/api/attention", ATTENTION, **{"Sec-Fetch-Site": "same-site"}), 403)
    for site in ("same-origin", "none"):
        assert post(port, "/api/attention", ATTENTION, Origin=own, **{"Sec-Fetch-Site": site})[0] == 200
    explorer = "/explorer?model=tiny-induction&text=abcabc&layer=1&head=0"
    refused(ask(port, "GET", explorer, {"Sec-Fetch-Site": "cross-site"}), 403)  # it computes: a foreign link may not
    status, headers, _ = ask(port, "GET", explorer, {"Sec-Fetch-Site": "same-origin"})
    assert status == 200 and "frame-ancestors 'self'" in headers["content-security-policy"]
    assert ask(port, "GET", "/", {"Sec-Fetch-Site": "cross-site"})[0] == 200  # a link to the page reads nothing


@pytest.mark.parametrize("kind", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None])
def test_a_body_a_form_can_send_is_refused(port, kind):
    headers = {} if kind is None else {"Content-Type": kind}
    refused(ask(port, "POST", "/api/attention", headers, json.dumps(ATTENTION).encode()), 415, "application/json")
    assert post(port, "/api/attention", ATTENTION, **{"Content-Type": "application/json; charset=utf-8"})[0] == 200


def test_a_preflight_is_never_granted(port):
    status, headers, body = ask(port, "OPTIONS", "/api/generate", {
        "Origin": "http://evil.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type"})
    assert status == 403 and not any(name.startswith("access-control-") for name in headers)


def test_a_body_too_long_is_refused_before_it_is_read(port):
    start = time.monotonic()
    status, _, body = ask(port, "POST", "/api/attention",
                          {"Content-Type": "application/json", "Content-Length": str(50 << 20)}, None)
    assert status == 413 and time.monotonic() - start < 5  # answered at once: not one of the 50 MB was sent
    assert "at most" in json.loads(body)["error"]
    chunked = b'{"text": "' + b"a" * (MAX_BODY_BYTES + 10) + b'"}'
    refused(ask(port, "POST", "/api/attention", {"Content-Type": "application/json", "Transfer-Encoding": "chunked"},
                chunked), 413, "at most")
    assert post(port, "/api/attention", ATTENTION)[0] == 200  # and the server goes on


@pytest.mark.parametrize("path", ["/", "/api/models", "/assets/live.js", "/assets/nothing.js",
                                  "/explorer?model=tiny-induction&text=ab"])
def test_every_response_carries_the_safety_headers(port, path):
    status, headers, _ = ask(port, "GET", path)
    assert status in (200, 404)
    assert headers["x-content-type-options"] == "nosniff" and headers["referrer-policy"] == "no-referrer"
    assert "default-src 'none'" in headers["content-security-policy"]
    assert not any(name.startswith("access-control-allow") for name in headers)
    if path == "/":
        assert "frame-ancestors 'none'" in headers["content-security-policy"]


def test_the_names_a_server_answers_follow_its_address():
    assert allowed_hosts("127.0.0.1", 8765) == {"127.0.0.1:8765", "localhost:8765", "[::1]:8765"}
    assert allowed_hosts("::1", 80) >= {"[::1]", "[::1]:80", "localhost"}  # port 80: browsers leave it out
    everywhere = host_names("0.0.0.0")
    import socket

    assert set(LOOPBACK_NAMES) <= set(everywhere) and socket.gethostname().lower() in everywhere
    assert host_names("192.168.1.7") == (*LOOPBACK_NAMES, "192.168.1.7")
    assert "[fe80::1]:9000" in allowed_hosts("fe80::1", 9000)
    assert all(urlsplit(f"http://{name}/").hostname for name in allowed_hosts("0.0.0.0", 9000))
