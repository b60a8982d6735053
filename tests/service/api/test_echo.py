"""The echo process (/req/core/test-process, /rec/core/test-process; texts vendored in
tests/ogc_schemas): its description against the standard's process.yaml, every kind of input
the standard names echoed unchanged (its results document against results.yaml), raw outputs,
jobs with a pause that can be dismissed, and the requests OGC's test suite
(ets-ogcapi-processes10) builds from the description."""

from __future__ import annotations

import base64
import email
import time
from pathlib import Path

import pytest

import yaml
from openapi_schema_validator import OAS30Validator, oas30_format_checker
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT4

from ops import registry
from tests.service.api.calls import wait_job
from tests.service.api.test_ogc_documents import BASE, SCHEMAS, ogc_errors

OGC = Path(__file__).resolve().parents[2] / "ogc_schemas" / "core"
EXECUTE = "/processes/echo/execution"
PNG = bytes(range(256))  # any bytes
EVERY_KIND = {
    "string_input": "teststring",
    "double_input": 2.5,
    "integer_input": 7,
    "boolean_input": False,
    "object_input": {"a": [1, {"b": None}], "c": "d"},
    "array_input": [1, 2.5, -3e9],
    "bbox_input": {"bbox": [51.9, 7.0, 52.0, 7.1], "crs": "http://www.opengis.net/def/crs/OGC/1.3/CRS84"},
    "binary_input": {"value": base64.b64encode(PNG).decode(), "mediaType": "image/png", "encoding": "base64"},
}


def _any_of(schema):
    if isinstance(schema, dict):
        return {("anyOf" if key == "oneOf" else key): _any_of(value) for key, value in schema.items()}
    return [_any_of(value) for value in schema] if isinstance(schema, list) else schema


# results.yaml with its oneOf read as anyOf: 1.0's inputValueNoObject.yaml lists number and
# integer (and string and binaryInputValue) in one oneOf, which an integer (a base64 string)
# matches twice, so no integer result could ever be valid; OGC's own test suite skips the
# same error ("More than 1 schema is valid", ogcapi-processes issue 350).
_RESULTS = Registry().with_resources(
    [(BASE + path.name, Resource.from_contents(_any_of(yaml.safe_load(path.read_text())), DRAFT4))
     for path in sorted(SCHEMAS.glob("*.yaml"))])


def results_errors(document) -> list[str]:
    """Why ``document`` is not a valid results document (results.yaml, oneOf as anyOf)."""
    validator = OAS30Validator({"$ref": BASE + "results.yaml"}, registry=_RESULTS, format_checker=oas30_format_checker)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message[:300]}" for e in validator.iter_errors(document)]


@pytest.mark.smoke
def test_the_echo_description_is_valid_and_names_every_kind_of_input(client):
    text = (OGC / "recommendations" / "core" / "REC_test-process.adoc").read_text()
    assert "Echo process" in text and "delay" in text  # what the recommendation asks for
    description = client.get("/processes/echo").json()
    assert ogc_errors(description, "process.yaml") == []
    schemas = {name: spec["schema"] for name, spec in description["inputs"].items()}
    assert {schemas[name]["type"] for name in EVERY_KIND} == {"string", "number", "integer", "boolean", "object",
                                                             "array"}
    assert "bbox" in schemas["bbox_input"]["properties"] and schemas["binary_input"]["format"] == "byte"
    assert schemas["pause"]["maximum"] == 10
    assert set(description["outputs"]) == set(EVERY_KIND)  # each input comes back as the output of its id
    assert "async-execute" in description["jobControlOptions"]
    listed = client.get("/processes?limit=10000").json()
    assert ogc_errors(listed, "processList.yaml") == []
    assert [summary["id"] for summary in listed["processes"]][-1] == "echo"
    assert "echo" not in registry.OPERATORS  # not an operator: the CLI and the accessor do not see it


def test_every_kind_of_input_comes_back_unchanged_in_a_results_document(client):
    answer = client.post(EXECUTE, json={"inputs": EVERY_KIND, "response": "document"})
    assert answer.status_code == 200, answer.text
    document = answer.json()
    assert results_errors(document) == []
    assert results_errors({"x": {"a": 1}}) and results_errors({"x": None})  # the check can fail (a bare object)
    assert document.pop("object_input") == {"value": EVERY_KIND["object_input"], "mediaType": "application/json"}
    binary = document.pop("binary_input")
    assert base64.b64decode(binary["value"]) == PNG and binary["mediaType"] == "image/png"
    assert document == {name: value for name, value in EVERY_KIND.items()
                        if name not in ("object_input", "binary_input")}
    monitor = answer.links["monitor"]["url"]  # /req/core/job-results-success-sync
    assert client.get(monitor).json()["status"] == "successful"


