"""The compiled row loop of AscendDequant (``ops.dequant.kernel.dequant_kernel``), in its own
module so that numba is imported at the first dequantisation, not by ``import ops``.
"""

from __future__ import annotations

import numba
import numpy as np

from ops._float_bits import bfloat16_bits, half_bits


@numba.njit(nogil=True, cache=True)
def dequant_rows(src, src_bits, scale, row_div, col_div, row_limit, col_limit, row0, out, kind):  # pragma: no cover - compiled
    """out[i, :n] = dst(f32(src[i, j]) * scale[r, c]) for one row block (global rows from row0).

    r = (row0 + i) // row_div relative to the block's first scale row (0 when row_div == 0);
    c = j // col_div (0 when col_div == 0). Elements with row0 + i >= row_limit or
    j >= col_limit are not scaled. ``kind`` picks the rounding of ``out``'s bits:
    0 float32 (as uint32), 1 float16, 2 bfloat16 (as uint16).
    """
    rows, n = src.shape
    product = np.empty(n, np.float32)
    bits = product.view(np.uint32)
    first = row0 // row_div if row_div else 0
    for i in range(rows):
        r = (row0 + i) // row_div - first if row_div else 0
        scaled = col_limit if row0 + i < row_limit else 0
        if col_div == 1:
            for j in range(scaled):
                product[j] = np.float32(src[i, j]) * scale[r, j]
        elif col_div == 0:
            factor = scale[r, 0]
            for j in range(scaled):
                product[j] = np.float32(src[i, j]) * factor
        else:
            for j in range(scaled):
                product[j] = np.float32(src[i, j]) * scale[r, j // col_div]
        for j in range(scaled):
            # NaN * NaN: IEEE leaves the payload open; take src's, quieted, as x86 (and so
            # NumPy's multiply) does, rather than whichever operand LLVM put first.
            if product[j] != product[j] and src[i, j] != src[i, j]:
                bits[j] = src_bits[i, j] | np.uint32(0x400000)
        for j in range(scaled, n):
            product[j] = np.float32(src[i, j])
        if kind == 0:
            for j in range(n):
                out[i, j] = bits[j]
        elif kind == 1:
            for j in range(n):
                out[i, j] = half_bits(bits[j])
        else:
            for j in range(n):
                out[i, j] = bfloat16_bits(bits[j])
