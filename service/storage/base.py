"""What the two array stores share (``StoreBase``, the base of ``service.storage.local.ArrayStore``
and ``service.storage.s3.ObjectArrayStore``): the local directories under ``<state dir>/tmp``
(upload spools, unzipped archives, a job's scratch), the sizes a store works in, and the
reads and writes built on a store's own ``locate``, ``open``, ``exists`` and ``zarr_target``.
Also shared: how a stored variable is opened (``open_variable``), which Zarr keys the HTTP
route may serve (``key_parts``) and how a stored key is streamed (``KeyPieces``).

Both stores satisfy ``service.storage.protocol.ArrayStorage``; the methods a store provides
itself (where arrays live differs: directories and renames, or versions and pointers) are
``exists``, ``names``, ``locate``, ``open``, ``open_key``, ``new_version``, ``zarr_target``,
``discard``, ``publish`` and ``delete``.
"""

from __future__ import annotations

import math
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import dask.array as da
import numpy as np
import xarray as xr

from service.errors import conflict, too_large
from service.storage import npy
from service.storage.blocks import DecodedBlocks
from service.storage.budgets import Budgets
from service.storage.chunk_order import c_order_regions
from service.storage import variables
from service.storage.names import KEY_PART, check_name
from service.storage.raw_dtypes import DTYPE_ATTR
from service.storage.scratch import configured_scratch
from service.storage.upload import NpyUpload, import_zip
from service.storage.variables import StoredVariable

# A stored key is streamed to an HTTP client in pieces of this size; an object store's key up
# to this size is read whole before the response starts, so a storage failure is a clean 503.
KEY_PIECE_BYTES = 8 * 2**20


def open_variable(source, variable: str, chunks=None, *, decoded: bool = False) -> StoredVariable:
    """The stored ``variable`` of the group in Zarr store ``source``, lazily, with its group's
    attrs and companions (``service.storage.variables``): ``decoded`` as jobs compute on it
    (as the accessor's users and ``chunked-tensor-ops run`` read it), else the stored values as
    downloads give them. Raw-bit dtypes come back as theirs. Every data root opens its arrays
    through this."""
    ds = variables.open_group(source, chunks, decoded=decoded, consolidated=True, zarr_format=3)
    return variables.variable_of(ds, variable, decoded=decoded)


def key_parts(key: str) -> list[str] | None:
    """The parts of the Zarr key ``key``, or None when it cannot be a key of a stored group:
    only parts made of ``[A-Za-z0-9_.-]``, none of them ``.`` or ``..``, so a key never names
    anything outside its array."""
    parts = key.split("/")
    if not key or not all(KEY_PART.fullmatch(p) and p not in (".", "..") for p in parts):
        return None
    return parts


class KeyPieces:
    """``pieces`` for a stored key (``service.storage.protocol.StoredKey``) that has ``read``."""

    def pieces(self, start: int, end: int) -> Iterator[bytes]:
        """Bytes ``start`` to ``end`` (exclusive), in pieces of at most ``KEY_PIECE_BYTES``."""
        for first in range(start, end, KEY_PIECE_BYTES):
            yield self.read(first, min(end, first + KEY_PIECE_BYTES))


