"""The xarray accessors: importing this package registers ``DataArray.ops`` and ``Dataset.ops``.

One module a concern: ``dataarray`` (``DataArray.ops``: the public methods and their reference
docstrings), ``dataset`` (``Dataset.ops``: each method on every data variable that has the dims)
and ``docstrings`` (the Dataset methods' docstrings, made from the DataArray methods');
``named_rearrange``, ``named_gather`` and ``named_dequant`` (the operators on dims by name);
``coords`` and ``coord_values`` (the coordinates of the results); ``history``
(``attrs["ops_history"]`` and ``invert``); ``conventions`` (xarray's conventions: keyword
forms, ``keep_attrs``, errors in dim names, the ``repr``); ``named_calls`` (the registry's
adapters that send DataArray inputs through ``DataArray.ops``).
"""

from ops.accessor.coords import CoordinateDropped
from ops.accessor.dataarray import OpsAccessor
from ops.accessor.dataset import OpsDatasetAccessor

__all__ = ["CoordinateDropped", "OpsAccessor", "OpsDatasetAccessor"]
