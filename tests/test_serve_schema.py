"""The live app's OpenAPI schema (/openapi.json) against docs/live.md's table of the requests' fields.

The table is the reference a reader has; the schema is what programs (and the fuzzer,
tests/test_serve_fuzz.py) read. Every field the table gives, with its JSON type, default
and range, must be the schema's, and the schema must have no field the table leaves out,
so the two cannot drift apart. The checks' own refusals at those bounds are in
tests/test_serve_api.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="the live app needs fastapi (make run installs it)")
from fastapi.testclient import TestClient  # noqa: E402

from selfattn.commands.live import LiveModels, variant_names  # noqa: E402
from selfattn.serve.app import create_app  # noqa: E402

PAGE = Path(__file__).resolve().parents[1] / "docs" / "live.md"
BODIES = {"attention": "AttentionBody", "generate": "GenerateBody", "explain": "ExplainBody"}
# The table's words for a JSON type, where they are not the type's own name.
TYPE_WORDS = {"list of `[layer, head]`": "list of [integer, integer]",
              'list of `{"role", "content"}`': "list of {role, content}", "list of integers": "list of integer"}


@pytest.fixture(scope="module")
def document() -> dict:
    with TestClient(create_app(LiveModels())) as client:
        response = client.get("/openapi.json")
    assert response.status_code == 200 and response.headers["content-type"] == "application/json"
    return response.json()


def table_rows() -> list[list[str]]:
    section = PAGE.read_text(encoding="utf-8").split("### The requests' fields")[1]
    table = section[section.index("| endpoint"):].split("\n\n")[0]  # the first table, up to its blank line
    rows = [[cell.strip() for cell in line.strip().strip("|").split(" | ")] for line in table.splitlines()[2:]]
    assert rows and all(len(row) == 5 for row in rows)
    return rows


def resolve(document: dict, schema: dict) -> dict:
    ref = schema.get("$ref")
    return resolve(document, document["components"]["schemas"][ref.split("/")[-1]]) if ref else schema


def kind(document: dict, schema: dict) -> str:
    """A schema's JSON type in the table's words."""
    schema = resolve(document, schema)
    if "const" in schema:
        return json.dumps(schema["const"])
    if schema.get("type") == "array":
        if "prefixItems" in schema:
            return "[" + ", ".join(kind(document, item) for item in schema["prefixItems"]) + "]"
        return "list of " + kind(document, schema["items"])
    if schema.get("type") == "object":
        return "{" + ", ".join(schema["properties"]) + "}"
    return schema["type"]


def schema_facts(document: dict, field: dict) -> tuple[set[str], dict]:
    """(the field's JSON types but null, its bounds) as the schema gives them."""
    branches = [resolve(document, branch) for branch in field.get("anyOf", [field]) if branch.get("type") != "null"]
    facts: dict = {}
    for branch in branches:
        facts.update({key: branch[key] for key in ("minimum", "maximum", "exclusiveMinimum", "maxLength", "minItems",
                                                   "uniqueItems", "enum") if key in branch})
        if "pattern" in branch:
            facts["not blank"] = branch["pattern"] == r"\S" and branch.get("minLength") == 1
        items = resolve(document, branch.get("items", {}))
        if "minimum" in items:
            facts["each minimum"] = items["minimum"]
        for member in items.get("properties", {}).values():
            if "enum" in member:
                facts["enum"] = member["enum"]
    return {kind(document, branch) for branch in branches}, facts


def number(text: str) -> int | float:
    return json.loads(text.replace(",", ""))


def table_facts(cell: str, names: list[str]) -> dict:
    """The bounds an "allowed" cell gives before its first semicolon."""
    first = cell.split(";")[0]
    facts: dict = {}
    if "/api/models" in first:
        facts["enum"] = names
    if "/api/variants" in first:
        facts["enum"] = "the names /api/variants lists"  # which list: the field's own, below
    if quoted := re.findall(r'`"(\w+)"`', first):
        facts["enum"] = quoted
    if found := re.search(r"^(-?[\d,]+) to (-?[\d,]+)", first):
        facts["minimum"], facts["maximum"] = number(found[1]), number(found[2])
    if found := re.search(r"(?<!each )\b([\d,]+) or more", first):
        facts["minimum"] = number(found[1])
    if found := re.search(r"each ([\d,]+) or more", first):
        facts["each minimum"] = number(found[1])
    if found := re.search(r"above ([\d.]+), at most ([\d.]+)", first):
        facts["exclusiveMinimum"], facts["maximum"] = number(found[1]), number(found[2])
    if found := re.search(r"at most ([\d,]+) characters", first):
        facts["maxLength"] = number(found[1])
    if "not blank" in first:
        facts["not blank"] = True
    if "at least one" in first:
        facts["minItems"] = 1
    if "distinct" in first:
        facts["uniqueItems"] = True
    return facts


def test_the_schema_is_served_and_the_pages_that_load_a_cdn_are_not(document):
    assert document["openapi"].startswith("3.1") and document["info"]["title"] == "selfattn live"
    assert {"/api/models", "/api/variants", "/api/explain", "/api/attention", "/api/generate", "/explorer"} <= set(
        document["paths"])
    with TestClient(create_app(LiveModels())) as client:
        assert client.get("/docs").status_code == 404 and client.get("/redoc").status_code == 404


def test_every_refusal_is_described_as_one_json_line(document):
    refusal = document["components"]["schemas"]["Refusal"]
    assert set(refusal["required"]) == {"error", "detail"}
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            assert "422" not in operation["responses"], (path, method)  # the routes' own 400, never FastAPI's 422
            for status, answer in operation["responses"].items():
                if status.startswith(("4", "5")):
                    assert answer["content"]["application/json"]["schema"]["$ref"].endswith("/Refusal"), (path, status)
            if method == "post":
                body = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
                assert body.endswith(BODIES[path.split("/")[-1]])


def test_the_schema_has_the_fields_the_checks_take(document):
    from selfattn.serve.schema import BODIES as DESCRIBED

    for endpoint, (model, fields) in DESCRIBED.items():
        assert model.__name__ == BODIES[endpoint]
        assert sorted(document["components"]["schemas"][model.__name__]["properties"]) == sorted(fields), endpoint


def test_the_table_of_fields_is_the_schema(document):
    names = LiveModels().names
    rows = table_rows()
    for endpoint, body in BODIES.items():
        schema = document["components"]["schemas"][body]
        assert schema["additionalProperties"] is False  # an unknown field is refused
        fields = [row[1].strip("`") for row in rows if row[0] == endpoint]
        assert sorted(fields) == sorted(schema["properties"]), endpoint
        for _, name, type_words, default, allowed in (row for row in rows if row[0] == endpoint):
            name = name.strip("`")
            field = schema["properties"][name]
            where = f"{endpoint}.{name}"
            types, facts = schema_facts(document, field)
            words = {TYPE_WORDS.get(part, part).replace("`", "") for part in type_words.split(" or ")}
            assert types == words, where
            if default == "(required)":
                assert name in schema.get("required", []), where
            else:
                assert name not in schema.get("required", []), where
                assert {"type": "null"} in field.get("anyOf", []), f"{where}: null must mean the default"
                written = default.strip("`")
                expected = json.loads(written) if default.startswith("`") or re.fullmatch(r"-?\d+", written) else None
                assert field["default"] == expected, where
            expected = table_facts(allowed, names)
            if expected.get("enum") == "the names /api/variants lists":
                expected["enum"] = variant_names()["variants" if name == "variant" else name]
            assert facts == expected, where
