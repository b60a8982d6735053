"""``/processes``: the operators as OGC processes, and their execution."""

from __future__ import annotations

import asyncio
import base64
import json
import math
import uuid

import numpy as np
from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from ops import registry
from schemas.service import (
    ARRAY_NAME_PATTERN,
    NPY_MEDIA_TYPE,
    ExecuteRequest,
    ProcessDescription,
    ProcessList,
    StatusInfo,
)
from service.api import descriptions, echo
from service.api.routers import ProcessID, dtype_header, npy_bytes, problems
from service.api.routers.jobs import raw_reference, result_document, status_info
from service.api.state import Services, base_url, is_json, require_token, services
from service.errors import NO_SUCH_PROCESS, ServiceError, bad_request, too_large
from service.jobs.callbacks import check_subscriber
from service.jobs.execution import RETRY_AFTER_SECONDS, TOO_MANY_JOBS

router = APIRouter(tags=["processes"], dependencies=[Depends(require_token)])


def _operator(process_id: str) -> registry.Operator:
    op = registry.OPERATORS.get(process_id)
    if op is None:
        raise ServiceError(404, NO_SUCH_PROCESS, f"no process {process_id!r}; the processes are "
                           f"{', '.join([*registry.OPERATORS, echo.PROCESS_ID])}")
    return op


# /req/core/pl-limit-definition: the limit parameter as the standard words it (its default,
# minimum and maximum are the requirement's own), and the offset that a next link sets.
LIMIT_PARAMETER = {"name": "limit", "in": "query", "required": False, "style": "form", "explode": False,
                   "description": "at most this many process summaries (a next link leads on)",
                   "schema": {"type": "integer", "minimum": 1, "maximum": 10000, "default": 10}}
OFFSET_PARAMETER = {"name": "offset", "in": "query", "required": False, "style": "form", "explode": False,
                    "description": "skip this many process summaries first (as a next link does)",
                    "schema": {"type": "integer", "minimum": 0, "default": 0}}
_LIMIT = LIMIT_PARAMETER["schema"]


@router.get("/processes", operation_id="getProcesses", response_model=ProcessList,
            response_model_exclude_none=True, responses=problems(400, 401),
            openapi_extra={"parameters": [LIMIT_PARAMETER, OFFSET_PARAMETER]})
def list_processes(request: Request,
                   # validated here, documented above (FastAPI cannot say style and explode)
                   limit: int = Query(_LIMIT["default"], ge=_LIMIT["minimum"], le=_LIMIT["maximum"],
                                      include_in_schema=False),
                   offset: int = Query(0, ge=0, include_in_schema=False)) -> dict:
    """One summary per operator, and the echo process's last, ``limit`` of them from
    ``offset`` on, with a ``next`` link while more remain (and ``prev`` after the first page)."""
    base = base_url(request)
    summaries = [descriptions.summary(op, base) for op in registry.OPERATORS.values()] + [echo.summary(base)]
    page = summaries[offset:offset + limit]
    paged = "limit" in request.query_params or "offset" in request.query_params

    def link(rel: str, start: int, title: str | None = None) -> dict:
        href = f"{base}/processes?limit={limit}&offset={start}" if rel != "self" or paged else f"{base}/processes"
        return {"href": href, "rel": rel, "type": "application/json", **({"title": title} if title else {})}

    links = [link("self", offset)]
    if offset + limit < len(summaries):
        links.append(link("next", offset + limit, "the next processes"))
    if offset > 0:
        links.append(link("prev", max(0, offset - limit), "the previous processes"))
    return {"processes": page, "links": links}


@router.get("/processes/{process_id}", operation_id="getProcessDescription", response_model=ProcessDescription,
            response_model_by_alias=True, response_model_exclude_none=True, responses=problems(401, 404))
def describe_process(process_id: ProcessID, request: Request) -> dict:
    """The operator's inputs (arrays, then keyword parameters with their JSON Schema) and output."""
    return descriptions.description(_operator(process_id), base_url(request))


def _inline(array: np.ndarray) -> dict:
    return {"value": base64.b64encode(npy_bytes(array)).decode("ascii"), "encoding": "base64",
            "mediaType": NPY_MEDIA_TYPE}


def _ints(*shape: int, dtype=np.int32) -> np.ndarray:
    return np.arange(math.prod(shape), dtype=dtype).reshape(shape)


