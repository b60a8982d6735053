"""xarray conventions on the ``.ops`` accessor (issue 9 items 3 and 4): the keyword form beside
the mapping form, ``keep_attrs`` as xarray resolves it (xarray's own ``coarsen`` is the judge),
numpydoc sections on every public method and their examples run as doctests, the accessor's
repr, errors worded in dim names, and AscendDequant on DataArrays of any rank (the plain NumPy
expression is the judge) with packed float scales."""

from __future__ import annotations

import doctest
import importlib.metadata
import inspect
import json
import re

import dask
import dask.array as da
import numpy as np
import pytest
import xarray as xr

import ops
from ops.accessor import OpsAccessor, OpsDatasetAccessor
from ops.accessor.docstrings import from_dataarray
from ops.errors import DimensionError, InvalidArgument, MissingDims
from tests.helpers import assert_same


def _image(backend="numpy"):
    data = np.arange(2 * 4 * 6 * 3, dtype=np.int32).reshape(2, 4, 6, 3)
    if backend == "dask":
        data = da.from_array(data, chunks=(1, 2, 3, 3))
    return xr.DataArray(data, dims=("time", "y", "x", "band"), name="t2m",
                        coords={"band": ["r", "g", "b"]}, attrs={"units": "K"})


def _explode(*args, **kwargs):
    raise AssertionError("the accessor computed something")


# --- 1. keyword form --------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["numpy", "dask"])
def test_keyword_form_equals_mapping_form(backend):
    arr = _image(backend)
    by_mapping = arr.ops.space_to_batch_nd({"y": 2, "x": 2}, {"y": (1, 1)})
    by_keywords = arr.ops.space_to_batch_nd(y=2, x=2, paddings={"y": (1, 1)})
    xr.testing.assert_identical(by_keywords, by_mapping)
    expected = ops.space_to_batch_nd(np.asarray(arr.values), [2, 2], [[1, 1], [0, 0]])
    assert_same(by_keywords.values, expected)
    back = by_keywords.ops.batch_to_space_nd(y=2, x=2, crops={"y": (1, 1)})
    xr.testing.assert_identical(back, by_mapping.ops.batch_to_space_nd({"y": 2, "x": 2}, crops={"y": (1, 1)}))
    assert_same(back.values, arr.values)
    ds = xr.Dataset({"t2m": arr}, attrs={"title": "demo"})
    xr.testing.assert_identical(ds.ops.space_to_batch_nd(y=2, x=2, paddings={"y": (1, 1)}),
                                ds.ops.space_to_batch_nd({"y": 2, "x": 2}, {"y": (1, 1)}))
    assert_same(ds.ops.space_to_batch_nd(y=2).ops.batch_to_space_nd(y=2)["t2m"].values, arr.values)
    xr.testing.assert_identical(ds.ops.space_to_batch_nd(y=2, x=3).ops.invert(), ds)


@pytest.mark.parametrize("call,match", [
    (lambda a: a.ops.space_to_batch_nd({"y": 2}, x=2),
     r"space_to_batch_nd: give block_shape either as a mapping or as keywords, not both; got block_shape=\{'y': 2\} and x=2"),
    (lambda a: a.ops.batch_to_space_nd({"y": 2}, y=2),
     r"batch_to_space_nd: give block_shape either as a mapping or as keywords, not both"),
    (lambda a: xr.Dataset({"t": a}).ops.space_to_batch_nd({"y": 2}, x=2), r"not both"),
    (lambda a: a.ops.space_to_batch_nd(), r"space_to_batch_nd needs a block size per spatial dim, by name: \.ops\.space_to_batch_nd\(y=2, x=2\)"),
    (lambda a: a.ops.space_to_batch_nd([2, 2]), r"block_shape must map spatial dim names to block sizes, e.g. .* or \.ops\.space_to_batch_nd\(y=2, x=2\), got \[2, 2\]"),
    (lambda a: a.ops.space_to_batch_nd(y=2, paddings=[(1, 1)]), r"paddings must map spatial dim names to \(before, after\), e.g. paddings=\{'y': \(1, 1\)\}, got \[\(1, 1\)\]"),
])
def test_keyword_form_refusals(call, match):
    with pytest.raises(InvalidArgument, match=match):
        call(_image())


