"""AscendDequant and its packed uint64 scales: the public functions, for NumPy and Dask arrays.

``y = dst(f32(src) * f32(scale))`` with the scale chosen per column (classic), per row
(per_token) or per group of rows or columns (per_group); elements outside ``calc_count`` pass
through as ``dst(f32(src))``.

The per-block kernel and the scale bit layout are in ``kernel``, its compiled row loop in
``jit``, the chunk plan in ``plan``, the Dask graph in ``graph`` and the argument checks in
``validate``.
"""

from __future__ import annotations

import dask.array as da
import numpy as np

from ops import dtypes
from ops.dequant.graph import _build
from ops.dequant.kernel import (
    F32,
    NO_LIMIT,
    dequant_kernel,
    offset_field,
    packed_scale_bits,
    scale_as_float32,
    unpacked_scale_bits,
)
from ops.dequant.plan import dequant_chunks
from ops.dequant.validate import (
    CLASSIC_SCALAR,
    CLASSIC_VECTOR,
    POLICY_PAIRS,
    _output_columns,
    _plan,
    _validate_dequant,
)
from ops.errors import InvalidArgument

__all__ = [
    "CLASSIC_SCALAR",
    "CLASSIC_VECTOR",
    "F32",
    "NO_LIMIT",
    "POLICY_PAIRS",
    "ascend_dequant",
    "dequant_chunks",
    "dequant_kernel",
    "pack_deq_scale",
    "scale_as_float32",
    "unpack_deq_scale",
]