# One small request per operator, inline in and out, for the document's examples (and so for
# /docs, and for the fuzzing tests' first cases, which run them and check the answers).
_EXAMPLE_INPUTS = {
    "depth_to_space": {"x": _inline(_ints(1, 2, 2, 4, dtype=np.float32)), "block_size": 2},
    "space_to_depth": {"x": _inline(_ints(1, 4, 4, 1, dtype=np.float32)), "block_size": 2},
    "space_to_batch": {"x": _inline(_ints(1, 2, 2, 1)), "block_size": 2, "paddings": [[0, 0], [0, 0]]},
    "space_to_batch_nd": {"x": _inline(_ints(1, 5, 2)), "block_shape": [4], "paddings": [[2, 1]]},
    "batch_to_space_nd": {"x": _inline(_ints(8, 3, 1)), "block_shape": [4], "crops": [[3, 4]]},
    "gather_nd": {"params": _inline(_ints(3, 4)), "indices": _inline(np.array([[0, 1], [2, -1]]))},
    "ascend_dequant": {"src": _inline(_ints(2, 8) - 8), "deq_scale": 0.5, "dst_dtype": "float32"},
}


def _example(op: registry.Operator) -> dict:
    return {"summary": f"{op.name} of a small inline array, the result inline in a results document",
            "value": {"inputs": _EXAMPLE_INPUTS[op.name],
                      "outputs": {"result": {"transmissionMode": "value"}}, "response": "document"}}


def _inputs_schema(op: registry.Operator) -> dict:
    """``op``'s ``inputs``, from its process description (and so the same ``schemas`` models)."""
    inputs = descriptions.description(op, "")["inputs"]
    return {"title": f"{op.name} inputs", "type": "object",
            "properties": {name: spec["schema"] for name, spec in inputs.items()},
            "required": [name for name, spec in inputs.items() if spec["minOccurs"]],
            "additionalProperties": False}


def _execute_body(op: registry.Operator | None) -> dict:
    """The OpenAPI request body of ``op``'s execution, or (``None``) of the templated path's,
    whose ``inputs`` are those of one of the operators: the one named in the path."""
    schema = ExecuteRequest.model_json_schema()
    schema = descriptions.inline_refs({k: v for k, v in schema.items() if k != "$defs"}, schema.get("$defs", {}))
    if op is None:
        schema["properties"]["inputs"] = {
            "anyOf": [_inputs_schema(op) for op in registry.OPERATORS.values()],
            "description": "array inputs and keyword parameters of the process in the path (its own execution "
                           "operation, POST /processes/NAME/execution, says which)"}
    else:
        schema["properties"]["inputs"] = {**_inputs_schema(op), "description": "array inputs and keyword parameters"}
    schema["required"] = ["inputs"]
    # One output, "result" (anything else is a 400), as NPY.
    schema["properties"]["outputs"] = {
        "anyOf": [{"type": "object", "additionalProperties": False, "properties": {"result": {
            "type": "object",
            "properties": {
                "format": {"anyOf": [{"type": "object", "properties": {"mediaType": {
                    "anyOf": [{"type": "string", "enum": [NPY_MEDIA_TYPE]}, {"type": "null"}]}}}, {"type": "null"}]},
                "transmissionMode": {"type": "string", "enum": ["value", "reference"], "default": "value"},
                "name": {"anyOf": [{"type": "string", "pattern": ARRAY_NAME_PATTERN, "maxLength": 128},
                                   {"type": "null"}],
                         "description": "the name of the stored result array (default: the job id)"},
            }}}}, {"type": "null"}],
        "description": "the wanted output, result: inline (value) or stored (reference)"}
    examples = [op] if op is not None else registry.OPERATORS.values()
    return {"requestBody": {"required": True, "content": {"application/json": {
        "schema": schema, "examples": {example.name: _example(example) for example in examples}}}},
            "callbacks": CALLBACKS}


# The requests a job's subscriber receives (OGC API - Processes 1.0, class callback; its example
# names the one to successUri jobCompleted): POSTs of application/json, answered with any 2xx.
CALLBACKS = {
    name: {f"{{$request.body#/subscriber/{uri}}}": {"post": {
        "summary": summary,
        "requestBody": {"required": True, "content": {"application/json": {
            "schema": {"$ref": f"#/components/schemas/{document}"}}}},
        "responses": {"200": {"description": "received (any 2xx; a 5xx or no answer is tried again later)"}}}}}
    for name, uri, document, summary in (
        ("jobCompleted", "successUri", "Results", "the results document, once the job is successful"),
        ("jobFailed", "failedUri", "StatusInfo", "the job's status, once it failed or was dismissed"),
        ("jobInProgress", "inProgressUri", "StatusInfo",
         "the job's status as its status or progress changes (at most one per callback_progress_interval)"))
}


