"""Scratch storage for a plan that moves its intermediate data out of band.

GatherNd with lazy indices into params larger than a few chunks is an all-to-all: every output
block needs rows from every params block. Inside a Dask graph that takes a task per (indices
block, params block) pair, and all the gathered rows sit in worker memory at once. Like
rechunker's ``temp_store``, the scratch plan instead writes the pieces to a scratch store that
every worker can reach (a local directory on one machine, or an fsspec URL such as
``s3://bucket/tmp`` on a cluster) and keeps only barrier tasks between the stages: tasks and
graph edges grow linearly with the blocks, and a task holds about one block.

BatchToSpaceND with the batch axis chunked is a smaller exchange: each output block takes a
part of one chunk of each of the P groups. Where a task cannot hold those P chunks, its
chunks go through the scratch store too: each is read once and cut into its parts there
(ops/space_batch/through_scratch.py), instead of being read (decoded, downloaded) P times.

Given to GatherNd as its ``scratch=`` argument (the service and the command line pass each
job's own), or for code that cannot pass it, set around the call with ``ops.scratch``::

    ops.gather_nd(params, indices, scratch="/fast/disk/tmp")
    ops.gather_nd(params, indices, scratch={"url": "s3://bucket/tmp",
                                            "storage_options": {"endpoint_url": ...}})
    with ops.scratch("/fast/disk/tmp"):
        ...

A gather's files live under ``<scratch>/gather_nd-<token>-<run>/`` and are removed by the last
output task that reads them.
"""

from __future__ import annotations

import bisect
import contextlib
import contextvars
import functools
import json
import mmap
import os
import tempfile
import uuid
from collections.abc import Mapping

import dask
import fsspec
from fsspec.implementations.local import LocalFileSystem

from ops.errors import InvalidArgument

CONFIG_KEY = "chunked-tensor-ops.scratch"
#: The part size of uploads to an object store (S3's minimum; a multiple of GCS's 256 KiB).
UPLOAD_PART_BYTES = 5 * 2**20
#: Files up to this size are uploaded with one request (read into memory whole): a multipart
#: upload takes at least four requests, and some servers copy the parts again to join them.
SINGLE_UPLOAD_BYTES = 4 * UPLOAD_PART_BYTES


