"""The live app's routes: the page, its assets and the JSON API, each a thin call into ``commands.live``.

    GET  /                 the page (render/visual/assets/live.html, with its own script and style)
    GET  /assets/{name}    the page's script modules (live.js and its live-*.js) and live.css
    GET  /explorer         the explorer page of ``selfattn view`` for the query's fields
    GET  /api/models       the models offered
    GET  /api/variants     the variants and positional encodings explain takes
    GET  /openapi.json     this API's OpenAPI schema (``serve.schema``)
    POST /api/explain      ``selfattn explain --format json``
    POST /api/attention    one head's weights (or a layer's)
    POST /api/generate     a generation and every step; NDJSON when the request's Accept header
                           asks for application/x-ndjson: a line per token as it is chosen,
                           then a line per step

Every refusal is JSON, ``{"error": message, "detail": message}`` with a 4xx status, or 503
and ``Retry-After`` past a model's queue (``serve.admission``: one generation per model at a
time, a few waiting); any other failure is a 500 with a line of text, and the server keeps serving.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from selfattn.commands.live import (
    LiveModels, RequestError, attention_json, explain_json, explorer_page, variant_names,
)
from selfattn.commands.live_generation import LiveGeneration, generate_request
from selfattn.errors import SelfAttnError
from selfattn.serve.admission import (
    GENERATIONS_RUNNING, GENERATIONS_WAITING, WORK_RUNNING, WORK_WAITING, Busy, Gates, Held, until_done,
)
from selfattn.serve.guard import Guard
from selfattn.serve.schema import openapi_document, operation
from selfattn.render.visual.explorer import CONTENT_SECURITY_POLICY as EXPLORER_CONTENT_POLICY
from selfattn.render.visual.live_page import ASSET_TYPES, CONTENT_SECURITY_POLICY, live_asset, live_page

NDJSON = "application/x-ndjson"
# The explorer's own policy (inline script and style, nothing fetched), framed by the page only.
EXPLORER_POLICY = f"{EXPLORER_CONTENT_POLICY}; frame-ancestors 'self'"


def refusal(message: str, status: int, headers: dict[str, str] | None = None) -> JSONResponse:
    """One clear line, in both keys clients look for (ours and FastAPI's)."""
    line = " ".join(str(message).split())
    return JSONResponse({"error": line, "detail": line}, status_code=status, headers=headers)


def create_app(models: LiveModels | None = None, hosts: Iterable[str] | None = None) -> FastAPI:
    """The live app over ``models`` (None: the built-in models only).

    Args:
        models: the models it offers.
        hosts: the Host headers it answers (``guard.allowed_hosts`` of the bound address);
            None: the loopback names on any port. Requests from other sites are refused
            either way (``serve.guard``).
    """
    models = LiveModels() if models is None else models
    # The schema at /openapi.json (serve.schema); no /docs or /redoc pages, which load their scripts from a CDN.
    app = FastAPI(title="selfattn live", docs_url=None, redoc_url=None, openapi_url="/openapi.json")
    app.state.models = models
    app.openapi = lambda: openapi_document(app)
    app.add_middleware(Guard, hosts=hosts)  # the Host, Origin, content type and size of every request

    @app.exception_handler(SelfAttnError)
    async def user_error(request: Request, error: SelfAttnError) -> JSONResponse:
        return refusal(str(error), getattr(error, "status", 400))

    @app.exception_handler(Busy)
    async def busy(request: Request, error: Busy) -> JSONResponse:
        return refusal(str(error), error.status, {"Retry-After": str(error.retry_after)})

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, error: HTTPException) -> JSONResponse:
        return refusal(str(error.detail), error.status_code)

    @app.exception_handler(Exception)
    async def our_bug(request: Request, error: Exception) -> JSONResponse:
        return refusal(f"internal error ({type(error).__name__}): {error}", 500)

    async def body_of(request: Request) -> Any:
        body = await request.body()  # the guard stops a body sent in chunks past its limit (413)
        try:
            return json.loads(body)
        except (ValueError, UnicodeDecodeError):
            raise RequestError("the body is not JSON: send a JSON object") from None

    generations = Gates("generation", GENERATIONS_RUNNING, GENERATIONS_WAITING)
    work = Gates("request", WORK_RUNNING, WORK_WAITING)

    async def bounded(fields: Any, function, *args) -> Any:
        """``function(*args)`` in the thread pool, once the gate of the model ``fields`` name lets it in."""
        name = fields.get("model") if isinstance(fields, dict) else None
        place = await work.of(name if isinstance(name, str) and name in app.state.models.names else "").enter()
        try:
            return await run_in_threadpool(function, *args)
        finally:
            place.leave()

    @app.get("/", response_class=HTMLResponse, openapi_extra=operation("page"))
    def page() -> HTMLResponse:
        return HTMLResponse(live_page(), headers={"Content-Security-Policy": CONTENT_SECURITY_POLICY})

    @app.get("/favicon.ico", include_in_schema=False)
    def no_icon() -> Response:
        return Response(status_code=204)  # the page has none; a 404 here would be a console error

    @app.get("/assets/{name}", openapi_extra=operation("asset"))
    def asset(name: str) -> Response:
        if name not in ASSET_TYPES:
            raise RequestError(f"no asset {name!r}", 404)
        return Response(live_asset(name), media_type=ASSET_TYPES[name])

    @app.get("/explorer", response_class=HTMLResponse, openapi_extra=operation("explorer"))
    async def explorer(request: Request) -> HTMLResponse:
        fields: dict[str, Any] = dict(request.query_params)
        for name in ("heads", "kv_heads", "d_k", "block_size", "dim", "seed", "precision", "layer", "head"):
            if name in fields:
                try:
                    fields[name] = int(fields[name])
                except ValueError:
                    raise RequestError(f"{name} must be a whole number, got {json.dumps(fields[name])}") from None
        if isinstance(fields.get("query"), str) and fields["query"].lstrip("-").isdigit():
            fields["query"] = int(fields["query"])
        return HTMLResponse(await bounded(fields, explorer_page, app.state.models, fields),
                            headers={"Content-Security-Policy": EXPLORER_POLICY})

    @app.get("/api/models", openapi_extra=operation("models"))
    def listing() -> dict:
        return app.state.models.listing()

    @app.get("/api/variants", openapi_extra=operation("variants"))
    def variants() -> dict:
        return variant_names()

    @app.post("/api/explain", openapi_extra=operation("explain"))
    async def explain(request: Request) -> Response:
        body = await body_of(request)
        text = await bounded(body, explain_json, app.state.models, body)
        return Response(text, media_type="application/json")

    @app.post("/api/attention", openapi_extra=operation("attention"))
    async def attention(request: Request) -> dict:
        body = await body_of(request)
        return await bounded(body, attention_json, app.state.models, body)

    @app.post("/api/generate", openapi_extra=operation("generate"))
    async def generate(request: Request) -> Response:
        body = await body_of(request)
        checked = generate_request(app.state.models, body)
        place = await generations.of(checked.model).enter()  # 503 past the model's queue
        try:
            run = await run_in_threadpool(LiveGeneration, app.state.models, checked)
            if NDJSON in request.headers.get("accept", ""):
                return Held(_lines(run), place, run.stop, NDJSON)
            await until_done(request.receive, run.stop, run.run)  # a client gone stops it at the next token
            return Held(_json_text(run), place, run.stop, "application/json")
        except BaseException:
            place.leave()
            raise

    return app


def _lines(run: LiveGeneration):
    """The stream: one line per event of ``run.events()``; a failure after the status is sent is a last line."""
    try:
        for event in run.events():
            yield _line(event)
    except Exception as error:  # noqa: BLE001 - the status is sent; the page reads the error line
        message = str(error) if isinstance(error, SelfAttnError) else f"internal error ({type(error).__name__}): {error}"
        yield _line({"event": "error", "error": " ".join(message.split())})


def _json_text(run: LiveGeneration, chunk: int = 1 << 18):
    """``run.whole()``'s object as JSON text, in pieces of about ``chunk`` characters, a step at a
    time: the answer is never whole in memory."""
    write = lambda value: json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))  # noqa: E731
    pieces = [write({**run.start(), **run.done()})[:-1] + ',"steps":[']
    size = len(pieces[0])
    for t, step in enumerate(run.steps()):
        pieces.append(("," if t else "") + write(step))
        size += len(pieces[-1])
        if size >= chunk:  # each piece sent is a hop to the event loop and back: not one per step
            yield "".join(pieces).encode("utf-8")
            pieces, size = [], 0
    yield ("".join(pieces) + "]}").encode("utf-8")


def _line(value: dict) -> bytes:
    return (json.dumps(value, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")
