"""The copy engine: any pair of same-shape views, every dtype, against np.copyto."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import dask
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ops._compiled import COMPILED_KEY, use_compiled_kernels
from ops._copy import copy_into
from ops.errors import InvalidArgument
from tests.helpers import assert_same, dtype_strategy, random_array


@st.composite
def view_pairs(draw):
    ndim = draw(st.integers(1, 6))
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=ndim, max_size=ndim)))
    dtype = draw(dtype_strategy)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    steps = [draw(st.integers(1, 2)) for _ in shape]
    big = random_array(rng, tuple(n * s for n, s in zip(shape, steps)), dtype)
    src = big[tuple(slice(None, None, s) for s in steps)]
    src = src.transpose(draw(st.permutations(range(ndim))))
    perm = draw(st.permutations(range(ndim)))
    dst_base = np.zeros(tuple(np.array(src.shape)[list(perm)]), dtype)
    dst = dst_base.transpose(np.argsort(perm))
    return dst, src


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "numpy"])
@given(pair=view_pairs())
def test_copy_matches_numpy(pair, compiled):
    dst, src = pair
    expected = np.empty_like(dst)
    np.copyto(expected, src)
    with dask.config.set({COMPILED_KEY: compiled}):
        copy_into(dst, src)
    assert_same(dst, expected)


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "numpy"])
@pytest.mark.smoke
def test_nan_payloads_and_odd_itemsizes_survive_either_path(compiled):
    bits = np.array([0x7FC00001, 0xFFC12345, 0x7F800001, 0x80000000], np.uint32)
    dst = np.empty((2, 2), np.float32)
    wide = np.arange(24, dtype=np.uint8).view("V12").reshape(2, 1)  # no machine word of 12 bytes
    wide_dst = np.empty((1, 2), "V12")
    with dask.config.set({COMPILED_KEY: compiled}):
        copy_into(dst.T, bits.view(np.float32).reshape(2, 2))
        copy_into(wide_dst.T, wide)
    assert dst.T.view(np.uint32).tolist() == bits.reshape(2, 2).tolist()
    assert wide_dst.tobytes() == bytes(range(24))


def test_a_bad_compiled_kernels_setting_names_the_key_and_value():
    with dask.config.set({COMPILED_KEY: "sometimes"}):
        with pytest.raises(InvalidArgument, match=r"chunked-tensor-ops.compiled-kernels .*'auto', true or false.*'sometimes'"):
            use_compiled_kernels()


def test_auto_keeps_numba_off_small_dask_workers():
    """Under the default setting a worker with a 384 MiB limit rearranges and dequantises without
    loading numba (its ~100 MiB would put the worker above its spill line), one with 2 GiB
    loads it; both give the in-process (compiled) result."""
    code = textwrap.dedent("""
        import sys
        import dask.array as da, numpy as np
        from distributed import Client, LocalCluster
        import ops
        x = np.arange(2 * 4 * 6 * 8, dtype=np.float32).reshape(2, 4, 6, 8)
        for limit in ("384MiB", "2GiB"):
            with LocalCluster(n_workers=1, threads_per_worker=1, memory_limit=limit, processes=True,
                              dashboard_address=None) as cluster, Client(cluster) as client:
                y = ops.depth_to_space(da.from_array(x, chunks=(1, 2, 6, 8)), 2).compute()
                q = da.from_array(np.arange(-64, 64, dtype=np.int32).reshape(8, 16), chunks=(4, 16))
                z = ops.ascend_dequant(q, np.float32(0.5), dst_dtype="bfloat16").compute()
                loaded = client.run(lambda: "numba" in sys.modules)
                same = (y.tobytes() == ops.depth_to_space(x, 2).tobytes()
                        and z.tobytes() == ops.ascend_dequant(q.compute(), np.float32(0.5), dst_dtype="bfloat16").tobytes())
                print(limit, list(loaded.values())[0], same)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["384MiB", "False", "True", "2GiB", "True", "True"]


@pytest.mark.parametrize("offset", [1, 2, 3, 4, 6])
def test_unaligned_buffers(offset):
    raw = np.zeros(8 * 64 + 16, np.uint8)
    src = random_array(np.random.default_rng(offset), (8, 8), np.float64)
    dst = np.frombuffer(raw.data, dtype=np.float64, count=64, offset=offset).reshape(8, 8).copy()
    unaligned = np.frombuffer(bytearray(raw.tobytes()), dtype=np.float64, count=64, offset=offset).reshape(8, 8)
    copy_into(unaligned.T, src)
    assert_same(unaligned.T, src)
    copy_into(dst, unaligned[::-1])
    assert_same(dst, src.T[::-1])


def test_broadcast_and_reversed_sources():
    dst = np.empty((3, 4), np.int32)
    copy_into(dst, np.broadcast_to(np.arange(4, dtype=np.int32), (3, 4)))
    assert dst.tolist() == [[0, 1, 2, 3]] * 3
    copy_into(dst, np.arange(12, dtype=np.int32).reshape(3, 4)[::-1, ::-1])
    assert dst[0].tolist() == [11, 10, 9, 8]


def test_mismatched_arguments():
    with pytest.raises(ValueError, match="shapes differ"):
        copy_into(np.empty((2, 3)), np.empty((3, 2)))
    with pytest.raises(ValueError, match="itemsizes differ"):
        copy_into(np.empty(3, np.float32), np.empty(3, np.float64))
