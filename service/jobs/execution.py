"""The executor: a planned request (``service.jobs.plan``) run to its result, the operator's
graph built through the registry and computed on the cluster (or inline, for small inline
inputs), synchronously for a request or as a background job that can be dismissed.

A stored input is opened lazily (``xarray.open_zarr`` -> Dask), so the graph reads it chunk by
chunk on the workers; a stored result is written with ``to_zarr`` through the distributed
client under a temporary name and renamed into place when complete. Inline inputs are small
NPY payloads; when every input is inline the operator runs on NumPy in the service's
threads, which is what a small synchronous request wants.
"""

from __future__ import annotations

import contextlib
import logging
import math
import queue
import threading
import time
from dataclasses import dataclass, field

import dask
import dask.array as da
import numpy as np
import xarray as xr
from distributed import CancelledError, Future

from ops import _limits
from ops._chunks import zarr_chunks
from ops.errors import InvalidArgument
from schemas.service import ExecuteRequest
from service.errors import (INVALID_PARAMETER, JOB_FAILED, PROJECT, ServiceError, conflict, disk_full,
                            insufficient_storage, no_such_array, too_large)
from service.jobs.runner import SchedulerSilent, Stopped, drain, remove_partial, wait_with_progress
from service.jobs.cluster import Cluster, ClusterUnavailable
from service.jobs.plan import JobPlan, plan_request
from service.jobs.records import INTERRUPTED, JobRecords, now
from service.storage.chunk_order import stream_chunks
from service.storage.names import check_variable_dims
from service.storage.protocol import ArrayStorage
from service.storage.variables import StoredVariable, uncompressed_bytes

log = logging.getLogger(__name__)

POLL_SECONDS = 0.25
DISMISSED = "dismissed by the client"
TOO_MANY_JOBS = PROJECT + "too-many-jobs"
RETRY_AFTER_SECONDS = 10


class Dismissed(Exception):
    """The job was dismissed while it ran."""


@dataclass
class _Control:
    """How an execution is told to stop (and why), and how it says it has."""

    dismissed: threading.Event = field(default_factory=threading.Event)
    finished: threading.Event = field(default_factory=threading.Event)
    why: str = DISMISSED
    background: bool = False  # a job of the queue, not a synchronous execution
    started: bool = False  # taken by a job thread (until then, a stop ends it at once)


