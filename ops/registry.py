"""The one registry of operators, shared by the accessor, the service and the command line.

Each entry says what the operator is called (the ``ops`` function name, which is also the
OGC process id), which function computes it, which ``schemas`` model holds its keyword
parameters and which of its inputs are arrays. Adding an operator means adding it here;
process descriptions and the OpenAPI document are generated from these entries.

Every door reaches an operator the same way: ``bind`` sorts a call's inputs (arrays,
keyword parameters, ``dims``) and checks them once, giving a ``BoundCall``; the door resolves
its own references (a stored array's name, a path) into arrays and ``run``s it. ``apply`` is
the two in one, for arrays at hand. A DataArray whose dims the ``.ops`` accessor recognises
(or an explicit ``dims`` mapping) goes through the accessor, so dims are matched by name and
coordinates and attrs are kept (the adapters of ``ops.accessor.named_calls``); anything else
runs the plain function positionally and the result gets the dim names of the operator's roles.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import xarray as xr
from pydantic import BaseModel

from ops import _scratch
from ops.accessor.conventions import cf_encoding, name_of
from ops.accessor.named_calls import NAMED_DIMS
from ops.dequant import ascend_dequant, pack_deq_scale
from ops.depth_space import depth_to_space, space_to_depth
from ops.dims import ROLES, is_named
from ops.errors import InvalidArgument, MissingInput, UnknownInput
from ops.gather_nd import gather_nd
from ops.space_batch import batch_to_space_nd, space_to_batch, space_to_batch_nd
from schemas import (
    AscendDequantParams,
    BatchToSpaceNDParams,
    DepthToSpaceParams,
    GatherNdParams,
    SpaceToBatchNDParams,
    SpaceToBatchParams,
    SpaceToDepthParams,
)

VERSION = "1.0.0"


@dataclass(frozen=True)
class Operator:
    """One operator: its name, function, parameter model and array inputs.

    Attributes
    ----------
    name : str
        The ``ops`` function name; also the OGC process id.
    function : callable
        The public ``ops`` function (NumPy in, NumPy out; Dask in, lazy Dask out).
    params : type[pydantic.BaseModel]
        The ``schemas`` model of the keyword parameters (shape-independent rules).
    array_inputs : tuple of str
        Names of the array arguments, in the function's positional order.
    title : str
        A short human title.
    scalar_inputs : tuple of str
        Array inputs that may also be a plain number (``deq_scale``).
    accepts_dims : bool
        Whether DataArray inputs go through the ``.ops`` accessor (dims by name, ``dims=``).
    roles : callable
        ``roles(kwargs, ndim) -> tuple[str, ...]``: dim names for a plain result.
    moves_values : bool
        Whether the result holds the input's values moved about (rearrangements, gathers), so
        that it keeps the input's CF packing; AscendDequant computes new values.
    literal : callable, optional
        ``literal(name, value, kwargs) -> array``: an array input given as a JSON list (the
        command line's ``--param deq_scale=[...]``) in the dtype the operator takes.
    """

    name: str
    function: Callable
    params: type[BaseModel]
    array_inputs: tuple[str, ...]
    title: str
    roles: Callable
    accepts_dims: bool = True
    scalar_inputs: tuple[str, ...] = ()
    moves_values: bool = True
    literal: Callable | None = None
    keywords: tuple[str, ...] = field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "keywords", tuple(self.params.model_fields))

    @property
    def description(self) -> str:
        """The first paragraph of the function's docstring."""
        doc = inspect.getdoc(self.function) or ""
        return " ".join(doc.split("\n\n")[0].split())

    @property
    def inputs(self) -> tuple[str, ...]:
        """Every input name: array inputs, keyword parameters, then ``dims`` if it takes them."""
        return (*self.array_inputs, *self.keywords, *(("dims",) if self.accepts_dims else ()))


# ---------------------------------------------------------------------------------------------
# Dim names of plain results


def _depth_roles(kwargs, ndim):
    return {"NHWC": ("n", "h", "w", "c"), "NCHW": ("n", "c", "h", "w"),
            "NCHW_VECT_C": ("n", "c", "h", "w", "v")}[kwargs.get("data_format") or "NHWC"][:ndim]


def _batch_roles(kwargs, ndim):
    return ("batch", *(f"dim_{k}" for k in range(1, ndim)))


def _dequant_literal(name, value, kwargs):
    """A scale given as a JSON list: float32, packed into the uint64 form float16 output takes."""
    if name != "deq_scale":
        return np.asarray(value)
    scale = np.asarray(value, dtype=np.float32)
    return pack_deq_scale(scale) if kwargs.get("dst_dtype") == "float16" else scale


def _gather_roles(kwargs, ndim):
    return tuple(f"dim_{k}" for k in range(ndim))


def _dequant_roles(kwargs, ndim):
    return ("row", "column")[2 - ndim:]


OPERATORS: dict[str, Operator] = {
    op.name: op
    for op in (
        Operator("depth_to_space", depth_to_space, DepthToSpaceParams, ("x",), "DepthToSpace", _depth_roles),
        Operator("space_to_depth", space_to_depth, SpaceToDepthParams, ("x",), "SpaceToDepth", _depth_roles),
        Operator("space_to_batch", space_to_batch, SpaceToBatchParams, ("x",), "SpaceToBatch", _depth_roles),
        Operator("space_to_batch_nd", space_to_batch_nd, SpaceToBatchNDParams, ("x",), "SpaceToBatchND",
                 _batch_roles),
        Operator("batch_to_space_nd", batch_to_space_nd, BatchToSpaceNDParams, ("x",), "BatchToSpaceND",
                 _batch_roles),
        Operator("gather_nd", gather_nd, GatherNdParams, ("params", "indices"), "GatherNd", _gather_roles),
        # No dims input: the accessor's dequant finds the columns from the scale's dim names.
        Operator("ascend_dequant", ascend_dequant, AscendDequantParams, ("src", "deq_scale"), "AscendDequant",
                 _dequant_roles, accepts_dims=False, scalar_inputs=("deq_scale",), moves_values=False,
                 literal=_dequant_literal),
    )
}


def get(name: str) -> Operator:
    """The registry entry named ``name``; InvalidArgument listing the known ones otherwise."""
    try:
        return OPERATORS[name]
    except KeyError:
        raise InvalidArgument(f"operator must be one of {', '.join(OPERATORS)}, got {name!r}") from None


def _data(value):
    return value.data if isinstance(value, xr.DataArray) else value


def _array_value(op: Operator, name: str, value):
    """An array input as the operator takes it: a number for a scalar input (``deq_scale``),
    nested lists as a NumPy array; arrays, DataArrays and a door's own references (a stored
    array's name, a path) unchanged."""
    if isinstance(value, (bool, np.bool_)):
        raise InvalidArgument(f"{op.name}: input {name!r} must be an array, got {value!r}")
    if isinstance(value, (int, float, np.integer, np.floating)):
        if name in op.scalar_inputs:
            return float(value)
        raise InvalidArgument(f"{op.name}: input {name!r} must be an array, got the number {value!r}")
    if isinstance(value, (list, tuple)):
        try:
            return np.asarray(value)
        except ValueError as error:  # ragged nesting
            raise InvalidArgument(f"{op.name}: input {name!r} must be a rectangular array: {error}") from None
    return value


@dataclass(frozen=True)
class BoundCall:
    """An operator call whose inputs have been sorted and checked (``bind``).

    Attributes
    ----------
    op : Operator
        The registry entry.
    arrays : dict
        Array inputs by name: NumPy or Dask arrays, DataArrays, numbers for scalar inputs, or
        until the door resolves them (``with_arrays``), its references to stored data.
    kwargs : dict
        The keyword parameters as given (absent ones take the function's defaults).
    dims : dict or None
        Role -> dim name (``{"H": "row"}``), for operators that take dims by name.
    """

    op: Operator
    arrays: dict
    kwargs: dict
    dims: dict | None = None

    def with_arrays(self, arrays: Mapping[str, object]) -> BoundCall:
        """The same call with (some of) its array inputs replaced, e.g. references resolved
        to the opened arrays; the new values are normalised as ``bind`` does."""
        resolved = {k: _array_value(self.op, k, v) for k, v in arrays.items()}
        return BoundCall(self.op, {**self.arrays, **resolved}, self.kwargs, self.dims)

    def run(self, *, scratch=None) -> xr.DataArray:
        """The operator's result as a DataArray (lazy when the inputs are Dask).

        DataArray inputs whose dims the ``.ops`` accessor recognises (or that come with
        ``dims``) go through the accessor, so dims are matched by name and coordinates and
        attrs are kept; anything else runs the plain function positionally and the result gets
        the dim names of the operator's roles. ``scratch``: where the plans that move data
        out of band write their intermediate files (GatherNd's exchange, BatchToSpaceND's
        parts), set for the graph's build as ``ops.scratch`` sets it.
        """
        if scratch is None:
            return self._run()
        store = _scratch.as_scratch(scratch)
        with _scratch.scratch(store.url, store.storage_options):
            return self._run()

    def _run(self) -> xr.DataArray:
        op, kwargs = self.op, dict(self.kwargs)
        if op.name in NAMED_DIMS:
            named = NAMED_DIMS[op.name](self.arrays, dict(kwargs), self.dims)
            if named is not None:
                return named
        result = op.function(*(_data(self.arrays[k]) for k in op.array_inputs), **kwargs)
        first = self.arrays[op.array_inputs[0]]
        if isinstance(first, xr.DataArray) and is_named(first) and first.ndim == result.ndim and op.name != "gather_nd":
            out_dims = first.dims  # a rearrangement keeps the meaning of every axis
        else:
            out_dims = op.roles(kwargs, result.ndim)
        attrs = dict(first.attrs) if isinstance(first, xr.DataArray) else {}
        out = xr.DataArray(result, dims=out_dims, attrs=attrs)
        out.name = name_of(first) if isinstance(first, xr.DataArray) else None  # not a Dask key
        if isinstance(first, xr.DataArray) and op.moves_values:
            out.encoding.update(cf_encoding(first))  # the same kind of values, packed the same way
        return out


def bind(name: str, inputs: Mapping[str, object]) -> BoundCall:
    """Sort and check the inputs of a call to operator ``name``, before anything is read.

    Every door (``apply``, the service's execution requests, the command line's flags) calls
    this, so an unknown or missing input and a malformed ``dims`` are refused with the same
    message whichever door the call came through. The values' rules are the operator's own:
    ``BoundCall.run`` calls the operator, which checks them (with the shapes they depend on)
    before any work is scheduled.

    Parameters
    ----------
    name : str
        A registry key (``depth_to_space``, ...).
    inputs : mapping
        Every input by name: the array inputs (arrays, DataArrays, numbers for scalar inputs,
        nested lists, or a door's references to stored data), the keyword parameters, and
        ``dims`` (role -> dim name) for the operators that take dims by name.

    Returns
    -------
    BoundCall
        The call, ready to ``run`` once its array inputs are arrays.

    Raises
    ------
    UnknownInput
        An input the operator does not have (``dims`` for one that takes no dims).
    MissingInput
        A required array input or parameter is absent.
    InvalidArgument
        ``dims`` is not a mapping of roles to dim names, or an array input is a bool, a
        number where an array is needed, or ragged nested lists.
    """
    op = get(name)
    unknown = [k for k in inputs if k not in op.inputs]
    if unknown:
        raise UnknownInput(f"{name} has no input {unknown[0]!r}; its inputs are {', '.join(op.inputs)}")
    missing = [k for k in op.array_inputs if k not in inputs]
    if missing:
        raise MissingInput(f"{name} needs the array input {missing[0]!r}", missing[0], "array")
    dims = inputs.get("dims")
    if dims is not None and not (isinstance(dims, Mapping) and all(
            k in ROLES and isinstance(v, str) for k, v in dims.items())):
        raise InvalidArgument(f"dims must map roles ({', '.join(ROLES)}) to dim names, e.g. {{'H': 'row'}}; "
                              f"got {dims!r}")
    kwargs = {k: v for k, v in inputs.items() if k in op.keywords}
    required = [k for k, f in op.params.model_fields.items() if f.is_required() and k not in kwargs]
    if required:
        raise MissingInput(f"{name} needs the parameter {required[0]!r}", required[0], "parameter")
    arrays = {k: _array_value(op, k, op.literal(k, inputs[k], kwargs) if op.literal and isinstance(
        inputs[k], (list, tuple)) else inputs[k]) for k in op.array_inputs}
    return BoundCall(op, arrays, kwargs, None if dims is None else dict(dims))


def apply(name: str, arrays: Mapping[str, object], kwargs: Mapping[str, object], dims=None, *, scratch=None):
    """Run operator ``name`` and return its result as a DataArray (lazy when inputs are Dask):
    ``bind(name, {**arrays, **kwargs, "dims": dims}).run(scratch=scratch)``.

    Parameters
    ----------
    name : str
        A registry key (``depth_to_space``, ...).
    arrays : mapping
        The array inputs by name: NumPy arrays, Dask arrays, DataArrays, or for scalar inputs
        plain numbers.
    kwargs : mapping
        Keyword parameters, as the ``ops`` function takes them; absent ones take defaults.
    dims : mapping, optional
        Role -> dim name (``{"H": "row", ...}``), as the accessor's ``dims=``.
    scratch : str, mapping or ops._scratch.Scratch, optional
        Where the plans that move data out of band (GatherNd's exchange, BatchToSpaceND's
        parts) write their intermediate files; the other plans ignore it, so a caller may
        pass its job's scratch to any operator.

    Returns
    -------
    xarray.DataArray
        The result, with coordinates and attrs kept when the accessor ran it.

    Raises
    ------
    InvalidArgument
        Unknown operator, unknown or missing inputs, or any rule of the operator.
    IndexError
        A concrete index out of range (GatherNd).
    """
    misplaced = [k for k in kwargs if k in arrays or k == "dims"]
    if misplaced:
        raise InvalidArgument(f"{name}: {misplaced[0]!r} is given as a keyword parameter; pass it "
                              f"{'as dims=' if misplaced[0] == 'dims' else 'among the arrays'}")
    inputs = {**arrays, **kwargs, **({} if dims is None else {"dims": dims})}
    return bind(name, inputs).run(scratch=scratch)
