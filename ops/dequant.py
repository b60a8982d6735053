"""AscendDequant: the NumPy kernel and the Dask builder, side by side.

``y = dst(f32(src) * f32(scale))`` with the scale chosen per column (classic), per row
(per_token) or per group of rows or columns (per_group); elements outside ``calc_count`` pass
through as ``dst(f32(src))``. Every rounding is NumPy's / ml_dtypes' own round-to-nearest-even, so
results equal the plain expression ``(src.astype(f32) * scale).astype(dst)`` bit for bit.

Kernel: the plain expression materialises two full float32 temporaries. The kernel is one
compiled pass instead: each row's float32 products go to a row buffer that stays in cache and
are rounded from there with NumPy's and ml_dtypes' own algorithms (``ops/_float_bits.py``),
so src is read once and the result written once, with the GIL released. Where numba is not
wanted (a small Dask worker, ``ops/_compiled.py``) the plain expression runs in row slabs.

Dask plan: row blocks with all n columns in one chunk; per-row scales are chunked with the
rows, and for per_group with k_dim=0 the row chunks are aligned to multiples of group_size so
each block sees whole scale rows.
"""

from __future__ import annotations

import numbers

import dask.array as da
import numpy as np
from dask.base import tokenize

from ops import _chunks, _lazy, _validate, dtypes
from ops._compiled import use_compiled_kernels
from ops.errors import InvalidArgument
from schemas import AscendDequantParams

F32 = np.dtype(np.float32)
_DST = {"float16": np.dtype(np.float16), "bfloat16": dtypes.bfloat16, "float32": F32}

# Supported combinations (docs/operators.md lists them). Classic: (dst, scale) for vector and scalar scales.
CLASSIC_VECTOR = [("float16", "uint64"), ("float32", "float32"), ("float32", "bfloat16"),
                  ("bfloat16", "bfloat16"), ("bfloat16", "float32")]
CLASSIC_SCALAR = [("bfloat16", "bfloat16"), ("bfloat16", "float32"), ("float32", "bfloat16"),
                  ("float32", "float32")]
# per_token / per_group: (scale, dst) for int32 or float32 src.
POLICY_PAIRS = [("float16", "float16"), ("bfloat16", "bfloat16"), ("float32", "float32"),
                ("float32", "float16"), ("float32", "bfloat16")]


# ---------------------------------------------------------------------------------------------
# NumPy kernel

NO_LIMIT = np.iinfo(np.int64).max


def scale_as_float32(scale: np.ndarray) -> np.ndarray:
    """Scale values in float32: exact for float16/bfloat16; uint64 carries them in its low 32 bits."""
    if scale.dtype == np.uint64:
        return (scale & np.uint64(0xFFFFFFFF)).astype(np.uint32).view(np.float32)
    return scale.astype(F32)


def dequant_kernel(src, scale, plan, dst_dtype, n_out: int, row0: int = 0) -> np.ndarray:
    """AscendDequant of one NumPy row block ``src`` [rows, n] (global rows row0 ...).

    ``scale`` is 2-D and ``plan = (row_div, col_div, row_limit, col_limit)`` says how it maps
    onto the elements (see ``ops._dequant_jit.dequant_rows``). The result has ``n_out >= n`` columns; the
    extra ones are zero.
    """
    rows, n = src.shape
    y = (np.zeros if n_out > n else np.empty)((rows, n_out), dst_dtype)
    if not use_compiled_kernels():  # a small Dask worker: no numba (see ops/_compiled.py)
        _dequant_rows_numpy(src, scale_as_float32(scale), plan, row0, y[:, :n])
        return y
    kind = {np.dtype(np.float32): 0, np.dtype(np.float16): 1}.get(np.dtype(dst_dtype), 2)
    bits = y.view(np.uint32 if kind == 0 else np.uint16)
    row_div, col_div, row_limit, col_limit = plan
    from ops._dequant_jit import dequant_rows  # numba on first use

    dequant_rows(src, src.view(np.uint32), scale_as_float32(scale), row_div, col_div,
                  row_limit, col_limit, row0, bits, kind)
    return y


#: Elements per slab of the NumPy path: its float32 temporaries stay at a few MiB.
_SLAB_ELEMENTS = 2**20