# --- 2. keep_attrs ----------------------------------------------------------------------------


CALLS = {
    "depth_to_space": lambda a, **kw: a.isel(band=slice(0, 1)).ops.space_to_depth(2, keep_attrs=True).ops.depth_to_space(2, **kw),
    "space_to_depth": lambda a, **kw: a.isel(band=slice(0, 1)).ops.space_to_depth(2, **kw),
    "space_to_batch": lambda a, **kw: a.ops.space_to_batch(2, **kw),
    "space_to_batch_nd": lambda a, **kw: a.ops.space_to_batch_nd(y=2, **kw),
    "batch_to_space_nd": lambda a, **kw: a.ops.batch_to_space_nd(y=2, **kw),
    "gather_nd": lambda a, **kw: a.ops.gather_nd(xr.DataArray([[0, 1]], dims=("p", "k"), coords={"k": ["y", "x"]}), **kw),
    "ascend_dequant": lambda a, **kw: a.ops.ascend_dequant(0.5, dst_dtype="float32", **kw),
}
RECORDED_AS = {"space_to_batch": "space_to_batch_nd"}  # the 4-D form is recorded as the ND call it makes


def _user_attrs(out):
    return {k: v for k, v in out.attrs.items() if k != "ops_history"}


@pytest.mark.parametrize("option", [None, True, False])
@pytest.mark.parametrize("name", list(CALLS))
def test_keep_attrs_follows_xarray(name, option):
    arr = _image()
    with xr.set_options(**({} if option is None else {"keep_attrs": option})):
        out = CALLS[name](arr)
        xarray_keeps = bool(arr.coarsen(y=2).mean().attrs)  # xarray's own rule, same options
    assert _user_attrs(out) == ({"units": "K"} if xarray_keeps else {})
    steps = json.loads(out.attrs["ops_history"])  # this step stays recorded: invert still works
    assert steps[-1]["operator"] == RECORDED_AS.get(name, name)
    with xr.set_options(keep_attrs=not xarray_keeps):  # the keyword wins over the option
        assert _user_attrs(CALLS[name](arr, keep_attrs=xarray_keeps)) == _user_attrs(out)


@pytest.mark.smoke
def test_keep_attrs_false_still_inverts_and_dataset_attrs():
    arr = _image()
    moved = arr.ops.space_to_batch_nd(y=2, x=2, keep_attrs=False)
    assert set(moved.attrs) == {"ops_history"}
    back = moved.ops.invert()
    assert_same(back.values, arr.values) and back.attrs == {}
    with xr.set_options(keep_attrs=False):
        assert arr.ops.space_to_batch_nd(y=2, keep_attrs=True).attrs["units"] == "K"
    assert arr.ops.space_to_depth(2, keep_attrs=True).ops.invert(keep_attrs=False).attrs == {}
    ds = xr.Dataset({"t2m": arr}, attrs={"title": "demo"})
    assert ds.ops.space_to_batch_nd(y=2).attrs == {"title": "demo"}
    dropped = ds.ops.space_to_batch_nd(y=2, keep_attrs=False)
    assert dropped.attrs == {} and set(dropped["t2m"].attrs) == {"ops_history"}
    with pytest.raises(InvalidArgument, match=r"keep_attrs must be True, False or None, got 'yes'"):
        arr.ops.space_to_batch_nd(y=2, keep_attrs="yes")


# --- 3. docstrings ----------------------------------------------------------------------------


PUBLIC = [(cls, name) for cls in (OpsAccessor, OpsDatasetAccessor)
          for name, member in vars(cls).items() if callable(member) and not name.startswith("_")]
SECTIONS = ("Parameters", "Returns", "Raises", "Examples")


def _sections(doc: str) -> dict[str, list[str]]:
    """numpydoc sections: a title line followed by a line of dashes of the same length."""
    lines = inspect.cleandoc(doc).splitlines()
    found, current = {}, None
    for k, line in enumerate(lines):
        if k + 1 < len(lines) and line.strip() and set(lines[k + 1].strip()) == {"-"} \
                and len(lines[k + 1].strip()) == len(line.strip()):
            current = found.setdefault(line.strip(), [])
        elif current is not None and not set(line.strip()) == {"-"}:
            current.append(line)
    return found


