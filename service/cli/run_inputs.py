"""``chunked-tensor-ops run``'s flags and inputs: ``--param``, ``--input``, ``--variable`` and
``--chunks`` parsed and checked against the operator (exit 2 with the operator's own message),
and the inputs opened lazily, a bare Zarr array or a variable of a group, from a local path or
an fsspec URL such as ``s3://bucket/in.zarr`` (exit 3 if unreadable).
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import xarray as xr

from ops import _validate, registry
from ops.errors import InvalidArgument
from service.cli.run_errors import INPUT, RunError, usage
from service.storage import run_storage

# --- command-line values --------------------------------------------------------------------


def parse_value(text: str):
    """A ``--param`` value: JSON (``2``, ``[[1,1],[0,0]]``, ``true``, ``"DCR"``), or the text
    itself when it is not JSON (``DCR``, ``float16``)."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def parse_params(items: list[str]) -> dict[str, object]:
    """``["block_size=2", "mode=DCR"]`` -> ``{"block_size": 2, "mode": "DCR"}``."""
    params: dict[str, object] = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or not name:
            raise usage(f"--param must be NAME=VALUE (VALUE as JSON), got {item!r}")
        if name in params:
            raise usage(f"--param {name} is given twice")
        params[name] = parse_value(text)
    return params


def parse_inputs(items: list[str], op: registry.Operator) -> dict[str, str]:
    """``--input PATH`` (the operator's first array input) or ``--input ROLE=PATH``."""
    inputs: dict[str, str] = {}
    for item in items:
        role, sep, path = item.partition("=")
        if not (sep and role in op.array_inputs):
            role, path = op.array_inputs[0], item
        if role in inputs:
            raise usage(f"--input {role} is given twice; {op.name} takes the array inputs "
                        f"{', '.join(op.array_inputs)} (--input ROLE=PATH)")
        if not path:
            raise usage(f"--input {role} needs a path, got {item!r}")
        inputs[role] = path
    return inputs


def parse_variables(items: list[str], op: registry.Operator) -> dict[str, str]:
    """``--variable NAME`` (the first array input) or ``--variable ROLE=NAME``."""
    variables: dict[str, str] = {}
    for item in items:
        role, sep, name = item.partition("=")
        if not (sep and role in op.array_inputs):
            role, name = op.array_inputs[0], item
        variables[role] = name
    return variables


def parse_chunks(text: str | None, dims: tuple[str, ...]) -> dict | None:
    """``--chunks``: ``1,64,64,16`` (one length per axis, -1 for a whole axis), ``y=64,x=64``
    (by dim name; other axes keep the stored chunks) or ``auto``. None: the stored chunks."""
    if text is None:
        return None
    if text == "auto":
        return {d: "auto" for d in dims}
    parts = [p.strip() for p in text.split(",")]
    try:
        if all("=" in p for p in parts):
            chunks = {name: int(n) for name, n in (p.split("=", 1) for p in parts)}
            unknown = [d for d in chunks if d not in dims]
            if unknown:
                raise usage(f"--chunks names the dim {unknown[0]!r}, which the input does not have; "
                            f"its dims are {list(dims)}; got {text!r}")
        else:
            lengths = [int(p) for p in parts]
            if len(lengths) != len(dims):
                raise usage(f"--chunks must give one length per axis ({len(dims)}), got {text!r}")
            chunks = dict(zip(dims, lengths))
    except ValueError:
        raise usage(f"--chunks must be comma-separated integers, NAME=INTEGER pairs or auto, got {text!r}") \
            from None
    bad = [n for n in chunks.values() if n < 1 and n != -1]
    if bad:
        raise usage(f"--chunks lengths must be >= 1 (or -1 for a whole axis), got {text!r}")
    return chunks


# --- inputs -----------------------------------------------------------------------------------


@dataclass
class Input:
    """An opened input: where it came from and the lazy array the graph reads."""

    role: str
    path: str
    variable: str | None  # None: a bare Zarr array
    array: xr.DataArray


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


def _open_dataset(path, chunks) -> xr.Dataset:
    """The group as xarray reads it, values as stored (no masking, scaling or time decoding)."""
    with warnings.catch_warnings():  # a group without consolidated metadata is read all the same
        warnings.filterwarnings("ignore", message="Failed to open Zarr store with consolidated metadata")
        return xr.open_zarr(path, chunks=chunks, mask_and_scale=False, decode_times=False,
                            decode_timedelta=False)


