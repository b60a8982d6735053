"""Job progress from the scheduler's own count of finished tasks.

These functions run *on the scheduler* (``Client.run_on_scheduler``): each job gets one of
distributed's ``Progress`` plugins, which walks the job's task graph on the scheduler and
removes a key when its task finishes. The module is pickled by value, so a scheduler that
does not have this package installed (an existing cluster) runs them too.
"""

from __future__ import annotations

import sys

import cloudpickle
from distributed.diagnostics.progress import Progress

_PREFIX = "chunked-tensor-ops-job-"


async def start(dask_scheduler, key, job_id: str) -> int:
    """Track every task the result ``key`` depends on; return how many there are."""
    progress = Progress([key], dask_scheduler, complete=True, name=_PREFIX + job_id)
    await progress.setup()
    return len(progress.all_keys)


def count(dask_scheduler, job_id: str):
    """(all tasks, tasks not yet finished) of a tracked job, or None when it stopped tracking."""
    progress = dask_scheduler.plugins.get(_PREFIX + job_id)
    if progress is None or progress.keys is None:
        return None
    return len(progress.all_keys), len(progress.keys)


def stop(dask_scheduler, job_id: str) -> None:
    progress = dask_scheduler.plugins.get(_PREFIX + job_id)
    if progress is not None:
        progress.stop()


cloudpickle.register_pickle_by_value(sys.modules[__name__])
