"""GatherNd against the documented examples, ONNX's reference evaluator and a tuple-at-a-time
reference; the three Dask plans against the NumPy path; index errors; sparse graphs."""

from __future__ import annotations

import collections
import math

import dask
import dask.array as da
import numpy as np
import pytest
import zarr
from dask.core import get_dependencies
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import ops
from ops.errors import InvalidArgument
from tests.helpers import ALL_DTYPES, assert_same, chunkings, compute, dtype_strategy, random_array
from tests.ops import reference

P2 = np.array([[0, 1], [2, 3]])
P3 = np.array([[[0, 1], [2, 3]], [[4, 5], [6, 7]]])


# --- The documented examples ------------------------------------------------------------------


@pytest.mark.parametrize(
    "params,indices,batch_dims,expected",
    [
        (P2, [[0, 0], [1, 1]], 0, [0, 3]),
        (P2, [[1], [0]], 0, [[2, 3], [0, 1]]),
        (P3, [[0, 1], [1, 0]], 0, [[2, 3], [4, 5]]),
        (P3, [[[0, 1]], [[1, 0]]], 0, [[[2, 3]], [[4, 5]]]),
        (P3, [[1], [0]], 1, [[2, 3], [4, 5]]),  # ONNX's batch_dims=1 example
    ],
)
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.smoke
def test_spec_examples(params, indices, batch_dims, expected, index_dtype):
    indices = np.array(indices, index_dtype)
    assert ops.gather_nd(params, indices, batch_dims=batch_dims).tolist() == expected
    lazy_params = da.from_array(params, chunks=1)
    assert compute(ops.gather_nd(lazy_params, indices, batch_dims=batch_dims)).tolist() == expected
    lazy_indices = da.from_array(indices, chunks=1)
    assert compute(ops.gather_nd(lazy_params, lazy_indices, batch_dims=batch_dims)).tolist() == expected


def test_big_endian_indices_and_params():
    params = P3.astype(">i8")
    assert ops.gather_nd(params, np.array([[0, 1], [1, 0]], ">i4")).tolist() == [[2, 3], [4, 5]]


@pytest.mark.smoke
def test_negative_indices_count_from_the_end():
    assert ops.gather_nd(P2, np.array([[-1, -2], [-2, -1]])).tolist() == [2, 1]
    assert ops.gather_nd(P3, np.array([[-1]]), batch_dims=0).tolist() == [[[4, 5], [6, 7]]]


# --- ONNX's reference evaluator -------------------------------------------------------------


