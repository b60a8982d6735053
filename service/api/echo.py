"""The ``echo`` process: a testable process, as OGC API - Processes 1.0 asks of a server tested
with OGC's test suite (/req/core/test-process, /rec/core/test-process). It returns every input
it is given, unchanged, as the output of the same id; ``pause`` (seconds, at most
``MAX_PAUSE_SECONDS``) makes it wait first, so that a job can be seen running.

Its inputs cover every kind of value the standard names: a string, a number (double), an
integer, a boolean, an object, an array, a bounding box and binary content (a qualified value:
base64 with its media type). It runs in the service's own threads (no Dask), and it is not an
operator: the command line and the xarray accessor do not see it.

This module holds what is the echo's own: its description, the parsing of its inputs (each
refused with a message naming the input, the rule and the value, before anything runs), its
outputs in either response form, and its jobs; ``service.api.routers.processes`` routes to it.
"""

from __future__ import annotations

import base64
import binascii
import json
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, Strict, StrictBool, StrictInt, StrictStr, TypeAdapter
from pydantic import ValidationError, field_validator

from ops import registry
from schemas.service import OGC_REL, ExecuteRequest
from service.errors import PROJECT, ServiceError, bad_request
from service.jobs.records import JobRecords

PROCESS_ID = "echo"
MAX_PAUSE_SECONDS = 10.0
MAX_STRING_CHARS = 1_000_000  # one input; the execute request's own size limit bounds them all
CRS84 = "http://www.opengis.net/def/crs/OGC/1.3/CRS84"
TOO_MANY_JOBS = PROJECT + "too-many-jobs"
RETRY_AFTER_SECONDS = 10
BASE64_PATTERN = r"^([A-Za-z0-9+/]{4})*([A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"

# --- the inputs: how each is parsed, and its OpenAPI 3.0 schema in the description ----------

Finite = Annotated[float, Strict(), Field(allow_inf_nan=False)]


class BoundingBox(BaseModel):
    """OGC's bbox.yaml: 4 or 6 numbers (lower corner, upper corner) and a CRS."""

    model_config = ConfigDict(extra="forbid")
    bbox: list[StrictInt | Finite]
    crs: StrictStr = CRS84

    @field_validator("bbox")
    @classmethod
    def _corners(cls, corners: list) -> list:
        if len(corners) not in (4, 6):
            raise ValueError(f"should hold 4 or 6 numbers, not {len(corners)}")
        return corners


class _Format(BaseModel):
    model_config = ConfigDict(extra="forbid")
    mediaType: StrictStr | None = None
    encoding: Literal["base64"] | None = None


class BinaryValue(BaseModel):
    """Binary content as a qualified value: ``value`` (base64) with ``mediaType`` (and
    ``encoding`` base64); the media type and encoding may also come in a ``format`` object,
    as OGC's test suite sends them."""

    model_config = ConfigDict(extra="forbid")
    value: Annotated[StrictStr, Field(max_length=MAX_STRING_CHARS, pattern=BASE64_PATTERN)]
    mediaType: StrictStr | None = None
    encoding: Literal["base64"] | None = None
    format: _Format | None = None

    @property
    def media_type(self) -> str:
        given = self.mediaType or (self.format.mediaType if self.format else None)
        return given or "application/octet-stream"


@dataclass(frozen=True)
class EchoInput:
    title: str
    kind: str            # how its output is written (see ``_document_value`` and ``_raw_part``)
    adapter: TypeAdapter
    schema: dict         # OpenAPI 3.0 Schema Object
    required: bool = False


