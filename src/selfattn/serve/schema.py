"""The live app's API described for OpenAPI (``GET /openapi.json``): the bodies, the answers, the refusal.

The models here describe and never check: a route reads its body itself and
``commands.live`` checks it, refusing with one line of JSON (a 4xx), never FastAPI's 422.
Every bound and default is read from the constant or the record the check uses
(``MAX_TEXT_CHARS``, ``MAX_LIVE_NEW_TOKENS``, ``EXPLAIN_WHOLE``, ``ExplainConfig``'s
defaults, ...), so the schema says what the checks do; tests/test_serve_schema.py holds
docs/live.md's table of fields to it.

    operation(name)              a route's ``openapi_extra``: its body, its answers, its refusals
    openapi_document(app)        the document: FastAPI's, with these bodies as components and
                                 ``model`` listing the names the app offers
"""

from __future__ import annotations

from copy import deepcopy
from dataclasses import fields as dataclass_fields
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from selfattn.commands.live import (
    ATTENTION_FIELDS, EXPLAIN_FIELDS, EXPLAIN_WHOLE, MAX_LAYER_CELLS, MAX_SEED, MAX_TEXT_CHARS,
)
from selfattn.commands.live_generate_request import (
    DEFAULT_SEED, GENERATE_FIELDS, MAX_LIVE_NEW_TOKENS, MAX_STEP_NUMBERS, MAX_TEMPERATURE, TOP_SHOWN,
)
from selfattn.commands.explain_options import MAX_TOKENS, ExplainConfig
from selfattn.models.chat import ROLES
from selfattn.pipeline.embedding_options import EMBED_METHODS
from selfattn.positional import POSITIONAL_NAMES
from selfattn.trace.variant_names import VARIANTS
from selfattn.render.visual.live_page import ASSET_TYPES, CSS, JAVASCRIPT

REF = "#/components/schemas/{model}"
NOT_BLANK = r"\S"  # a text with something besides white space
Whole = Annotated[int, Field(ge=0)]


def _default(name: str) -> Any:
    """``ExplainConfig``'s default for a field: the API's, since a body's fields become its arguments."""
    return {field.name: field.default for field in dataclass_fields(ExplainConfig)}[name]


def _whole(name: str, default: Any, description: str) -> Any:
    """A whole-number field of explain within ``EXPLAIN_WHOLE``'s bounds for it; null means the default."""
    low, high = EXPLAIN_WHOLE[name]
    return Field(default, ge=low, le=high, description=description)


# ---- the bodies ---------------------------------------------------------------------------
# Every field may be null, which means its default; an unknown field is refused.

class ExplainBody(BaseModel):
    """POST /api/explain: the options of ``selfattn explain`` as fields; the answer is its JSON."""

    model_config = ConfigDict(extra="forbid")
    text: Annotated[str, Field(min_length=1, max_length=MAX_TEXT_CHARS, pattern=NOT_BLANK)] | None = Field(
        None, description=f"the sentence; default: the seed's sentence. At most {MAX_TOKENS} tokens")
    query: str | int | None = Field(
        None, description="a token of the text, or its position from 0 (negative: from the end); default: position 1")
    variant: Literal[VARIANTS] | None = Field(_default("variant"), description="the attention variant")
    positional: Literal[POSITIONAL_NAMES] | None = Field(_default("positional"), description="the positional encoding")
    heads: int | None = _whole("heads", None,
                               "query heads, with multihead or gqa; default: none (2 for multihead, 4 for gqa)")
    kv_heads: int | None = _whole("kv_heads", None,
                                  "key/value heads, with gqa; default: none (half the heads, 1 when odd)")
    d_k: int | None = _whole("d_k", None, "the width of each head's queries and keys, with projections; "
                             "default: none (the width over the heads)")
    block_size: int | None = _whole("block_size", None, "keys per block, with flash; default: none (2)")
    embed: Literal[EMBED_METHODS] | None = Field(_default("embed"), description="how the embeddings are made")
    dim: int | None = _whole("dim", None, "the width of random embeddings; default: none (3)")
    seed: int | None = _whole("seed", _default("seed"), "seeds the random embeddings and weights")
    precision: int | None = _whole("precision", _default("precision"), "digits after the decimal point")
    model: str | None = Field(None, description="a model to explain instead of the variants; default: none")
    layer: int | None = _whole("layer", None, "with model: its layer; default: none (0)")
    head: int | None = _whole("head", None, "with model: its head; default: none (0)")
    format: Literal["json"] | None = Field("json", description="the API answers in JSON only")


