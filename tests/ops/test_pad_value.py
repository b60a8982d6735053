"""SpaceToBatch(ND)'s pad_value: the padded cells hold it, bit for bit, in the NumPy and the
Dask path, through the registry and the accessor; values a dtype cannot hold are refused."""

from __future__ import annotations

import math

import dask.array as da
import numpy as np
import pytest
import xarray as xr
import zarr
from hypothesis import given, settings
from hypothesis import strategies as st

import ops
from ops import dtypes, registry
from ops.space_batch.padding import pad_fill
from tests.helpers import assert_same, chunkings, compute, dtype_strategy, random_array
from tests.ops import reference


def _fill_for(dtype: np.dtype, draw):
    """A pad value of ``dtype``'s kind, and the 0-d array it must become, made independently."""
    real = np.dtype(np.float16) if dtype == dtypes.complex32 else dtype
    fill = np.zeros((), dtype)
    if real.kind == "b":
        value = draw(st.integers(0, 1))
        fill[()] = bool(value)
    elif real.kind in "iu":
        info = np.iinfo(real)
        value = draw(st.integers(int(info.min), int(info.max)))
        fill[()] = value
    else:
        value = draw(st.sampled_from([math.nan, -0.0, 1.5, -2.0, math.inf]))
        if dtype == dtypes.complex32:
            fill["real"] = value
        else:
            fill[()] = value  # the real part of a complex type, imaginary 0
    return value, fill


@st.composite
def padded_cases(draw):
    m = draw(st.integers(1, 3))
    rest = draw(st.lists(st.integers(0, 2), max_size=5 - m))
    block = draw(st.lists(st.integers(1, 3), min_size=m, max_size=m))
    spatial, pads = [], []
    for b in block:
        s, lo, hi = draw(st.integers(0, 5)), draw(st.integers(0, 4)), draw(st.integers(0, 3))
        hi += (-(s + lo + hi)) % b
        spatial.append(s)
        pads.append([lo, hi])
    shape = (draw(st.integers(1, 3)), *spatial, *rest)
    dtype = draw(dtype_strategy)
    x = random_array(np.random.default_rng(draw(st.integers(0, 2**32 - 1))), shape, dtype)
    value, fill = _fill_for(np.dtype(dtype), draw)
    return x, block, pads, value, fill, draw(chunkings(shape))


@settings(max_examples=40, deadline=None)  # every dtype within a few seconds
@given(padded_cases())
def test_padded_cells_hold_pad_value_numpy_and_dask(case):
    x, block, pads, value, fill, chunks = case
    expected = reference.space_to_batch_nd(x, block, pads, fill)
    assert_same(ops.space_to_batch_nd(x, block, pads, pad_value=value), expected)
    lazy = ops.space_to_batch_nd(da.from_array(x, chunks=chunks), block, pads, pad_value=value)
    assert_same(compute(lazy), expected)
    if x.dtype.kind != "V":  # Zarr holds NumPy's own dtypes (not complex32, bfloat16, float8)
        # read straight from a store: the window strategies that read their own regions
        stored = zarr.create_array(zarr.storage.MemoryStore(), shape=x.shape, dtype=x.dtype,
                                   chunks=tuple(max(max(c, default=1), 1) for c in chunks))
        stored[...] = x
        from_store = da.from_zarr(stored, chunks=chunks)
        assert_same(compute(ops.space_to_batch_nd(from_store, block, pads, pad_value=value)), expected)
    # the padding is cropped away again: the inverse gives x back whatever the pad was
    assert_same(ops.batch_to_space_nd(expected, block, pads), x)


@pytest.mark.smoke
def test_nan_padding_of_a_float_image():
    x = np.array([[1, 2, 3], [4, 5, 6]], np.float32)
    y = ops.space_to_batch_nd(x, [2], [[1, 0]], pad_value="NaN")
    assert np.isnan(y[:2, 0]).all() and y[2:, 0].tolist() == [1, 4] and y[:, 1].tolist() == [2, 5, 3, 6]
    four = ops.space_to_batch(np.ones((1, 2, 2, 1), np.float64), 2, [[1, 1], [0, 0]], pad_value=-1)
    assert sorted(four.reshape(-1).tolist()) == [-1, -1, -1, -1, 1, 1, 1, 1]


def test_zero_and_negative_zero_differ():
    x = np.ones((1, 1), np.float32)
    plus = ops.space_to_batch_nd(x, [2], [[1, 0]])
    minus = ops.space_to_batch_nd(x, [2], [[1, 0]], pad_value=-0.0)
    assert np.signbit(minus[0, 0]) and not np.signbit(plus[0, 0])


@pytest.mark.parametrize("dtype,value,rule", [
    ("int16", 2.5, "must be an integer in -32768..32767 for x's dtype int16, got 2.5"),
    ("int16", 40000, "must be an integer in -32768..32767 for x's dtype int16, got 40000"),
    ("uint8", -1, "must be an integer in 0..255 for x's dtype uint8, got -1"),
    ("int32", math.nan, "NaN needs a floating dtype"),
    ("bool", 2, "must be an integer in 0..1 for x's dtype bool, got 2"),
    ("float16", 1e6, "must be within the range of x's dtype float16, got 1000000.0"),
    ("float32", True, "must be a number (or 'NaN'), got True"),
    ("float32", "nan", "must be a number (or 'NaN'), got 'nan'"),
])
def test_values_the_dtype_cannot_hold_are_refused_before_any_work(dtype, value, rule):
    x = da.zeros((1, 3), dtype=dtype, chunks=1)
    with pytest.raises(ops.InvalidArgument, match="pad_value") as error:
        ops.space_to_batch_nd(x, [2], [[1, 0]], pad_value=value)
    assert rule in str(error.value)


