"""The array store: every array is a Zarr v3 group under ``<data root>/arrays/<name>``.

A group holds one data variable (named after the array for NPY uploads and results, or as
it was in an uploaded xarray store) with xarray's ``dimension_names``, its coordinates and
attrs, and consolidated metadata in the root ``zarr.json``, so ``xarray.open_zarr`` reads it
over HTTP. Zarr v3 has no bfloat16 or complex32: those are stored as their raw bits
(``uint16``, ``uint32``) with the attribute ``ops_dtype`` naming the real type.

Nothing appears half-written: every array is built under ``<data root>/tmp`` and moved into
place with one ``rename``; an existing array is replaced by swapping the two groups in one
``renameat2(RENAME_EXCHANGE)`` (``ArrayStore.publish``), so a reader sees the old array or
the new one, never a mix and never a missing name. Reads in this process hold the version
they started on (``ArrayStore.open(pinned=True)``) until they finish.

A data root in an object store (``s3://bucket/prefix``) is ``service.objectstore.ObjectArrayStore``:
the same groups and the same interface, with versions and pointer objects instead of
directories and renames (docs/storage.md). What both share: an array is built at a *location*
(``new_version``), written through ``zarr_target``, made visible by ``publish`` and, if it
never was, removed by ``discard``.
"""

from __future__ import annotations

import ctypes
import errno
import itertools
import json
import logging
import math
import os
import re
import shutil
import tempfile
import threading
import uuid
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import dask
import dask.array as da
import numpy as np
import xarray as xr
import zarr

import ops
from ops import dtypes
from service import npy, zipstore
from service.errors import bad_request, conflict, no_such_array, too_large

log = logging.getLogger(__name__)

NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}")
_KEY_PART = re.compile(r"[A-Za-z0-9_.-]+")
# The most chunks (files) a client may ask an array to be cut into with ?chunks=.
MAX_CHUNK_COUNT = 1_000_000
# The largest chunk (or shard) an uploaded Zarr store may declare.
MAX_CHUNK_BYTES = 512 * 2**20
DTYPE_ATTR = "ops_dtype"
# Stored in place of the dtypes Zarr v3 has no name for.
_RAW_BITS = {"bfloat16": np.dtype("<u2"), "complex32": np.dtype("<u4")}
_REAL = {"bfloat16": dtypes.bfloat16, "complex32": dtypes.complex32}


def check_name(name: str, what: str = "array name") -> str:
    """An array name: 1-128 characters of ``[A-Za-z0-9._-]``, not starting with ``.``."""
    if not isinstance(name, str) or not NAME.fullmatch(name) or name.startswith("."):
        raise bad_request(
            f"{what} must be 1-128 characters of [A-Za-z0-9._-] not starting with '.', got {name!r}"
        )
    return name


def parse_dims(text: str | None, ndim: int) -> tuple[str, ...] | None:
    """``?dims=n,y,x,c`` as a tuple of distinct names, one per axis."""
    if text is None:
        return None
    names = tuple(part.strip() for part in text.split(","))
    if len(names) != ndim or len(set(names)) != ndim or not all(NAME.fullmatch(n) for n in names):
        raise bad_request(f"dims must be {ndim} distinct comma-separated names of [A-Za-z0-9._-], got {text!r}")
    return names


