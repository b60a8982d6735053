"""The registry: one entry per public operator, matching the function it names."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import xarray as xr

import ops
from ops import registry
from ops.errors import InvalidArgument, MissingInput, UnknownInput
from tests.helpers import assert_same


def test_every_public_operator_is_registered_once():
    public = {"depth_to_space", "space_to_depth", "space_to_batch", "space_to_batch_nd", "batch_to_space_nd",
              "gather_nd", "ascend_dequant"}
    assert set(registry.OPERATORS) == public
    for name, op in registry.OPERATORS.items():
        assert op.function is getattr(ops, name)


@pytest.mark.parametrize("name", sorted(registry.OPERATORS))
def test_entry_matches_the_function_signature(name):
    """Array inputs then the Params model's fields (and GatherNd's ``scratch``, which the
    registry sets for every operator as ``ops.scratch`` does) are exactly the function's
    parameters."""
    op = registry.OPERATORS[name]
    parameters = list(inspect.signature(op.function).parameters)
    assert parameters[: len(op.array_inputs)] == list(op.array_inputs)
    assert sorted(parameters[len(op.array_inputs):]) == sorted([*op.keywords, *(["scratch"] if name == "gather_nd" else [])])


@pytest.mark.smoke
def test_apply_by_name_equals_the_plain_function_and_keeps_coordinates():
    x = np.arange(2 * 2 * 2 * 8, dtype=np.float32).reshape(2, 2, 2, 8)
    labelled = xr.DataArray(x, dims=("time", "y", "x", "band"), coords={"y": [0.0, 10.0], "x": [0.0, 10.0]},
                            attrs={"units": "K"})
    named = registry.apply("depth_to_space", {"x": labelled}, {"block_size": 2})
    plain = registry.apply("depth_to_space", {"x": x}, {"block_size": 2})
    assert_same(named.values, ops.depth_to_space(x, 2))
    assert_same(plain.values, ops.depth_to_space(x, 2))
    assert named.dims == ("time", "y", "x", "band") and plain.dims == ("n", "h", "w", "c")
    np.testing.assert_array_equal(named["y"].values, [-2.5, 2.5, 7.5, 12.5])
    assert named.attrs["units"] == "K" and "ops_history" in named.attrs


def test_apply_nd_by_name_maps_block_shape_to_the_dims_after_batch():
    x = np.arange(1 * 4 * 6 * 3).reshape(1, 4, 6, 3)
    labelled = xr.DataArray(x, dims=("sample", "row", "col", "feature"), coords={"feature": ["a", "b", "c"]})
    out = registry.apply("space_to_batch_nd", {"x": labelled}, {"block_shape": [2, 3], "paddings": [[0, 0], [0, 0]]})
    assert_same(out.values, ops.space_to_batch_nd(x, [2, 3], [[0, 0], [0, 0]]))
    assert list(out["feature"].values) == ["a", "b", "c"]


def test_apply_refuses_unknown_parameters_and_conflicting_layout():
    x = xr.DataArray(np.zeros((1, 2, 2, 4)), dims=("n", "y", "x", "c"))
    with pytest.raises(InvalidArgument, match="has no input 'blocksize'"):
        registry.apply("depth_to_space", {"x": x}, {"blocksize": 2})
    with pytest.raises(InvalidArgument, match="data_format 'NCHW' disagrees"):
        registry.apply("depth_to_space", {"x": x}, {"block_size": 2, "data_format": "NCHW"})
    with pytest.raises(InvalidArgument, match="operator must be one of"):
        registry.get("pixel_shuffle")


def test_a_scratch_reaches_only_the_operators_that_take_one(tmp_path):
    """The service and the command line pass their job's scratch to every operator; GatherNd
    writes its intermediate files there (and removes them), the others ignore it."""
    import dask
    import dask.array as da

    params = np.arange(64 * 4).reshape(64, 4)
    indices = da.from_array(np.array([[63], [0], [7]]), chunks=1)
    with dask.config.set({"array.chunk-size": "1B"}):
        lazy = registry.apply("gather_nd", {"params": da.from_array(params, chunks=(8, 4)), "indices": indices}, {},
                              scratch=str(tmp_path))
    assert any(str(key[0]).startswith("gather_nd-assemble-") for key in dict(lazy.data.__dask_graph__())
               if isinstance(key, tuple))  # the scratch plan
    assert (lazy.compute().values == params[[63, 0, 7]]).all()
    assert list(tmp_path.iterdir()) == []  # the run's files are removed by its last block
    x = np.arange(2 * 2 * 2 * 8, dtype=np.float32).reshape(2, 2, 2, 8)
    assert (registry.apply("depth_to_space", {"x": x}, {"block_size": 2}, scratch=str(tmp_path)).values
            == ops.depth_to_space(x, 2)).all()


# --- bind: one check of a call's inputs for every door -------------------------------------------


@pytest.mark.smoke
def test_bind_sorts_inputs_into_arrays_parameters_and_dims():
    x = np.zeros((1, 2, 2, 4), np.float32)
    call = registry.bind("depth_to_space", {"x": x, "block_size": 2, "dims": {"H": "row"}})
    assert call.op is registry.OPERATORS["depth_to_space"]
    assert call.arrays["x"] is x and call.kwargs == {"block_size": 2} and call.dims == {"H": "row"}
    scale = registry.bind("ascend_dequant", {"src": [[1, 2]], "deq_scale": 3, "dst_dtype": "float32"})
    assert scale.arrays["deq_scale"] == 3.0 and isinstance(scale.arrays["deq_scale"], float)
    assert isinstance(scale.arrays["src"], np.ndarray) and scale.arrays["src"].tolist() == [[1, 2]]


@pytest.mark.parametrize("name, inputs, error, message", [
    ("depth_to_space", {"x": 0, "block_size": 2}, InvalidArgument, "input 'x' must be an array, got the number 0"),
    ("depth_to_space", {"x": [], "blocksize": 2}, UnknownInput,
     "depth_to_space has no input 'blocksize'; its inputs are x, block_size, data_format, mode, dims"),
    ("ascend_dequant", {"src": [1], "deq_scale": 1, "dst_dtype": "float32", "dims": {}}, UnknownInput,
     "ascend_dequant has no input 'dims'"),
    ("gather_nd", {"params": [1]}, MissingInput, "gather_nd needs the array input 'indices'"),
    ("depth_to_space", {"x": []}, MissingInput, "depth_to_space needs the parameter 'block_size'"),
    ("depth_to_space", {"x": [], "block_size": 2, "dims": ["H"]}, InvalidArgument,
     "dims must map roles (N, H, W, C, V) to dim names"),
    ("depth_to_space", {"x": [], "block_size": 2, "dims": {"Q": "row"}}, InvalidArgument, "dims must map roles"),
    ("depth_to_space", {"x": [], "block_size": 2, "dims": {"H": 1}}, InvalidArgument, "dims must map roles"),
    ("depth_to_space", {"x": True, "block_size": 2}, InvalidArgument, "input 'x' must be an array, got True"),
    ("gather_nd", {"params": [[1], [1, 2]], "indices": [0]}, InvalidArgument, "must be a rectangular array"),
])
def test_bind_refuses_a_call_before_anything_is_read(name, inputs, error, message):
    with pytest.raises(error) as caught:
        registry.bind(name, inputs)
    assert message in str(caught.value)
    if error is MissingInput:
        missing = message.rsplit(" ", 1)[1].strip("'")
        assert caught.value.input == missing
        assert caught.value.kind == ("array" if "array input" in message else "parameter")


def test_a_bound_call_runs_once_its_references_are_resolved():
    """A door binds the call with its own references (a stored name, a path), resolves them
    to arrays and runs it: the same result as apply with the arrays at hand."""
    x = np.arange(2 * 2 * 2 * 8, dtype=np.float32).reshape(2, 2, 2, 8)
    call = registry.bind("depth_to_space", {"x": "stored-name", "block_size": 2, "mode": "CRD"})
    assert call.arrays == {"x": "stored-name"}
    out = call.with_arrays({"x": x}).run()
    assert_same(out.values, ops.depth_to_space(x, 2, mode="CRD"))
    assert_same(out.values, registry.apply("depth_to_space", {"x": x}, {"block_size": 2, "mode": "CRD"}).values)


@pytest.mark.parametrize("name, kwargs, dims", [
    ("depth_to_space", {"block_size": 2}, ("n", "y", "x", "c")),
    ("space_to_depth", {"block_size": 2}, ("y", "x", "c")),
    ("space_to_batch", {"block_size": 2, "paddings": [[0, 0], [0, 0]]}, ("n", "y", "x", "c")),
    ("space_to_batch_nd", {"block_shape": [2, 2], "paddings": [[0, 0], [0, 0]]}, ("n", "y", "x", "c")),
])
def test_a_named_call_resolves_the_dims_once(monkeypatch, name, kwargs, dims):
    """Which dim plays which role is decided once per call (the accessor used to redo it at
    each layer)."""
    from ops import dims as dims_module
    from ops.accessor import named_rearrange

    calls = []

    def counting(*args, **kw):
        calls.append(args[1])
        return dims_module.find_dims(*args, **kw)

    monkeypatch.setattr(named_rearrange, "find_dims", counting)
    sizes = {"n": 1, "y": 4, "x": 4, "c": 4}
    x = xr.DataArray(np.zeros([sizes[d] for d in dims], np.float32), dims=dims)
    out = registry.apply(name, {"x": x}, kwargs)
    assert out.dims == dims
    assert len(calls) == (0 if name == "space_to_batch_nd" else 1), calls  # ND takes the batch dim first
