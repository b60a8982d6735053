"""``create_app(settings)``: the FastAPI application. Nothing runs at import; the data root,
job records and Dask cluster are opened in the app's lifespan."""

from __future__ import annotations

import contextlib
import logging
import os
import threading

import dask
from fastapi import Depends, FastAPI
from fastapi.concurrency import run_in_threadpool
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import JSONResponse

from ops import registry
from service import errors
from service.api.routers import arrays, health, jobs, landing, processes
from service.api.state import Services, require_token
from service.jobs.cluster import Cluster
from service.jobs.execution import Executor
from service.jobs.records import JobRecords
from service.settings import Settings
from service.storage.s3 import open_store

log = logging.getLogger(__name__)

_pool = None
_pool_lock = threading.Lock()


def local_pool():
    """The one thread pool of this process for Dask's ``scheduler="threads"`` computations
    (NPY downloads, uploads, jobs on inline inputs). Dask's default gives every calling thread
    a pool of its own (CPU count + 4 threads each, kept while the thread lives), so under load
    each of the request threads (up to 40) grew its own: the service's threads climbed with
    the load instead of staying bounded."""
    global _pool
    with _pool_lock:
        if _pool is None:
            try:
                from dask.threaded import ContextAwareThreadPoolExecutor as Pool  # carries dask.config into tasks
            except ImportError:  # older Dask
                from concurrent.futures import ThreadPoolExecutor as Pool
            _pool = Pool(min(32, (os.cpu_count() or 1) + 4))
        return _pool


def open_services(settings: Settings) -> Services:
    """Open the data root (sweeping half-built arrays), the job records (marking jobs left
    running by an earlier service as failed) and the cluster. Blocking."""
    store = open_store(settings)  # a local directory, or an s3:// URL (StorageUnavailable if unreachable)
    store.sweep()
    records = JobRecords(store.state_dir / "jobs.sqlite", retention_seconds=settings.job_retention_seconds,
                         max_records=settings.max_job_records)  # pruned now and as jobs come
    interrupted = records.mark_interrupted()
    if interrupted:
        log.warning("%d job(s) were interrupted by the last shutdown and are marked failed", interrupted)
    cluster = Cluster(settings)
    cluster.start()
    executor = Executor(store, records, cluster, max_inline_bytes=settings.max_inline_bytes,
                        max_jobs=settings.max_jobs, max_queued_jobs=settings.max_queued_jobs)
    return Services(settings, store, records, cluster, executor)


def create_app(settings: Settings | None = None) -> FastAPI:
    """The service as an ASGI app; ``settings`` default to flags-free environment settings."""
    settings = settings or Settings()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.services = await run_in_threadpool(open_services, settings)
        try:
            with dask.config.set(pool=local_pool()):
                yield
        finally:
            svc = app.state.services
            await run_in_threadpool(svc.executor.shutdown)  # cancels what runs, waits for it (seconds)
            await run_in_threadpool(svc.cluster.close)
            await run_in_threadpool(svc.records.mark_interrupted)  # jobs the shutdown cut short

    app = FastAPI(
        title="chunked-tensor-ops",
        version=registry.VERSION,
        description="OGC API - Processes for tensor rearrangement, gather and dequantisation on a Dask "
                    "cluster; stored arrays as Zarr v3 over HTTP.",
        lifespan=lifespan,
        # Served below behind the token check, like every route but / and /healthz.
        openapi_url=None, docs_url=None, redoc_url=None,
    )
    errors.install(app)
    for module in (landing, processes, jobs, arrays, health):
        app.include_router(module.router)
    _api_description_routes(app)
    if not settings.token:
        _without_security(app)
    return app


def _without_security(app: FastAPI) -> None:
    """Without a token the service asks for none, so its OpenAPI document declares none.
    (``require_token`` declares a bearer scheme on every operation that depends on it, all
    but ``/`` and ``/healthz``; with a token configured, generated clients and Swagger UI's
    "Authorize" send it.)"""
    generate = app.openapi

    def openapi() -> dict:
        document = generate()
        document.get("components", {}).pop("securitySchemes", None)
        for operations in document.get("paths", {}).values():
            for operation in operations.values():
                operation.pop("security", None)
        return document

    app.openapi = openapi


def _api_description_routes(app: FastAPI) -> None:
    """``/openapi.json`` and ``/docs`` (Swagger UI), protected by the token when one is set."""
    guarded = [Depends(require_token)]

    @app.get("/openapi.json", include_in_schema=False, dependencies=guarded)
    def openapi_document():
        return JSONResponse(app.openapi(), media_type="application/vnd.oai.openapi+json;version=3.0")

    @app.get("/docs", include_in_schema=False, dependencies=guarded)
    def swagger_ui():
        return get_swagger_ui_html(openapi_url="/openapi.json", title=f"{app.title} - API")
