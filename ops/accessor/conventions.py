"""xarray conventions for the ``.ops`` accessor: keyword or mapping arguments, ``keep_attrs``,
argument checks that speak in dim names, and the accessor's ``repr``.

The plain ``ops`` functions see positional axes and word their errors that way
(``x.shape[1]``, ``spatial dim 0``). The accessor checks the same rules first, on the names
the caller used, so a DataArray user reads ``dim 'y'`` and ``block_shape={'y': 2.0}``; the
few rules left to the functions are reworded by ``in_dim_terms``.
"""

from __future__ import annotations

import difflib

import json
import re
from collections.abc import Mapping

import numpy as np
import xarray as xr

from ops._validate import INT64_MAX, _is_integer
from ops.accessor.history import HISTORY
from ops.dims import layout_of
from ops.errors import InvalidArgument

OPERATORS = ("depth_to_space", "space_to_depth", "space_to_batch", "space_to_batch_nd", "batch_to_space_nd",
             "gather_nd", "ascend_dequant", "invert")


# ---------------------------------------------------------------------------------------------
# Mapping or keywords (xarray's either_dict_or_kwargs)


# How a variable is written in CF terms: how its values are packed and marked missing on disk,
# and which grid mapping variable it names. A rearranged or gathered variable holds the same
# kind of values, so it is written back the same way. Chunks and codecs belong to the store
# the result goes to and are not carried.
CF_ENCODING = ("dtype", "scale_factor", "add_offset", "_FillValue", "missing_value", "units", "calendar",
               "grid_mapping")


def cf_encoding(arr) -> dict:
    """The CF keys of ``arr.encoding`` (``CF_ENCODING``), for the result of a rearrangement."""
    return {key: arr.encoding[key] for key in CF_ENCODING if key in arr.encoding}


def _is_nan(value) -> bool:
    return (isinstance(value, str) and value == "NaN") or (
        isinstance(value, (float, np.floating)) and bool(np.isnan(value)))


def pad_value(arr, value):
    """The pad value for SpaceToBatchND on ``arr``: NaN on integers read without decoding
    (``mask_and_scale=False``) that carry a ``_FillValue`` (or ``missing_value``) is that fill
    value, the missing value of packed data; anything else as given (the operator checks it
    against the dtype)."""
    if _is_nan(value) and np.dtype(arr.dtype).kind in "iu":
        for key in ("_FillValue", "missing_value"):
            fill = arr.encoding.get(key, arr.attrs.get(key))
            if fill is not None and np.ndim(fill) == 0:
                return fill.item() if isinstance(fill, np.generic) else fill
    return value


def json_number(value):
    """``value`` as JSON can hold it (``ops_history``): NaN as ``"NaN"``, NumPy scalars as Python's."""
    if _is_nan(value):
        return "NaN"
    return value.item() if isinstance(value, np.generic) else value


def name_of(arr):
    """The name a result of ``arr`` carries: its name, unless xarray took it from the Dask array
    (an unnamed lazy DataArray is named after its graph key, which means nothing to a reader)."""
    data = arr.variable._data
    return None if getattr(data, "name", None) == arr.name and hasattr(data, "__dask_graph__") else arr.name


def either_dict_or_kwargs(mapping, keywords: Mapping, param: str, method: str, dims=(), parameters=()) -> dict:
    """``mapping`` or the ``**keywords`` form of the same argument, never both.

    As ``DataArray.coarsen(dim=None, **window_kwargs)``: ``.ops.space_to_batch_nd(y=2, x=2)``
    equals ``.ops.space_to_batch_nd({"y": 2, "x": 2})``. A keyword that names none of ``dims``
    but looks like a misspelling of one of ``parameters`` (``padings=``) is refused as such,
    rather than taken for a dim.
    """
    for key in keywords:
        close = difflib.get_close_matches(key, parameters, n=1) if key not in dims else []
        if close:  # a dim the array lacks is the later checks' business (a Dataset skips such variables)
            raise InvalidArgument(
                f"{method}: {key!r} is neither a dim of the array {tuple(dims)} nor a parameter of "
                f"{method}; did you mean {close[0]}=?"
            )
    if mapping is None:
        return dict(keywords)
    if keywords:
        given = ", ".join(f"{k}={v!r}" for k, v in keywords.items())
        raise InvalidArgument(
            f"{method}: give {param} either as a mapping or as keywords, not both; got "
            f"{param}={mapping!r} and {given}"
        )
    if not isinstance(mapping, Mapping):
        raise InvalidArgument(
            f"{method}: {param} must map spatial dim names to block sizes, e.g. {param}={{'y': 2, 'x': 2}} "
            f"or .ops.{method}(y=2, x=2), got {mapping!r}"
        )
    return dict(mapping)


# ---------------------------------------------------------------------------------------------
# keep_attrs


