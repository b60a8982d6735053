"""Callbacks: a job's status and results pushed to the URIs of its execute request's
``subscriber`` (OGC API - Processes 1.0, conformance class callback).

What goes where (the standard only says that the server uses the subscriber's URIs; the
rest is this service's rule):

- ``successUri``: the results document (as ``GET /jobs/{jobID}/results`` gives it), once,
  when the job is successful;
- ``failedUri``: the job's statusInfo, once, when it failed or was dismissed (it ended
  without results);
- ``inProgressUri``: the job's statusInfo each time its status or progress changes while it
  is accepted or running, at most one push per ``progress_interval`` seconds: changes that
  come sooner are merged into the latest one (a change of status is never merged away).

Every request is a POST of ``application/json`` with ``Link: <.../jobs/{jobID}>;
rel="monitor"`` (a results document does not say whose it is). A job's deliveries go out one
after another in the order of its changes; those of different jobs go side by side.

Where they may go: only to URIs the allow-list admits (``AllowList``: scheme, host, port and
leading path of a configured URL prefix), checked when the request comes (400 before any job)
and again before each delivery. Redirects are never followed. A host *name* is resolved when
it is checked, and every delivery resolves it again and connects to the address it checked
(no second lookup an attacker's DNS could answer differently); a name that resolves to a
loopback, private or otherwise non-global address is refused unless the operator allows it.

They cannot hold the service up: deliveries run on one event loop in a thread of their own;
a job's status change only hands them a snapshot of its record (``changed`` never blocks).
A failed try (connection error, timeout, 5xx) is tried again after ``backoff`` seconds,
doubling, ``retries`` times. What waits is bounded: a job has at most one waiting push per
status and its final one, and at most ``max_pending`` jobs have deliveries waiting (past
that a new job with a subscriber is refused: ``has_room``).
"""

from __future__ import annotations

import asyncio
import collections
import ipaddress
import json
import logging
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx

from schemas.service import Subscriber
from service.errors import INVALID_PARAMETER, ServiceError
from service.jobs.records import JobRecords

log = logging.getLogger(__name__)

FINAL = ("successful", "failed", "dismissed")
_DEFAULT_PORTS = {"http": 80, "https": 443}
# The concurrent callback requests of the whole service (more wait for a connection).
MAX_CONNECTIONS = 32
USER_AGENT = "chunked-tensor-ops-callbacks"


# --- where callbacks may go ---------------------------------------------------------------------

@dataclass(frozen=True)
class Target:
    """A URL split into what the allow-list compares: scheme, host, port and path."""

    scheme: str
    host: str          # lower case; an IP literal in its compressed form, without brackets
    port: int
    path: str
    literal: bool      # the host is an IP address, not a name

    @classmethod
    def of(cls, url: str) -> Target:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        host = (parts.hostname or "").lower()
        try:
            host, literal = str(ipaddress.ip_address(host)), True
        except ValueError:
            literal = False
        return cls(scheme, host, parts.port or _DEFAULT_PORTS[scheme], parts.path or "/", literal)

    def admits(self, other: Target) -> bool:
        """Whether ``other`` is at or under this prefix: same scheme, host and port, and a path
        that is this one or continues it after a ``/``."""
        if (self.scheme, self.host, self.port) != (other.scheme, other.host, other.port):
            return False
        prefix = self.path.rstrip("/")
        return not prefix or other.path == prefix or other.path.startswith(prefix + "/")


