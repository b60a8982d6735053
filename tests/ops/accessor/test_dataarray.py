"""The xarray ``.ops`` accessor: named dims, every operator against the plain ``ops``
function on NumPy and Dask backends, laziness, coordinates, attrs, round trips, Datasets."""

from __future__ import annotations

import json

import dask
import dask.array as da
import numpy as np
import pytest
import xarray as xr

import ops
from ops.errors import DimensionError
from ops.errors import InvalidArgument
from tests.helpers import assert_same

BACKENDS = ["numpy", "dask"]


def _image(backend="numpy", dims=("time", "y", "x", "band"), shape=(2, 4, 6, 8), dtype=np.int32):
    data = np.arange(np.prod(shape), dtype=dtype).reshape(shape)
    if backend == "dask":
        data = da.from_array(data, chunks=tuple(max(1, n // 2) for n in shape))
    coords = {}
    for dim, n in zip(dims, shape):
        if dim in ("y", "x"):
            coords[dim] = xr.Variable(dim, 1000.0 + 10.0 * np.arange(n) + 5.0, {"units": "m"})
        elif dim == "band":
            coords[dim] = [f"b{k}" for k in range(n)]
        elif dim == "time":
            coords[dim] = np.array(["2026-01-01", "2026-02-01"][:n], dtype="datetime64[ns]")
    arr = xr.DataArray(data, dims=dims, coords=coords, attrs={"units": "K", "source": "synthetic"}, name="t2m")
    return arr.assign_coords(sensor=("time", ["a", "b"][: arr.sizes["time"]])) if "time" in dims else arr


def _explode(*args, **kwargs):
    raise AssertionError("the accessor computed something")


# --- registration and dims ------------------------------------------------------------------


@pytest.mark.smoke
def test_registered_and_stateless():
    arr = _image()
    accessor = arr.ops
    assert isinstance(accessor, ops.accessor.OpsAccessor)
    assert vars(accessor) == {"_obj": arr}
    assert isinstance(xr.Dataset({"a": arr}).ops, ops.accessor.OpsDatasetAccessor)


@pytest.mark.parametrize(
    "dims",
    [("n", "h", "w", "c"), ("batch", "height", "width", "channel"), ("sample", "lat", "lon", "feature"),
     ("time", "row", "col", "bands"), ("N", "Y", "X", "C")],
)
def test_dims_recognised_by_name(dims):
    arr = xr.DataArray(np.arange(2 * 2 * 2 * 4).reshape(2, 2, 2, 4), dims=dims)
    assert_same(arr.ops.depth_to_space(2).values, ops.depth_to_space(arr.values, 2))


@pytest.mark.smoke
def test_explicit_dims_override_names():
    arr = xr.DataArray(np.arange(32).reshape(2, 2, 2, 4), dims=("a", "b", "d", "e"))
    out = arr.ops.depth_to_space(2, dims={"N": "a", "H": "b", "W": "d", "C": "e"})
    assert_same(out.values, ops.depth_to_space(arr.values, 2))
    # "x" would be W by name; the explicit mapping makes it H instead.
    arr = xr.DataArray(np.arange(32).reshape(2, 2, 2, 4), dims=("n", "x", "y", "c"))
    out = arr.ops.depth_to_space(2, dims={"H": "x", "W": "y"})
    assert_same(out.values, ops.depth_to_space(arr.values, 2))


def test_missing_dim_error_lists_what_was_found_and_the_fix():
    arr = xr.DataArray(np.zeros((1, 2, 2, 4)), dims=("time", "y", "x", "q"))
    with pytest.raises(DimensionError) as error:
        arr.ops.depth_to_space(2)
    message = str(error.value)
    assert "needs channel (C)" in message
    assert "('time', 'y', 'x', 'q')" in message and "H='y', W='x', N='time'" in message
    assert ".ops.depth_to_space(..., dims={'H': 'y', 'W': 'x', 'N': 'time', 'C': 'q'})" in message
    # ... and that call works.
    assert arr.ops.depth_to_space(2, dims={"C": "q"}).sizes["y"] == 4


def test_ambiguous_and_unknown_dims():
    arr = xr.DataArray(np.zeros((2, 2, 4, 4)), dims=("y", "lat", "x", "c"))
    with pytest.raises(DimensionError, match=r"dims \['y', 'lat'\] all look like the height dim \(H\); say which, e\.g\. \.ops\.depth_to_space\(\.\.\., dims=\{'H': 'y'\}\)"):
        arr.ops.depth_to_space(2)
    with pytest.raises(DimensionError, match=r"dims\['C'\] = 'band' is not a dim of the array"):
        arr.ops.depth_to_space(2, dims={"C": "band"})
    with pytest.raises(DimensionError, match=r"dims keys must be among N, H, W, C, V, got 'Z'"):
        arr.ops.depth_to_space(2, dims={"Z": "y"})
    extra = xr.DataArray(np.zeros((2, 2, 2, 4, 3)), dims=("n", "y", "x", "c", "level"))
    with pytest.raises(DimensionError, match=r"dims \['level'\] are none of"):
        extra.ops.depth_to_space(2)


# --- every operator against the plain function ----------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_to_space_nhwc_and_nchw(backend, mode):
    nhwc = _image(backend)
    out = nhwc.ops.depth_to_space(2, mode=mode)
    assert out.dims == nhwc.dims
    assert_same(out.values, ops.depth_to_space(nhwc.values, 2, mode=mode))
    nchw = nhwc.transpose("time", "band", "y", "x")
    out = nchw.ops.depth_to_space(2, mode=mode)
    assert out.dims == nchw.dims
    assert_same(out.values, ops.depth_to_space(np.ascontiguousarray(nchw.values), 2, data_format="NCHW", mode=mode))
    # Any other order: the same result, in the caller's order.
    odd = nhwc.transpose("band", "x", "time", "y")
    assert_same(odd.ops.depth_to_space(2, mode=mode).transpose(*nhwc.dims).values, nhwc.ops.depth_to_space(2, mode=mode).values)


@pytest.mark.parametrize("backend", BACKENDS)
def test_space_to_depth_and_vect_c(backend):
    arr = _image(backend)
    out = arr.ops.space_to_depth(2)
    assert_same(out.values, ops.space_to_depth(arr.values, 2))
    vect = xr.DataArray(np.arange(1 * 4 * 2 * 2 * 4).reshape(1, 4, 2, 2, 4), dims=("n", "c", "y", "x", "lane"))
    if backend == "dask":
        vect = vect.chunk({"y": 1})
    out = vect.ops.depth_to_space(2)
    assert out.dims == vect.dims and out.sizes["c"] == 1 and out.sizes["lane"] == 4
    assert_same(out.values, ops.depth_to_space(vect.values, 2, data_format="NCHW_VECT_C"))


def test_single_image_without_batch_dim():
    img = _image(dims=("y", "x", "band"), shape=(4, 6, 8))
    out = img.ops.depth_to_space(2)
    assert out.dims == ("y", "x", "band") and out.shape == (8, 12, 2)
    assert_same(out.values, ops.depth_to_space(img.values[None], 2)[0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_space_to_batch_family(backend):
    arr = _image(backend)
    out = arr.ops.space_to_batch(2, [[1, 1], [0, 2]])
    assert out.dims == arr.dims
    assert_same(out.values, ops.space_to_batch(arr.values, 2, [[1, 1], [0, 2]]))
    nd = arr.ops.space_to_batch_nd({"x": 3}, {"x": (0, 3)})
    assert_same(nd.values, ops.space_to_batch_nd(arr.values.transpose(0, 2, 1, 3), [3], [[0, 3]]).transpose(0, 2, 1, 3))
    back = nd.ops.batch_to_space_nd({"x": 3}, {"x": (0, 3)})
    assert_same(back.values, arr.values)
    # Spatial dims in any order, batch dim found by name wherever it is.
    moved = arr.transpose("y", "band", "time", "x").ops.space_to_batch_nd({"y": 2, "x": 2})
    assert moved.dims == ("y", "band", "time", "x")
    assert_same(moved.transpose(*arr.dims).values, ops.space_to_batch_nd(arr.values, [2, 2], [[0, 0], [0, 0]]))


def test_batch_family_errors():
    arr = _image()
    with pytest.raises(InvalidArgument, match=r"block_shape must map spatial dim names"):
        arr.ops.space_to_batch_nd([2, 2])
    with pytest.raises(DimensionError, match=r"'z' is not a dim of the array"):
        arr.ops.space_to_batch_nd({"z": 2})
    with pytest.raises(DimensionError, match=r"'time' is the batch dim \(N\), not a spatial dim"):
        arr.ops.space_to_batch_nd({"time": 2})
    with pytest.raises(DimensionError, match=r"name dims \['x'\] that have no block size"):
        arr.ops.space_to_batch_nd({"y": 2}, {"x": (1, 1)})
    no_batch = xr.DataArray(np.zeros((4, 4)), dims=("y", "x"))
    with pytest.raises(DimensionError, match=r"needs batch \(N\)"):
        no_batch.ops.space_to_batch_nd({"y": 2})
    with pytest.raises(InvalidArgument, match=r"dim 'y' padded to 4 \+ 0 \+ 0 = 4 is not divisible by its block size 3"):
        arr.ops.space_to_batch_nd({"y": 3})


@pytest.mark.parametrize("backend", BACKENDS)
def test_gather_nd_by_name(backend):
    arr = _image(backend)
    points = xr.DataArray(np.array([[0, 5], [3, 1], [-1, -1]]), dims=("point", "coord"),
                          coords={"coord": ["y", "x"], "point": ["p", "q", "r"]})
    out = arr.ops.gather_nd(points)
    assert out.dims == ("point", "time", "band")
    expected = ops.gather_nd(arr.values.transpose(1, 2, 0, 3), points.values)
    assert_same(out.values, expected)
    # The indexed dims' coordinates travel with the points; the others stay.
    assert out["y"].values.tolist() == [1005.0, 1035.0, 1035.0]
    assert out["x"].values.tolist() == [1055.0, 1015.0, 1055.0]
    assert out["point"].values.tolist() == ["p", "q", "r"] and "band" in out.coords and "sensor" in out.coords
    # Unlabelled tuples index params dims in order; batch dims are shared by name.
    positional = arr.ops.gather_nd(xr.DataArray(np.array([[1, 2]]), dims=("k", "tuple")))
    assert_same(positional.values, ops.gather_nd(arr.values, np.array([[1, 2]])))
    per_time = xr.DataArray(np.array([[[1], [2]], [[3], [0]]]), dims=("time", "k", "tuple"), coords={"tuple": ["y"]})
    batched = arr.ops.gather_nd(per_time, batch_dims=1)
    assert batched.dims == ("time", "k", "x", "band")
    assert_same(batched.values, ops.gather_nd(arr.values, per_time.values, batch_dims=1))
    lazy_points = points.chunk({"point": 2})
    assert_same(arr.ops.gather_nd(lazy_points).values, expected)


def test_gather_nd_errors():
    arr = _image()
    with pytest.raises(InvalidArgument, match=r"indices must be a DataArray"):
        arr.ops.gather_nd(np.array([[0, 0]]))
    with pytest.raises(DimensionError, match=r"params has no dims \['z'\]"):
        arr.ops.gather_nd(xr.DataArray(np.array([[0, 0]]), dims=("p", "c"), coords={"c": ["y", "z"]}))
    with pytest.raises(DimensionError, match=r"must name distinct, non-batch params dims"):
        arr.ops.gather_nd(xr.DataArray(np.array([[0, 0]]), dims=("p", "c"), coords={"c": ["y", "y"]}))
    with pytest.raises(IndexError, match=r"indices\[\{'p': 0, 'c': 1\}\] = 6 is out of range for params dim 'x' of size 6"):
        arr.ops.gather_nd(xr.DataArray(np.array([[0, 6]]), dims=("p", "c"), coords={"c": ["y", "x"]}))


@pytest.mark.parametrize("backend", BACKENDS)
def test_ascend_dequant_by_name(backend):
    rng = np.random.default_rng(0)
    src_values = rng.integers(-1000, 1000, (64, 32), dtype=np.int32)
    src = xr.DataArray(src_values, dims=("token", "k"), coords={"token": np.arange(64) * 2})
    if backend == "dask":
        src = src.chunk({"token": 16})
    columns = xr.DataArray(rng.random(32).astype(np.float32), dims="k")
    assert_same(src.ops.ascend_dequant(columns, dst_dtype="float32").values,
                ops.ascend_dequant(src_values, columns.values, dst_dtype="float32"))
    # A per-token scale names the row dim, whatever the order of src's dims.
    per_token = xr.DataArray(rng.random(64).astype(np.float32), dims="token", coords={"token": np.arange(64) * 2})
    expected = ops.ascend_dequant(src_values, per_token.values, dst_dtype="float16", policy="per_token")
    assert_same(src.ops.ascend_dequant(per_token, dst_dtype="float16", policy="per_token").values, expected)
    flipped = src.transpose("k", "token").ops.ascend_dequant(per_token, dst_dtype="float16", policy="per_token")
    assert flipped.dims == ("k", "token")
    assert_same(flipped.transpose("token", "k").values, expected)
    # Scales are matched by label, not position.
    shuffled = per_token.isel(token=rng.permutation(64))
    assert_same(src.ops.ascend_dequant(shuffled, dst_dtype="float16", policy="per_token").values, expected)
    # per_group: the src dim missing from the scale is the grouped one (k_dim).
    groups_k = xr.DataArray(rng.random((64, 1)).astype(np.float32), dims=("token", "kgroup"))
    assert_same(src.ops.ascend_dequant(groups_k, dst_dtype="float32", policy="per_group", group_size=32).values,
                ops.ascend_dequant(src_values, groups_k.values, dst_dtype="float32", policy="per_group", group_size=32, k_dim=1))
    groups_t = xr.DataArray(rng.random((2, 32)).astype(np.float32), dims=("tgroup", "k"))
    assert_same(src.ops.ascend_dequant(groups_t, dst_dtype="float32", policy="per_group", group_size=32).values,
                ops.ascend_dequant(src_values, groups_t.values, dst_dtype="float32", policy="per_group", group_size=32, k_dim=0))
    padded = src.isel(k=slice(0, 8)).ops.ascend_dequant(1.5, dst_dtype="bfloat16", align_output=True)
    assert padded.sizes["k"] == 16 and "token" in padded.coords


# --- laziness ---------------------------------------------------------------------------------


def test_nothing_is_computed_and_chunks_follow_the_plan():
    arr = _image("dask")
    points = xr.DataArray(np.array([[0, 1]]), dims=("p", "c"), coords={"c": ["y", "x"]})
    with dask.config.set(scheduler=_explode):
        results = [
            (arr.ops.depth_to_space(2), ops.depth_to_space(arr.data, 2)),
            (arr.ops.space_to_depth(2), ops.space_to_depth(arr.data, 2)),
            (arr.ops.space_to_batch(2, [1, 1, 0, 0]), ops.space_to_batch(arr.data, 2, [1, 1, 0, 0])),
            (arr.ops.gather_nd(points), None),
            (arr.ops.depth_to_space(2).ops.invert(), None),
        ]
        src = xr.DataArray(da.ones((64, 32), chunks=16, dtype=np.int32), dims=("token", "k"))
        results.append((src.ops.ascend_dequant(xr.DataArray(da.ones(64, chunks=16, dtype=np.float32), dims="token"),
                                               dst_dtype="float16", policy="per_token"), None))
    for out, plain in results:
        assert isinstance(out.data, da.Array)
        if plain is not None:
            assert out.data.chunks == plain.chunks


# --- coordinates, attrs, round trips ----------------------------------------------------------


def test_coordinates_refined_and_coarsened():
    arr = _image()  # y/x: a 10 m grid, pixel centres at 1005, 1015, ...
    fine = arr.ops.depth_to_space(2)
    assert fine["y"].values.tolist() == [1002.5, 1007.5, 1012.5, 1017.5, 1022.5, 1027.5, 1032.5, 1037.5]
    assert fine["y"].attrs == {"units": "m"}
    # DCR groups channels k, k + 2, k + 4, k + 6: their labels, joined (tests/ops/accessor/test_coords.py).
    assert fine["band"].values.tolist() == ["b0|b2|b4|b6", "b1|b3|b5|b7"]
    assert fine["time"].equals(arr["time"]) and fine["sensor"].equals(arr["sensor"])
    coarse = arr.ops.space_to_depth(2)
    assert coarse["x"].values.tolist() == [1010.0, 1030.0, 1050.0]
    # Uneven or non-numeric spatial coordinates are dropped with a warning, never mislabelled.
    uneven = arr.assign_coords(y=[0.0, 1.0, 3.0, 7.0], x=[f"c{k}" for k in range(6)])
    with pytest.warns(ops.CoordinateDropped):
        out = uneven.ops.depth_to_space(2)
    assert "y" not in out.coords and "x" not in out.coords
    two_d = arr.assign_coords(lat=(("y", "x"), np.zeros((4, 6))))
    with pytest.warns(ops.CoordinateDropped, match="'lat' dropped"):
        assert "lat" not in two_d.ops.depth_to_space(2).coords


def test_attrs_history_and_inversion():
    arr = _image()
    out = arr.ops.depth_to_space(2, mode="CRD")
    assert out.attrs["units"] == "K" and out.attrs["source"] == "synthetic" and out.name == "t2m"
    assert json.loads(out.attrs["ops_history"]) == [
        {"operator": "depth_to_space",
         "parameters": {"block_size": 2, "mode": "CRD", "dims": {"H": "y", "W": "x", "C": "band", "N": "time"}},
         "coords": {"band": {"dims": ["band"], "dtype": "<U2", "values": [f"b{k}" for k in range(8)], "attrs": {}}},
         "drop_coords": ["phase_x", "phase_y", "source_band"]}
    ]
    back = out.ops.invert()
    assert_same(back.values, arr.values)
    assert back.attrs == arr.attrs and back.dims == arr.dims
    # Every coordinate comes back, channel labels included (recorded in ops_history).
    xr.testing.assert_identical(back, arr)
    two_steps = arr.ops.space_to_batch_nd({"y": 2}, {"y": (1, 1)}).ops.depth_to_space(2, dims={"N": "time"})
    assert len(json.loads(two_steps.attrs["ops_history"])) == 2
    undone = two_steps.ops.invert().ops.invert()
    assert_same(undone.values, arr.values)
    assert "ops_history" not in undone.attrs
    with pytest.raises(ops.InvalidArgument, match=r"nothing to undo"):
        arr.ops.invert()
    with pytest.raises(ops.InvalidArgument, match=r"gather_nd has no inverse"):
        arr.ops.gather_nd(xr.DataArray(np.array([[0]]), dims=("p", "c"))).ops.invert()


# --- Dataset -----------------------------------------------------------------------------------


def test_dataset_applies_to_variables_with_the_dims():
    arr = _image()
    ds = xr.Dataset({"t2m": arr, "label": ("time", ["x", "y"]), "mask": arr.isel(band=0) > 3}, attrs={"title": "demo"})
    # A variable that lacks the operator's dims but shares a dim whose size changes cannot stay
    # beside the result: it is left out, with one warning that names it.
    with pytest.warns(ops.CoordinateDropped, match=r"data variables \['mask'\] left out: they lack the dims the "
                                                   r"operator needs but share \['x', 'y'\]") as caught:
        left = ds.ops.depth_to_space(2)
    assert set(left.data_vars) == {"t2m", "label"} and len(caught) == 1
    out = ds.drop_vars("mask").ops.depth_to_space(2)
    assert out.identical(left)
    assert_same(out["t2m"].values, arr.ops.depth_to_space(2).values)
    assert out["label"].equals(ds["label"]) and out.attrs == {"title": "demo"}
    assert_same(out.ops.invert()["t2m"].values, arr.values)
    with pytest.raises(DimensionError, match=r"no data variable of the Dataset has the dims it needs"):
        xr.Dataset({"label": ("time", ["x", "y"])}).ops.depth_to_space(2)
    # gather_nd samples every variable that has the indexed dims.
    points = xr.DataArray(np.array([[1, 2]]), dims=("p", "c"), coords={"c": ["y", "x"]})
    sampled = ds.ops.gather_nd(points)
    assert_same(sampled["mask"].values, ds["mask"].values[:, 1, 2][None])
    assert sampled["label"].equals(ds["label"])


def test_a_dataset_warns_once_for_a_coordinate_its_variables_share():
    arr = _image().assign_coords(y=[0.0, 1.0, 5.0, 6.0][: _image().sizes["y"]])
    ds = xr.Dataset({"a": arr, "b": arr * 2})
    with pytest.warns(ops.CoordinateDropped) as caught:
        ds.ops.space_to_depth(2)
    messages = [str(w.message) for w in caught]
    assert len(messages) == len(set(messages)) and any("'y' dropped" in m for m in messages)
