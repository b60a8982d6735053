"""``/jobs``: job list, status, results and dismiss (OGC API - Processes)."""

from __future__ import annotations

import base64
import json
from email.utils import format_datetime
from typing import get_args

import numpy as np
from fastapi import APIRouter, Depends, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response

from schemas.service import NPY_MEDIA_TYPE, OGC_REL, JobList, JobStatus, Results, StatusInfo
from service.api import echo
from service.api.routers import JobID, dtype_header, jobfilters, npy_bytes, problems
from service.api.state import Services, base_url, require_token, server_paths, services
from service.errors import INVALID_PARAMETER, NO_SUCH_JOB, RESULT_NOT_READY, ServiceError, redact
from service.jobs.records import parse_stamp
from service.storage.protocol import ArrayStorage

router = APIRouter(tags=["jobs"], dependencies=[Depends(require_token)])

_STATUS_FIELDS = ("created", "started", "finished", "updated")


def status_info(job: dict, base: str, store: ArrayStorage | None = None) -> dict:
    """A job record as an OGC statusInfo document. A successful job links to its results and
    its result array while that is stored (with ``store``, it is looked up): a synchronous
    execution that returned its result inline stored none, and a result can be deleted. A
    finished job says when it ``expires`` (its record and result are deleted then;
    statusInfo.yaml allows members of one's own)."""
    message = job["message"]
    if message and store is not None:  # a failure's message may quote a worker's error
        message = redact(message, server_paths(store))
    info = {"jobID": job["id"], "type": "process", "processID": job["process_id"], "status": job["status"],
            "message": message, "progress": job["progress"]}
    info.update({k: job[k] for k in _STATUS_FIELDS if job.get(k)})
    if job.get("expires"):
        info["expires"] = job["expires"]
    links = [{"href": f"{base}/jobs/{job['id']}", "rel": "self", "type": "application/json", "title": "status"}]
    successful = job["status"] == "successful"
    kept = successful and job.get("outputs") is not None  # the echo's outputs, kept with the job
    stored = successful and not kept and job["writes"] and (store is None or store.exists(job["writes"]))
    if kept or stored:
        links.append({"href": f"{base}/jobs/{job['id']}/results", "rel": OGC_REL + "results",
                      "type": "application/json", "title": "results"})
    if stored:
        links.append({"href": f"{base}/arrays/{job['writes']}", "rel": "related", "type": NPY_MEDIA_TYPE,
                      "title": "the result array"})
    info["links"] = links
    return info


def result_document(value: np.ndarray) -> dict:
    """``{"result": qualified inline value}`` for a NumPy result."""
    return {"result": {"value": base64.b64encode(npy_bytes(value)).decode("ascii"), "encoding": "base64",
                       "mediaType": NPY_MEDIA_TYPE}}


def kept_outputs(job: dict) -> dict | None:
    """The outputs kept with a job's record (the echo process's) as its results document;
    None for a job whose result is an array."""
    outputs = job.get("outputs")
    return None if outputs is None else json.loads(outputs)


def reference_link(name: str, base: str) -> str:
    """The ``Link`` header value of a stored result: the answer of a raw response with
    transmission reference, which OGC API - Processes 1.0 gives as 204 No Content with one
    ``Link`` header per output (rel related, titled with the output's id, result)."""
    return f'<{base}/arrays/{name}>; rel="related"; type="{NPY_MEDIA_TYPE}"; title="result"'


def raw_reference(name: str, base: str, *links: str, headers: dict | None = None) -> Response:
    """204 No Content with the stored result's ``Link`` (and ``links`` besides)."""
    return Response(status_code=204, headers={"Link": ", ".join((reference_link(name, base), *links)),
                                              **(headers or {})})


def expires_header(job: dict) -> dict:
    """``Expires`` (an HTTP-date): when the job's results are deleted."""
    expires = job.get("expires")
    return {"Expires": format_datetime(parse_stamp(expires), usegmt=True)} if expires else {}


def _job(svc: Services, job_id: str) -> dict:
    job = svc.records.get(job_id)
    if job is None:
        raise ServiceError(404, NO_SUCH_JOB, f"no job {job_id!r}")
    return job


# The parameters of GET /jobs as OGC API - Processes 1.0's job-list class words them
# (/req/job-list/type-, processID-, status-, datetime-, duration- and limit-definition: each
# "schema" is the requirement's own fragment; status names the states of statusCode.yaml), and
# the offset that the next and prev links set. FastAPI cannot say style and explode: the route
# reads them itself and they are documented here.
def _parameter(name: str, description: str, schema: dict, **extra) -> dict:
    return {"name": name, "in": "query", "required": False, "description": description, "schema": schema, **extra}


