"""Job records in an embedded SQLite database under the data root (``jobs.sqlite``).

They survive restarts: a new service lists the earlier jobs, and marks the ones that were
accepted or running when the old one stopped as failed.

They survive a crash too (the service killed with SIGKILL, or dying, mid-write): the database
is in write-ahead-log mode (``journal_mode=WAL``, kept in the file) with ``synchronous=NORMAL``
on every connection, and every write is one explicit ``BEGIN IMMEDIATE`` ... ``COMMIT``
transaction. A write that returned is in the WAL, which the next connection replays; one cut
short is rolled back, never half applied. (NORMAL syncs the WAL at checkpoints only: a power
loss may forget the last commits, a process crash forgets nothing; FULL would fsync every
commit.) Each method opens its own connection and closes it before returning; besides them one
idle connection stays open as long as the ``JobRecords`` (``close()``): while any connection is
open SQLite keeps the WAL and its index (``-wal``, ``-shm``), so on a full disk the records can
still be read (writes fail with "database or disk is full") instead of every new connection
failing to re-create the index ("disk I/O error").
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
import threading
import weakref
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

from service.errors import JOB_FAILED

ACTIVE = ("accepted", "running")
_COLUMNS = ("id", "process_id", "status", "message", "created", "started", "finished", "updated",
            "progress", "reads", "writes", "transmission", "error_status", "error_type")
BUSY_TIMEOUT_S = 30


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class JobRecords:
    """One row per job; every method is a short blocking transaction on its own connection."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._lock = threading.Lock()  # one writer of this process at a time (SQLite allows one anyway)
        with self._connect() as db:
            mode = db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise RuntimeError(f"{self.path}: SQLite refused write-ahead logging (journal_mode={mode})")
        with self._write() as db:
            db.execute(
                "CREATE TABLE IF NOT EXISTS jobs (id TEXT PRIMARY KEY, process_id TEXT NOT NULL, "
                "status TEXT NOT NULL, message TEXT, created TEXT, started TEXT, finished TEXT, "
                "updated TEXT, progress INTEGER, reads TEXT NOT NULL, writes TEXT, transmission TEXT, "
                "error_status INTEGER, error_type TEXT)"
            )
            db.execute("CREATE INDEX IF NOT EXISTS jobs_created ON jobs (created)")
        # Idle, holding no lock (so checkpoints go on): it only keeps -wal and -shm in place.
        self._keeper = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None,
                                       check_same_thread=False)
        self._keeper.execute("SELECT count(*) FROM jobs").fetchall()
        weakref.finalize(self, self._keeper.close)

    def close(self) -> None:
        """Close the idle connection (the records stay usable, one connection per call)."""
        self._keeper.close()

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        """A connection (autocommit: transactions are explicit), closed on exit."""
        db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        try:
            db.row_factory = sqlite3.Row
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_S * 1000}")
            yield db
        finally:
            db.close()

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction: committed when the block ends, rolled back if it raises."""
        with self._lock, self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    def _row(self, row) -> dict:
        job = dict(row)
        job["reads"] = json.loads(job["reads"])
        return job

    def create(self, job_id: str, process_id: str, reads: list[str], writes: str | None,
               transmission: str, status: str = "accepted") -> dict:
        stamp = now()
        with self._write() as db:
            db.execute(
                "INSERT INTO jobs (id, process_id, status, message, created, started, updated, progress, reads, "
                "writes, transmission) VALUES (?, ?, ?, ?, ?, ?, ?, 0, ?, ?, ?)",
                (job_id, process_id, status, "queued" if status == "accepted" else "running", stamp,
                 stamp if status == "running" else None, stamp, json.dumps(reads), writes, transmission),
            )
        return self.get(job_id)

    def update(self, job_id: str, **fields) -> None:
        unknown = set(fields) - set(_COLUMNS)
        if unknown:
            raise KeyError(unknown)
        fields["updated"] = now()
        assignments = ", ".join(f"{k} = ?" for k in fields)
        with self._write() as db:
            db.execute(f"UPDATE jobs SET {assignments} WHERE id = ?", (*fields.values(), job_id))

    def finish(self, job_id: str, status: str, message: str, **fields) -> None:
        """Move an active job to a final status (a job already final keeps its status)."""
        unknown = set(fields) - set(_COLUMNS)
        if unknown:
            raise KeyError(unknown)
        stamp = now()
        assignments = "".join(f", {k} = ?" for k in fields)
        with self._write() as db:
            db.execute(
                f"UPDATE jobs SET status = ?, message = ?, finished = ?, updated = ?{assignments} "
                "WHERE id = ? AND status IN ('accepted', 'running')",
                (status, message, stamp, stamp, *fields.values(), job_id),
            )

    def get(self, job_id: str) -> dict | None:
        with self._connect() as db:
            row = db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return self._row(row) if row else None

    def list(self, process_id: str | None = None, status: list[str] | None = None, limit: int = 1000) -> list[dict]:
        query, args = "SELECT * FROM jobs WHERE 1", []
        if process_id:
            query += " AND process_id = ?"
            args.append(process_id)
        if status:
            query += f" AND status IN ({', '.join('?' * len(status))})"
            args.extend(status)
        query += " ORDER BY created DESC, id LIMIT ?"
        args.append(limit)
        with self._connect() as db:
            return [self._row(r) for r in db.execute(query, args).fetchall()]

    def busy_with(self, name: str) -> str | None:
        """The id of an active job that reads or writes array ``name``, if any."""
        for job in self.list(status=list(ACTIVE)):
            if name in job["reads"] or job["writes"] == name:
                return job["id"]
        return None

    def mark_interrupted(self) -> int:
        """Jobs left active by a service that stopped: failed, saying so."""
        stamp = now()
        with self._write() as db:
            cursor = db.execute(
                "UPDATE jobs SET status = 'failed', message = ?, finished = ?, updated = ?, error_status = 500, "
                "error_type = ? WHERE status IN ('accepted', 'running')",
                ("interrupted: the service stopped while the job was running; submit it again", stamp, stamp,
                 JOB_FAILED),
            )
            return cursor.rowcount
