"""float32 -> float16 / bfloat16 rounding on raw bits, compiled, exactly as NumPy and ml_dtypes.

NumPy casts float32 to float16 in software (``npy_floatbits_to_halfbits``) at a few ns per
element; ml_dtypes casts to bfloat16 with Eigen's round-to-nearest-even bit trick. These are
the same two algorithms as numba functions, so AscendDequant can round inside its compiled
loop. Both were compared with NumPy / ml_dtypes over all 2**32 float32 bit patterns (no
difference; see bench/RESULTS.md); tests/ops/test_float_bits.py checks every exponent.
"""

from __future__ import annotations

import numba
import numpy as np

U32 = np.uint32


@numba.njit(nogil=True, cache=True, inline="always")
def half_bits(f):  # pragma: no cover - compiled
    """float16 bits of the float32 with bits ``f`` (round to nearest even; NaN stays NaN)."""
    h_sgn = np.uint16((f & U32(0x80000000)) >> U32(16))
    f_exp = f & U32(0x7F800000)
    if f_exp >= U32(0x47800000):  # overflow, inf or NaN
        if f_exp == U32(0x7F800000):
            f_sig = f & U32(0x007FFFFF)
            if f_sig != 0:
                ret = np.uint16(0x7C00 + (f_sig >> U32(13)))
                if ret == np.uint16(0x7C00):  # a payload below float16's keeps it a NaN
                    ret = np.uint16(0x7C01)
                return np.uint16(h_sgn + ret)
        return np.uint16(h_sgn + np.uint16(0x7C00))
    if f_exp <= U32(0x38000000):  # subnormal float16 or signed zero
        if f_exp < U32(0x33000000):
            return h_sgn
        e = f_exp >> U32(23)
        f_sig = U32(0x00800000) + (f & U32(0x007FFFFF))
        f_sig = f_sig >> (U32(113) - e)
        if (f_sig & U32(0x00003FFF)) != U32(0x00001000) or (f & U32(0x000007FF)) != 0:
            f_sig += U32(0x00001000)
        return np.uint16(h_sgn + np.uint16(f_sig >> U32(13)))
    h_exp = np.uint16((f_exp - U32(0x38000000)) >> U32(13))
    f_sig = f & U32(0x007FFFFF)
    if (f_sig & U32(0x00003FFF)) != U32(0x00001000):
        f_sig += U32(0x00001000)
    return np.uint16(h_sgn + h_exp + np.uint16(f_sig >> U32(13)))


@numba.njit(nogil=True, cache=True, inline="always")
def bfloat16_bits(f):  # pragma: no cover - compiled
    """bfloat16 bits of the float32 with bits ``f`` (round to nearest even; NaN -> quiet NaN)."""
    if (f & U32(0x7F800000)) == U32(0x7F800000) and (f & U32(0x007FFFFF)) != 0:
        return np.uint16(0xFFC0) if (f >> U32(31)) else np.uint16(0x7FC0)
    return np.uint16((f + U32(0x7FFF) + ((f >> U32(16)) & U32(1))) >> U32(16))


@numba.njit(nogil=True, cache=True)
def _convert(bits, out, bfloat):  # pragma: no cover - compiled
    for i in range(bits.shape[0]):
        for j in range(bits.shape[1]):
            out[i, j] = bfloat16_bits(bits[i, j]) if bfloat else half_bits(bits[i, j])


def round_float32(values: np.ndarray, out: np.ndarray) -> None:
    """``out[...] = values.astype(out.dtype)`` for 2-D float32 ``values`` and a float16 or
    bfloat16 ``out`` (any strides), rounded exactly as NumPy / ml_dtypes round."""
    _convert(values.view(np.uint32), out.view(np.uint16), out.dtype != np.float16)