def _onnx_gather_nd(params, indices, batch_dims):
    node = helper.make_node("GatherND", ["data", "indices"], ["y"], batch_dims=batch_dims)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info("data", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("indices", TensorProto.INT64, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    return ReferenceEvaluator(model).run(None, {"data": params, "indices": indices})[0]


@pytest.mark.parametrize(
    "params_shape,lead,c,batch_dims",
    [((5, 4, 3), (6,), 1, 0), ((5, 4, 3), (2, 3), 2, 0), ((5, 4, 3), (7,), 3, 0),
     ((3, 4, 5), (3, 2), 1, 1), ((3, 4, 5, 2), (3, 6), 2, 1), ((2, 3, 4, 5), (2, 3, 4), 1, 2)],
)
def test_matches_onnx(params_shape, lead, c, batch_dims):
    rng = np.random.default_rng(len(lead) + c)
    params = rng.standard_normal(params_shape).astype(np.float32)
    dims = params_shape[batch_dims : batch_dims + c]
    indices = np.stack([rng.integers(-s, s, size=lead) for s in dims], axis=-1).astype(np.int64)
    expected = _onnx_gather_nd(params, indices, batch_dims)
    assert_same(ops.gather_nd(params, indices, batch_dims=batch_dims), expected)
    lazy = da.from_array(params, chunks=2)
    assert_same(compute(ops.gather_nd(lazy, indices, batch_dims=batch_dims)), expected)


# --- every dtype, and the Dask plans against NumPy --------------------------------------------


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
def test_every_dtype(dtype):
    rng = np.random.default_rng(3)
    params = random_array(rng, (4, 3, 2), dtype)
    indices = rng.integers(-3, 3, size=(5, 2)).astype(np.int32)
    expected = reference.gather_nd(params, indices)
    assert_same(ops.gather_nd(params, indices), expected)
    assert_same(compute(ops.gather_nd(da.from_array(params, chunks=(3, 2, 1)), indices)), expected)


@st.composite
def gather_cases(draw):
    r = draw(st.integers(1, 4))
    params_shape = tuple(draw(st.lists(st.integers(1, 4), min_size=r, max_size=r)))
    b = draw(st.integers(0, r - 1))
    c = draw(st.integers(1, r - b))
    extra = draw(st.lists(st.integers(0, 3), max_size=2))
    lead = params_shape[:b] + tuple(extra)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    dims = params_shape[b : b + c]
    negative = draw(st.booleans())
    low = (lambda s: -s) if negative else (lambda s: 0)
    indices = np.stack([rng.integers(low(s), s, size=lead) for s in dims], axis=-1)
    indices = indices.astype(draw(st.sampled_from([np.int32, np.int64])))
    params = random_array(rng, params_shape, draw(dtype_strategy))
    return params, indices, b, negative, draw(chunkings(params.shape)), draw(chunkings(indices.shape))


@pytest.fixture(scope="module")
def scratch_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("scratch")


def _files(root) -> list:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


@given(case=gather_cases())
def test_dask_plans_equal_numpy(scratch_dir, case):
    params, indices, b, negative, params_chunks, indices_chunks = case
    kwargs = dict(batch_dims=b, negative_index_support=negative)
    expected = ops.gather_nd(params, indices, **kwargs)
    assert_same(expected, reference.gather_nd(params, indices, b))
    lazy_params = da.from_array(params, chunks=params_chunks)
    lazy_indices = da.from_array(indices, chunks=indices_chunks)
    assert_same(compute(ops.gather_nd(lazy_params, indices, **kwargs)), expected)  # in memory
    with dask.config.set(scheduler="processes"):  # concrete, bucketed (built only, run below)
        bucketed = ops.gather_nd(lazy_params, indices, **kwargs)
    assert_same(compute(bucketed), expected)
    assert_same(compute(ops.gather_nd(lazy_params, lazy_indices, **kwargs)), expected)  # broadcast
    assert_same(compute(ops.gather_nd(params, lazy_indices, **kwargs)), expected)
    with dask.config.set({"array.chunk-size": "1B"}):  # in memory: gathered from the whole array
        assert_same(compute(ops.gather_nd(lazy_params, lazy_indices, **kwargs)), expected)
    with dask.config.set({"array.chunk-size": "1B", "scheduler": "processes"}):  # the exchange (no scratch)
        exchanged = ops.gather_nd(lazy_params, lazy_indices, **kwargs)
    assert_same(compute(exchanged), expected)
    with dask.config.set({"array.chunk-size": "1B", "chunked-tensor-ops.scratch": str(scratch_dir)}):
        assert_same(compute(ops.gather_nd(lazy_params, lazy_indices, **kwargs)), expected)  # scratch plan
    # A budget of 4 blocks: params blocks served in groups of 2 (when params has more than one).
    budget = 4 * max(1, math.prod(lazy_params.chunksize) * params.dtype.itemsize)
    with dask.config.set({"array.chunk-size": f"{budget}B", "chunked-tensor-ops.scratch": str(scratch_dir)}):
        assert_same(compute(ops.gather_nd(lazy_params, lazy_indices, **kwargs)), expected)
    assert _files(scratch_dir) == []  # the last output block removed the run's files


def test_empty_indices_and_empty_slices():
    assert ops.gather_nd(P3, np.zeros((0, 2), np.int64)).shape == (0, 2)
    assert ops.gather_nd(np.zeros((0, 3)), np.zeros((0, 1), np.int32)).shape == (0, 3)
    lazy = da.from_array(P3, chunks=1)
    assert compute(ops.gather_nd(lazy, np.zeros((2, 0, 1), np.int64))).shape == (2, 0, 2, 2)
    assert compute(ops.gather_nd(lazy, da.zeros((0, 2), dtype=np.int64))).shape == (0, 2)
    assert ops.gather_nd(np.zeros((3, 0)), np.array([[1], [2]])).shape == (2, 0)


# --- index errors --------------------------------------------------------------------------


@pytest.mark.parametrize("lazy", ["numpy", "concrete", "broadcast", "shuffle", "scratch"])
def test_first_bad_index_is_named(lazy, tmp_path):
    params = np.arange(5 * 5).reshape(5, 5)
    indices = np.array([[0, 0], [1, 2], [4, 1], [3, 7], [9, 9]], np.int64)

    def run(p, i):
        if lazy == "numpy":
            return ops.gather_nd(p, i)
        if lazy == "concrete":  # checked while building the graph
            return ops.gather_nd(da.from_array(p, chunks=2), i).compute()
        config = {"array.chunk-size": "128MiB" if lazy == "broadcast" else "1B"}
        if lazy == "scratch":
            config["chunked-tensor-ops.scratch"] = str(tmp_path)
        with dask.config.set(config):
            return ops.gather_nd(da.from_array(p, chunks=2), da.from_array(i, chunks=(5, 2))).compute()

    with pytest.raises(IndexError, match=r"^indices\[3, 1\] = 7 is out of range for dimension 1 of size 5 \(allowed -5..4\)$"):
        run(params, indices)
    negative = np.array([[0, 0], [0, -1]])
    assert run(params, negative).tolist() == [0, 4]
    with pytest.raises(IndexError, match=r"indices\[0, 0\] = -6 is out of range for dimension 0 of size 5"):
        run(params, np.array([[-6, 0]]))


def test_lazy_index_errors_name_the_global_position():
    params = da.from_array(np.arange(10), chunks=5)
    indices = da.from_array(np.array([[1], [2], [3], [4], [10], [5]]), chunks=2)
    lazy = ops.gather_nd(params, indices)  # building checks nothing
    with pytest.raises(IndexError, match=r"indices\[4, 0\] = 10 is out of range for dimension 0 of size 10"):
        lazy.compute()


def test_negative_indices_refused_without_support():
    with pytest.raises(IndexError, match=r"indices\[1, 0\] = -1 is out of range for dimension 0 of size 2 \(allowed 0..1, negative_index_support=False\)"):
        ops.gather_nd(P2, np.array([[0, 0], [-1, 0]]), negative_index_support=False)


def test_batch_dims_error_names_the_params_dimension():
    with pytest.raises(IndexError, match=r"indices\[1, 0\] = 2 is out of range for dimension 1 of size 2"):
        ops.gather_nd(P3, np.array([[1], [2]]), batch_dims=1)


def test_indices_into_an_empty_dimension():
    with pytest.raises(IndexError, match=r"dimension 1 of size 0 \(allowed none: the dimension is empty\)"):
        ops.gather_nd(np.zeros((2, 0, 3)), np.array([[1, 0]]))
    with pytest.raises(IndexError, match=r"dimension 0 of size 0"):
        ops.gather_nd(da.zeros((0, 3), chunks=1), np.array([[0]]))


# --- bad arguments -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "params,indices,kwargs,match",
    [
        (P2, np.array([[0.0, 1.0]]), {}, r"indices dtype must be int32 or int64, got float64"),
        (P2, np.array([[0, 1]], np.int16), {}, r"indices dtype must be int32 or int64, got int16"),
        (P2, np.array([[0, 1]], np.uint64), {}, r"got uint64"),
        (P2, np.array([[True, False]]), {}, r"got bool"),
        (P2, np.zeros((2, 0), np.int64), {}, r"indices.shape\[-1\] \(the index tuple length\) must be in 1..rank\(params\) - batch_dims = 2, got 0"),
        (P2, np.zeros((2, 3), np.int64), {}, r"must be in 1..rank\(params\) - batch_dims = 2, got 3"),
        (P3, np.zeros((2, 3), np.int64), {"batch_dims": 1}, r"must be in 1..rank\(params\) - batch_dims = 2, got 3"),
        (P3, np.zeros((2, 1), np.int64), {"batch_dims": 2}, r"batch_dims must be < min\(rank\(indices\), rank\(params\)\) = 2, got 2"),
        (P3, np.zeros((3, 1), np.int64), {"batch_dims": 1}, r"the first batch_dims = 1 dims of params and indices must be equal, got \[2\] and \[3\]"),
        (P3, np.zeros((2, 1), np.int64), {"batch_dims": -1}, r"batch_dims must be >= 0, got -1"),
        (P3, np.zeros((2, 1), np.int64), {"batch_dims": 1.0}, r"batch_dims must be an integer, got float"),
        (P3, np.zeros((2, 1), np.int64), {"negative_index_support": 1}, r"negative_index_support: Input should be a valid boolean, got 1"),
        (np.array(5), np.zeros((1,), np.int64), {}, r"params must have rank >= 1, got rank 0"),
        (P2, np.array(0, np.int64), {}, r"indices must have rank >= 1, got rank 0"),
        (np.array([["a", "b"]]), np.zeros((1, 1), np.int64), {}, r"params dtype must be one of"),
        (np.array([[object()]]), np.zeros((1, 1), np.int64), {}, r"params dtype must be one of"),
    ],
)
def test_bad_arguments(params, indices, kwargs, match):
    with pytest.raises(InvalidArgument, match=match):
        ops.gather_nd(params, indices, **kwargs)


# --- graphs -------------------------------------------------------------------------------


def _params_blocks_read(y, params_name):
    graph = dict(y.__dask_graph__())
    needed, stack, seen = set(), [k for k in _flat(y.__dask_keys__())], set()
    while stack:
        key = stack.pop()
        if key in seen:
            continue
        seen.add(key)
        for dep in get_dependencies(graph, key):
            if isinstance(dep, tuple) and dep[0] == params_name:
                needed.add(dep)
            else:
                stack.append(dep)
    return needed


def _flat(keys):
    for k in keys:
        if isinstance(k, list):
            yield from _flat(k)
        else:
            yield k


def test_in_memory_params_are_gathered_from_their_array_in_one_task_per_block():
    # da.from_array's blocks are views of one copy of the array: on threads each output block
    # takes its rows from that copy, reading no block; the chunks are the bucketed plan's.
    rng = np.random.default_rng(5)
    values = rng.standard_normal((6, 50, 7)).astype(np.float32)
    params = da.from_array(values, chunks=(4, 9, 3))
    indices = np.stack([rng.integers(-6, 6, (40, 30)), rng.integers(0, 50, (40, 30))], axis=-1)
    with dask.config.set({"array.chunk-size": "2KiB"}):  # 2 rows of 30 x 7 per block: 20 x 3 blocks
        y = ops.gather_nd(params, indices)
        with dask.config.set(scheduler="processes"):
            bucketed = ops.gather_nd(params, indices)
    assert y.chunks == bucketed.chunks and y.npartitions == 20 * 3
    assert not y.__dask_graph__().layers[y.name].is_materialized()  # tasks made when run
    assert _params_blocks_read(y, params.name) == set()
    assert len(y.__dask_graph__()) == y.npartitions + 1  # and the array, once
    expected = reference.gather_nd(values, indices)
    assert_same(compute(y), expected)
    assert_same(y.compute(scheduler="threads"), expected)


def test_in_memory_plan_needs_one_array_and_a_scheduler_sharing_its_memory():
    from ops.gather_nd import in_memory

    values = np.arange(48.0).reshape(12, 4)
    one = da.from_array(values, chunks=(5, 3))
    assert in_memory.whole_array(one) is not None
    assert in_memory.whole_array(da.from_array(values, chunks=-1)) is not None
    persisted = (one + 1).persist(scheduler="sync")  # blocks are arrays of their own
    fortran = np.asfortranarray(values)
    by_hand = da.Array({("f", 0, 0): fortran[:6], ("f", 1, 0): fortran[6:]}, "f", ((6, 6), (4,)), fortran.dtype)
    part = da.Array({("p", 0, 0): values[:6], ("p", 1, 0): values[6:11]}, "p", ((6, 5), (4,)), values.dtype)
    swapped = da.Array({("s", 0, 0): values[6:], ("s", 1, 0): values[:6]}, "s", ((6, 6), (4,)), values.dtype)
    for params in (persisted, by_hand, part, swapped, one * 2, da.ones((12, 4), chunks=6)):
        assert in_memory.whole_array(params) is None
    index = np.array([[11], [0], [5]])
    for scheduler, plan in (("threads", "in-memory"), ("sync", "in-memory"), ("processes", "bucketed")):
        with dask.config.set(scheduler=scheduler):
            y = ops.gather_nd(one, index)
        assert (_params_blocks_read(y, one.name) == set()) == (plan == "in-memory"), scheduler
        assert_same(compute(y), values[[11, 0, 5]])
    index[...] = 0  # a graph keeps its own rows (one int64 column is a view of the tuples)
    assert_same(compute(y), values[[11, 0, 5]])
    with dask.config.set(scheduler="threads"):
        y = ops.gather_nd(one, index)
    index[...] = 3
    assert_same(compute(y), values[[0, 0, 0]])
    for params in (persisted, part):
        assert _params_blocks_read(ops.gather_nd(params, np.array([[0]])), params.name) != set()


def test_lazy_indices_gather_from_the_whole_in_memory_array_of_any_size(tmp_path):
    rng = np.random.default_rng(6)
    values = rng.standard_normal((300, 5)).astype(np.float32)
    params = da.from_array(values, chunks=(7, 2))
    index = rng.integers(-300, 300, (50, 4, 1))
    indices = da.from_array(index, chunks=(9, 2, 1))
    expected = values[index[..., 0]]
    with dask.config.set({"array.chunk-size": "1KiB"}):  # params (6,000 bytes) past the broadcast size
        y = ops.gather_nd(params, indices)
        with dask.config.set(scheduler="processes"):
            exchanged = ops.gather_nd(params, indices)
        scratched = ops.gather_nd(params, indices, scratch=str(tmp_path))  # a store asked for is used
    assert not y.__dask_graph__().layers[y.name].is_materialized()  # tasks made when run
    assert _params_blocks_read(y, params.name) == set()
    # the indices blocks, a gather per output block (12 x 3), the array
    assert y.npartitions == indices.npartitions * 3
    assert len(dask.optimize(y)[0].__dask_graph__()) == indices.npartitions + y.npartitions + 1
    assert _params_blocks_read(exchanged, params.name) != set() != _params_blocks_read(scratched, params.name)
    for result in (y, exchanged, scratched):
        assert result.chunks == y.chunks
        assert_same(compute(result), expected)
    index[20, 3, 0] = 300
    with dask.config.set({"array.chunk-size": "1KiB"}):
        bad = ops.gather_nd(params, da.from_array(index, chunks=(9, 2, 1)))
    with pytest.raises(IndexError, match=r"^indices\[20, 3, 0\] = 300 is out of range for dimension 0 of size 300"):
        bad.compute()


def test_sparse_gather_reads_only_hit_blocks():
    # A 10^4 x 10^4 lazy table in 10,000 blocks; three points hit two blocks.
    params = da.ones((10_000, 10_000), chunks=(100, 100), dtype=np.float32)
    indices = np.array([[5, 5], [50, 99], [9_999, 0]])
    y = ops.gather_nd(params, indices)
    assert _params_blocks_read(y, params.name) == {(params.name, 0, 0), (params.name, 99, 0)}
    assert y.compute().tolist() == [1.0, 1.0, 1.0]


def test_row_gather_reads_only_hit_row_blocks_and_keeps_column_chunks():
    params = da.from_array(np.arange(60).reshape(20, 3), chunks=(5, 2))
    with dask.config.set(scheduler="processes"):  # the bucketed plan, as on a cluster
        y = ops.gather_nd(params, np.array([[0], [19], [1]]))
    assert y.chunks == ((3,), (2, 1))
    assert {k[1] for k in _params_blocks_read(y, params.name)} == {0, 3}
    assert_same(y.compute(), np.arange(60).reshape(20, 3)[[0, 19, 1]])


def _readers(graph: dict, params_name: str) -> dict:
    """params block key -> the tasks that read it."""
    readers = {}
    for key in graph:
        for dep in get_dependencies(graph, key):
            if isinstance(dep, tuple) and dep[0] == params_name:
                readers.setdefault(dep, []).append(key)
    return readers


def test_shuffle_plan_reads_each_params_block_once():
    params = da.from_array(np.arange(64).reshape(16, 4), chunks=(4, 4))
    indices = da.from_array(np.arange(16).reshape(16, 1)[::-1], chunks=4)
    with dask.config.set({"array.chunk-size": "64B", "scheduler": "processes"}):  # as on a cluster
        y = ops.gather_nd(params, indices)
    graph = dict(y.__dask_graph__())
    readers = _readers(graph, params.name)
    assert len(readers) == params.npartitions
    assert all(len(keys) == 1 for keys in readers.values())  # one serve task per block
    out_keys = set(_flat(y.__dask_keys__()))
    assert not any(k in out_keys for keys in readers.values() for k in keys)
    assert_same(y.compute(), np.arange(64).reshape(16, 4)[::-1])


def test_broadcast_plan_for_small_params():
    params = da.from_array(np.arange(12).reshape(4, 3), chunks=2)
    indices = da.from_array(np.array([[3], [0], [2], [1]]), chunks=(1, 1))
    y = ops.gather_nd(params, indices)
    assert y.chunks == ((1, 1, 1, 1), (3,))
    # params' blocks are views of one array: that array is the one block (no rechunk, no copy)
    assert _params_blocks_read(y, params.name) == set()
    assert len(dask.optimize(y)[0].__dask_graph__()) == 4 + 4 + 1  # indices, gathers, params
    assert_same(y.compute(), np.arange(12).reshape(4, 3)[[3, 0, 2, 1]])


def test_building_computes_nothing():
    def explode(*args, **kwargs):
        raise AssertionError("computed")

    params = da.ones((100, 4), chunks=10)
    indices = da.from_array(np.array([[1], [2]]), chunks=1)
    with dask.config.set(scheduler=explode):
        ops.gather_nd(params, indices)
        ops.gather_nd(params, np.array([[1], [2]]))
        with dask.config.set({"array.chunk-size": "1B"}):
            ops.gather_nd(params, indices)


# --- the scratch plan (lazy indices, large params, a scratch store configured) -------------


def _scratch_gather(params, indices, scratch, chunk_size="1KiB", **kwargs):
    with dask.config.set({"array.chunk-size": chunk_size}):
        return ops.gather_nd(params, indices, scratch=str(scratch), **kwargs)


def test_the_scratch_argument_wins_over_the_context_and_needs_no_config(tmp_path):
    """Concurrent builds with scratches of their own share no global state: the argument is
    used as given; ``ops.scratch`` only supplies a default."""
    params = da.from_array(np.arange(256).reshape(64, 4), chunks=(8, 4))
    indices = da.from_array(np.array([[63], [0], [7]]), chunks=1)
    mine, context = tmp_path / "mine", tmp_path / "context"
    with ops.scratch(context), dask.config.set({"array.chunk-size": "1B"}):
        explicit = ops.gather_nd(params, indices, scratch={"url": str(mine)})
        by_context = ops.gather_nd(params, indices)
    graph = dict(explicit.__dask_graph__())
    runs = {str(a.url) for k in _stage(graph, "split") for a in graph[k][1:] if hasattr(a, "url")}
    assert runs and all(url.startswith(str(mine)) for url in runs), runs
    assert (explicit.compute() == np.arange(256).reshape(64, 4)[[63, 0, 7]]).all()
    assert (by_context.compute() == np.arange(256).reshape(64, 4)[[63, 0, 7]]).all()
    with pytest.raises(ops.InvalidArgument, match=r"scratch must be a path, a URL or a mapping with 'url'"):
        ops.gather_nd(params, indices, scratch=3)


def test_scratch_plan_reads_each_params_block_once_and_leaves_no_files(tmp_path):
    rng = np.random.default_rng(1)
    values = rng.random((64, 8, 4), dtype=np.float32)
    index = rng.integers(-64, 64, size=(300, 1))
    params = da.from_array(values, chunks=(8, 8, 4))
    y = _scratch_gather(params, da.from_array(index, chunks=(50, 1)), tmp_path)
    graph = dict(y.__dask_graph__())
    readers = _readers(graph, params.name)
    assert len(readers) == params.npartitions and all(len(keys) == 1 for keys in readers.values())
    # Outputs never depend on params blocks or on each other's pieces: each is a view of its
    # batch's rows, and a batch depends on the two barriers only.
    for key in _flat(y.__dask_keys__()):
        (batch,) = get_dependencies(graph, key)
        assert str(batch[0]).startswith("gather_nd-assemble-")
        assert len(get_dependencies(graph, batch)) == 2
    for _ in range(2):  # a second compute of the same graph writes and removes its files again
        assert_same(y.compute(), values[index[:, 0]])
        assert _files(tmp_path) == []


@pytest.mark.parametrize("source", ["numpy", "zarr"])
def test_scratch_plan_serves_params_blocks_in_groups(tmp_path, source):
    # Params in 1 KiB blocks and a 4 KiB chunk budget. NumPy-backed params come from their
    # block keys, all in the serve task's memory: groups of 2 blocks (half the budget), 4
    # serve tasks for 8 blocks; with 9 blocks the last group has one. Zarr params are read
    # inside the serve task, one block at a time (no block keys): groups of 16 (four times the
    # budget), 2 serve tasks for 17 or 32 blocks.
    rng = np.random.default_rng(11)
    for rows in ((64, 72) if source == "numpy" else (136, 256)):
        values = rng.random((rows, 8, 4), dtype=np.float32)
        if source == "zarr":
            z = zarr.create_array(zarr.storage.MemoryStore(), shape=values.shape, chunks=(8, 8, 4), dtype=np.float32)
            z[...] = values
            params = da.from_zarr(z)
        else:
            params = da.from_array(values, chunks=(8, 8, 4))
        index = rng.integers(-rows, rows, size=(300, 1))
        y = _scratch_gather(params, da.from_array(index, chunks=(50, 1)), tmp_path, chunk_size="4KiB")
        graph = dict(y.__dask_graph__())
        serves = [k for k in graph if isinstance(k, tuple) and str(k[0]).startswith("gather_nd-serve-")]
        assert len(serves) == -(-params.npartitions // (2 if source == "numpy" else 16))
        if source == "numpy":
            readers = _readers(graph, params.name)
            assert len(readers) == params.npartitions and all(len(keys) == 1 for keys in readers.values())
        else:
            assert not _readers(graph, params.name)  # read inside the serve tasks
        assert_same(y.compute(), values[index[:, 0]])
        assert _files(tmp_path) == []


def _stage(graph, stage):
    return [k for k in graph if isinstance(k, tuple) and str(k[0]).startswith(f"gather_nd-{stage}-")]


@pytest.mark.parametrize("lead,index_chunks", [((300,), (50,)), ((12, 25), (5, 10))])
def test_scratch_plan_batches_indices_blocks(tmp_path, lead, index_chunks):
    # A 16 KiB budget: an output block of 50 rows of 4 float32 is 800 bytes and a batch holds
    # up to a quarter of the budget (5 blocks; 10 with params chunked in two along the row, one
    # batch per slice block). A split task takes one batch here (a run of batches would hold
    # more than half the budget at 128 bytes a tuple). 2-D indices batch their blocks in C order.
    rng = np.random.default_rng(12)
    values = rng.random((64, 8, 4), dtype=np.float32)
    index = np.stack([rng.integers(-64, 64, lead), rng.integers(-8, 8, lead)], axis=-1)
    indices = da.from_array(index, chunks=(*index_chunks, 2))
    for params_chunks, per_batch, slices in (((8, 8, 4), 5, 1), ((8, 8, 2), 10, 2)):
        y = _scratch_gather(da.from_array(values, chunks=params_chunks), indices, tmp_path, chunk_size="16KiB")
        graph = dict(y.__dask_graph__())
        batches = -(-indices.npartitions // per_batch)
        assert batches < indices.npartitions
        assert len(_stage(graph, "split")) == batches
        assert len(_stage(graph, "assemble")) == batches * slices
        assert y.chunks == (*indices.chunks[:-1], (4,) if slices == 1 else (2, 2))
        assert_same(y.compute(), values[index[..., 0], index[..., 1]])
        assert _files(tmp_path) == []


@pytest.mark.parametrize("store", ["local", "object"])
@pytest.mark.parametrize("params_chunks,batches,slices,splits", [((8, 8, 64), 19, 1, 5), ((8, 8, 32), 10, 2, 5)])
def test_scratch_plan_splits_runs_of_batches(tmp_path, params_chunks, batches, slices, splits, store):
    # Rows of 64 float32 (256 bytes) make a split's 128 bytes a tuple small beside them. A
    # 32 KiB budget: a batch holds 8 KiB of rows (8 blocks of 4 tuples), a split task 16 KiB
    # of tuples (128: 4 batches), so 150 indices blocks make 19 batches and 5 split tasks (the
    # last one short). With the rows in two slice blocks (128 bytes each): batches of 16
    # blocks, 2 to a split task, each batch assembled once per slice block. "object": the
    # scratch in fsspec's memory file system, written as an object store is (whole files).
    import fsspec

    rng = np.random.default_rng(13)
    values = rng.random((64, 8, 64), dtype=np.float32)
    index = np.stack([rng.integers(-64, 64, 600), rng.integers(0, 8, 600)], axis=-1)
    indices = da.from_array(index, chunks=(4, 2))
    scratch = tmp_path if store == "local" else f"memory://{tmp_path.name}"
    y = _scratch_gather(da.from_array(values, chunks=params_chunks), indices, scratch, chunk_size="32KiB")
    graph = dict(y.__dask_graph__())
    assert len(_stage(graph, "split")) == splits
    assert len(_stage(graph, "assemble")) == batches * slices
    assert_same(y.compute(), values[index[:, 0], index[:, 1]])
    assert _files(tmp_path) == [] and fsspec.filesystem("memory").find(f"/{tmp_path.name}") == []


def test_scratch_plan_batch_reports_a_bad_index_in_its_own_block(tmp_path):
    # Rows of 128 int32 (512 bytes) and a 64 KiB budget: batches of 3 blocks of 10 tuples, one
    # split task for all 4 blocks. The bad tuple is in the third block: the message gives its
    # position in indices.
    values = np.arange(64 * 128, dtype=np.int32).reshape(64, 128)
    index = np.zeros((40, 1), np.int64)
    index[27, 0] = 64
    y = _scratch_gather(da.from_array(values, chunks=(8, 128)), da.from_array(index, chunks=(10, 1)), tmp_path,
                        chunk_size="64KiB")
    graph = dict(y.__dask_graph__())
    assert len(_stage(graph, "split")) == 1 and len(_stage(graph, "assemble")) == 2
    with pytest.raises(IndexError, match=r"^indices\[27, 0\] = 64 is out of range for dimension 0 of size 64"):
        y.compute()


class _CountingStore(zarr.storage.MemoryStore):
    """A Zarr store that counts the reads of each key."""

    def __init__(self):
        super().__init__()
        self.reads = collections.Counter()

    async def get(self, key, prototype, byte_range=None):
        self.reads[key] += 1
        return await super().get(key, prototype, byte_range)


def _zarr_params(values, chunks):
    store = _CountingStore()
    z = zarr.create_array(store, shape=values.shape, chunks=chunks, dtype=values.dtype)
    z[...] = values
    store.reads.clear()
    return da.from_zarr(z), store


@pytest.mark.parametrize("source", ["numpy", "zarr"])
def test_scratch_plan_serves_a_hot_block_in_batches(tmp_path, source):
    # Every tuple hits params block 0 (a 1 KiB chunk budget): its serve task takes the rows 8
    # at a time (16 bytes each) and reads the requests 16 at a time, not all at once; a block
    # read inside the task is read again for each run of requests, and the blocks nobody
    # asks for are not read.
    values = np.arange(64 * 4, dtype=np.int32).reshape(64, 4)
    index = np.random.default_rng(2).integers(0, 8, size=(500, 1))
    params, store = (da.from_array(values, chunks=(8, 4)), None) if source == "numpy" else _zarr_params(values, (8, 4))
    y = _scratch_gather(params, da.from_array(index, chunks=(70, 1)), tmp_path)
    assert_same(y.compute(), values[index[:, 0]])
    if store is not None:
        assert set(store.reads) == {"c/0/0"} and store.reads["c/0/0"] > 1


def test_scratch_plan_reads_a_stored_params_block_once_and_only_if_hit(tmp_path):
    # A 32 KiB budget: one serve task for all 16 blocks, every request in one run.
    rng = np.random.default_rng(14)
    values = rng.random((128, 8, 4), dtype=np.float32)
    index = rng.integers(0, 24, size=(300, 1))  # blocks 0, 1 and 2 of 16
    params, store = _zarr_params(values, (8, 8, 4))
    y = _scratch_gather(params, da.from_array(index, chunks=(50, 1)), tmp_path, chunk_size="32KiB")
    assert_same(y.compute(), values[index[:, 0]])
    assert store.reads == {"c/0/0/0": 1, "c/1/0/0": 1, "c/2/0/0": 1}


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_scratch_plan_moves_every_dtype_exactly(dtype, tmp_path):
    rng = np.random.default_rng(3)
    values = random_array(rng, (6, 5, 3), dtype)
    index = np.stack([rng.integers(0, 6, 40), rng.integers(-5, 5, 40)], axis=-1)
    y = _scratch_gather(da.from_array(values, chunks=(2, 2, 2)), da.from_array(index, chunks=(7, 2)), tmp_path,
                        chunk_size="1B")
    assert_same(y.compute(), reference.gather_nd(values, index))


def test_scratch_plan_with_batch_dims_and_element_tuples(tmp_path):
    rng = np.random.default_rng(4)
    values = rng.random((3, 10, 6), dtype=np.float32)
    index = np.stack([rng.integers(0, 10, (3, 20)), rng.integers(0, 6, (3, 20))], axis=-1)
    y = _scratch_gather(da.from_array(values, chunks=(1, 4, 3)), da.from_array(index, chunks=(2, 6, 2)), tmp_path,
                        chunk_size="1B", batch_dims=1)
    assert_same(y.compute(), reference.gather_nd(values, index, 1))


def test_scratch_graph_grows_linearly(tmp_path):
    rng = np.random.default_rng(5)

    def tasks(params_chunks, index_chunks):
        params = da.random.random((8 * params_chunks, 8, 4), chunks=(8, 8, 4)).astype(np.float32)
        indices = rng.integers(0, 8 * params_chunks, size=(16 * index_chunks, 1))
        return len(_scratch_gather(params, da.from_array(indices, chunks=(16, 1)), tmp_path).__dask_graph__())

    base, double = tasks(4, 4), tasks(8, 8)
    assert double <= 2 * base, (base, double)


@pytest.mark.parametrize("value,match", [
    (42, r"chunked-tensor-ops.scratch must be a path, a URL or a mapping with 'url'.*got 42$"),
    ({"endpoint": "x", "secret": "hunter2"}, r"got a mapping with keys \['endpoint', 'secret'\]$"),
    ({"url": "/tmp/x", "storage_options": [1]}, r"storage_options must be a mapping, got list"),
])
def test_a_bad_scratch_config_is_named(value, match):
    params = da.ones((64, 4), chunks=8)
    indices = da.from_array(np.array([[1], [2]]), chunks=1)
    with dask.config.set({"array.chunk-size": "1B", "chunked-tensor-ops.scratch": value}):
        with pytest.raises(InvalidArgument, match=match) as info:
            ops.gather_nd(params, indices)
    assert "hunter2" not in str(info.value)


def test_scratch_helper_example_runs_on_its_own():
    import doctest

    test = doctest.DocTestFinder().find(ops.scratch, "ops.scratch", globs={})[0]
    result = doctest.DocTestRunner().run(test)
    assert result.attempted >= 2 and result.failed == 0


def test_scratch_helper_sets_the_config_for_the_build(tmp_path):
    params = da.from_array(np.arange(256).reshape(64, 4), chunks=(8, 4))
    indices = da.from_array(np.array([[63], [0]]), chunks=1)
    with ops.scratch(tmp_path), dask.config.set({"array.chunk-size": "1B"}):
        y = ops.gather_nd(params, indices)
    assert any("gather_nd-split" in str(k) for k in dict(y.__dask_graph__()))
    assert y.compute().tolist() == [[252, 253, 254, 255], [0, 1, 2, 3]]


def test_scratch_files_written_at_offsets_on_a_local_disk(tmp_path):
    """Several files in one byte space, written in place out of order (a write may cross into
    the next file); they appear only when all are complete, and not at all on a failure."""
    from ops._scratch import Scratch

    run = Scratch(str(tmp_path / "run"))
    layout = [("pieces/a", 100, 5), ("pieces/b", 105, 7)]
    with pytest.raises(RuntimeError, match="the task failed"):
        with run.open_write_at(layout) as out:
            out.write_at(100, b"01234")
            raise RuntimeError("the task failed")
    assert _files(tmp_path) == []
    with run.open_write_at(layout) as out:
        out.write_at(103, b"34abc")  # across the two files
        out.write_at(108, b"defg")
        out.write_at(100, b"012")
        partial = _files(tmp_path)
        assert len(partial) == 2 and all(".partial-" in f for f in partial)  # not published yet
    assert run.read("pieces/a") == b"01234" and run.read("pieces/b") == b"abcdefg"
    assert _files(tmp_path) == ["run/pieces/a", "run/pieces/b"]


def test_the_last_blocks_mark_races_the_one_before(tmp_path, monkeypatch):
    """Two output batches finishing together: the second marks, counts both markers and
    removes the run between the first's mark and its count. The first sees a finished run
    (it was a FileNotFoundError, failing a gather that had computed every block)."""
    from fsspec.implementations.local import LocalFileSystem

    from ops._scratch import Scratch

    run = Scratch(str(tmp_path / "run"))
    run.write("pieces/a", b"rows")
    other = Scratch(str(tmp_path / "run"))
    ls = LocalFileSystem.ls
    finished = []

    def the_other_finishes_first(fs, path, *args, **kwargs):
        if not finished:
            finished.append(True)
            assert other.mark_and_count("second", "done") == 2
            other.remove()
        return ls(fs, path, *args, **kwargs)

    monkeypatch.setattr(LocalFileSystem, "ls", the_other_finishes_first)
    assert run.mark_and_count("first", "done") == 0  # below any block count: nothing left to remove
    assert _files(tmp_path) == []


def test_a_marker_being_written_is_not_counted(tmp_path):
    """A count that saw another task's marker while it was still a partial file removed the run
    under that task, whose rename then failed (FileNotFoundError in a finished gather)."""
    from ops._scratch import Scratch

    run = Scratch(str(tmp_path / "run"))
    (tmp_path / "run" / "done").mkdir(parents=True)
    (tmp_path / "run" / "done" / "second.partial-5a9b27f5").write_bytes(b"")
    assert run.mark_and_count("first", "done") == 1
    assert _files(tmp_path) == ["run/done/first", "run/done/second.partial-5a9b27f5"]


def test_a_missing_scratch_file_is_named(tmp_path):
    """A block recomputed after the run removed its files says so, not a TypeError."""
    values = np.arange(64 * 4).reshape(64, 4)
    y = _scratch_gather(da.from_array(values, chunks=(8, 4)), da.from_array(np.array([[5], [60]]), chunks=1),
                        tmp_path, chunk_size="1B")
    graph = dict(y.__dask_graph__())
    first = _stage(graph, "assemble")[0]  # an output block's batch
    dependencies = {k: v for k, v in zip(graph, dask.get(graph, list(graph))) if k != first}
    import shutil

    shutil.rmtree(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"a scratch file under .* is missing .*compute it again"):
        dask.get({**graph, **dependencies}, first)


def test_two_builds_of_one_scratch_gather_have_keys_of_their_own(tmp_path):
    params = da.from_array(np.arange(256).reshape(64, 4), chunks=(8, 4))
    indices = da.from_array(np.array([[63], [0], [7]]), chunks=1)
    first, second = (_scratch_gather(params, indices, tmp_path, chunk_size="1B") for _ in range(2))
    assert not set(dict(first.__dask_graph__())) & set(dict(second.__dask_graph__())) - set(
        dict(params.__dask_graph__())) - set(dict(indices.__dask_graph__()))
    both = dask.compute(first, second)
    assert all(b.tolist() == [[252, 253, 254, 255], [0, 1, 2, 3], [28, 29, 30, 31]] for b in both)
