"""Tensor rearrangement operators as chunk-aware Dask graph builders (see SPEC.md).

Each public function takes a NumPy array (and returns the computed NumPy result) or a Dask
array (and returns a lazy Dask array built block by block, never materialising the input).
"""

from ops import dtypes, errors
from ops.depth_space import depth_to_space, space_to_depth
from ops.errors import InvalidArgument
from ops.space_batch import batch_to_space_nd, space_to_batch, space_to_batch_nd

__all__ = [
    "InvalidArgument",
    "batch_to_space_nd",
    "depth_to_space",
    "dtypes",
    "errors",
    "space_to_batch",
    "space_to_batch_nd",
    "space_to_depth",
]