def test_every_public_method_is_listed():
    names = {name for cls, name in PUBLIC if cls is OpsAccessor}
    assert names == {"depth_to_space", "space_to_depth", "space_to_batch", "space_to_batch_nd",
                     "batch_to_space_nd", "gather_nd", "ascend_dequant", "invert"}
    assert names == {name for cls, name in PUBLIC if cls is OpsDatasetAccessor}  # ascend_dequant too


@pytest.mark.parametrize("cls,name", PUBLIC, ids=[f"{c.__name__}.{n}" for c, n in PUBLIC])
def test_numpydoc_sections_and_typed_parameters(cls, name):
    method = getattr(cls, name)
    sections = _sections(method.__doc__ or "")
    assert all(s in sections for s in SECTIONS), (name, sorted(sections))
    documented = {}
    for line in sections["Parameters"]:
        match = re.match(r"^(\*{0,2}\w+) : (\S.*)$", line)
        if match:
            documented[match.group(1)] = match.group(2)
    parameters = []
    for p in list(inspect.signature(method).parameters.values())[1:]:
        parameters.append(("**" if p.kind is p.VAR_KEYWORD else "") + p.name)
    assert list(documented) == parameters, (name, list(documented), parameters)  # all, typed, in order
    returns = [line for line in sections["Returns"] if line.strip()]
    assert returns[0].startswith("xarray.Data"), returns
    assert any(re.match(r"^\w+(Error|Argument|Applicable)$", line) for line in sections["Raises"])
    assert any(line.strip().startswith(">>> ") for line in sections["Examples"])


def test_docstring_examples_run():
    finder, runner = doctest.DocTestFinder(), doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    tests = [t for obj in (OpsAccessor, OpsDatasetAccessor, ops.pack_deq_scale, ops.unpack_deq_scale)
             for t in finder.find(obj, globs={}) if t.examples]
    assert len(tests) >= 2 * 8 + 2
    for test in tests:
        runner.run(test)
    assert runner.summarize(verbose=False).failed == 0


@pytest.mark.parametrize("name", sorted(name for cls, name in PUBLIC if cls is OpsDatasetAccessor))
def test_dataset_docstrings_are_made_from_the_dataarray_ones(name):
    """One source: the Dataset method shows the DataArray method's description and parameters,
    with its own summary, Returns and examples."""
    on_array, on_dataset = inspect.getdoc(getattr(OpsAccessor, name)), inspect.getdoc(getattr(OpsDatasetAccessor, name))
    assert on_dataset.splitlines()[0].startswith(f"``DataArray.ops.{name}`` on every data variable that ")
    assert on_array.split("\nParameters\n", 1)[0] in on_dataset  # summary and description
    array_sections, dataset_sections = _sections(on_array), _sections(on_dataset)
    assert dataset_sections["Parameters"] == array_sections["Parameters"]
    assert [line for line in dataset_sections["Returns"] if line.strip()][0] == "xarray.Dataset"
    assert dataset_sections["Examples"] != array_sections["Examples"]
    assert "ds.ops." in "\n".join(dataset_sections["Examples"])


def test_a_dataset_method_must_take_the_parameters_of_the_dataarray_method():
    def depth_to_space(self, block_size, *, dims=None):
        """Examples\n--------\n>>> 1\n1"""

    with pytest.raises(TypeError, match="does not take the parameters of DataArray.ops.depth_to_space"):
        from_dataarray(OpsAccessor.depth_to_space)(depth_to_space)


# --- 4. repr ----------------------------------------------------------------------------------


