"""Arrays in an object store: a data root ``s3://bucket/prefix`` (through s3fs).

The layout under the prefix (docs/storage.md)::

    refs/NAME              a pointer: {"version": "<id>", "published": "<time>"}
    versions/<id>/         one published (or being built) array: a Zarr v3 group, as locally

S3 has no rename, so nothing is ever moved. An array is built under a fresh
``versions/<id>/`` prefix (by the Dask workers themselves for a job: the graph carries a Zarr
``FsspecStore`` with the storage options, so workers need no configuration and the API process
never relays a job's chunks) and published by one PUT of its pointer, which S3 applies
atomically: readers see the old version or the new one, never a mix. A new name is created
with a conditional PUT (``If-None-Match: *``), so of two publishers of one name one wins and
the other gets 409. Readers resolve the pointer once and read that version to the end; in this
process they pin it (``open(pinned=True)``, the Zarr-over-HTTP route), and a replaced or
deleted version is removed when its last pin is released. Deleting removes the pointer first,
then the version. Versions that no pointer names (a crashed upload, a dismissed job's chunks)
are removed at start-up, as the local store sweeps ``tmp/``.

Every storage failure (endpoint down, missing bucket, refused credentials) becomes a 503
naming the data root; the service does not start when the bucket cannot be reached.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import wraps
from pathlib import Path

from zarr.storage import FsspecStore

from service.errors import PROJECT, ServiceError, conflict, no_such_array
from service.settings import Settings
from service.storage.base import KeyPieces, StoreBase, key_parts, open_variable
from service.storage.budgets import Budgets
from service.storage.fsspec_store import ObjectStore
from service.storage.local import ArrayStore
from service.storage.metadata import Located, located
from service.storage.names import NAME, check_name
from service.storage.protocol import ArrayStorage
from service.storage.s3_config import storage_options
from service.storage.s3_pins import PinnedFsspecStore, Version, VersionPin, VersionPins
from service.storage.scratch import configured_scratch, scratch_root
from service.storage.upload import NpyUpload
from service.storage.variables import StoredVariable

log = logging.getLogger(__name__)

STORAGE_UNAVAILABLE = PROJECT + "storage-unavailable"
_URL = re.compile(r"s3://([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])(/.*)?")


class StorageUnavailable(RuntimeError):
    """The data root cannot be used (raised at start-up; requests get a 503 instead)."""


def open_store(settings: Settings) -> ArrayStorage:
    """The array store of ``settings.data_root``: a local directory or an ``s3://`` URL."""
    sizes = dict(chunk_bytes=settings.chunk_bytes, max_upload_bytes=settings.max_upload_bytes,
                 budgets=Budgets.of(settings))
    if not settings.remote:
        store = ArrayStore(settings.data_root, **sizes)
    else:
        store = ObjectArrayStore(settings.data_root, options=storage_options(settings),
                                 state_dir=settings.state_dir or Path("state"), create_bucket=settings.s3_create_bucket,
                                 **sizes)
    if settings.scratch:
        store.scratch_root = scratch_root(settings)
    elif settings.remote and settings.scheduler is None:
        store.scratch_on_local_disk = True
    return store