_STRINGS = {"type": "array", "items": {"type": "string"}}
_INTEGERS = {"type": "array", "items": {"type": "integer"}}
JOB_LIST_PARAMETERS = [
    _parameter("type", "only jobs of these types (repeatable); every job here is a process job, type=process",
               _STRINGS),
    _parameter("processID", "only jobs of these processes (repeatable)", _STRINGS),
    _parameter("status", "only jobs in these states (repeatable)",
               {"type": "array", "items": {"type": "string", "enum": list(get_args(JobStatus))}}),
    _parameter("datetime", "only jobs created at this RFC 3339 instant or within this interval "
               "(START/END, an open end as .. or empty)",
               {"type": "string", "pattern": jobfilters.DATETIME_PATTERN}),
    _parameter("minDuration", "only jobs that ran at least this many seconds", _INTEGERS),
    _parameter("maxDuration", "only jobs that ran at most this many seconds", _INTEGERS,
               style="form", explode=False),
    _parameter("limit", "at most this many jobs (a next link leads on)",
               {"type": "integer", "minimum": 1, "maximum": 10000, "default": 10}, style="form", explode=False),
    _parameter("offset", "skip this many jobs first (as a next link does)",
               {"type": "integer", "minimum": 0, "default": 0}, style="form", explode=False),
]
_LIMIT = JOB_LIST_PARAMETERS[6]["schema"]


def _hidden(default=None, **constraints):
    return Query(default, include_in_schema=False, **constraints)


@router.get("/jobs", operation_id="getJobs", response_model=JobList, response_model_exclude_none=True,
            responses=problems(400, 401), openapi_extra={"parameters": JOB_LIST_PARAMETERS})
def list_jobs(request: Request, type: list[str] = _hidden([]), processID: list[str] = _hidden([]),
              status: list[JobStatus] = _hidden([]), datetime: str | None = _hidden(),
              minDuration: list[str] = _hidden([]), maxDuration: list[str] = _hidden([]),
              limit: int = _hidden(_LIMIT["default"], ge=_LIMIT["minimum"], le=_LIMIT["maximum"]),
              offset: int = _hidden(0, ge=0), svc: Services = Depends(services)) -> dict:
    """The jobs, newest first, filtered by ``type``, ``processID``, ``status``, ``datetime``
    (on ``created``), ``minDuration`` and ``maxDuration``: ``limit`` of them from ``offset``
    on, with a ``next`` link while more remain (and ``prev`` after the first page)."""
    base = base_url(request)
    created_from, created_to = jobfilters.created_range(datetime) if datetime else (None, None)
    shortest = jobfilters.seconds("minDuration", minDuration, max)
    longest = jobfilters.seconds("maxDuration", maxDuration, min)
    offset = min(offset, jobfilters.LARGEST_OFFSET)
    jobs = [] if type and "process" not in type else svc.records.list(
        process_id=processID, status=status, limit=limit + 1, offset=offset, created_from=created_from,
        created_to=created_to, min_duration=shortest, max_duration=longest)

    def link(rel: str, start: int, title: str) -> dict:
        href = str(request.url.include_query_params(limit=limit, offset=start))
        return {"href": href, "rel": rel, "type": "application/json", "title": title}

    links = [{"href": str(request.url) if request.url.query else f"{base}/jobs", "rel": "self",
              "type": "application/json", "title": "this document"}]
    if len(jobs) > limit:
        links.append(link("next", offset + limit, "the next jobs"))
    if offset > 0:
        links.append(link("prev", max(0, offset - limit), "the previous jobs"))
    return {"jobs": [status_info(j, base, svc.store) for j in jobs[:limit]], "links": links}


@router.get("/jobs/{job_id}", operation_id="getStatus", response_model=StatusInfo, response_model_exclude_none=True,
            responses=problems(401, 404))
def get_job(job_id: JobID, request: Request, svc: Services = Depends(services)) -> dict:
    """The job's statusInfo, with progress 0-100 from the scheduler's count of finished tasks."""
    return status_info(_job(svc, job_id), base_url(request), svc.store)


_EXPIRES = {"description": "when the job and its stored result are deleted (an HTTP-date; "
                           "job_retention_seconds after it finished)", "schema": {"type": "string"}}

# A failed job answers with its own error (its status and type, as the sync request would have).
_FAILED = "the job failed with this error"


