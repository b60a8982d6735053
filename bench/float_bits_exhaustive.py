"""Compare ops/_float_bits.py with NumPy (float16) and ml_dtypes (bfloat16) over all 2**32
float32 bit patterns (run by hand, ~6 minutes): ``python -m bench.float_bits_exhaustive``."""

from __future__ import annotations

import time

import numpy as np

from ops._float_bits import round_float32
from ops.dtypes import bfloat16


def main() -> None:
    step = 2**26
    for dtype in (np.dtype(np.float16), bfloat16):
        started, mismatches = time.perf_counter(), 0
        out = np.empty((1024, step // 1024), dtype)
        for start in range(0, 2**32, step):
            bits = np.arange(start, start + step, dtype=np.uint64).astype(np.uint32)
            values = bits.view(np.float32).reshape(out.shape)
            round_float32(values, out)
            with np.errstate(all="ignore"):
                expected = values.astype(dtype)
            mismatches += int((out.view(np.uint16) != expected.view(np.uint16)).sum())
        print(f"{dtype}: {mismatches} of 2**32 float32 patterns differ "
              f"({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
