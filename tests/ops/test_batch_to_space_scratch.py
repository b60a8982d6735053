"""BatchToSpaceND through a scratch store: with the batch axis chunked and no room for a bundle
of P chunks, each source chunk is read once and the parts of it that output blocks take go
through files (ops/space_batch/through_scratch.py), instead of each chunk being read P times."""

from __future__ import annotations

import itertools
import mmap

import dask
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ops
from ops import registry
from ops._chunks import zarr_regular
from ops._scratch import Scratch
from ops.space_batch import kernel
from tests.helpers import assert_same
from tests.ops.test_plans_and_graphs import _counted_zarr_of, _layer_reads


def _files(path) -> list[str]:
    return sorted(p.name for p in path.iterdir()) if path.exists() else []


@pytest.mark.smoke
def test_each_chunk_is_read_once_and_its_parts_go_through_the_scratch_store(tmp_path):
    # Four 256-byte chunks (float32 [1, 4, 8, 2]), one per group, feed four output blocks; with
    # a 1 KiB chunk size no bundle fits, and without a scratch store each output block reads
    # its quarter of the 4 chunks (every chunk decoded 4 times).
    values = np.arange(4 * 16 * 8 * 2, dtype=np.float32).reshape(4, 16, 8, 2)
    expected = ops.batch_to_space_nd(values, [2, 2], [[0, 0], [0, 0]])
    scratch = tmp_path / "scratch"
    x, store = _counted_zarr_of(values, (1, 4, 8, 2))
    with dask.config.set({"array.chunk-size": "1KiB"}), ops.scratch(scratch):
        y = ops.batch_to_space_nd(x, [2, 2], [[0, 0], [0, 0]])
    assert not _layer_reads(y, "-bundle-")
    splits = _layer_reads(y, "-split-")
    assert all(len(r) == 1 for r in splits.values())
    assert sorted(r[0][2] for r in splits.values()) == sorted(  # each chunk whole, by one split
        tuple(slice(a, a + n) for a, n in zip(k, (1, 4, 8, 2))) for k in [(g, 4 * r, 0, 0) for g in range(4) for r in range(4)])
    assert not _files(scratch)  # nothing is written before the graph runs
    for scheduler in ("sync", "threads"):
        store.reads.clear()
        assert_same(y.compute(scheduler=scheduler), expected)
        assert len(store.reads) == x.npartitions and set(store.reads.values()) == {1}, store.reads
        assert not _files(scratch), _files(scratch)  # every part removed by the block that took it
    # The scratch store as given to the registry (the service's and the command line's door).
    with dask.config.set({"array.chunk-size": "1KiB"}):
        named = registry.apply("batch_to_space_nd", {"x": x}, {"block_shape": [2, 2], "crops": [[0, 0], [0, 0]]},
                               scratch={"url": str(scratch)})
        plain = registry.apply("batch_to_space_nd", {"x": x}, {"block_shape": [2, 2], "crops": [[0, 0], [0, 0]]})
    assert [k for k in dict(named.data.__dask_graph__()) if "-split-" in str(k[0])]
    assert not [k for k in dict(plain.data.__dask_graph__()) if "-split-" in str(k[0])]
    assert_same(named.values, expected)
    assert dask.config.get("chunked-tensor-ops.scratch", None) is None  # set for the build only


def test_the_plan_is_taken_only_where_the_chunks_would_be_read_more_than_once(tmp_path):
    values = np.arange(4 * 16 * 8 * 2, dtype=np.float32).reshape(4, 16, 8, 2)
    x, _ = _counted_zarr_of(values, (1, 4, 8, 2))
    with ops.scratch(tmp_path):
        with dask.config.set({"array.chunk-size": "2KiB"}):  # a bundle of the 4 chunks fits: read once
            bundled = ops.batch_to_space_nd(x, [2, 2], [[0, 0], [0, 0]])
        with dask.config.set({"array.chunk-size": "1KiB"}):
            computed = ops.batch_to_space_nd(x + 0, [2, 2], [[0, 0], [0, 0]])  # blocks computed once anyway
            single = ops.batch_to_space_nd(_counted_zarr_of(values, (4, 4, 8, 2))[0], [2, 2], [[0, 0], [0, 0]])
    assert _layer_reads(bundled, "-bundle-") and not _layer_reads(bundled, "-split-")
    for y in (computed, single):
        assert not [k for k in dict(y.__dask_graph__()) if "-split-" in str(k[0])]
    for y in (bundled, computed, single):
        assert_same(y.compute(), ops.batch_to_space_nd(values, [2, 2], [[0, 0], [0, 0]]))


