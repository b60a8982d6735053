"""AscendDequant against the seed's table, ONNX's DequantizeLinear (where the semantics
coincide: int32 input, zero point 0), and the plain NumPy expression bit for bit; the Dask
row-block plan against the NumPy path; every refusal. Every test runs twice: with the compiled
kernel and with the NumPy path small Dask workers use (ops/_compiled.py)."""

from __future__ import annotations

import dask
import dask.array as da
import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import ops
from ops._compiled import COMPILED_KEY
from ops.dequant import CLASSIC_SCALAR, CLASSIC_VECTOR, POLICY_PAIRS, dequant_chunks
from ops.errors import InvalidArgument
from tests.helpers import assert_same, chunking, compute, random_array
from tests.ops import reference

DTYPES = {"float16": np.dtype(np.float16), "bfloat16": np.dtype(ml_dtypes.bfloat16),
          "float32": np.dtype(np.float32), "uint64": np.dtype(np.uint64)}


@pytest.fixture(autouse=True, params=[True, False], ids=["compiled", "numpy"])
def kernel_path(request):
    with dask.config.set({COMPILED_KEY: request.param}):
        yield request.param


SEED_SRC = np.arange(-16, 16, dtype=np.int32).reshape(4, 8)
SEED_SCALE = np.array([2.2, -2.2, 2.2, -2.2, 2.2, -2.2, 0, 0], np.float32)


@pytest.mark.smoke
def test_seed_table():
    y = ops.ascend_dequant(SEED_SRC, SEED_SCALE, dst_dtype=np.float32, calc_count=6)
    printed = [[-35.2, 33.0, -30.8, 28.6, -26.4, 24.2, -10.0, -9.0],
               [-17.6, 15.4, -13.2, 11.0, -8.8, 6.6, -2.0, -1.0],
               [0.0, -2.2, 4.4, -6.6, 8.8, -11.0, 6.0, 7.0],
               [17.6, -19.8, 22.0, -24.2, 26.4, -28.6, 14.0, 15.0]]
    np.testing.assert_allclose(y, printed, rtol=1e-6)
    assert y[0].tolist()[6:] == [-10.0, -9.0]  # the tail passes through unscaled
    assert y.dtype == np.float32


def test_arithmetic_is_float32():
    # f32(2**24 + 1) rounds to 2**24 before the multiply; a float64 product would not.
    src = np.array([[2**24 + 1]], np.int32)
    y = ops.ascend_dequant(src, 3.0, dst_dtype="float32")
    assert y[0, 0] == 3 * 2**24
    assert np.float32(float(2**24 + 1) * 3.0) != 3 * 2**24


@pytest.mark.smoke
def test_bfloat16_seed_example_shape_and_uint64_scale():
    # The seed's first figure: int32 [4, 8], calc_count 4, bfloat16 out padded to n_dst = 16.
    src = SEED_SRC
    y = ops.ascend_dequant(src, SEED_SCALE, dst_dtype="bfloat16", calc_count=4, align_output=True)
    assert y.shape == (4, 16) and y.dtype == DTYPES["bfloat16"]
    assert (y[:, 8:].astype(np.float32) == 0).all()
    # uint64 scales carry a float32 in the low 32 bits; the high bits are ignored.
    packed = SEED_SCALE.view(np.uint32).astype(np.uint64) | np.uint64(0xDEADBEEF << 32)
    y16 = ops.ascend_dequant(src, packed, dst_dtype="float16", calc_count=6)
    assert_same(y16, (src.astype(np.float32) * np.concatenate([SEED_SCALE[:6], np.ones(2, np.float32)])).astype(np.float16))