def test_repr_shows_layout_and_the_dims_found():
    text = repr(_image().ops)
    assert text.splitlines()[0] == "<ops accessor on DataArray 't2m' (time: 2, y: 4, x: 6, band: 3)>"
    assert "Layout: NHWC" in text
    assert re.search(r"batch +\(N\): 'time'", text) and re.search(r"height +\(H\): 'y'", text)
    assert re.search(r"width +\(W\): 'x'", text) and re.search(r"channel +\(C\): 'band'", text)
    nchw = _image().transpose("time", "band", "y", "x")
    assert "Layout: NCHW" in repr(nchw.ops)
    no_channel = xr.DataArray(np.zeros((2, 2, 3)), dims=("y", "x", "q"))
    text = repr(no_channel.ops)
    assert "no C dim found" in text and "Other dims: 'q'" in text and re.search(r"channel +\(C\): -", text)
    ambiguous = xr.DataArray(np.zeros((2, 2)), dims=("y", "lat"))
    assert "dims ['y', 'lat'] all look like the height dim (H)" in repr(ambiguous.ops)
    assert "History: space_to_depth" in repr(_image().isel(band=[0]).ops.space_to_depth(2).ops)
    ds_text = repr(xr.Dataset({"t2m": _image(), "label": ("time", ["a", "b"])}).ops)
    assert ds_text.startswith("<ops accessor on Dataset (") and "Data variables: 't2m', 'label'" in ds_text
    assert repr(xr.DataArray(1.0).ops).startswith("<ops accessor on DataArray (no dims)>")


# --- 5. errors in dim names -------------------------------------------------------------------


def _errors(arr=None):
    arr = _image() if arr is None else arr
    one = arr.isel(band=[0])
    where = lambda v: xr.DataArray([[0, v]], dims=("p", "k"), coords={"k": ["y", "x"]})  # noqa: E731
    return [
        (lambda: arr.ops.space_to_batch_nd(block_shape={"y": 2.0}), ["block_shape={'y': 2.0}", "dim 'y'", "float 2.0"]),
        (lambda: arr.ops.space_to_batch_nd(y=2.0), ["block_shape={'y': 2.0}", "must be an integer"]),
        (lambda: arr.ops.space_to_batch_nd(y=0), ["block_shape={'y': 0}", "dim 'y'", ">= 1, got 0"]),
        (lambda: arr.ops.space_to_batch_nd(y=2, paddings={"y": (1, -1)}), ["paddings={'y': (1, -1)}", "dim 'y'", ">= 0"]),
        (lambda: arr.ops.space_to_batch_nd(y=2, paddings={"y": (1, 2, 3)}), ["paddings={'y': (1, 2, 3)}", "(before, after)"]),
        (lambda: arr.ops.space_to_batch_nd(x=4), ["dim 'x'", "6 + 0 + 0 = 6", "block size 4", "block_shape={'x': 4}"]),
        (lambda: arr.ops.batch_to_space_nd(y=2, x=2), ["batch dim 'time'", "2 entries", "block_shape={'y': 2, 'x': 2} = 4"]),
        (lambda: arr.ops.batch_to_space_nd(y=2, crops={"y": (5, 4)}), ["crops={'y': (5, 4)}", "dim 'y'", "4 x block 2 = 8"]),
        (lambda: arr.ops.depth_to_space(2), ["channel dim 'band'", "3 channels", "block_size**2 = 4"]),
        (lambda: arr.ops.depth_to_space(2.5), ["block_size", "float 2.5"]),
        (lambda: arr.ops.depth_to_space(1), ["block_size", "got 1"]),
        (lambda: one.isel(y=slice(0, 3)).ops.space_to_depth(2), ["height dim 'y'", "3 entries", "block_size=2"]),
        (lambda: one.ops.space_to_depth(4), ["width dim 'x'", "6 entries", "block_size=4"]),
        (lambda: arr.ops.space_to_batch(1.5), ["space_to_batch", "block_size", "float 1.5"]),
        (lambda: arr.ops.space_to_batch(2, [[1, 0], [0, 0]]), ["dim 'y'", "4 + 1 + 0 = 5"]),
        (lambda: arr.ops.gather_nd(where(9)), ["params dim 'x'", "= 9", "'p': 0, 'k': 1"]),
        (lambda: arr.ops.gather_nd(xr.DataArray(np.zeros((1, 5), int), dims=("p", "k"))), ["indices dim 'k'", "got 5"]),
        (lambda: xr.DataArray(np.zeros((1, 2, 2, 2, 2), np.int8), dims=("n", "c", "y", "x", "v")).ops.depth_to_space(2),
         ["dim 'v' must be 4 for NCHW_VECT_C", "got 2"]),
    ]


