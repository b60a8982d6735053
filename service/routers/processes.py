"""``/processes``: the operators as OGC processes, and their execution."""

from __future__ import annotations

import json
import uuid

from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from ops import registry
from schemas.service import ExecuteRequest, ProcessDescription, ProcessList, StatusInfo
from service import descriptions
from service.errors import NO_SUCH_PROCESS, ServiceError, bad_request, too_large
from service.execution import NPY_MEDIA_TYPE, dtype_header, npy_bytes
from service.routers import problems
from service.routers.jobs import result_document, status_info
from service.state import Services, base_url, require_token, services

router = APIRouter(tags=["processes"], dependencies=[Depends(require_token)])


def _operator(process_id: str) -> registry.Operator:
    op = registry.OPERATORS.get(process_id)
    if op is None:
        raise ServiceError(404, NO_SUCH_PROCESS, f"no process {process_id!r}; the processes are "
                           f"{', '.join(registry.OPERATORS)}")
    return op


@router.get("/processes", response_model=ProcessList, response_model_exclude_none=True, responses=problems(401))
def list_processes(request: Request) -> dict:
    """One summary per operator."""
    base = base_url(request)
    return {"processes": [descriptions.summary(op, base) for op in registry.OPERATORS.values()],
            "links": [{"href": f"{base}/processes", "rel": "self", "type": "application/json"}]}


@router.get("/processes/{process_id}", response_model=ProcessDescription, response_model_by_alias=True,
            response_model_exclude_none=True, responses=problems(401, 404))
def describe_process(process_id: str, request: Request) -> dict:
    """The operator's inputs (arrays, then keyword parameters with their JSON Schema) and output."""
    return descriptions.description(_operator(process_id), base_url(request))


def _execute_body() -> dict:
    """The execute request's OpenAPI schema, its ``inputs`` one variant per operator, built
    from the same process descriptions (and so the same ``schemas`` models)."""
    schema = ExecuteRequest.model_json_schema()
    schema = descriptions.inline_refs({k: v for k, v in schema.items() if k != "$defs"}, schema.get("$defs", {}))
    variants = []
    for op in registry.OPERATORS.values():
        inputs = descriptions.description(op, "")["inputs"]
        variants.append({"title": f"{op.name} inputs", "type": "object",
                         "properties": {name: spec["schema"] for name, spec in inputs.items()},
                         "required": [name for name, spec in inputs.items() if spec["minOccurs"]],
                         "additionalProperties": False})
    schema["properties"]["inputs"] = {"anyOf": variants, "description": "array inputs and keyword parameters"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


_EXECUTE_BODY = _execute_body()


async def _read_request(request: Request, limit: int) -> ExecuteRequest:
    """The JSON body, read with a size limit (base64 inline arrays may be large)."""
    media = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
    if media != "application/json":
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


@router.post(
    "/processes/{process_id}/execution",
    openapi_extra=_EXECUTE_BODY,
    status_code=200,
    responses={
        200: {"description": "Sync result: NPY (response raw) or a results document",
              "content": {NPY_MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}},
                          "application/json": {"schema": {"type": "object"}}}},
        201: {"model": StatusInfo, "description": "Job created (Prefer: respond-async)"},
        **problems(400, 401, 404, 409, 413, 415, 503),
    },
)
async def execute(process_id: str, request: Request, svc: Services = Depends(services)):
    """Run the operator: synchronously, or as a job with ``Prefer: respond-async``."""
    _operator(process_id)
    body = await _read_request(request, 2 * svc.settings.max_inline_bytes + 2**20)
    job_id = uuid.uuid4().hex
    base = base_url(request)
    plan = await run_in_threadpool(svc.executor.plan, process_id, body, job_id, base)
    prefer = request.headers.get("prefer", "").lower()
    if "respond-async" in prefer:
        await run_in_threadpool(svc.executor.submit, plan)
        job = await run_in_threadpool(svc.records.get, job_id)
        return JSONResponse(status_info(job, base), status_code=201,
                            headers={"Location": f"{base}/jobs/{job_id}", "Preference-Applied": "respond-async"})
    value = await run_in_threadpool(svc.executor.run_sync, plan)
    if value is None:  # stored: a link
        link = {"href": f"/arrays/{plan.result_name}", "type": NPY_MEDIA_TYPE}
        body = {"result": link} if plan.response == "document" else link
        return JSONResponse(body, headers={"Link": f'</arrays/{plan.result_name}>; rel="related"'})
    if plan.response == "document":
        return JSONResponse(result_document(value), headers=dtype_header(value.dtype))
    content = await run_in_threadpool(npy_bytes, value)
    return Response(content, media_type=NPY_MEDIA_TYPE, headers=dtype_header(value.dtype))
