"""OGC API exceptions: every error the service answers is an RFC 7807 problem-details body
``{"type", "title", "status", "detail"}`` with ``Content-Type: application/problem+json``."""

from __future__ import annotations

import errno
import logging
import re
import sqlite3
from typing import TYPE_CHECKING

from ops.errors import InvalidArgument
from schemas.service import OGC_EXCEPTION

if TYPE_CHECKING:  # the web framework is imported where the service uses it: the command line,
    # which raises these errors too (service.jobs.cluster), does not pay for importing it
    from fastapi import FastAPI, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse

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
METHOD_NOT_ALLOWED = PROJECT + "method-not-allowed"
SERVER_ERROR = PROJECT + "server-error"
INSUFFICIENT_STORAGE = PROJECT + "insufficient-storage"
HOST_NOT_ALLOWED = PROJECT + "host-not-allowed"
REQUEST_TIMEOUT = PROJECT + "request-timeout"

_TITLES = {
    400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 405: "Method Not Allowed",
    408: "Request Timeout", 409: "Conflict", 413: "Payload Too Large", 415: "Unsupported Media Type",
    416: "Range Not Satisfiable", 500: "Internal Server Error", 503: "Service Unavailable",
    507: "Insufficient Storage",
}


class ServiceError(Exception):
    """An error answered as an OGC exception with ``status``, ``type`` and ``detail``.

    ``full``, when given, is the same error with what a client must not read (e.g. where the
    Dask scheduler listens): it goes to the service's log, and the command line prints it."""

    def __init__(self, status: int, type_: str, detail: str, headers: dict | None = None, *,
                 full: str | None = None):
        super().__init__(detail)
        self.status = status
        self.type = type_
        self.detail = detail
        self.headers = headers
        self.full = detail if full is None else full


def bad_request(detail: str) -> ServiceError:
    return ServiceError(400, INVALID_PARAMETER, detail)


def too_large(detail: str) -> ServiceError:
    return ServiceError(413, TOO_LARGE, detail)


_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
_SQLITE_FULL = 13  # "database or disk is full": the job records, on the data root


def disk_full(error: BaseException) -> bool:
    """Whether ``error`` is the data root running out of space (or quota)."""
    if isinstance(error, sqlite3.Error):
        return getattr(error, "sqlite_errorcode", None) == _SQLITE_FULL
    return isinstance(error, OSError) and error.errno in _DISK_FULL


def insufficient_storage(error: Exception) -> ServiceError:
    """507: the data root is full. The detail names the error (not the server's paths)."""
    if isinstance(error, OSError):
        what = f"[Errno {error.errno}] {error.strerror or error}"
    else:
        what = f"the job records: {error}"
    return ServiceError(507, INSUFFICIENT_STORAGE, f"the data root is out of space: {what}; nothing was stored; "
                                                   "delete arrays or ask the operator for room")


def conflict(detail: str) -> ServiceError:
    return ServiceError(409, CONFLICT, detail)


def no_such_array(name: str) -> ServiceError:
    return ServiceError(404, NO_SUCH_ARRAY, f"no array named {name!r}")


TRACEBACK = "Traceback (most recent call last)"
SERVER_PATH = "<server path>"


def redact(detail: str, paths) -> str:
    """``detail`` fit for a client: each of ``paths`` (this server's own directories, such as
    the data root) replaced by ``<server path>``, and a traceback, if one was pasted in, cut off."""
    detail = detail.split(TRACEBACK, 1)[0].rstrip(" :\n") or "internal error"
    for path in sorted({str(p).rstrip("/") for p in paths if str(p).rstrip("/")}, key=len, reverse=True):
        detail = re.sub(re.escape(path) + r"(?![\w.-])", SERVER_PATH, detail)  # not /data in /database
    return detail


#: RFC 7807's media type of a problem-details body (OGC's exception.yaml is "based on RFC 7807").
PROBLEM_JSON = "application/problem+json"


