"""What the routers share, wired by ``create_app`` and reached through ``services(request)``."""

from __future__ import annotations

import hmac
import re
from dataclasses import dataclass
from pathlib import Path

from fastapi import Depends, Request, Security
from fastapi.security import HTTPBearer

from service.errors import UNAUTHORIZED, UNSUPPORTED_MEDIA_TYPE, ServiceError
from service.jobs.callbacks import CallbackDispatcher
from service.jobs.cluster import Cluster
from service.jobs.execution import Executor
from service.jobs.records import JobRecords
from service.settings import Settings
from service.storage.protocol import ArrayStorage


@dataclass
class Services:
    settings: Settings
    store: ArrayStorage
    records: JobRecords
    cluster: Cluster
    executor: Executor
    callbacks: CallbackDispatcher | None = None  # a job's subscriber: service.jobs.callbacks


def services(request: Request) -> Services:
    """The app's services (a FastAPI dependency; tests may override it)."""
    return request.app.state.services


def base_url(request: Request) -> str:
    return str(request.base_url).rstrip("/")


#: The token as the OpenAPI document's security scheme (``create_app`` drops it from the
#: document when no token is configured). It only describes: ``auto_error=False`` never
#: refuses a request, ``require_token`` does, with an OGC exception body.
BEARER = HTTPBearer(
    scheme_name="bearerAuth", auto_error=False,
    description="The service's token (--token, CHUNKED_TENSOR_OPS_TOKEN) as Authorization: Bearer <token>.",
)


def token_given(request: Request) -> bool:
    """Whether the request carries the configured token (compared in constant time); never
    without a token configured."""
    token = request.app.state.services.settings.token
    if not token:
        return False
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(), token.encode())


def require_token(request: Request, _described=Security(BEARER)) -> None:
    """With a token configured, ``Authorization: Bearer <token>``."""
    if request.app.state.services.settings.token and not token_given(request):
        raise ServiceError(401, UNAUTHORIZED, "this service needs Authorization: Bearer <token>",
                           headers={"WWW-Authenticate": "Bearer"})


_JSON = re.compile(r"application/([a-z0-9!#$&^_.-]+\+)?json")


def is_json(content_type: str | None) -> bool:
    """Whether a ``Content-Type`` says JSON: ``application/json`` or ``application/*+json``."""
    return bool(_JSON.fullmatch((content_type or "").split(";")[0].strip().lower()))


def require_json(request: Request, _token=Depends(require_token)) -> None:
    """A request that sends a body (POST, PUT, PATCH) must declare it JSON, or 415 (after the
    token check). A browser sends a cross-site form, ``text/plain`` or untyped body without
    asking the service first; a JSON one only if a CORS preflight allows it."""
    if request.method in ("POST", "PUT", "PATCH") and not is_json(request.headers.get("content-type")):
        given = request.headers.get("content-type")
        got = f"got {given[:100]!r}" if given else "it has none"
        raise ServiceError(415, UNSUPPORTED_MEDIA_TYPE, f"the request body must be Content-Type: application/json; {got}")


def server_paths(store) -> list:
    """The directories of the store that no answer may name: its state directory, its root
    when that is local, and a local scratch root."""
    paths = [p for p in (store.state_dir, store.root) if isinstance(p, Path)]
    scratch = store.scratch_root
    if scratch is not None and "://" not in scratch[0]:
        paths.append(Path(scratch[0]).absolute())
    return paths