def _now() -> str:
    """A pointer's ``published`` time: UTC, ISO 8601 to the millisecond, as the job records write it."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


@dataclass
class RemoteKey(KeyPieces):
    """A Zarr key of a published version, pinned while it is served
    (``service.storage.protocol.StoredKey``).

    Attributes
    ----------
    store : ObjectArrayStore
        The store it is read through.
    path : str
        The key's object, as s3fs names it.
    size : int
        Its length in bytes.
    pin : VersionPin
        The hold on its version, released when the key is gone.
    """

    store: ObjectArrayStore
    path: str
    size: int
    pin: VersionPin

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]

    @property
    def local_path(self) -> None:
        """None: the bytes are in the object store, read through ``read``."""
        return None

    def read(self, start: int, end: int) -> bytes:
        """Bytes ``start`` to ``end`` (exclusive); a 503 when the store fails."""
        with self.store.guard():
            return self.store.fs.cat_file(self.path, start=start, end=end) if end > start else b""


def _storage_failures_as_503(method):
    """Run a store method with storage failures turned into 503s (``ObjectArrayStore.guard``)."""
    @wraps(method)
    def wrapper(self, *args, **kwargs):
        with self.guard():
            return method(self, *args, **kwargs)
    return wrapper


class _GuardedNpyUpload(NpyUpload):
    """An NPY upload into an object store: storage failures are 503s."""

    def flush(self) -> None:
        with self.store.guard():
            super().flush()

    def finish(self) -> dict:
        with self.store.guard():
            return super().finish()


class ObjectArrayStore(StoreBase):
    """Arrays in an object store (``service.storage.protocol.ArrayStorage``): the same arrays,
    Zarr groups and HTTP keys as ``service.storage.local.ArrayStore``; versions and pointers
    instead of directories and renames. Every method is blocking.

    Parameters
    ----------
    url : str
        The data root, ``s3://BUCKET[/PREFIX]``.
    options : dict
        s3fs's options (endpoint, credentials), also carried by the workers' graphs.
    state_dir : Path
        The local directory of the job records; its ``tmp/`` holds upload spools.
    chunk_bytes : int
        The size aimed at for one stored chunk and one piece of an NPY download.
    max_upload_bytes : int
        The largest array an upload or a job may store.
    create_bucket : bool
        Create the bucket when it does not exist (else the store refuses to start).
    budgets : Budgets, optional
        What one stored array may cost (default: the settings' defaults).

    Attributes
    ----------
    scratch_on_local_disk : bool
        The workers are processes on this machine (the embedded cluster): a job's
        intermediate files go to a directory under the state dir's ``tmp/``, not through
        the bucket.
    """

    scratch_on_local_disk: bool = False
    upload_class = _GuardedNpyUpload

    def __init__(self, url: str, *, options: dict, state_dir: Path, chunk_bytes: int, max_upload_bytes: int,
                 create_bucket: bool = False, budgets: Budgets | None = None):
        import s3fs  # only a service with an s3:// data root needs it

        match = _URL.fullmatch(url.rstrip("/"))
        if not match:
            raise StorageUnavailable(f"data_root must be a local path or s3://BUCKET[/PREFIX], got {url!r}")
        self.bucket = match.group(1)
        prefix = (match.group(2) or "").strip("/")
        self.base = f"{self.bucket}/{prefix}" if prefix else self.bucket
        self.url = f"s3://{self.base}"
        super().__init__(self.url, state_dir, chunk_bytes=chunk_bytes, max_upload_bytes=max_upload_bytes,
                         budgets=budgets)
        self.options = options
        # Scrubbed from every message (a value too short to be a real credential would only
        # mangle the text around it).
        self._secrets = [v for k, v in options.items()
                         if k in ("key", "secret", "token") and isinstance(v, str) and len(v) >= 6]
        # The API process's own client: no listing cache (another request may just have written).
        self.fs = s3fs.S3FileSystem(**options, use_listings_cache=False, skip_instance_cache=True)
        self._pins = VersionPins(self._remove_version)
        self._check_bucket(create_bucket)

    # --- errors ---------------------------------------------------------------------------

    def _clean(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def unavailable(self, error: BaseException) -> ServiceError:
        """The 503 for a storage failure: names the data root, never a secret."""
        detail = self._clean(f"{type(error).__name__}: {error}")[:500]
        return ServiceError(503, STORAGE_UNAVAILABLE, f"the data root {self.url} is unavailable ({detail}); "
                                                      "try again later or ask the operator")

    def storage_error(self, error: BaseException) -> ServiceError | None:
        return self.unavailable(error) if _storage_failure(error) else None

    def guard(self):
        """A context turning storage failures (anything but the service's own errors) into 503s."""
        return _Guard(self)

    def _check_bucket(self, create: bool) -> None:
        endpoint = (self.options.get("client_kwargs") or {}).get("endpoint_url", "the default AWS endpoint")
        try:
            self.fs.call_s3("head_bucket", Bucket=self.bucket)
            return
        except FileNotFoundError:
            if not create:
                raise StorageUnavailable(
                    f"data root {self.url}: the bucket {self.bucket!r} does not exist at {endpoint}; create it, or "
                    "set CHUNKED_TENSOR_OPS_S3_CREATE_BUCKET=true to have the service create it") from None
        except Exception as error:
            raise StorageUnavailable(f"data root {self.url}: cannot reach the bucket at {endpoint}: "
                                     f"{self._clean(f'{type(error).__name__}: {error}')}") from None
        try:
            self.fs.call_s3("create_bucket", Bucket=self.bucket)
        except Exception as error:
            raise StorageUnavailable(f"data root {self.url}: cannot create the bucket {self.bucket!r} at {endpoint}: "
                                     f"{self._clean(f'{type(error).__name__}: {error}')}") from None

    # --- names, pointers, versions ----------------------------------------------------------

    def _ref(self, name: str) -> str:
        return f"{self.base}/refs/{check_name(name)}"

    def path(self, name: str) -> str:
        """The pointer object of ``name`` (the name checked)."""
        return self._ref(name)

    def _current(self, name: str) -> Version | None:
        try:
            pointer = json.loads(self.fs.cat_file(self._ref(name)))
        except FileNotFoundError:
            return None
        return self._version(str(pointer["version"]), published=True)

    def _version(self, version_id: str, published: bool = False) -> Version:
        return Version(version_id, f"{self.base}/versions/{version_id}", published)

    def _pinned_current(self, name: str) -> VersionPin:
        """A pin on the version ``name`` points to, taken before checking that it still does
        (a publish that flipped the pointer meanwhile has disposed of it, or will wait)."""
        for _ in range(16):
            version = self._current(name)
            if version is None:
                raise no_such_array(name)
            pin = self._pins.pin(version)
            again = self._current(name)
            if again is not None and again.id == version.id:
                return pin
            del pin
        raise conflict(f"the array {name!r} is being replaced by other requests; try again")

    def _remove_version(self, version: Version) -> None:
        """Remove a version's objects; a failure is logged (the start-up sweep retries)."""
        try:
            self.fs.rm(version.path, recursive=True)
        except FileNotFoundError:
            pass
        except Exception as error:
            log.warning("could not remove %s: %s", version.url, self._clean(str(error)))

    @_storage_failures_as_503
    def exists(self, name: str) -> bool:
        return self.fs.exists(self._ref(name))

    @_storage_failures_as_503
    def names(self) -> list[str]:
        try:
            keys = self.fs.ls(f"{self.base}/refs", detail=False)
        except FileNotFoundError:
            return []
        names = (key.rsplit("/", 1)[-1] for key in keys)
        return sorted(n for n in names if NAME.fullmatch(n) and not n.startswith("."))

    @_storage_failures_as_503
    def locate(self, name: str, path: Version | None = None) -> Located:
        version = self._current(name) if path is None else path
        if version is None:
            raise no_such_array(name)
        try:
            group = json.loads(self.fs.cat_file(f"{version.path}/zarr.json"))
        except FileNotFoundError:
            raise no_such_array(name) from None
        return located(name, version, group)

    @_storage_failures_as_503
    def stored_bytes(self, name: str | None = None) -> int:
        """The bytes of every version in the bucket (published ones, and those being built), or
        of the current version of array ``name``."""
        version = None if name is None else self._current(name)
        if name is not None and version is None:
            return 0
        try:
            return int(self.fs.du(f"{self.base}/versions" if version is None else version.path, total=True))
        except FileNotFoundError:
            return 0

    @_storage_failures_as_503
    def sweep(self) -> None:
        """Remove local spools, jobs' scratch files, and versions no pointer names (left by a
        service that stopped mid-upload or mid-job). One service per data root, as for a local one."""
        super().sweep()
        try:
            self.fs.rm(f"{self.base}/scratch", recursive=True)
        except FileNotFoundError:
            pass
        named = {v.id for v in (self._current(n) for n in self.names()) if v is not None}
        try:
            versions = self.fs.ls(f"{self.base}/versions", detail=False)
        except FileNotFoundError:
            return
        for key in versions:
            version_id = key.rstrip("/").rsplit("/", 1)[-1]
            if version_id not in named:
                self._remove_version(self._version(version_id))

    # --- reading --------------------------------------------------------------------------

    def _zarr_store(self, version: Version, read_only: bool, sub: str = "") -> FsspecStore:
        url = f"{version.url}/{sub}" if sub else version.url
        return ObjectStore.from_url(url, storage_options=self.options, read_only=read_only)

    @_storage_failures_as_503
    def open(self, name: str, chunks=None, *, pinned: bool = False, decoded: bool = False) -> StoredVariable:
        """The stored array, lazily (see ``service.storage.local.ArrayStore.open``). The graph
        reads the version current at this call straight from the object store; workers open it
        with the storage options the graph carries. ``pinned=True`` also keeps that version from
        removal by an overwrite or a delete until the DataArray and its graph are gone."""
        if pinned:
            pin = self._pinned_current(name)
            found = self.locate(name, pin.version)
            plain = self._zarr_store(pin.version, read_only=True)
            source = PinnedFsspecStore(plain.fs, pin=pin, path=plain.path)
        else:
            found = self.locate(name)
            source = self._zarr_store(found.path, read_only=True)
        return open_variable(source, found.variable, chunks, decoded=decoded)

    info = _storage_failures_as_503(StoreBase.info)
    read_small = _storage_failures_as_503(StoreBase.read_small)

    @_storage_failures_as_503
    def iter_npy(self, name: str, piece_bytes: int | None = None):
        dtype, length, pieces = super().iter_npy(name, piece_bytes)

        def guarded_pieces():
            with self.guard():  # headers are sent by now: a failure cuts the body short
                yield from pieces
        return dtype, length, guarded_pieces()

    @_storage_failures_as_503
    def open_key(self, name: str, key: str) -> RemoteKey | None:
        """Zarr key ``key`` of the current version of ``name`` (None: no such key); only keys
        made of ``[A-Za-z0-9_.-]`` parts, so never one outside the array's version."""
        pin = self._pinned_current(name)
        if key_parts(key) is None:
            return None
        path = f"{pin.version.path}/{key}"
        try:
            info = self.fs.info(path)
        except FileNotFoundError:
            return None
        if info.get("type") != "file":
            return None
        return RemoteKey(self, path, int(info["size"]), pin)

    # --- writing --------------------------------------------------------------------------

    def new_version(self, prefix: str) -> Version:
        """A fresh version prefix (nothing is written until Zarr writes into it)."""
        return self._version(f"{prefix}{uuid.uuid4().hex}")

    def scratch(self, prefix: str) -> tuple[dict, Callable[[], None]]:
        """A fresh location for one job's intermediate files (``ops.scratch``) and its removal:
        the scratch setting's, else a directory under tmp/ when the workers share this
        machine's disk, else a prefix under ``scratch/`` in the bucket, which the workers
        reach with the graph's storage options."""
        if self.scratch_root is None and self.scratch_on_local_disk:
            # GatherNd moves its gathered rows through the scratch twice: on local disk that
            # costs no request and no server time.
            return super().scratch(prefix)
        root = self.scratch_root or (f"s3://{self.base}/scratch", self.options)
        return configured_scratch(*root, prefix)

    def zarr_target(self, location: Version, sub: str = "") -> FsspecStore:
        """A writable Zarr store on ``location`` (picklable: Dask workers write through it)."""
        return self._zarr_store(location, read_only=False, sub=sub)

    def discard(self, location: Version) -> None:
        if not location.published:
            self._remove_version(location)

    write_skeleton = _storage_failures_as_503(StoreBase.write_skeleton)
    npy_upload = _storage_failures_as_503(StoreBase.npy_upload)
    zip_upload = _storage_failures_as_503(StoreBase.zip_upload)

    @_storage_failures_as_503
    def publish(self, built: Version, name: str, overwrite: bool) -> None:
        """Make ``built`` the array ``name``: one PUT of its pointer. A new name is a
        conditional PUT (409 if the name exists and ``overwrite`` is false); a replaced
        version is removed now, or when its last pinned reader in this process lets go."""
        ref = self._ref(name)
        pointer = json.dumps({"version": built.id, "published": _now()}).encode()
        if not overwrite:
            try:
                self.fs.pipe_file(ref, pointer, IfNoneMatch="*")
            except FileExistsError:
                self.discard(built)
                raise conflict(f"an array named {name!r} exists; use ?overwrite=true to replace it") from None
            built.published = True
            return
        old = self._current(name)
        self.fs.pipe_file(ref, pointer)
        built.published = True
        if old is not None and old.id != built.id:
            self._pins.dispose(old)

    @_storage_failures_as_503
    def delete(self, name: str) -> None:
        """Remove the pointer (the name is gone at once), then the version (now, or when its
        last pinned reader lets go)."""
        old = self._current(name)
        if old is None:
            raise no_such_array(name)
        try:
            self.fs.rm_file(self._ref(name))
        except FileNotFoundError:
            raise no_such_array(name) from None
        self._pins.dispose(old)


class _Guard:
    """``ObjectArrayStore.guard()``: ServiceErrors (and the NPY parser's errors) pass through,
    as do programming errors; failures of the storage become the store's 503."""

    def __init__(self, store: ObjectArrayStore):
        self.store = store

    def __enter__(self):
        return self

    def __exit__(self, kind, error, traceback):
        if error is None or not _storage_failure(error):
            return False
        raise self.store.unavailable(error) from None


def _storage_failure(error: BaseException) -> bool:
    from service.storage.npy_header import NpyError

    if isinstance(error, (ServiceError, NpyError)):
        return False
    if isinstance(error, (OSError, TimeoutError, ConnectionError)):
        return True
    module = type(error).__module__ or ""
    return module.startswith(("botocore", "aiobotocore", "aiohttp", "s3fs"))
