"""Wire models of the service: OGC API - Processes documents, array references and infos.

These are the response and request bodies of the REST service; FastAPI publishes them in
the OpenAPI document. Field names follow OGC API - Processes - Part 1: Core 1.0.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, TypeAdapter, field_validator

OGC_CONFORMANCE = "http://www.opengis.net/spec/ogcapi-processes-1/1.0/conf/"
OGC_REL = "http://www.opengis.net/def/rel/ogc/1.0/"
OGC_EXCEPTION = "http://www.opengis.net/def/exceptions/ogcapi-processes-1/1.0/"

JobStatus = Literal["accepted", "running", "successful", "failed", "dismissed"]

# What the service takes as an array name (``service.storage.names.check_name`` enforces it): 1-128
# characters of [A-Za-z0-9._-], not starting with ".".
ARRAY_NAME_PATTERN = r"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}$"
# A job id is the hex of a random UUID (``uuid.uuid4().hex``).
JOB_ID_PATTERN = r"^[0-9a-f]{32}$"
# A key inside a stored Zarr group: "/"-separated parts of [A-Za-z0-9._-].
ZARR_KEY_PATTERN = r"^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$"
NPY_MEDIA_TYPE = "application/x-npy"


class Link(BaseModel):
    """A web link (RFC 8288) as OGC APIs write it."""

    href: str
    rel: str | None = None
    type: str | None = None
    title: str | None = None


class LandingPage(BaseModel):
    title: str
    description: str
    links: list[Link]


class Conformance(BaseModel):
    conformsTo: list[str]


class ProcessSummary(BaseModel):
    id: str
    version: str
    title: str
    description: str
    jobControlOptions: list[str]
    outputTransmission: list[str]
    links: list[Link]


class ProcessList(BaseModel):
    processes: list[ProcessSummary]
    links: list[Link]


class InputDescription(BaseModel):
    title: str
    description: str = ""
    schema_: dict[str, Any] = Field(alias="schema")
    minOccurs: int = 1
    maxOccurs: int = 1

    model_config = ConfigDict(populate_by_name=True)


class OutputDescription(BaseModel):
    title: str
    description: str = ""
    schema_: dict[str, Any] = Field(alias="schema")

    model_config = ConfigDict(populate_by_name=True)


class ProcessDescription(ProcessSummary):
    inputs: dict[str, InputDescription]
    outputs: dict[str, OutputDescription]


class Format(BaseModel):
    mediaType: str | None = None


class OutputRequest(BaseModel):
    """How the client wants the ``result`` output: inline (``value``) or stored (``reference``).

    ``name`` (an extension) names the stored result array.
    """

    format: Format | None = None
    transmissionMode: Literal["value", "reference"] = "value"
    name: str | None = Field(None, json_schema_extra={"pattern": ARRAY_NAME_PATTERN, "maxLength": 128})


# The longest callback URI taken (a URL is an address, not a payload).
MAX_URI_LENGTH = 2048


def check_callback_uri(uri: str) -> str:
    """``uri`` if it is an absolute http(s) URI with a host and no user info; else ValueError
    saying which rule it breaks, with the value."""
    try:
        parts = urlsplit(uri)
        port = parts.port  # raises on a port that is not a number in 0-65535
    except ValueError as error:
        raise ValueError(f"must be an absolute http or https URI, got {uri!r} ({error})") from None
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        raise ValueError(f"must be an absolute http or https URI with a host, got {uri!r}")
    if "@" in parts.netloc:  # http://allowed.example@elsewhere/ reads as one host and is another
        raise ValueError(f"must not carry user info (user@host), got {uri!r}")
    if port == 0:
        raise ValueError(f"must not name port 0, got {uri!r}")
    if any(c.isspace() or ord(c) < 0x20 for c in uri):
        raise ValueError(f"must not contain white space or control characters, got {uri!r}")
    return uri


CallbackUri = Annotated[str, Field(max_length=MAX_URI_LENGTH, json_schema_extra={"format": "uri"})]


class Subscriber(BaseModel):
    """Where the service sends a job's callbacks (OGC API - Processes 1.0, class callback): the
    results document to ``successUri`` when the job succeeds, its status to ``failedUri`` when
    it fails and to ``inProgressUri`` as its status and progress change. ``successUri`` is
    required, as OGC's 1.0 schema (subscriber.yaml) requires it; later drafts make every URI
    optional. Unknown members are refused: a misspelt URI would otherwise never be called."""

    model_config = ConfigDict(extra="forbid")

    successUri: CallbackUri
    inProgressUri: CallbackUri | None = None
    failedUri: CallbackUri | None = None

    @field_validator("successUri", "inProgressUri", "failedUri")
    @classmethod
    def _absolute_http(cls, value: str | None) -> str | None:
        return value if value is None else check_callback_uri(value)

    def uris(self) -> dict[str, str]:
        """The URIs given, by field name."""
        return {name: uri for name, uri in self.model_dump().items() if uri is not None}


class ExecuteRequest(BaseModel):
    """``POST /processes/{id}/execution``: inputs, the wanted outputs and the response form.

    An array input is ``{"href": "/arrays/NAME"}`` or an inline NPY ``{"value": base64,
    "encoding": "base64", "mediaType": "application/x-npy"}``; keyword parameters are plain
    JSON values.
    """

    inputs: dict[str, Any] = Field(default_factory=dict)
    outputs: dict[str, OutputRequest] | None = None
    response: Literal["raw", "document"] = "raw"
    subscriber: Subscriber | None = None


class InlineValue(BaseModel):
    """A qualified inline value: the NPY bytes of an array, base64-encoded."""

    value: str
    encoding: Literal["base64"] = "base64"
    mediaType: Literal["application/x-npy"] = NPY_MEDIA_TYPE


class InlineArray(InlineValue):
    """An array input given inline; ``dtype`` names a dtype NPY has no code for (``bfloat16``)."""

    dtype: str | None = None


class ArrayReference(BaseModel):
    """An array input by reference: ``{"href": "/arrays/NAME"}``, a stored array of this service."""

    href: str
    type: str | None = None  # a link's media type, which OGC clients may send along


class QualifiedValue(BaseModel):
    """A qualified input value, ``{"value": ..., "mediaType": "application/json"}``: a keyword
    parameter, ``dims``, or a number for a scalar array input."""

    value: Any
    mediaType: Literal["application/json"] | None = None


def _array_input_kind(value) -> str | None:
    if isinstance(value, dict):
        if "href" in value:
            return "reference"
        if "value" in value:
            return "inline" if isinstance(value["value"], str) else "qualified"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return "number"
    return None


ARRAY_INPUT_FORMS = (f'{{"href": "/arrays/NAME"}} or an inline NPY {{"value": base64, "encoding": "base64", '
                     f'"mediaType": "{NPY_MEDIA_TYPE}"}}')

# An array input of an execute request; which form it is follows from its keys, so a malformed
# input is reported against the form it meant.
ArrayInput = TypeAdapter(Annotated[
    Annotated[ArrayReference, Tag("reference")]
    | Annotated[InlineArray, Tag("inline")]
    | Annotated[QualifiedValue, Tag("qualified")]
    | Annotated[float, Tag("number")],
    Discriminator(_array_input_kind, custom_error_type="array_input",
                  custom_error_message=f"must be {ARRAY_INPUT_FORMS}"),
])


def _parameter_input_kind(value) -> str:
    return "qualified" if isinstance(value, dict) and "value" in value else "literal"


# A keyword parameter or ``dims`` of an execute request: the plain JSON value, or qualified.
ParameterInput = TypeAdapter(Annotated[
    Annotated[QualifiedValue, Tag("qualified")] | Annotated[Any, Tag("literal")],
    Discriminator(_parameter_input_kind),
])


class ResultLink(BaseModel):
    """A link to a stored result array."""

    href: str
    type: Literal["application/x-npy"] = NPY_MEDIA_TYPE


class Results(BaseModel):
    """A results document (``response: "document"``, ``GET /jobs/{jobID}/results``): the one
    output ``result``, inline or as a link."""

    result: InlineValue | ResultLink


class StatusInfo(BaseModel):
    """A job's status (OGC ``statusInfo``)."""

    jobID: str
    type: Literal["process"] = "process"
    processID: str
    status: JobStatus
    message: str | None = None
    created: str | None = None
    started: str | None = None
    finished: str | None = None
    updated: str | None = None
    progress: int | None = Field(default=None, ge=0, le=100)
    # a finished job's: when its record and stored result are deleted (a member of this
    # service's own; statusInfo.yaml allows others)
    expires: str | None = None
    links: list[Link] = Field(default_factory=list)


class JobList(BaseModel):
    jobs: list[StatusInfo]
    links: list[Link]


class ArrayInfo(BaseModel):
    """A stored array: its shape, dtype, chunks, dim names and attrs."""

    name: str
    shape: list[int]
    dtype: str
    chunks: list[int]
    dims: list[str]
    attrs: dict[str, Any] = Field(default_factory=dict)
    links: list[Link] = Field(default_factory=list)


class ArraySummary(BaseModel):
    name: str
    shape: list[int]
    dtype: str
    chunks: list[int]
    dims: list[str]
    links: list[Link] = Field(default_factory=list)


class ArrayList(BaseModel):
    arrays: list[ArraySummary]
    links: list[Link]


class ClusterHealth(BaseModel):
    scheduler: str | None = None
    workers: int = 0
    threads: int = 0
    memory_limit: int = 0
    dashboard: str | None = None
    embedded: bool = True
    error: str | None = None


class Health(BaseModel):
    status: Literal["ok", "unavailable"]
    cluster: ClusterHealth
    data_root: str


class Exception_(BaseModel):
    """An OGC API exception (RFC 7807 problem details)."""

    type: str
    title: str | None = None
    status: int | None = None
    detail: str | None = None
    instance: str | None = None
