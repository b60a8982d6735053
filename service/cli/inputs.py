"""``chunked-tensor-ops run``'s inputs, opened lazily: a bare Zarr array or a variable of a
group, from a local path or an fsspec URL such as ``s3://bucket/in.zarr`` (exit 3 if
unreadable).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import xarray as xr

from ops.accessor.conventions import cf_encoding
from service.cli.flags import parse_chunks
from service.cli.run_errors import INPUT, RunError, usage
from service.storage import run_storage, variables

@dataclass
class Input:
    """An opened input: where it came from and the lazy array the graph reads."""

    role: str
    path: str
    variable: str | None  # None: a bare Zarr array
    array: xr.DataArray
    global_attrs: dict = field(default_factory=dict)  # the group's own attrs
    companions: dict = field(default_factory=dict)    # variables the array refers to (its grid mapping)


def _zarr_source(path: str, settings):
    """What Zarr and xarray read for ``path``: the path, or a read-only store on a URL."""
    if not run_storage.is_url(path):
        if not Path(path).exists():
            raise RunError(INPUT, f"input {path}: no such file or directory")
        return path
    try:
        found = run_storage.url_exists(path, settings)
    except Exception as error:  # an unreachable endpoint, refused credentials, a missing bucket
        raise RunError(INPUT, f"input {path} cannot be read: {type(error).__name__}: {error}") from None
    if not found:
        raise RunError(INPUT, f"input {path}: nothing is stored there")
    return run_storage.read_store(path, settings)


def _zarr_node(path: str, source):
    import zarr

    try:
        return zarr.open(source, mode="r")
    except Exception as error:  # not Zarr, a v2/v3 metadata error, permissions...
        raise RunError(INPUT, f"input {path} is not a readable Zarr array or group: "
                              f"{type(error).__name__}: {error}") from None


def _bare_array(node, chunks_text: str | None) -> xr.DataArray:
    """A Zarr array as a Dask-backed DataArray; dims from Zarr v3 ``dimension_names`` or
    xarray's v2 ``_ARRAY_DIMENSIONS`` (else xarray's dim_0, dim_1, ...)."""
    import dask.array as da

    attrs = dict(node.attrs)
    names = getattr(node.metadata, "dimension_names", None) or attrs.pop("_ARRAY_DIMENSIONS", None)
    attrs.pop("_ARRAY_DIMENSIONS", None)
    dims = tuple(str(n) for n in names) if names and all(names) else tuple(f"dim_{k}" for k in range(node.ndim))
    chunks = parse_chunks(chunks_text, dims)
    lazy = da.from_zarr(node, chunks=tuple(chunks.get(d, c) for d, c in zip(dims, node.chunks)) if chunks
                        else node.chunks)
    return xr.DataArray(lazy, dims=dims, attrs=attrs)


def _group_variable(path: str, source, node, variable: str | None,
                    chunks_text: str | None) -> tuple[str, xr.DataArray, dict, dict]:
    """A variable of a group, opened with xarray (coordinates kept, CF-decoded as the accessor's
    users open it: ``service.storage.variables``) when xarray can read it."""
    try:
        ds = variables.open_group(source)
    except Exception:  # e.g. Zarr v2 arrays without _ARRAY_DIMENSIONS: read them as bare arrays
        ds = None
    candidates = list(ds.data_vars) if ds is not None else [k for k, _ in node.arrays()]
    if variable is None:
        if len(candidates) != 1:
            raise usage(f"input {path} is a group with {len(candidates)} variables "
                        f"({', '.join(map(str, candidates)) or 'none'}); pick one with --variable NAME")
        variable = str(candidates[0])
    elif variable not in candidates and not (ds is not None and variable in ds.variables):
        raise RunError(INPUT, f"input {path} has no variable {variable!r}; its variables are "
                              f"{', '.join(map(str, candidates)) or 'none'}")
    if ds is None:
        return variable, _bare_array(node[variable], chunks_text), {}, {}
    chunks = parse_chunks(chunks_text, tuple(map(str, ds[variable].dims)))
    if chunks:
        ds = variables.open_group(source, chunks=chunks)
    found = variables.variable_of(ds, variable)
    return variable, found.array, found.global_attrs, found.companions


def open_input(role: str, path: str, variable: str | None, chunks_text: str | None, settings) -> Input:
    """Open ``path`` (a local path or an fsspec URL) lazily: a bare Zarr array, or one
    variable of a group."""
    import zarr

    from service.storage.raw_dtypes import from_stored  # bfloat16/complex32 stored as raw bits + ops_dtype

    source = _zarr_source(path, settings)
    node = _zarr_node(path, source)
    global_attrs, companions = {}, {}
    if isinstance(node, zarr.Array):
        if variable is not None:
            raise usage(f"--variable {variable}: input {path} is a bare Zarr array, not a group")
        arr = _bare_array(node, chunks_text)
        arr.encoding = cf_encoding(arr)  # how it is packed on disk; its chunks and codecs are the input's
        arr = from_stored(arr)
    else:
        variable, arr, global_attrs, companions = _group_variable(path, source, node, variable, chunks_text)
    return Input(role, path, variable, arr, global_attrs, companions)