def exception_response(status: int, type_: str, detail: str, headers: dict | None = None) -> JSONResponse:
    """The OGC exception body of an error, as ``application/problem+json``."""
    from fastapi.responses import JSONResponse

    body = {"type": type_, "title": _TITLES.get(status, "Error"), "status": status, "detail": detail}
    return JSONResponse(body, status_code=status, headers=headers, media_type=PROBLEM_JSON)


def _validation_detail(error: RequestValidationError) -> str:
    parts = []
    for e in error.errors()[:3]:
        where = ".".join(str(p) for p in e.get("loc", ()) if p != "body")
        parts.append(f"{where}: {e.get('msg')}" if where else str(e.get("msg")))
    return "; ".join(parts) or "invalid request"


_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")


def allowed_methods(app: FastAPI, request: Request) -> list[str]:
    """Every method some route of ``app`` answers on this request's path. Starlette's own 405
    names only the methods of the first route that matched the path (``GET /jobs/{id}``, not
    ``DELETE``), which RFC 9110 does not allow: ``Allow`` lists the resource's methods."""
    from starlette.routing import Match

    allowed = []
    for method in _METHODS:
        scope = {**request.scope, "method": method}
        if any(route.matches(scope)[0] == Match.FULL for route in app.router.routes):
            allowed.append(method)
    if "GET" in allowed and "HEAD" not in allowed:  # the edge answers HEAD wherever GET (HeadAsGet)
        allowed.insert(allowed.index("GET") + 1, "HEAD")
    return allowed


_EXCEPTION_REF = "#/components/schemas/Exception_"


def _describe_400_not_422(app: FastAPI) -> None:
    """FastAPI documents a 422 ``HTTPValidationError`` on every operation with parameters or a
    body; this service answers those as 400 OGC exceptions (``_validation`` below), so the
    document says 400 with the exception schema and has no 422. Every exception body is
    documented as ``application/problem+json``, as it is served (FastAPI puts a response's
    ``model`` under ``application/json``)."""
    generate = app.openapi

    def openapi() -> dict:
        document = generate()
        for operations in document.get("paths", {}).values():
            for operation in operations.values():
                responses = operation.get("responses", {})
                if responses.pop("422", None) is not None and "400" not in responses:
                    responses["400"] = {"description": "Bad parameters", "content": {PROBLEM_JSON: {
                        "schema": {"$ref": _EXCEPTION_REF}}}}
                for response in responses.values():
                    content = response.get("content", {})
                    if content.get("application/json", {}).get("schema") == {"$ref": _EXCEPTION_REF}:
                        content[PROBLEM_JSON] = content.pop("application/json")
        schemas = document.get("components", {}).get("schemas", {})
        for unused in ("HTTPValidationError", "ValidationError"):
            schemas.pop(unused, None)
        return document

    app.openapi = openapi


def install(app: FastAPI) -> None:
    """Register the handlers that turn every error into an OGC exception body."""
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException as StarletteHTTPException

    _describe_400_not_422(app)

    @app.exception_handler(ServiceError)
    async def _service_error(request: Request, exc: ServiceError):
        if exc.full != exc.detail:
            log.warning("%s %s: %s", request.method, request.url.path, exc.full)
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
        headers = getattr(exc, "headers", None)
        if exc.status_code == 405:
            allowed = allowed_methods(app, request)
            headers = {**(headers or {}), "Allow": ", ".join(allowed)}
            return exception_response(405, METHOD_NOT_ALLOWED,
                                      f"{request.method} is not allowed here; allowed: {', '.join(allowed)}", headers)
        return exception_response(exc.status_code, type_, str(exc.detail), headers)

    @app.exception_handler(OSError)
    @app.exception_handler(sqlite3.Error)
    async def _os_error(request: Request, exc: Exception):
        if disk_full(exc):  # the upload (or whatever wrote) has removed its partial files
            error = insufficient_storage(exc)
            log.warning("%s %s: %s", request.method, request.url.path, error.detail)
            return exception_response(error.status, error.type, error.detail)
        raise exc  # anything else: the 500 below, as before

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        log.exception("unexpected error on %s %s", request.method, request.url.path)
        return exception_response(500, SERVER_ERROR, f"internal error: {type(exc).__name__}")
