"""SpaceToBatch(ND) and BatchToSpaceND: the NumPy kernels and the Dask builders.

Both operators pair a *space* array ``[B, s_1..s_M, rest...]`` with a *batch* array
``[P*B, t_1..t_M, rest...]`` (``P = prod(block_shape)``): batch group ``g`` (block offsets
``j``, ``g = ravel(j)``) holds the space rows ``r`` with ``r + offset = t*b + j`` on every
spatial axis, where ``offset`` is the leading padding (SpaceToBatch) or leading crop
(BatchToSpace).

One concern per module, dependencies pointing down the list:

- ``api``: the public functions and the validation of their arguments.
- ``graph_space_to_batch``, ``graph_batch_to_space``: the Dask graph strategies of each
  direction and the rule that picks one; ``graph``: what both share.
- ``plan``: the chunk plans, pure functions of chunk tuples.
- ``kernel``: the NumPy kernels and the per-block functions the tasks call (no Dask).
"""

from ops.space_batch.api import batch_to_space_nd, space_to_batch, space_to_batch_nd
from ops.space_batch.kernel import batch_to_space_nd_kernel, space_to_batch_nd_kernel
from ops.space_batch.plan import batch_to_space_nd_chunks, space_to_batch_nd_chunks

__all__ = [
    "batch_to_space_nd",
    "batch_to_space_nd_chunks",
    "batch_to_space_nd_kernel",
    "space_to_batch",
    "space_to_batch_nd",
    "space_to_batch_nd_chunks",
    "space_to_batch_nd_kernel",
]