def _dequant_rows_numpy(src, scale, plan, row0: int, out) -> None:
    """``dequant_rows`` as the plain NumPy expression, a slab of rows at a time: the same bits
    (the compiled loop reproduces NumPy's float32 multiply and its / ml_dtypes' casts)."""
    rows, n = src.shape
    row_div, col_div, row_limit, col_limit = plan
    scaled_rows = min(rows, max(0, row_limit - row0))
    cols = min(n, col_limit)
    first = row0 // row_div if row_div else 0
    col_index = np.arange(cols) // col_div if col_div else np.zeros(cols, np.intp)
    step = max(1, _SLAB_ELEMENTS // max(n, 1))
    with np.errstate(all="ignore"):  # NaN, inf and overflow are results here, not accidents
        for i0 in range(0, rows, step):
            i1 = min(rows, i0 + step)
            product = src[i0:i1].astype(F32)
            k1 = min(i1, scaled_rows)
            if i0 < k1 and cols:
                global_rows = np.arange(row0 + i0, row0 + k1)
                row_index = global_rows // row_div - first if row_div else np.zeros(k1 - i0, np.intp)
                # product first: NaN * NaN keeps src's NaN (quieted), as the compiled loop does.
                product[: k1 - i0, :cols] *= scale[row_index[:, None], col_index[None, :]]
            out[i0:i1] = product.astype(out.dtype)


# ---------------------------------------------------------------------------------------------
# Validation


def _dst_name(dst_dtype) -> str:
    try:
        dtype = np.dtype(dst_dtype)
    except TypeError:
        dtype = None
    for name, candidate in _DST.items():
        if dtype == candidate:
            return name
    raise InvalidArgument(f"dst_dtype must be one of float16, bfloat16 or float32, got {dst_dtype!r}")


def _scale_array(deq_scale):
    """The scale as an array (Python numbers become float32 0-d arrays)."""
    if isinstance(deq_scale, (bool, np.bool_)):
        raise InvalidArgument(f"deq_scale must be a number or an array, got bool {deq_scale!r}")
    if isinstance(deq_scale, numbers.Real) and not isinstance(deq_scale, np.generic):
        return np.asarray(deq_scale, F32)
    if isinstance(deq_scale, np.float64):  # a Python float subclass: treated as one
        return np.asarray(deq_scale, F32)
    if isinstance(deq_scale, (np.ndarray, da.Array)):
        return deq_scale
    return np.asarray(deq_scale)


def _type_name(dtype) -> str:
    return dtypes.name(np.dtype(dtype).newbyteorder("="))  # either byte order is fine


def _unsupported(what: str, got: str, pairs, columns: str) -> InvalidArgument:
    listed = "; ".join("(" + ", ".join(pair) + ")" for pair in pairs)
    return InvalidArgument(f"{what}: ({columns}) = ({got}) is not supported; supported: {listed}")


def _validate_dequant(src, deq_scale, dst_dtype, calc_count, mode, policy, group_size, k_dim, align_output):
    p = _validate.params(
        AscendDequantParams,
        dst_dtype=_dst_name(dst_dtype),
        calc_count=None if calc_count is None else _validate.integer("calc_count", calc_count),
        mode=mode,
        policy=policy,
        group_size=None if group_size is None else _validate.integer("group_size", group_size),
        k_dim=_validate.integer("k_dim", k_dim),
        align_output=align_output,
    )
    src = _validate.array("src", src)
    if not src.dtype.isnative:  # the compiled kernel reads native words
        src = src.astype(src.dtype.newbyteorder("="))
    if src.ndim == 1:
        src = src.reshape(1, -1)
    _validate.rank("src", src, "1 or 2 ([n] or [m, n])", src.ndim == 2)
    m, n = src.shape
    scale = _scale_array(deq_scale)
    src_name, scale_name = _type_name(src.dtype), _type_name(scale.dtype)
    if p.policy is None:
        if src_name != "int32":
            raise InvalidArgument(f"src dtype must be int32 without a policy, got {src_name}")
        if scale.ndim > 1:
            raise InvalidArgument(f"deq_scale must be a scalar or a 1-D vector, got shape {list(scale.shape)}")
        pairs = CLASSIC_VECTOR if scale.ndim == 1 else CLASSIC_SCALAR
        if (p.dst_dtype, scale_name) not in pairs:
            kind = "vector" if scale.ndim == 1 else "scalar"
            error = _unsupported(f"with a {kind} deq_scale", f"{p.dst_dtype}, {scale_name}", pairs, "dst_dtype, scale dtype")
            raise InvalidArgument(f"{error}{_scale_fix(p.dst_dtype, scale, n)}")
        cc = n if p.calc_count is None else p.calc_count
        if p.calc_count is not None and not 1 <= cc <= n:
            raise InvalidArgument(f"calc_count must be in 1..n = {n}, got {cc}")
        if scale.ndim == 1 and scale.shape[0] < cc:
            raise InvalidArgument(
                f"deq_scale must have at least calc_count = {cc} elements, got {scale.shape[0]}"
            )
    else:
        if src_name not in ("int32", "float32"):
            raise InvalidArgument(f"src dtype must be int32 or float32 with policy={p.policy!r}, got {src_name}")
        if (scale_name, p.dst_dtype) not in POLICY_PAIRS:
            raise _unsupported(f"with policy={p.policy!r}", f"{src_name}, {scale_name}, {p.dst_dtype}",
                               [(s, *pair) for s in ("int32", "float32") for pair in POLICY_PAIRS],
                               "src, scale, dst_dtype")
        expected = _policy_scale_shape(p, m, n)
        if scale.shape not in expected:
            raise InvalidArgument(
                f"deq_scale must have shape {' or '.join(str(list(s)) for s in expected)} for "
                f"{_policy_label(p)}, got {list(scale.shape)}"
            )
        cc = m * n if p.calc_count is None else p.calc_count
        if not 0 <= cc <= m * n or (n and cc % n):
            raise InvalidArgument(
                f"calc_count must be a multiple of n = {n} in 0..m*n = {m * n} with policy={p.policy!r}, got {cc}"
            )
    if p.policy != "per_group" and p.group_size is not None:
        raise InvalidArgument(f"group_size applies only to policy='per_group', got group_size={p.group_size}")
    if p.policy != "per_group" and p.k_dim != 1:
        raise InvalidArgument(f"k_dim applies only to policy='per_group', got k_dim={p.k_dim}")
    if p.align_output and (n * 4) % 32:
        raise InvalidArgument(
            f"align_output=True needs 32-byte aligned src rows (n*4 % 32 == 0), got n = {n}"
        )
    return src, scale, p, cc


def _scale_fix(dst_name: str, scale, n: int) -> str:
    """The one-line fix for a float scale the classic form does not take, or ''."""
    if scale.dtype.kind != "f" and scale.dtype != dtypes.bfloat16:
        return ""
    if dst_name == "float16":  # the device takes float16 output only from packed uint64 scales
        packed = "ops.pack_deq_scale(scale)" if scale.ndim == 1 else f"ops.pack_deq_scale(np.full({n}, scale))"
        return f". For float16 output pack the float scale: deq_scale={packed}"
    if scale.dtype == np.float64:
        return ". Pass the scale as float32: deq_scale=np.float32(scale)" if scale.ndim == 0 else \
            ". Pass the scale as float32: deq_scale=scale.astype(np.float32)"
    return ""


def _policy_label(p) -> str:
    if p.policy == "per_token":
        return "policy='per_token'"
    return f"policy='per_group', k_dim={p.k_dim}, group_size={p.group_size}"


def _policy_scale_shape(p, m: int, n: int):
    if p.policy == "per_token":
        return [(m,), (m, 1)]
    if p.group_size is None:
        raise InvalidArgument("group_size is required with policy='per_group'")
    g = p.group_size
    return [(-(-m // g), n)] if p.k_dim == 0 else [(m, -(-n // g))]


def _output_columns(n: int, dst_dtype, align: bool) -> int:
    if not align:
        return n
    itemsize = np.dtype(dst_dtype).itemsize
    return -(-(n * itemsize) // 32) * 32 // itemsize


def _plan(src_shape, scale, p, cc):
    """(scale as 2-D, (row_div, col_div, row_limit, col_limit)): how scales map onto elements."""
    m, n = src_shape
    if p.policy is None:
        limit = cc
        per_row = 32 // np.dtype(_DST[p.dst_dtype]).itemsize
        if p.mode == "single_row" and m == 1 and cc % per_row == 0 and n % cc == 0:
            # The device reads the row as [n / calc_count, calc_count]: every element is
            # scaled, by scale[j % calc_count].
            limit = n
            if scale.ndim == 1:
                scale = (da.tile if isinstance(scale, da.Array) else np.tile)(scale[:cc], n // cc)
        if scale.ndim == 0:
            return scale.reshape(1, 1), (0, 0, NO_LIMIT, limit)
        return scale.reshape(1, -1), (0, 1, NO_LIMIT, limit)
    rows = cc // n if n else 0
    if p.policy == "per_token":
        return scale.reshape(m, 1), (1, 0, rows, n)
    if p.k_dim == 0:
        return scale, (p.group_size, 1, rows, n)
    return scale, (1, p.group_size, rows, n)


# ---------------------------------------------------------------------------------------------
# Dask builder


def _dequant_block(src, scale, plan, dst_dtype, n_out, block_info=None):
    row0 = block_info[0]["array-location"][0][0]
    return dequant_kernel(src, scale, plan, dst_dtype, n_out, row0)


def dequant_chunks(row_chunks, row_div: int):
    """Plan: (src row chunks, scale row chunks or None). Columns are always one chunk.

    ``row_div`` 0: one scale row for all (classic); 1: a scale row per src row; g: one per
    g rows, with src row chunks aligned to multiples of g.
    """
    if row_div == 0:
        return row_chunks, None
    if row_div > 1:
        row_chunks = _chunks.align(row_chunks, row_div)
        return row_chunks, tuple(-(-c // row_div) for c in row_chunks)
    return row_chunks, row_chunks


def _build(src: da.Array, scale, plan, dst_dtype, n_out):
    row_chunks, scale_rows = dequant_chunks(src.chunks[0], plan[0])
    if src.chunks != (row_chunks, (src.shape[1],)):
        src = src.rechunk((row_chunks, (src.shape[1],)))
    # Scales ride along as a second array, matched to src blocks by position (map_blocks):
    # whole (classic) or chunked with the rows.
    chunks = ((scale.shape[0],) if scale_rows is None else scale_rows, (scale.shape[1],))
    if isinstance(scale, da.Array):
        scale = scale.rechunk(chunks)
    else:
        scale = da.from_array(np.asarray(scale), chunks=chunks)
    token = tokenize(src, scale, plan, dst_dtype, n_out)
    return da.map_blocks(
        _dequant_block, src, scale, plan, dst_dtype, n_out,
        chunks=(row_chunks, (n_out,)), dtype=dst_dtype, meta=_lazy.meta(2, dst_dtype),
        name=f"ascend_dequant-{token}",
    )


# ---------------------------------------------------------------------------------------------
# Public function


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
    dst = _DST[p.dst_dtype]
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

_SCALE_BITS = np.uint64(0xFFFFFFFF)   # bits 0..31: the float32 scale
_FP19_BITS = np.uint64(0xFFFFE000)    # the scale's top 19 bits, as the device's fp19 keeps them
_OFFSET_SHIFT = np.uint64(37)         # bits 37..45: the offset, 9-bit two's complement
_OFFSET_BITS = np.uint64(0x1FF)
_FLAG = np.uint64(1 << 46)            # bit 46: set by the device's TransQuantParam


def _float_scale(scale):
    """``scale`` as float32 (NumPy or Dask), refusing what is not a real number."""
    array = scale if isinstance(scale, (np.ndarray, da.Array)) else np.asarray(scale)
    if array.dtype.kind not in "fiu" and array.dtype != dtypes.bfloat16:
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
    bits = value.view(np.uint32).astype(np.uint64) & (_FP19_BITS if fp19 else _SCALE_BITS)
    packed = bits | _FLAG
    if offset is not None:
        if isinstance(offset, (bool, np.bool_)):
            raise InvalidArgument(f"offset must be a number or an array of numbers, got bool {offset!r}")
        rounded = _float_scale(offset).astype(np.float64)
        # round half away from zero, as C's round() in the device's TransQuantParam
        rounded = np.clip(np.sign(rounded) * np.floor(np.abs(rounded) + 0.5), -256, 255)
        try:
            packed = packed | ((rounded.astype(np.int64).astype(np.uint64) & _OFFSET_BITS) << _OFFSET_SHIFT)
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
    scale = (array & _SCALE_BITS).astype(np.uint32).view(F32)
    field = ((array >> _OFFSET_SHIFT) & _OFFSET_BITS).astype(np.int16)
    offset = field - ((field >> 8) << 9)  # sign-extend the 9-bit field
    return scale, offset


def _flag(name: str, value) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise InvalidArgument(f"{name} must be True or False, got {value!r}")
    return bool(value)
