"""Who may use the live app: the requests the server answers, checked before any route runs.

The server listens on this machine and computes on request, so a web page the user visits
elsewhere must not be able to drive it or read its answers. Two ways a foreign page could:

- DNS rebinding: the page's own host name is made to resolve to 127.0.0.1, so the browser
  sends the page's requests, with the page's name in ``Host``, to this server. Answered
  only for the names the server is reached by (``allowed_hosts``): anything else is 421.
- Cross-site requests: a form or ``fetch`` from another origin (CSRF). A browser says where
  a request comes from in ``Origin`` and ``Sec-Fetch-Site``; a request that does work (a
  POST, or GET /explorer, which computes a page) is refused with 403 when either names
  another site, and a body must be ``application/json`` (415 otherwise), which no plain
  HTML form can send without a CORS preflight, and a preflight is never granted (no
  ``Access-Control-Allow-*`` header is ever sent). Clients that send no Origin (curl,
  Python) pass, as does the page itself.

A body longer than ``max_body`` bytes is refused by its Content-Length before a byte of it
is read (413), or as soon as a body sent in chunks passes the limit. Every response gets
``X-Content-Type-Options: nosniff`` and ``Referrer-Policy: no-referrer``, and a
Content-Security-Policy when its route set none (``default-src 'none'``: JSON needs none).
Every refusal is one JSON line, as the routes' own are.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from selfattn.errors import SelfAttnError

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
TEST_CLIENT = "testserver"  # Starlette's TestClient's host: answered only by an app made without an address
MAX_BODY_BYTES = 1 << 20  # a request body: the longest text the API takes is 20,000 characters
WORK_PATHS = ("/explorer",)  # GETs that compute, besides every POST
JSON_TYPE = "application/json"
DEFAULT_POLICY = "default-src 'none'; frame-ancestors 'none'"
ALWAYS = ((b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"no-referrer"))


def host_names(host: str) -> tuple[str, ...]:
    """The names a server bound to ``host`` is reached by, as a Host header writes them.

    A loopback address is reached by every loopback name; a wildcard address (0.0.0.0, ::)
    by the loopback names and this machine's own names and addresses; any other address or
    name by itself and the loopback names.
    """
    import socket

    shown = lambda name: f"[{name}]" if ":" in name and not name.startswith("[") else name  # noqa: E731
    names = list(LOOPBACK_NAMES)
    if host in ("127.0.0.1", "localhost", "::1"):
        return tuple(names)
    if host in ("0.0.0.0", "::", ""):
        own = {socket.gethostname(), socket.getfqdn()}
        try:
            own |= {info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None)}
        except OSError:
            pass  # a machine whose own name does not resolve: its names alone
        names += sorted(own)
    else:
        names.append(host)
    return tuple(dict.fromkeys(shown(name).lower() for name in names))


def allowed_hosts(host: str, port: int) -> frozenset[str]:
    """Every Host header a server bound to host:port accepts: each of its names with the port
    (and without it on port 80, where browsers leave the port out)."""
    names = host_names(host)
    return frozenset([f"{name}:{port}" for name in names] + (list(names) if port == 80 else []))


class Guard:
    """ASGI middleware that answers only the page, its own origin and clients without one.

    Args:
        app: the app behind it.
        hosts: the Host headers it answers (``allowed_hosts``); None: the loopback names on
            any port, and "testserver", the name Starlette's TestClient sends (an app made
            without an address, as scripts and tests make it; never one bound to a socket).
        max_body: the most bytes a request body may have.
    """

    def __init__(self, app, hosts: Iterable[str] | None = None, max_body: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.hosts = None if hosts is None else frozenset(name.lower() for name in hosts)
        self.max_body = max_body

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope["headers"]}
        refusal = self.refusal(scope["method"], scope["path"], headers)
        if refusal is not None:
            await _refuse(send, *refusal)
            return
        await self.app(scope, self._bounded(receive, send), _with_headers(send))

    def refusal(self, method: str, path: str, headers: dict[str, str]) -> tuple[int, str] | None:
        """(status, message) for a request this server does not answer; None for one it does."""
        host = headers.get("host", "").lower()
        if not self._host_allowed(host):
            return 421, (f"this server answers requests addressed to {self._names()}, not to {host or 'no host'}: "
                         "open the address selfattn serve printed")
        if method in ("GET", "HEAD") and path not in WORK_PATHS:
            return None  # reading the page, its assets and the model list changes nothing
        origin = headers.get("origin")
        if origin is not None and origin.lower() != f"http://{host}":
            return 403, f"requests from {origin} are refused: only the page at http://{host}/ may use this server"
        site = headers.get("sec-fetch-site")
        if site is not None and site.lower() not in ("same-origin", "none"):
            return 403, f"a {site} request is refused: only the page at http://{host}/ may use this server"
        if method in ("GET", "HEAD"):
            return None
        kind = headers.get("content-type", "").split(";")[0].strip().lower()
        if method == "POST" and kind != JSON_TYPE:
            return 415, f"the body must be JSON, sent as Content-Type: {JSON_TYPE} (got {kind or 'none'})"
        length = headers.get("content-length")
        if length is not None:
            if not length.isdigit():
                return 400, f"Content-Length must be a whole number of bytes, got {length!r}"
            if int(length) > self.max_body:
                return 413, f"the body has {int(length)} bytes; this server takes at most {self.max_body}"
        return None

    def _host_allowed(self, host: str) -> bool:
        if self.hosts is not None:
            return host in self.hosts
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        port = host.rsplit(":", 1)[1] if ":" in host and not host.endswith("]") else ""
        return (name in LOOPBACK_NAMES or name == TEST_CLIENT) and (port == "" or port.isdigit())

    def _names(self) -> str:
        return ", ".join(sorted(self.hosts)) if self.hosts is not None else "this machine's loopback names"

    def _bounded(self, receive, send):
        """``receive`` that stops a body sent in chunks once it passes ``max_body``."""
        seen = 0

        async def bounded():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_body:
                    raise BodyTooLong(self.max_body)
            return message

        return bounded


class BodyTooLong(SelfAttnError):
    """A body sent without a length went past the limit (the app answers it with a 413)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the body has more than {limit} bytes; this server takes at most {limit}")
        self.status = 413


def _with_headers(send):
    """``send`` that adds the headers every response carries (and a policy where none was set)."""

    async def sending(message) -> None:
        if message["type"] == "http.response.start":
            headers = [(name, value) for name, value in message.get("headers", [])
                       if not name.lower().startswith(b"access-control-allow-")]
            if not any(name.lower() == b"content-security-policy" for name, _ in headers):
                headers.append((b"content-security-policy", DEFAULT_POLICY.encode()))
            headers += [header for header in ALWAYS if header[0] not in {name.lower() for name, _ in headers}]
            message = {**message, "headers": headers}
        await send(message)

    return sending


async def _refuse(send, status: int, message: str) -> None:
    line = " ".join(message.split())
    body = json.dumps({"error": line, "detail": line}).encode("utf-8")
    await _with_headers(send)({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
