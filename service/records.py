"""Job records in an embedded SQLite database under the data root (``jobs.sqlite``).

They survive restarts: a new service lists the earlier jobs, and marks the ones that were
accepted or running when the old one stopped as failed.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from datetime import datetime, timezone
from pathlib import Path

from service.errors import JOB_FAILED

ACTIVE = ("accepted", "running")
_COLUMNS = ("id", "process_id", "status", "message", "created", "started", "finished", "updated",
            "progress", "reads", "writes", "transmission", "error_status", "error_type")


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class JobRecords:
    """One row per job; every method is a short blocking transaction."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._lock = threading.Lock()
        with self._connect() as db:
            db.execute(
                "CREATE TABLE IF NOT EXISTS jobs (id TEXT PRIMARY KEY, process_id TEXT NOT NULL, "
                "status TEXT NOT NULL, message TEXT, created TEXT, started TEXT, finished TEXT, "
                "updated TEXT, progress INTEGER, reads TEXT NOT NULL, writes TEXT, transmission TEXT, "
                "error_status INTEGER, error_type TEXT)"
            )
            db.execute("CREATE INDEX IF NOT EXISTS jobs_created ON jobs (created)")

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        db.row_factory = sqlite3.Row
        return db

    def _row(self, row) -> dict:
        job = dict(row)
        job["reads"] = json.loads(job["reads"])
        return job

    def create(self, job_id: str, process_id: str, reads: list[str], writes: str | None,
               transmission: str, status: str = "accepted") -> dict:
        stamp = now()
        with self._lock, self._connect() as db:
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
        with self._lock, self._connect() as db:
            db.execute(f"UPDATE jobs SET {assignments} WHERE id = ?", (*fields.values(), job_id))

    def finish(self, job_id: str, status: str, message: str, **fields) -> None:
        """Move an active job to a final status (a job already final keeps its status)."""
        stamp = now()
        with self._lock, self._connect() as db:
            assignments = "".join(f", {k} = ?" for k in fields)
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
        with self._lock, self._connect() as db:
            cursor = db.execute(
                "UPDATE jobs SET status = 'failed', message = ?, finished = ?, updated = ?, error_status = 500, "
                "error_type = ? WHERE status IN ('accepted', 'running')",
                ("interrupted: the service stopped while the job was running; submit it again", stamp, stamp,
                 JOB_FAILED),
            )
            return cursor.rowcount
