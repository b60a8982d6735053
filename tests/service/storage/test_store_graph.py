"""``service.storage.variables.store_graph``: the group written as ``to_zarr`` writes it, the
data's graph left unmade until it is computed (by the scheduler, under distributed), and
its multi-output tasks storing their own blocks there."""

from __future__ import annotations

import json

import dask
import dask.array as da
import numpy as np
import pytest
import xarray as xr
import zarr
from dask.blockwise import Blockwise

import ops
from ops._lazy_layer import LazyLayer
from service.storage.variables import output_dataset, store_graph


def _field(lazy_blocks: bool = True) -> xr.DataArray:
    """A CF-packed float field with missing values and coordinates, made by BatchToSpaceND
    (bundles, whose tasks a LazyLayer makes) from a Zarr source."""
    rng = np.random.default_rng(3)
    values = rng.standard_normal((8, 6, 8, 2)).astype(np.float32)
    values[0, 1, 2, 0] = values[5, 3, 3, 1] = np.nan
    source = zarr.create_array(zarr.storage.MemoryStore(), shape=values.shape, chunks=(1, 3, 8, 2),
                               dtype=np.float32, fill_value=0)
    source[...] = values
    data = ops.batch_to_space_nd(da.from_zarr(source), [2, 2], [[0, 0], [0, 0]])
    assert isinstance(data.dask.layers[data.name], LazyLayer) == lazy_blocks
    field = xr.DataArray(data, dims=("t", "y", "x", "band"),
                         coords={"y": np.arange(12.0)[::-1], "band": ["red", "nir"]},
                         attrs={"units": "K", "grid_mapping": "crs"}, name="field")
    field.encoding = {"dtype": "int16", "scale_factor": 0.01, "add_offset": 1.0, "_FillValue": -32768}
    return field


def _written(field: xr.DataArray, how: str) -> zarr.storage.MemoryStore:
    ds, encoding = output_dataset(field, "field", (1, 2, 16, 2), {"title": "a field"},
                                  {"crs": xr.Variable((), 0, {"grid_mapping_name": "latitude_longitude"})})
    target = zarr.storage.MemoryStore()
    if how == "to_zarr":
        ds.to_zarr(target, zarr_format=3, consolidated=True, mode="w", encoding=encoding)
    else:
        dask.compute(store_graph(ds, encoding, "field", target), scheduler="sync")
    return target


def _contents(store) -> dict:
    """Every document of the store (parsed JSON) and every chunk (bytes), by key."""
    found = {}
    for key in sorted(store._store_dict):
        value = store._store_dict[key].to_bytes()
        found[key] = json.loads(value) if key.endswith(".json") else value
    return found


@pytest.mark.smoke
def test_the_group_is_what_to_zarr_writes():
    # Every metadata document, attribute, packed chunk and the consolidated metadata alike.
    field = _field()
    assert _contents(_written(field, "store_graph")) == _contents(_written(field, "to_zarr"))
    back = xr.open_zarr(_written(field, "store_graph"), zarr_format=3)
    assert np.isnan(back["field"].values).sum() == 2 and back.attrs == {"title": "a field"}


def test_the_data_graph_is_not_made_by_the_call():
    field = _field()
    ds, encoding = output_dataset(field, "field", (1, 2, 16, 2))
    graph = store_graph(ds, encoding, "field", zarr.storage.MemoryStore())
    for layer in graph.__dask_graph__().layers.values():
        if isinstance(layer, (Blockwise, LazyLayer)):
            assert not layer.is_materialized()
    assert not field.data.dask.layers[field.data.name].is_materialized()


def test_bundles_store_their_own_blocks_when_computed():
    # Optimized where it is computed, the graph's bundles write their blocks themselves (as
    # inside ops.fusing_stores; a packed field's encoding step between them keeps Dask's plan).
    field = _field()
    field.encoding = {}
    ds, encoding = output_dataset(field, "field", (1, 2, 16, 2))
    graph = store_graph(ds, encoding, "field", zarr.storage.MemoryStore())
    (optimized,) = dask.optimize(graph)
    names = {key[0] if isinstance(key, tuple) else key for key in dict(optimized.__dask_graph__())}
    assert any("-stored-" in name for name in names)


def test_a_scalar_or_in_memory_variable_goes_through_to_zarr():
    field = _field().compute()
    assert _contents(_written(field, "store_graph")) == _contents(_written(field, "to_zarr"))


def test_blocks_that_would_share_a_zarr_chunk_are_refused():
    # Written by two tasks at once without a lock, one would overwrite the other's part.
    field = _field()
    ds, encoding = output_dataset(field, "field", (1, 3, 16, 2))
    with pytest.raises(ValueError, match=r"Dask blocks \[2, 2, 2, 2, 2, 2\] on axis 1 do not end on the Zarr chunks of 3"):
        store_graph(ds, encoding, "field", zarr.storage.MemoryStore())
