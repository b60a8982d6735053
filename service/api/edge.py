"""The network edge: what every request passes before it reaches a route (the Host it names,
CORS, how slowly it may send its body), and uvicorn's deadline on a request's head."""

from __future__ import annotations

import asyncio
import ipaddress
import json
from collections.abc import Callable, Iterable

from starlette.datastructures import MutableHeaders
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.errors import (
    HOST_NOT_ALLOWED,
    PROBLEM_JSON,
    REQUEST_TIMEOUT,
    ServiceError,
    exception_response,
    redact,
)
from service.settings import Settings

#: Bind addresses that listen on every interface: the names clients use cannot be known.
WILDCARD_BINDS = ("", "0.0.0.0", "::", "[::]")
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")
#: What a client may send with a request, and read of a response, across origins (CORS).
CORS_REQUEST_HEADERS = ("Authorization", "Content-Type", "Prefer", "Range", "X-Array-Dtype")
CORS_RESPONSE_HEADERS = ("Location", "Link", "Preference-Applied", "X-Array-Dtype", "Content-Range",
                         "Accept-Ranges", "WWW-Authenticate", "Retry-After", "Expires")
#: The largest request head (request line and headers) the server buffers: h11's own default,
#: stated so that it does not depend on the library's.
MAX_HEAD_BYTES = 16 * 1024


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _with_port(host: str, port: int) -> list[str]:
    host = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return [host, f"{host}:{port}"]


def allowed_hosts(settings: Settings) -> frozenset[str] | None:
    """The ``Host`` header values the service answers, lowercase; ``None``: any. Default: the
    bound address with and without the port, and for a loopback bind the loopback names too;
    a bind to every interface (0.0.0.0) cannot know its names, so allows any unless told."""
    if settings.allowed_hosts is not None:
        hosts = {host.strip().lower() for host in settings.allowed_hosts}
        return None if "*" in hosts else frozenset(hosts)
    if settings.host.strip() in WILDCARD_BINDS:
        return None
    names = [settings.host, *LOOPBACK_NAMES] if _is_loopback(settings.host) else [settings.host]
    return frozenset(value.lower() for name in names for value in _with_port(name, settings.port))


class _HttpOnly:
    """An ASGI middleware for HTTP requests: ``http`` sees them, anything else (the lifespan)
    passes by."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self.http(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        raise NotImplementedError


class HostGuard:
    """Refuses (400) a request whose ``Host`` is not one the service answers for, before
    anything else: a web page whose own name was made to resolve to this machine (DNS
    rebinding) reaches the port, but names its own host."""

    def __init__(self, app: ASGIApp, allowed: frozenset[str]):
        self.app = app
        self.allowed = allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            given = [value for key, value in scope["headers"] if key == b"host"]
            host = given[0].decode("latin-1").strip().lower() if len(given) == 1 else None
            if host not in self.allowed:
                what = "no Host header" if host is None else f"host {host[:100]!r}"
                response = exception_response(400, HOST_NOT_ALLOWED, f"this service does not answer for {what}")
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


class _Answered(Exception):
    """Raised into the app once a HEAD answer has its headers: the rest is nobody's."""


class HeadAsGet(_HttpOnly):
    """HEAD on a resource that answers GET (RFC 9110: every such resource answers HEAD): the
    request goes to the GET route, past the same token check, and its status and headers
    leave without the content. A route with a HEAD of its own (the Zarr keys) answers it
    itself. Every answer to a HEAD ends at its headers: a streamed body (an array's NPY) is
    not read on for nobody. ``routes`` is asked per request: routes are added after the app
    is made."""

    def __init__(self, app: ASGIApp, routes: Callable[[], Iterable]):
        super().__init__(app)
        self.routes = routes

    def _answers(self, scope: Scope, method: str) -> bool:
        scope = {**scope, "method": method}
        return any(route.matches(scope)[0] == Match.FULL for route in self.routes())

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return
        if not self._answers(scope, "HEAD") and self._answers(scope, "GET"):
            scope = {**scope, "method": "GET"}
        answered = False

        async def headers_only(message: Message) -> None:
            nonlocal answered
            if answered:
                raise _Answered
            if message["type"] != "http.response.body":
                await send(message)
                return
            answered = True
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            if message.get("more_body", False):
                raise _Answered

        try:
            await self.app(scope, receive, headers_only)
        except _Answered:
            pass
        except BaseExceptionGroup as group:  # raised inside a task group (a streamed body)
            _, rest = group.split(_Answered)
            if rest is not None:
                raise rest from None