def parse_chunks(text: str | None, shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """``?chunks=1,256,256,-1`` (``-1``: the whole axis) as one positive chunk length per axis;
    a length past its axis is the whole axis (Zarr would allocate a chunk that long)."""
    if text is None:
        return None
    try:
        values = [int(part) for part in text.split(",")] if shape else []
    except ValueError:
        raise bad_request(f"chunks must be comma-separated integers, got {text!r}") from None
    if len(values) != len(shape) or any(v == 0 or v < -1 for v in values):
        raise bad_request(f"chunks must give {len(shape)} positive lengths (or -1 for a whole axis), got {text!r}")
    chunks = tuple(max(1, n) if v == -1 else min(v, max(1, n)) for v, n in zip(values, shape))
    count = math.prod(math.ceil(n / c) for n, c in zip(shape, chunks))
    if count > MAX_CHUNK_COUNT:  # each chunk is a file: millions of them exhaust the disk's inodes
        raise bad_request(f"chunks {list(chunks)} would cut shape {list(shape)} into {count} chunks, more than "
                          f"{MAX_CHUNK_COUNT}; choose larger chunks")
    return chunks


def stream_chunks(shape: tuple[int, ...], itemsize: int, target: int) -> tuple[int, ...]:
    """Chunks that a C-order byte stream fills one after another, each about ``target`` bytes.

    Axes before the split axis get chunk 1, the split axis as many rows as fit, the axes after
    it stay whole; so every chunk is one contiguous run of the stream.
    """
    tail = itemsize
    for axis in reversed(range(len(shape))):
        if tail * shape[axis] > target:
            rows = max(1, target // tail)
            return (1,) * axis + (rows,) + tuple(max(1, n) for n in shape[axis + 1:])
        tail *= shape[axis]
    return tuple(max(1, n) for n in shape)


def stored_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype Zarr stores for ``dtype``: little-endian, raw bits for bfloat16/complex32."""
    name = dtypes.name(np.dtype(dtype))
    return _RAW_BITS[name] if name in _RAW_BITS else np.dtype(dtype).newbyteorder("<")


def to_stored(arr: xr.DataArray) -> xr.DataArray:
    """The DataArray as Zarr stores it: bfloat16/complex32 as raw bits with ``ops_dtype``."""
    name = dtypes.name(np.dtype(arr.dtype))
    if name in _RAW_BITS:
        return arr.copy(data=_view(arr.data, _RAW_BITS[name])).assign_attrs({DTYPE_ATTR: name})
    return arr


def _view(data, dtype: np.dtype):
    """``data.view(dtype)`` for a same-size dtype; Dask cannot view a 0-d array, so via one axis."""
    return data.reshape(1).view(dtype).reshape(()) if data.ndim == 0 else data.view(dtype)


def from_stored(arr: xr.DataArray) -> xr.DataArray:
    """The inverse of ``to_stored``: raw bits viewed as the dtype ``ops_dtype`` names."""
    name = arr.attrs.get(DTYPE_ATTR)
    if name in _REAL:
        attrs = {k: v for k, v in arr.attrs.items() if k != DTYPE_ATTR}
        return xr.DataArray(_view(arr.data, _REAL[name]), dims=arr.dims, coords=arr.coords, attrs=attrs,
                            name=arr.name)
    return arr


@dataclass
class Located:
    """An array found in the store: its group path, its data variable's name and the
    consolidated metadata of both."""

    name: str
    path: Path
    variable: str
    meta: dict          # the variable's array metadata (shape, data_type, chunk_grid, ...)
    group_attrs: dict


def located(name: str, where, group: dict) -> Located:
    """The array ``name`` as the group's consolidated metadata (``group``: its root
    ``zarr.json``) describes it; ``where`` is the group's location in the store."""
    arrays = group.get("consolidated_metadata", {}).get("metadata", {})
    coords = set()
    for key, child in arrays.items():
        coords.update(str(child.get("attributes", {}).get("coordinates", "")).split())
        if child.get("dimension_names") == [key]:
            coords.add(key)
    variables = [k for k, child in arrays.items()
                 if child.get("node_type") == "array" and "/" not in k and k not in coords]
    if len(variables) != 1:
        raise bad_request(f"array {name!r} holds {len(variables)} data variables, expected one")
    return Located(name, where, variables[0], arrays[variables[0]], group.get("attributes", {}))


# --- atomic replacement and stable reads ------------------------------------------------------

_AT_FDCWD = -100
_RENAME_NOREPLACE = 1  # <linux/fs.h>
_RENAME_EXCHANGE = 2
_PROC_FD = Path("/proc/self/fd")


def _load_renameat2():
    try:
        function = ctypes.CDLL(None, use_errno=True).renameat2  # glibc >= 2.28
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


_renameat2 = _load_renameat2()


def _rename2(src: Path, dst: Path, flags: int) -> bool:
    """``renameat2(src, dst, flags)``: True when done, False where the C library, the kernel or
    the file system lacks it or the flag (then the caller falls back to plain renames); any
    other failure raises OSError (FileNotFoundError, FileExistsError, ...)."""
    if _renameat2 is None:
        return False
    if _renameat2(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), flags) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    if code == errno.ENOTEMPTY:
        code = errno.EEXIST
    raise OSError(code, os.strerror(code), str(src), None, str(dst))


class _Pin:
    """One reader's hold on one array directory: an open descriptor of it, so that
    ``path`` (``/proc/self/fd/N``) names that directory wherever it is moved; released (the
    descriptor closed, the count dropped) when the last object referring to it is gone."""

    _serial = itertools.count()

    def __init__(self, pins: _Pins, key: tuple[int, int], fd: int):
        self.key, self.fd = key, fd
        self.path = _PROC_FD / str(fd)
        self.serial = next(self._serial)
        weakref.finalize(self, pins.release, key, fd)


