"""``create_app(settings)``: the FastAPI application. Nothing runs at import; the data root,
job records and Dask cluster are opened in the app's lifespan."""

from __future__ import annotations

import contextlib
import importlib.resources
import logging
import os
import threading
from pathlib import Path

import dask
from fastapi import Depends, FastAPI
from fastapi.concurrency import run_in_threadpool
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, JSONResponse
from starlette.middleware.cors import CORSMiddleware

from ops import registry
from service import errors
from service.api import oas30
from service.api.edge import (
    CORS_REQUEST_HEADERS,
    CORS_RESPONSE_HEADERS,
    BodyReadTimeout,
    ErrorBodyGuard,
    HeadAsGet,
    HostGuard,
    allowed_hosts,
)
from schemas.service import NPY_MEDIA_TYPE
from service.api.routers import arrays, echo, health, jobs, landing, processes
from service.api.state import Services, require_json, require_token, server_paths
from service.jobs.callbacks import AllowList, CallbackDispatcher, SubscribedRecords
from service.jobs.cluster import Cluster
from service.jobs.execution import Executor
from service.jobs.sweeper import Sweeper
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


def open_services(settings: Settings, dashboard: bool = False) -> Services:
    """Open the data root (sweeping half-built arrays), the job records (marking jobs left
    running by an earlier service as failed) and the cluster. Blocking."""
    store = open_store(settings)  # a local directory, or an s3:// URL (StorageUnavailable if unreachable)
    store.sweep()
    callbacks = callback_dispatcher(settings, store)
    # pruned now and as jobs come; the changes of jobs with a subscriber told to ``callbacks``
    records = SubscribedRecords(store.state_dir / "jobs.sqlite", callbacks,
                                retention_seconds=settings.job_retention_seconds, max_records=settings.max_job_records)
    interrupted = records.mark_interrupted()
    if interrupted:
        log.warning("%d job(s) were interrupted by the last shutdown and are marked failed", interrupted)
    cluster = Cluster(settings, dashboard=dashboard)
    cluster.start()
    executor = Executor(store, records, cluster, max_inline_bytes=settings.max_inline_bytes,
                        max_graph_blocks=settings.max_graph_blocks, max_graph_tasks=settings.max_graph_tasks,
                        max_jobs=settings.max_jobs, max_queued_jobs=settings.max_queued_jobs)
    return Services(settings, store, records, cluster, executor, callbacks)


def callback_dispatcher(settings: Settings, store) -> CallbackDispatcher:
    """The deliveries of jobs' callbacks, with the documents the job routes serve: statusInfo
    (inProgressUri, failedUri) and the results document as ``GET /jobs/{jobID}/results``
    gives it with response document (successUri)."""

    def status(job: dict) -> dict:
        return jobs.status_info(job, job.get("base_url") or "", store)

    def results(job: dict) -> dict:
        outputs = jobs.kept_outputs(job)  # the echo's (as its results route serves them)
        if outputs is not None:
            return outputs
        if job["transmission"] == "reference":
            return {"result": {"href": f"/arrays/{job['writes']}", "type": NPY_MEDIA_TYPE}}
        return jobs.result_document(store.read_small(job["writes"], settings.max_inline_bytes))

    allow = AllowList(settings.callback_allow, private_addresses=settings.callback_private_addresses)
    return CallbackDispatcher(allow, status, results, timeout=settings.callback_timeout,
                              retries=settings.callback_retries, backoff=settings.callback_backoff,
                              progress_interval=settings.callback_progress_interval,
                              max_pending=settings.callback_max_pending)


def with_token(settings: Settings) -> Settings:
    """``settings`` with the token read from ``token_file`` (its first line), if one is named.
    ValueError if it is empty or a token is given besides; OSError if it cannot be read."""
    if settings.token_file is None:
        return settings
    if settings.token:
        raise ValueError("the token is given twice: use --token-file or --token/CHUNKED_TENSOR_OPS_TOKEN, not both")
    path = Path(settings.token_file)
    lines = path.read_text().splitlines()
    token = lines[0].strip() if lines else ""
    if not token:
        raise ValueError(f"the token file {path} is empty")
    if path.stat().st_mode & 0o077:
        log.warning("the token file %s can be read by other users (chmod 600 it)", path)
    return settings.model_copy(update={"token": token})