_NUMBER = {"type": "number", "format": "double"}
INPUTS: dict[str, EchoInput] = {
    # first: OGC's test suite echoes its first input alone, by the output of the same id
    "string_input": EchoInput("a string", "string",
                              TypeAdapter(Annotated[StrictStr, Field(max_length=MAX_STRING_CHARS)]),
                              {"type": "string", "maxLength": MAX_STRING_CHARS}, required=True),
    "double_input": EchoInput("a number", "json", TypeAdapter(StrictInt | Finite), _NUMBER),
    "integer_input": EchoInput("an integer", "json", TypeAdapter(StrictInt), {"type": "integer"}),
    "boolean_input": EchoInput("a boolean", "json", TypeAdapter(StrictBool), {"type": "boolean"}),
    "object_input": EchoInput("an object", "object", TypeAdapter(dict[str, Any]),
                              {"type": "object", "additionalProperties": True}),
    "array_input": EchoInput("an array of numbers", "json",
                             TypeAdapter(Annotated[list[StrictInt | Finite], Field(max_length=10_000)]),
                             {"type": "array", "items": _NUMBER, "maxItems": 10_000}),
    "bbox_input": EchoInput("a bounding box", "json", TypeAdapter(BoundingBox), {
        "type": "object", "required": ["bbox"],
        "properties": {"bbox": {"type": "array", "oneOf": [{"minItems": 4, "maxItems": 4},
                                                           {"minItems": 6, "maxItems": 6}],
                                "items": {"type": "number"}},
                       "crs": {"type": "string", "format": "uri", "default": CRS84}}}),
    # a qualified value, or the base64 string alone (binaryInputValue.yaml; application/octet-stream)
    "binary_input": EchoInput("binary content (base64, with its media type)", "binary",
                              TypeAdapter(BinaryValue | Annotated[StrictStr, Field(max_length=MAX_STRING_CHARS,
                                                                                   pattern=BASE64_PATTERN)]),
                              {"type": "string", "format": "byte", "contentEncoding": "base64",
                               "contentMediaType": "application/octet-stream"}),
}
PAUSE = EchoInput(f"seconds to wait before answering (0-{MAX_PAUSE_SECONDS:g})", "json",
                  TypeAdapter(Annotated[StrictInt | Finite, Field(ge=0, le=MAX_PAUSE_SECONDS)]),
                  {"type": "number", "minimum": 0, "maximum": MAX_PAUSE_SECONDS, "default": 0})
QUALIFIED_KEYS = {"value", "mediaType", "encoding", "schema"}
# the names pydantic gives the members of a union in an error's location (not the input's parts)
_UNION_TAGS = {"int", "float", "str", "constrained-str", "BinaryValue"}

# --- the description -------------------------------------------------------------------------


def summary(base: str) -> dict:
    return {
        "id": PROCESS_ID, "version": registry.VERSION, "title": "Echo",
        "description": "Returns every input it is given as the output of the same id (a test process); "
                       f"pause waits up to {MAX_PAUSE_SECONDS:g} s first.",
        "jobControlOptions": ["sync-execute", "async-execute", "dismiss"],
        "outputTransmission": ["value"],
        "links": [{"href": f"{base}/processes/{PROCESS_ID}", "rel": "self", "type": "application/json",
                   "title": "Echo"},
                  {"href": f"{base}/processes/{PROCESS_ID}/execution", "rel": OGC_REL + "execute",
                   "type": "application/json", "title": "Execute Echo"}],
    }


def description(base: str) -> dict:
    inputs = {name: {"title": spec.title, "description": f"{spec.title}, returned as output {name}",
                     "schema": spec.schema, "minOccurs": int(spec.required), "maxOccurs": 1}
              for name, spec in INPUTS.items()}
    inputs["pause"] = {"title": "pause", "description": PAUSE.title, "schema": PAUSE.schema,
                       "minOccurs": 0, "maxOccurs": 1}
    outputs = {name: {"title": spec.title, "description": f"input {name}, as given", "schema": spec.schema}
               for name, spec in INPUTS.items()}
    return {**summary(base), "inputs": inputs, "outputs": outputs}


