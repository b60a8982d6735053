"""``/healthz``: the service answers; the cluster is reachable or not (503)."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from schemas.service import Health
from service.api.state import Services, services

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health, responses={503: {"model": Health, "description": "cluster unreachable"}})
async def healthz(svc: Services = Depends(services)):
    """The cluster (scheduler, workers, threads, memory limit, dashboard) and the data root."""
    cluster = await run_in_threadpool(svc.cluster.health)
    ok = "error" not in cluster
    body = Health(status="ok" if ok else "unavailable", cluster=cluster, data_root=str(svc.store.root))
    return JSONResponse(body.model_dump(), status_code=200 if ok else 503)