class AllowList:
    """The callback allow-list: URL prefixes (the ``callback_allow`` setting).

    ``private_addresses``: an allowed host name may resolve to a non-global address (loopback,
    private, link-local); otherwise only a host allowed as an IP literal may be one."""

    def __init__(self, entries: list[str], *, private_addresses: bool = False):
        self.entries = [Target.of(entry) for entry in entries]
        self.private_addresses = private_addresses

    def match(self, url: str) -> Target | None:
        target = Target.of(url)
        return next((entry for entry in self.entries if entry.admits(target)), None)

    def addresses(self, url: str, resolve: Callable = socket.getaddrinfo) -> list[str]:
        """The addresses a delivery to ``url`` may connect to; ValueError saying why none."""
        target = Target.of(url)
        if target.literal:
            return [target.host]  # allowed by itself: no name to resolve
        try:
            found = resolve(target.host, target.port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as error:
            raise ValueError(f"its host {target.host!r} does not resolve ({error})") from None
        addresses = list(dict.fromkeys(str(ipaddress.ip_address(info[4][0].split("%")[0])) for info in found))
        if not self.private_addresses:
            inner = [a for a in addresses if not ipaddress.ip_address(a).is_global]
            if inner:
                raise ValueError(f"its host {target.host!r} resolves to the non-public address {inner[0]} "
                                 "(allow that address itself, or set callback_private_addresses)")
        if not addresses:
            raise ValueError(f"its host {target.host!r} resolves to no address")
        return addresses


ALLOW_SETTING = "the service's callback_allow setting (CHUNKED_TENSOR_OPS_CALLBACK_ALLOW)"


def check_subscriber(subscriber: Subscriber, allow: AllowList) -> None:
    """400 (naming ``subscriber.<field>``, the rule and the value) unless every URI of
    ``subscriber`` is admitted by ``allow`` and, for a host name, resolves as it must.
    Blocking (a name is resolved)."""
    for name, uri in subscriber.uris().items():
        where = f"execute request: subscriber.{name}"
        if not allow.entries:
            raise ServiceError(400, INVALID_PARAMETER, f"{where}: {uri!r} is refused: this service sends no "
                               f"callbacks ({ALLOW_SETTING} is empty)")
        if allow.match(uri) is None:
            raise ServiceError(400, INVALID_PARAMETER, f"{where}: {uri!r} is not allowed: a callback URI must "
                               f"have the scheme, host, port and leading path of a URL that {ALLOW_SETTING} "
                               "lists")
        try:
            allow.addresses(uri)
        except ValueError as error:
            raise ServiceError(400, INVALID_PARAMETER, f"{where}: {uri!r} is not allowed: {error}") from None


# --- the deliveries -----------------------------------------------------------------------------

@dataclass
class _Push:
    field: str   # successUri | failedUri | inProgressUri
    job: dict    # the record's snapshot at the change


@dataclass
class _Feed:
    """One job's deliveries: waiting pushes in order, and the state last seen."""

    subscriber: dict
    pushes: collections.deque = field(default_factory=collections.deque)
    seen: tuple | None = None       # (status, progress) of the last change taken
    updated: str = ""               # the record's ``updated`` of it (older snapshots are late)
    ended: bool = False             # its final push is taken: nothing after it
    last_progress_push: float = float("-inf")
    task: asyncio.Task | None = None


class CallbackDispatcher:
    """Delivers callbacks from an event loop in a thread of its own (see the module's text).

    Parameters
    ----------
    allow : AllowList
    render_status : callable
        ``render_status(job) -> dict``: a job record as its statusInfo (blocking is fine: it
        runs in a worker thread).
    render_results : callable
        ``render_results(job) -> dict``: a successful job's results document (likewise).
    timeout : float
        Seconds one request may take, all of it.
    retries : int
        Tries after the first (connection error, timeout, 5xx).
    backoff : float
        Seconds before the first retry; each later one waits twice as long as the one before.
    progress_interval : float
        At least this many seconds between two pushes to a job's inProgressUri.
    max_pending : int
        Jobs with deliveries waiting past which ``has_room`` says no.
    """

    def __init__(self, allow: AllowList, render_status: Callable[[dict], dict],
                 render_results: Callable[[dict], dict], *, timeout: float = 10.0, retries: int = 5,
                 backoff: float = 0.5, progress_interval: float = 1.0, max_pending: int = 1000):
        self.allow = allow
        self.render_status, self.render_results = render_status, render_results
        self.timeout, self.retries, self.backoff = timeout, retries, backoff
        self.progress_interval, self.max_pending = progress_interval, max_pending
        self._feeds: dict[str, _Feed] = {}  # the loop's own (read elsewhere only for its size)
        self._loop = asyncio.new_event_loop()
        self._client: httpx.AsyncClient | None = None
        self._thread = threading.Thread(target=self._run, name="callback-deliveries", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._client = httpx.AsyncClient(
            follow_redirects=False,  # a redirect could lead anywhere: it ends the delivery
            trust_env=False,  # no proxy from the environment (it would connect for us)
            timeout=httpx.Timeout(self.timeout),
            limits=httpx.Limits(max_connections=MAX_CONNECTIONS, max_keepalive_connections=8),
            headers={"User-Agent": USER_AGENT})
        self._loop.run_forever()

    # --- from any thread ----------------------------------------------------------------

    def has_room(self) -> bool:
        """Whether a new job with a subscriber may be taken (``max_pending``)."""
        return len(self._feeds) < self.max_pending

    def changed(self, job: dict) -> None:
        """A job with a subscriber changed: ``job`` is its record after the change. Returns at
        once, and never raises into the job that changed (after ``close``, nothing is sent)."""
        self._call(self._take, job)

    def forget(self, job_id: str) -> None:
        """Drop a job's waiting deliveries (a job refused after it was recorded)."""
        self._call(self._drop, job_id)

    def _call(self, function, argument) -> None:
        try:
            self._loop.call_soon_threadsafe(function, argument)
        except RuntimeError:  # the loop is closed: the service has stopped
            log.warning("callbacks: a change after the deliveries stopped is not sent")

    def close(self, wait: float = 5.0) -> None:
        """Deliver what waits, ``wait`` seconds at most, then stop the loop and its thread."""
        if self._loop.is_closed():
            return
        future = asyncio.run_coroutine_threadsafe(self._finish(wait), self._loop)
        try:
            future.result(wait + self.timeout + 5)
        except Exception as error:  # the loop is stopped below in any case
            log.warning("callbacks: not all delivered at shutdown: %s", error)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self._loop.close()

    # --- on the loop --------------------------------------------------------------------

    def _take(self, job: dict) -> None:
        subscriber = job.get("subscriber")
        feed = self._feeds.get(job["id"])
        if feed is None:
            if not subscriber:
                return
            feed = self._feeds[job["id"]] = _Feed(json.loads(subscriber) if isinstance(subscriber, str)
                                                  else dict(subscriber))
        state = (job["status"], job["progress"])
        if feed.ended or state == feed.seen or (job.get("updated") or "") < feed.updated:
            return  # nothing new, or a snapshot overtaken by a later one
        status_changed = feed.seen is None or feed.seen[0] != job["status"]
        feed.seen, feed.updated = state, job.get("updated") or ""
        if job["status"] in FINAL:
            feed.ended = True
            wanted = "successUri" if job["status"] == "successful" else "failedUri"
            if feed.subscriber.get(wanted):
                feed.pushes.append(_Push(wanted, job))
        elif feed.subscriber.get("inProgressUri"):
            last = feed.pushes[-1] if feed.pushes else None
            if not status_changed and last is not None and last.field == "inProgressUri" \
                    and last.job["status"] == job["status"]:
                last.job = job  # not sent yet: it goes out as the latest state
            else:
                feed.pushes.append(_Push("inProgressUri", job))
        if feed.task is None:
            if feed.pushes:
                feed.task = self._loop.create_task(self._send_all(job["id"], feed))
            elif feed.ended:  # nothing to send for its end (no failedUri)
                del self._feeds[job["id"]]

    def _drop(self, job_id: str) -> None:
        feed = self._feeds.pop(job_id, None)
        if feed is not None and feed.task is not None:
            feed.task.cancel()

    async def _send_all(self, job_id: str, feed: _Feed) -> None:
        """A job's pushes one after another, inProgressUri ones spaced by the interval."""
        try:
            while feed.pushes:
                push = feed.pushes[0]
                if push.field == "inProgressUri":
                    wait = feed.last_progress_push + self.progress_interval - self._loop.time()
                    if wait > 0:
                        await asyncio.sleep(wait)  # changes meanwhile update this push
                        continue
                    feed.last_progress_push = self._loop.time()
                feed.pushes.popleft()
                await self._deliver(job_id, feed.subscriber[push.field], push)
        except asyncio.CancelledError:
            feed.task = None
            raise
        except Exception:  # a bug here must not end the loop (the job's other pushes go)
            log.exception("callbacks of job %s", job_id)
            feed.pushes.clear()
        feed.task = None
        if self._feeds.get(job_id) is feed and feed.ended:
            del self._feeds[job_id]

    async def _deliver(self, job_id: str, uri: str, push: _Push) -> None:
        try:
            render = self.render_results if push.field == "successUri" else self.render_status
            document = await asyncio.to_thread(render, push.job)
        except Exception as error:  # e.g. the result was deleted meanwhile
            log.warning("callback %s of job %s not sent: %s", push.field, job_id, error)
            return
        body = json.dumps(document).encode()
        base = (push.job.get("base_url") or "").rstrip("/")
        headers = {"Content-Type": "application/json", "Link": f'<{base}/jobs/{job_id}>; rel="monitor"'}
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                answer = await asyncio.wait_for(self._post(uri, body, headers), self.timeout)
            except ValueError as error:  # no longer allowed, or its name resolves elsewhere now
                log.warning("callback %s of job %s to %s refused: %s", push.field, job_id, uri, error)
                return
            except (httpx.TransportError, asyncio.TimeoutError, OSError) as error:
                log.info("callback %s of job %s to %s: %s (try %d)", push.field, job_id, uri,
                         type(error).__name__, attempt + 1)
                continue
            if answer.status_code < 500:
                if answer.status_code >= 300:
                    log.warning("callback %s of job %s to %s answered %d (not retried; redirects are not "
                                "followed)", push.field, job_id, uri, answer.status_code)
                return
            log.info("callback %s of job %s to %s answered %d (try %d)", push.field, job_id, uri,
                     answer.status_code, attempt + 1)
        log.warning("callback %s of job %s to %s given up after %d tries", push.field, job_id, uri,
                    self.retries + 1)

    async def _post(self, uri: str, body: bytes, headers: dict) -> httpx.Response:
        """POST to ``uri`` at the address its check found (ValueError if it is not allowed)."""
        if self.allow.match(uri) is None:
            raise ValueError("not in the allow-list (any more)")
        addresses = await asyncio.to_thread(self.allow.addresses, uri)
        url = httpx.URL(uri)
        extensions = {}
        if not Target.of(uri).literal:  # connect to the address checked, naming the host
            headers = {**headers, "Host": url.netloc.decode("ascii")}
            if url.scheme == "https":
                extensions["sni_hostname"] = url.host  # TLS verifies the certificate against it
            url = url.copy_with(host=addresses[0])
        return await self._client.post(url, content=body, headers=headers, extensions=extensions)

    async def _finish(self, wait: float) -> None:
        deadline = self._loop.time() + wait
        while self._feeds and any(f.pushes or f.task for f in self._feeds.values()) \
                and self._loop.time() < deadline:
            await asyncio.sleep(0.02)
        for feed in list(self._feeds.values()):
            if feed.task is not None:
                feed.task.cancel()
        await self._client.aclose()
        await self._loop.shutdown_default_executor()  # the threads that rendered documents


# --- where the job's changes come from ----------------------------------------------------------

class SubscribedRecords(JobRecords):
    """The job records, telling ``callbacks`` every change of a job that has a subscriber:
    every status and progress change of a job passes through these methods, so this is the
    one place callbacks hook in. The snapshot is read right after the change."""

    def __init__(self, path, callbacks: CallbackDispatcher | None = None, **options):
        super().__init__(path, **options)
        self.callbacks = callbacks  # None until set: changes are then not told
        self._watched: set[str] = set()
        self._watched_lock = threading.Lock()

    def create(self, job_id: str, *args, subscriber: str | None = None, **options) -> dict:
        job = super().create(job_id, *args, subscriber=subscriber, **options)
        if subscriber:
            with self._watched_lock:
                self._watched.add(job_id)
            self._tell(job)
        return job

    def start(self, job_id: str) -> bool:
        started = super().start(job_id)
        self._changed(job_id)
        return started

    def update(self, job_id: str, **fields) -> None:
        super().update(job_id, **fields)
        self._changed(job_id)

    def finish(self, job_id: str, status: str, message: str, **fields) -> None:
        super().finish(job_id, status, message, **fields)
        self._changed(job_id)

    def delete(self, job_id: str) -> None:
        super().delete(job_id)
        with self._watched_lock:
            watched = job_id in self._watched
            self._watched.discard(job_id)
        if watched and self.callbacks is not None:
            self.callbacks.forget(job_id)

    def mark_interrupted(self) -> int:
        with self._connect() as db:  # the active jobs with a subscriber: their failure is told too
            ids = [row[0] for row in db.execute(
                "SELECT id FROM jobs WHERE status IN ('accepted', 'running') AND subscriber IS NOT NULL")]
        count = super().mark_interrupted()
        with self._watched_lock:
            self._watched.update(ids)
        for job_id in ids:
            self._changed(job_id)
        return count

    def _changed(self, job_id: str) -> None:
        with self._watched_lock:
            if job_id not in self._watched:
                return
        try:
            job = self.get(job_id)
        except Exception as error:  # the change itself is recorded; its callback is a courtesy
            log.warning("job %s: callback not queued: %s", job_id, error)
            return
        if job is not None:
            self._tell(job)

    def _tell(self, job: dict) -> None:
        if job["status"] in FINAL:
            with self._watched_lock:
                self._watched.discard(job["id"])
        if self.callbacks is not None:
            self.callbacks.changed(job)
