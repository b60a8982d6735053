"""Whether the compiled (numba) kernels run here, or their NumPy equivalents.

numba and the code of the kernels cost a process about 100 MiB once loaded. On a Dask worker
with a small memory limit that is the room its blocks need: above distributed's spill line
(70% of the limit, measured: a 384 MiB worker sat at 240-290 MiB with numba loaded) every
block a task keeps for a later task is written to disk and read back. So under the default
Dask config ``chunked-tensor-ops.compiled-kernels: auto``, a worker whose memory limit is under
1 GiB uses the NumPy path unless numba is loaded there already (then it is paid for);
``true`` or ``false`` decide for every process (``DASK_CHUNKED_TENSOR_OPS__COMPILED_KERNELS``
on the workers). Both paths give the same bits.
"""

from __future__ import annotations

import sys

import dask

from ops.errors import InvalidArgument

#: Dask config key: "auto" (the default), true or false.
COMPILED_KEY = "chunked-tensor-ops.compiled-kernels"
#: Under "auto", a Dask worker with a memory limit below this uses the NumPy paths.
SMALL_WORKER_BYTES = 2**30


def use_compiled_kernels() -> bool:
    """Whether this process runs the compiled (numba) kernels or their NumPy equivalents."""
    setting = dask.config.get(COMPILED_KEY, "auto")
    if setting is True or setting is False:
        return setting
    if setting != "auto":
        raise InvalidArgument(
            f"dask config {COMPILED_KEY} must be 'auto', true or false, got {setting!r}"
        )
    return "numba" in sys.modules or not _on_small_worker()


def _on_small_worker() -> bool:
    """Whether this code runs in a Dask worker whose memory limit is below SMALL_WORKER_BYTES."""
    distributed = sys.modules.get("distributed")  # not imported: not a worker
    if distributed is None:
        return False
    try:
        worker = distributed.get_worker()
    except ValueError:
        return False
    limit = getattr(getattr(worker, "memory_manager", None), "memory_limit", None)
    return bool(limit) and limit < SMALL_WORKER_BYTES
