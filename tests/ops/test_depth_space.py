"""DepthToSpace / SpaceToDepth against the documented worked examples, ONNX's reference
evaluator, the literal index formulas (docs/operators.md), and as Dask graphs against the
NumPy path."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import ops
from tests.helpers import ALL_DTYPES, assert_same, chunkings, compute, dtype_strategy, random_array
from tests.ops import reference

FORMATS = ["NHWC", "NCHW", "NCHW_VECT_C"]
MODES = ["DCR", "CRD"]


# --- The documented worked examples -----------------------------------------------------------


def test_spec_example_single_pixel():
    x = np.array([[[[1, 2, 3, 4]]]])
    assert ops.depth_to_space(x, 2).tolist() == [[[[1], [2]], [[3], [4]]]]


@pytest.mark.smoke
def test_spec_example_two_by_two():
    x = np.arange(1, 17).reshape(1, 2, 2, 4)
    y = ops.depth_to_space(x, 2)
    assert y.shape == (1, 4, 4, 1)
    assert y[0, :, :, 0].tolist() == [[1, 2, 5, 6], [3, 4, 7, 8], [9, 10, 13, 14], [11, 12, 15, 16]]
    assert_same(ops.space_to_depth(y, 2), x)


def test_seed_example_depth_twelve():
    x = np.arange(1, 13).reshape(1, 1, 1, 12)
    assert ops.depth_to_space(x, 2).tolist() == [[[[1, 2, 3], [4, 5, 6]], [[7, 8, 9], [10, 11, 12]]]]


@pytest.mark.smoke
def test_crd_is_pixel_shuffle():
    # PyTorch pixel_shuffle (CRD), NCHW: channel c*4 + i*2 + j goes to (c, 2h+i, 2w+j).
    x = np.arange(8).reshape(1, 8, 1, 1)
    y = ops.depth_to_space(x, 2, data_format="NCHW", mode="CRD")
    assert y.tolist() == [[[[0, 1], [2, 3]], [[4, 5], [6, 7]]]]


# --- ONNX reference evaluator (external oracle, NCHW) -----------------------------------------


def _onnx_run(op_type: str, x: np.ndarray, **attributes) -> np.ndarray:
    node = helper.make_node(op_type, ["x"], ["y"], **attributes)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    return ReferenceEvaluator(model).run(None, {"x": x})[0]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("bs", [2, 3])
@pytest.mark.parametrize("data_format", ["NCHW", "NHWC"])
def test_depth_to_space_matches_onnx(mode, bs, data_format):
    rng = np.random.default_rng(bs)
    x_nchw = rng.standard_normal((2, 3 * bs * bs, 4, 5)).astype(np.float32)
    expected = _onnx_run("DepthToSpace", x_nchw, blocksize=bs, mode=mode)
    if data_format == "NCHW":
        assert_same(ops.depth_to_space(x_nchw, bs, data_format="NCHW", mode=mode), expected)
    else:
        y = ops.depth_to_space(np.ascontiguousarray(x_nchw.transpose(0, 2, 3, 1)), bs, mode=mode)
        assert_same(y, np.ascontiguousarray(expected.transpose(0, 2, 3, 1)))


@pytest.mark.parametrize("bs", [2, 3])
def test_space_to_depth_matches_onnx(bs):
    rng = np.random.default_rng(bs)
    x = rng.standard_normal((2, 3, 4 * bs, 2 * bs)).astype(np.float32)
    expected = _onnx_run("SpaceToDepth", x, blocksize=bs)
    assert_same(ops.space_to_depth(x, bs, data_format="NCHW"), expected)


# --- The index formulas, every dtype, format and mode -----------------------------------------


def _depth_input(rng, data_format, n, h, w, c, dtype):
    shape = {"NHWC": (n, h, w, c), "NCHW": (n, c, h, w), "NCHW_VECT_C": (n, c // 4, h, w, 4)}
    return random_array(rng, shape[data_format], dtype)


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("data_format", FORMATS)
def test_depth_to_space_formula_every_dtype(dtype, mode, data_format):
    rng = np.random.default_rng(7)
    bs = 2
    x = _depth_input(rng, data_format, 2, 3, 5, 16, dtype)
    y = ops.depth_to_space(x, bs, data_format=data_format, mode=mode)
    assert_same(y, reference.depth_to_space(x, bs, data_format, mode))
    assert_same(ops.space_to_depth(y, bs, data_format=data_format, mode=mode), x)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("data_format", FORMATS)
def test_space_to_depth_formula(mode, data_format):
    rng = np.random.default_rng(3)
    x = _depth_input(rng, data_format, 2, 6, 9, 8, np.int16)
    assert_same(
        ops.space_to_depth(x, 3, data_format=data_format, mode=mode),
        reference.space_to_depth(x, 3, data_format, mode),
    )


@pytest.mark.parametrize("data_format", FORMATS)
def test_empty_tensors(data_format):
    for n, h, w in [(0, 2, 2), (1, 0, 3), (2, 3, 0)]:
        x = _depth_input(np.random.default_rng(0), data_format, n, h, w, 16, np.float32)
        y = ops.depth_to_space(x, 2, data_format=data_format)
        assert_same(y, reference.depth_to_space(x, 2, data_format, "DCR"))
        assert_same(compute(ops.depth_to_space(da.from_array(x), 2, data_format=data_format)), y)
    x = np.zeros((1, 2, 2, 0), np.float32)
    assert ops.depth_to_space(x, 2).shape == (1, 4, 4, 0)


def test_non_contiguous_and_big_endian_inputs():
    rng = np.random.default_rng(1)
    base = random_array(rng, (2, 4, 6, 8), np.float64)
    strided = base[:, :, ::2, :]
    assert_same(ops.depth_to_space(strided, 2), reference.depth_to_space(strided, 2))
    reversed_ = base[::-1, :, ::-1]
    assert_same(ops.depth_to_space(reversed_, 2), reference.depth_to_space(reversed_, 2))
    swapped = base.astype(">f8")
    assert_same(ops.depth_to_space(swapped, 2), reference.depth_to_space(swapped, 2))


# --- Dask == NumPy byte for byte, and round trips, over random shapes/dtypes/chunkings --------


@st.composite
def depth_cases(draw):
    data_format = draw(st.sampled_from(FORMATS))
    mode = draw(st.sampled_from(MODES))
    bs = draw(st.integers(2, 3))
    n, h, w = draw(st.integers(0, 2)), draw(st.integers(0, 3)), draw(st.integers(0, 3))
    c = bs * bs * draw(st.integers(0, 3)) * (4 if data_format == "NCHW_VECT_C" else 1)
    dtype = draw(dtype_strategy)
    x = _depth_input(np.random.default_rng(draw(st.integers(0, 2**32 - 1))), data_format, n, h, w, c, dtype)
    return x, bs, data_format, mode, draw(chunkings(x.shape))


@given(depth_cases())
def test_depth_to_space_dask_equals_numpy(case):
    x, bs, data_format, mode, chunks = case
    expected = ops.depth_to_space(x, bs, data_format=data_format, mode=mode)
    assert_same(expected, reference.depth_to_space(x, bs, data_format, mode))
    lazy = ops.depth_to_space(da.from_array(x, chunks=chunks), bs, data_format=data_format, mode=mode)
    assert_same(compute(lazy), expected)
    # ... and back again, lazily: SpaceToDepth inverts it on any chunking.
    back = ops.space_to_depth(lazy.rechunk(chunks=lazy.chunks), bs, data_format=data_format, mode=mode)
    assert_same(compute(back), x)


@given(depth_cases(), st.data())
def test_space_to_depth_dask_equals_numpy(case, data):
    x, bs, data_format, mode, _ = case
    y = ops.depth_to_space(x, bs, data_format=data_format, mode=mode)
    chunks = data.draw(chunkings(y.shape))
    expected = ops.space_to_depth(y, bs, data_format=data_format, mode=mode)
    assert_same(expected, x)
    lazy = ops.space_to_depth(da.from_array(y, chunks=chunks), bs, data_format=data_format, mode=mode)
    assert_same(compute(lazy), x)
