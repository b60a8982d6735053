"""What the routers share, wired by ``create_app`` and reached through ``services(request)``."""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from fastapi import Request, Security
from fastapi.security import HTTPBearer

from service.errors import UNAUTHORIZED, ServiceError
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


def require_token(request: Request, _described=Security(BEARER)) -> None:
    """With a token configured, ``Authorization: Bearer <token>`` (compared in constant time)."""
    token = request.app.state.services.settings.token
    if not token:
        return
    given = request.headers.get("authorization", "")
    scheme, _, value = given.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(value.strip().encode(), token.encode()):
        raise ServiceError(401, UNAUTHORIZED, "this service needs Authorization: Bearer <token>",
                           headers={"WWW-Authenticate": "Bearer"})
