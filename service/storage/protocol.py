"""What the service asks of its array store (``ArrayStorage``) and of one stored Zarr key
served over HTTP (``StoredKey``).

Two stores satisfy them: ``service.storage.local.ArrayStore`` (a directory) and
``service.storage.s3.ObjectArrayStore`` (``s3://bucket/prefix``). The API routers, the jobs
executor and the uploads hold a store through ``ArrayStorage``; which one it is, only
``service.storage.s3.open_store`` knows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import xarray as xr

from service.errors import ServiceError
from service.storage.upload import NpyUpload
from service.storage.variables import StoredVariable

#: Where a store builds one array before ``publish`` (a directory under ``tmp/``, or an
#: object store version): opaque to callers, who only hand it back to the same store.
Location = Any


@runtime_checkable
class StoredKey(Protocol):
    """One Zarr key of a stored array (``zarr.json`` or a chunk), as ``ArrayStorage.open_key``
    gives it to the Zarr-over-HTTP route; it holds the array's version while it is served.

    Attributes
    ----------
    name : str
        The key's last part (``zarr.json``, ``0``, ...).
    size : int
        Its length in bytes.
    local_path : Path or None
        A file on this machine holding exactly the key's bytes, which can be served as a
        file (sendfile, multi-range); None when the bytes are read through ``read``.
    """

    @property
    def name(self) -> str: ...

    @property
    def size(self) -> int: ...

    @property
    def local_path(self) -> Path | None: ...

    def read(self, start: int, end: int) -> bytes:
        """Bytes ``start`` to ``end`` (exclusive)."""
        ...

    def pieces(self, start: int, end: int) -> Iterator[bytes]:
        """Bytes ``start`` to ``end`` (exclusive), in pieces read one at a time."""
        ...


@runtime_checkable
class ArrayStorage(Protocol):
    """The service's stored arrays: Zarr v3 groups by name, read, written whole and
    published atomically. Every method is blocking (run it in a thread from async code);
    a failure of the storage itself is a ``ServiceError`` (503 for an object store).

    Attributes
    ----------
    root : Path or str
        The data root (a directory, or an ``s3://`` URL), as the health check names it.
    state_dir : Path
        The local directory of the job records.
    chunk_bytes : int
        The size aimed at for one stored chunk and one piece of an NPY download.
    max_upload_bytes : int
        The largest array an upload or a job may store.
    """

    root: Path | str
    state_dir: Path
    chunk_bytes: int
    max_upload_bytes: int

    # --- reading ---------------------------------------------------------------------------

    def exists(self, name: str) -> bool:
        """Whether an array ``name`` is stored (400 for a name that is not one)."""
        ...

    def names(self) -> list[str]:
        """The stored arrays' names, sorted."""
        ...

    def info(self, name: str) -> dict:
        """Shape, dtype, chunks, dims and attrs of array ``name`` (404 if there is none)."""
        ...

    def open(self, name: str, chunks=None, *, pinned: bool = False, decoded: bool = False) -> StoredVariable:
        """Array ``name`` as a lazy DataArray with its group's attrs and companions;
        ``decoded``: CF-decoded, as jobs compute on it, else the stored values; ``pinned``: its
        current version held for this process's readers until the DataArray and its graph are
        gone."""
        ...

    def read_small(self, name: str, limit: int) -> np.ndarray:
        """Array ``name`` in memory, if it is at most ``limit`` bytes (413 otherwise)."""
        ...

    def iter_npy(self, name: str, piece_bytes: int | None = None) -> tuple[np.dtype, int, Iterator[bytes]]:
        """(dtype, byte length, the NPY bytes in pieces) of array ``name``."""
        ...

    def open_key(self, name: str, key: str) -> StoredKey | None:
        """Zarr key ``key`` of array ``name``'s current version, or None when it has no
        such key (404 when there is no such array)."""
        ...

    # --- writing ---------------------------------------------------------------------------

    def npy_upload(self, name: str, *, dims: str | None, chunks: str | None, declared_dtype: str | None,
                   overwrite: bool) -> NpyUpload:
        """A streamed NPY upload into array ``name`` (409 if it exists and not ``overwrite``)."""
        ...

    def zip_upload(self, name: str, archive: Path, *, variable: str | None, dims: str | None,
                   chunks: str | None, overwrite: bool) -> dict:
        """Import the zipped Zarr v3 store ``archive`` as array ``name``; its ``info``."""
        ...

    def spool_dir(self, prefix: str) -> Path:
        """A new local directory for an upload's spool or an unzipped archive."""
        ...

    def new_version(self, prefix: str) -> Location:
        """A new, empty location to build one array in."""
        ...

    def zarr_target(self, location: Location, sub: str = "") -> Any:
        """What Zarr / xarray write to for ``location`` (joined with ``sub``)."""
        ...

    def write_skeleton(self, path: Location, arr: xr.DataArray, chunks: tuple[int, ...], variable: str,
                       group_attrs: dict | None = None, companions: dict | None = None) -> Any:
        """Write the group's metadata for ``arr`` at ``path`` (packed as its ``encoding`` says,
        under ``group_attrs``, with its ``companions``); the Dask graph filling its data."""
        ...

    def hold_quota(self, name: str, nbytes: int, overwrite: bool) -> Callable[[], None]:
        """Hold ``nbytes`` of the disk quota while array ``name`` is built (413 if it would
        pass ``disk_quota_bytes``); returns what gives them back."""
        ...

    def publish(self, built: Location, name: str, overwrite: bool) -> None:
        """Make the array built at ``built`` array ``name`` in one step (409 if the name is
        taken and not ``overwrite``)."""
        ...

    def discard(self, location: Location) -> None:
        """Remove a location that was not published (a no-op once it was)."""
        ...

    def delete(self, name: str) -> None:
        """Remove array ``name`` (404 if there is none); readers holding it read to the end."""
        ...

    # --- jobs and housekeeping -------------------------------------------------------------

    def scratch(self, prefix: str) -> tuple[dict, Callable[[], None]]:
        """A job's scratch location (``{"url", "storage_options"}``) and its removal."""
        ...

    def storage_error(self, error: BaseException) -> ServiceError | None:
        """The ServiceError for a failure of the storage seen by a worker, or None."""
        ...

    def sweep(self) -> None:
        """Remove what a service that stopped left half-built."""
        ...