class Scratch:
    """A directory (local path or fsspec URL) and the fsspec options to reach it.

    A plain class, not a dataclass or tuple, so that Dask passes it to tasks as it is.
    """

    def __init__(self, url: str, storage_options: Mapping | None = None):
        self.url = url
        self.storage_options = dict(storage_options or {})

    def __repr__(self) -> str:  # never the storage options: they may hold credentials
        return f"Scratch({self.url!r})"

    def child(self, name: str) -> Scratch:
        return Scratch(f"{self.url.rstrip('/')}/{name}", self.storage_options)

    def new_run(self, prefix: str) -> Scratch:
        """A directory of its own for one graph (two graphs never share files)."""
        return self.child(f"{prefix}-{uuid.uuid4().hex[:12]}")

    @property
    def _fs_root(self):
        return _filesystem(self.url, json.dumps(dict(self.storage_options), sort_keys=True, default=str))

    @property
    def local(self) -> bool:
        """True for a local directory (files take writes at any offset, ranges cost their bytes)."""
        return isinstance(self._fs_root[0], LocalFileSystem)

    def path(self, name: str) -> str:
        fs, root = self._fs_root
        return f"{root.rstrip('/')}/{name}"

    @contextlib.contextmanager
    def open_write(self, name: str):
        """A binary file that appears under ``name`` only once it is complete (readers never see
        half a file, and a task that runs twice replaces it whole)."""
        fs, _ = self._fs_root
        path = self.path(name)
        if self.local:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            partial = f"{path}.partial-{uuid.uuid4().hex[:8]}"
            try:
                with open(partial, "wb") as f:
                    yield f
                os.replace(partial, path)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(partial)
        else:  # an object store publishes an object when its upload completes
            # Upload in parts of S3's smallest part size: s3fs would otherwise buffer 50 MiB
            # of a large file in the writing task's memory before its first upload.
            f = fs.open(path, "wb", block_size=UPLOAD_PART_BYTES)
            try:
                yield f
                f.close()
            except BaseException:  # the writer's error, or the upload's own
                _abandon(f)
                raise

    @contextlib.contextmanager
    def open_write_at(self, files: list[tuple[str, int, int]]):
        """Files written at any offset, each published once all are complete.

        ``files`` are (name, start, size): consecutive ranges of one byte space, in which
        ``write_at(offset, data)`` writes (across files too). Local files are written in
        place; for an object store the bytes go to a local temporary file (the system's, or
        Dask's ``temporary-directory``) and are uploaded, a part at a time, at the end.
        """
        if not files:
            yield _WriteAt([], [])
            return
        base = files[0][1]
        if self.local:
            paths = [self.path(name) for name, _, _ in files]
            partials = [f"{path}.partial-{uuid.uuid4().hex[:8]}" for path in paths]
            fds = []
            try:
                for partial in partials:
                    os.makedirs(os.path.dirname(partial), exist_ok=True)
                    fds.append(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644))
                yield _WriteAt(fds, [start for _, start, _ in files])
                while fds:
                    os.close(fds.pop())
                for partial, path in zip(partials, paths):
                    os.replace(partial, path)
            finally:
                for fd in fds:
                    os.close(fd)
                for partial in partials:
                    with contextlib.suppress(FileNotFoundError):
                        os.remove(partial)
        else:
            with tempfile.TemporaryFile(dir=dask.config.get("temporary-directory", None)) as temporary:
                fd = temporary.fileno()
                yield _WriteAt([fd], [base])  # one file for all
                for name, start, size in files:
                    if size <= SINGLE_UPLOAD_BYTES:  # one PUT, not a multipart upload of two parts
                        self.write(name, os.pread(fd, size, start - base))
                        continue
                    with self.open_write(name) as out:
                        for offset in range(start - base, start - base + size, UPLOAD_PART_BYTES):
                            out.write(os.pread(fd, min(UPLOAD_PART_BYTES, start - base + size - offset), offset))

    def write(self, name: str, data) -> None:
        """``data`` (bytes in memory) as the whole file ``name``, published complete."""
        if self.local:
            with self.open_write(name) as f:
                f.write(data)
        else:  # one PUT (s3fs's buffered file would make a multipart upload of anything over a part)
            fs, _ = self._fs_root
            fs.pipe_file(self.path(name), data if isinstance(data, (bytes, bytearray)) else bytes(data))

    def read(self, name: str) -> bytes:
        fs, _ = self._fs_root
        with self._missing():
            return fs.cat_file(self.path(name))

    def read_view(self, name: str):
        """The bytes of ``name`` as a read-only buffer: a local file mapped into memory (no copy
        made; a task that copies the bytes on to their place reads them once), else ``read``."""
        if not self.local:
            return self.read(name)
        with self._missing(), open(self.path(name), "rb") as f:
            if not os.fstat(f.fileno()).st_size:
                return b""  # an empty file cannot be mapped
            # A scratch file is never changed in place (a rewrite replaces it and a removal
            # unlinks it), so the mapping keeps the bytes it was made with. MAP_POPULATE (Linux)
            # maps all its pages in the one call instead of a fault per page on first touch.
            if hasattr(mmap, "MAP_POPULATE"):
                return mmap.mmap(f.fileno(), 0, flags=mmap.MAP_SHARED | mmap.MAP_POPULATE, prot=mmap.PROT_READ)
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)

    def read_ranges(self, names: list[str], starts: list[int], stops: list[int]) -> list[bytes]:
        """Byte ranges [start, stop) of several files (concurrent requests on an object store)."""
        if not names:
            return []
        fs, _ = self._fs_root
        with self._missing():
            return fs.cat_ranges([self.path(n) for n in names], list(starts), list(stops), on_error="raise")

    def remove_files(self, names: list[str]) -> None:
        """Remove the files ``names``; those already gone are ignored."""
        fs, _ = self._fs_root
        paths = [self.path(name) for name in names]
        if self.local:
            for path in paths:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(path)
        elif paths:
            with contextlib.suppress(FileNotFoundError):
                fs.rm(paths)

    @contextlib.contextmanager
    def _missing(self):
        try:
            yield
        except FileNotFoundError as error:
            # A run's files are removed once taken (GatherNd's by its last output batch): a
            # task computed again after that (its worker died before the result was stored)
            # finds them gone. BatchToSpaceND's blocks read their parts from the source then.
            raise FileNotFoundError(
                f"a scratch file under {self.url} is missing ({error}): the scratch store was removed "
                "while the graph ran, or a block was recomputed after the run finished; compute it again"
            ) from None

    def mark_and_count(self, marker: str, folder: str) -> int:
        """Create the empty file ``folder/marker`` and count the complete markers in ``folder``;
        0 when the folder is gone by then."""
        fs, _ = self._fs_root
        path = self.path(f"{folder}/{marker}")
        try:
            if self.local:
                # An empty file is complete the moment it exists: no partial file to rename, which
                # another task's count could see and then remove under this one.
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "wb"):
                    pass
            else:  # one PUT publishes the object whole
                fs.pipe_file(path, b"")
            names = fs.ls(self.path(folder), detail=False)
        except FileNotFoundError:
            # Another task marked after this one, counted both markers and removed the run
            # before this one counted: the run is complete, and not this task's to remove.
            return 0
        return sum(".partial-" not in os.path.basename(name.rstrip("/")) for name in names)

    def remove(self) -> None:
        fs, root = self._fs_root
        with contextlib.suppress(FileNotFoundError):
            fs.rm(root, recursive=True)