@pytest.mark.parametrize("case", range(len(_errors())))
def test_errors_speak_in_dim_names(case):
    call, expected = _errors()[case]
    with pytest.raises((InvalidArgument, IndexError)) as error:
        call()
    message = str(error.value)
    for text in expected:
        assert text in message, (text, message)
    assert "shape[" not in message and "spatial dim" not in message, message


def test_errors_come_before_any_work():
    arr = _image("dask")
    with dask.config.set(scheduler=_explode):
        for call, _ in _errors(arr)[:9]:
            with pytest.raises(InvalidArgument):
                call()


# --- 6. and 7. AscendDequant on DataArrays -----------------------------------------------------


def _expected(src, scale, dst):
    return (np.asarray(src, np.float32) * np.asarray(scale, np.float32)).astype(dst)


@pytest.mark.parametrize("backend", ["numpy", "dask"])
def test_three_dim_src_by_name(backend):
    rng = np.random.default_rng(3)
    values = rng.integers(-1000, 1000, (2, 5, 64), dtype=np.int32)
    src = xr.DataArray(values, dims=("batch", "token", "channel"),
                       coords={"token": np.arange(5) * 10, "channel": np.arange(64)}, attrs={"units": "count"})
    if backend == "dask":
        src = src.chunk({"batch": 1, "token": 2})
    columns = xr.DataArray(rng.uniform(-1, 1, 64).astype(np.float32), dims="channel")
    per_token = xr.DataArray(rng.uniform(-1, 1, (5, 2)).astype(np.float32), dims=("token", "batch"),
                             coords={"token": np.arange(5) * 10})
    groups = xr.DataArray(rng.uniform(-1, 1, (2, 5, 2)).astype(np.float32), dims=("batch", "token", "group"))
    with dask.config.set(scheduler=_explode):  # building computes nothing
        classic = src.ops.ascend_dequant(columns, dst_dtype="float32")
        token = src.transpose("channel", "token", "batch").ops.ascend_dequant(
            per_token.isel(token=[4, 2, 0, 1, 3]), dst_dtype="float16", policy="per_token")
        grouped = src.ops.ascend_dequant(groups, dst_dtype="bfloat16", policy="per_group", group_size=32)
        packed = src.ops.ascend_dequant(ops.pack_deq_scale(columns), dst_dtype="float16")
    assert classic.dims == ("batch", "token", "channel") and token.dims == ("channel", "token", "batch")
    assert isinstance(classic.data, da.Array if backend == "dask" else np.ndarray)
    assert_same(classic.values, _expected(values, columns.values, np.float32))
    assert_same(packed.values, _expected(values, columns.values, np.float16))
    per_row = per_token.transpose("batch", "token").values[..., None]
    assert_same(token.transpose("batch", "token", "channel").values, _expected(values, per_row, np.float16))
    per_group = np.repeat(groups.values, 32, axis=-1)
    assert_same(grouped.values, _expected(values, per_group, ops.dtypes.bfloat16))
    xr.testing.assert_identical(classic.coords.to_dataset(), src.coords.to_dataset())
    assert classic.attrs["units"] == "count"


def test_dequant_dims_and_dtype_refusals_show_the_way():
    src = xr.DataArray(np.zeros((2, 3, 64), np.int32), dims=("batch", "token", "channel"))
    scale = xr.DataArray(np.ones(64, np.float32), dims="channel")
    with pytest.raises(InvalidArgument, match=r"deq_scale=ops\.pack_deq_scale\(scale\)"):
        src.ops.ascend_dequant(scale, dst_dtype="float16")
    rows = xr.DataArray(np.ones((1, 3, 64), np.float32), dims=("bgroup", "token", "channel"))  # groups of batch
    with pytest.raises(DimensionError, match=r"needs a 2-D src; .* src\.stack\(rows=\[\.\.\.\]\)\.ops\.ascend_dequant"):
        src.ops.ascend_dequant(rows, dst_dtype="float32", policy="per_group", group_size=32)
    with pytest.raises(DimensionError, match=r"per_token deq_scale has every dim of src .* but the column dim; got dims \('token',\)"):
        src.ops.ascend_dequant(xr.DataArray(np.ones(3, np.float32), dims="token"), dst_dtype="float32", policy="per_token")
    with pytest.raises(InvalidArgument, match=r"deq_scale dim 'token' has 4 entries, src dim 'token' has 3"):
        src.ops.ascend_dequant(xr.DataArray(np.ones((2, 4), np.float32), dims=("batch", "token")),
                               dst_dtype="float32", policy="per_token")
    with pytest.raises(InvalidArgument, match=r"src dtype must be int32 without a policy, got float64"):
        src.astype(np.float64).ops.ascend_dequant(1.0, dst_dtype="float32")
    ds = xr.Dataset({"acc": src, "mask": src.astype(bool), "other": ("k", np.zeros(3, np.int32))})
    out = ds.ops.ascend_dequant(scale, dst_dtype="float32")
    assert out["acc"].dtype == np.float32 and out["mask"].dtype == bool and out["other"].dtype == np.int32