class _Pins:
    """Array directories being read in this process, counted by (device, inode), and the
    replaced or deleted ones whose removal waits for their last reader."""

    def __init__(self):
        self.supported = _PROC_FD.is_dir()
        self._lock = threading.Lock()
        self._readers: dict[tuple[int, int], int] = {}
        self._doomed: dict[tuple[int, int], Path] = {}

    def pin(self, path: Path) -> _Pin:
        """Hold the directory at ``path`` (FileNotFoundError if there is none). Opened under the
        lock, so that ``dispose`` of a directory moved away after this open sees the count."""
        with self._lock:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            stat = os.fstat(fd)
            key = (stat.st_dev, stat.st_ino)
            self._readers[key] = self._readers.get(key, 0) + 1
        return _Pin(self, key, fd)

    def release(self, key: tuple[int, int], fd: int) -> None:
        """A pin's finalizer (any thread, maybe inside garbage collection): never raises."""
        try:
            os.close(fd)
        except OSError:
            pass
        with self._lock:
            left = self._readers.get(key, 1) - 1
            if left > 0:
                self._readers[key] = left
                return
            self._readers.pop(key, None)
            doomed = self._doomed.pop(key, None)
        if doomed is not None:
            _remove_in_background(doomed)

    def dispose(self, path: Path) -> None:
        """Remove ``path`` (a replaced or deleted group, moved under tmp/) now, or when the last
        reader holding it lets go."""
        try:
            stat = os.stat(path)
        except OSError:
            return
        with self._lock:
            key = (stat.st_dev, stat.st_ino)
            if key in self._readers:
                self._doomed[key] = path
                return
        shutil.rmtree(path, ignore_errors=True)

    def waiting(self) -> list[Path]:
        """Replaced or deleted groups kept for their readers (for tests)."""
        with self._lock:
            return list(self._doomed.values())


def _configured_scratch(root: str, options: dict, prefix: str) -> tuple[dict, Callable[[], None]]:
    """A job's scratch location under ``root`` (a shared directory or a URL), and its removal;
    a failed removal is logged (the start-up sweep of an S3 data root retries)."""
    import fsspec

    url = f"{root.rstrip('/')}/{prefix}{uuid.uuid4().hex}"
    fs, path = fsspec.core.url_to_fs(url, **options)

    def remove() -> None:
        try:
            fs.rm(path, recursive=True)
        except FileNotFoundError:
            pass
        except Exception as error:  # a leftover in a scratch area, not a failed job
            log.warning("could not remove the scratch %s: %s", root, type(error).__name__)

    return {"url": url, "storage_options": options}, remove


def _remove_in_background(path: Path) -> None:
    """Remove a directory off the calling thread (a pin may be released on the event loop)."""
    try:
        threading.Thread(target=shutil.rmtree, args=(path, True), name="remove-replaced-array",
                         daemon=True).start()
    except RuntimeError:  # interpreter shutdown: no new threads
        shutil.rmtree(path, ignore_errors=True)


class _PinnedStore(zarr.storage.LocalStore):
    """A read-only Zarr LocalStore on a pinned directory (``/proc/self/fd/N``) that keeps the
    pin while it, or a copy of it, is referenced (by xarray, zarr, a Dask graph)."""

    def __init__(self, root, *, pin: _Pin, read_only: bool = True):
        super().__init__(root, read_only=True)  # always: an input is never written through it
        self.pin = pin

    def with_read_only(self, read_only: bool = False):
        return type(self)(self.root, pin=self.pin)

    def __dask_tokenize__(self):
        # /proc/self/fd/N is reused by later pins: name the graph after this pin, not the path.
        return ("pinned-array-store", self.pin.key, self.pin.serial)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _PinnedStore) and other.pin is self.pin

    __hash__ = object.__hash__


