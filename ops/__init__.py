"""Tensor rearrangement, gather and dequantisation operators as chunk-aware Dask graph builders (see SPEC.md).

Each public function takes a NumPy array (and returns the computed NumPy result) or a Dask
array (and returns a lazy Dask array built block by block, never materialising the input).
"""

from ops import accessor, dtypes, errors  # accessor: registers DataArray.ops / Dataset.ops
from ops.dequant import ascend_dequant
from ops.depth_space import depth_to_space, space_to_depth
from ops.errors import InvalidArgument
from ops.gather_nd import gather_nd
from ops.space_batch import batch_to_space_nd, space_to_batch, space_to_batch_nd

__all__ = [
    "accessor",
    "InvalidArgument",
    "ascend_dequant",
    "batch_to_space_nd",
    "depth_to_space",
    "dtypes",
    "errors",
    "gather_nd",
    "space_to_batch",
    "space_to_batch_nd",
    "space_to_depth",
]
