"""The documents the service publishes about itself, checked against OGC API - Processes 1.0's
own schemas (vendored in tests/ogc_schemas, see its README): the landing page, the
conformance declaration, the process list and every process description, whose input and
output ``schema`` members must be OpenAPI 3.0 Schema Objects (/req/ogc-process-description/
input-def, inputs-def, json-encoding) and say inputs of mixed type with ``oneOf``
(/req/ogc-process-description/input-mixed-type)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml
from openapi_schema_validator import OAS30Validator, oas30_format_checker
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT4

from ops import registry

SCHEMAS = Path(__file__).resolve().parents[2] / "ogc_schemas" / "core" / "openapi" / "schemas"
# Where OGC publishes them (the base their relative $refs resolve against).
BASE = "https://schemas.opengis.net/ogcapi/processes/part1/1.0/openapi/schemas/"


def _registry() -> Registry:
    resources = [(BASE + path.name, Resource.from_contents(yaml.safe_load(path.read_text()), DRAFT4))
                 for path in sorted(SCHEMAS.glob("*.yaml"))]
    return Registry().with_resources(resources)


OGC = _registry()


def ogc_errors(document, schema_file: str) -> list[str]:
    """Why ``document`` is not valid against OGC's ``schema_file`` (none: it is)."""
    validator = OAS30Validator({"$ref": BASE + schema_file}, registry=OGC, format_checker=oas30_format_checker)
    return [f"{'/'.join(map(str, error.absolute_path))}: {error.message[:300]}"
            for error in validator.iter_errors(document)]


def schema_errors(schema: dict, value) -> list[str]:
    """Why ``value`` does not match ``schema`` (an OpenAPI 3.0 Schema Object)."""
    return [error.message[:300] for error in OAS30Validator(schema).iter_errors(value)]


@pytest.fixture(scope="module")
def descriptions(client) -> dict[str, dict]:
    return {name: client.get(f"/processes/{name}").json() for name in registry.OPERATORS}


@pytest.mark.smoke
def test_every_process_description_is_valid_against_the_standards_process_schema(descriptions):
    for name, description in descriptions.items():
        assert description["id"] == name
        assert ogc_errors(description, "process.yaml") == [], name


def test_the_standards_schema_refuses_json_schema_that_openapi_30_cannot_say(descriptions):
    # the check above can fail: 2020-12 forms in an input's schema are refused
    description = descriptions["depth_to_space"]
    for bad in ({"type": "null"}, {"prefixItems": [{"type": "integer"}]}, {"const": 2},
                {"propertyNames": {"enum": ["N"]}}, {"examples": [2]}, {"exclusiveMinimum": 0},
                {"anyOf": [{"type": "integer"}, {"type": "null"}]}):
        changed = copy.deepcopy(description)
        changed["inputs"]["block_size"]["schema"].update(bad)
        assert ogc_errors(changed, "process.yaml"), bad


def test_inputs_of_mixed_type_say_one_of_and_exactly_one_form_matches(descriptions):
    for name, description in descriptions.items():
        for input_name, spec in description["inputs"].items():
            assert "anyOf" not in json.dumps(spec["schema"]), (name, input_name)
    deq_scale = descriptions["ascend_dequant"]["inputs"]["deq_scale"]["schema"]
    assert len(deq_scale["oneOf"]) == 3
    inline = {"value": "k05VTVBZ", "encoding": "base64", "mediaType": "application/x-npy"}
    for value in (0.5, 2, {"href": "/arrays/scale"}, inline, {**inline, "dtype": "bfloat16"},
                  {**inline, "dtype": None}, {"href": "/arrays/scale", "value": "k05VTVBZ"}):
        assert schema_errors(deq_scale, value) == [], value  # oneOf: valid means exactly one form
    for value in ("0.5", [0.5], {"dtype": "bfloat16"}, {**inline, "dtype": "int4"}, None):
        assert schema_errors(deq_scale, value), value
    pad_value = descriptions["space_to_batch"]["inputs"]["pad_value"]["schema"]
    for value in (0, -1.5, "NaN"):
        assert schema_errors(pad_value, value) == [], value
    assert schema_errors(pad_value, "nan")


def test_keyword_schemas_keep_their_rules_in_openapi_30_terms(descriptions):
    paddings = descriptions["space_to_batch"]["inputs"]["paddings"]["schema"]
    assert schema_errors(paddings, [[0, 1], [2, 3]]) == []
    for bad in ([[0, 1]], [[0, 1], [2, 3], [4, 5]], [[0, 1, 2], [2, 3]], [[0, -1], [2, 3]]):
        assert schema_errors(paddings, bad), bad
    dims = descriptions["depth_to_space"]["inputs"]["dims"]["schema"]
    assert schema_errors(dims, {"H": "y", "W": "x"}) == [] and schema_errors(dims, None) == []
    for bad in ({"Q": "y"}, {"H": 1}, ["H"]):
        assert schema_errors(dims, bad), bad
    policy = descriptions["ascend_dequant"]["inputs"]["policy"]["schema"]
    assert schema_errors(policy, None) == [] and schema_errors(policy, "per_group") == []
    assert schema_errors(policy, "per_row")


def test_the_process_list_landing_page_and_conformance_are_valid_against_the_standards_schemas(client):
    assert ogc_errors(client.get("/processes").json(), "processList.yaml") == []
    assert ogc_errors(client.get("/").json(), "landingPage.yaml") == []
    assert ogc_errors(client.get("/conformance").json(), "confClasses.yaml") == []
    assert ogc_errors({"processes": [{"id": 1}]}, "processList.yaml")  # the check can fail


def test_the_process_list_honours_limit_and_leads_on_with_next_links(client):
    # /req/core/pl-limit-response (and /rec/core/next-1..3): no more than limit summaries, and a
    # next link while more remain, whose pages together list every process once, in order
    processes = [*registry.OPERATORS, "echo"]  # the operators, and the echo process last
    for limit in (1, 2, 3, len(processes), 10000):
        url, seen = f"/processes?limit={limit}", []
        while url is not None:
            page = client.get(url)
            assert page.status_code == 200, page.text
            body = page.json()
            assert ogc_errors(body, "processList.yaml") == []
            assert 1 <= len(body["processes"]) <= limit
            seen += [summary["id"] for summary in body["processes"]]
            nexts = [link["href"] for link in body["links"] if link["rel"] == "next"]
            assert len(nexts) <= 1
            url = nexts[0] if nexts else None
        assert seen == processes, limit
    first = client.get("/processes?limit=1").json()
    assert [s["id"] for s in first["processes"]] == ["depth_to_space"]
    assert {link["rel"] for link in first["links"]} == {"self", "next"}
    # without limit: the default (the requirement's 10), which holds every process here
    assert [s["id"] for s in client.get("/processes").json()["processes"]] == processes


@pytest.mark.parametrize("query", ["limit=0", "limit=10001", "limit=x", "limit=1.5", "offset=-1"])
def test_a_limit_out_of_its_definition_is_a_400(client, query):
    response = client.get(f"/processes?{query}")
    assert response.status_code == 400, response.text
    assert query.split("=")[0] in response.json()["detail"]