class StoreBase:
    """The code every array store shares. Every method is blocking (run it in a thread from
    async code).

    Parameters
    ----------
    root : Path or str
        The data root: a directory, or an ``s3://bucket/prefix`` URL.
    state_dir : Path
        The local directory of the job records; its ``tmp/`` holds spools and local scratch.
    chunk_bytes : int
        The size aimed at for one stored chunk and one piece of an NPY download.
    max_upload_bytes : int
        The largest array an upload or a job may store.
    budgets : Budgets, optional
        What one stored array may cost (default: the settings' defaults).

    Attributes
    ----------
    scratch_root : tuple of (str, dict) or None
        The ``scratch`` setting as ``(url, fsspec options)``; None: scratch under ``tmp/``.
    upload_class : type
        The ``NpyUpload`` that ``npy_upload`` returns.
    """

    scratch_root: tuple[str, dict] | None = None
    upload_class: type[NpyUpload] = NpyUpload

    def __init__(self, root: Path | str, state_dir: Path, *, chunk_bytes: int, max_upload_bytes: int,
                 budgets: Budgets | None = None):
        self.root = root
        self.state_dir = Path(state_dir).resolve()
        self.tmp = self.state_dir / "tmp"
        self.chunk_bytes = chunk_bytes
        self.max_upload_bytes = max_upload_bytes
        self.budgets = budgets or Budgets.of()
        self._quota_lock = threading.Lock()
        self._held = 0  # bytes of the disk quota held by uploads being built
        self.tmp.mkdir(parents=True, exist_ok=True)

    # --- local directories ----------------------------------------------------------------

    def temp_dir(self, prefix: str) -> Path:
        """A new directory under ``tmp/``."""
        return Path(tempfile.mkdtemp(prefix=prefix, dir=self.tmp))

    def spool_dir(self, prefix: str) -> Path:
        """A new local scratch directory (an upload's spool, an unzipped archive)."""
        return self.temp_dir(prefix)

    def scratch(self, prefix: str) -> tuple[dict, Callable[[], None]]:
        """A new scratch location for one job's intermediate files (``ops.scratch``: GatherNd's
        all-to-all), which the workers reach as they reach the arrays, and its removal."""
        if self.scratch_root is not None:
            return configured_scratch(*self.scratch_root, prefix)
        path = self.temp_dir(prefix)
        return {"url": str(path), "storage_options": {}}, lambda: shutil.rmtree(path, ignore_errors=True)

    def storage_error(self, error: BaseException):
        """The ServiceError for a failure of the storage itself seen by a worker, or None
        (on local disk: a full disk is ``errors.disk_full``; anything else is a failure)."""
        return None

    def sweep(self) -> None:
        """Remove everything under tmp/ (work of a service that stopped)."""
        for entry in self.tmp.iterdir():
            shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)

    # --- reading --------------------------------------------------------------------------

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
        arr = self.open(name, pinned=True).array
        nbytes = math.prod(arr.shape) * np.dtype(arr.dtype).itemsize
        if nbytes > limit:
            raise too_large(f"the result is {nbytes} bytes, over the {limit}-byte inline limit; "
                            f"download it from /arrays/{name}")
        return np.asarray(arr.values)

    def iter_npy(self, name: str, piece_bytes: int | None = None) -> tuple[np.dtype, int, Iterator[bytes]]:
        """(dtype, byte length, the NPY bytes in pieces): C order, produced slab by slab, never
        whole in memory; each stored chunk is decoded once while it fits beside the others
        still needed (four pieces' worth, or one chunk of up to ``max_chunk_bytes``)."""
        arr = self.open(name, pinned=True).array
        dtype = np.dtype(arr.dtype)
        wire, _ = npy.wire_dtype(dtype)
        data = da.asarray(arr.data)  # a 0-d variable opens as NumPy
        target = piece_bytes or self.chunk_bytes
        header = npy.header_bytes(dtype, arr.shape)
        chunk = math.prod(data.chunksize) * dtype.itemsize
        blocks = DecodedBlocks(data, max(4 * target, min(chunk, self.budgets.max_chunk_bytes)))

        def pieces():
            yield header
            for region in c_order_regions(arr.shape, data.chunksize, dtype.itemsize, target):
                yield np.ascontiguousarray(blocks.read(region)).view(wire).tobytes()

        return dtype, len(header) + math.prod(arr.shape) * dtype.itemsize, pieces()

    # --- writing --------------------------------------------------------------------------

    def write_skeleton(self, path, arr: xr.DataArray, chunks: tuple[int, ...], variable: str,
                       group_attrs: dict | None = None, companions: dict | None = None):
        """Write the group's metadata (and coordinates) for ``arr`` at location ``path`` (from
        ``new_version``); data chunks come later. ``arr`` is packed as its ``encoding`` says
        (``service.storage.variables.output_dataset``), under ``group_attrs``, with the
        ``companions`` variables it names.

        Returns the Dask store graph (a Delayed) that fills the data variable from ``arr``.
        """
        # A zero-length axis has Dask blocks of length 0, and a Zarr chunk is at least 1 long
        # (zarr 3.2 and newer refuse 0).
        chunks = tuple(max(1, c) for c in chunks)
        # (raw-bit dtypes are stored in as many bytes as they have)
        self.budgets.check_grid(f"array {variable!r}", arr.shape, chunks, np.dtype(arr.dtype).itemsize, too_large)
        ds, encoding = variables.output_dataset(arr, variable, chunks, group_attrs, companions)
        return variables.store_graph(ds, encoding, variable, self.zarr_target(path))

    def hold_quota(self, name: str, nbytes: int, overwrite: bool) -> Callable[[], None]:
        """Hold ``nbytes`` of the disk quota for array ``name`` while it is built; returns what
        gives them back. 413 when the stored arrays (less ``name`` if it is replaced), what
        other uploads hold and ``nbytes`` would pass ``disk_quota_bytes``."""
        quota = self.budgets.disk_quota_bytes
        if quota is None:
            return lambda: None
        with self._quota_lock:
            used = self.stored_bytes() + self._held
            if overwrite and self.exists(name):
                used -= self.stored_bytes(name)
            if used + nbytes > quota:
                raise too_large(f"array {name!r} ({nbytes} bytes) would bring the stored arrays to {used + nbytes} "
                                f"bytes, {self.budgets.over('disk_quota_bytes')}; delete arrays or ask the operator "
                                "for room")
            self._held += nbytes

        def release() -> None:
            with self._quota_lock:
                self._held -= nbytes
        return release

    def npy_upload(self, name: str, *, dims: str | None, chunks: str | None, declared_dtype: str | None,
                   overwrite: bool) -> NpyUpload:
        """A streamed NPY upload into array ``name`` (409 now if the name is taken and not
        ``overwrite``)."""
        check_name(name)
        if self.exists(name) and not overwrite:
            raise conflict(f"an array named {name!r} exists; use ?overwrite=true to replace it")
        return self.upload_class(self, name, dims, chunks, declared_dtype, overwrite)

    def zip_upload(self, name: str, archive: Path, *, variable: str | None, dims: str | None,
                   chunks: str | None, overwrite: bool) -> dict:
        """Import a zipped Zarr v3 store (e.g. from ``xarray.Dataset.to_zarr``) as array ``name``."""
        return import_zip(self, name, archive, variable=variable, dims=dims, chunks=chunks, overwrite=overwrite)
