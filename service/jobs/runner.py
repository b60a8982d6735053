"""Waiting for a computation on the cluster, with its progress: one loop for the service's jobs
and for ``chunked-tensor-ops run``.

Every call to the scheduler is bounded. A scheduler that stops answering (frozen: its
connections stay open, so only silence tells) is given up after ``patience`` seconds; the
progress tracker on the scheduler is removed however the wait ends. ``drain`` cancels a
computation and waits until none of its tasks still runs on a worker; ``remove_partial``
removes what a stopped computation wrote, now and again later.
"""

from __future__ import annotations

import heapq
import itertools
import shutil
import threading
import time
from collections.abc import Callable

from distributed import Future

from service.jobs import progress


class SchedulerSilent(Exception):
    """The scheduler has not answered for ``seconds`` (the last call failed with ``error``)."""

    def __init__(self, seconds: float, error: BaseException):
        super().__init__(f"the Dask scheduler has not answered for {seconds:.0f} s ({type(error).__name__}: {error})")
        self.seconds, self.error = seconds, error


class Stopped(Exception):
    """``should_stop()`` said so: the computation was cancelled."""


def wait_with_progress(client, future: Future, *, tracker: str, bound: float, patience: float,
                       on_progress: Callable[[int, int], None] | None,
                       on_start: Callable[[int], None] | None = None,
                       on_no_progress: Callable[[BaseException], None] | None = None,
                       should_stop: Callable[[], bool] | None = None, poll: float = 0.1) -> None:
    """Wait until ``future`` is done, reporting ``on_progress(done, total)`` tasks from the
    scheduler's own count, or only checking that the scheduler answers (``on_progress`` None).

    Parameters
    ----------
    client : distributed.Client
    future : distributed.Future
        The computation; its outcome (finished, error, cancelled) is the caller's to read.
    tracker : str
        A name for the progress tracker on the scheduler, unique among running computations.
    bound : float
        Seconds any one call to the scheduler may take.
    patience : float
        Seconds of scheduler silence after which the wait is given up (``SchedulerSilent``).
    on_progress : callable or None
        ``on_progress(done, total)``, each time the scheduler answers with a count. None: no
        progress is tracked (nothing runs on the scheduler per task, and each poll only asks
        the scheduler for its identity).
    on_start : callable, optional
        ``on_start(total)`` once tracking has begun (never without ``on_progress``).
    on_no_progress : callable, optional
        ``on_no_progress(error)`` when tracking could not begin (the wait goes on).
    should_stop : callable, optional
        Checked before every poll, and once more when the future is done (a stop that raced
        the last task wins): True cancels the computation and raises ``Stopped``.
    poll : float
        Seconds between counts (a finished future ends the wait at once).
    """
    if on_progress is None:  # nothing to show: ask only whether the scheduler answers
        _poll_until_done(client, future, lambda: client.sync(client.scheduler.identity, callback_timeout=bound),
                         patience=patience, should_stop=should_stop, poll=poll)
        return
    answered = time.monotonic()
    try:
        try:
            total = client.run_on_scheduler(progress.start, key=future.key, job_id=tracker, callback_timeout=bound)
            answered = time.monotonic()
            if on_start is not None:
                on_start(total)
        except Exception as error:  # progress is a courtesy; the computation goes on without it
            # (a start that timed out here may still have begun tracking on a busy scheduler:
            # the counts below then report progress, and the stop below removes the tracker)
            if on_no_progress is not None:
                on_no_progress(error)

        def counted(counts) -> None:  # None when the scheduler does not track the computation
            if counts:
                total, left = counts
                on_progress(total - left, total)

        # the counts are also the scheduler's sign of life
        _poll_until_done(client, future, lambda: client.run_on_scheduler(progress.count, job_id=tracker,
                                                                         callback_timeout=bound),
                         patience=patience, should_stop=should_stop, poll=poll, answered=answered, on_answer=counted)
    finally:
        try:
            client.run_on_scheduler(progress.stop, job_id=tracker, callback_timeout=bound)
        except Exception:
            pass


