"""The retention sweeper: a thread of the service that deletes expired jobs (finished longer
than ``job_retention_seconds`` ago) together with their stored results, every
``job_sweep_interval`` seconds and once when the service starts.

Each job goes in one step (``JobRecords.expire``): its result array is deleted within the
transaction that deletes its record, so a failed deletion leaves both for the next sweep. A job
still running never expires; a result that a running job reads is left until it is done; a
download already under way reads to its end (the store deletes the files when its last reader
lets go).
"""

from __future__ import annotations

import logging
import threading

from service.jobs.records import JobRecords
from service.storage.protocol import ArrayStorage

log = logging.getLogger(__name__)


class Sweeper:
    """Deletes the expired jobs of ``records`` and their results in ``store``.

    Parameters
    ----------
    records : JobRecords
        The job records; their ``retention_seconds`` says when a job expires.
    store : ArrayStorage
        Where the jobs' results are stored.
    interval : float
        Seconds between sweeps.
    """

    def __init__(self, records: JobRecords, store: ArrayStorage, interval: float):
        self.records, self.store, self.interval = records, store, interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sweep(self) -> int:
        """One sweep: every job expired by now, with its result; how many went."""
        swept = 0
        for job in self.records.expired():
            try:
                swept += self.records.expire(job["id"], self._remove)
            except Exception as error:  # e.g. the store is unreachable: both stay, the next sweep tries again
                log.warning("expired job %s was not deleted: %s", job["id"], error)
        return swept

    def _remove(self, name: str) -> None:
        if self.store.exists(name):
            self.store.delete(name)

    def start(self) -> Sweeper:
        self._thread = threading.Thread(target=self._run, name="retention-sweeper", daemon=True)
        self._thread.start()
        return self

    def stop(self, wait: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(wait)

    def _run(self) -> None:
        while True:
            try:
                swept = self.sweep()
                if swept:
                    log.info("deleted %d expired job(s) and their results", swept)
            except Exception:  # the records unreadable for a moment: the next sweep
                log.exception("the sweep of expired jobs failed")
            if self._stop.wait(self.interval):
                return
