"""What the routers share, wired by ``create_app`` and reached through ``services(request)``."""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from fastapi import Request

from service.cluster import Cluster
from service.errors import UNAUTHORIZED, ServiceError
from service.execution import Executor
from service.records import JobRecords
from service.settings import Settings
from service.storage import ArrayStore


@dataclass
class Services:
    settings: Settings
    store: ArrayStore
    records: JobRecords
    cluster: Cluster
    executor: Executor


def services(request: Request) -> Services:
    """The app's services (a FastAPI dependency; tests may override it)."""
    return request.app.state.services


def base_url(request: Request) -> str:
    return str(request.base_url).rstrip("/")


def require_token(request: Request) -> None:
    """With a token configured, ``Authorization: Bearer <token>`` (compared in constant time)."""
    token = request.app.state.services.settings.token
    if not token:
        return
    given = request.headers.get("authorization", "")
    scheme, _, value = given.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(value.strip().encode(), token.encode()):
        raise ServiceError(401, UNAUTHORIZED, "this service needs Authorization: Bearer <token>",
                           headers={"WWW-Authenticate": "Bearer"})
