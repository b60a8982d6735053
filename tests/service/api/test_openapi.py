"""The OpenAPI document describes what the service takes, from the same models as ops, as a
real OpenAPI 3.0 document (OGC API - Processes 1.0, /req/oas30/oas-definition-2), as the
OpenAPI Initiative's 3.0 schema, through openapi-spec-validator, judges it."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
import yaml
from openapi_spec_validator.validation.validators import OpenAPIV30SpecValidator

from ops import registry
from service.api import oas30
from service.api.app import create_app

OAS30_MEDIA_TYPE = "application/vnd.oai.openapi+json;version=3.0"
OGC = Path(__file__).resolve().parents[2] / "ogc_schemas"


def spec_errors(document: dict) -> list[str]:
    return [str(error)[:500] for error in OpenAPIV30SpecValidator(document).iter_errors()]


@pytest.mark.smoke
def test_the_served_document_is_openapi_30_as_its_media_type_says(client):
    served = client.get("/openapi.json")
    assert served.status_code == 200
    assert served.headers["content-type"] == OAS30_MEDIA_TYPE
    document = served.json()
    assert re.fullmatch(r"3\.0\.\d+", document["openapi"]), document["openapi"]
    assert spec_errors(document) == []


def test_the_validator_refuses_json_schema_that_openapi_30_cannot_say():
    # the check above can fail: each 3.1 form in one schema of the document is an error
    document = create_app().openapi()
    for bad in ({"type": "null"}, {"type": ["string", "null"]}, {"prefixItems": [{}]}, {"const": "x"},
                {"propertyNames": {"enum": ["a"]}}, {"examples": ["x"]}, {"exclusiveMinimum": 0},
                {"$defs": {}}, {"contentMediaType": "text/plain"}):
        changed = copy.deepcopy(document)
        changed["components"]["schemas"]["Link"]["properties"]["href"].update(bad)
        assert spec_errors(changed), bad
    assert spec_errors({**document, "openapi": "3.1.0"})


def test_the_conversion_keeps_the_rules():
    # what the converter makes of pydantic's 2020-12 forms, rule for rule
    assert oas30.schema({"anyOf": [{"type": "integer", "minimum": 0}, {"type": "null"}], "default": None}) == {
        "type": "integer", "minimum": 0, "default": None, "nullable": True}
    assert oas30.schema({"anyOf": [{"type": "string", "enum": ["a"]}, {"type": "null"}]}) == {
        "type": "string", "enum": ["a", None], "nullable": True}
    assert oas30.schema({"const": "x", "type": "string"}) == {"enum": ["x"], "type": "string"}
    assert oas30.schema({"type": "number", "exclusiveMinimum": 0}) == {
        "type": "number", "minimum": 0, "exclusiveMinimum": True}
    assert oas30.schema({"type": "array", "prefixItems": [{"type": "integer"}, {"type": "integer"}],
                         "minItems": 2, "maxItems": 2}) == {
        "type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2}
    assert oas30.schema({"type": "object", "propertyNames": {"enum": ["a", "b"]},
                         "additionalProperties": {"type": "string"}}) == {
        "type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}},
        "additionalProperties": False}
    assert oas30.schema({"anyOf": [{"type": "integer"}, {"type": "number"}, {"type": "string", "const": "NaN"}]}) == {
        "oneOf": [{"type": "number"}, {"type": "string", "enum": ["NaN"]}]}
    assert oas30.schema({"anyOf": [{"$ref": "#/components/schemas/A"}, {"type": "null"}]},
                        components={"A": {"type": "object"}}) == {
        "allOf": [{"$ref": "#/components/schemas/A"}], "type": "object", "nullable": True}
    with pytest.raises(ValueError, match="patternProperties"):
        oas30.schema({"type": "object", "patternProperties": {"^a": {}}})


@pytest.mark.smoke
def test_execute_inputs_are_the_params_models_of_every_operator():
    document = create_app().openapi()
    body = document["paths"]["/processes/{process_id}/execution"]["post"]["requestBody"]
    variants = body["content"]["application/json"]["schema"]["properties"]["inputs"]["anyOf"]
    assert len(variants) == len(registry.OPERATORS)
    executions = [path for path in document["paths"] if path.endswith("/execution")]
    assert executions == ["/processes/echo/execution"] + [
        f"/processes/{name}/execution" for name in registry.OPERATORS] + ["/processes/{process_id}/execution"]
    for op, variant in zip(registry.OPERATORS.values(), variants):
        # each process's own execution operation has the same inputs as its variant
        own = document["paths"][f"/processes/{op.name}/execution"]["post"]["requestBody"]
        assert own["content"]["application/json"]["schema"]["properties"]["inputs"] == {
            **variant, "description": "array inputs and keyword parameters"}
        model = op.params.model_json_schema()
        for name in op.keywords:
            # the same rules: bounds and enums straight from the schemas model, in 3.0 terms
            # (FastAPI drops null values)
            published = {k: v for k, v in variant["properties"][name].items()
                         if k not in ("title", "description") and v is not None}
            if "$ref" not in json.dumps(model["properties"][name]):
                expected = oas30.schema(model["properties"][name], content=True)
                assert published == {k: v for k, v in expected.items()
                                     if k not in ("title", "description") and v is not None}, name
        assert set(variant["required"]) == set(op.array_inputs) | set(model.get("required", []))


def test_every_reference_resolves():
    document = create_app().openapi()
    refs = set(re.findall(r'"\$ref": "([^"]+)"', json.dumps(document)))
    known = {f"#/components/schemas/{name}" for name in document["components"]["schemas"]}
    assert refs <= known, refs - known


def test_processes_declares_limit_as_the_standard_words_it():
    # /req/core/pl-limit-definition: the OpenAPI 3.0 fragment of the requirement's own text
    text = (OGC / "core/requirements/core/REQ_process-list-limit-def.adoc").read_text()
    fragment = yaml.safe_load(re.search(r"\[source,yaml\]\n----\n(.*?)\n----", text, re.S).group(1))
    assert fragment["name"] == "limit" and fragment["schema"]["maximum"] == 10000
    operation = create_app().openapi()["paths"]["/processes"]["get"]
    assert operation["operationId"] == "getProcesses"  # as OGC's test suite looks it up
    (limit,) = [p for p in operation["parameters"] if p["name"] == "limit"]
    assert {k: v for k, v in limit.items() if k != "description"} == fragment
