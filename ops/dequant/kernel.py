"""AscendDequant of one NumPy row block, and the bit layout of packed uint64 scales.

``y = dst(f32(src) * f32(scale))``; elements outside the scaled rows and columns pass through
as ``dst(f32(src))``. Every rounding is NumPy's / ml_dtypes' own round-to-nearest-even, so
results equal the plain expression ``(src.astype(f32) * scale).astype(dst)`` bit for bit.

The plain expression materialises two full float32 temporaries. The kernel is one compiled
pass instead (``ops.dequant.jit``): each row's float32 products go to a row buffer that stays
in cache and are rounded from there with NumPy's and ml_dtypes' own algorithms
(``ops/_float_bits.py``), so src is read once and the result written once, with the GIL
released. Where numba is not wanted (a small Dask worker, ``ops/_compiled.py``) the plain
expression runs in row slabs.
"""

from __future__ import annotations

import numpy as np

from ops._compiled import use_compiled_kernels

F32 = np.dtype(np.float32)

NO_LIMIT = np.iinfo(np.int64).max


def scale_as_float32(scale: np.ndarray) -> np.ndarray:
    """Scale values in float32: exact for float16/bfloat16; uint64 carries them in its low 32 bits."""
    if scale.dtype == np.uint64:
        return (scale & np.uint64(0xFFFFFFFF)).astype(np.uint32).view(np.float32)
    return scale.astype(F32)


def dequant_kernel(src, scale, plan, dst_dtype, n_out: int, row0: int = 0) -> np.ndarray:
    """AscendDequant of one NumPy row block ``src`` [rows, n] (global rows row0 ...).

    ``scale`` is 2-D and ``plan = (row_div, col_div, row_limit, col_limit)`` says how it maps
    onto the elements (see ``ops.dequant.jit.dequant_rows``). The result has ``n_out >= n`` columns; the
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
    from ops.dequant.jit import dequant_rows  # numba on first use

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
# Packed uint64 scales (the device's quantisation parameter)

_SCALE_BITS = np.uint64(0xFFFFFFFF)   # bits 0..31: the float32 scale
_FP19_BITS = np.uint64(0xFFFFE000)    # the scale's top 19 bits, as the device's fp19 keeps them
_OFFSET_SHIFT = np.uint64(37)         # bits 37..45: the offset, 9-bit two's complement
_OFFSET_BITS = np.uint64(0x1FF)
_FLAG = np.uint64(1 << 46)            # bit 46: set by the device's TransQuantParam


def packed_scale_bits(value: np.ndarray, fp19: bool):
    """float32 ``value`` (NumPy or Dask) as uint64 deq_scale words: its bits in 0..31 (the top
    19 only with ``fp19``) and bit 46 set, the offset field zero."""
    bits = value.view(np.uint32).astype(np.uint64) & (_FP19_BITS if fp19 else _SCALE_BITS)
    return bits | _FLAG


def offset_field(offset):
    """float64 offsets (NumPy or Dask) as uint64 words holding only bits 37..45: rounded half
    away from zero, clipped to -256..255, as a 9-bit two's complement."""
    # round half away from zero, as C's round() in the device's TransQuantParam
    rounded = np.clip(np.sign(offset) * np.floor(np.abs(offset) + 0.5), -256, 255)
    return (rounded.astype(np.int64).astype(np.uint64) & _OFFSET_BITS) << _OFFSET_SHIFT


def unpacked_scale_bits(array):
    """uint64 deq_scale words (NumPy or Dask) as (float32 scale from bits 0..31, int16 offset
    from bits 37..45)."""
    scale = (array & _SCALE_BITS).astype(np.uint32).view(F32)
    field = ((array >> _OFFSET_SHIFT) & _OFFSET_BITS).astype(np.int16)
    offset = field - ((field >> 8) << 9)  # sign-extend the 9-bit field
    return scale, offset