class Executor:
    """Runs executions: synchronously for a request, or as background jobs."""

    def __init__(self, store: ArrayStorage, records: JobRecords, cluster: Cluster, *, max_inline_bytes: int,
                 max_jobs: int = 4, max_queued_jobs: int = 64, max_graph_blocks: int | None = None,
                 max_graph_tasks: int | None = None):
        self.store = store
        self.records = records
        self.cluster = cluster
        self.max_inline_bytes = max_inline_bytes
        self.max_graph_blocks, self.max_graph_tasks = max_graph_blocks, max_graph_tasks  # None: ops' defaults
        self.max_jobs, self.max_queued_jobs = max_jobs, max_queued_jobs
        self._running: dict[str, _Control] = {}  # the executions of this process
        self._lock = threading.Lock()  # over _running and _workers
        self._queue: queue.SimpleQueue[JobPlan | None] = queue.SimpleQueue()
        self._workers: list[threading.Thread] = []
        self._slots = threading.Semaphore(max_jobs)
        self._stopping = threading.Event()

    # --- planning (no work scheduled) -------------------------------------------------------
    def plan(self, process_id: str, request: ExecuteRequest, job_id: str, base_url: str) -> JobPlan:
        """The validated request (``service.jobs.plan.plan_request``); nothing is scheduled."""
        return plan_request(process_id, request, job_id, base_url, store=self.store,
                            max_inline_bytes=self.max_inline_bytes)

    def build(self, plan: JobPlan, scratch: dict | None = None) -> StoredVariable:
        """The operator's lazy result, with the group attrs and companion variables of its first
        input (which its output group keeps). Stored inputs are opened CF-decoded
        (``service.storage.variables``), as ``chunked-tensor-ops run`` and the accessor's users
        read them, so every door computes on the same values; the result keeps the input's
        packing in its ``encoding``. Nothing is computed (or allocated) before the result's size
        has been checked (the first inline input becomes a one-block Dask array). ``scratch``
        (``{"url", "storage_options"}``) is where GatherNd writes its intermediate files.
        Raises InvalidArgument / IndexError (bad parameters) before anything runs.

        The operator counts its output's blocks and its graph's tasks (and, where it knows the
        output's shape before it builds, its bytes) against this service's limits before it
        builds anything, and the whole graph's tasks are counted once it is built: past a
        limit, a 400 (413 for bytes) naming the setting that sets it."""
        arrays, first = {}, StoredVariable(None)
        for name, value in plan.call.arrays.items():
            if isinstance(value, str):
                opened = self.store.open(value, decoded=True)
                arrays[name] = opened.array
                if name == plan.call.op.array_inputs[0]:
                    # A dataset's variable keeps its name (t2m); an array uploaded as NPY is
                    # named after its upload, and its result after the result.
                    first = opened if opened.array.name != value else StoredVariable(
                        None, opened.global_attrs, opened.companions)
            elif isinstance(value, np.ndarray) and name == plan.call.op.array_inputs[0]:
                # the first input lazy makes the result lazy; the others stay concrete, as the
                # other doors pass small ones (GatherNd then knows which labels its points pick)
                arrays[name] = da.from_array(value, chunks=-1 if value.ndim else ())
        inline = plan.transmission == "value" or plan.inline_only  # as _check_size decides
        settings = {"max_blocks": "max_graph_blocks", "max_tasks": "max_graph_tasks",
                    "max_bytes": "max_inline_bytes" if inline else "max_upload_bytes"}
        try:
            with _limits.limits(max_blocks=self.max_graph_blocks, max_tasks=self.max_graph_tasks,
                                max_bytes=self.max_inline_bytes if inline else self.store.max_upload_bytes):
                result = plan.call.with_arrays(arrays).run(scratch=scratch)
                if dask.is_dask_collection(result.data):  # a HighLevelGraph's length materialises no layer
                    _limits.check(plan.process_id, result.data.npartitions, len(result.data.__dask_graph__()))
        except _limits.LimitExceeded as error:
            setting = settings[error.limit]
            detail = f"{error} (the service's {setting} setting, CHUNKED_TENSOR_OPS_{setting.upper()})"
            if error.limit == "max_bytes" and inline:  # worded as _check_size words it, known sooner
                raise too_large(f"the result is {error.count} bytes, over the {error.allowed}-byte inline limit "
                                f"({setting}, CHUNKED_TENSOR_OPS_{setting.upper()}); {self._size_hint(plan)}") from None
            if error.limit == "max_bytes":
                raise too_large(detail) from None
            raise ServiceError(400, INVALID_PARAMETER, detail) from None
        self._check_size(plan, result)
        return StoredVariable(result, first.global_attrs, first.companions,
                              None if first.array is None else str(first.array.name))

    @contextlib.contextmanager
    def _job_scratch(self, plan: JobPlan):
        """The job's scratch location (see ``_build_with_scratch``), removed when the job ends."""
        scratch, remove = self._as_service_error(self.store.scratch, f"job-{plan.job_id}-")
        try:
            yield scratch
        finally:
            remove()

    def _build_with_scratch(self, plan: JobPlan, scratch: dict) -> StoredVariable:
        """``build`` with the job's own scratch location, passed to the operator (builds of
        concurrent jobs share nothing)."""
        return self.build(plan, scratch)

    @staticmethod
    def _size_hint(plan: JobPlan) -> str:
        """How to get a result past the inline limit."""
        if not plan.inline_only:
            return "ask for outputs.result.transmissionMode \"reference\" and download /arrays/NAME"
        return ("upload the inputs with PUT /arrays/NAME, pass their href and ask for transmissionMode "
                "\"reference\", so the cluster computes it")

    def _check_size(self, plan: JobPlan, result: xr.DataArray) -> None:
        """Refuse a result the service would have to hold (inline value, or computed from
        inline inputs in its own process) past the inline limit, and any result past the
        upload limit."""
        nbytes = math.prod(result.shape) * np.dtype(result.dtype).itemsize
        if plan.transmission == "value" or plan.inline_only:
            if nbytes > self.max_inline_bytes:
                raise too_large(f"the result is {nbytes} bytes, over the {self.max_inline_bytes}-byte inline "
                                f"limit; {self._size_hint(plan)}")
        elif nbytes > self.store.max_upload_bytes:
            raise too_large(f"the result would be {nbytes} bytes, over the {self.store.max_upload_bytes}-byte "
                            "limit of a stored array")

    # --- running --------------------------------------------------------------------------
    #
    # Background jobs run on at most ``max_jobs`` threads (started as jobs come, then kept), which
    # take them from one queue; at most ``max_queued_jobs`` more wait there, and one past that is
    # refused before it is recorded: the service's threads and memory stay bounded whatever the
    # clients submit. Every execution, synchronous or not, has a _Control in ``_running`` while it
    # is here, so that a dismiss, a client that goes away and the shutdown can stop its tasks.

    def run_sync(self, plan: JobPlan):
        """Run a request to the end (blocking). Returns a NumPy array (value) or None
        (reference: the result is stored under ``plan.result_name``). ``stop`` (a dismiss, the
        client gone) cancels its tasks: 409, nothing stored."""
        control = self._enter(plan.job_id, _Control())
        try:
            self.records.create(plan.job_id, plan.process_id, plan.reads, plan.result_name, plan.transmission,
                                status="running", response=plan.response)
            try:
                return self._run_sync(plan)
            except Dismissed:
                if self._stopping.is_set():  # records.mark_interrupted() fails the record
                    raise ServiceError(500, JOB_FAILED, INTERRUPTED) from None
                self.records.finish(plan.job_id, "dismissed", control.why)
                raise conflict(f"job {plan.job_id} was stopped ({control.why}); nothing was stored") from None
            except Exception as error:
                if self._stopping.is_set():
                    raise
                answer = self._record_failure(plan.job_id, error)
                if answer is error:
                    raise
                raise answer from None
        finally:
            self._leave(plan.job_id, control)

    def _run_sync(self, plan: JobPlan):
        self._check_inputs(plan)
        with self._job_scratch(plan) as scratch:
            result = self._as_service_error(self._build_with_scratch, plan, scratch)
            if plan.transmission == "value":
                value = self._as_service_error(self._compute_value, plan, result)
                self.records.finish(plan.job_id, "successful", "done: the result was returned inline", progress=100)
                return value
            self._as_service_error(self._store_result, plan, result)
        self.records.finish(plan.job_id, "successful", f"done: stored as array {plan.result_name!r}", progress=100)
        return None

    def submit(self, plan: JobPlan, *, subscriber: str | None = None, base_url: str | None = None) -> None:
        """Record the job and queue it for the job threads. 503 (with Retry-After) when
        ``max_jobs + max_queued_jobs`` jobs are running or queued; 404 when an input was deleted
        since the plan (the job is then forgotten). ``subscriber`` (JSON) and ``base_url`` are
        kept with the job's record, for its callbacks."""
        with self._lock:
            waiting = sum(1 for control in self._running.values() if control.background)
            if waiting >= self.max_jobs + self.max_queued_jobs:
                raise ServiceError(
                    503, TOO_MANY_JOBS,
                    f"{waiting} jobs are running or queued, as many as this service takes (max_jobs "
                    f"{self.max_jobs} + max_queued_jobs {self.max_queued_jobs}; the operator sets them with "
                    "CHUNKED_TENSOR_OPS_MAX_JOBS and CHUNKED_TENSOR_OPS_MAX_QUEUED_JOBS); submit it again later",
                    headers={"Retry-After": str(RETRY_AFTER_SECONDS)})
            control = self._running[plan.job_id] = _Control(background=True)
        try:
            self.records.create(plan.job_id, plan.process_id, plan.reads, plan.result_name, plan.transmission,
                                response=plan.response, subscriber=subscriber, base_url=base_url)
            try:
                self._check_inputs(plan)
            except ServiceError:
                self.records.delete(plan.job_id)
                raise
        except BaseException:
            self._leave(plan.job_id, control)
            raise
        self._queue.put(plan)
        with self._lock:
            if len(self._workers) < self.max_jobs:
                worker = threading.Thread(target=self._work, name=f"job-{len(self._workers)}", daemon=True)
                self._workers.append(worker)
                worker.start()

    def _work(self) -> None:
        """A job thread: the queued jobs one after the other, until told to end (None)."""
        while (plan := self._queue.get()) is not None:
            try:
                self._run_job(plan)
            except Exception:  # e.g. its failure could not be recorded: the thread serves the next
                log.exception("job %s: its outcome was not recorded", plan.job_id)

    def _run_job(self, plan: JobPlan) -> None:
        with self._lock:
            control = self._running.get(plan.job_id)
            if control is None:  # dismissed while it waited, or the service is stopping
                return
            control.started = True
        try:
            # Normally free (there are as many job threads as slots); a test holds them to keep
            # jobs waiting. Not past a dismiss.
            while not self._slots.acquire(timeout=POLL_SECONDS):
                if control.dismissed.is_set():
                    raise Dismissed
            try:
                if control.dismissed.is_set():
                    raise Dismissed
                self.records.update(plan.job_id, status="running", started=now(), message="building the graph")
                with self._job_scratch(plan) as scratch:
                    result = self._as_service_error(self._build_with_scratch, plan, scratch)
                    self.records.update(plan.job_id, message="running on the cluster")
                    self._as_service_error(self._store_result, plan, result)
            finally:
                self._slots.release()
            self.records.finish(plan.job_id, "successful", f"done: stored as array {plan.result_name!r}",
                                progress=100)
        except Dismissed:
            if not self._stopping.is_set():  # else records.mark_interrupted() says so
                self.records.finish(plan.job_id, "dismissed", control.why)
        except Exception as error:
            if self._stopping.is_set():  # cut short by the shutdown: records.mark_interrupted() says so
                return
            if not isinstance(error, ServiceError) and not disk_full(error):
                log.exception("job %s failed", plan.job_id)  # a failure of the service itself
            elif isinstance(error, ServiceError) and error.full != error.detail:  # what its record must not say
                log.warning("job %s: %s", plan.job_id, error.full)
            self._record_failure(plan.job_id, error)
        finally:
            self._leave(plan.job_id, control)

    def _record_failure(self, job_id: str, error: Exception) -> Exception:
        """Record ``error`` as the job's failure; returns the error to answer with (a full disk
        as a 507)."""
        if disk_full(error):  # e.g. the job records, on the same full disk
            error = insufficient_storage(error)
        if isinstance(error, ServiceError):
            self.records.finish(job_id, "failed", error.detail, error_status=error.status, error_type=error.type)
        else:
            self.records.finish(job_id, "failed", f"{type(error).__name__}: {error}", error_status=500,
                                error_type=JOB_FAILED)
        return error

    def _check_inputs(self, plan: JobPlan) -> None:
        """404 if an input was deleted between the plan and the job's record (from the record
        on, a delete is refused: ``JobRecords.unused``)."""
        for name in plan.reads:
            if not self.store.exists(name):
                raise no_such_array(name)

    def _enter(self, job_id: str, control: _Control) -> _Control:
        with self._lock:
            self._running[job_id] = control
        return control

    def _leave(self, job_id: str, control: _Control) -> None:
        with self._lock:
            if self._running.get(job_id) is control:
                del self._running[job_id]
        control.finished.set()

    def stop(self, job_id: str, why: str = DISMISSED) -> None:
        """Tell an execution of this process to stop: its tasks are cancelled within moments
        (``_wait``), and it ends as dismissed, saying ``why``. A queued job ends at once and
        never runs (its record is the caller's)."""
        with self._lock:
            control = self._running.get(job_id)
            if control is None:
                return
            control.why = why
            control.dismissed.set()
            if control.background and not control.started:
                del self._running[job_id]
                control.finished.set()

    def dismiss(self, job_id: str, wait: float = 30.0) -> None:
        """Cancel an execution's tasks and wait (bounded) until its partial output is gone."""
        control = self._running.get(job_id)
        if control is not None:  # running here: stop it and wait for its cleanup
            self.stop(job_id)
            control.finished.wait(wait)
        self.records.finish(job_id, "dismissed", DISMISSED)

    def shutdown(self, wait: float = 5.0) -> None:
        """The service is stopping: queued jobs never start, and every execution is stopped
        (its tasks cancelled) and waited for, ``wait`` seconds at most. Their records stay
        active, for ``JobRecords.mark_interrupted`` to fail them with a message saying so."""
        self._stopping.set()
        with self._lock:
            controls = list(self._running.items())
            workers = len(self._workers)
        for job_id, _ in controls:
            self.stop(job_id, "the service is stopping")
        for _ in range(workers):
            self._queue.put(None)
        deadline = time.monotonic() + wait
        for _, control in controls:
            control.finished.wait(max(0.0, deadline - time.monotonic()))

    # --- steps ----------------------------------------------------------------------------

    def _as_service_error(self, step, *args):
        """Run a step, turning operator errors into 400s, cluster loss into 503s and a full
        data root into 507s."""
        try:
            return step(*args)
        except (InvalidArgument, IndexError) as error:
            raise ServiceError(400, INVALID_PARAMETER, str(error)) from None
        except (ServiceError, Dismissed):
            raise
        except CancelledError:
            raise Dismissed from None
        except OSError as error:
            if disk_full(error):
                raise insufficient_storage(error) from None
            raise

    def _compute_value(self, plan: JobPlan, built: StoredVariable) -> np.ndarray:
        """The result's values as a stored result of it would download: packed as its input was
        (a packed input's missing values as its fill value)."""
        result = built.array
        data = xr.conventions.encode_cf_variable(result.variable).data if result.encoding else result.data
        if plan.inline_only:  # small and already here: compute in this thread
            return np.asarray(dask.compute(data, scheduler="sync")[0])
        client = self.cluster.live_client()
        return self._wait(plan.job_id, client, client.compute(data))

    def _store_result(self, plan: JobPlan, outcome: StoredVariable) -> None:
        result = outcome.array
        variable = outcome.variable or plan.result_name
        check_variable_dims(variable, result.dims, "the result's variable" if outcome.variable
                            else "outputs.result.name")  # before anything is computed
        # The result counts against the disk quota as an upload does, held from before anything
        # is computed until it is published (413 now if it would pass the quota).
        release = self.store.hold_quota(plan.result_name, uncompressed_bytes(result, outcome.companions),
                                        overwrite=False)
        built = self.store.new_version(f"job-{plan.job_id}-")  # the workers write here directly
        try:
            if plan.inline_only:  # one small block, computed here and stored in chunks
                value = result.copy(data=result.data.compute(scheduler="sync"))
                chunks = stream_chunks(value.shape, np.dtype(value.dtype).itemsize, self.store.chunk_bytes)
                arr = value.chunk(dict(zip(value.dims, chunks))) if value.ndim else value.chunk()
            else:
                arr = result.chunk(dict(zip(result.dims, zarr_chunks(result.data.chunks)))) if result.ndim else result
            fill = self.store.write_skeleton(built, arr, tuple(c[0] for c in arr.chunks) if arr.ndim else (),
                                             variable, outcome.global_attrs, outcome.companions)
            if plan.inline_only:
                dask.compute(fill, scheduler="threads")
            else:
                client = self.cluster.live_client()
                future = client.compute(fill)
                self._wait(plan.job_id, client, future)
            control = self._running.get(plan.job_id)
            if control is not None and control.dismissed.is_set():
                raise Dismissed  # dismissed while it ran: its result never appears
            self.store.publish(built, plan.result_name, overwrite=False)
        finally:
            remove_partial(built, self.store.discard)
            release()

    def _wait(self, job_id: str, client, future: Future):
        """Wait for ``future``, recording progress from the scheduler (``service.jobs.runner``,
        the loop ``chunked-tensor-ops run`` waits with too); cancel on dismiss. A scheduler
        that stops answering (frozen: its connections stay open) fails the job after
        ``cluster.patience`` seconds of silence."""
        control = self._running.get(job_id)
        dismissed = control.dismissed if control is not None else None
        bound = self.cluster.settings.scheduler_timeout
        recorded = [-1]

        def record(done: int, total: int) -> None:
            percent = min(99, int(100 * done / max(total, 1)))
            if percent != recorded[0]:
                try:
                    self.records.update(job_id, progress=percent)
                    recorded[0] = percent
                except Exception as error:  # e.g. the disk is full: the job goes on
                    log.warning("job %s: progress not recorded: %s", job_id, error)

        try:
            try:
                wait_with_progress(
                    client, future, tracker=job_id, bound=bound, patience=self.cluster.patience, on_progress=record,
                    on_no_progress=lambda error: log.warning("no progress for job %s yet: %s", job_id, error),
                    should_stop=dismissed.is_set if dismissed is not None else None, poll=POLL_SECONDS)
            except Stopped:
                raise Dismissed from None
            except SchedulerSilent as silent:
                raise ClusterUnavailable(f"the Dask scheduler has not answered for {silent.seconds:.0f} s; the job "
                                         "was given up", f"{silent}; the job was given up") from None
            if future.status == "error":
                error = future.exception()
                if isinstance(error, (InvalidArgument, IndexError)):
                    raise error
                if disk_full(error):
                    raise insufficient_storage(error)
                unavailable = self.store.storage_error(error)  # a worker lost the object store
                if unavailable is not None:
                    raise unavailable
                raise ServiceError(500, JOB_FAILED, f"the computation failed: {type(error).__name__}: {error}")
            if future.status == "cancelled":
                raise ServiceError(503, "https://chunked-tensor-ops.readthedocs.io/exceptions/cluster-unavailable",
                                   "the computation was cancelled by the cluster")
            return future.result()
        except (OSError, TimeoutError) as error:
            raise ClusterUnavailable("lost the Dask cluster", f"lost the Dask cluster: {error}") from None
        finally:
            given_up = future.status == "pending" and client.status == "running"  # an error here
            if future.status == "error" or given_up or (dismissed is not None and dismissed.is_set()):
                # failed, dismissed or given up on: stop the job's other tasks before its output
                # is removed (a future the cluster cancelled has none left to stop)
                drain(client, future, bound=bound)