def create_app(settings: Settings | None = None, *, dashboard: bool = False) -> FastAPI:
    """The service as an ASGI app; ``settings`` default to flags-free environment settings.
    ``dashboard``: the embedded Dask cluster's (off: it shows tasks, logs and call stacks)."""
    settings = with_token(settings or Settings())

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.services = await run_in_threadpool(open_services, settings, dashboard)
        # expired jobs and their results deleted now and every job_sweep_interval seconds
        sweeper = Sweeper(app.state.services.records, app.state.services.store, settings.job_sweep_interval).start()
        try:
            with dask.config.set(pool=local_pool()):
                yield
        finally:
            svc = app.state.services
            await run_in_threadpool(sweeper.stop)
            await run_in_threadpool(svc.executor.shutdown)  # cancels what runs, waits for it (seconds)
            await run_in_threadpool(svc.cluster.close)
            await run_in_threadpool(svc.records.mark_interrupted)  # jobs the shutdown cut short
            await run_in_threadpool(svc.callbacks.close)  # their failures told, a few seconds at most

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
    app.include_router(landing.router)
    app.include_router(echo.router)  # /processes/echo: before the operators' templated paths
    app.include_router(processes.router, dependencies=[Depends(require_json)])  # the execute requests
    for module in (jobs, arrays, health):
        app.include_router(module.router)
    _api_description_routes(app)
    if not settings.token:
        _without_security(app)
    _as_openapi_30(app)
    _guard_the_edge(app, settings)
    return app


def _server_paths(app: FastAPI, settings: Settings) -> list:
    """The directories of this server that no error body may name."""
    svc = getattr(app.state, "services", None)
    paths = [] if settings.remote else [Path(settings.data_root).absolute()]
    return paths + (server_paths(svc.store) if svc is not None else [])


def _guard_the_edge(app: FastAPI, settings: Settings) -> None:
    """The middleware every request passes first, outermost last: the Host check (before
    anything else), CORS for the configured origins only, the body read timeout, HEAD as
    GET without the content, and the server's paths out of error bodies."""
    app.add_middleware(ErrorBodyGuard, paths=lambda: _server_paths(app, settings))
    app.add_middleware(HeadAsGet, routes=lambda: app.router.routes)
    app.add_middleware(BodyReadTimeout, seconds=settings.read_timeout)
    if settings.cors_origins:
        app.add_middleware(CORSMiddleware, allow_origins=settings.cors_origins,
                           allow_methods=["GET", "HEAD", "POST", "PUT", "DELETE"],
                           allow_headers=CORS_REQUEST_HEADERS, expose_headers=CORS_RESPONSE_HEADERS)
    hosts = allowed_hosts(settings)
    if hosts is not None:
        app.add_middleware(HostGuard, allowed=hosts)


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


def _as_openapi_30(app: FastAPI) -> None:
    """The document as OpenAPI 3.0.3, which its media type (``version=3.0``) and OGC API -
    Processes 1.0 (``oas30``) promise: FastAPI writes 3.1, whose JSON Schema (null types,
    tuples, ``const``) 3.0 tools refuse. Made once, on first request."""
    generate = app.openapi
    made: list[dict] = []

    def openapi() -> dict:
        if not made:
            made.append(oas30.document(generate()))
        return made[0]

    app.openapi_version = oas30.VERSION
    app.openapi = openapi


# Swagger UI's script, style and icon, as the service serves them under /docs/: from the
# fastapi-offline package's copy, so that /docs works on a machine without internet.
SWAGGER_UI_FILES = {"swagger-ui-bundle.js": "text/javascript", "swagger-ui.css": "text/css",
                    "favicon.png": "image/png"}


def _swagger_ui_file(name: str) -> Path:
    return Path(str(importlib.resources.files("fastapi_offline") / "static" / name))


def _api_description_routes(app: FastAPI) -> None:
    """``/openapi.json`` and ``/docs`` (Swagger UI, every file of it from this service),
    protected by the token when one is set."""
    guarded = [Depends(require_token)]

    @app.get("/openapi.json", include_in_schema=False, dependencies=guarded)
    def openapi_document():
        return JSONResponse(app.openapi(), media_type="application/vnd.oai.openapi+json;version=3.0")

    @app.get("/docs", include_in_schema=False, dependencies=guarded)
    def swagger_ui():
        return get_swagger_ui_html(openapi_url="/openapi.json", title=f"{app.title} - API",
                                   swagger_js_url="/docs/swagger-ui-bundle.js", swagger_css_url="/docs/swagger-ui.css",
                                   swagger_favicon_url="/docs/favicon.png",
                                   # no validator badge: it would ask a server on the internet
                                   swagger_ui_parameters={"validatorUrl": None})

    def serve(name: str, media_type: str) -> None:
        @app.get(f"/docs/{name}", include_in_schema=False, dependencies=guarded, name=f"swagger_ui_{name}")
        def swagger_ui_file():
            return FileResponse(_swagger_ui_file(name), media_type=media_type,
                                headers={"Cache-Control": "public, max-age=86400"})

    for name, media_type in SWAGGER_UI_FILES.items():
        serve(name, media_type)