def inputs_schema() -> dict:
    """The execute request's ``inputs`` for the echo (its OpenAPI operation's request body)."""
    properties = {name: spec.schema for name, spec in INPUTS.items()} | {"pause": PAUSE.schema}
    return {"title": "echo inputs", "type": "object", "properties": properties,
            "required": [name for name, spec in INPUTS.items() if spec.required], "additionalProperties": False}


# --- a request, parsed -----------------------------------------------------------------------


@dataclass(frozen=True)
class EchoPlan:
    outputs: dict[str, Any]  # output id -> its value as a results document carries it
    pause: float
    response: str            # raw | document


def _parsed(name: str, spec: EchoInput, value):
    if spec.kind not in ("object", "binary") and isinstance(value, dict) and "value" in value \
            and set(value) <= QUALIFIED_KEYS:
        value = value["value"]  # a qualified value (qualifiedInputValue.yaml): its value
    try:
        return spec.adapter.validate_python(value)
    except ValidationError as error:
        first = error.errors(include_url=False)[0]
        # a number is an int or a float: pydantic names the union's member it tried first
        union = bool(first["loc"]) and first["loc"][-1] in ("int", "float")
        where = ".".join(str(part) for part in first["loc"] if part not in _UNION_TAGS)
        shown = repr(first["input"])
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        rule = first["msg"].removeprefix("Input ").removeprefix("Value error, ")
        if union:
            rule = "should be a finite number"
        elif first["type"] == "string_pattern_mismatch":
            rule = "should be base64 (RFC 4648, padded)"
        raise bad_request(f"input {name!r}{': ' + where if where else ''} {rule}, got {shown}") from None


def _document_value(spec: EchoInput, parsed) -> Any:
    """An output as results.yaml carries it: a plain value, an object as a qualified value
    (a bare object would read as one), binary content as base64 with its media type."""
    if isinstance(parsed, BoundingBox):
        return parsed.model_dump()
    if spec.kind == "object":
        return {"value": parsed, "mediaType": "application/json"}
    if spec.kind == "binary":
        if isinstance(parsed, str):
            parsed = BinaryValue(value=parsed)
        try:
            base64.b64decode(parsed.value, validate=True)
        except (binascii.Error, ValueError):
            raise bad_request("input 'binary_input': value is not valid base64") from None
        return {"value": parsed.value, "encoding": "base64", "mediaType": parsed.media_type}
    return parsed


def plan(request: ExecuteRequest) -> EchoPlan:
    """The request checked (inputs, wanted outputs); a 400 naming what is wrong otherwise."""
    unknown = sorted(set(request.inputs) - set(INPUTS) - {"pause"})
    if unknown:
        raise bad_request(f"echo has no input {unknown[0]!r}; its inputs are {', '.join([*INPUTS, 'pause'])}")
    missing = [name for name, spec in INPUTS.items() if spec.required and name not in request.inputs]
    if missing:
        raise bad_request(f"input {missing[0]!r} is required (minOccurs 1)")
    values = {name: _document_value(spec, _parsed(name, spec, request.inputs[name]))
              for name, spec in INPUTS.items() if name in request.inputs}
    pause = float(_parsed("pause", PAUSE, request.inputs["pause"])) if "pause" in request.inputs else 0.0
    wanted = list(request.outputs) if request.outputs else list(values)  # none named: every output
    for name in wanted:
        if name not in INPUTS:
            raise bad_request(f"echo has no output {name!r}; its outputs are {', '.join(INPUTS)}")
        if request.outputs and request.outputs[name].transmissionMode != "value":
            raise bad_request(f"outputs.{name}.transmissionMode must be 'value' (the echo's outputTransmission), "
                              f"got {request.outputs[name].transmissionMode!r}")
        if name not in values:
            raise bad_request(f"output {name!r} echoes input {name!r}, which the request does not give")
    return EchoPlan({name: values[name] for name in wanted}, pause, request.response)


# --- the outputs, in the response form asked for ---------------------------------------------