async def _read_request(request: Request, limit: int) -> ExecuteRequest:
    """The JSON body, read with a size limit (base64 inline arrays may be large)."""
    media = request.headers.get("content-type")
    if not is_json(media):  # require_json refuses it first; this keeps the reader honest on its own
        raise ServiceError(415, "https://chunked-tensor-ops.readthedocs.io/exceptions/unsupported-media-type",
                           f"the execute request must be application/json, got {media!r}")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large(f"the request body is {declared} bytes, over the {limit}-byte limit; "
                        "upload large arrays with PUT /arrays/NAME and pass their href")
    body = bytearray()
    async for piece in request.stream():
        body += piece
        if len(body) > limit:
            raise too_large(f"the request body is over the {limit}-byte limit; "
                            "upload large arrays with PUT /arrays/NAME and pass their href")
    try:
        document = json.loads(body)
    except (ValueError, RecursionError) as error:
        raise bad_request(f"the request body is not valid JSON: {error}") from None
    try:
        return ExecuteRequest.model_validate(document)
    except ValidationError as error:
        first = error.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"])
        raise bad_request(f"execute request: {where}: {first['msg']}") from None


_EXECUTE_RESPONSES = {
    200: {"description": "Sync result: the NPY (response raw, transmission value) or a results document "
                         "(response document)",
          "content": {NPY_MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}},
                      "application/json": {"schema": {"$ref": "#/components/schemas/Results"}}},
          "headers": {"X-Array-Dtype": {"description": "bfloat16 or complex32 when the NPY holds those types' "
                                                       "raw bits", "schema": {"type": "string"}},
                      "Link": {"description": "the job this execution created (rel monitor), and the stored "
                                              "result (rel related, transmission reference)",
                               "schema": {"type": "string"}}}},
    204: {"description": "Sync result of response raw with transmission reference: no content, a Link header to "
                         "the stored result (rel related, title result) and to the job (rel monitor)",
          "headers": {"Link": {"description": "the stored result and the job", "schema": {"type": "string"}}}},
    201: {"model": StatusInfo, "description": "Job created (Prefer: respond-async)",
          "headers": {"Location": {"description": "the job's URL", "schema": {"type": "string"}},
                      "Preference-Applied": {"description": "respond-async", "schema": {"type": "string"}}},
          "links": {name: {"operationId": target, "parameters": {"job_id": "$response.body#/jobID"},
                           "description": description}
                    for name, target, description in (("status", "getStatus", "the job's status"),
                                                      ("results", "getResult", "its results"),
                                                      ("dismiss", "dismiss", "dismiss it"))}},
    **problems(400, 401, 404, 409, 413, 415, 503, 507,
               _400="Bad inputs, parameters or shapes: the message ops raises for the same call",
               _404="No such process (the templated path), or no array behind an input's href",
               _409="The result name exists, or names an input; or the execution was dismissed while it ran",
               _503="The Dask cluster is unreachable; or (respond-async) max_jobs + max_queued_jobs jobs are "
                    "running or queued: submit again after Retry-After seconds",
               _413="An inline input, the request or an inline result is over the limit: upload to "
                    "/arrays and use transmission reference",
               _415="The request is not application/json"),
}
PREFER = Header(None, alias="Prefer",
                description="respond-async: run as a job (201); otherwise (or respond-sync) run to the end")


def _execute_route(op: registry.Operator) -> None:
    """``POST /processes/{op}/execution``, one operation per operator in the OpenAPI document
    besides the templated path of OGC API - Processes: the request body's ``inputs`` depend on
    the process, which the templated path's schema cannot tie to the path."""

    async def endpoint(request: Request, svc: Services = Depends(services), prefer: str = PREFER):
        return await execute(op.name, request, svc, prefer)

    router.add_api_route(
        f"/processes/{op.name}/execution", endpoint, methods=["POST"], status_code=200,
        openapi_extra=_execute_body(op), responses=_EXECUTE_RESPONSES, operation_id=f"execute_{op.name}",
        summary=f"Execute {op.name}",
        description=f"Run {op.name}: synchronously, or as a job with ``Prefer: respond-async``.")


for _op in registry.OPERATORS.values():
    _execute_route(_op)