class AttentionBody(BaseModel):
    """POST /api/attention: one head's weights, or every head's of a layer."""

    model_config = ConfigDict(extra="forbid")
    model: str = Field(description="a name /api/models lists")
    text: Annotated[str, Field(min_length=1, max_length=MAX_TEXT_CHARS, pattern=NOT_BLANK)] = Field(
        description="the text; at most the model's positions in tokens")
    layer: Whole | None = Field(0, description="the layer, below the model's layers")
    head: Whole | Literal["all"] | None = Field(
        "all", description=f'the head, below the model\'s heads, or "all": heads x tokens^2 at most {MAX_LAYER_CELLS}')


class ChatMessage(BaseModel):
    """One message of a chat."""

    model_config = ConfigDict(extra="forbid")
    role: Literal[ROLES]
    content: str


class GenerateBody(BaseModel):
    """POST /api/generate: a generation and every step's numbers."""

    # A prompt or a chat: text or messages, one of them.
    model_config = ConfigDict(extra="forbid", json_schema_extra={"oneOf": [
        {"required": ["text"], "properties": {"text": {"type": "string"}}},
        {"required": ["messages"], "properties": {"messages": {"type": "array"}}}]})
    model: str = Field(description="a decoder /api/models lists")
    text: Annotated[str, Field(min_length=1, max_length=MAX_TEXT_CHARS, pattern=NOT_BLANK)] | None = Field(
        None, description="the prompt; send it or messages")
    messages: Annotated[list[ChatMessage], Field(min_length=1)] | None = Field(
        None, description=f"a chat, in place of text, for a model with chat: the last message the user's; "
                          f"at most {MAX_TEXT_CHARS} characters in all; default: none")
    max_new_tokens: int | None = Field(20, ge=1, le=MAX_LIVE_NEW_TOKENS, description="tokens to generate")
    temperature: float | None = Field(0.0, ge=0, le=MAX_TEMPERATURE, description="0 is greedy")
    top_k: int | None = Field(None, ge=1, description="sample from the k likeliest; default: none")
    top_p: float | None = Field(None, gt=0, le=1, description="sample from the likeliest p of the mass; default: none")
    seed: int | None = Field(DEFAULT_SEED, ge=0, le=MAX_SEED, description="seeds the sampling")
    ablate: list[tuple[int, int]] | None = Field([], description="[layer, head] pairs knocked out")
    first_step: int | None = Field(0, ge=0, le=MAX_LIVE_NEW_TOKENS, description="the steps before it are left out")
    layers: Literal["all"] | Annotated[list[Whole], Field(json_schema_extra={"uniqueItems": True})] | None = Field(
        "all", description="the layers each step's attention holds, in this order")
    heads: Literal["all"] | Annotated[list[Whole], Field(json_schema_extra={"uniqueItems": True})] | None = Field(
        "all", description=f"the heads of each of those layers; one answer holds at most {MAX_STEP_NUMBERS} "
                           "attention numbers")


# Each route's body and the fields its check takes (explain's "format": "json" only, dropped before the check).
BODIES = {"explain": (ExplainBody, EXPLAIN_FIELDS + ("format",)), "attention": (AttentionBody, ATTENTION_FIELDS),
          "generate": (GenerateBody, GENERATE_FIELDS)}


# ---- the answers, briefly -----------------------------------------------------------------