def test_single_row_reads_one_row_as_many():
    # As documented: {1, 16, 8} with float dst is computed as {2, 8, 8}: every element is scaled.
    src = np.arange(16, dtype=np.int32)
    scale = np.arange(1, 9, dtype=np.float32)
    single = ops.ascend_dequant(src, scale, dst_dtype="float32", calc_count=8)
    assert single.tolist() == (np.arange(16) * np.tile(np.arange(1, 9), 2)).tolist()  # [n] in, [n] out
    multi = ops.ascend_dequant(src, scale, dst_dtype="float32", calc_count=8, mode="multi_row")
    assert multi.tolist() == (np.arange(8) * np.arange(1, 9)).tolist() + list(range(8, 16))
    # calc_count not a multiple of 32 / sizeof(dst) = 16 for bfloat16: no reinterpretation.
    bf = ops.ascend_dequant(src, scale, dst_dtype="bfloat16", calc_count=8)
    assert bf.astype(np.float32).tolist()[8:] == list(range(8, 16))
    lazy = ops.ascend_dequant(da.from_array(src.reshape(1, 16), chunks=(1, 4)), scale, dst_dtype="float32", calc_count=8)
    assert_same(compute(lazy), single.reshape(1, 16))


# --- ONNX's DequantizeLinear as an external oracle ------------------------------------------


