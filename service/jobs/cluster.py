"""The Dask cluster the service runs jobs on: an embedded LocalCluster, or an existing
scheduler (``--scheduler tcp://...``). An unreachable scheduler is a 503, never a hang.

A Dask scheduler runs whatever code a client sends it, so the embedded cluster lets in only
this process: worker processes and the scheduler listen on 127.0.0.1 over TLS with credentials
made at start-up and held only in memory (a local user who finds the port has no certificate),
and in-process workers talk over ``inproc://``, which nothing outside the process can reach."""

from __future__ import annotations

import contextlib
import logging
import threading
import time

import dask
from distributed import Client, LocalCluster, WorkerPlugin
from distributed.security import Security

from service.errors import CLUSTER_UNAVAILABLE, ServiceError
from service.settings import Settings
from service.storage.fsspec_store import close_sessions

log = logging.getLogger(__name__)


class ClusterUnavailable(ServiceError):
    """503: the cluster takes no work. ``detail``, what a client reads, never names the
    scheduler (whoever reaches its address runs code on the cluster); ``full`` (the service's
    log, the command line, whose user chose the scheduler) says where and why."""

    def __init__(self, detail: str, full: str | None = None):
        super().__init__(503, CLUSTER_UNAVAILABLE, detail, full=full)


class CloseObjectStoreSessions(WorkerPlugin):
    """Closes a worker's object store sessions when the worker closes: without it, each worker
    process of the embedded cluster reports its open sessions on stderr as it ends."""

    name = "chunked-tensor-ops-close-object-store-sessions"

    def teardown(self, worker) -> None:
        close_sessions()


class Cluster:
    """Owns the distributed ``Client`` (and the LocalCluster when embedded). Blocking methods;
    call them from threads."""

    def __init__(self, settings: Settings, *, dashboard: bool = False):
        self.settings = settings
        self.embedded = settings.scheduler is None
        # The embedded cluster's dashboard, only when asked: it shows task names, logs and call
        # stacks to anyone on this machine, and costs start-up time.
        self.dashboard = dashboard
        self._local: LocalCluster | None = None
        self._client: Client | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        if self.embedded:
            s = self.settings
            # Workers read and write the data root by path: the same files the API serves.
            where = {"host": "127.0.0.1", "security": Security.temporary()} if s.cluster_processes else {}
            with dask.config.set(self._http_routes()):
                self._local = LocalCluster(
                    n_workers=s.n_workers, threads_per_worker=s.threads_per_worker, memory_limit=s.memory_limit,
                    processes=s.cluster_processes, dashboard_address="127.0.0.1:0",
                    scheduler_kwargs={"dashboard": self.dashboard}, **where,
                )
            self._client = Client(self._local, security=self._local.security, set_as_default=False)
            if s.cluster_processes:
                self._client.register_plugin(CloseObjectStoreSessions())
        else:
            try:
                self.client()
            except ClusterUnavailable as error:  # the service still answers; executions get 503
                log.warning("%s", error.detail)

    def _http_routes(self) -> dict:
        """Dask config for the embedded cluster's HTTP servers, which its scheduler and workers
        start whether or not there is a dashboard (on 127.0.0.1): without a dashboard, only
        their ``/health``, not the pages of logs, tracebacks and call stacks."""
        if self.dashboard:
            return {}
        return {"distributed.scheduler.http.routes": ["distributed.http.health"],
                "distributed.worker.http.routes": ["distributed.http.health"]}

    def client(self) -> Client:
        """A connected client, reconnecting to an external scheduler if needed; 503 otherwise."""
        with self._lock:
            client = self._client
            if client is not None and client.status == "running":
                return client
            if self.embedded:
                raise ClusterUnavailable("the embedded Dask cluster is not running")
            timeout = self.settings.scheduler_timeout
            if client is not None and client.status == "connecting":
                # lost its scheduler and retrying by itself for ``timeout`` s: let it finish
                # (interrupting it only logs a traceback), then use it or start afresh
                deadline = time.monotonic() + timeout + 1
                while client.status == "connecting" and time.monotonic() < deadline:
                    time.sleep(0.05)
                if client.status == "running":
                    return client
            if client is not None:  # lost its scheduler for good: start afresh
                with contextlib.suppress(Exception):
                    client.close(timeout=1)
                self._client = None
            try:
                with dask.config.set({"distributed.comm.timeouts.connect": f"{timeout}s"}):
                    self._client = Client(self.settings.scheduler, timeout=timeout, set_as_default=False)
            except (OSError, TimeoutError) as error:
                raise ClusterUnavailable(
                    "the Dask scheduler is unreachable",
                    f"the Dask scheduler at {self.settings.scheduler} is unreachable: {error}") from None
            return self._client

    @property
    def patience(self) -> float:
        """How long a job waits for a scheduler that stopped answering before it fails (a
        frozen scheduler keeps its connections open: nothing else would ever tell)."""
        return 3 * self.settings.scheduler_timeout

    def identity(self, client: Client | None = None) -> dict:
        """The scheduler's own description (workers, threads, memory), asked now; 503 if down."""
        client = client or self.client()
        try:
            return client.sync(client.scheduler.identity, callback_timeout=self.settings.scheduler_timeout)
        except (OSError, TimeoutError) as error:
            raise ClusterUnavailable("the Dask scheduler does not answer",
                                     f"the Dask scheduler does not answer: {error}") from None

    def live_client(self) -> Client:
        """``client()``, once the scheduler has answered now (bounded): work is only handed to
        a scheduler that answers, and an unresponsive one is a prompt 503, not a hang."""
        client = self.client()
        self.identity(client)
        return client

    def health(self) -> dict:
        address = self.settings.scheduler or (self._local.scheduler_address if self._local else None)
        try:
            ident = self.identity()
        except ClusterUnavailable as error:
            return {"scheduler": address, "embedded": self.embedded, "error": error.detail}
        workers = ident.get("workers", {}).values()
        linked = self._client is not None and (self.dashboard or not self.embedded)  # an external one: its operator's
        return {
            "scheduler": ident.get("address", address),
            "workers": len(workers),
            "threads": sum(w.get("nthreads", 0) for w in workers),
            "memory_limit": sum(w.get("memory_limit") or 0 for w in workers),
            "dashboard": self._client.dashboard_link if linked else None,
            "embedded": self.embedded,
        }

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close(timeout=5)
                self._client = None
            if self._local is not None:
                self._local.close(timeout=10)
                self._local = None
