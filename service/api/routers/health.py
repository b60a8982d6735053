"""``/healthz``: the service answers; the cluster is reachable or not (503). Open to everyone,
so it says only as much as the asker may know: where the scheduler listens (whoever reaches
it runs code on the cluster) and where the data lives only to the token's holder."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from schemas.service import ClusterHealth
from service.api.state import Services, services, token_given

router = APIRouter(tags=["health"])

#: What a service without a token tells anyone about its cluster: its size, not its address.
PUBLIC_CLUSTER = ("workers", "threads", "memory_limit", "embedded")


class HealthReport(BaseModel):
    """``status`` for everyone. With a token configured, ``cluster`` (with the scheduler's
    address and dashboard) and ``data_root`` for the token's holder only; without one, the
    cluster's size, its embedded dashboard's link if it has one, and whether it answers."""

    status: Literal["ok", "unavailable"]
    cluster: ClusterHealth | None = None
    data_root: str | None = None


def _public(cluster: dict) -> dict:
    view = {key: cluster[key] for key in PUBLIC_CLUSTER if key in cluster}
    if cluster.get("embedded"):  # an external scheduler's dashboard link names the scheduler's host
        view["dashboard"] = cluster.get("dashboard")
    if "error" in cluster:  # its detail may name the scheduler
        view["error"] = "the Dask cluster does not answer"
    return view


@router.get("/healthz", response_model=HealthReport,
            responses={503: {"model": HealthReport, "description": "cluster unreachable"}})
async def healthz(request: Request, svc: Services = Depends(services)):
    """Whether the service and its cluster answer; more for the token's holder (see the model)."""
    cluster = await run_in_threadpool(svc.cluster.health)
    ok = "error" not in cluster
    report = HealthReport(status="ok" if ok else "unavailable")
    if token_given(request):
        report.cluster, report.data_root = ClusterHealth(**cluster), str(svc.store.root)
    elif not svc.settings.token:
        report.cluster = ClusterHealth(**_public(cluster))
    return JSONResponse(report.model_dump(exclude_none=True), status_code=200 if ok else 503)
