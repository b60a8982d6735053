"""``/`` and ``/conformance``."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request

from schemas.service import OGC_CONFORMANCE, OGC_REL, Conformance, LandingPage
from service.api.routers import problems
from service.api.state import base_url, require_token

router = APIRouter(tags=["landing"])

CONFORMANCE = [OGC_CONFORMANCE + c for c in ("core", "json", "oas30", "job-list", "dismiss",
                                              "ogc-process-description", "callback")]


@router.get("/", response_model=LandingPage, response_model_exclude_none=True)
def landing(request: Request) -> dict:
    """The landing page: links to the API description, conformance, processes and jobs."""
    base = base_url(request)
    return {
        "title": "chunked-tensor-ops",
        "description": "Tensor rearrangement, gather and dequantisation operators as OGC API - Processes, "
                       "running on a Dask cluster; arrays as Zarr v3 over HTTP.",
        "links": [
            {"href": f"{base}/", "rel": "self", "type": "application/json", "title": "this document"},
            {"href": f"{base}/openapi.json", "rel": "service-desc",
             "type": "application/vnd.oai.openapi+json;version=3.0", "title": "the API definition"},
            {"href": f"{base}/docs", "rel": "service-doc", "type": "text/html", "title": "the API documentation"},
            {"href": f"{base}/conformance", "rel": OGC_REL + "conformance", "type": "application/json",
             "title": "conformance classes"},
            {"href": f"{base}/processes", "rel": OGC_REL + "processes", "type": "application/json",
             "title": "the processes (operators)"},
            {"href": f"{base}/jobs", "rel": OGC_REL + "job-list", "type": "application/json", "title": "the jobs"},
            {"href": f"{base}/arrays", "rel": "data", "type": "application/json", "title": "the stored arrays"},
        ],
    }


@router.get("/conformance", response_model=Conformance, dependencies=[Depends(require_token)],
            responses=problems(401))
def conformance() -> dict:
    """The OGC API - Processes conformance classes this service implements."""
    return {"conformsTo": CONFORMANCE}