def ascend_dequant(src, deq_scale, *, dst_dtype, calc_count=None, mode="single_row", policy=None,
                   group_size=None, k_dim=1, align_output=False):
    """Dequantise ``src``: ``dst(f32(src) * f32(scale))``, rounded to nearest even (AscendDequant).

    src and scale are converted to float32, multiplied in float32 and rounded to
    ``dst_dtype``. Classic (``policy=None``): int32 src, a scalar or vector ``deq_scale``
    applied to the first ``calc_count`` columns; the remaining columns pass through unscaled
    (the Ascend description calls them undefined; its example shows them unscaled). With
    ``mode="single_row"`` a single row is read as ``[n / calc_count, calc_count]`` when the
    device would (m == 1, calc_count a multiple of ``32 / itemsize(dst)``, n % calc_count
    == 0). ``policy="per_token"``: one scale per row; ``"per_group"``: one per
    ``group_size`` rows (``k_dim=0``) or columns (``k_dim=1``); rows from
    ``calc_count // n`` on pass through. The supported dtype combinations are listed in
    docs/operators.md, the full reference.

    Parameters
    ----------
    src : numpy.ndarray or dask.array.Array
        ``[m, n]``, or ``[n]`` (computed as ``[1, n]`` and returned as ``[n]``). int32;
        float32 too with a policy.
    deq_scale : float, numpy.ndarray or dask.array.Array
        Classic: a scalar or a vector of at least ``calc_count`` values (float32, bfloat16,
        or uint64 carrying a float32 in its low 32 bits: the only kind for float16 output,
        see :func:`ops.pack_deq_scale`). per_token: ``[m]`` or ``[m, 1]``. per_group:
        ``[ceil(m/g), n]`` (``k_dim=0``) or ``[m, ceil(n/g)]`` (``k_dim=1``).
    dst_dtype : {"float16", "bfloat16", "float32"}
        The result's dtype.
    calc_count : int, optional
        Classic: columns scaled, ``1 <= calc_count <= n`` (default n). Policies: elements
        computed, a multiple of n (default m*n).
    mode : {"single_row", "multi_row"}, default "single_row"
        Whether a single row may be read as several (above).
    policy : {None, "per_token", "per_group"}, default None
        How the scale maps onto the elements.
    group_size : int, optional
        per_group only: > 0 and a multiple of 32.
    k_dim : {0, 1}, default 1
        per_group only: 0 groups rows, 1 groups columns.
    align_output : bool, default False
        True: the device layout, each row padded with zeros to a multiple of 32 bytes
        (src rows must be 32-byte aligned, ``n*4 % 32 == 0``).

    Returns
    -------
    numpy.ndarray or dask.array.Array
        ``[m, n]`` (``[m, n_dst]`` with ``align_output``) of ``dst_dtype``; lazy for Dask
        input, processed in row blocks.

    Raises
    ------
    ops.InvalidArgument
        An unsupported (src, scale, dst) combination (the message lists the supported ones),
        a scale of the wrong shape, ``calc_count`` or ``group_size`` out of range,
        ``align_output`` with unaligned rows, src of rank other than 1 or 2.

    Examples
    --------
    >>> import numpy as np, ops
    >>> src = np.arange(-16, 16, dtype=np.int32).reshape(4, 8)
    >>> scale = np.array([2.2, -2.2, 2.2, -2.2, 2.2, -2.2, 0, 0], np.float32)
    >>> ops.ascend_dequant(src, scale, dst_dtype="float32", calc_count=6)[0]   # the last 2 columns pass through
    array([-35.2     ,  33.      , -30.800001,  28.6     , -26.400002,
            24.2     , -10.      ,  -9.      ], dtype=float32)
    >>> y = ops.ascend_dequant(np.array([[1, 3, -7]], np.int32), np.float32(0.1), dst_dtype="bfloat16")
    >>> y.dtype.name, y.tolist()   # each value the bfloat16 nearest to i * 0.1
    ('bfloat16', [[0.10009765625, 0.30078125, -0.69921875]])
    >>> ops.ascend_dequant(np.array([[10, 20], [30, 40]], np.int32), np.float32([0.5, 2]),
    ...                    dst_dtype="float32", policy="per_token")   # one scale per row
    array([[ 5., 10.],
           [60., 80.]], dtype=float32)
    """
    one_row = np.ndim(src) == 1  # [n] is computed as [1, n] and given back as [n]
    src, scale, p, cc = _validate_dequant(
        src, deq_scale, dst_dtype, calc_count, mode, policy, group_size, k_dim, align_output
    )
    dst = dtypes.named(p.dst_dtype)
    n_out = _output_columns(src.shape[1], dst, p.align_output)
    scale, plan = _plan(src.shape, scale, p, cc)
    if isinstance(src, da.Array):
        y = _build(src, scale, plan, dst, n_out)
    else:
        if isinstance(scale, da.Array):
            scale = scale.compute()  # a NumPy src is computed eagerly, so is its scale
        y = dequant_kernel(src, np.asarray(scale), plan, dst, n_out)
    return y.reshape(n_out) if one_row else y


# ---------------------------------------------------------------------------------------------
# Packed uint64 scales (the device's quantisation parameter)


def _float_scale(scale):
    """``scale`` as float32 (NumPy or Dask), refusing what is not a real number."""
    array = scale if isinstance(scale, (np.ndarray, da.Array)) else np.asarray(scale)
    if array.dtype.kind not in "fiu" and not dtypes.is_bfloat16(array.dtype):
        raise InvalidArgument(f"scale must hold real numbers (a float or integer dtype), got dtype {array.dtype}")
    return array.astype(F32)