def _poll_until_done(client, future: Future, ask: Callable[[], object], *, patience: float,
                     should_stop: Callable[[], bool] | None, poll: float, answered: float | None = None,
                     on_answer: Callable[[object], None] | None = None) -> None:
    """Call ``ask()`` (a bounded call to the scheduler) every ``poll`` seconds until ``future``
    is done, and ``on_answer`` with each answer; ``SchedulerSilent`` once no call has
    succeeded for ``patience`` seconds since ``answered`` (default now), ``Stopped`` when
    ``should_stop()``."""
    answered = time.monotonic() if answered is None else answered
    finished = threading.Event()  # wakes the loop at once when the result is ready
    future.add_done_callback(lambda _: finished.set())
    while True:
        if should_stop is not None and should_stop():
            client.cancel([future], force=True)
            raise Stopped
        if future.done():
            return
        try:
            answer = ask()
            answered = time.monotonic()
        except Exception as error:
            silent = time.monotonic() - answered
            if silent > patience and not future.done():
                raise SchedulerSilent(silent, error) from None
        else:
            if on_answer is not None:
                on_answer(answer)
        finished.wait(poll)


def drain(client, future: Future, timeout: float = 10.0, bound: float | None = None) -> None:
    """Cancel the job's remaining tasks and wait until none still runs, so that no worker
    writes into the directory that is about to be removed. A worker finishes a task it was
    executing when the scheduler released it: such a task runs on a worker while the
    scheduler no longer has it processing."""
    # Local functions: pickled by value, so workers and a scheduler without this package run them.
    def running_keys(dask_worker) -> list:
        state = dask_worker.state  # executing and seceded tasks, cancelled ones included
        return [ts.key for ts in (*state.executing, *state.long_running)]

    def processing_keys(dask_scheduler) -> list:
        return [ts.key for ts in dask_scheduler.tasks.values() if ts.state == "processing"]

    deadline = time.monotonic() + timeout
    try:
        client.cancel([future], force=True)
    except Exception:
        return
    while time.monotonic() < deadline:
        try:
            # workers first, then the scheduler; each call bounded (the scheduler may be gone)
            running = client.run(running_keys, callback_timeout=bound)
            processing = set(client.run_on_scheduler(processing_keys, callback_timeout=bound))
        except Exception:
            return
        if all(key in processing for keys in running.values() for key in keys):
            return
        time.sleep(0.05)


# When to look again for a cancelled job's partial output (seconds after its removal).
RESWEEP_SECONDS = (1.0, 5.0)


def remove_partial(path, remove=None) -> None:
    """Remove a job's partial output now, and again a little later.

    Cancelling a job does not recall a task the scheduler has already sent to a worker: it can
    still write its chunk after the job's cleanup, and Zarr recreates the directories it writes
    into. Such a task finishes within moments, so two later looks remove what it left (the
    start-up sweep of tmp/ is the last resort). After a successful publish ``path`` is gone
    (or, in an object store, marked published) and the later looks find nothing to remove.
    ``remove(path)`` (default: remove the local directory) must not raise. The later looks are
    one thread's, whatever the number of jobs.
    """
    remove = remove or (lambda where: shutil.rmtree(where, ignore_errors=True))
    remove(path)
    global _sweeper
    with _later_ready:
        for delay in RESWEEP_SECONDS:
            heapq.heappush(_later, (time.monotonic() + delay, next(_order), remove, path))
        if _sweeper is None:
            _sweeper = threading.Thread(target=_sweep_later, name="job-output-resweep", daemon=True)
            _sweeper.start()
        _later_ready.notify()


_later: list = []  # (when, order, remove, path), soonest first
_later_ready = threading.Condition()
_order = itertools.count()
_sweeper: threading.Thread | None = None


def _sweep_later() -> None:
    while True:
        with _later_ready:
            while not _later or _later[0][0] > time.monotonic():
                _later_ready.wait(_later[0][0] - time.monotonic() if _later else None)
            _, _, remove, path = heapq.heappop(_later)
        try:
            remove(path)
        except Exception:  # it must not raise; if it does, the later looks of other jobs go on
            pass