@router.post("/processes/{process_id}/execution", operation_id="execute", status_code=200,
             openapi_extra=_execute_body(None), responses=_EXECUTE_RESPONSES)
async def execute(process_id: ProcessID, request: Request, svc: Services = Depends(services),
                  prefer: str = PREFER):
    """Run the operator: synchronously, or as a job with ``Prefer: respond-async``. (The
    operators' own routes above match first; they are documented with their own inputs.)"""
    _operator(process_id)
    body = await _read_request(request, 2 * svc.settings.max_inline_bytes + 2**20)
    asynchronous = "respond-async" in (prefer or "").lower()
    if body.subscriber is not None:  # before anything is planned, let alone recorded
        await _check_subscriber(body, svc, asynchronous)
    job_id = uuid.uuid4().hex
    base = base_url(request)
    plan = await run_in_threadpool(svc.executor.plan, process_id, body, job_id, base)
    if asynchronous:
        subscriber = body.subscriber.model_dump_json(exclude_none=True) if body.subscriber else None
        await run_in_threadpool(svc.executor.submit, plan, subscriber=subscriber, base_url=base)
        job = await run_in_threadpool(svc.records.get, job_id)
        return JSONResponse(status_info(job, base), status_code=201,
                            headers={"Location": f"{base}/jobs/{job_id}", "Preference-Applied": "respond-async"})
    value = await _run_sync(request, svc, plan)
    # /req/core/job-results-success-sync: the job this execution created, as rel=monitor
    monitor = f'<{base}/jobs/{job_id}>; rel="monitor"'
    if value is None:  # stored: a link
        if plan.response == "raw":  # /req/core/process-execute-sync-raw-ref: 204, the output as a Link
            return raw_reference(plan.result_name, base, monitor)
        link = {"href": f"/arrays/{plan.result_name}", "type": NPY_MEDIA_TYPE}
        return JSONResponse({"result": link},
                            headers={"Link": f'</arrays/{plan.result_name}>; rel="related", {monitor}'})
    headers = {**dtype_header(value.dtype), "Link": monitor}
    if plan.response == "document":
        return JSONResponse(result_document(value), headers=headers)
    content = await run_in_threadpool(npy_bytes, value)
    return Response(content, media_type=NPY_MEDIA_TYPE, headers=headers)


async def _check_subscriber(body: ExecuteRequest, svc: Services, asynchronous: bool) -> None:
    """A subscriber's URIs must be allowed (``service.jobs.callbacks.check_subscriber``), for
    a job (a synchronous execution answers with its result itself), with room for its
    deliveries."""
    if not asynchronous:
        raise bad_request("execute request: subscriber: callbacks are sent for jobs; ask for one with "
                          "Prefer: respond-async (a synchronous execution answers with its result itself)")
    if svc.callbacks is None:  # services wired without deliveries: as an empty allow-list
        raise bad_request("execute request: subscriber: this service sends no callbacks")
    await run_in_threadpool(check_subscriber, body.subscriber, svc.callbacks.allow)
    if not svc.callbacks.has_room():
        raise ServiceError(503, TOO_MANY_JOBS, f"{svc.callbacks.max_pending} jobs' callbacks are waiting to be "
                           "delivered, as many as this service keeps (callback_max_pending, "
                           "CHUNKED_TENSOR_OPS_CALLBACK_MAX_PENDING); submit it again later",
                           headers={"Retry-After": str(RETRY_AFTER_SECONDS)})


# How often a synchronous execution looks whether its client is still there (seconds).
DISCONNECT_POLL_SECONDS = 0.5
CLIENT_GONE = "dismissed: the client closed the connection before the result"


async def _run_sync(request: Request, svc: Services, plan):
    """``executor.run_sync``, stopped when the client goes away, or when the request is
    cancelled (as uvicorn cancels the requests still running when its graceful shutdown times
    out): the job's tasks are cancelled on the cluster rather than run for nobody."""
    work = asyncio.ensure_future(run_in_threadpool(svc.executor.run_sync, plan))
    try:
        while not work.done():
            await asyncio.wait({work}, timeout=DISCONNECT_POLL_SECONDS)
            if not work.done() and await request.is_disconnected():
                svc.executor.stop(plan.job_id, CLIENT_GONE)
                break
        return await work  # once stopped, within moments: its cleanup is done when the request ends
    except asyncio.CancelledError:
        svc.executor.stop(plan.job_id, "dismissed: the request was cancelled")
        work.add_done_callback(lambda done: done.cancelled() or done.exception())  # its end is nobody's
        raise
