"""OGC API exceptions: every error the service answers is a JSON problem-details body
``{"type", "title", "status", "detail"}`` with ``Content-Type: application/json``."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ops.errors import InvalidArgument
from schemas.service import OGC_EXCEPTION

log = logging.getLogger(__name__)

# Project-specific exception types (documented in docs/api.md).
PROJECT = "https://chunked-tensor-ops.readthedocs.io/exceptions/"

INVALID_PARAMETER = OGC_EXCEPTION + "invalid-parameter"
NO_SUCH_PROCESS = OGC_EXCEPTION + "no-such-process"
NO_SUCH_JOB = OGC_EXCEPTION + "no-such-job"
RESULT_NOT_READY = OGC_EXCEPTION + "result-not-ready"
NO_SUCH_ARRAY = PROJECT + "no-such-array"
NOT_FOUND = PROJECT + "not-found"
CONFLICT = PROJECT + "conflict"
TOO_LARGE = PROJECT + "payload-too-large"
UNSUPPORTED_MEDIA_TYPE = PROJECT + "unsupported-media-type"
UNAUTHORIZED = PROJECT + "unauthorized"
CLUSTER_UNAVAILABLE = PROJECT + "cluster-unavailable"
JOB_FAILED = PROJECT + "job-failed"
RANGE_NOT_SATISFIABLE = PROJECT + "range-not-satisfiable"
SERVER_ERROR = PROJECT + "server-error"

_TITLES = {
    400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed",
    409: "Conflict", 413: "Payload Too Large", 415: "Unsupported Media Type",
    416: "Range Not Satisfiable", 500: "Internal Server Error", 503: "Service Unavailable",
}


class ServiceError(Exception):
    """An error answered as an OGC exception with ``status``, ``type`` and ``detail``."""

    def __init__(self, status: int, type_: str, detail: str, headers: dict | None = None):
        super().__init__(detail)
        self.status = status
        self.type = type_
        self.detail = detail
        self.headers = headers


def bad_request(detail: str) -> ServiceError:
    return ServiceError(400, INVALID_PARAMETER, detail)


def too_large(detail: str) -> ServiceError:
    return ServiceError(413, TOO_LARGE, detail)


def conflict(detail: str) -> ServiceError:
    return ServiceError(409, CONFLICT, detail)


def no_such_array(name: str) -> ServiceError:
    return ServiceError(404, NO_SUCH_ARRAY, f"no array named {name!r}")


def exception_response(status: int, type_: str, detail: str, headers: dict | None = None) -> JSONResponse:
    body = {"type": type_, "title": _TITLES.get(status, "Error"), "status": status, "detail": detail}
    return JSONResponse(body, status_code=status, headers=headers)


def _validation_detail(error: RequestValidationError) -> str:
    parts = []
    for e in error.errors()[:3]:
        where = ".".join(str(p) for p in e.get("loc", ()) if p != "body")
        parts.append(f"{where}: {e.get('msg')}" if where else str(e.get("msg")))
    return "; ".join(parts) or "invalid request"


def install(app: FastAPI) -> None:
    """Register the handlers that turn every error into an OGC exception body."""

    @app.exception_handler(ServiceError)
    async def _service_error(request: Request, exc: ServiceError):
        return exception_response(exc.status, exc.type, exc.detail, exc.headers)

    @app.exception_handler(InvalidArgument)
    async def _invalid(request: Request, exc: InvalidArgument):
        return exception_response(400, INVALID_PARAMETER, str(exc))

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        return exception_response(400, INVALID_PARAMETER, _validation_detail(exc))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        type_ = {404: NOT_FOUND, 413: TOO_LARGE, 415: UNSUPPORTED_MEDIA_TYPE}.get(exc.status_code, PROJECT + "http-error")
        return exception_response(exc.status_code, type_, str(exc.detail), getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return exception_response(500, SERVER_ERROR, f"internal error: {type(exc).__name__}")
