"""Service settings: command-line flags and ``CHUNKED_TENSOR_OPS_*`` environment variables."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from schemas.service import check_callback_uri

ENV_PREFIX = "CHUNKED_TENSOR_OPS_"
MiB = 2**20
GiB = 2**30


class Settings(BaseSettings):
    """Everything the service can be told. Each field is also an environment variable:
    ``CHUNKED_TENSOR_OPS_`` + the field name in capitals (``CHUNKED_TENSOR_OPS_PORT=9000``)."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore")

    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    # A local directory, or an object store URL (``s3://bucket/prefix``, through s3fs; see
    # docs/storage.md). A URL stays a string; anything else is a path.
    data_root: Path | str = Path("data")
    # None: an embedded LocalCluster; otherwise the address of an existing Dask scheduler,
    # whose workers must see a local data_root at the same path (an s3:// one they reach themselves).
    scheduler: str | None = None
    token: str | None = None
    n_workers: int = Field(2, ge=1)
    threads_per_worker: int = Field(1, ge=1)
    memory_limit: str = "2GiB"
    # Worker processes (the default) or threads in the service's own process (quick tests).
    cluster_processes: bool = True
    # The largest array a client may upload (NPY or unzipped Zarr), and the largest inline
    # NPY input or inline result (past it: 413, "upload to /arrays and use reference").
    max_upload_bytes: int = Field(16 * GiB, ge=1)
    max_inline_bytes: int = Field(64 * MiB, ge=1)
    # Target size of one stored chunk: uploads are chunked along their leading axes so that
    # a streamed NPY fills each chunk exactly once.
    chunk_bytes: int = Field(16 * MiB, ge=1024)
    # How long an execution waits for the scheduler before answering 503.
    scheduler_timeout: float = Field(5.0, gt=0)
    # Where jobs put their intermediate files (GatherNd's all-to-all when params is large): a
    # directory every worker reaches (a shared file system) or an fsspec URL (s3:// uses the
    # s3_* settings below). Default: under the data root (tmp/) when it is local; with an S3
    # data root, the state dir's tmp/ for the embedded cluster (its workers share this disk)
    # and scratch/ in the bucket for an external one (its workers may share no disk). The
    # scratch carries GatherNd's gathered rows twice: a shared disk saves those requests.
    scratch: str | None = None
    # --- budgets: what one request may cost, checked before any work (413/400 past them) ------
    # Chunks of one stored array (an axis of length 0 counts as 1), inner chunks of one
    # shard, and the decoded size of one chunk: uploads, ?chunks= and results alike.
    max_chunks: int = Field(10_000, ge=1)
    max_shard_chunks: int = Field(1024, ge=1)
    max_chunk_bytes: int = Field(64 * MiB, ge=1024)
    # One string of a variable-length string array (a coordinate's labels) and all of them.
    max_string_bytes: int = Field(64 * 1024, ge=1)
    max_strings_bytes: int = Field(16 * MiB, ge=1)
    # Blocks of an operator's output and tasks of a job's graph.
    max_graph_blocks: int = Field(100_000, ge=1)
    max_graph_tasks: int = Field(1_000_000, ge=1)
    # All stored arrays together (None: no quota beyond the disk's own size).
    disk_quota_bytes: int | None = Field(None, ge=1)
    # --- jobs ------------------------------------------------------------------------------
    # Jobs running at once, jobs waiting for one of those slots (past it: 503), and how long
    # a finished job is kept with its stored result (seconds) and how many records are kept at most.
    max_jobs: int = Field(4, ge=1)
    max_queued_jobs: int = Field(64, ge=0)
    job_retention_seconds: float = Field(7 * 24 * 3600, gt=0)
    max_job_records: int = Field(10_000, ge=1)
    # Seconds between two sweeps that delete the jobs past job_retention_seconds with their
    # stored results (service.jobs.sweeper).
    job_sweep_interval: float = Field(60.0, gt=0)
    # --- callbacks: a job's subscriber (successUri, inProgressUri, failedUri) -------------------
    # Where callbacks may go: URL prefixes (http://receiver.example:8080/hooks/); a subscriber
    # URI must match one in scheme, host, port and leading path. Empty (the default): an
    # execute request with a subscriber is refused (400).
    callback_allow: list[str] = Field(default_factory=list)
    # Let an allowed host *name* resolve to a loopback, private or link-local address (an
    # internal DNS the operator trusts); an address allowed by itself (http://10.0.0.5/) is
    # always allowed.
    callback_private_addresses: bool = False
    # Seconds one callback request may take; tries after the first on a connection error,
    # a timeout or a 5xx, the first retry after callback_backoff seconds, each later one
    # after twice the wait before it.
    callback_timeout: float = Field(10.0, gt=0)
    callback_retries: int = Field(5, ge=0)
    callback_backoff: float = Field(0.5, gt=0)
    # At most one push to a job's inProgressUri per this many seconds (the latest state is
    # sent once the interval has passed).
    callback_progress_interval: float = Field(1.0, ge=0)
    # Jobs whose callbacks wait to be delivered, at most; past it a new job with a subscriber
    # is refused (503, Retry-After) rather than the pending deliveries growing without bound.
    callback_max_pending: int = Field(1000, ge=1)
    # --- the network -------------------------------------------------------------------------
    # The token may come from a file (its first line) rather than the command line, where
    # every local user can read it in the process list.
    token_file: Path | None = None
    # Host header values the service answers (DNS rebinding): None means the bound address
    # and, for a loopback one, localhost/127.0.0.1/[::1] (with the port).
    allowed_hosts: list[str] | None = None
    # Origins allowed by CORS; empty: no CORS headers (browsers refuse cross-site reads).
    cors_origins: list[str] = Field(default_factory=list)
    # Connections served at once (more wait in the listen backlog) and the seconds a client
    # may take to send its headers or a piece of its body.
    max_connections: int = Field(256, ge=1)
    read_timeout: float = Field(30.0, gt=0)
    # --- object storage (data_root = s3://bucket/prefix); never taken from requests --------
    # Where the job records (SQLite) and upload spools live when data_root is remote;
    # default ./state. Unused for a local data root (they live in it).
    state_dir: Path | None = None
    s3_endpoint_url: str | None = None   # e.g. http://127.0.0.1:9000 for MinIO; None: AWS
    s3_key: SecretStr | None = None      # access key id; None: s3fs/boto's own lookup (env, profile, role)
    s3_secret: SecretStr | None = None
    s3_region: str | None = None
    # Any further s3fs options, as JSON (CHUNKED_TENSOR_OPS_STORAGE_OPTIONS='{"anon": false}');
    # the s3_* fields above win over the same options here.
    storage_options: dict = Field(default_factory=dict)
    # Create the bucket at start-up when it is missing (default: refuse to start).
    s3_create_bucket: bool = False

    @field_validator("data_root", mode="before")
    @classmethod
    def _path_unless_url(cls, value):
        text = str(value)
        return text.rstrip("/") if "://" in text else Path(value)

    @field_validator("callback_allow")
    @classmethod
    def _absolute_urls(cls, entries: list[str]) -> list[str]:
        for entry in entries:
            check_callback_uri(entry)  # ValueError naming the entry
        return entries

    @property
    def remote(self) -> bool:
        """Whether the data root is an object store URL."""
        return isinstance(self.data_root, str)

    def data_root_text(self) -> str:
        """The data root for messages: the URL, or the absolute path."""
        return self.data_root if self.remote else str(Path(self.data_root).resolve())