def keep_attrs_default(keep_attrs, default: bool = True) -> bool:
    """``keep_attrs`` as xarray resolves it: the keyword if given, else ``xr.set_options``'s
    ``keep_attrs``, else ``default`` (True, as ``coarsen``, ``isel`` and arithmetic have it)."""
    if keep_attrs is None:
        option = xr.get_options()["keep_attrs"]
        return default if option == "default" else bool(option)
    if not isinstance(keep_attrs, (bool, np.bool_)):
        raise InvalidArgument(f"keep_attrs must be True, False or None, got {keep_attrs!r}")
    return bool(keep_attrs)


def apply_keep_attrs(out, keep_attrs, *, history: bool = True):
    """``out`` (attrs: the input's plus ``ops_history``) with the input's attrs dropped when
    ``keep_attrs`` resolves to False; this step's ``ops_history`` entry stays so that
    ``.ops.invert()`` still works (``history=False``: drop it too)."""
    if keep_attrs_default(keep_attrs):
        return out
    steps = json.loads(out.attrs.get(HISTORY, "[]"))
    out.attrs = {HISTORY: json.dumps(steps[-1:])} if steps and history else {}
    return out


# ---------------------------------------------------------------------------------------------
# Checks in dim names


def _shown(mapping: Mapping) -> str:
    return "{" + ", ".join(f"{k!r}: {v!r}" for k, v in mapping.items()) + "}"


def block_sizes(method: str, block_shape: Mapping, *, minimum: int = 1) -> dict:
    """``{dim: int}`` from the caller's block sizes, each an integer in minimum..INT64_MAX."""
    sizes = {}
    for dim, size in block_shape.items():
        value = size.item() if isinstance(size, np.ndarray) and size.ndim == 0 else size
        where = f"{method}: block_shape={_shown(block_shape)}: the block size of dim {dim!r}"
        if not _is_integer(value):
            raise InvalidArgument(f"{where} must be an integer, got {type(value).__name__} {value!r}")
        if not minimum <= int(value) <= INT64_MAX:
            rule = f">= {minimum}" if int(value) < minimum else f"<= {INT64_MAX}"
            raise InvalidArgument(f"{where} must be {rule}, got {int(value)}")
        sizes[dim] = int(value)
    return sizes


def pairs(method: str, param: str, given: Mapping) -> dict:
    """``{dim: (before, after)}``, each two integers in 0..INT64_MAX."""
    rows = {}
    for dim, pair in given.items():
        items = list(pair) if isinstance(pair, (list, tuple, np.ndarray)) else None
        if (items is None or len(items) != 2 or not all(_is_integer(v) for v in items)
                or not all(0 <= int(v) <= INT64_MAX for v in items)):
            raise InvalidArgument(
                f"{method}: {param}={_shown(given)}: the {param} of dim {dim!r} must be two integers "
                f">= 0 (before, after), got {pair!r}"
            )
        rows[dim] = (int(items[0]), int(items[1]))
    return rows


def check_space_to_batch(arr, blocks: Mapping, paddings: Mapping) -> None:
    """Each padded spatial dim must divide into whole blocks."""
    for dim, block in blocks.items():
        before, after = paddings.get(dim, (0, 0))
        padded = arr.sizes[dim] + before + after
        if padded % block:
            raise InvalidArgument(
                f"space_to_batch_nd: dim {dim!r} padded to {arr.sizes[dim]} + {before} + {after} = {padded} "
                f"is not divisible by its block size {block} (block_shape={_shown(blocks)}, "
                f"paddings={_shown(paddings)})"
            )


def check_batch_to_space(arr, batch: str, blocks: Mapping, crops: Mapping) -> None:
    """The batch dim must hold whole groups of blocks; crops must leave something."""
    groups = int(np.prod([int(b) for b in blocks.values()], dtype=object))
    if arr.sizes[batch] % groups:
        raise InvalidArgument(
            f"batch_to_space_nd: the batch dim {batch!r} has {arr.sizes[batch]} entries, which is not "
            f"divisible by the product of block_shape={_shown(blocks)} = {groups}"
        )
    for dim, block in blocks.items():
        before, after = crops.get(dim, (0, 0))
        full = arr.sizes[dim] * block
        if before + after > full:
            raise InvalidArgument(
                f"batch_to_space_nd: crops={_shown(crops)} removes {before} + {after} entries from dim "
                f"{dim!r}, which holds {arr.sizes[dim]} x block {block} = {full}"
            )


def block_size(method: str, value, *, minimum: int = 2) -> int:
    """A single block size (DepthToSpace/SpaceToDepth: >= 2; SpaceToBatch: >= 1)."""
    if isinstance(value, np.ndarray) and value.ndim == 0:
        value = value.item()
    if not _is_integer(value):
        raise InvalidArgument(
            f"{method}: block_size must be an integer >= {minimum}, got {type(value).__name__} {value!r}"
        )
    if not minimum <= int(value) <= INT64_MAX:
        raise InvalidArgument(f"{method}: block_size must be an integer in {minimum}..{INT64_MAX}, got {int(value)}")
    return int(value)


