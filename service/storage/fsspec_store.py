"""The Zarr store jobs write an object store through: zarr's ``FsspecStore``, minus one copy.

zarr's ``FsspecStore.set`` hands the file system ``value.to_bytes()``, a copy of the encoded
chunk, although the codec (zstd) produced an immutable ``bytes`` object that zarr only wraps.
For a worker writing 16 MiB chunks that is 16 MiB more held during every write, on workers
whose memory the operators' plans are sized to (measured on a local S3 server: 43 -> 29 MiB
allocated to store one 16 MiB chunk). ``ObjectStore`` passes that ``bytes`` object itself
when the buffer is exactly it, and anything else (an uncompressed chunk, a view) is copied
as zarr does.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys

from zarr.core.buffer import Buffer, cpu
from zarr.storage import FsspecStore


class _WholeBytes(cpu.Buffer):
    """A buffer over an immutable ``bytes`` object whose ``to_bytes`` is that object (a
    buffer made from it, a slice say, has no ``data`` and copies as usual)."""

    def __init__(self, array, data: bytes | None = None):
        super().__init__(array)
        self._bytes = data

    def to_bytes(self) -> bytes:
        return super().to_bytes() if self._bytes is None else self._bytes


def _whole_bytes(value: Buffer) -> Buffer:
    """``value``, or the same bytes as a ``_WholeBytes`` when it wraps a whole ``bytes`` object."""
    if not isinstance(value, cpu.Buffer):
        return value
    array = value.as_numpy_array()
    data = array.base
    # type() and not isinstance: a bytes subclass could be mutable underneath. A forward,
    # contiguous byte view of it as long as it is the whole object.
    if type(data) is bytes and array.ndim == 1 and array.strides == (1,) and array.nbytes == len(data):
        return _WholeBytes(array, data)
    return value


class ObjectStore(FsspecStore):
    """``FsspecStore`` that stores an encoded chunk's ``bytes`` without copying it first."""

    async def set(self, key: str, value: Buffer, byte_range: tuple[int, int] | None = None) -> None:
        await super().set(key, _whole_bytes(value), byte_range)


def close_sessions(timeout: float = 5.0) -> None:
    """Close the HTTP sessions of this process's cached s3fs file systems, each on the event
    loop it was opened in.

    s3fs closes none of the sessions of the asynchronous file systems Zarr opens, and its
    finalizer for the others no longer reaches aiobotocore's sessions (fsspec/s3fs#943): a
    worker process that ends reports each one left open as "Unclosed client session" on
    stderr. Closing an aiohttp session twice is harmless, so s3fs's own finalizer may still run.
    """
    s3fs = sys.modules.get("s3fs")
    if s3fs is None:  # this process never opened an object store
        return
    by_loop: dict[asyncio.AbstractEventLoop, list] = {}
    for fs in list(s3fs.S3FileSystem._cache.values()):
        http = getattr(getattr(getattr(fs, "_s3", None), "_endpoint", None), "http_session", None)
        for session in (getattr(http, "_sessions", None) or {}).values():
            loop = getattr(session, "_loop", None)
            if loop is not None and not session.closed and not loop.is_closed():
                by_loop.setdefault(loop, []).append(session)
    for loop, sessions in by_loop.items():
        async def close(sessions=sessions) -> None:
            for session in sessions:
                await session.close()

        with contextlib.suppress(Exception):  # a teardown: nothing here may fail a worker's exit
            if not loop.is_running():
                loop.run_until_complete(close())
            elif loop is not _running_loop():
                asyncio.run_coroutine_threadsafe(close(), loop).result(timeout)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
