"""float32 -> float16 conversion, compiled, bit for bit as NumPy does it.

NumPy casts float32 to float16 in software (``npy_floatbits_to_halfbits``: round to nearest
even, NaN payloads truncated but kept NaN), at a few ns per element, which dominates
AscendDequant's float16 output. This is the same algorithm compiled by numba; it is checked
against NumPy over every float32 bit pattern class in tests/ops/test_half.py.
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(nogil=True, cache=True, inline="always")
def _half_bits(f):  # pragma: no cover - compiled
    h_sgn = np.uint16((f & np.uint32(0x80000000)) >> np.uint32(16))
    f_exp = f & np.uint32(0x7F800000)
    if f_exp >= np.uint32(0x47800000):  # overflow, inf or NaN
        if f_exp == np.uint32(0x7F800000):
            f_sig = f & np.uint32(0x007FFFFF)
            if f_sig != 0:
                ret = np.uint16(0x7C00 + (f_sig >> np.uint32(13)))
                if ret == np.uint16(0x7C00):  # keep it a NaN
                    ret = np.uint16(0x7C01)
                return np.uint16(h_sgn + ret)
        return np.uint16(h_sgn + np.uint16(0x7C00))
    if f_exp <= np.uint32(0x38000000):  # subnormal half or signed zero
        if f_exp < np.uint32(0x33000000):
            return h_sgn
        e = f_exp >> np.uint32(23)
        f_sig = np.uint32(0x00800000) + (f & np.uint32(0x007FFFFF))
        f_sig = f_sig >> (np.uint32(113) - e)
        if (f_sig & np.uint32(0x00003FFF)) != np.uint32(0x00001000) or (f & np.uint32(0x000007FF)) != 0:
            f_sig += np.uint32(0x00001000)
        return np.uint16(h_sgn + np.uint16(f_sig >> np.uint32(13)))
    h_exp = np.uint16((f_exp - np.uint32(0x38000000)) >> np.uint32(13))
    f_sig = f & np.uint32(0x007FFFFF)
    if (f_sig & np.uint32(0x00003FFF)) != np.uint32(0x00001000):
        f_sig += np.uint32(0x00001000)
    return np.uint16(h_sgn + h_exp + np.uint16(f_sig >> np.uint32(13)))


@numba.njit(nogil=True, cache=True)
def _convert(bits, out):  # pragma: no cover - compiled
    rows, cols = bits.shape
    for i in range(rows):
        for j in range(cols):
            out[i, j] = _half_bits(bits[i, j])


def float32_to_float16(values: np.ndarray, out: np.ndarray) -> None:
    """``out[...] = values.astype(float16)`` for 2-D arrays (any strides), as NumPy rounds."""
    _convert(values.view(np.uint32), out.view(np.uint16))
