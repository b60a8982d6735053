"""What the body of ``PUT /arrays/NAME`` becomes: an NPY streamed chunk by chunk into a new
array (``NpyUpload``), or a zipped Zarr v3 store imported (``import_zip``).

Both build the array at a new location of the store and publish it whole; whatever fails
before leaves nothing behind. The store (``service.storage.local.ArrayStore`` or its object
store subclass) is passed in: this module does not import it.
"""

from __future__ import annotations

import itertools
import math
import shutil
from pathlib import Path

import dask
import dask.array as da
import numpy as np
import xarray as xr
import zarr

from ops import dtypes
from service.errors import bad_request, conflict, too_large
from service.storage import npy, variables
from service.storage.chunk_check import Refused, check_chunks
from service.storage.chunk_order import stream_chunks
from service.storage.names import check_name, check_variable_dims, parse_chunks, parse_dims
from service.storage.raw_dtypes import stored_block, stored_dtype
from service.storage.zip_checks import ZipStoreError, ZipTooLarge
from service.storage.zip_extract import extract_zarr_zip


class NpyUpload:
    """An NPY body arriving in pieces, written chunk by chunk into a new array.

    Feed it the request body with ``feed`` (cheap, no I/O) and call ``flush`` (blocking: it
    writes every complete chunk) whenever ``pending`` grows past ``chunk_bytes``; ``finish``
    checks the byte count and publishes the array. Memory stays about one chunk. ``store`` is
    the ``ArrayStore`` (or ``ObjectArrayStore``) it builds the array in.
    """

    def __init__(self, store, name, dims, chunks, declared_dtype, overwrite):
        self.store, self.name, self.overwrite = store, name, overwrite
        self._dims_text, self._chunks_text, self._declared = dims, chunks, declared_dtype
        self._buffer = bytearray()
        self.header: npy.NpyHeader | None = None
        self.received = 0
        self._written = 0  # data bytes written so far
        self._built = None  # the location being built (ArrayStore.new_version)
        self._release = lambda: None  # gives back the disk quota the upload holds

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
                self._plan()
        if self.header is not None and self._written + len(self._buffer) > self.header.nbytes:
            raise npy.NpyError(
                f"NPY body: declared {self.header.nbytes} data bytes, got more "
                f"({self._written + len(self._buffer)} so far)"
            )

    def _plan(self) -> None:
        """The array's dims and chunks, checked against the store's budgets as soon as the
        header is in (arithmetic only: ``feed`` runs on the event loop)."""
        h = self.header
        # Fortran-order data is the C-order data of the reversed shape, transposed.
        self._shape = h.shape[::-1] if h.fortran_order else h.shape
        self._dtype = h.dtype.newbyteorder("<") if h.dtype.byteorder == ">" else h.dtype
        self._dims = parse_dims(self._dims_text, len(h.shape)) or tuple(f"dim_{k}" for k in range(len(h.shape)))
        check_variable_dims(self.name, self._dims, "array name")
        self._final_chunks = parse_chunks(self._chunks_text, h.shape)
        self._stream_chunks = stream_chunks(self._shape, self._dtype.itemsize, self.store.chunk_bytes)
        budgets = self.store.budgets
        budgets.check_grid("the NPY, stored", self._shape, self._stream_chunks,
                           self._dtype.itemsize, too_large)
        if self._final_chunks is not None:
            budgets.check_grid("?chunks=", h.shape, self._final_chunks, self._dtype.itemsize, bad_request)

    def _prepare(self) -> None:
        h = self.header
        shape = self._shape
        self._release = self.store.hold_quota(self.name, h.nbytes, self.overwrite)
        self._stored = stored_dtype(self._dtype)
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
            self._target[region] = stored_block(block, self._stored).reshape([s.stop - s.start for s in region])
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
        self._release()
        self._release = lambda: None


def _unpack(store, archive: Path, unpacked: Path) -> Path:
    """Extract the archive into ``unpacked`` and check it: its entries, its Zarr metadata
    against the store's budgets, then every chunk decoded in a subprocess; its store root."""
    budgets = store.budgets
    try:
        root = extract_zarr_zip(archive, unpacked, max_bytes=store.max_upload_bytes,
                                max_chunk_bytes=budgets.max_chunk_bytes, budgets=budgets)
        check_chunks(root, budgets)
    except (ZipTooLarge, ZipStoreError, Refused) as error:
        too_big = isinstance(error, ZipTooLarge) or getattr(error, "status", 400) == 413
        raise (too_large if too_big else bad_request)(str(error)) from None
    return root


def import_zip(store, name: str, archive: Path, *, variable: str | None, dims: str | None,
               chunks: str | None, overwrite: bool) -> dict:
    """Import a zipped Zarr v3 store (e.g. from ``xarray.Dataset.to_zarr``) as array ``name``
    of ``store`` (``ArrayStore.zip_upload``); returns its ``info``."""
    check_name(name)
    if store.exists(name) and not overwrite:
        raise conflict(f"an array named {name!r} exists; use ?overwrite=true to replace it")
    unpacked = store.spool_dir("unzip-")
    built = store.new_version("zip-")
    release = None
    try:
        root = _unpack(store, archive, unpacked)
        try:
            # Each array's own zarr.json, which the checks above have read (consolidated
            # metadata, which Zarr would otherwise trust, may say something else).
            ds = variables.open_group(root, decoded=False, consolidated=False, zarr_format=3)
        except Exception as error:  # whatever zarr/xarray refuse in a client's store
            raise bad_request(f"the zip does not hold a readable Zarr v3 store: {error}") from None
        names = [str(v) for v in ds.data_vars]
        if variable is None:
            if len(names) != 1:
                raise bad_request(f"the store holds data variables {names}; choose one with ?variable=")
            variable = names[0]
        elif variable not in names:
            raise bad_request(f"variable must be one of the store's data variables {names}, got {variable!r}")
        # The stored values as they are, their fill value (the missing values of packed data)
        # in the encoding, so that it is written again; the grid mapping comes along.
        found = variables.variable_of(ds, variable, decoded=False)
        arr = found.array
        try:
            dtypes.check_supported(f"variable {variable!r}", arr.dtype)
        except ValueError as error:
            raise bad_request(str(error)) from None
        if dims is not None:
            arr = arr.rename(dict(zip(arr.dims, parse_dims(dims, arr.ndim))))
        check_variable_dims(variable, arr.dims, "variable")
        wanted = parse_chunks(chunks, arr.shape)
        if wanted is not None:
            store.budgets.check_grid("?chunks=", arr.shape, wanted, arr.dtype.itemsize, bad_request)
        wanted = wanted or tuple(c[0] if c else 1 for c in arr.chunks)
        arr = arr.chunk(dict(zip(arr.dims, wanted)))
        for coord in arr.coords.values():
            coord.encoding = {}
        arr.encoding = {k: v for k, v in found.array.encoding.items() if k in variables.FILL_ATTRS}
        release = store.hold_quota(name, variables.uncompressed_bytes(arr, found.companions), overwrite)
        fill = store.write_skeleton(built, arr, wanted, variable, group_attrs=found.global_attrs,
                                    companions=found.companions)
        try:
            dask.compute(fill, scheduler="threads")
        except (ValueError, RuntimeError) as error:  # a chunk Zarr refuses that the checker let through
            raise bad_request(f"the zip's chunks cannot be decoded: {type(error).__name__}: {error}") from None
        store.publish(built, name, overwrite)
    finally:
        shutil.rmtree(unpacked, ignore_errors=True)
        store.discard(built)
        if release is not None:
            release()
    return store.info(name)