def _onnx_dequantize(x, scale, axis, block_size=0, output=None):
    types = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float16): TensorProto.FLOAT16,
             DTYPES["bfloat16"]: TensorProto.BFLOAT16}
    attributes = {"axis": axis}
    if block_size:
        attributes["block_size"] = block_size
    if output is not None:
        attributes["output_dtype"] = types[np.dtype(output)]
    node = helper.make_node("DequantizeLinear", ["x", "s"], ["y"], **attributes)
    out_type = types[np.dtype(output)] if output is not None else types[scale.dtype]
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info("x", TensorProto.INT32, None),
         helper.make_tensor_value_info("s", types[scale.dtype], None)],
        [helper.make_tensor_value_info("y", out_type, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    return ReferenceEvaluator(model).run(None, {"x": x, "s": scale})[0]


def _scales(rng, shape, dtype):
    return rng.uniform(-4, 4, size=shape).astype(np.float32).astype(dtype)


@pytest.mark.parametrize("scale_name,dst_name", POLICY_PAIRS)
def test_per_token_matches_onnx_per_axis(scale_name, dst_name):
    rng = np.random.default_rng(1)
    src = rng.integers(-2**31, 2**31, size=(7, 64), dtype=np.int32)
    scale = _scales(rng, (7,), DTYPES[scale_name])
    expected = _onnx_dequantize(src, scale, axis=0, output=DTYPES[dst_name])
    assert_same(ops.ascend_dequant(src, scale, dst_dtype=dst_name, policy="per_token"), expected)


@pytest.mark.parametrize("k_dim", [0, 1])
@pytest.mark.parametrize("scale_name,dst_name", POLICY_PAIRS)
def test_per_group_matches_onnx_blocked(k_dim, scale_name, dst_name):
    rng = np.random.default_rng(2)
    src = rng.integers(-10**6, 10**6, size=(70, 96), dtype=np.int32)
    g = 32
    shape = (-(-70 // g), 96) if k_dim == 0 else (70, 96 // g)
    scale = _scales(rng, shape, DTYPES[scale_name])
    expected = _onnx_dequantize(src, scale, axis=k_dim, block_size=g, output=DTYPES[dst_name])
    y = ops.ascend_dequant(src, scale, dst_dtype=dst_name, policy="per_group", group_size=g, k_dim=k_dim)
    assert_same(y, expected)


@pytest.mark.parametrize("dst_name,scale_name", [p for p in CLASSIC_VECTOR if p[1] != "uint64"])
def test_classic_vector_matches_onnx_per_column(dst_name, scale_name):
    rng = np.random.default_rng(3)
    src = rng.integers(-2**20, 2**20, size=(5, 40), dtype=np.int32)
    scale = _scales(rng, (40,), DTYPES[scale_name])
    expected = _onnx_dequantize(src, scale, axis=1, output=DTYPES[dst_name])
    assert_same(ops.ascend_dequant(src, scale, dst_dtype=dst_name, mode="multi_row"), expected)


# --- the plain expression, bit for bit, over every supported combination -----------------------


def _random_scale(rng, shape, name):
    if name == "uint64":
        return rng.integers(0, 2**63, size=shape, dtype=np.uint64) * 2 + 1  # any bits at all
    return random_array(rng, shape, DTYPES[name])  # NaN, inf and subnormal scales included


@pytest.mark.parametrize("dst_name,scale_name", CLASSIC_VECTOR)
def test_classic_vector_every_pair(dst_name, scale_name):
    rng = np.random.default_rng(4)
    src = rng.integers(-2**31, 2**31, size=(9, 24), dtype=np.int32)
    scale = _random_scale(rng, (30,), scale_name)
    for cc in (1, 7, 24):
        expected = reference.dequant(src, scale, DTYPES[dst_name], calc_count=cc)
        assert_same(ops.ascend_dequant(src, scale, dst_dtype=dst_name, calc_count=cc, mode="multi_row"), expected)
        lazy = ops.ascend_dequant(da.from_array(src, chunks=(4, 5)), scale, dst_dtype=dst_name, calc_count=cc, mode="multi_row")
        assert_same(compute(lazy), expected)


@pytest.mark.parametrize("dst_name,scale_name", CLASSIC_SCALAR)
def test_classic_scalar_every_pair(dst_name, scale_name):
    rng = np.random.default_rng(5)
    src = rng.integers(-2**31, 2**31, size=(3, 16), dtype=np.int32)
    scale = _random_scale(rng, (), scale_name)
    expected = reference.dequant(src, scale, DTYPES[dst_name], calc_count=5)
    assert_same(ops.ascend_dequant(src, scale, dst_dtype=dst_name, calc_count=5), expected)
    if scale_name == "float32":  # a Python float is a float32 scale
        py = ops.ascend_dequant(src, 2.2, dst_dtype=dst_name, calc_count=5)
        assert_same(py, reference.dequant(src, np.float32(2.2), DTYPES[dst_name], calc_count=5))


@st.composite
def policy_cases(draw):
    policy = draw(st.sampled_from(["per_token", "per_group"]))
    src_name = draw(st.sampled_from(["int32", "float32"]))
    scale_name, dst_name = draw(st.sampled_from(POLICY_PAIRS))
    m, n = draw(st.integers(0, 70)), 8 * draw(st.integers(0, 9))
    k_dim = draw(st.sampled_from([0, 1]))
    g = 32 * draw(st.integers(1, 2))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    src = random_array(rng, (m, n), np.int32 if src_name == "int32" else np.float32)
    if policy == "per_token":
        shape = draw(st.sampled_from([(m,), (m, 1)]))
    else:
        shape = (-(-m // g), n) if k_dim == 0 else (m, -(-n // g))
    scale = _random_scale(rng, shape, scale_name)
    rows = draw(st.integers(0, m)) if n else 0
    cc = draw(st.sampled_from([None, rows * n]))
    kwargs = dict(dst_dtype=dst_name, policy=policy, calc_count=cc)
    if policy == "per_group":
        kwargs.update(group_size=g, k_dim=k_dim)
    return src, scale, kwargs, draw(chunking(m)), draw(st.booleans())


@given(policy_cases())
def test_policies_equal_plain_expression_and_dask(case):
    src, scale, kwargs, row_chunks, align = case
    expected = reference.dequant(src, scale, DTYPES[kwargs["dst_dtype"]], kwargs["calc_count"],
                                 kwargs["policy"], kwargs.get("group_size"), kwargs.get("k_dim", 1))
    y = ops.ascend_dequant(src, scale, align_output=align, **kwargs)
    n = src.shape[1]
    assert_same(y[:, :n], expected)
    assert (y[:, n:].astype(np.float32) == 0).all()
    lazy_src = da.from_array(src, chunks=(row_chunks, (max(n // 2, 1),) * 2 if n else (0,)))
    lazy_scale = da.from_array(scale, chunks=1) if scale.size else scale
    assert_same(compute(ops.ascend_dequant(lazy_src, lazy_scale, align_output=align, **kwargs)), y)


def test_big_endian_inputs():
    src = SEED_SRC.astype(">i4")
    scale = SEED_SCALE.astype(">f4")
    expected = ops.ascend_dequant(SEED_SRC, SEED_SCALE, dst_dtype="float32", calc_count=6)
    assert_same(ops.ascend_dequant(src, scale, dst_dtype="float32", calc_count=6), expected)
    lazy = ops.ascend_dequant(da.from_array(src, chunks=2), scale, dst_dtype="float32", calc_count=6)
    assert_same(compute(lazy), expected)


def test_align_output_layout():
    src = np.ones((2, 8), np.int32)
    assert ops.ascend_dequant(src, 1.0, dst_dtype="bfloat16", align_output=True).shape == (2, 16)
    assert ops.ascend_dequant(src, 1.0, dst_dtype="float32", align_output=True).shape == (2, 8)
    assert ops.ascend_dequant(np.ones((2, 24), np.int32), 1.0, dst_dtype="bfloat16", align_output=True).shape == (2, 32)
    assert ops.ascend_dequant(np.ones((1, 3), np.int32), 1.0, dst_dtype="float32").shape == (1, 3)
    with pytest.raises(InvalidArgument, match=r"align_output=True needs 32-byte aligned src rows \(n\*4 % 32 == 0\), got n = 12"):
        ops.ascend_dequant(np.ones((2, 12), np.int32), 1.0, dst_dtype="float32", align_output=True)


# --- plan and graph -------------------------------------------------------------------------


def test_row_block_plan():
    assert dequant_chunks((5, 5, 5), 0) == ((5, 5, 5), None)  # classic: one scale row
    assert dequant_chunks((5, 5, 5), 1) == ((5, 5, 5), (5, 5, 5))  # a scale row per row
    # Row groups of 32: 40 -> 32; 80 is as near 64 as 96, and ties go up.
    assert dequant_chunks((40, 40, 50), 32) == ((32, 64, 34), (1, 2, 2))
    # regular row chunks stay regular: 40 rows -> 32
    assert dequant_chunks((40, 40, 20), 32) == ((32, 32, 32, 4), (1, 1, 1, 1))


def test_dask_blocks_are_row_blocks():
    src = da.ones((100, 64), chunks=(10, 16), dtype=np.int32)
    y = ops.ascend_dequant(src, np.ones(64, np.float32), dst_dtype="float32", mode="multi_row")
    assert y.chunks == ((10,) * 10, (64,))
    scale = da.ones((100, 2), chunks=(25, 1), dtype=np.float16)
    y = ops.ascend_dequant(src, scale, dst_dtype="float16", policy="per_group", group_size=32)
    assert y.chunks == ((10,) * 10, (64,))
    assert_same(y.compute(), np.ones((100, 64), np.float16))
    y0 = ops.ascend_dequant(src, np.ones((4, 64), np.float32), dst_dtype="float32", policy="per_group", group_size=32, k_dim=0)
    assert all(c % 32 == 0 for c in y0.chunks[0][:-1])


def test_building_computes_nothing():
    def explode(*args, **kwargs):
        raise AssertionError("computed")

    src = da.ones((64, 32), chunks=8, dtype=np.int32)
    with dask.config.set(scheduler=explode):
        ops.ascend_dequant(src, da.ones(32, chunks=8, dtype=np.float32), dst_dtype="float32")
        ops.ascend_dequant(src, da.ones(64, chunks=8, dtype=np.float32), dst_dtype="float16", policy="per_token")
        ops.ascend_dequant(src[:1], da.ones(32, chunks=8, dtype=np.float32), dst_dtype="float32", calc_count=8)


# --- refusals --------------------------------------------------------------------------------


S = np.zeros((2, 8), np.int32)


@pytest.mark.parametrize(
    "args,kwargs,match",
    [
        ((S, np.ones(8, np.float32)), dict(dst_dtype="float16"),
         r"with a vector deq_scale: \(dst_dtype, scale dtype\) = \(float16, float32\) is not supported; supported: \(float16, uint64\); \(float32, float32\); \(float32, bfloat16\); \(bfloat16, bfloat16\); \(bfloat16, float32\)"),
        ((S, np.float16(1)), dict(dst_dtype="float32"),
         r"with a scalar deq_scale: \(dst_dtype, scale dtype\) = \(float32, float16\) is not supported; supported: \(bfloat16, bfloat16\)"),
        ((S, np.uint64(1)), dict(dst_dtype="float16"), r"with a scalar deq_scale: .* = \(float16, uint64\) is not supported"),
        ((S, np.ones(8, np.float64)), dict(dst_dtype="float32"), r"\(float32, float64\) is not supported"),
        ((S, 1.0), dict(dst_dtype="float64"), r"dst_dtype must be one of float16, bfloat16 or float32, got 'float64'"),
        ((S, 1.0), dict(dst_dtype=np.int8), r"dst_dtype must be one of float16, bfloat16 or float32"),
        ((S.astype(np.float32), 1.0), dict(dst_dtype="float32"), r"src dtype must be int32 without a policy, got float32"),
        ((S.astype(np.int64), np.ones(2, np.float32)), dict(dst_dtype="float32", policy="per_token"), r"src dtype must be int32 or float32 with policy='per_token', got int64"),
        ((S, np.ones(8, np.float32)), dict(dst_dtype="float32", calc_count=0), r"calc_count must be in 1..n = 8, got 0"),
        ((S, np.ones(8, np.float32)), dict(dst_dtype="float32", calc_count=9), r"calc_count must be in 1..n = 8, got 9"),
        ((S, np.ones(5, np.float32)), dict(dst_dtype="float32", calc_count=6), r"deq_scale must have at least calc_count = 6 elements, got 5"),
        ((S, np.ones(5, np.float32)), dict(dst_dtype="float32"), r"at least calc_count = 8 elements, got 5"),
        ((S, np.ones((2, 8), np.float32)), dict(dst_dtype="float32"), r"deq_scale must be a scalar or a 1-D vector, got shape \[2, 8\]"),
        ((S, 1.0), dict(dst_dtype="float32", calc_count=2.0), r"calc_count must be an integer"),
        ((S, 1.0), dict(dst_dtype="float32", mode="rows"), r"mode must be one of 'single_row' or 'multi_row', got 'rows'"),
        ((S, 1.0), dict(dst_dtype="float32", policy="per_channel"), r"policy must be one of 'per_token' or 'per_group', got 'per_channel'"),
        ((S, np.ones(2, np.float32)), dict(dst_dtype="float16", policy="per_token", calc_count=4), r"calc_count must be a multiple of n = 8 in 0..m\*n = 16 with policy='per_token', got 4"),
        ((S, np.ones(2, np.float32)), dict(dst_dtype="float16", policy="per_token", calc_count=24), r"got 24"),
        ((S, np.ones(3, np.float32)), dict(dst_dtype="float16", policy="per_token"), r"deq_scale must have shape \[2\] or \[2, 1\] for policy='per_token', got \[3\]"),
        ((S, np.ones((2, 1), np.uint64)), dict(dst_dtype="float16", policy="per_token"), r"with policy='per_token': \(src, scale, dst_dtype\) = \(int32, uint64, float16\) is not supported"),
        ((S, np.ones((1, 8), np.float32)), dict(dst_dtype="float32", policy="per_group"), r"group_size is required with policy='per_group'"),
        ((S, np.ones((1, 8), np.float32)), dict(dst_dtype="float32", policy="per_group", group_size=16), r"group_size must be a multiple of 32, got 16"),
        ((S, np.ones((1, 8), np.float32)), dict(dst_dtype="float32", policy="per_group", group_size=0), r"group_size must be >= 1, got 0"),
        ((S, np.ones((1, 8), np.float32)), dict(dst_dtype="float32", policy="per_group", group_size=32, k_dim=2), r"k_dim must be one of 0 or 1, got 2"),
        ((S, np.ones((2, 2), np.float32)), dict(dst_dtype="float32", policy="per_group", group_size=32, k_dim=0), r"deq_scale must have shape \[1, 8\] for policy='per_group', k_dim=0, group_size=32, got \[2, 2\]"),
        ((S, 1.0), dict(dst_dtype="float32", group_size=32), r"group_size applies only to policy='per_group'"),
        ((S, 1.0), dict(dst_dtype="float32", k_dim=0), r"k_dim applies only to policy='per_group'"),
        ((S, 1.0), dict(dst_dtype="float32", align_output=1), r"align_output: Input should be a valid boolean"),
        ((np.zeros((2, 2, 2), np.int32), 1.0), dict(dst_dtype="float32"), r"src must have rank 1 or 2 \(\[n\] or \[m, n\]\), got rank 3"),
        ((np.zeros((2, 8), object), 1.0), dict(dst_dtype="float32"), r"src dtype must be one of"),
        ((S, True), dict(dst_dtype="float32"), r"deq_scale must be a number or an array, got bool True"),
        ((S, "2.0"), dict(dst_dtype="float32"), r"\(float32, <U3\) is not supported"),
    ],
)
def test_refusals(args, kwargs, match):
    with pytest.raises(InvalidArgument, match=match):
        ops.ascend_dequant(*args, **kwargs)


def test_offset_is_not_accepted():
    with pytest.raises(TypeError, match="offset"):
        ops.ascend_dequant(S, 1.0, dst_dtype="float32", offset=np.zeros(8))


# --- 1-D src, packed uint64 scales ------------------------------------------------------------


def _value(y):
    return compute(y) if isinstance(y, da.Array) else y


@pytest.mark.parametrize("backend", ["numpy", "dask"])
@pytest.mark.parametrize("dst_name,scale", [("float32", np.float32(0.75)), ("bfloat16", np.float32(-1.5)),
                                            ("float32", np.linspace(-2, 2, 16, dtype=np.float32))])
def test_one_dim_src_gives_one_dim_result(backend, dst_name, scale):
    src = np.arange(-8, 8, dtype=np.int32)
    expected = (src.astype(np.float32) * scale).astype(DTYPES[dst_name])
    data = src if backend == "numpy" else da.from_array(src, chunks=4)
    y = ops.ascend_dequant(data, scale, dst_dtype=dst_name, mode="multi_row")
    assert y.shape == (16,) and isinstance(y, np.ndarray if backend == "numpy" else da.Array)
    assert_same(_value(y), expected)
    padded = _value(ops.ascend_dequant(data, scale, dst_dtype=dst_name, align_output=True))
    assert padded.ndim == 1 and padded.shape[0] % (32 // DTYPES[dst_name].itemsize) == 0


BITS32 = st.integers(0, 2**32 - 1)
OFFSETS = st.integers(-256, 255)


@given(bits=st.lists(BITS32, min_size=1, max_size=8), offset=st.lists(OFFSETS, min_size=1, max_size=1))
def test_pack_unpack_round_trip(bits, offset):
    scale = np.array(bits, np.uint32).view(np.float32)  # every float32, NaN payloads included
    packed = ops.pack_deq_scale(scale, offset=offset[0])
    assert packed.dtype == np.uint64 and packed.shape == scale.shape
    # The layout: low 32 bits the scale, bit 46 the flag, bits 37..45 the offset (9-bit).
    assert ((packed & np.uint64(0xFFFFFFFF)).astype(np.uint32) == np.array(bits, np.uint32)).all()
    assert (packed >> np.uint64(46) & np.uint64(1) == 1).all()
    assert ((packed >> np.uint64(37)) & np.uint64(0x1FF) == np.uint64(offset[0] % 512)).all()
    back, off = ops.unpack_deq_scale(packed)
    assert_same(back, scale)
    assert (off == offset[0]).all() and off.dtype == np.int16
    assert_same(ops.pack_deq_scale(back, offset=off), packed)


@given(words=st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=8))
def test_unpack_reads_only_its_fields(words):
    packed = np.array(words, np.uint64)
    scale, offset = ops.unpack_deq_scale(packed)
    canonical = (packed & np.uint64(0x3FE0FFFFFFFF)) | np.uint64(1 << 46)
    assert_same(ops.pack_deq_scale(scale, offset=offset), canonical)


def test_pack_rounds_and_clips_offsets_like_the_device():
    _, offset = ops.unpack_deq_scale(ops.pack_deq_scale(np.ones(6), offset=[0.5, -0.5, 1.49, 300, -300.7, 2.5]))
    assert offset.tolist() == [1, -1, 1, 255, -256, 3]  # half away from zero, then -256..255
    assert ops.unpack_deq_scale(ops.pack_deq_scale(2.0))[1].tolist() == 0
    fp19 = ops.pack_deq_scale(np.float32(1 / 3), fp19=True)
    assert int(fp19) & 0xFFFFFFFF == int(np.float32(1 / 3).view(np.uint32)) & 0xFFFFE000


@pytest.mark.parametrize("backend", ["numpy", "dask"])
def test_float16_dequant_with_packed_float_scale(backend):
    rng = np.random.default_rng(9)
    src = rng.integers(-2**20, 2**20, size=(6, 40), dtype=np.int32)
    scale = rng.uniform(-1e-3, 1e-3, size=40).astype(np.float32)
    packed = ops.pack_deq_scale(scale if backend == "numpy" else da.from_array(scale, chunks=8))
    if backend == "dask":
        src = da.from_array(src, chunks=(2, 40))
    y = ops.ascend_dequant(src, packed, dst_dtype="float16")
    assert_same(_value(y), (_value(src).astype(np.float32) * scale).astype(np.float16))


def test_float_scale_error_shows_the_fix_and_the_fix_works():
    src = np.arange(16, dtype=np.int32).reshape(2, 8)
    scale = np.linspace(0.5, 4, 8, dtype=np.float32)
    with pytest.raises(InvalidArgument, match=r"deq_scale=ops\.pack_deq_scale\(scale\)$"):
        ops.ascend_dequant(src, scale, dst_dtype="float16")
    fixed = ops.ascend_dequant(src, ops.pack_deq_scale(scale), dst_dtype="float16")
    assert_same(fixed, (src.astype(np.float32) * scale).astype(np.float16))
    with pytest.raises(InvalidArgument, match=r"deq_scale=ops\.pack_deq_scale\(np\.full\(8, scale\)\)$"):
        ops.ascend_dequant(src, 0.5, dst_dtype="float16")
    with pytest.raises(InvalidArgument, match=r"deq_scale=scale\.astype\(np\.float32\)$"):
        ops.ascend_dequant(src, scale.astype(np.float64), dst_dtype="float32")


@pytest.mark.parametrize("call,match", [
    (lambda: ops.pack_deq_scale(np.array(["a"])), r"scale must hold real numbers .* got dtype <U1"),
    (lambda: ops.pack_deq_scale(np.ones(2, np.complex64)), r"got dtype complex64"),
    (lambda: ops.pack_deq_scale(np.ones(2), offset=True), r"offset must be a number .* got bool True"),
    (lambda: ops.pack_deq_scale(np.ones(2), offset=np.ones(3)), r"offset must broadcast against scale: shapes \[3\] and \[2\]"),
    (lambda: ops.pack_deq_scale(np.ones(2), fp19=1), r"fp19 must be True or False, got 1"),
    (lambda: ops.unpack_deq_scale(np.ones(2, np.float32)), r"packed must hold uint64 values, got dtype float32"),
])
def test_pack_refusals(call, match):
    with pytest.raises(InvalidArgument, match=match):
        call()


def test_nan_times_nan_keeps_the_src_payload_quieted():
    """x86 (and so NumPy's multiply) returns the first operand's NaN; both paths take src's."""
    src_bits = np.array([[0x7F800001, 0xFFC00123], [0x7FA00000, 0x7FC00000]], np.uint32)
    scale_bits = np.array([0x7F812345, 0xFFFFFFFF], np.uint32)
    y = ops.ascend_dequant(src_bits.view(np.float32), scale_bits.view(np.float32),
                           dst_dtype="float32", policy="per_token")
    assert y.view(np.uint32).tolist() == (src_bits | np.uint32(0x400000)).tolist()