def _group_variable(path: str, source, node, variable: str | None,
                    chunks_text: str | None) -> tuple[str, xr.DataArray]:
    """A variable of a group, opened with xarray (coordinates kept) when xarray can read it."""
    try:
        ds = _open_dataset(source, chunks={})
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
        return variable, _bare_array(node[variable], chunks_text)
    arr = ds[variable]
    chunks = parse_chunks(chunks_text, tuple(map(str, arr.dims)))
    if chunks:
        arr = _open_dataset(source, chunks=chunks)[variable]
    arr.attrs.pop("_FillValue", None)
    arr.attrs = {**ds.attrs, **arr.attrs}
    return variable, arr


def open_input(role: str, path: str, variable: str | None, chunks_text: str | None, settings) -> Input:
    """Open ``path`` (a local path or an fsspec URL) lazily: a bare Zarr array, or one
    variable of a group."""
    import zarr

    from service.storage.raw_dtypes import from_stored  # bfloat16/complex32 stored as raw bits + ops_dtype

    source = _zarr_source(path, settings)
    node = _zarr_node(path, source)
    if isinstance(node, zarr.Array):
        if variable is not None:
            raise usage(f"--variable {variable}: input {path} is a bare Zarr array, not a group")
        arr = _bare_array(node, chunks_text)
    else:
        variable, arr = _group_variable(path, source, node, variable, chunks_text)
    arr.encoding = {}
    return Input(role, path, variable, from_stored(arr))


def scalar_or_array(role: str, value, op: registry.Operator):
    """An array input given with ``--param`` (JSON): a number for a scalar input, else an array."""
    if role in op.scalar_inputs and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    try:
        return np.asarray(value)
    except ValueError as error:
        raise usage(f"--param {role} must be a JSON array (or give --input {role}=PATH): {error}") from None


def check_arguments(op: registry.Operator, input_items: list[str], param_items: list[str],
                    variable_items: list[str]) -> tuple[dict, dict, dict, dict]:
    """The flags, checked against the operator before anything is read: (keyword parameters,
    input paths by role, variables by role, array inputs given as JSON values, the ``dims``
    mapping of roles to dim names or None)."""
    params = parse_params(param_items)
    paths = parse_inputs(input_items, op)
    variables = parse_variables(variable_items, op)
    literal_arrays = {k: params.pop(k) for k in list(params) if k in op.array_inputs}
    dims = params.pop("dims", None) if op.accepts_dims else None
    if dims is not None and not (isinstance(dims, dict) and all(isinstance(v, str) for v in dims.values())):
        raise usage(f"--param dims must map roles to dim names as JSON, e.g. dims={{\"H\":\"row\"}}; got {dims!r}")
    both = [k for k in literal_arrays if k in paths]
    if both:
        raise usage(f"{both[0]} is given both as --input and as --param; give it once")
    unknown = [k for k in params if k not in op.keywords]
    if unknown:
        raise usage(f"{op.name} has no parameter {unknown[0]!r}; its parameters are {', '.join(op.keywords)}")
    missing = [k for k in op.array_inputs if k not in paths and k not in literal_arrays]
    if missing:
        hint = (f"--input {missing[0]}=PATH or --param {missing[0]}=NUMBER" if missing[0] in op.scalar_inputs
                else f"--input {missing[0]}=PATH" if missing[0] != op.array_inputs[0] else "--input PATH")
        raise usage(f"{op.name} needs the array input {missing[0]!r} ({hint})")
    required = [k for k, f in op.params.model_fields.items() if f.is_required() and k not in params]
    if required:
        raise usage(f"{op.name} needs the parameter {required[0]!r} (--param {required[0]}=VALUE)")
    stray = [k for k in variables if k not in paths]
    if stray:
        raise usage(f"--variable {stray[0]}=...: there is no --input {stray[0]}")
    try:
        _validate.params(op.params, **params)  # the operator's own message
    except InvalidArgument as error:
        raise usage(str(error)) from None
    return params, paths, variables, literal_arrays, dims