class ArrayStore:
    """Arrays as Zarr v3 groups under one data root. Every method is blocking (run it in a
    thread from async code)."""

    def __init__(self, root: Path, *, chunk_bytes: int, max_upload_bytes: int):
        self.root = Path(root).resolve()
        self.state_dir = self.root  # job records live in the data root itself
        self.arrays = self.root / "arrays"
        self.tmp = self.root / "tmp"
        self.chunk_bytes = chunk_bytes
        self.max_upload_bytes = max_upload_bytes
        self.arrays.mkdir(parents=True, exist_ok=True)
        self.tmp.mkdir(parents=True, exist_ok=True)
        self._pins = _Pins()

    # --- names and paths ------------------------------------------------------------------

    def path(self, name: str) -> Path:
        """The group path of ``name``, checked to stay inside the data root."""
        check_name(name)
        path = self.arrays / name
        if (path.is_symlink() or (path / "zarr.json").is_symlink()
                or (path.exists() and not path.resolve().is_relative_to(self.arrays))):
            raise bad_request(f"array name {name!r} does not resolve inside the data root")
        return path

    @staticmethod
    def _refuse_links(name: str, group: Path) -> None:
        """Refuse a group holding a symbolic link (the service never makes one, uploads cannot):
        reading through it could leave the data root. One directory scan, before any chunk is read."""
        folders = [group]
        while folders:
            with os.scandir(folders.pop()) as entries:
                for entry in entries:
                    if entry.is_symlink():
                        raise bad_request(f"array name {name!r} does not resolve inside the data root "
                                          f"(it holds a symbolic link, {entry.name!r})")
                    if entry.is_dir(follow_symlinks=False):
                        folders.append(Path(entry.path))

    def exists(self, name: str) -> bool:
        path = self.path(name)
        return (path / "zarr.json").is_file()

    def locate(self, name: str, path: Path | None = None) -> Located:
        """The array ``name`` as its consolidated metadata describes it (read from ``path``,
        a pinned directory, when given)."""
        path = self.path(name) if path is None else path
        if not (path / "zarr.json").is_file():
            raise no_such_array(name)
        return located(name, path, json.loads((path / "zarr.json").read_text()))

    def temp_dir(self, prefix: str) -> Path:
        return Path(tempfile.mkdtemp(prefix=prefix, dir=self.tmp))

    # Where things are built. A store on another medium (service.objectstore) overrides these:
    # a new array is built at a *location* (here a directory under tmp/), written through
    # ``zarr_target`` and made visible by ``publish``; ``discard`` removes an unpublished one.

    def spool_dir(self, prefix: str) -> Path:
        """A new local scratch directory (an upload's spool, an unzipped archive)."""
        return self.temp_dir(prefix)

    def new_version(self, prefix: str) -> Path:
        """A new, empty location to build one array in, for ``publish``."""
        return self.temp_dir(prefix)

    # (url, fsspec options) of the ``scratch`` setting, or None: scratch under the data root.
    scratch_root: tuple[str, dict] | None = None

    def scratch(self, prefix: str) -> tuple[dict, Callable[[], None]]:
        """A new scratch location for one job's intermediate files (``ops.scratch``: GatherNd's
        all-to-all), which the workers reach as they reach the arrays, and its removal."""
        if self.scratch_root is not None:
            return _configured_scratch(*self.scratch_root, prefix)
        path = self.temp_dir(prefix)
        return {"url": str(path), "storage_options": {}}, lambda: shutil.rmtree(path, ignore_errors=True)

    def zarr_target(self, location: Path, sub: str = ""):
        """What Zarr / xarray write to for ``location`` (joined with ``sub``)."""
        return location / sub if sub else location

    def discard(self, location: Path) -> None:
        """Remove a location that was not published (a no-op once it was)."""
        shutil.rmtree(location, ignore_errors=True)

    def storage_error(self, error: BaseException):
        """The ServiceError for a failure of the storage itself seen by a worker, or None
        (a local data root: a full disk is ``errors.disk_full``; anything else is a failure)."""
        return None

    def sweep(self) -> None:
        """Remove everything under tmp/ (work of a service that stopped)."""
        for entry in self.tmp.iterdir():
            shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)

    # --- reading --------------------------------------------------------------------------

    def open(self, name: str, chunks=None, *, pinned: bool = False) -> xr.DataArray:
        """The stored array as a lazy (Dask-backed) DataArray with its real dtype, opened
        read-only (a read-only Zarr store: nothing computed from it can write the input).

        ``pinned=False`` (graphs that the cluster's workers run, in other processes): the graph
        reads the group by its path. Replacing or deleting an array that a running job reads is
        refused (409), so the path keeps its version for the job.

        ``pinned=True`` (reads in this process: the NPY download, a job's inline result): the
        graph reads the version current at this call, through an open descriptor of its
        directory (``/proc/self/fd/N``), however long the read lasts. An overwrite or a delete
        meanwhile moves that directory aside, and ``publish``/``delete`` remove it only when the
        last such reader has let go: the pin lives as long as the Zarr store object that the
        DataArray and its graph refer to (released when they are garbage-collected). So a
        download that began before an overwrite streams the old array to its end, never a mix.
        Where there is no ``/proc`` this falls back to reading by path.
        """
        path = self.path(name)
        if pinned and self._pins.supported:
            try:
                pin = self._pins.pin(path)
            except (FileNotFoundError, NotADirectoryError):
                raise no_such_array(name) from None
            found = self.locate(name, pin.path)
            source = _PinnedStore(pin.path, pin=pin)
        else:
            found = self.locate(name)
            source = zarr.storage.LocalStore(found.path, read_only=True)
        self._refuse_links(name, found.path)
        ds = xr.open_zarr(source, zarr_format=3, consolidated=True, mask_and_scale=False,
                          chunks={} if chunks is None else chunks)
        arr = ds[found.variable]
        arr.attrs.pop("_FillValue", None)
        # The group's attrs (a Dataset's title, history, ...) under the variable's own.
        arr.attrs = {**ds.attrs, **arr.attrs}
        arr.encoding = {}
        return from_stored(arr)

    def info(self, name: str) -> dict:
        """Shape, dtype, chunks, dims and attrs, from the consolidated metadata alone."""
        found = self.locate(name)
        meta = found.meta
        attrs = {**found.group_attrs, **meta.get("attributes", {})}
        dtype = attrs.pop(DTYPE_ATTR, None) or meta["data_type"]
        if dtype == "int8" and attrs.get("dtype") == "bool":  # how xarray before 2026.9 stores bool
            dtype = attrs.pop("dtype")
        for internal in ("_FillValue", "coordinates"):  # xarray's encoding, not the user's attrs
            attrs.pop(internal, None)
        return {
            "name": name,
            "shape": list(meta["shape"]),
            "dtype": dtype,
            "chunks": list(meta["chunk_grid"]["configuration"]["chunk_shape"]),
            "dims": [str(d) for d in meta.get("dimension_names") or ()],
            "attrs": attrs,
        }

    def read_small(self, name: str, limit: int) -> np.ndarray:
        """The whole array in memory, if it is at most ``limit`` bytes (413 otherwise)."""
        arr = self.open(name, pinned=True)
        nbytes = math.prod(arr.shape) * np.dtype(arr.dtype).itemsize
        if nbytes > limit:
            raise too_large(f"the result is {nbytes} bytes, over the {limit}-byte inline limit; "
                            f"download it from /arrays/{name}")
        return np.asarray(arr.values)

    def names(self) -> list[str]:
        return sorted(p.name for p in self.arrays.iterdir()
                      if NAME.fullmatch(p.name) and not p.name.startswith(".") and (p / "zarr.json").is_file())

    def open_key(self, name: str, key: str) -> Path | None:
        """Zarr key ``key`` of array ``name`` for the HTTP route: here its file (None: no such key)."""
        return self.key_path(name, key)

    def key_path(self, name: str, key: str) -> Path | None:
        """The file of Zarr key ``key`` inside array ``name``, or None when there is none."""
        found = self.path(name)
        if not (found / "zarr.json").is_file():
            raise no_such_array(name)
        parts = key.split("/")
        if not key or not all(_KEY_PART.fullmatch(p) and p not in (".", "..") for p in parts):
            return None
        path = found.joinpath(*parts)
        if path.is_symlink() or not path.is_file() or not path.resolve().is_relative_to(found.resolve()):
            return None
        return path

    def iter_npy(self, name: str, piece_bytes: int | None = None) -> tuple[np.dtype, int, Iterator[bytes]]:
        """(dtype, byte length, the NPY bytes in pieces): C order, produced slab by slab, never
        whole in memory."""
        arr = self.open(name, pinned=True)
        dtype = np.dtype(arr.dtype)
        wire, _ = npy.wire_dtype(dtype)
        data = da.asarray(arr.data)  # a 0-d variable opens as NumPy
        target = piece_bytes or self.chunk_bytes
        header = npy.header_bytes(dtype, arr.shape)

        def pieces():
            yield header
            for region in _c_order_regions(arr.shape, data.chunksize, dtype.itemsize, target):
                block = np.asarray(data[region].compute(scheduler="threads"))
                yield np.ascontiguousarray(block).view(wire).tobytes()

        return dtype, len(header) + math.prod(arr.shape) * dtype.itemsize, pieces()

    # --- writing --------------------------------------------------------------------------

    def publish(self, built: Path, name: str, overwrite: bool) -> None:
        """Move the group built at ``built`` (under tmp/) to ``name``; 409 if the name is taken
        and ``overwrite`` is false.

        A new name appears whole in one ``renameat2(RENAME_NOREPLACE)``, so of two publishers
        of one name one wins and the other gets 409. An existing array is replaced by
        ``renameat2(RENAME_EXCHANGE)``: ``arrays/NAME`` goes from the old group to the new one
        in one step, so a reader finds the old array or the new one, never a missing name or
        a mix. The old group (now at ``built``) is moved aside under tmp/ and removed, at once,
        or when the last reader in this process that pinned it (``open(pinned=True)``) lets
        go. Where the C library, kernel or file system lacks renameat2, a check and a rename,
        and two renames to replace (the name absent between them), do instead.
        """
        target = self.path(name)
        for _ in range(16):  # each turn loses only to another writer of this name
            if overwrite and target.exists():
                try:
                    swapped = _rename2(built, target, _RENAME_EXCHANGE)
                except FileNotFoundError:
                    continue  # deleted meanwhile: publish it as a new name
                aside = self.tmp / f"replaced-{uuid.uuid4().hex}"
                if swapped:
                    os.rename(built, aside)  # the old group, out of the caller's cleanup of built
                else:
                    try:
                        os.rename(target, aside)
                    except FileNotFoundError:
                        continue  # deleted meanwhile: publish it as a new name
                    os.rename(built, target)
                self._pins.dispose(aside)
                return
            try:
                if not _rename2(built, target, _RENAME_NOREPLACE):
                    if target.exists():
                        raise FileExistsError(errno.EEXIST, "exists", str(target))
                    os.rename(built, target)  # fails (ENOTEMPTY) if a group appeared meanwhile
                return
            except OSError as error:
                if error.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
            if not overwrite:
                shutil.rmtree(built, ignore_errors=True)
                raise conflict(f"an array named {name!r} exists; use ?overwrite=true to replace it")
        raise conflict(f"the array {name!r} is being replaced by other requests; try again")

    def delete(self, name: str) -> None:
        """Remove the array: the name disappears at once and whole (one rename under tmp/); its
        files go now, or when the last reader in this process that pinned them lets go."""
        path = self.path(name)
        if not (path / "zarr.json").is_file():
            raise no_such_array(name)
        trash = self.tmp / f"deleted-{uuid.uuid4().hex}"
        try:
            os.rename(path, trash)
        except FileNotFoundError:
            raise no_such_array(name) from None
        self._pins.dispose(trash)

    def write_skeleton(self, path: Path, arr: xr.DataArray, chunks: tuple[int, ...], variable: str,
                       group_attrs: dict | None = None):
        """Write the group's metadata (and coordinates) for ``arr``; data chunks come later.

        Returns the Dask store graph (a Delayed) that fills the data variable from ``arr``.
        """
        stored = to_stored(arr)
        ds = stored.to_dataset(name=variable)
        ds.attrs = dict(group_attrs or {})
        # A zero-length axis has Dask blocks of length 0, and a Zarr chunk is at least 1 long
        # (zarr 3.2 and newer refuse 0).
        encoding = {variable: {"chunks": tuple(max(1, c) for c in chunks)}} if stored.ndim else {}
        with ops.fusing_stores():  # to_zarr optimizes the graph it returns as it builds it
            return ds.to_zarr(self.zarr_target(path), zarr_format=3, consolidated=True, compute=False, mode="w",
                              encoding=encoding)

    def npy_upload(self, name: str, *, dims: str | None, chunks: str | None, declared_dtype: str | None,
                   overwrite: bool) -> NpyUpload:
        check_name(name)
        if self.exists(name) and not overwrite:
            raise conflict(f"an array named {name!r} exists; use ?overwrite=true to replace it")
        return NpyUpload(self, name, dims, chunks, declared_dtype, overwrite)

    def zip_upload(self, name: str, archive: Path, *, variable: str | None, dims: str | None,
                   chunks: str | None, overwrite: bool) -> dict:
        """Import a zipped Zarr v3 store (e.g. from ``xarray.Dataset.to_zarr``) as array ``name``."""
        check_name(name)
        if self.exists(name) and not overwrite:
            raise conflict(f"an array named {name!r} exists; use ?overwrite=true to replace it")
        unpacked = self.spool_dir("unzip-")
        built = self.new_version("zip-")
        try:
            try:
                root = zipstore.extract_zarr_zip(archive, unpacked, max_bytes=self.max_upload_bytes,
                                                 max_chunk_bytes=min(MAX_CHUNK_BYTES, self.max_upload_bytes))
            except zipstore.ZipTooLarge as error:
                raise too_large(str(error)) from None
            except zipstore.ZipStoreError as error:
                raise bad_request(str(error)) from None
            try:
                ds = xr.open_zarr(root, zarr_format=3, mask_and_scale=False, chunks={},
                                  consolidated=None)
            except Exception as error:  # whatever zarr/xarray refuse in a client's store
                raise bad_request(f"the zip does not hold a readable Zarr v3 store: {error}") from None
            names = [str(v) for v in ds.data_vars]
            if variable is None:
                if len(names) != 1:
                    raise bad_request(f"the store holds data variables {names}; choose one with ?variable=")
                variable = names[0]
            elif variable not in names:
                raise bad_request(f"variable must be one of the store's data variables {names}, got {variable!r}")
            arr = from_stored(ds[variable])
            arr.attrs.pop("_FillValue", None)
            try:
                dtypes.check_supported(f"variable {variable!r}", arr.dtype)
            except ValueError as error:
                raise bad_request(str(error)) from None
            if dims is not None:
                arr = arr.rename(dict(zip(arr.dims, parse_dims(dims, arr.ndim))))
            wanted = parse_chunks(chunks, arr.shape) or tuple(c[0] if c else 1 for c in arr.chunks)
            arr = arr.chunk(dict(zip(arr.dims, wanted)))
            for coord in arr.coords.values():
                coord.encoding = {}
            arr.encoding = {}
            fill = self.write_skeleton(built, arr, wanted, variable, group_attrs=ds.attrs)
            dask.compute(fill, scheduler="threads")
            self.publish(built, name, overwrite)
        finally:
            shutil.rmtree(unpacked, ignore_errors=True)
            self.discard(built)
        return self.info(name)


