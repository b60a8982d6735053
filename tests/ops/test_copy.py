"""The copy engine: any pair of same-shape views, every dtype, against np.copyto."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ops._copy import copy_into
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


@given(view_pairs())
def test_copy_matches_numpy(pair):
    dst, src = pair
    expected = np.empty_like(dst)
    np.copyto(expected, src)
    copy_into(dst, src)
    assert_same(dst, expected)


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


def test_nan_payloads_survive():
    bits = np.array([0x7FC00001, 0xFFC12345, 0x7F800001, 0x80000000], np.uint32)
    src = bits.view(np.float32).reshape(2, 2)
    dst = np.empty((2, 2), np.float32)
    copy_into(dst.T, src)
    assert dst.T.view(np.uint32).tolist() == bits.reshape(2, 2).tolist()