def _raw_part(name: str, value) -> tuple[bytes, str]:
    """One output as raw content: a string as text, binary content as itself, anything else
    as JSON (an object: the object itself)."""
    kind = INPUTS[name].kind
    if kind == "string":
        return value.encode(), "text/plain; charset=utf-8"
    if kind == "binary":
        return base64.b64decode(value["value"]), value["mediaType"]
    if kind == "object":
        value = value["value"]
    return json.dumps(value).encode(), "application/json"


def answer(outputs: dict[str, Any], response: str | None, headers: dict | None = None) -> Response:
    """The outputs as a response: a results document (``document``, and records made before
    the response was kept), or raw: one output as itself, several as multipart/related (a part
    per output, its id as Content-ID; /req/core/process-execute-sync-raw-value-multi)."""
    headers = headers or {}
    if response != "raw":
        return JSONResponse(outputs, headers=headers)
    if len(outputs) == 1:
        [(name, value)] = outputs.items()
        content, media_type = _raw_part(name, value)
        return Response(content, media_type=media_type, headers=headers)
    boundary = uuid.uuid4().hex
    body = bytearray()
    for name, value in outputs.items():
        content, media_type = _raw_part(name, value)
        body += f"--{boundary}\r\nContent-Type: {media_type}\r\nContent-ID: <{name}>\r\n\r\n".encode()
        body += content + b"\r\n"
    body += f"--{boundary}--\r\n".encode()
    return Response(bytes(body), headers={"Content-Type": f'multipart/related; boundary="{boundary}"', **headers})


# --- running ---------------------------------------------------------------------------------


def record(records: JobRecords, job_id: str, echo: EchoPlan, status: str, *, subscriber: str | None = None,
           base_url: str | None = None) -> None:
    """Record the job; ``subscriber`` (its callback URIs, JSON, checked by the caller) and
    ``base_url`` as for an operator's job: its callbacks go as theirs do."""
    records.create(job_id, PROCESS_ID, [], None, "value", status=status, response=echo.response,
                   subscriber=subscriber, base_url=base_url)


def finish(records: JobRecords, job_id: str, echo: EchoPlan) -> None:
    """The job successful with its outputs (unless it was dismissed or failed meanwhile)."""
    records.finish(job_id, "successful", "done: the inputs echoed", progress=100, outputs=json.dumps(echo.outputs))


class EchoJobs:
    """The echo's jobs, on a few threads of their own, at most ``max_waiting`` running or
    queued (past it: 503 with Retry-After, as for the operators' jobs). A pause ends early
    when its job is dismissed."""

    def __init__(self, threads: int = 4, max_waiting: int = 64):
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="echo-job")
        self._slots = threading.BoundedSemaphore(max_waiting)

    def submit(self, records: JobRecords, job_id: str, echo: EchoPlan, *, subscriber: str | None = None,
               base_url: str | None = None) -> None:
        if not self._slots.acquire(blocking=False):
            raise ServiceError(503, TOO_MANY_JOBS, "as many echo jobs are running or queued as this service "
                               "takes; submit it again later", headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
        try:
            record(records, job_id, echo, "accepted", subscriber=subscriber, base_url=base_url)
            self._pool.submit(self._run, records, job_id, echo)
        except BaseException:
            self._slots.release()
            raise

    def _run(self, records: JobRecords, job_id: str, echo: EchoPlan) -> None:
        try:
            if not records.start(job_id):  # dismissed while it waited
                return
            deadline = time.monotonic() + echo.pause
            while (left := deadline - time.monotonic()) > 0:
                time.sleep(min(left, 0.1))
                job = records.get(job_id)
                if job is None or job["status"] != "running":  # dismissed, or swept
                    return
            finish(records, job_id, echo)
        finally:
            self._slots.release()


JOBS = EchoJobs()  # one per service process, whatever the number of apps in it
