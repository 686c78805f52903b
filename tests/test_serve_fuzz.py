"""The live app's API fuzzed from its own OpenAPI schema (schemathesis), in process, no network.

Every operation /openapi.json describes is called with bodies and queries drawn from its
schema, valid ones and invalid ones alike (schemathesis' "all" mode), a bounded number of
each. Every answer must be one the schema declares for it (status, content type, the JSON's
shape), never a 5xx; a refusal is one line of JSON, ``{"error", "detail"}``, the same line
under both names; and the server answers a plain request afterwards.

To stay quick the fuzzed copy of the schema offers only the two tiny built-in models
(tiny-induction, stories260K: the others take seconds to load) and at most 8 new tokens a
generation; the app itself is the real one, with every built-in model.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("fastapi", reason="the live app needs fastapi (make run installs it)")
schemathesis = pytest.importorskip("schemathesis", reason="the fuzzer is a dev dependency (make test installs it)")
from fastapi.testclient import TestClient  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402
from schemathesis.config import SchemathesisConfig  # noqa: E402

from selfattn.commands.live import LiveModels  # noqa: E402
from selfattn.serve.app import create_app  # noqa: E402

SMALL_MODELS = ["tiny-induction", "stories260K"]
FEW_TOKENS = 8
EXAMPLES = 12  # per operation, besides schemathesis' own boundary cases

APP = create_app(LiveModels())


def fuzzed_document() -> dict:
    """/openapi.json as the app serves it, with the small models only and short generations."""
    with TestClient(APP) as client:
        response = client.get("/openapi.json")
    assert response.status_code == 200
    document = response.json()
    schemas = document["components"]["schemas"]
    for body in ("ExplainBody", "AttentionBody", "GenerateBody"):
        field = schemas[body]["properties"]["model"]
        for branch in field.get("anyOf", [field]):
            if "enum" in branch:
                assert set(SMALL_MODELS) <= set(branch["enum"])
                branch["enum"] = SMALL_MODELS
    for parameter in document["paths"]["/explorer"]["get"]["parameters"]:
        if parameter["name"] == "model":
            parameter["schema"]["enum"] = SMALL_MODELS
    for branch in schemas["GenerateBody"]["properties"]["max_new_tokens"]["anyOf"]:
        if branch.get("type") == "integer":
            branch["maximum"] = FEW_TOKENS
    return document


CONFIG = SchemathesisConfig.from_dict({
    "seed": 20240,  # the same cases on every run
    "generation": {"mode": "all", "max-examples": EXAMPLES},
    "phases": {"stateful": {"enabled": False}},
    "request-timeout": 60,
})
schema = schemathesis.openapi.from_dict(fuzzed_document(), config=CONFIG)
schema.app = APP

CHECKS = ("not_a_server_error", "status_code_conformance", "content_type_conformance", "response_schema_conformance",
          "response_headers_conformance")


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
def test_every_operation_answers_as_its_schema_says(case):
    from schemathesis import checks

    response = case.call()
    case.validate_response(response, checks=[getattr(checks, name) for name in CHECKS])
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        assert response.headers["content-type"][0].startswith("application/json"), (response.status_code, response.text)
        assert response.text.count("\n") == 0, response.text
        refusal = json.loads(response.text)
        assert set(refusal) == {"error", "detail"} and refusal["error"] == refusal["detail"], refusal
        assert refusal["error"].strip() and "Traceback" not in refusal["error"]


def test_the_server_still_answers_afterwards():
    with TestClient(APP) as client:
        body = {"model": "tiny-induction", "text": "abcabc", "layer": 1, "head": 0}
        answer = client.post("/api/attention", json=body)
        assert answer.status_code == 200 and answer.json()["tokens"] == ["<s>", "a", "b", "c", "a", "b", "c"]
        assert client.get("/api/models").status_code == 200