class _WriteAt:
    """``write_at(offset, data)`` in a byte space cut into files at ``starts`` (ascending): each
    byte goes to the file whose range holds it, at its offset from that file's start."""

    def __init__(self, fds: list[int], starts: list[int]):
        self._fds = fds
        self._starts = starts

    def write_at(self, offset: int, data) -> None:
        view = memoryview(data).cast("B")
        while view.nbytes:
            k = bisect.bisect_right(self._starts, offset) - 1
            end = self._starts[k + 1] if k + 1 < len(self._starts) else offset + view.nbytes
            written = os.pwrite(self._fds[k], view[: end - offset], offset - self._starts[k])
            view, offset = view[written:], offset + written


def _abandon(f) -> None:
    """Publish nothing of an object-store file whose writer failed: fsspec's ``close`` (which
    its own ``with`` block calls on an error too) would publish what was written so far."""
    with contextlib.suppress(Exception):
        f.discard()  # s3fs: aborts the multipart upload, if one was started
    with contextlib.suppress(Exception):
        f.closed = True  # so that nothing closes (publishes) it later


@functools.lru_cache(maxsize=16)
def _filesystem(url: str, options_json: str):
    fs, root = fsspec.core.url_to_fs(url, **json.loads(options_json))
    return fs, root


def as_scratch(value, what: str = "scratch") -> Scratch | None:
    """``value`` as a Scratch: None, a local path or fsspec URL, a Scratch, or a mapping with
    ``url`` (and optional ``storage_options``). ``what`` names the value in errors."""
    if value is None or isinstance(value, Scratch):
        return value
    if isinstance(value, (str, os.PathLike)):
        return Scratch(os.fspath(value))
    if isinstance(value, Mapping) and isinstance(value.get("url"), (str, os.PathLike)):
        options = value.get("storage_options") or {}
        if not isinstance(options, Mapping):
            raise InvalidArgument(f"{what}.storage_options must be a mapping, got {type(options).__name__}")
        return Scratch(os.fspath(value["url"]), dict(options))
    # Never echo a mapping: its storage_options may hold credentials.
    got = f"a mapping with keys {sorted(map(str, value))}" if isinstance(value, Mapping) else repr(value)
    raise InvalidArgument(
        f"{what} must be a path, a URL or a mapping with 'url' (and optional 'storage_options'), got {got}"
    )


