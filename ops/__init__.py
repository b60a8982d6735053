"""Tensor rearrangement, gather and dequantisation operators as chunk-aware Dask graph builders (see docs/operators.md).

Each public function takes a NumPy array (and returns the computed NumPy result) or a Dask
array (and returns a lazy Dask array built block by block, never materialising the input).
"""

from importlib import metadata as _metadata

from ops import accessor, dtypes, errors  # the accessor package registers DataArray.ops, Dataset.ops
from ops.accessor import CoordinateDropped
from ops._fused_stores import fusing_stores
from ops._limits import limits
from ops._scratch import scratch
from ops.dequant import ascend_dequant, pack_deq_scale, unpack_deq_scale
from ops.depth_space import depth_to_space, space_to_depth
from ops.errors import InvalidArgument
from ops.gather_nd import gather_nd
from ops.space_batch import batch_to_space_nd, space_to_batch, space_to_batch_nd

try:
    __version__ = _metadata.version("chunked-tensor-ops")
except _metadata.PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "__version__",
    "accessor",
    "CoordinateDropped",
    "InvalidArgument",
    "ascend_dequant",
    "batch_to_space_nd",
    "depth_to_space",
    "dtypes",
    "errors",
    "fusing_stores",
    "gather_nd",
    "limits",
    "pack_deq_scale",
    "scratch",
    "space_to_batch",
    "space_to_batch_nd",
    "space_to_depth",
    "unpack_deq_scale",
]
