"""A variable of a Zarr group as every door reads and writes it: the service's jobs and
uploads, and ``chunked-tensor-ops run``.

Reading, a variable comes with what it needs from its group: the group's own attrs (a
Dataset's ``title``, ``Conventions``, ``history`` stay the group's, never the variable's) and
its companions, the variables it names (its CF grid mapping). Decoded, it is what xarray users
compute on (missing values as NaN, packed values unpacked, times as dates), its packing kept
in ``encoding``; raw, it is the stored values, its fill value in ``encoding`` rather than its
attrs (so that writing it again keeps the missing values).

Writing, ``output_dataset`` puts a result back in a group the same way: the group's attrs, the
companions as coordinates, and every variable packed as its source was.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import dask.array as da
import numpy as np
import xarray as xr
import zarr
from xarray.backends.zarr import encode_zarr_variable

import ops
from ops._fused_stores import fusing
from ops.accessor.conventions import cf_encoding
from service.storage.chunk_writes import SampledFillCheck
from service.storage.raw_dtypes import from_stored, to_stored

# xarray's attrs of a variable read without decoding that are its encoding, not the user's
FILL_ATTRS = ("_FillValue",)


@dataclass
class StoredVariable:
    """A variable opened lazily, with its group's attrs and its companion variables."""

    array: xr.DataArray
    global_attrs: dict = field(default_factory=dict)
    companions: dict = field(default_factory=dict)  # name -> xr.Variable (the grid mapping)
    variable: str | None = None  # the variable's own name in a dataset (a result keeps it)


def open_group(source, chunks=None, *, decoded: bool = True, consolidated: bool | None = None,
               zarr_format: int | None = None) -> xr.Dataset:
    """The Zarr group at ``source`` (a path or a Zarr store), lazily (``chunks``: Dask chunks
    per dim, default the stored ones). ``decoded``: CF-decoded as ``xr.open_zarr`` reads it by
    default; else the raw stored values (``mask_and_scale=False``)."""
    with warnings.catch_warnings():  # a group without consolidated metadata is read all the same
        warnings.filterwarnings("ignore", message="Failed to open Zarr store with consolidated metadata")
        return xr.open_zarr(source, chunks={} if chunks is None else chunks, consolidated=consolidated,
                            zarr_format=zarr_format, **({} if decoded else {"mask_and_scale": False}))


def variable_of(ds: xr.Dataset, variable: str, *, decoded: bool = True) -> StoredVariable:
    """Variable ``variable`` of ``ds`` (from ``open_group``) with its group's attrs and
    companions; its packing in ``encoding`` (its chunks and codecs are the input's, not kept)."""
    arr = ds[variable]
    if decoded:
        arr.encoding = cf_encoding(arr)
    else:
        fill = {k: arr.attrs.pop(k) for k in FILL_ATTRS if k in arr.attrs}
        arr.encoding = fill
    mapping = arr.encoding.get("grid_mapping", arr.attrs.get("grid_mapping"))
    companions = {mapping: ds[mapping].variable} if mapping in ds.variables and mapping != variable else {}
    return StoredVariable(from_stored(arr), dict(ds.attrs), companions)


def uncompressed_bytes(arr: xr.DataArray, companions: dict | None = None) -> int:
    """The bytes a stored copy of ``arr`` counts against the disk quota: its values (in the
    dtype its encoding packs them to, if any), its coordinates and its ``companions``
    variables, uncompressed (an upper bound on the files)."""
    values = arr.size * np.dtype(arr.encoding.get("dtype", arr.dtype)).itemsize
    return values + sum(c.nbytes for c in arr.coords.values()) + sum(
        v.nbytes for v in (companions or {}).values())


def output_dataset(result: xr.DataArray, variable: str, chunks: tuple[int, ...], global_attrs: dict | None = None,
                   companions: dict | None = None) -> tuple[xr.Dataset, dict]:
    """``(dataset, encoding)`` for ``to_zarr``: ``result`` as variable ``variable`` of a group
    with ``global_attrs`` and ``companions`` (as coordinates), every variable packed as its
    ``encoding`` says (``cf_encoding``), the data in Zarr chunks ``chunks``."""
    ds = to_stored(result).to_dataset(name=variable)
    ds.attrs = dict(global_attrs or {})  # the group's attrs stay the group's
    carried = {k: v for k, v in (companions or {}).items() if k not in ds.variables}
    ds = ds.assign_coords(carried)  # the grid mapping the variable names, with it
    for name in ds.variables:  # the inputs' chunks and codecs are not the output's; packing is
        ds[name].encoding = cf_encoding(ds[name])
    # to_zarr's encoding replaces a variable's own: the packing goes with the chunks
    encoding = {variable: {**ds[variable].encoding, "chunks": chunks}} if result.ndim else {}
    return ds, encoding


def store_graph(ds: xr.Dataset, encoding: dict, variable: str, target):
    """Write the group ``ds`` (``output_dataset``) to ``target`` (a path or a Zarr store),
    all but the data of ``variable``, and return the Dask graph that writes that data: a
    collection whose multi-output tasks store their own blocks (``ops._fused_stores``).

    ``to_zarr(compute=False)`` would return the data's graph wrapped in a Delayed, whose
    making builds and optimizes every task in this process (minutes for a million blocks).
    Here the group's metadata and small variables come from ``to_zarr`` on a stand-in of one
    block (its graph is never computed), and the data, packed by xarray's own Zarr encoder,
    is stored by ``da.store``: a graph made where it is computed (the scheduler).
    """
    data = ds[variable]
    if data.ndim == 0 or not isinstance(data.data, da.Array):
        with ops.fusing_stores():  # to_zarr optimizes the graph it returns as it builds it
            return ds.to_zarr(target, zarr_format=3, consolidated=True, compute=False, mode="w", encoding=encoding)
    _check_aligned(variable, data.data.chunks, encoding.get(variable, {}).get("chunks"))
    stand_in = ds.drop_vars(variable).load()
    stand_in[variable] = data.copy(data=da.zeros(data.shape, dtype=data.dtype, chunks=data.shape))
    stand_in.to_zarr(target, zarr_format=3, consolidated=False, compute=False, mode="w", encoding=encoding)
    plain = data.variable.copy(deep=False)
    plain.encoding = dict(encoding.get(variable, data.encoding))
    encoded = encode_zarr_variable(plain, name=variable, zarr_format=3)
    array = zarr.open_group(target, mode="r+", zarr_format=3)[variable]
    stored = da.store(encoded.data, SampledFillCheck(array), lock=False, compute=False)
    zarr.consolidate_metadata(target, zarr_format=3)  # what to_zarr(consolidated=True) writes
    return fusing(stored)


def _check_aligned(variable: str, dask_chunks, zarr_chunks) -> None:
    """Refuse, as ``to_zarr`` does, Dask blocks that would share a Zarr chunk: written by two
    tasks at once (no lock), one would overwrite the other's part."""
    if zarr_chunks is None:
        return
    for axis, (blocks, size) in enumerate(zip(dask_chunks, zarr_chunks)):
        start = 0
        for length in blocks[:-1]:
            start += length
            if start % size:
                raise ValueError(f"variable {variable!r}: Dask blocks {list(blocks)} on axis {axis} do not "
                                 f"end on the Zarr chunks of {size}")