class NpyUpload:
    """An NPY body arriving in pieces, written chunk by chunk into a new array.

    Feed it the request body with ``feed`` (cheap, no I/O) and call ``flush`` (blocking: it
    writes every complete chunk) whenever ``pending`` grows past ``chunk_bytes``; ``finish``
    checks the byte count and publishes the array. Memory stays about one chunk.
    """

    def __init__(self, store: ArrayStore, name, dims, chunks, declared_dtype, overwrite):
        self.store, self.name, self.overwrite = store, name, overwrite
        self._dims_text, self._chunks_text, self._declared = dims, chunks, declared_dtype
        self._buffer = bytearray()
        self.header: npy.NpyHeader | None = None
        self.received = 0
        self._written = 0  # data bytes written so far
        self._built = None  # the location being built (ArrayStore.new_version)

    @property
    def pending(self) -> int:
        return len(self._buffer)

    def feed(self, piece: bytes) -> None:
        self._buffer += piece
        self.received += len(piece)
        if self.header is None:
            self.header = npy.parse_header(bytes(self._buffer[: npy.MAX_HEADER_BYTES + 16]),
                                           max_bytes=self.store.max_upload_bytes,
                                           declared_dtype=self._declared)
            if self.header is not None:
                del self._buffer[: self.header.data_offset]
        if self.header is not None and self._written + len(self._buffer) > self.header.nbytes:
            raise npy.NpyError(
                f"NPY body: declared {self.header.nbytes} data bytes, got more "
                f"({self._written + len(self._buffer)} so far)"
            )

    def _prepare(self) -> None:
        h = self.header
        # Fortran-order data is the C-order data of the reversed shape, transposed.
        shape = h.shape[::-1] if h.fortran_order else h.shape
        self._dtype = h.dtype.newbyteorder("<") if h.dtype.byteorder == ">" else h.dtype
        self._stored = stored_dtype(self._dtype)
        self._dims = parse_dims(self._dims_text, len(h.shape)) or tuple(f"dim_{k}" for k in range(len(h.shape)))
        self._final_chunks = parse_chunks(self._chunks_text, h.shape)
        self._stream_chunks = stream_chunks(shape, self._dtype.itemsize, self.store.chunk_bytes)
        self._built = self.store.new_version("npy-")
        self._direct = not h.fortran_order and self._final_chunks in (None, self._stream_chunks)
        if self._direct:
            template = xr.DataArray(da.empty(shape, dtype=self._dtype, chunks=self._stream_chunks), dims=self._dims)
            self.store.write_skeleton(self._built, template, self._stream_chunks, self.name)
            self._target = zarr.open_array(self.store.zarr_target(self._built, self.name), mode="r+",
                                           zarr_format=3)
        else:  # stream into a raw array, then reorder/rechunk it in a second pass
            self._target = zarr.create_array(self.store.zarr_target(self._built, "stream"), shape=shape, dtype=self._stored,
                                             chunks=self._stream_chunks, zarr_format=3, fill_value=0)
        grid = [range(math.ceil(n / c)) for n, c in zip(shape, self._stream_chunks)]
        self._regions = list(itertools.product(*grid))  # C order: the order the bytes arrive in
        self._shape = shape
        self._chunk_index = 0

    def flush(self) -> None:
        """Write every chunk whose bytes have all arrived (blocking)."""
        if self.header is None:
            return
        if self._built is None:
            self._prepare()
        while self._chunk_index < len(self._regions):
            index = self._regions[self._chunk_index]
            region = tuple(slice(i * c, min((i + 1) * c, n))
                           for i, c, n in zip(index, self._stream_chunks, self._shape))
            size = math.prod(s.stop - s.start for s in region) * self._dtype.itemsize
            if len(self._buffer) < size:
                return
            block = np.frombuffer(bytes(self._buffer[:size]), dtype=self.header.dtype)
            del self._buffer[:size]
            self._target[region] = _raw(block, self._stored).reshape([s.stop - s.start for s in region])
            self._written += size
            self._chunk_index += 1

    def finish(self) -> dict:
        """Check the byte count, complete the array and publish it (blocking)."""
        if self.header is None:
            raise npy.NpyError(f"NPY body: {self.received} bytes do not hold a complete NPY header")
        self.flush()
        if self._written + len(self._buffer) != self.header.nbytes or self._chunk_index != len(self._regions):
            raise npy.NpyError(
                f"NPY body: declared {self.header.nbytes} data bytes, got {self._written + len(self._buffer)}"
            )
        if not self._direct:
            data = da.from_zarr(self._target).view(self._dtype)
            if self.header.fortran_order:
                data = data.T
            chunks = self._final_chunks or stream_chunks(data.shape, self._dtype.itemsize, self.store.chunk_bytes)
            arr = xr.DataArray(data.rechunk(chunks), dims=self._dims)
            final = self.store.new_version("npy-final-")
            try:
                fill = self.store.write_skeleton(final, arr, chunks, self.name)
                dask.compute(fill, scheduler="threads")
            except BaseException:
                self.store.discard(final)
                raise
            self.store.discard(self._built)
            self._built = final
        self.store.publish(self._built, self.name, self.overwrite)
        self._built = None
        return self.store.info(self.name)

    def abort(self) -> None:
        if self._built is not None:
            self.store.discard(self._built)
            self._built = None