class BodyReadTimeout(_HttpOnly):
    """A request body whose next piece does not arrive within ``seconds`` is cut off: 408, and
    the connection closed (a client trickling its body would otherwise hold a request, and
    whatever it had reserved, for as long as it liked). Time the app spends between reads
    does not count, nor does anything after the body's last piece."""

    def __init__(self, app: ASGIApp, seconds: float):
        super().__init__(app)
        self.seconds = seconds

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        body_done = False

        async def timed_receive() -> Message:
            nonlocal body_done
            if body_done:  # e.g. a streaming response listening for the client to go
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), self.seconds)
            except TimeoutError:
                raise ServiceError(408, REQUEST_TIMEOUT,
                                   f"the request body stalled: no data for {self.seconds:g} s",
                                   headers={"Connection": "close"}) from None
            body_done = message["type"] != "http.request" or not message.get("more_body", False)
            return message

        await self.app(scope, timed_receive, send)


class ErrorBodyGuard(_HttpOnly):
    """Error bodies (status 400 and above, JSON or problem+json) leave with the server's own
    directories (the data root, its state and scratch directories) out of their ``detail`` and
    no traceback:
    a message from a library (zarr names its store by path) tells a client nothing it may
    use, and the map of the server's disk is none of its business. ``paths`` is asked per
    response: the store opens after the app is made."""

    LARGEST = 2**20  # an exception body is a few hundred bytes; anything longer passes as it is

    def __init__(self, app: ASGIApp, paths: Callable[[], Iterable[str]]):
        super().__init__(app)
        self.paths = paths

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        held: list[Message] = []

        async def guarded_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                media = MutableHeaders(raw=message["headers"]).get("content-type", "")
                if message["status"] >= 400 and media.startswith(("application/json", PROBLEM_JSON)):
                    held.append(message)
                    return
            elif held and message["type"] == "http.response.body":
                held.append(message)
                size = sum(len(m.get("body", b"")) for m in held[1:])
                if message.get("more_body", False) and size <= self.LARGEST:
                    return
                await self._send_redacted(held, send)
                held.clear()
                return
            await send(message)

        await self.app(scope, receive, guarded_send)

    async def _send_redacted(self, held: list[Message], send: Send) -> None:
        start, pieces = held[0], held[1:]
        body = b"".join(m.get("body", b"") for m in pieces)
        if not pieces[-1].get("more_body", False):
            try:
                document = json.loads(body)
            except ValueError:
                document = None
            detail = document.get("detail") if isinstance(document, dict) else None
            if isinstance(detail, str) and redact(detail, self.paths()) != detail:
                document["detail"] = redact(detail, self.paths())
                body = json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode()
                MutableHeaders(raw=start["headers"])["content-length"] = str(len(body))
        await send(start)
        await send({"type": "http.response.body", "body": body, "more_body": pieces[-1].get("more_body", False)})


def head_timed_protocol(seconds: float) -> type:
    """uvicorn's h11 protocol with a deadline on each request's head: a connection that has
    not sent a whole request line and headers within ``seconds`` of opening (or of its last
    response) is closed. uvicorn has none: a client sending its headers a byte at a time
    would hold its connection forever."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class HeadTimedH11Protocol(H11Protocol):
        _head_deadline: asyncio.TimerHandle | None = None

        def _waiting_for_head(self) -> bool:
            return self.cycle is None or self.cycle.response_complete

        def _arm(self) -> None:
            self._disarm()
            self._head_deadline = self.loop.call_later(seconds, self._head_late)

        def _disarm(self) -> None:
            if self._head_deadline is not None:
                self._head_deadline.cancel()
                self._head_deadline = None

        def _head_late(self) -> None:
            self._head_deadline = None
            if self._waiting_for_head() and not self.transport.is_closing():
                self.transport.close()

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if not self._waiting_for_head():
                self._disarm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self._waiting_for_head() and not self.transport.is_closing():
                self._arm()

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

    return HeadTimedH11Protocol