@router.get("/jobs/{job_id}/results", operation_id="getResult", response_model=Results, responses={
    200: {"description": "The results document (response document): the result inline (transmission value) or a "
                         "link (reference); or the NPY itself (response raw, transmission value)",
          "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Results"}},
                      NPY_MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}}},
          "headers": {"X-Array-Dtype": {"description": "bfloat16 or complex32 when the inline NPY holds those "
                                                       "types' raw bits", "schema": {"type": "string"}},
                      "Expires": _EXPIRES}},
    204: {"description": "Response raw, transmission reference: no content, a Link header to the stored result",
          "headers": {"Link": {"description": "the stored result (rel related, title result)",
                               "schema": {"type": "string"}}, "Expires": _EXPIRES}},
    **problems(400, 401, 404, 409, 413, 500, 503, 507, _400=_FAILED + " (bad inputs)",
               _404="No such job; result-not-ready while it is not successful, and when its result was not "
                    "stored (a synchronous execution's) or was deleted",
               _409=_FAILED + " (its result name was taken)",
               _413=_FAILED + " (too large), or its stored result is over the inline limit",
               _500=_FAILED + " (the service itself failed, or was stopped while the job ran)",
               _503=_FAILED + " (the Dask cluster was lost)",
               _507=_FAILED + " (the data root was out of space)")})
async def get_results(job_id: JobID, request: Request, svc: Services = Depends(services)):
    """The results of a successful job in the form its execute request asked for: with
    ``response`` document a results document (a link, or the value inline); with raw the
    NPY itself (transmission value) or 204 with a ``Link`` to the stored result (reference).
    The job's error when it failed; 404 result-not-ready otherwise."""
    job = await run_in_threadpool(_job, svc, job_id)
    if job["status"] == "failed":
        status = job["error_status"] or 500
        raise ServiceError(status, job["error_type"] if status != 400 else INVALID_PARAMETER,
                           f"job {job_id} failed: {job['message']}")
    if job["status"] != "successful":
        raise ServiceError(404, RESULT_NOT_READY, f"job {job_id} is {job['status']}; it has no results")
    expires = expires_header(job)
    outputs = kept_outputs(job)
    if outputs is not None:  # the echo process's, kept with the job
        return echo.answer(outputs, job.get("response"), expires)
    name = job["writes"]
    raw = job.get("response") == "raw"  # a job recorded before responses were kept: a document
    if job["transmission"] == "reference":
        if raw:  # /req/core/job-results-async-raw-ref
            return raw_reference(name, base_url(request), headers=expires)
        return JSONResponse({"result": {"href": f"/arrays/{name}", "type": NPY_MEDIA_TYPE}}, headers=expires)
    if not await run_in_threadpool(svc.store.exists, name):
        # OGC API - Processes 1.0 has no exception type for results that are gone; of its own
        # types (a client may only know those) result-not-ready is the one that says "none here"
        raise ServiceError(404, RESULT_NOT_READY, f"job {job_id} has no stored result {name!r}: a synchronous "
                           "execution answers with its result and stores none (ask for transmissionMode "
                           "\"reference\" to keep it), and a stored result may have been deleted")
    value = await run_in_threadpool(svc.store.read_small, name, svc.settings.max_inline_bytes)
    if raw:  # /req/core/job-results-async-raw-value-one: the output itself, as a sync execution gives it
        content = await run_in_threadpool(npy_bytes, value)
        return Response(content, media_type=NPY_MEDIA_TYPE, headers={**dtype_header(value.dtype), **expires})
    return JSONResponse(result_document(value), headers={**dtype_header(value.dtype), **expires})


@router.delete("/jobs/{job_id}", operation_id="dismiss", response_model=StatusInfo,
               response_model_exclude_none=True, responses=problems(401, 404))
async def dismiss_job(job_id: JobID, request: Request, svc: Services = Depends(services)) -> dict:
    """Dismiss: cancel the job's tasks, remove its partial output; idempotent."""
    job = await run_in_threadpool(_job, svc, job_id)
    if job["status"] in ("accepted", "running"):
        await run_in_threadpool(svc.executor.dismiss, job_id)
        job = await run_in_threadpool(_job, svc, job_id)
    if job["status"] != "dismissed":  # finished before (or while) it was dismissed
        await run_in_threadpool(svc.records.update, job_id, status="dismissed", message="dismissed by the client")
    job = await run_in_threadpool(_job, svc, job_id)
    return await run_in_threadpool(status_info, job, base_url(request), svc.store)
