"""Job records in an embedded SQLite database under the data root (``jobs.sqlite``).

They survive restarts: a new service lists the earlier jobs, and marks the ones that were
accepted or running when the old one stopped as failed.

They do not pile up. A finished job (successful, failed, dismissed) expires ``retention_seconds``
after it finished (``expires``): ``expire`` then deletes its record together with its stored
result, in one transaction (``service.jobs.sweeper`` does so periodically in the service).
Past ``max_records``, the records of the oldest finished jobs are deleted when the records are
opened and whenever a job is recorded; only the record goes then, its result stays an array.

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
from datetime import datetime, timedelta, timezone
from pathlib import Path

from service.errors import JOB_FAILED

ACTIVE = ("accepted", "running")
_ACTIVE_SQL = "('accepted', 'running')"
INTERRUPTED = "interrupted: the service stopped while the job was running; submit it again"
_COLUMNS = ("id", "process_id", "status", "message", "created", "started", "finished", "updated",
            "progress", "reads", "writes", "transmission", "error_status", "error_type", "response", "outputs",
            "subscriber", "base_url")
BUSY_TIMEOUT_S = 30


# Columns added after the first release, as (name, SQL type): a database made before them gets
# them on opening (ALTER TABLE ... ADD COLUMN; its earlier rows read NULL), so it stays usable.
_ADDED_COLUMNS = (("response", "TEXT"),
                  ("outputs", "TEXT"),  # the echo process's outputs (JSON), kept with its job
                  # the execute request's subscriber (JSON) and the service's URL as its client
                  # saw it (the links of the job's callbacks)
                  ("subscriber", "TEXT"), ("base_url", "TEXT"))


def _add_missing_columns(db: sqlite3.Connection) -> None:
    present = {row[1] for row in db.execute("PRAGMA table_info(jobs)")}
    for name, kind in _ADDED_COLUMNS:
        if name not in present:
            db.execute(f"ALTER TABLE jobs ADD COLUMN {name} {kind}")


def _stamp(moment: datetime) -> str:
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_stamp(stamp: str) -> datetime:
    """A time as the records store it, as an aware datetime."""
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def now(ago: float = 0.0) -> str:
    """The time ``ago`` seconds before now, as the records store it (ISO 8601 UTC, in ms)."""
    return _stamp(datetime.now(timezone.utc) - timedelta(seconds=ago))


class JobRecords:
    """One row per job; every method is a short blocking transaction on its own connection.

    ``retention_seconds`` and ``max_records`` (None: no bound) bound the records of finished
    jobs (see the module's description)."""

    def __init__(self, path: Path, *, retention_seconds: float | None = None, max_records: int | None = None):
        self.path = Path(path)
        self.retention_seconds = retention_seconds
        self.max_records = max_records
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
            db.execute("CREATE INDEX IF NOT EXISTS jobs_status ON jobs (status)")
            db.execute("CREATE INDEX IF NOT EXISTS jobs_finished ON jobs (finished)")
            _add_missing_columns(db)
            self._prune(db)
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
        job["expires"] = self.expires(job)
        return job

    def create(self, job_id: str, process_id: str, reads: list[str], writes: str | None,
               transmission: str, status: str = "accepted", *, response: str | None = None,
               subscriber: str | None = None, base_url: str | None = None) -> dict:
        """Record a new job. ``response`` is the execute request's (raw or document): the
        form its results are served in; ``subscriber`` its callback URIs (JSON) and
        ``base_url`` the service's URL as the request reached it."""
        stamp = now()
        with self._write() as db:
            db.execute(
                "INSERT INTO jobs (id, process_id, status, message, created, started, updated, progress, reads, "
                "writes, transmission, response, subscriber, base_url) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, 0, ?, ?, ?, ?, ?, ?)",
                (job_id, process_id, status, "queued" if status == "accepted" else "running", stamp,
                 stamp if status == "running" else None, stamp, json.dumps(reads), writes, transmission, response,
                 subscriber, base_url),
            )
            self._prune(db)
        return self.get(job_id)

    def delete(self, job_id: str) -> None:
        """Forget a job (one that was refused before it could start)."""
        with self._write() as db:
            db.execute("DELETE FROM jobs WHERE id = ?", (job_id,))

    def start(self, job_id: str) -> bool:
        """Move an accepted job to running (``started`` now); False when it is no longer
        accepted (dismissed while it waited)."""
        stamp = now()
        with self._write() as db:
            return db.execute("UPDATE jobs SET status = 'running', message = 'running', started = ?, updated = ? "
                              "WHERE id = ? AND status = 'accepted'", (stamp, stamp, job_id)).rowcount == 1

    def expires(self, job: dict) -> str | None:
        """When a job's record and stored result are deleted: ``retention_seconds`` after it
        finished (None while it is active, or with no retention)."""
        if self.retention_seconds is None or not job.get("finished") or job["status"] in ACTIVE:
            return None
        return _stamp(parse_stamp(job["finished"]) + timedelta(seconds=self.retention_seconds))

    def expired(self, limit: int = 1000) -> list[dict]:
        """Finished jobs past their expiry, the ones that finished first first."""
        if self.retention_seconds is None:
            return []
        with self._connect() as db:
            rows = db.execute(f"SELECT * FROM jobs WHERE status NOT IN {_ACTIVE_SQL} AND finished < ? "
                              "ORDER BY finished, id LIMIT ?", (now(self.retention_seconds), limit)).fetchall()
        return [self._row(row) for row in rows]

    def expire(self, job_id: str, remove) -> bool:
        """Delete an expired job: ``remove(name)`` deletes its stored result (it is called
        within the transaction that deletes the record, and must not call these records), then
        the record goes. Nothing is half deleted: when ``remove`` raises, the record stays (and
        the error propagates); while an active job reads or writes the result, neither goes
        (False). A result name that a later job wrote too is that job's: only the record goes."""
        with self._write() as db:
            job = db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if (job is None or self.retention_seconds is None or job["status"] in ACTIVE
                    or not job["finished"] or job["finished"] >= now(self.retention_seconds)):
                return False
            name = job["writes"]
            if name is not None:
                if self._busy_with(db, name) is not None:
                    return False
                later = db.execute("SELECT 1 FROM jobs WHERE writes = ? AND id != ? AND created >= ? LIMIT 1",
                                   (name, job_id, job["created"])).fetchone()
                if later is None:
                    remove(name)
            db.execute("DELETE FROM jobs WHERE id = ?", (job_id,))
            return True

    def prune(self) -> int:
        """Delete the records of the oldest finished jobs past ``max_records`` (as opening the
        records and recording a job do); how many went."""
        with self._write() as db:
            return self._prune(db)

    def _prune(self, db: sqlite3.Connection) -> int:
        removed = 0
        if self.max_records is not None:
            excess = db.execute("SELECT count(*) FROM jobs").fetchone()[0] - self.max_records
            if excess > 0:  # the ones that finished first (an active job is never pruned)
                removed += db.execute(
                    f"DELETE FROM jobs WHERE id IN (SELECT id FROM jobs WHERE status NOT IN {_ACTIVE_SQL} "
                    "ORDER BY finished, created, id LIMIT ?)", (excess,)).rowcount
        return removed

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

    def list(self, process_id: str | list[str] | None = None, status: list[str] | None = None, limit: int = 1000,
             *, offset: int = 0, created_from: str | None = None, created_to: str | None = None,
             min_duration: float | None = None, max_duration: float | None = None) -> list[dict]:
        """Jobs newest first, ``offset`` on, at most ``limit``: of these processes (one id or a
        list) and states; created within ``created_from`` .. ``created_to`` (inclusive, in the
        records' own form, ``now()``'s); whose duration in seconds is within ``min_duration`` ..
        ``max_duration`` (finished - started, or now - started while running: a job with no
        such duration, accepted or dismissed before it started, is left out)."""
        query, args = "SELECT * FROM jobs WHERE 1", []
        processes = [process_id] if isinstance(process_id, str) else list(process_id or [])
        if processes:
            query += f" AND process_id IN ({', '.join('?' * len(processes))})"
            args.extend(processes)
        if status:
            query += f" AND status IN ({', '.join('?' * len(status))})"
            args.extend(status)
        if created_from is not None:
            query += " AND created >= ?"
            args.append(created_from)
        if created_to is not None:
            query += " AND created <= ?"
            args.append(created_to)
        if min_duration is not None or max_duration is not None:
            duration = "(julianday(COALESCE(finished, ?)) - julianday(started)) * 86400.0"
            query += " AND started IS NOT NULL AND (finished IS NOT NULL OR status = 'running')"
            for bound, op in ((min_duration, ">="), (max_duration, "<=")):
                if bound is not None:
                    query += f" AND {duration} {op} ?"
                    args.extend([now(), bound])
        query += " ORDER BY created DESC, id LIMIT ? OFFSET ?"
        args.extend([limit, offset])
        with self._connect() as db:
            return [self._row(r) for r in db.execute(query, args).fetchall()]

    def busy_with(self, name: str) -> str | None:
        """The id of an active job that reads or writes array ``name``, if any (every active
        job is looked at, however many there are)."""
        with self._connect() as db:
            return self._busy_with(db, name)

    @contextlib.contextmanager
    def unused(self, name: str) -> Iterator[str | None]:
        """``busy_with(name)`` held true while the block runs: no job can be recorded meanwhile
        (``create`` waits), so a block that gets None may delete or replace array ``name`` with
        no job starting to read it halfway. (The block must not call these records itself:
        they wait for it.) A job checks that its inputs exist once it is recorded."""
        with self._write() as db:
            yield self._busy_with(db, name)

    @staticmethod
    def _busy_with(db: sqlite3.Connection, name: str) -> str | None:
        row = db.execute(
            f"SELECT id FROM jobs WHERE status IN {_ACTIVE_SQL} AND (writes = ? OR EXISTS "
            "(SELECT 1 FROM json_each(jobs.reads) WHERE json_each.value = ?)) LIMIT 1", (name, name)).fetchone()
        return row[0] if row else None

    def mark_interrupted(self) -> int:
        """Jobs left active by a service that stopped: failed, saying so."""
        stamp = now()
        with self._write() as db:
            cursor = db.execute(
                "UPDATE jobs SET status = 'failed', message = ?, finished = ?, updated = ?, error_status = 500, "
                "error_type = ? WHERE status IN ('accepted', 'running')",
                (INTERRUPTED, stamp, stamp, JOB_FAILED),
            )
            return cursor.rowcount
