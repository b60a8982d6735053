"""``ops.accessor.named_dequant``: AscendDequant's scale matched by dim name and by label."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

import ops
from ops import registry
from ops.errors import InvalidArgument

RNG = np.random.default_rng(29)
SRC = RNG.integers(-1000, 1000, size=(8, 3, 4), dtype=np.int32)  # (channel, batch, token)
SCALE = RNG.uniform(0.5, 2.0, 8).astype(np.float32)


def reference(src_last_channel: np.ndarray, scale: np.ndarray) -> np.ndarray:
    return (src_last_channel.astype(np.float32) * scale).astype(np.float32)


@pytest.mark.smoke
def test_a_plain_vector_scale_applies_along_the_channel_dim_found_by_name():
    arr = xr.DataArray(SRC, dims=("channel", "batch", "token"))
    out = arr.ops.ascend_dequant(SCALE, dst_dtype="float32")
    expected = np.moveaxis(reference(np.moveaxis(SRC, 0, -1), SCALE), -1, 0)
    np.testing.assert_array_equal(out.values, expected)
    assert out.dims == ("channel", "batch", "token")


def test_a_plain_vector_scale_of_another_length_is_refused_naming_both():
    arr = xr.DataArray(SRC, dims=("channel", "batch", "token"))
    with pytest.raises(InvalidArgument, match="deq_scale has 5 entries, the column dim 'channel' of src has 8"):
        arr.ops.ascend_dequant(SCALE[:5], dst_dtype="float32")
    with pytest.raises(InvalidArgument, match="deq_scale has 9 entries"):
        arr.ops.ascend_dequant(np.append(SCALE, 1.0), dst_dtype="float32")


def test_without_a_channel_name_the_last_dim_holds_the_columns():
    arr = xr.DataArray(SRC.transpose(1, 2, 0), dims=("a", "b", "k"))
    out = arr.ops.ascend_dequant(SCALE, dst_dtype="float32")
    np.testing.assert_array_equal(out.values, reference(SRC.transpose(1, 2, 0), SCALE))


def test_a_labelled_scale_aligns_by_label_through_the_registry_as_in_the_accessor():
    """What the command line and the service run (the registry) aligns as the accessor does."""
    labels = [f"c{i}" for i in range(8)]
    src = xr.DataArray(SRC.reshape(8, 12).T, dims=("row", "channel"), coords={"channel": labels})
    scale = xr.DataArray(SCALE[::-1], dims=("channel",), coords={"channel": labels[::-1]})
    expected = reference(SRC.reshape(8, 12).T, SCALE)
    np.testing.assert_array_equal(src.ops.ascend_dequant(scale, dst_dtype="float32").values, expected)
    through = registry.apply("ascend_dequant", {"src": src, "deq_scale": scale}, {"dst_dtype": "float32"})
    np.testing.assert_array_equal(through.values, expected)
    assert through.dims == ("row", "channel") and list(through["channel"].values) == labels
    positional = ops.ascend_dequant(src.values, scale.values, dst_dtype="float32")
    assert not np.array_equal(positional, expected)  # by position it would be another answer


def test_an_unnamed_lazy_result_stays_unnamed():
    """xarray names a DataArray after its Dask array when no name is given; a result of an
    unnamed input must stay unnamed (to_netcdf would write the Dask key as its variable)."""
    import dask.array as da

    x = xr.DataArray(da.zeros((1, 4, 4, 4), chunks=2), dims=("n", "y", "x", "c"))
    src = xr.DataArray(da.zeros((4, 8), dtype=np.int32, chunks=2), dims=("row", "channel"))
    assert x.ops.space_to_depth(2).name is None
    assert x.ops.space_to_batch_nd(y=2, x=2).name is None
    assert src.ops.ascend_dequant(SCALE, dst_dtype="float32").name is None
    assert x.ops.gather_nd(xr.DataArray(np.array([[0, 1]]), dims=("p", "i"))).name is None
    assert x.name is not None  # xarray named the input after its Dask key; the results do not take it
    assert registry.apply("depth_to_space", {"x": x.data}, {"block_size": 2}).name is None
    assert x.rename("t").ops.space_to_depth(2).name == "t"


def test_the_packing_of_src_is_not_kept_and_a_warning_says_so():
    """AscendDequant computes new values: a packed src's scale_factor would corrupt them, so the
    result has none of its packing, and the warning names what was left out."""
    src = xr.DataArray(np.arange(8, dtype=np.int32).reshape(2, 4), dims=("token", "channel"))
    src.encoding.update({"scale_factor": 0.5, "_FillValue": -1, "dtype": "int32"})
    with pytest.warns(ops.CoordinateDropped, match=r"packing of src \(scale_factor, _FillValue\) is not kept"):
        out = src.ops.ascend_dequant(np.float32(2.0), dst_dtype="float32")
    assert not {"scale_factor", "_FillValue", "dtype"} & set(out.encoding)
    assert out.values.tolist() == (np.arange(8).reshape(2, 4) * 2.0).tolist()