def check_depth(method: str, arr, roles: Mapping, size: int) -> None:
    """Channels divisible by block_size**2 (DepthToSpace); H and W by block_size (SpaceToDepth)."""
    if method == "depth_to_space":
        channels = arr.sizes[roles["C"]] * (arr.sizes[roles["V"]] if "V" in roles else 1)
        if channels % (size * size):
            what = f"channel dims {roles['C']!r} x {roles['V']!r}" if "V" in roles else f"channel dim {roles['C']!r}"
            raise InvalidArgument(
                f"depth_to_space: the {what} holds {channels} channels, which is not divisible by "
                f"block_size**2 = {size * size} (block_size={size})"
            )
        return
    for role, label in (("H", "height"), ("W", "width")):
        dim = roles[role]
        if arr.sizes[dim] % size:
            raise InvalidArgument(
                f"space_to_depth: the {label} dim {dim!r} has {arr.sizes[dim]} entries, which is not "
                f"divisible by block_size={size}"
            )


_POSITIONAL = [
    # (pattern, replacement builder) for the wordings of the plain functions
    (re.compile(r"x\.shape\[(\d+)\]"), lambda m, axes: f"dim {axes[int(m.group(1))]!r}"),
    (re.compile(r"spatial dim (\d+)"), lambda m, axes: f"dim {axes[1 + int(m.group(1))]!r}"),
    (re.compile(r"\b(block_shape|paddings|crops)\[(\d+)\]"), lambda m, axes: f"{m.group(1)}[{axes[1 + int(m.group(2))]!r}]"),
]


def in_dim_terms(message: str, axes) -> str:
    """A plain function's message with positional axes (``x.shape[1]``, ``spatial dim 0``,
    ``block_shape[0]``) replaced by the dim names ``axes`` (the order the function saw)."""
    for pattern, build in _POSITIONAL:
        def replace(match, build=build):
            try:
                return build(match, axes)
            except IndexError:
                return match.group(0)

        message = pattern.sub(replace, message)
    return message


# ---------------------------------------------------------------------------------------------
# repr


def describe(obj, kind: str, roles: Mapping[str, str] | None, problem: str | None,
             role_labels: Mapping[str, str]) -> str:
    """The text of ``repr(obj.ops)``: the object, the layout and the dim of each role."""
    sizes = ", ".join(f"{d}: {n}" for d, n in obj.sizes.items()) or "no dims"
    name = f" {obj.name!r}" if kind == "DataArray" and obj.name is not None else ""
    lines = [f"<ops accessor on {kind}{name} ({sizes})>"]
    if problem:
        problem = re.sub(r"\.ops\.repr\(\.\.\., (dims=\{.*\})\)", r"pass \1 to each method", problem)
        lines.append(f"Dims: {problem.removeprefix('repr: ')}")
    else:
        roles = dict(roles or {})
        lines.append(f"Layout: {layout_of(tuple(obj.dims), roles)}")
        width = max(len(label) for role, label in role_labels.items() if role != "V" or role in roles)
        for role, label in role_labels.items():
            if role == "V" and role not in roles:
                continue  # the NCHW_VECT_C lane: worth a line only when there is one
            found = repr(roles[role]) if role in roles else "-"
            lines.append(f"  {label:<{width}} ({role}): {found}")
        other = [d for d in obj.dims if d not in roles.values()]
        lines.append(f"Other dims: {', '.join(map(repr, other)) or 'none'}")
    steps = json.loads(obj.attrs.get(HISTORY, "[]")) if isinstance(obj.attrs.get(HISTORY), str) else []
    if steps:
        done = ", ".join(step.get("operator", "?") for step in steps)
        lines.append(f"History: {done} (.ops.invert() undoes the last)")
    lines.append(f"Operators: {', '.join(OPERATORS)}")
    return "\n".join(lines)


_GATHER_POSITIONAL = [
    (re.compile(r"indices\[([\d, ]+)\] = "),
     lambda m, params, indices: "indices[{" + ", ".join(
         f"{dim!r}: {i}" for dim, i in zip(indices, m.group(1).split(", "))) + "}] = "),
    (re.compile(r"for dimension (\d+) of size"), lambda m, params, indices: f"for params dim {params[int(m.group(1))]!r} of size"),
    (re.compile(r"indices\.shape\[-1\]"), lambda m, params, indices: f"the size of indices dim {indices[-1]!r}"),
]


def gather_in_dim_terms(message: str, params_dims, indices_dims) -> str:
    """GatherNd's positional wording (``indices[0, 1]``, ``dimension 1``, ``indices.shape[-1]``)
    in the dim names of params (in the order the function saw) and of indices."""
    for pattern, build in _GATHER_POSITIONAL:
        def replace(match, build=build):
            try:
                return build(match, tuple(params_dims), tuple(indices_dims))
            except (IndexError, ValueError):
                return match.group(0)

        message = pattern.sub(replace, message)
    return message