def test_pad_fill_casts_to_the_dtype():
    assert pad_fill("NaN", np.float32).dtype == np.float32 and np.isnan(pad_fill("NaN", np.float32))
    assert pad_fill(0.1, np.float16) == np.float16(0.1)  # rounded to the nearest of the type
    assert pad_fill(3, np.complex64) == np.complex64(3 + 0j)
    assert pad_fill(2**63 - 1, np.int64) == np.iinfo(np.int64).max  # exact, not through a float
    c32 = pad_fill(-2, dtypes.complex32)
    assert c32["real"] == -2 and c32["imag"] == 0


@pytest.mark.parametrize("chunks", [2, (1, 4, 4), (2, 4, 4), (2, 1, 3)])
def test_a_pad_value_adds_no_task(chunks):
    # the tasks that make the blocks write the pad into them: no task of its own
    x = np.arange(32, dtype="f4").reshape(2, 4, 4)
    lazy = da.from_array(x, chunks=chunks)
    plain = ops.space_to_batch_nd(lazy, [2, 2], [[1, 1], [0, 2]])
    for value in (0, 7, math.nan):
        padded = ops.space_to_batch_nd(lazy, [2, 2], [[1, 1], [0, 2]], pad_value=value)
        assert len(padded.dask) == len(plain.dask)
        fill = np.full((), value, "f4")
        assert_same(compute(padded), reference.space_to_batch_nd(x, [2, 2], [[1, 1], [0, 2]], fill))


class _DirtyNumPy:
    """NumPy whose ``empty`` hands out memory full of 0x7F bytes, as reused memory can be, and
    which counts the blocks made by ``zeros``."""

    def __init__(self):
        self.zeroed = 0

    def __getattr__(self, name):
        return getattr(np, name)

    def zeros(self, *args, **kwargs):
        self.zeroed += 1
        return np.zeros(*args, **kwargs)

    @staticmethod
    def empty(shape, dtype=float):
        block = np.empty(shape, dtype)
        block.reshape(-1).view(np.uint8)[:] = 0x7F
        return block


@pytest.mark.parametrize("source", ["from_array", "zarr"])
@pytest.mark.parametrize("chunks", [(1, 4, 8, 2), (2, 2, 3, 2), (1, 3, 8, 2)])
@pytest.mark.parametrize("value", [0, -0.0, math.nan])
def test_blocks_are_not_zeroed_first_yet_every_padding_cell_holds_the_pad(monkeypatch, value, chunks, source):
    # A zero pad too is written into the padding cells alone, not by zeroing whole blocks.
    from ops.space_batch import kernel

    dirty = _DirtyNumPy()
    monkeypatch.setattr(kernel, "np", dirty)
    x = np.arange(2 * 8 * 8 * 2, dtype="f4").reshape(2, 8, 8, 2) + 1
    if source == "zarr":
        stored = zarr.create_array(zarr.storage.MemoryStore(), shape=x.shape, dtype=x.dtype, chunks=chunks)
        stored[...] = x
        lazy = da.from_zarr(stored)
    else:
        lazy = da.from_array(x, chunks=chunks)
    for block, pads in (([2, 2], [[1, 1], [1, 1]]), ([2, 4], [[3, 1], [1, 3]]), ([4], [[2, 2]])):
        expected = reference.space_to_batch_nd(x, block, pads, np.full((), value, "f4"))
        assert_same(compute(ops.space_to_batch_nd(lazy, block, pads, pad_value=value)), expected)
    assert dirty.zeroed == 0


# --- the accessor and the registry ------------------------------------------------------------


def test_accessor_and_registry_pad_by_name():
    x = xr.DataArray(np.arange(12, dtype="f4").reshape(1, 3, 4), dims=("time", "y", "x"))
    by_name = x.ops.space_to_batch_nd(y=2, x=2, paddings={"y": (1, 0)}, pad_value=np.nan)
    plain = ops.space_to_batch_nd(x.values, [2, 2], [[1, 0], [0, 0]], pad_value=np.nan)
    assert_same(by_name.values, plain)
    through = registry.apply("space_to_batch_nd", {"x": x},
                             {"block_shape": {"y": 2, "x": 2}, "paddings": {"y": [1, 0]}, "pad_value": "NaN"})
    assert_same(through.values, plain)
    assert '"pad_value": "NaN"' in by_name.attrs["ops_history"]  # JSON has no NaN
    square = xr.DataArray(np.ones((1, 2, 2, 1), "f8"), dims=("n", "y", "x", "c"))
    four = registry.apply("space_to_batch", {"x": square}, {"block_size": 2, "paddings": [[1, 1], [0, 0]],
                                                            "pad_value": 5})
    assert_same(four.values, ops.space_to_batch(square.values, 2, [[1, 1], [0, 0]], pad_value=5))
    assert (four.values == 5).sum() == 4


def test_nan_on_raw_packed_integers_is_their_fill_value():
    raw = xr.DataArray(np.arange(12, dtype="i2").reshape(1, 3, 4), dims=("time", "y", "x"),
                       attrs={"scale_factor": 0.5, "_FillValue": np.int16(-32767)})
    padded = raw.ops.space_to_batch_nd(y=2, x=2, paddings={"y": (1, 0)}, pad_value="NaN")
    assert padded.dtype == np.int16 and (padded.values == -32767).sum() == 4
    assert xr.decode_cf(padded.to_dataset(name="t"))["t"].isnull().sum() == 4
    unpacked = raw.drop_attrs()
    with pytest.raises(ops.InvalidArgument, match="NaN needs a floating dtype"):
        unpacked.ops.space_to_batch_nd(y=2, x=2, paddings={"y": (1, 0)}, pad_value="NaN")