@settings(max_examples=25, deadline=None)
@given(
    block=st.sampled_from([[2], [3], [2, 2], [1, 3], [2, 1, 2]]),
    batch=st.integers(1, 2),
    row_chunk=st.integers(1, 4),
    crop=st.data(),
    size=st.sampled_from(["64B", "256B", "1KiB"]),
)
def test_through_scratch_equals_the_numpy_kernel(tmp_path_factory, block, batch, row_chunk, crop, size):
    # Any block shape, a batch chunked per image, spatial chunks of any size (split further
    # where the plan's chunks are smaller: a split reads its source chunk whole), any crops.
    m = len(block)
    spatial = [4 * b for b in block]
    shape = (int(np.prod(block)) * batch, *spatial, 3)
    values = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    crops = [[crop.draw(st.integers(0, n // 2)), crop.draw(st.integers(0, n // 2 - 1))] for n in spatial]
    scratch = tmp_path_factory.mktemp("scratch")
    x, store = _counted_zarr_of(values, (1, *([row_chunk] * m), 3))
    with dask.config.set({"array.chunk-size": size}), ops.scratch(scratch):
        y = ops.batch_to_space_nd(x, block, crops)
    assert_same(y.compute(scheduler="threads"), ops.batch_to_space_nd(values, block, crops))
    if _layer_reads(y, "-split-"):
        assert max(store.reads.values()) == 1, store.reads
        assert all(map(zarr_regular, y.chunks)), y.chunks  # stored as it is, with no rechunk
    assert not _files(scratch)


def _batch_to_space_reference(x: np.ndarray, block, crops) -> np.ndarray:
    """BatchToSpaceND as TensorFlow defines it: a reshape, a transpose, a reshape, a crop."""
    m, batch = len(block), x.shape[0] // int(np.prod(block))
    y = x.reshape(*block, batch, *x.shape[1:])
    y = y.transpose(m, *(a for i in range(m) for a in (m + 1 + i, i)), *range(2 * m + 1, y.ndim))
    y = y.reshape(batch, *(n * b for n, b in zip(x.shape[1 : 1 + m], block)), *x.shape[1 + m :])
    return y[(slice(None), *(slice(lo, y.shape[1 + i] - hi) for i, (lo, hi) in enumerate(crops)))]


@settings(max_examples=50, deadline=None)
@given(block=st.sampled_from([[2], [3], [2, 2], [1, 3], [2, 1, 2]]), cuts=st.data())
def test_parts_placed_one_by_one_make_the_block(block, cuts):
    # An output task places each part of each group's rows where BatchToSpaceND puts it (no
    # box assembled first); parts lying in cropped rows only are skipped.
    batch = cuts.draw(st.integers(1, 3))
    spatial = [cuts.draw(st.integers(1, 4)) for _ in block]
    x = np.random.default_rng(1).standard_normal((int(np.prod(block)) * batch, *spatial, 2)).astype(np.float32)
    crops = [sorted(cuts.draw(st.lists(st.integers(0, n * b // 2), min_size=2, max_size=2)))
             for n, b in zip(spatial, block)]
    crops = [[lo, min(hi, n * b - lo - 1)] for (lo, hi), n, b in zip(crops, spatial, block)]
    expected = _batch_to_space_reference(x, block, crops)
    y = np.full(expected.shape, np.nan, np.float32)
    groups = x.reshape(-1, batch, *x.shape[1:])
    for group, j in zip(groups, np.ndindex(*block)):
        bounds = [sorted({0, n, *cuts.draw(st.lists(st.integers(1, max(1, n - 1)), max_size=2))})
                  for n in group.shape]
        for box in itertools.product(*(zip(b, b[1:]) for b in bounds)):
            offsets = [lo for lo, _ in box]
            part = group[tuple(slice(lo, hi) for lo, hi in box)]
            kernel.place_batch_part(y, part, offsets, j, block, [lo for lo, _ in crops])
    assert_same(y, expected)


def test_a_crop_before_the_first_row_keeps_the_blocks_zarr_chunks(tmp_path):
    # Crops [[1, 1], [1, 1]] on two chunked spatial axes: the blocks are counted from the first
    # kept row, so a block's box of each group lies across up to 2 x 2 chunks; still each chunk
    # is read once and the blocks are regular.
    values = np.arange(8 * 16 * 16 * 2, dtype=np.float32).reshape(8, 16, 16, 2)
    crops = [[1, 1], [1, 1]]
    x, store = _counted_zarr_of(values, (1, 4, 4, 2))
    with dask.config.set({"array.chunk-size": "256B"}), ops.scratch(tmp_path):
        y = ops.batch_to_space_nd(x, [2, 2], crops)
    assert all(map(zarr_regular, y.chunks)) and y.chunks[1][0] == y.chunks[1][1], y.chunks
    recipes = [task for key, task in dict(y.__dask_graph__()).items() if key[0] == y.name]
    assert max(len(parts) for task in recipes for _, parts in _boxes(task)) == 4  # a corner of 2 x 2 chunks
    assert_same(y.compute(scheduler="threads"), ops.batch_to_space_nd(values, [2, 2], crops))
    assert len(store.reads) == x.npartitions and set(store.reads.values()) == {1}
    assert not _files(tmp_path)


def _boxes(task) -> list:
    """The ``(shape, parts)`` per group of an output task (``batch_to_space_from_scratch``)."""
    boxes = task.args[2] if hasattr(task, "args") else task[3]
    return getattr(boxes, "value", boxes)


@pytest.mark.parametrize("crop", [0, 1])
def test_a_block_computed_again_after_its_parts_were_taken_reads_them_from_the_source(tmp_path, crop):
    # A block computed again after it took its parts (its worker died before the result was
    # stored), its splits' results still held: the files are gone, and the block reads the
    # parts from the input's source instead (cropped too: parts then lie across chunks).
    values = np.arange(4 * 8 * 8 * 2, dtype=np.float32).reshape(4, 8, 8, 2)
    crops = [[crop, crop], [0, 0]]
    expected = ops.batch_to_space_nd(values, [2, 2], crops)
    x, store = _counted_zarr_of(values, (1, 4, 8, 2))
    with dask.config.set({"array.chunk-size": "1KiB"}), ops.scratch(tmp_path):
        y = ops.batch_to_space_nd(x, [2, 2], crops)
    graph = dict(y.__dask_graph__())
    assert [k for k in graph if "-split-" in str(k[0])]
    assert_same(y.compute(scheduler="sync"), expected)
    assert not _files(tmp_path)
    for key in [k for k in graph if "-split-" in str(k[0])]:
        graph[key] = 4
    store.reads.clear()
    blocks = [[dask.get(graph, (y.name, 0, i, j, 0)) for j in range(y.numblocks[2])] for i in range(y.numblocks[1])]
    assert_same(np.concatenate([np.concatenate(row, axis=2) for row in blocks], axis=1), expected)
    assert store.reads  # from the source, as the split tasks read them
    assert not _files(tmp_path)


def test_a_local_part_is_mapped_not_copied_and_outlives_its_file(tmp_path):
    """The output tasks map local part files (one copy, from the page cache to the block's
    place): the mapping holds the bytes the file was written with, a removed or rewritten file
    leaves it intact, and an empty or missing file reads as it does through ``read``."""
    run = Scratch(str(tmp_path / "run"))
    values = np.arange(1000, dtype=np.float64)
    run.write("part", memoryview(values).cast("B"))
    run.write("empty", b"")
    view = run.read_view("part")
    assert isinstance(view, mmap.mmap)
    part = np.frombuffer(view, dtype=np.float64)
    assert not part.flags.writeable
    run.write("part", memoryview(-values).cast("B"))  # a task run twice replaces its file whole
    run.remove_files(["part"])
    assert_same(part, values)
    assert run.read_view("empty") == run.read("empty") == b""
    with pytest.raises(FileNotFoundError, match=r"a scratch file under .* is missing .*compute it again"):
        run.read_view("part")


def test_a_scratch_store_set_in_one_thread_is_not_seen_by_another(tmp_path):
    # The service builds jobs in threads, each job with its own scratch store: a store set by
    # one job while another builds must not move the other's files into it (with Dask's
    # process-wide config it did, and a plain build took the scratch plan now and then).
    import threading

    values = np.arange(4 * 16 * 8 * 2, dtype=np.float32).reshape(4, 16, 8, 2)
    x, _ = _counted_zarr_of(values, (1, 4, 8, 2))
    entered, built = threading.Event(), threading.Event()

    def job_with_scratch():
        with ops.scratch(tmp_path):
            entered.set()
            built.wait(30)

    thread = threading.Thread(target=job_with_scratch)
    thread.start()
    try:
        assert entered.wait(30)
        with dask.config.set({"array.chunk-size": "1KiB"}):
            plain = ops.batch_to_space_nd(x, [2, 2], [[0, 0], [0, 0]])
    finally:
        built.set()
        thread.join()
    assert not [k for k in dict(plain.__dask_graph__()) if "-split-" in str(k[0])]
    with ops.scratch(tmp_path), dask.config.set({"array.chunk-size": "1KiB"}):
        here = ops.batch_to_space_nd(x, [2, 2], [[0, 0], [0, 0]])
    assert [k for k in dict(here.__dask_graph__()) if "-split-" in str(k[0])]
    assert_same(plain.compute(), ops.batch_to_space_nd(values, [2, 2], [[0, 0], [0, 0]]))