@pytest.mark.smoke
def test_raw_outputs_are_the_values_themselves(client):
    def raw(name: str):
        answer = client.post(EXECUTE, json={"inputs": EVERY_KIND, "outputs": {name: {"transmissionMode": "value"}},
                                            "response": "raw"})
        assert answer.status_code == 200, answer.text
        return answer

    text = raw("string_input")
    assert text.headers["content-type"] == "text/plain; charset=utf-8" and text.text == "teststring"
    binary = raw("binary_input")
    assert binary.headers["content-type"] == "image/png" and binary.content == PNG
    alone = EVERY_KIND["binary_input"]["value"]  # the base64 string alone (binaryInputValue.yaml)
    bare = client.post(EXECUTE, json={"inputs": {"string_input": "x", "binary_input": alone},
                                      "outputs": {"binary_input": {}}, "response": "raw"})
    assert bare.headers["content-type"] == "application/octet-stream" and bare.content == PNG
    assert raw("object_input").json() == EVERY_KIND["object_input"]
    assert raw("bbox_input").json() == EVERY_KIND["bbox_input"]
    # several: multipart/related, a part per output, its id as Content-ID
    several = client.post(EXECUTE, json={"inputs": EVERY_KIND, "response": "raw"})
    assert several.headers["content-type"].startswith("multipart/related")
    message = email.message_from_bytes(b"Content-Type: " + several.headers["content-type"].encode() + b"\r\n\r\n"
                                       + several.content)
    parts = {part["Content-ID"].strip("<>"): part for part in message.get_payload()}
    assert set(parts) == set(EVERY_KIND)
    assert parts["binary_input"].get_payload(decode=True) == PNG
    assert parts["string_input"].get_payload(decode=True).decode() == "teststring"


def test_a_job_pauses_and_answers_its_results_in_the_form_asked_for(client):
    started = time.monotonic()
    submitted = client.post(EXECUTE, json={"inputs": {"string_input": "teststring", "pause": 1},
                                           "response": "raw"}, headers={"Prefer": "respond-async"})
    assert submitted.status_code == 201, submitted.text
    job_id = submitted.json()["jobID"]
    assert submitted.headers["location"].endswith(f"/jobs/{job_id}")
    assert client.get(f"/jobs/{job_id}").json()["status"] in ("accepted", "running")
    info = wait_job(client, job_id, timeout=20)
    assert info["status"] == "successful" and time.monotonic() - started >= 1.0
    assert ogc_errors(info, "statusInfo.yaml") == []
    results = client.get(f"/jobs/{job_id}/results")
    assert results.status_code == 200 and results.text == "teststring"
    assert results.headers["expires"].endswith(" GMT")


def test_a_paused_job_can_be_dismissed(client):
    submitted = client.post(EXECUTE, json={"inputs": {"string_input": "x", "pause": 10}},
                            headers={"Prefer": "respond-async"})
    job_id = submitted.json()["jobID"]
    dismissed = client.delete(f"/jobs/{job_id}")
    assert dismissed.status_code == 200 and dismissed.json()["status"] == "dismissed"
    time.sleep(0.5)  # its thread sees it within 0.1 s and ends, leaving it dismissed
    assert client.get(f"/jobs/{job_id}").json()["status"] == "dismissed"
    assert client.get(f"/jobs/{job_id}/results").status_code == 404


@pytest.mark.parametrize(("inputs", "detail"), [
    ({"double_input": 1}, "input 'string_input' is required"),
    ({"string_input": 3}, "input 'string_input' should be a valid string, got 3"),
    ({"string_input": "a", "integer_input": 1.5}, "input 'integer_input' should be a valid integer, got 1.5"),
    ({"string_input": "a", "double_input": True}, "input 'double_input' should be a finite number, got True"),
    ({"string_input": "a", "boolean_input": "yes"}, "input 'boolean_input' should be a valid boolean, got 'yes'"),
    ({"string_input": "a", "bbox_input": {"bbox": [1, 2, 3]}}, "input 'bbox_input': bbox should hold 4 or 6 numbers"),
    ({"string_input": "a", "binary_input": {"value": "%%"}}, "input 'binary_input': value should be base64"),
    ({"string_input": "a", "pause": 11}, "input 'pause' should be less than or equal to 10, got 11"),
    ({"string_input": "a", "colour": 1}, "echo has no input 'colour'"),
])
def test_a_bad_input_is_a_400_naming_it_before_any_job(client, inputs, detail):
    before = len(client.get("/jobs?processID=echo&limit=10000").json()["jobs"])
    answer = client.post(EXECUTE, json={"inputs": inputs}, headers={"Prefer": "respond-async"})
    assert answer.status_code == 400, answer.text
    assert answer.headers["content-type"] == "application/problem+json"
    assert detail in answer.json()["detail"], answer.json()
    assert len(client.get("/jobs?processID=echo&limit=10000").json()["jobs"]) == before


def test_the_requests_ogcs_test_suite_builds_are_echoed(client):
    """As Jobs.java builds them from the description: every plain string "teststring", an
    object input as {"value": ...}, a bbox with its crs, binary content with a format object;
    with one output (the first input's id), raw, sync and async."""
    inputs = {"string_input": "teststring", "object_input": {"value": "teststring"},
              "bbox_input": {"bbox": [51.9, 7, 52, 7.1], "crs": "http://www.opengis.net/def/crs/OGC/1.3/CRS84"},
              "binary_input": {"value": base64.b64encode(b"II*\x00").decode(), "format": {"encoding": "base64"}}}
    body = {"inputs": inputs, "outputs": {"string_input": {"transmissionMode": "value"}}, "response": "raw"}
    sync = client.post(EXECUTE, json=body)
    assert sync.status_code == 200 and "teststring" in sync.text
    submitted = client.post(EXECUTE, json=body, headers={"Prefer": "respond-async"})
    assert submitted.status_code == 201
    info = wait_job(client, submitted.json()["jobID"])
    results = next(link["href"] for link in info["links"] if link["rel"].endswith("/results"))
    assert "teststring" in client.get(results).text  # /req/core/job-results-async-raw-value-one
