"""What one stored array may cost (``Budgets``): chunks, inner chunks of a shard, the decoded
size of a chunk, strings and the disk quota, as the settings of the same names set them; and
the wording every refusal shares, which names the limit and the setting that raises it
(``over``).

Uploads (NPY and zipped Zarr), ``?chunks=`` and results are checked against them before any
work.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields

from service.settings import ENV_PREFIX, Settings


def over(setting: str, limit: int) -> str:
    """``more than the LIMIT of the SETTING setting (CHUNKED_TENSOR_OPS_SETTING)``: how a
    refusal names the limit it met and how to raise it."""
    return f"more than the {limit} of the {setting} setting ({ENV_PREFIX}{setting.upper()})"


def chunk_count(shape: Sequence[int], chunks: Sequence[int]) -> int:
    """The chunks of a regular grid; an axis of length 0 counts as 1, so that a zero-length
    axis does not hide the other axes' count (a Dask graph and a chunk grid are built along
    every axis, empty or not)."""
    return math.prod(-(-max(n, 1) // c) for n, c in zip(shape, chunks))


@dataclass(frozen=True)
class Budgets:
    """The per-array budgets of the service (each the setting of the same name).

    Attributes
    ----------
    max_chunks : int
        Chunks of one stored array (an axis of length 0 counts as 1).
    max_shard_chunks : int
        Inner chunks of one shard of a sharded array.
    max_chunk_bytes : int
        Decoded bytes of one chunk (of one shard, for a sharded array).
    max_string_bytes : int
        Bytes of one string of a string array.
    max_strings_bytes : int
        Bytes of all the strings of one string array.
    disk_quota_bytes : int or None
        Bytes of all stored arrays together; None: no quota.
    """

    max_chunks: int
    max_shard_chunks: int
    max_chunk_bytes: int
    max_string_bytes: int
    max_strings_bytes: int
    disk_quota_bytes: int | None

    @classmethod
    def of(cls, settings: Settings | None = None, **overrides) -> Budgets:
        """The budgets of ``settings`` (a ``service.settings.Settings``; None: the settings'
        defaults), with ``overrides``."""
        values = {f.name: getattr(settings, f.name) if settings is not None else Settings.model_fields[f.name].default
                  for f in fields(cls)}
        return cls(**{**values, **overrides})

    def over(self, setting: str) -> str:
        """``over(setting, its value)``."""
        return over(setting, getattr(self, setting))

    def check_grid(self, what: str, shape: Sequence[int], chunks: Sequence[int], itemsize: int,
                   error: Callable[[str], Exception]) -> None:
        """Raise ``error(detail)`` when ``chunks`` cut ``shape`` into more than ``max_chunks``
        chunks or one chunk of ``itemsize``-byte elements is more than ``max_chunk_bytes``."""
        count = chunk_count(shape, chunks)
        if count > self.max_chunks:
            raise error(f"{what}: chunks {list(chunks)} cut shape {list(shape)} into {count} chunks, "
                        f"{self.over('max_chunks')}")
        nbytes = math.prod(chunks) * itemsize
        if nbytes > self.max_chunk_bytes:
            raise error(f"{what}: a chunk of {list(chunks)} x {itemsize} bytes is {nbytes} bytes, "
                        f"{self.over('max_chunk_bytes')}")
