"""A job's scratch location under a configured root (the ``scratch`` setting: a shared
directory or a URL), where GatherNd's all-to-all writes its intermediate files (its ``scratch``
argument). The service's jobs and ``chunked-tensor-ops run`` read the setting here alike.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable

log = logging.getLogger(__name__)


def scratch_root(settings) -> tuple[str, dict] | None:
    """The ``scratch`` setting (``CHUNKED_TENSOR_OPS_SCRATCH``) as ``(root, fsspec options)``
    (an ``s3://`` root takes the ``s3_*`` settings' options), or None when it is not set."""
    if not settings.scratch:
        return None
    from service.storage.s3_config import storage_options

    return settings.scratch, (storage_options(settings) if settings.scratch.startswith("s3://") else {})


def configured_scratch(root: str, options: dict, prefix: str) -> tuple[dict, Callable[[], None]]:
    """A job's scratch location under ``root`` (a shared directory or a URL), and its removal;
    a failed removal is logged (the start-up sweep of an S3 data root retries)."""
    import fsspec

    url = f"{root.rstrip('/')}/{prefix}{uuid.uuid4().hex}"
    fs, path = fsspec.core.url_to_fs(url, **options)

    def remove() -> None:
        try:
            fs.rm(path, recursive=True)
        except FileNotFoundError:
            pass
        except Exception as error:  # a leftover in a scratch area, not a failed job
            log.warning("could not remove the scratch %s: %s", root, type(error).__name__)

    return {"url": url, "storage_options": options}, remove