class Refusal(BaseModel):
    """Every refusal: one line, the same under both names."""

    error: str = Field(description="why, in one line")
    detail: str = Field(description="the same line, where FastAPI's clients look")


class ModelEntry(BaseModel):
    name: str
    kind: Literal["encoder", "decoder"] | None = None
    layers: int | None = None
    heads: int | None = None
    kv_heads: int | None = None
    positions: int | None = None
    loaded: bool | None = None
    chat: bool | None = Field(None, description="a decoder's: it carries a chat template")
    weights: dict[str, int] | None = Field(None, description="a GGUF file's block types and their tensors")
    error: str | None = Field(None, description="in place of the sizes, when the model cannot be read")


class ModelsAnswer(BaseModel):
    models: list[ModelEntry]


class VariantsAnswer(BaseModel):
    variants: list[str]
    positional: list[str]


class AttentionAnswer(BaseModel):
    model: str
    layer: int
    head: int | Literal["all"]
    tokens: list[str]
    labels: list[str]
    weights: list[list[Any]] = Field(description='[queries][keys]; with "all", [heads][queries][keys]')
    kind: str
    causal: bool
    window: int | None
    mask_ranges: list[list[int]] = Field(description="per query, the keys [start, end) it may see")
    positional: str | None
    rope_base: float | None
    kv_heads: int
    kv_head_of: list[int]


class Candidate(BaseModel):
    id: int
    token: str
    label: str
    p: float


class Step(BaseModel):
    step: int
    id: int
    token: str
    label: str
    text: str
    p: float
    top: list[Candidate] = Field(max_length=TOP_SHOWN)
    attention: list[list[list[float]]] = Field(description="[layers asked][heads asked][keys]")
    cache: dict[str, Any]


class GenerateAnswer(BaseModel):
    model: str
    prompt_ids: list[int]
    prompt_tokens: list[str]
    prompt_labels: list[str]
    positions: int
    ablate: list[list[int]]
    chat: bool
    options: dict[str, Any]
    ids: list[int]
    text: str
    tokens: list[str]
    steps_total: int
    window_slid_at: int | None
    steps: list[Step]


ANSWERS = (Refusal, ModelsAnswer, VariantsAnswer, AttentionAnswer, GenerateAnswer)


# ---- the routes' descriptions ---------------------------------------------------------------

def _json(name: str) -> dict[str, Any]:
    return {"application/json": {"schema": {"$ref": REF.format(model=name)}}}


REFUSED = {"description": "refused: one line of JSON", "content": _json("Refusal")}
GUARDED = {"4XX": {"description": "refused before the route runs (serve.guard): 421 a foreign Host, "
                                  "403 a foreign Origin, 415 a body not JSON, 413 a body too long",
                   "content": _json("Refusal")}}
BUSY = {"503": {**REFUSED, "description": "the model's queue is full: ask again after Retry-After seconds",
                "headers": {"Retry-After": {"schema": {"type": "integer", "minimum": 0}}}}}
ASKED = {"400": {**REFUSED, "description": "a field out of range, of the wrong type, or unknown"},
         "404": {**REFUSED, "description": "a model this server does not offer"}, **GUARDED, **BUSY}
PAGE = {"text/html": {"schema": {"type": "string"}}}


def _body(name: str) -> dict[str, Any]:
    return {"required": True, "content": _json(name)}