def _raw(block: np.ndarray, stored: np.dtype) -> np.ndarray:
    """A block as the stored dtype (raw bits for bfloat16/complex32), little-endian."""
    if block.dtype.byteorder == ">":
        block = block.byteswap().view(block.dtype.newbyteorder("<"))
    return block.view(stored) if block.dtype != stored else block


def _c_order_regions(shape, chunks, itemsize: int, target: int):
    """Regions of ``shape`` that, read one after another, give the array in C order.

    Rows of the split axis are taken a whole chunk at a time when that slab is small enough,
    so each stored chunk is read once.
    """
    if not shape:
        yield ()
        return
    if 0 in shape:
        return
    tail, axis = itemsize, -1
    for a in reversed(range(len(shape))):
        if tail * shape[a] > target:
            axis = a
            break
        tail *= shape[a]
    if axis < 0:
        yield tuple(slice(0, n) for n in shape)
        return
    rows = chunks[axis] if chunks[axis] * tail <= 4 * target else max(1, target // tail)
    for lead in itertools.product(*(range(n) for n in shape[:axis])):
        for start in range(0, shape[axis], rows):
            yield (*lead, slice(start, min(start + rows, shape[axis])))


def _jsonable(attrs: dict) -> dict:
    out = {}
    for key, value in attrs.items():
        try:
            json.dumps(value)
            out[str(key)] = value
        except TypeError:
            out[str(key)] = value.tolist() if hasattr(value, "tolist") else str(value)
    return out
