"""Argument checks shared by the operators; all raise InvalidArgument before any work.

Integer parameters arrive as Python ints, NumPy integer scalars or integer arrays (the
reference operators take int32/int64 tensors); ``integers`` turns them into plain Python ints
and refuses bools, floats and anything ragged. The shape-independent rules then come from the
``schemas`` models, whose pydantic errors are rewritten here into one-line messages that name
the parameter, the rule and the value.
"""

from __future__ import annotations

import math
import numbers

import dask.array as da
import numpy as np
from pydantic import BaseModel, ValidationError

from ops import _limits, dtypes
from ops.errors import InvalidArgument

INT64_MAX = 2**63 - 1


def _is_integer(value) -> bool:
    return isinstance(value, (numbers.Integral, np.integer)) and not isinstance(
        value, (bool, np.bool_)
    )


def integers(param: str, value) -> tuple[tuple[int, ...], list[int]]:
    """``value`` as (shape, flat list of Python ints); a scalar has shape ()."""
    if isinstance(value, da.Array):
        raise InvalidArgument(
            f"{param} must be concrete integers (a list, tuple or NumPy array), got a Dask array"
        )
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "iu":
            raise InvalidArgument(f"{param} must be an integer array, got dtype {value.dtype}")
        return value.shape, [int(v) for v in value.reshape(-1).tolist()]
    try:
        array = np.array(value, dtype=object)
    except ValueError as error:  # ragged nesting
        raise InvalidArgument(f"{param} must be a rectangular array of integers: {error}") from None
    if array.ndim > 32:  # NumPy's iterators stop at 32 dimensions (a RuntimeError)
        raise InvalidArgument(
            f"{param} must be a rectangular array of integers of at most 32 dimensions, got "
            f"{array.ndim}{' or more' if array.ndim >= 64 else ''}"
        )
    for position, item in np.ndenumerate(array):
        if isinstance(item, (list, tuple, np.ndarray)):
            raise InvalidArgument(f"{param} must be a rectangular array of integers, got {value!r}")
        if not _is_integer(item):
            where = f"{param}[{', '.join(map(str, position))}]" if position else param
            raise InvalidArgument(
                f"{where} must be an integer, got {type(item).__name__} {item!r}"
            )
    return array.shape, [int(v) for v in array.reshape(-1)]


def integer(param: str, value) -> int:
    """A single integer parameter (0-d arrays and NumPy scalars included)."""
    shape, flat = integers(param, value)
    if shape != ():
        raise InvalidArgument(f"{param} must be a single integer, got shape {list(shape)}")
    return flat[0]


def pairs(param: str, value, rows: int) -> list[tuple[int, int]]:
    """An [M, 2] integer parameter (paddings, crops) as M (before, after) tuples."""
    shape, flat = integers(param, value)
    if shape != (rows, 2):
        raise InvalidArgument(f"{param} must have shape [{rows}, 2], got shape {list(shape)}")
    return [(flat[2 * k], flat[2 * k + 1]) for k in range(rows)]


def _location(loc: tuple) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _message(error: dict) -> str:
    where = _location(error["loc"])
    value = error.get("input")
    kind = error["type"]
    ctx = error.get("ctx", {})
    if kind == "greater_than_equal":
        return f"{where} must be >= {ctx['ge']}, got {value!r}"
    if kind == "less_than_equal":
        return f"{where} must be <= {ctx['le']}, got {value!r}"
    if kind == "literal_error":
        return f"{where} must be one of {ctx['expected']}, got {value!r}"
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return f"{where} must be an integer, got {type(value).__name__} {value!r}"
    if kind == "too_short":
        return f"{where} must have at least {ctx['min_length']} entries, got {ctx['actual_length']}"
    if kind == "too_long":
        return f"{where} must have at most {ctx['max_length']} entries, got {ctx['actual_length']}"
    if kind == "value_error":
        return str(ctx.get("error", error["msg"]))
    return f"{where}: {error['msg']}, got {value!r}"


def params(model: type[BaseModel], **values) -> BaseModel:
    """Validate shape-independent rules with a schemas model; errors become InvalidArgument."""
    try:
        return model(**values)
    except ValidationError as error:
        raise InvalidArgument(_message(error.errors(include_url=False)[0])) from None


def array(param: str, x):
    """``x`` as a NumPy or Dask array of a supported dtype with known shape."""
    if not isinstance(x, (np.ndarray, da.Array)):
        if hasattr(x, "__dask_graph__") or hasattr(x, "dims"):
            raise InvalidArgument(
                f"{param} must be a NumPy or Dask array, got {type(x).__name__} "
                "(use the .ops accessor for xarray objects)"
            )
        x = np.asarray(x)
    dtypes.check_supported(param, x.dtype)
    if any(math.isnan(n) for n in x.shape):
        raise InvalidArgument(
            f"{param} has unknown chunk sizes {x.shape}; call {param}.compute_chunk_sizes() first"
        )
    return x


def rank(param: str, x, allowed: str, ok: bool) -> None:
    if not ok:
        raise InvalidArgument(f"{param} must have rank {allowed}, got rank {x.ndim} (shape {list(x.shape)})")


def output_shape(shape: tuple[int, ...], itemsize: int, op: str = "the operator") -> tuple[int, ...]:
    """Refuse an output shape whose byte size overflows int64 (it could not be allocated), or
    passes the ``max_bytes`` of ``ops.limits`` (before any graph is built)."""
    elements = math.prod(max(n, 1) for n in shape)
    if any(n > INT64_MAX for n in shape) or elements * itemsize > INT64_MAX:
        raise InvalidArgument(
            f"output shape {list(shape)} overflows int64 ({elements} elements of {itemsize} bytes)"
        )
    _limits.check_bytes(op, shape, itemsize)
    return tuple(shape)
