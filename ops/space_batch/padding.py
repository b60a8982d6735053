"""SpaceToBatchND's padding value: which output cells are padding, and filling them.

The kernels and graph builders pad with the dtype's zero (NumPy's ``zeros``, padding-only
blocks that read nothing). Any other ``pad_value`` is written afterwards, block by block, into
exactly the cells that lie in the padding: an output cell ``[n, h_1, ..., h_M, ...]`` came
from input position ``h_i * b_i + j_i - before_i`` of spatial dim ``i``, where ``j_i`` is its
block offset, read from the batch index; it is padding when that position falls outside the
dim. Those cells form a few runs per block (the first and last positions along each axis, for
each run of batch entries with the same offsets), so a zero pad costs nothing extra and any
other pad a write of the padding cells alone.
"""

from __future__ import annotations

import math
import numbers

import dask.array as da
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
    fill = np.zeros((), dtype)
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


def _fill_block(block: np.ndarray, fill, batch, block_shape, paddings, sizes, starts=None,
                block_id=None) -> np.ndarray:
    """``block`` with its padding cells set to ``fill``: in place when it is writeable (a block
    the kernel or the graph made for this result), else in a copy (Dask's zeros are read-only
    views)."""
    m = len(block_shape)
    lead = tuple(0 for _ in range(m + 1)) if starts is None else tuple(
        starts[axis][block_id[axis]] for axis in range(m + 1))
    stops = tuple(lo + n for lo, n in zip(lead, block.shape))
    runs = list(_padding_slices(lead, stops, batch, block_shape, paddings, sizes))
    if not runs:
        return block
    if not block.flags.writeable:
        block = block.copy()
    for index in runs:
        block[index] = fill
    return block


def with_pad_value(y, fill: np.ndarray, in_shape, block_shape, paddings):
    """SpaceToBatchND's zero-padded output ``y`` (NumPy or Dask) with ``fill`` in its padding."""
    if is_zero(fill) or not any(before or after for before, after in paddings) or 0 in y.shape:
        return y
    m = len(block_shape)
    args = (fill, in_shape[0], tuple(block_shape), tuple(map(tuple, paddings)), tuple(in_shape[1:1 + m]))
    if not isinstance(y, da.Array):
        return _fill_block(y, *args)
    starts = tuple(tuple(np.cumsum((0,) + y.chunks[axis][:-1]).tolist()) for axis in range(m + 1))
    return y.map_blocks(_fill_block, *args, starts=starts, dtype=y.dtype, meta=y._meta, token="pad-value")
