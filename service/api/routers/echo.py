"""``/processes/echo``: the echo process's description and execution (``service.api.echo``),
routed before the operators' templated paths. Its summary is listed with theirs; its jobs are
the service's jobs (``/jobs``), its outputs kept with the job's record."""

from __future__ import annotations

import asyncio
import uuid

from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from schemas.service import ExecuteRequest, ProcessDescription
from service.api import echo
from service.api.descriptions import inline_refs
from service.api.routers import problems
from service.api.routers.jobs import status_info
from service.api.routers.processes import _EXECUTE_RESPONSES, CALLBACKS, PREFER, _check_subscriber, _read_request
from service.api.state import Services, base_url, require_json, require_token, services

router = APIRouter(tags=["processes"], dependencies=[Depends(require_token)])

_PATH = f"/processes/{echo.PROCESS_ID}"


@router.get(_PATH, response_model=ProcessDescription, response_model_by_alias=True, response_model_exclude_none=True,
            include_in_schema=False)  # documented by GET /processes/{process_id}
def describe_echo(request: Request) -> dict:
    return echo.description(base_url(request))


def _body() -> dict:
    schema = ExecuteRequest.model_json_schema()
    properties = {"inputs": {**echo.inputs_schema(), "description": "the values to echo, and pause"},
                  "outputs": {"type": "object", "description": "the outputs wanted (default: one per input given; "
                                                               "each names an input the request gives)",
                              "properties": {name: {"type": "object", "properties": {
                                  "transmissionMode": {"type": "string", "enum": ["value"]}}} for name in echo.INPUTS},
                              "additionalProperties": False},
                  "response": schema["properties"]["response"],
                  "subscriber": inline_refs(schema["properties"]["subscriber"], schema.get("$defs", {}))}
    example = {"inputs": {"string_input": "teststring", "integer_input": 7, "boolean_input": True,
                          "bbox_input": {"bbox": [51.9, 7.0, 52.0, 7.1]}, "pause": 0},
               "response": "document"}
    return {"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"type": "object", "required": ["inputs"], "properties": properties},
        "examples": {"echo": {"summary": "a few inputs, echoed in a results document", "value": example}}}}},
        "callbacks": CALLBACKS}


_RESPONSES = {
    200: {"description": "The outputs: a results document (response document); raw, one output as itself "
                         "(a string as text/plain, binary content in its media type, anything else as JSON) "
                         "or several as multipart/related, a part per output (Content-ID: its id)",
          "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Results"}},
                      "text/plain": {"schema": {"type": "string"}},
                      "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
                      "multipart/related": {"schema": {"type": "string", "format": "binary"}}},
          "headers": {"Link": {"description": "the job this execution created (rel monitor)",
                               "schema": {"type": "string"}}}},
    201: _EXECUTE_RESPONSES[201],
    **problems(400, 401, 415, 503, _400="An input or output that breaks the echo's description (named in the detail)",
               _503="As many echo jobs are running or queued as the service takes"),
}


@router.post(f"{_PATH}/execution", operation_id=f"execute_{echo.PROCESS_ID}", status_code=200,
             dependencies=[Depends(require_json)], openapi_extra=_body(), responses=_RESPONSES,
             summary="Execute echo",
             description="Return the inputs as outputs: synchronously, or as a job with ``Prefer: respond-async``.")
async def execute_echo(request: Request, svc: Services = Depends(services), prefer: str = PREFER):
    body = await _read_request(request, 2 * svc.settings.max_inline_bytes + 2**20)
    asynchronous = "respond-async" in (prefer or "").lower()
    if body.subscriber is not None:  # as for the operators: allowed URIs, for a job, with room
        await _check_subscriber(body, svc, asynchronous)
    plan = echo.plan(body)
    job_id = uuid.uuid4().hex
    base = base_url(request)
    if asynchronous:
        subscriber = body.subscriber.model_dump_json(exclude_none=True) if body.subscriber else None
        await run_in_threadpool(echo.JOBS.submit, svc.records, job_id, plan, subscriber=subscriber, base_url=base)
        job = await run_in_threadpool(svc.records.get, job_id)
        return JSONResponse(status_info(job, base), status_code=201,
                            headers={"Location": f"{base}/jobs/{job_id}", "Preference-Applied": "respond-async"})
    await run_in_threadpool(echo.record, svc.records, job_id, plan, "running")
    await asyncio.sleep(plan.pause)
    await run_in_threadpool(echo.finish, svc.records, job_id, plan)
    # /req/core/job-results-success-sync: the job this execution created
    return echo.answer(plan.outputs, plan.response, {"Link": f'<{base}/jobs/{job_id}>; rel="monitor"'})

