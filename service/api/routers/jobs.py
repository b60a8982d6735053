"""``/jobs``: job list, status, results and dismiss (OGC API - Processes)."""

from __future__ import annotations

import base64
from typing import Literal

import numpy as np
from fastapi import APIRouter, Depends, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from ops import registry
from schemas.service import NPY_MEDIA_TYPE, OGC_REL, JobList, JobStatus, Results, StatusInfo
from service.api.routers import JobID, dtype_header, npy_bytes, problems
from service.api.state import Services, base_url, require_token, server_paths, services
from service.errors import INVALID_PARAMETER, NO_SUCH_JOB, RESULT_NOT_READY, ServiceError, redact
from service.storage.protocol import ArrayStorage

router = APIRouter(tags=["jobs"], dependencies=[Depends(require_token)])

_STATUS_FIELDS = ("created", "started", "finished", "updated")


def status_info(job: dict, base: str, store: ArrayStorage | None = None) -> dict:
    """A job record as an OGC statusInfo document. A successful job links to its results and
    its result array while that is stored (with ``store``, it is looked up): a synchronous
    execution that returned its result inline stored none, and a result can be deleted."""
    message = job["message"]
    if message and store is not None:  # a failure's message may quote a worker's error
        message = redact(message, server_paths(store))
    info = {"jobID": job["id"], "type": "process", "processID": job["process_id"], "status": job["status"],
            "message": message, "progress": job["progress"]}
    info.update({k: job[k] for k in _STATUS_FIELDS if job.get(k)})
    links = [{"href": f"{base}/jobs/{job['id']}", "rel": "self", "type": "application/json", "title": "status"}]
    if job["status"] == "successful" and (store is None or store.exists(job["writes"])):
        links.append({"href": f"{base}/jobs/{job['id']}/results", "rel": OGC_REL + "results",
                      "type": "application/json", "title": "results"})
        links.append({"href": f"{base}/arrays/{job['writes']}", "rel": "related", "type": NPY_MEDIA_TYPE,
                      "title": "the result array"})
    info["links"] = links
    return info


def result_document(value: np.ndarray) -> dict:
    """``{"result": qualified inline value}`` for a NumPy result."""
    return {"result": {"value": base64.b64encode(npy_bytes(value)).decode("ascii"), "encoding": "base64",
                       "mediaType": NPY_MEDIA_TYPE}}


def _job(svc: Services, job_id: str) -> dict:
    job = svc.records.get(job_id)
    if job is None:
        raise ServiceError(404, NO_SUCH_JOB, f"no job {job_id!r}")
    return job


ProcessName = Literal[tuple(registry.OPERATORS)]


@router.get("/jobs", response_model=JobList, response_model_exclude_none=True, responses=problems(400, 401))
def list_jobs(request: Request,
              processID: list[ProcessName] = Query([], description="only jobs of these processes (repeatable)"),
              status: list[JobStatus] = Query([], description="only jobs in these states (repeatable)"),
              limit: int = Query(100, ge=1, le=10000), svc: Services = Depends(services)) -> dict:
    """Every job, newest first; filter by ``processID``, ``status`` and ``limit``."""
    base = base_url(request)
    jobs = []
    for process in dict.fromkeys(processID) or [None]:  # a process named twice lists its jobs once
        jobs += svc.records.list(process_id=process, status=status, limit=limit)
    jobs.sort(key=lambda j: j["created"], reverse=True)
    return {"jobs": [status_info(j, base, svc.store) for j in jobs[:limit]],
            "links": [{"href": f"{base}/jobs", "rel": "self", "type": "application/json"}]}


@router.get("/jobs/{job_id}", operation_id="get_job", response_model=StatusInfo, response_model_exclude_none=True,
            responses=problems(401, 404))
def get_job(job_id: JobID, request: Request, svc: Services = Depends(services)) -> dict:
    """The job's statusInfo, with progress 0-100 from the scheduler's count of finished tasks."""
    return status_info(_job(svc, job_id), base_url(request), svc.store)


# A failed job answers with its own error (its status and type, as the sync request would have).
_FAILED = "the job failed with this error"


@router.get("/jobs/{job_id}/results", operation_id="get_job_results", response_model=Results, responses={
    200: {"description": "The results document: the result inline (transmission value) or a link (reference)",
          "headers": {"X-Array-Dtype": {"description": "bfloat16 or complex32 when the inline NPY holds those "
                                                       "types' raw bits", "schema": {"type": "string"}}}},
    **problems(400, 401, 404, 409, 413, 500, 503, 507, _400=_FAILED + " (bad inputs)",
               _404="No such job; result-not-ready while it is not successful, and when its result was not "
                    "stored (a synchronous execution's) or was deleted",
               _409=_FAILED + " (its result name was taken)",
               _413=_FAILED + " (too large), or its stored result is over the inline limit",
               _500=_FAILED + " (the service itself failed, or was stopped while the job ran)",
               _503=_FAILED + " (the Dask cluster was lost)",
               _507=_FAILED + " (the data root was out of space)")})
async def get_results(job_id: JobID, svc: Services = Depends(services)):
    """The results document of a successful job (a link, or the value inline); the job's
    error when it failed; 404 result-not-ready otherwise."""
    job = await run_in_threadpool(_job, svc, job_id)
    if job["status"] == "failed":
        status = job["error_status"] or 500
        raise ServiceError(status, job["error_type"] if status != 400 else INVALID_PARAMETER,
                           f"job {job_id} failed: {job['message']}")
    if job["status"] != "successful":
        raise ServiceError(404, RESULT_NOT_READY, f"job {job_id} is {job['status']}; it has no results")
    name = job["writes"]
    if job["transmission"] == "reference":
        return {"result": {"href": f"/arrays/{name}", "type": NPY_MEDIA_TYPE}}
    if not await run_in_threadpool(svc.store.exists, name):
        # OGC API - Processes 1.0 has no exception type for results that are gone; of its own
        # types (a client may only know those) result-not-ready is the one that says "none here"
        raise ServiceError(404, RESULT_NOT_READY, f"job {job_id} has no stored result {name!r}: a synchronous "
                           "execution answers with its result and stores none (ask for transmissionMode "
                           "\"reference\" to keep it), and a stored result may have been deleted")
    value = await run_in_threadpool(svc.store.read_small, name, svc.settings.max_inline_bytes)
    return JSONResponse(result_document(value), headers=dtype_header(value.dtype))


@router.delete("/jobs/{job_id}", operation_id="dismiss_job", response_model=StatusInfo,
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
