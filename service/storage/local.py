"""The array store of a local data root: every array is a Zarr v3 group under
``<data root>/arrays/<name>`` (``ArrayStore``).

A group holds one data variable (named after the array for NPY uploads and results, or as
it was in an uploaded xarray store) with xarray's ``dimension_names``, its coordinates and
attrs, and consolidated metadata in the root ``zarr.json``, so ``xarray.open_zarr`` reads it
over HTTP. Zarr v3 has no bfloat16 or complex32: those are stored as their raw bits
(``service.storage.raw_dtypes``).

Nothing appears half-written: every array is built under ``<data root>/tmp`` and moved into
place with one ``rename``; an existing array is replaced by swapping the two groups in one
``renameat2(RENAME_EXCHANGE)`` (``ArrayStore.publish``, ``service.storage.publish``), so a
reader sees the old array or the new one, never a mix and never a missing name. Reads in this
process hold the version they started on (``ArrayStore.open(pinned=True)``,
``service.storage.pins``) until they finish.

A data root in an object store (``s3://bucket/prefix``) is ``service.storage.s3.ObjectArrayStore``:
the same groups and the same interface, with versions and pointer objects instead of
directories and renames (docs/storage.md). What both share: an array is built at a *location*
(``new_version``), written through ``zarr_target``, made visible by ``publish`` and, if it
never was, removed by ``discard``.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import dask.array as da
import numpy as np
import xarray as xr
import zarr

import ops
from service.errors import bad_request, conflict, no_such_array, too_large
from service.storage import npy
from service.storage.chunk_order import c_order_regions
from service.storage.metadata import Located, located
from service.storage.names import KEY_PART, NAME, check_name
from service.storage.pins import PinnedStore, Pins
from service.storage.publish import publish_group
from service.storage.raw_dtypes import DTYPE_ATTR, from_stored, to_stored
from service.storage.scratch import configured_scratch
from service.storage.upload import NpyUpload, import_zip



def open_variable(source, variable: str, chunks=None) -> xr.DataArray:
    """The stored ``variable`` of the group in Zarr store ``source``, lazily, as the operators
    take it: raw values (no mask or scale), the group's attrs under the variable's own, no
    encoding, raw-bit dtypes back to theirs. Every data root opens its arrays through this."""
    ds = xr.open_zarr(source, zarr_format=3, consolidated=True, mask_and_scale=False,
                      chunks={} if chunks is None else chunks)
    arr = ds[variable]
    arr.attrs.pop("_FillValue", None)
    # The group's attrs (a Dataset's title, history, ...) under the variable's own.
    arr.attrs = {**ds.attrs, **arr.attrs}
    arr.encoding = {}
    return from_stored(arr)

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
        self._pins = Pins()

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

    # Where things are built. A store on another medium (service.storage.s3) overrides these:
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
            return configured_scratch(*self.scratch_root, prefix)
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
            source = PinnedStore(pin.path, pin=pin)
        else:
            found = self.locate(name)
            source = zarr.storage.LocalStore(found.path, read_only=True)
        self._refuse_links(name, found.path)
        return open_variable(source, found.variable, chunks)

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
        if not key or not all(KEY_PART.fullmatch(p) and p not in (".", "..") for p in parts):
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
            for region in c_order_regions(arr.shape, data.chunksize, dtype.itemsize, target):
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
        publish_group(built, self.path(name), name, overwrite, tmp=self.tmp, dispose=self._pins.dispose)

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
        return import_zip(self, name, archive, variable=variable, dims=dims, chunks=chunks, overwrite=overwrite)