@pytest.mark.parametrize("backend", ["numpy", "dask"])
def test_one_dim_accessor_and_function_agree(backend):
    values = np.arange(-8, 8, dtype=np.int32)
    src = xr.DataArray(values if backend == "numpy" else da.from_array(values, chunks=4), dims="channel")
    scale = np.float32(0.25)
    out = src.ops.ascend_dequant(scale, dst_dtype="float32")
    plain = ops.ascend_dequant(src.data, scale, dst_dtype="float32")
    assert out.dims == ("channel",) and plain.shape == (16,)
    assert_same(out.values, np.asarray(plain))
    assert_same(out.values, _expected(values, scale, np.float32))


def test_pack_deq_scale_keeps_dims_of_a_dataarray():
    scale = xr.DataArray(np.array([0.5, 2.0], np.float32), dims="channel", coords={"channel": ["a", "b"]})
    packed = ops.pack_deq_scale(scale, offset=3)
    assert packed.dims == ("channel",) and packed.dtype == np.uint64 and list(packed["channel"].values) == ["a", "b"]
    back, offset = ops.unpack_deq_scale(packed)
    xr.testing.assert_identical(back, scale)
    assert offset.dims == ("channel",) and offset.values.tolist() == [3, 3]


def test_version():
    assert ops.__version__ == importlib.metadata.version("chunked-tensor-ops")
    assert "__version__" in ops.__all__


def test_a_misspelled_keyword_is_not_taken_for_a_dim():
    x = xr.DataArray(np.zeros((1, 4, 4)), dims=("time", "y", "x"))
    with pytest.raises(InvalidArgument, match=r"'padings' is neither a dim of the array \('time', 'y', 'x'\) nor a "
                                              r"parameter of space_to_batch_nd; did you mean paddings=\?"):
        x.ops.space_to_batch_nd(y=2, x=2, padings={"y": (1, 1)})
    with pytest.raises(InvalidArgument, match="did you mean crops="):
        x.ops.batch_to_space_nd(y=2, x=2, crop={"y": (1, 1)})


@pytest.mark.parametrize("dims, call", [
    (("time", "lat", "lon"), lambda a: a.ops.space_to_depth(2)),
    (("time", "lat", "lon"), lambda a: a.ops.space_to_depth(2, mode="CRD")),
    (("band", "y", "x"), lambda a: a.ops.space_to_batch_nd(y=2, x=2)),
    (("band", "y", "x"), lambda a: a.ops.batch_to_space_nd(y=1, x=1)),
])
def test_the_advice_for_a_missing_batch_or_channel_dim_works_as_written(dims, call):
    """A field without a channel dim, a raster without a batch dim: the error says which
    expand_dims call adds it, and that call, run as written, makes the operator work."""
    arr = xr.DataArray(np.arange(48.0).reshape(3, 4, 4), dims=dims)
    with pytest.raises(MissingDims) as caught:
        call(arr)
    advice = re.search(r"arr\.((?:expand_dims\([^)]*\)\.?)+)\.ops\.", str(caught.value))
    assert advice, caught.value
    fixed = eval(f"arr.{advice.group(1)}", {"arr": arr})  # the advice, verbatim
    out = call(fixed)
    assert set(out.dims) == set(fixed.dims)