OPERATIONS: dict[str, dict[str, Any]] = {
    "page": {"responses": {"200": {"description": "the live page", "content": PAGE}, **GUARDED}},
    "asset": {"responses": {"200": {"description": "one of the page's script modules or style sheets",
                                    "content": {kind.split(";")[0]: {"schema": {"type": "string"}}
                                                for kind in (JAVASCRIPT, CSS)}},
                            "404": {**REFUSED, "description": "no such asset"}, **GUARDED}},
    "models": {"responses": {"200": {"description": "the models offered", "content": _json("ModelsAnswer")},
                             **GUARDED}},
    "variants": {"responses": {"200": {"description": "the names explain's variant and positional take",
                                       "content": _json("VariantsAnswer")}, **GUARDED}},
    "explain": {"requestBody": _body("ExplainBody"), "responses": {
        "200": {"description": "exactly the JSON `selfattn explain --format json` prints",
                "content": {"application/json": {"schema": {"type": "object"}}}}, **ASKED}},
    "attention": {"requestBody": _body("AttentionBody"), "responses": {
        "200": {"description": "the weights, rows are queries, and how to read them",
                "content": _json("AttentionAnswer")}, **ASKED}},
    "generate": {"requestBody": _body("GenerateBody"), "responses": {
        "200": {"description": "the generation and every step; with Accept: application/x-ndjson, a line per event",
                "content": {**_json("GenerateAnswer"), "application/x-ndjson": {"schema": {"type": "string"}}}},
        **ASKED}},
    "explorer": {"responses": {"200": {"description": "the explorer page of `selfattn view`", "content": PAGE},
                               **ASKED}},
}


def operation(name: str) -> dict[str, Any]:
    """What a route adds to FastAPI's description of it (its ``openapi_extra``)."""
    return OPERATIONS[name]


def body_schemas(names: list[str]) -> dict[str, dict[str, Any]]:
    """The bodies' and answers' JSON schemas by name, ``model`` listing ``names`` (the models offered)."""
    schemas: dict[str, dict[str, Any]] = {}
    modes = [*((body, "validation") for body, _ in BODIES.values()), *((answer, "serialization") for answer in ANSWERS)]
    for model, mode in modes:
        schema = model.model_json_schema(ref_template=REF, mode=mode)
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    for body, _ in BODIES.values():
        field = schemas[body.__name__]["properties"]["model"]
        for branch in field.get("anyOf", [field]):
            if branch.get("type") == "string":
                branch["enum"] = list(names)
    return schemas


def explorer_parameters(names: list[str]) -> list[dict[str, Any]]:
    """GET /explorer's query: explain's fields, each as its body field without null."""
    properties = body_schemas(names)["ExplainBody"]["properties"]
    parameters = []
    for name in EXPLAIN_FIELDS:
        schema = {key: value for key, value in properties[name].items() if key not in ("default", "title")}
        branches = [branch for branch in schema.pop("anyOf", [schema]) if branch.get("type") != "null"]
        parameters.append({"name": name, "in": "query", "required": False, "description": schema.get("description", ""),
                           "schema": branches[0] if len(branches) == 1 else {"anyOf": branches}})
    return parameters


def openapi_document(app) -> dict[str, Any]:
    """The app's OpenAPI document: FastAPI's from the routes, with the bodies and answers as
    components and no 422 (the routes refuse a body themselves, with a 400)."""
    if app.openapi_schema is None:
        from fastapi.openapi.utils import get_openapi

        from selfattn import __version__

        names = app.state.models.names
        document = get_openapi(title=app.title, version=__version__, routes=app.routes,
                               description=__doc__.split("\n")[0])
        components = document.setdefault("components", {}).setdefault("schemas", {})
        for name in ("HTTPValidationError", "ValidationError"):
            components.pop(name, None)
        components.update(body_schemas(names))
        for route in app.routes:  # a route's answers are exactly those it describes (FastAPI adds a JSON 200, a 422)
            for method in getattr(route, "methods", ()) if getattr(route, "openapi_extra", None) else ():
                document["paths"][route.path][method.lower()]["responses"] = deepcopy(route.openapi_extra["responses"])
        document["paths"]["/explorer"]["get"]["parameters"] = explorer_parameters(names)
        document["paths"]["/assets/{name}"]["get"]["parameters"] = [
            {"name": "name", "in": "path", "required": True, "schema": {"type": "string", "enum": list(ASSET_TYPES)}}]
        app.openapi_schema = document
    return app.openapi_schema
