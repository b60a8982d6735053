"""Where ``chunked-tensor-ops run`` reads and writes: a local path or an fsspec URL.

An input or output given as a URL (``s3://bucket/prefix/in.zarr``) is read and written by the
workers themselves through a Zarr ``FsspecStore`` that carries its storage options, as the
service's jobs do; nothing passes through the process that runs the command. The options come
from the same settings as the service's (``CHUNKED_TENSOR_OPS_S3_ENDPOINT_URL``, ``..._S3_KEY``,
``..._STORAGE_OPTIONS``; without keys, s3fs's own lookup: environment, profile, role).

An output appears whole or not at all. On a file system it is built in a hidden sibling and
renamed into place. An object store has no rename, so a new output is written in place with
its root ``zarr.json`` held back until every chunk is stored: before that the prefix is not a
Zarr group, and a failed run removes what it wrote. Replacing an existing output
(``--overwrite``) builds the new one in a hidden sibling prefix first, so a failed run leaves
the old one as it was; only then is the old one removed and the new one copied into place
(server-side copies), its root ``zarr.json`` last.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import dask
from zarr.storage import FsspecStore

from service.storage.fsspec_store import ObjectStore

ROOT_METADATA = "zarr.json"


def is_url(text: str) -> bool:
    """Whether ``text`` names an fsspec URL other than a local file (``s3://...``)."""
    return "://" in text and not text.startswith("file://")


def storage_options(url: str, settings) -> dict:
    """The fsspec options for ``url``: for S3 the service's s3fs options, else the settings'
    ``storage_options`` as given."""
    from service.storage.s3_config import storage_options as s3_options

    protocol = url.split("://", 1)[0]
    return s3_options(settings) if protocol in ("s3", "s3a") else dict(settings.storage_options)


def filesystem(url: str, settings):
    """``(fs, path, options)`` for ``url``, with listings never cached (a run checks what exists)."""
    import fsspec

    options = storage_options(url, settings)
    fs, path = fsspec.core.url_to_fs(url, **options, use_listings_cache=False, skip_instance_cache=True)
    return fs, path.rstrip("/"), options


def read_store(url: str, settings) -> FsspecStore:
    """A read-only Zarr store on ``url`` (it travels to the workers with its options)."""
    return FsspecStore.from_url(url, storage_options=storage_options(url, settings), read_only=True)


def url_exists(url: str, settings) -> bool:
    """Whether anything is stored under ``url`` (an object, or objects under it as a prefix)."""
    fs, path, _ = filesystem(url, settings)
    return fs.exists(path)


class HeldRootStore(ObjectStore):
    """An ``ObjectStore`` (service/storage/fsspec_store.py) that keeps the root ``zarr.json`` in
    memory instead of storing it (``held_root`` gives it to store last): until then the
    prefix is no Zarr group, whatever else is in it."""

    @classmethod
    def at(cls, url: str, options: dict) -> HeldRootStore:
        """A writable store on ``url`` (its file system asynchronous, as zarr needs it)."""
        plain = FsspecStore.from_url(url, storage_options=options, read_only=False)
        return cls(fs=plain.fs, path=plain.path, read_only=False)

    def __init__(self, *args, held: dict | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.held = {} if held is None else held

    def with_read_only(self, read_only: bool = False) -> HeldRootStore:
        return type(self)(fs=self.fs, path=self.path, allowed_exceptions=self.allowed_exceptions,
                          read_only=read_only, held=self.held)

    async def set(self, key, value, byte_range=None):
        if key == ROOT_METADATA:
            self.held[key] = value
            return
        await super().set(key, value, byte_range)

    async def get(self, key, prototype, byte_range=None):
        if key == ROOT_METADATA and key in self.held and byte_range is None:
            return self.held[key]
        return await super().get(key, prototype, byte_range)

    async def exists(self, key):
        return (key == ROOT_METADATA and key in self.held) or await super().exists(key)

    def held_root(self) -> bytes:
        """The root ``zarr.json`` that was not stored."""
        return self.held[ROOT_METADATA].to_bytes()


@runtime_checkable
class RunOutput(Protocol):
    """Where one ``chunked-tensor-ops run`` writes its output: built out of sight, then
    published whole (``LocalOutput``: a directory; ``ObjectOutput``: an fsspec URL).
    ``str(output)`` names it as the command line gave it."""

    def exists(self) -> bool:
        """Whether something is stored under the output's name already."""
        ...

    def is_input(self, text: str, settings) -> bool:
        """Whether the input named ``text`` is the output itself."""
        ...

    def parent_missing(self) -> str | None:
        """Why the output cannot be written there, or None."""
        ...

    def scratch(self, workers_local: bool = False) -> tuple[str, dict]:
        """A new location for GatherNd's intermediate files: ``(url, storage options)``."""
        ...

    def remove_scratch(self, url: str) -> bool:
        """Remove the scratch at ``url``; whether there was one."""
        ...

    def target(self) -> Any:
        """What ``to_zarr`` writes to (a path or a Zarr store)."""
        ...

    def publish(self, overwrite: bool) -> None:
        """Let the finished output appear whole (``FileExistsError`` when the name is taken
        and not ``overwrite``)."""
        ...

    def discard(self) -> bool:
        """Remove what an unfinished run wrote; whether there was anything."""
        ...


class LocalOutput:
    """An output directory (a ``RunOutput``): built as a hidden sibling, renamed into place.

    Parameters
    ----------
    text : str
        The output's path as the command line gave it.
    """

    def __init__(self, text: str):
        self.path = Path(text).absolute()
        self.built = self.path.with_name(f".{self.path.name}.tmp-{uuid.uuid4().hex[:8]}")

    def __str__(self) -> str:
        return str(self.path)

    def exists(self) -> bool:
        return self.path.exists() or self.path.is_symlink()

    def is_input(self, text: str, settings) -> bool:
        return not is_url(text) and Path(text).resolve() == self.path.resolve()

    def parent_missing(self) -> str | None:
        """Why the output cannot be written there, or None."""
        parent = self.path.parent
        return None if parent.is_dir() else f"the directory {parent} does not exist"

    def scratch(self, workers_local: bool = False) -> tuple[str, dict]:
        """A sibling for GatherNd's intermediate files: ``(url, storage options)``. (The
        workers reach it as they reach the output, on this machine or not.)"""
        return str(self.path.with_name(f".{self.path.name}.scratch-{uuid.uuid4().hex[:8]}")), {}

    def remove_scratch(self, url: str) -> bool:
        """Remove the scratch; whether there was one."""
        return _remove_local_scratch(url)

    def target(self):
        """What ``to_zarr`` writes to."""
        return str(self.built)

    def publish(self, overwrite: bool) -> None:
        """Move the finished group into place. A new name appears whole (one rename that
        fails if the name was taken meanwhile); an existing output is moved aside first and
        removed after. Raises ``FileExistsError`` when the name is taken and not ``overwrite``."""
        if self.exists():
            if not overwrite:
                raise FileExistsError(f"output {self.path} exists; pass --overwrite to replace it")
            aside = self.path.with_name(f".{self.path.name}.old-{uuid.uuid4().hex[:8]}")
            os.rename(self.path, aside)
            os.rename(self.built, self.path)
            if aside.is_dir() and not aside.is_symlink():
                shutil.rmtree(aside, ignore_errors=True)
            else:
                aside.unlink(missing_ok=True)
            return
        try:
            os.rename(self.built, self.path)
        except OSError as error:  # a directory appeared there meanwhile (ENOTEMPTY/EEXIST)
            raise FileExistsError(f"output {self.path} appeared while computing: {error}") from None

    def discard(self) -> bool:
        """Remove what an unfinished run wrote; whether there was anything."""
        if not self.built.exists():
            return False
        shutil.rmtree(self.built, ignore_errors=True)
        return True


def _remove_local_scratch(path: str) -> bool:
    """Remove a scratch directory; whether there was one."""
    if not Path(path).exists():
        return False
    shutil.rmtree(path, ignore_errors=True)
    return True


class ObjectOutput:
    """An output prefix in an object store, or any fsspec file system without rename (a
    ``RunOutput``).

    Parameters
    ----------
    url : str
        The output's URL (``s3://bucket/prefix/out.zarr``).
    settings : Settings
        Where its storage options come from (``storage_options``).
    """

    def __init__(self, url: str, settings):
        self.text = url.rstrip("/")
        self.fs, self.path, self.options = filesystem(self.text, settings)
        self.protocol = self.text.split("://", 1)[0]
        self.replacing = False
        self.built: str | None = None   # where the workers write
        self.store: HeldRootStore | None = None

    def __str__(self) -> str:
        return self.text

    def _url(self, path: str) -> str:
        return f"{self.protocol}://{path}"

    def _sibling(self, kind: str) -> str:
        parent, _, name = self.path.rpartition("/")
        return f"{parent}/.{name}.{kind}-{uuid.uuid4().hex[:8]}"

    def exists(self) -> bool:
        return self.fs.exists(self.path)

    def is_input(self, text: str, settings) -> bool:
        if not is_url(text):
            return False
        _, path, _ = filesystem(text, settings)
        return text.split("://", 1)[0] == self.protocol and path == self.path

    def parent_missing(self) -> str | None:
        bucket = self.path.split("/", 1)[0]
        if "/" not in self.path:
            return f"give a prefix inside the bucket ({self.text}/out.zarr), not the bucket itself"
        try:
            self.fs.info(bucket)  # one HEAD of the bucket on S3
        except FileNotFoundError:
            return f"the bucket {bucket} does not exist"
        except PermissionError as error:
            return f"the bucket {bucket} is not accessible: {error}"
        return None

    def scratch(self, workers_local: bool = False) -> tuple[str, dict]:
        """Where GatherNd's intermediate files go: ``(url, storage options)``. Workers on this
        machine (the embedded cluster) use a directory in Dask's ``temporary-directory`` (else
        the system's): the rows pass through the scratch twice, and local disk costs no
        request. Workers elsewhere use a prefix beside the output, which they reach."""
        if workers_local:
            base = dask.config.get("temporary-directory", None) or tempfile.gettempdir()
            return str(Path(base).absolute() / f"chunked-tensor-ops-scratch-{uuid.uuid4().hex}"), {}
        return self._url(self._sibling("scratch")), self.options

    def remove_scratch(self, url: str) -> bool:
        if not is_url(url):
            return _remove_local_scratch(url)
        path = url.split("://", 1)[1]
        if not self.fs.exists(path):
            return False
        _remove(self.fs, path)
        return True

    def target(self) -> HeldRootStore:
        """A new output is written in place; a replacement in a hidden sibling first."""
        self.replacing = self.exists()
        self.built = self._sibling("tmp") if self.replacing else self.path
        self.store = HeldRootStore.at(self._url(self.built), self.options)
        return self.store

    def publish(self, overwrite: bool) -> None:
        """Let the finished group appear: its root ``zarr.json`` stored (a replacement: the old
        output removed, root metadata first, and the new one copied into place)."""
        root = f"{self.path}/{ROOT_METADATA}"
        if not self.replacing:
            # Another run published this name meanwhile. (Two runs writing one new output at
            # once are not kept apart: their chunks share the prefix; docs/cli.md says so.)
            if self.fs.exists(root):
                self.built = None  # the prefix is the other run's output now: not ours to remove
                raise FileExistsError(f"output {self.text} appeared while computing")
            self.fs.pipe_file(root, self.store.held_root())
            self.built = None
            return
        if not overwrite:
            raise FileExistsError(f"output {self.text} exists; pass --overwrite to replace it")
        _remove(self.fs, root)  # the old group is gone as a whole first
        _remove(self.fs, self.path)
        self.fs.copy(self.built, self.path, recursive=True)
        self.fs.pipe_file(root, self.store.held_root())
        _remove(self.fs, self.built)
        self.built = None

    def discard(self) -> bool:
        if self.built is None or not self.fs.exists(self.built):
            return False
        _remove(self.fs, self.built)
        return True


def _remove(fs, path: str) -> None:
    try:
        fs.rm(path, recursive=True)
    except FileNotFoundError:
        pass


def output_for(text: str, settings) -> RunOutput:
    """The output named on the command line."""
    return ObjectOutput(text, settings) if is_url(text) else LocalOutput(text)