def pack_deq_scale(scale, offset=None, *, fp19=False):
    """Pack float scales into the uint64 ``deq_scale`` that float16 AscendDequant takes.

    Bits 0..31 hold the float32 scale (the only bits ``ascend_dequant`` reads); bit 46 is
    set and bits 37..45 hold ``offset`` as a 9-bit signed integer, as the device's
    ``TransQuantParam`` lays them out.

    Parameters
    ----------
    scale : float, array_like, numpy.ndarray, dask.array.Array or xarray.DataArray
        Scale values; converted to float32 (exact for float16 and bfloat16 scales).
    offset : float or array_like, optional
        Offsets broadcast against ``scale``, rounded half away from zero and clipped to
        -256..255. Default: none (bits 37..45 are zero).
    fp19 : bool, default False
        Keep only the scale's top 19 bits (sign, exponent and 10 mantissa bits), as the
        device's TransQuantParam does; the default keeps the float32 exactly.

    Returns
    -------
    numpy.ndarray, dask.array.Array or xarray.DataArray
        uint64 values of ``scale``'s shape (a DataArray keeps its dims and coordinates);
        lazy for Dask input.

    Raises
    ------
    InvalidArgument
        If ``scale`` or ``offset`` is not real-valued or their shapes do not broadcast.

    See Also
    --------
    unpack_deq_scale : the inverse.

    Examples
    --------
    >>> import numpy as np, ops
    >>> packed = ops.pack_deq_scale(np.array([0.5, 2.0], np.float32))
    >>> packed.dtype, [hex(v) for v in packed.tolist()]
    (dtype('uint64'), ['0x40003f000000', '0x400040000000'])
    >>> src = np.array([[4, 4]], np.int32)
    >>> ops.ascend_dequant(src, packed, dst_dtype="float16")
    array([[2., 8.]], dtype=float16)
    """
    import xarray as xr  # only for DataArray scales

    if isinstance(scale, xr.DataArray):
        return scale.copy(data=pack_deq_scale(scale.data, offset, fp19=fp19))
    fp19 = _flag("fp19", fp19)
    value = _float_scale(scale)
    packed = packed_scale_bits(value, fp19)
    if offset is not None:
        if isinstance(offset, (bool, np.bool_)):
            raise InvalidArgument(f"offset must be a number or an array of numbers, got bool {offset!r}")
        rounded = _float_scale(offset).astype(np.float64)
        try:
            packed = packed | offset_field(rounded)
        except ValueError as error:
            raise InvalidArgument(
                f"offset must broadcast against scale: shapes {list(np.shape(offset))} and {list(value.shape)} do not ({error})"
            ) from None
    return packed


def unpack_deq_scale(packed):
    """Split uint64 ``deq_scale`` values into their float32 scale and integer offset.

    The inverse of :func:`pack_deq_scale`: bits 0..31 are the scale, bits 37..45 the offset
    (9-bit two's complement); other bits are ignored.

    Parameters
    ----------
    packed : int, array_like, numpy.ndarray, dask.array.Array or xarray.DataArray
        uint64 values (Python ints in 0..2**64-1 are accepted).

    Returns
    -------
    scale : numpy.ndarray, dask.array.Array or xarray.DataArray
        float32 scales, bit for bit the low 32 bits.
    offset : numpy.ndarray, dask.array.Array or xarray.DataArray
        int16 offsets in -256..255.

    Raises
    ------
    InvalidArgument
        If ``packed`` does not hold uint64 values.

    Examples
    --------
    >>> import numpy as np, ops
    >>> scale, offset = ops.unpack_deq_scale(ops.pack_deq_scale([0.5, -3.0], offset=[1, -2]))
    >>> scale.tolist(), offset.tolist()
    ([0.5, -3.0], [1, -2])
    """
    import xarray as xr

    if isinstance(packed, xr.DataArray):
        scale, offset = unpack_deq_scale(packed.data)
        return packed.copy(data=scale), packed.copy(data=offset)
    array = packed if isinstance(packed, (np.ndarray, da.Array)) else np.asarray(packed)
    if array.dtype != np.uint64:
        if array.dtype.kind in "iu" and not isinstance(packed, (np.ndarray, da.Array)):
            array = array.astype(np.uint64)  # Python ints
        else:
            raise InvalidArgument(f"packed must hold uint64 values, got dtype {array.dtype}")
    return unpacked_scale_bits(array)


def _flag(name: str, value) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise InvalidArgument(f"{name} must be True or False, got {value!r}")
    return bool(value)
