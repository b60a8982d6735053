"""Waiting for a computation on the cluster, with its progress: one loop for the service's jobs
and for ``chunked-tensor-ops run``.

Every call to the scheduler is bounded. A scheduler that stops answering (frozen: its
connections stay open, so only silence tells) is given up after ``patience`` seconds; the
progress tracker on the scheduler is removed however the wait ends.
"""

from __future__ import annotations

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
                       on_progress: Callable[[int, int], None], on_start: Callable[[int], None] | None = None,
                       on_no_progress: Callable[[BaseException], None] | None = None,
                       should_stop: Callable[[], bool] | None = None, poll: float = 0.1) -> None:
    """Wait until ``future`` is done, reporting ``on_progress(done, total)`` tasks from the
    scheduler's own count.

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
    on_progress : callable
        ``on_progress(done, total)``, each time the scheduler answers with a count.
    on_start : callable, optional
        ``on_start(total)`` once tracking has begun.
    on_no_progress : callable, optional
        ``on_no_progress(error)`` when tracking could not begin (the wait goes on).
    should_stop : callable, optional
        Checked before every poll, and once more when the future is done (a stop that raced
        the last task wins): True cancels the computation and raises ``Stopped``.
    poll : float
        Seconds between counts (a finished future ends the wait at once).
    """
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
        finished = threading.Event()  # wakes the loop at once when the result is ready
        future.add_done_callback(lambda _: finished.set())
        while True:
            if should_stop is not None and should_stop():
                client.cancel([future], force=True)
                raise Stopped
            if future.done():
                return
            try:  # also the scheduler's sign of life (None when it does not track the computation)
                counts = client.run_on_scheduler(progress.count, job_id=tracker, callback_timeout=bound)
                answered = time.monotonic()
            except Exception as error:
                silent = time.monotonic() - answered
                if silent > patience and not future.done():
                    raise SchedulerSilent(silent, error) from None
            else:
                if counts:
                    total, left = counts
                    on_progress(total - left, total)
            finished.wait(poll)
    finally:
        try:
            client.run_on_scheduler(progress.stop, job_id=tracker, callback_timeout=bound)
        except Exception:
            pass
