"""The compiled inner loop of ``ops._copy.copy_into``, in its own module so that numba (about
50 MiB of a process's memory) is imported at the first copy, not by ``import ops``: a Dask worker
that only gathers or copies never loads it.
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(nogil=True, cache=True)
def copy_words(src, src_strides, dst, dst_strides, shape):  # pragma: no cover - compiled
    nd = shape.shape[0]
    n_in = shape[nd - 1]
    ss_in = src_strides[nd - 1]
    ds_in = dst_strides[nd - 1]
    n_mid = shape[nd - 2]
    ss_mid = src_strides[nd - 2]
    ds_mid = dst_strides[nd - 2]
    outer = 1
    for k in range(nd - 2):
        outer *= shape[k]
    idx = np.zeros(nd, np.int64)
    s = 0
    d = 0
    # Unsigned indices: NumPy-style negative-index wraparound checks would stop LLVM from
    # vectorising the inner loops (measured 4x slower).
    u_in = np.uint64(n_in)
    uss_in = np.uint64(ss_in)
    uds_in = np.uint64(ds_in)
    for _ in range(outer):
        if ss_in == 1 and ds_in == 1:
            for a in range(n_mid):
                sa = np.uint64(s + a * ss_mid)
                da = np.uint64(d + a * ds_mid)
                for t in range(u_in):
                    dst[da + t] = src[sa + t]
        else:
            for a in range(n_mid):
                sa = np.uint64(s + a * ss_mid)
                da = np.uint64(d + a * ds_mid)
                for t in range(u_in):
                    dst[da + t * uds_in] = src[sa + t * uss_in]
        k = nd - 3
        while k >= 0:
            idx[k] += 1
            s += src_strides[k]
            d += dst_strides[k]
            if idx[k] < shape[k]:
                break
            s -= src_strides[k] * shape[k]
            d -= dst_strides[k] * shape[k]
            idx[k] = 0
            k -= 1