#: The scratch store ``scratch`` set for the current thread (or task), over Dask's config.
#: Dask's config is process-wide: a ``dask.config.set`` context entered by one thread (one job
#: of the service, with its own scratch) is seen by every other thread building a graph at
#: that moment, which would then put its files in that job's store.
_SET_HERE = contextvars.ContextVar("chunked_tensor_ops_scratch", default=None)


def configured() -> Scratch | None:
    """The scratch store ``scratch`` set for this thread, else the one in Dask's config
    (``chunked-tensor-ops.scratch``), or None."""
    here = _SET_HERE.get()
    if here is not None:
        return as_scratch(here, "ops.scratch")
    return as_scratch(dask.config.get(CONFIG_KEY, None), f"dask config {CONFIG_KEY}")


def scratch(url, storage_options: Mapping | None = None):
    """Use a scratch store for the plans that move data out of band (a context manager): the
    default for calls that do not pass one (``ops.gather_nd(..., scratch=...)`` wins).

    GatherNd with lazy (Dask) indices into params larger than a quarter of Dask's
    ``array.chunk-size`` is an all-to-all: with a scratch store its gathered rows go through
    files there, and its graph stays linear in the blocks with about one block per task;
    without one they go through worker memory, exchanged between groups of blocks (a
    graph linear in the blocks too, but a group's task holds its share of the rows).
    BatchToSpaceND of a chunked batch axis read from Zarr, whose P chunks per output block
    do not fit in a task together, reads each chunk once and passes its parts through files
    there, instead of reading each chunk P times. The store is read when the graph is built,
    so build inside the block (computing may happen later). Every worker must reach it: a
    local directory on one machine, or an fsspec URL (``s3://bucket/tmp``) on a cluster. A
    finished gather removes its own files, and each BatchToSpaceND output block the files of
    its parts; a failed run leaves them under ``<url>/gather_nd-*`` or as
    ``<url>/batch_to_space_nd-*``.

    Parameters
    ----------
    url : str or os.PathLike
        A local directory or an fsspec URL.
    storage_options : mapping, optional
        fsspec options for ``url`` (s3fs: ``key``, ``secret``, ``endpoint_url``, ...). They
        travel inside the graph to the workers.

    Returns
    -------
    context manager
        Sets the store for the thread (or asyncio task) that enters it, over Dask's config
        key ``chunked-tensor-ops.scratch`` (a process-wide default): graphs built at the same
        time in other threads do not see it.

    Examples
    --------
    >>> import dask, dask.array as da, numpy as np, ops, tempfile
    >>> params = da.arange(4096, chunks=256).reshape(1024, 4)
    >>> indices = da.from_array(np.array([[1023], [0], [512]]), chunks=1)
    >>> with tempfile.TemporaryDirectory() as tmp, ops.scratch(tmp), dask.config.set({"array.chunk-size": "1KiB"}):
    ...     ops.gather_nd(params, indices).compute()
    array([[4092, 4093, 4094, 4095],
           [   0,    1,    2,    3],
           [2048, 2049, 2050, 2051]])
    """
    value = {"url": os.fspath(url), "storage_options": dict(storage_options or {})}
    return _set_here(value)


@contextlib.contextmanager
def _set_here(value):
    token = _SET_HERE.set(value)
    try:
        yield
    finally:
        _SET_HERE.reset(token)
