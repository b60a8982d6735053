"""SpaceToBatchND's padding value: which output cells are padding, and filling them.

The NumPy kernel pads with the dtype's zero (NumPy's ``zeros``), as do padding-only blocks
that read nothing. Any other ``pad_value`` is written into exactly the cells that lie in the
padding:
an output cell ``[n, h_1, ..., h_M, ...]`` came from input position ``h_i * b_i + j_i -
before_i`` of spatial dim ``i``, where ``j_i`` is its block offset, read from the batch index;
it is padding when that position falls outside the dim. Those cells form a few runs per block
(the first and last positions along each axis, for each run of batch entries with the same
offsets), so any pad costs a write of the padding cells alone. The NumPy path writes them
after its kernel; a Dask task writes them, zeros too, into the block it makes (``PadCells``),
after its input pieces, so the pad costs no task of its own and no pass over the block.
"""

from __future__ import annotations

import math
import numbers
from typing import NamedTuple

import numpy as np

from ops import dtypes
from ops.errors import InvalidArgument

NAN_TEXT = "NaN"  # how JSON, which has no NaN, spells it


def _real_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype a pad value is cast to: complex types take a real value in their real part."""
    if dtype == dtypes.complex32:
        return np.dtype(np.float16)
    if dtype.kind == "c":
        return np.dtype(f"f{dtype.itemsize // 2}")
    return dtype


def pad_fill(value, dtype) -> np.ndarray:
    """``pad_value`` as a 0-d array of ``dtype``, or InvalidArgument naming the rule.

    Floating types take any real number (rounded to the nearest value of the type), NaN and
    the infinities; integer types an integral value in their range; bool 0 or 1; complex types
    a real number (imaginary part 0).
    """
    dtype = np.dtype(dtype)
    if isinstance(value, str) and value == NAN_TEXT:
        value = math.nan
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Real, np.integer, np.floating)):
        raise InvalidArgument(f"pad_value must be a number (or {NAN_TEXT!r}), got {value!r}")
    name, real = dtypes.name(dtype), _real_dtype(dtype)
    if real.kind in "iub":
        low, high = (0, 1) if real.kind == "b" else (int(np.iinfo(real).min), int(np.iinfo(real).max))
        integral = math.isfinite(value) and float(value).is_integer() if isinstance(value, float) else True
        if not integral or not low <= int(value) <= high:
            missing = (" (NaN needs a floating dtype; packed data is padded with its _FillValue "
                       "through the .ops accessor)") if isinstance(value, float) and math.isnan(value) else ""
            raise InvalidArgument(f"pad_value must be an integer in {low}..{high} for x's dtype {name}, "
                                  f"got {value!r}{missing}")
        cast = np.asarray(int(value)).astype(real)
    else:
        with np.errstate(over="ignore"):
            cast = np.asarray(float(value), dtype=np.float64).astype(real)
        if math.isfinite(value) and not np.isfinite(cast.astype(np.float64)):
            raise InvalidArgument(f"pad_value must be within the range of x's dtype {name}, got {value!r}")
    # Native byte order spelt as such ('=', as a pickled copy has it, not Zarr's explicit
    # '<'): a task's arguments then tokenize alike before and after they travel.
    fill = np.zeros((), dtype.newbyteorder("=") if dtype.isnative else dtype)
    if dtype == dtypes.complex32:
        fill["real"] = cast
    else:
        fill[()] = cast
    return fill


def is_zero(fill: np.ndarray) -> bool:
    """Whether ``fill`` is all zero bits, which the kernels' padding already is (-0.0 is not)."""
    return not fill.tobytes().strip(b"\0")


def _padding_slices(starts, stops, batch: int, block_shape, paddings, sizes):
    """The padding cells of the output cells ``[starts, stops)`` of the batch and spatial axes,
    as index tuples relative to ``starts``: for each run of batch entries that share their block
    offsets, and each spatial axis, the (at most two) runs of positions whose source lies before
    or after the input along that axis. Their union is every padding cell; they cost as many
    assignments as runs, not as cells."""
    n0, n1 = starts[0], stops[0]
    for group in range(n0 // batch, (n1 - 1) // batch + 1):
        rows = slice(max(n0, group * batch) - n0, min(n1, (group + 1) * batch) - n0)
        stride = math.prod(block_shape)
        for i, (b, (before, _), size) in enumerate(zip(block_shape, paddings, sizes)):
            stride //= b
            offset = (group // stride) % b
            # position h reads input h*b + offset - before: inside for first <= h < end
            first = -(-(before - offset) // b)
            end = -(-(size + before - offset) // b)
            lo, hi = starts[1 + i], stops[1 + i]
            for run in ((lo, min(hi, first)), (max(lo, end), hi)):
                if run[0] < run[1]:
                    yield (rows, *(slice(None),) * i, slice(run[0] - lo, run[1] - lo))


class PadCells(NamedTuple):
    """Where a block's padding cells are and what goes in them: the pad ``fill`` (a 0-d array
    of the block's dtype); the input's batch size, ``block_shape``, ``paddings`` and spatial
    ``sizes``; and ``leads``, the output position (batch, spatial...) of the first cell of
    each of the block's equal slabs of rows (one slab, or one per group when a task makes a
    batch chunk's P group blocks at once). Small and picklable: a task's argument."""

    fill: np.ndarray
    batch: int
    block_shape: tuple
    paddings: tuple
    sizes: tuple
    leads: tuple


def set_padding(block: np.ndarray, cells: PadCells) -> None:
    """Write ``cells.fill`` into the padding cells of ``block`` (writeable), in place."""
    m = len(cells.block_shape)
    slab = block.shape[0] // len(cells.leads)
    for i, lead in enumerate(cells.leads):
        view = block[i * slab : (i + 1) * slab]
        stops = tuple(lo + n for lo, n in zip(lead, view.shape[: m + 1]))
        for index in _padding_slices(lead, stops, cells.batch, cells.block_shape, cells.paddings, cells.sizes):
            view[index] = cells.fill


def padding_block(shape, fill: np.ndarray) -> np.ndarray:
    """A block of padding only: ``fill`` everywhere."""
    y = np.empty(shape, fill.dtype)
    y[...] = fill
    return y


def writes_pad(fill: np.ndarray, paddings) -> bool:
    """Whether ``fill`` has to be written into padding cells: there is padding, and the
    kernels' zeros are not the pad already."""
    return not is_zero(fill) and any(before or after for before, after in paddings)


def pad_cells(fill: np.ndarray, in_shape, block_shape, paddings, leads) -> PadCells | None:
    """The ``PadCells`` of a block at ``leads``, or None when the kernels' zeros are the pad
    already (``writes_pad``)."""
    if not writes_pad(fill, paddings):
        return None
    return cells_at(fill, in_shape, block_shape, paddings, leads)


def cells_at(fill: np.ndarray, in_shape, block_shape, paddings, leads) -> PadCells:
    """The ``PadCells`` of a block at ``leads`` holding ``fill``, zero or not."""
    m = len(block_shape)
    return PadCells(fill, in_shape[0], tuple(block_shape), tuple(map(tuple, paddings)), tuple(in_shape[1 : 1 + m]),
                    tuple(leads))


def with_pad_value(y: np.ndarray, fill: np.ndarray, in_shape, block_shape, paddings) -> np.ndarray:
    """SpaceToBatchND's zero-padded NumPy output ``y`` with ``fill`` in its padding (in place)."""
    cells = pad_cells(fill, in_shape, block_shape, paddings, [(0,) * (1 + len(block_shape))])
    if cells is not None and 0 not in y.shape:
        set_padding(y, cells)
    return y
