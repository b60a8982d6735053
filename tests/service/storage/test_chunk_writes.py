"""``SampledFillCheck``: blocks written through it leave the store byte for byte as Zarr's own
writes do (all-fill chunks not stored, by Zarr's comparison), and a block whose sample shows
an element that is not fill skips Zarr's whole-chunk comparison."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import zarr
from dask.base import tokenize
from hypothesis import given, settings
from hypothesis import strategies as st
from zarr.core.buffer import default_buffer_prototype

from service.storage.chunk_writes import SAMPLE_SIZE, SampledFillCheck

NDBuffer = type(default_buffer_prototype().nd_buffer.from_numpy_array(np.zeros(1)))


def _array(dtype, fill, shape=(6, 10), chunks=(3, 5), **kwargs) -> zarr.Array:
    return zarr.create_array(zarr.storage.MemoryStore(), shape=shape, chunks=chunks, dtype=dtype, fill_value=fill,
                             zarr_format=3, **kwargs)


def _contents(array: zarr.Array) -> dict:
    store = array.store._store_dict
    return {key: store[key].to_bytes() for key in sorted(store) if not key.endswith("zarr.json")}


def _blocks(shape, step):
    """Slices of ``shape`` in blocks of ``step`` along each axis (edge blocks shorter)."""
    for i in range(0, shape[0], step[0]):
        for j in range(0, shape[1], step[1]):
            yield slice(i, min(i + step[0], shape[0])), slice(j, min(j + step[1], shape[1]))


def _write_both(values, dtype, fill, step, chunks=(3, 5)):
    plain, sampled = _array(dtype, fill, values.shape, chunks), _array(dtype, fill, values.shape, chunks)
    target = SampledFillCheck(sampled)
    for region in _blocks(values.shape, step):
        plain[region] = values[region]
        target[region] = values[region]
    return plain, sampled


FILLS = {"float32": [0.0, np.nan, 1.5, -0.0], "int16": [0, -7], "float64": [0.0, np.nan], "bool": [False, True],
         "uint8": [0, 255]}


@settings(max_examples=60, deadline=None)
@given(data=st.data(), dtype=st.sampled_from(sorted(FILLS)),
       step=st.sampled_from([(3, 5), (2, 5), (3, 10), (6, 10), (1, 1), (3, 4)]))
def test_the_store_holds_what_zarr_alone_writes(data, dtype, step):
    fill = data.draw(st.sampled_from(FILLS[dtype]))
    values = np.full((6, 10), fill, dtype=dtype)
    # Blocks of fill, of fill but one element (anywhere, sampled or not), and of other values.
    others = {"float32": [0.0, -0.0, np.nan, 2.5, 1.5], "float64": [0.0, -0.0, np.nan, 3.0],
              "int16": [0, -7, 12], "bool": [False, True], "uint8": [0, 255, 3]}[dtype]
    for _ in range(data.draw(st.integers(0, 12))):
        i, j = data.draw(st.integers(0, 5)), data.draw(st.integers(0, 9))
        values[i, j] = data.draw(st.sampled_from(others))
    plain, sampled = _write_both(values, dtype, fill, step)
    assert _contents(sampled) == _contents(plain)
    np.testing.assert_array_equal(sampled[...], values)


@pytest.mark.smoke
def test_negative_zero_is_stored_in_a_zero_filled_array_and_nan_payloads_are_fill():
    values = np.zeros((6, 10), np.float32)
    values[4, 7] = -0.0  # a different bit pattern from the fill: Zarr stores the chunk
    plain, sampled = _write_both(values, "float32", 0.0, (3, 5))
    assert list(_contents(sampled)) == list(_contents(plain)) == ["c/1/1"]
    nans = np.full((6, 10), np.nan, np.float32)
    nans.view(np.uint32)[1, 1] = 0x7FC00001  # another NaN: equal to a NaN fill by Zarr's rule
    plain, sampled = _write_both(nans, "float32", np.nan, (3, 5))
    assert _contents(sampled) == _contents(plain) == {}


@pytest.fixture
def full_checks(monkeypatch):
    """The sizes of the buffers Zarr's fill comparison is asked about."""
    sizes = []
    compare = NDBuffer.all_equal

    def recorded(self, other, *args, **kwargs):
        sizes.append(self._data.size)
        return compare(self, other, *args, **kwargs)

    monkeypatch.setattr(NDBuffer, "all_equal", recorded)
    return sizes


@pytest.mark.smoke
def test_a_block_with_a_sampled_value_skips_the_whole_chunk_comparison(full_checks):
    array = _array("float32", 0.0, shape=(64, 64), chunks=(32, 32))
    target = SampledFillCheck(array)
    block = np.random.default_rng(0).random((32, 32), dtype=np.float32)
    target[32:64, 0:32] = block
    assert full_checks and max(full_checks) <= SAMPLE_SIZE
    np.testing.assert_array_equal(array[32:64, 0:32], block)


def test_a_block_of_fill_but_one_unsampled_element_is_checked_whole_and_stored(full_checks):
    array = _array("float32", 0.0, shape=(64, 64), chunks=(32, 32))
    block = np.zeros((32, 32), np.float32)
    block[5, 7] = 1.0  # flat index 167: the 64 sampled of 1,024 (i * 1023 // 63) take 162 and 178
    SampledFillCheck(array)[0:32, 32:64] = block
    assert max(full_checks) == 32 * 32
    assert list(_contents(array)) == ["c/0/1"]


def test_blocks_over_several_chunks_sharded_and_scalar_arrays_keep_zarrs_check(full_checks):
    array = _array("float32", 0.0, shape=(64, 64), chunks=(32, 32))
    block = np.zeros((32, 64), np.float32)
    block[0, 0] = 1.0  # a sampled element, in the first of two chunks: the second is all fill
    SampledFillCheck(array)[0:32, 0:64] = block
    assert list(_contents(array)) == ["c/0/0"]
    sharded = _array("float32", 0.0, shape=(64, 64), chunks=(16, 16), shards=(32, 32))
    assert SampledFillCheck(sharded)._writes_all is None
    SampledFillCheck(sharded)[0:32, 0:32] = np.ones((32, 32), np.float32)
    np.testing.assert_array_equal(sharded[0:32, 0:32], 1.0)
    scalar = _array("float32", 0.0, shape=(), chunks=())
    assert SampledFillCheck(scalar)._writes_all is None
    SampledFillCheck(scalar)[()] = np.float32(2.5)
    assert scalar[()] == 2.5


def test_it_travels_to_workers_and_tokenizes_as_its_array(tmp_path):
    array = zarr.create_array(tmp_path / "a.zarr", shape=(6, 10), chunks=(3, 5), dtype="int16", fill_value=-7,
                              zarr_format=3)
    target = pickle.loads(pickle.dumps(SampledFillCheck(array)))
    target[0:3, 0:5] = np.arange(15, dtype=np.int16).reshape(3, 5)
    np.testing.assert_array_equal(array[0:3, 0:5], np.arange(15).reshape(3, 5))
    assert tokenize(SampledFillCheck(array)) == tokenize(SampledFillCheck(array))
    assert tokenize(SampledFillCheck(array)) != tokenize(SampledFillCheck(_array("int16", -7)))
