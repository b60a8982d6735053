"""The array store of a local data root: every array is a Zarr v3 group under
``<data root>/arrays/<name>`` (``ArrayStore``).

A group holds one data variable (named after the array for NPY uploads and results, or as
it was in an uploaded xarray store) with xarray's ``dimension_names``, its coordinates and
attrs, and consolidated metadata in the root ``zarr.json``, so ``xarray.open_zarr`` reads it
over HTTP. Zarr v3 has no bfloat16 or complex32: those are stored as their raw bits
(``service.storage.raw_dtypes``).

Nothing appears half-written: every array is built under ``<data root>/tmp`` and moved into
place with one ``rename``; an existing array is replaced by swapping the two groups in one
``renameat2(RENAME_EXCHANGE)`` (``ArrayStore.publish``, ``service.storage.publish``), so a
reader sees the old array or the new one, never a mix and never a missing name. Reads in this
process hold the version they started on (``ArrayStore.open(pinned=True)``,
``service.storage.pins``) until they finish.

A data root in an object store (``s3://bucket/prefix``) is ``service.storage.s3.ObjectArrayStore``:
the same groups and the same interface (``service.storage.protocol.ArrayStorage``), with
versions and pointer objects instead of directories and renames (docs/storage.md). What the
two share is ``service.storage.base.StoreBase``: an array is built at a *location*
(``new_version``), written through ``zarr_target``, made visible by ``publish`` and, if it
never was, removed by ``discard``.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import zarr

from service.errors import bad_request, no_such_array
from service.storage.base import KeyPieces, StoreBase, key_parts, open_variable
from service.storage.budgets import Budgets
from service.storage.metadata import Located, located
from service.storage.names import NAME, check_name
from service.storage.pins import PinnedStore, Pins
from service.storage.publish import publish_group
from service.storage.variables import StoredVariable


def _entries(folder: Path) -> Iterator[os.DirEntry]:
    """Every entry under ``folder``, depth first, not following symbolic links; a folder
    removed meanwhile (an array deleted) has none."""
    folders = [folder]
    while folders:
        try:
            with os.scandir(folders.pop()) as entries:
                for entry in entries:
                    yield entry
                    if entry.is_dir(follow_symlinks=False):
                        folders.append(Path(entry.path))
        except FileNotFoundError:
            continue


@dataclass
class LocalKey(KeyPieces):
    """A Zarr key of a local array: its file (``service.storage.protocol.StoredKey``).

    Attributes
    ----------
    local_path : Path
        The key's file, which the HTTP route serves as it is.
    size : int
        Its length in bytes.
    """

    local_path: Path
    size: int

    @property
    def name(self) -> str:
        return self.local_path.name

    def read(self, start: int, end: int) -> bytes:
        """Bytes ``start`` to ``end`` (exclusive) of the file."""
        with open(self.local_path, "rb") as file:
            file.seek(start)
            return file.read(max(0, end - start))


class ArrayStore(StoreBase):
    """Arrays as Zarr v3 groups under one local data root (``service.storage.protocol.ArrayStorage``).
    Every method is blocking (run it in a thread from async code).

    Parameters
    ----------
    root : Path
        The data root: ``arrays/`` holds the arrays, ``tmp/`` what is being built, and the
        job records live in the root itself.
    chunk_bytes, max_upload_bytes, budgets
        As for ``service.storage.base.StoreBase``.
    """

    def __init__(self, root: Path, *, chunk_bytes: int, max_upload_bytes: int, budgets: Budgets | None = None):
        root = Path(root).resolve()
        super().__init__(root, root, chunk_bytes=chunk_bytes, max_upload_bytes=max_upload_bytes, budgets=budgets)
        self.arrays = self.root / "arrays"
        self.arrays.mkdir(parents=True, exist_ok=True)
        self._pins = Pins()

    # --- names and paths ------------------------------------------------------------------

    def path(self, name: str) -> Path:
        """The group path of ``name``, checked to stay inside the data root."""
        check_name(name)
        path = self.arrays / name
        if (path.is_symlink() or (path / "zarr.json").is_symlink()
                or (path.exists() and not path.resolve().is_relative_to(self.arrays))):
            raise bad_request(f"array name {name!r} does not resolve inside the data root")
        return path

    @staticmethod
    def _refuse_links(name: str, group: Path) -> None:
        """Refuse a group holding a symbolic link (the service never makes one, uploads cannot):
        reading through it could leave the data root. One directory scan, before any chunk is read."""
        for entry in _entries(group):
            if entry.is_symlink():
                raise bad_request(f"array name {name!r} does not resolve inside the data root "
                                  f"(it holds a symbolic link, {entry.name!r})")

    def stored_bytes(self, name: str | None = None) -> int:
        """The bytes of the files of every stored array (of array ``name``, when given)."""
        return sum(entry.stat(follow_symlinks=False).st_size
                   for entry in _entries(self.arrays if name is None else self.path(name))
                   if entry.is_file(follow_symlinks=False))

    def exists(self, name: str) -> bool:
        path = self.path(name)
        return (path / "zarr.json").is_file()

    def locate(self, name: str, path: Path | None = None) -> Located:
        """The array ``name`` as its consolidated metadata describes it (read from ``path``,
        a pinned directory, when given)."""
        path = self.path(name) if path is None else path
        if not (path / "zarr.json").is_file():
            raise no_such_array(name)
        return located(name, path, json.loads((path / "zarr.json").read_text()))

    def new_version(self, prefix: str) -> Path:
        """A new, empty location to build one array in, for ``publish``."""
        return self.temp_dir(prefix)

    def zarr_target(self, location: Path, sub: str = ""):
        """What Zarr / xarray write to for ``location`` (joined with ``sub``)."""
        return location / sub if sub else location

    def discard(self, location: Path) -> None:
        """Remove a location that was not published (a no-op once it was)."""
        shutil.rmtree(location, ignore_errors=True)

    # --- reading --------------------------------------------------------------------------

    def open(self, name: str, chunks=None, *, pinned: bool = False, decoded: bool = False) -> StoredVariable:
        """The stored array as a lazy (Dask-backed) DataArray with its real dtype, opened
        read-only (a read-only Zarr store: nothing computed from it can write the input), with
        its group's attrs and companions (``StoredVariable``). ``decoded``: CF-decoded, as a
        job computes on it (``service.storage.variables``); else the stored values.

        ``pinned=False`` (graphs that the cluster's workers run, in other processes): the graph
        reads the group by its path. Replacing or deleting an array that a running job reads is
        refused (409), so the path keeps its version for the job.

        ``pinned=True`` (reads in this process: the NPY download, a job's inline result): the
        graph reads the version current at this call, through an open descriptor of its
        directory (``/proc/self/fd/N``), however long the read lasts. An overwrite or a delete
        meanwhile moves that directory aside, and ``publish``/``delete`` remove it only when the
        last such reader has let go: the pin lives as long as the Zarr store object that the
        DataArray and its graph refer to (released when they are garbage-collected). So a
        download that began before an overwrite streams the old array to its end, never a mix.
        Where there is no ``/proc`` this falls back to reading by path.
        """
        path = self.path(name)
        if pinned and self._pins.supported:
            try:
                pin = self._pins.pin(path)
            except (FileNotFoundError, NotADirectoryError):
                raise no_such_array(name) from None
            found = self.locate(name, pin.path)
            source = PinnedStore(pin.path, pin=pin)
        else:
            found = self.locate(name)
            source = zarr.storage.LocalStore(found.path, read_only=True)
        self._refuse_links(name, found.path)
        return open_variable(source, found.variable, chunks, decoded=decoded)

    def names(self) -> list[str]:
        return sorted(p.name for p in self.arrays.iterdir()
                      if NAME.fullmatch(p.name) and not p.name.startswith(".") and (p / "zarr.json").is_file())

    def open_key(self, name: str, key: str) -> LocalKey | None:
        """Zarr key ``key`` of array ``name`` for the HTTP route: its file, or None when
        there is none (or the key would lead outside the array)."""
        found = self.path(name)
        if not (found / "zarr.json").is_file():
            raise no_such_array(name)
        parts = key_parts(key)
        if parts is None:
            return None
        path = found.joinpath(*parts)
        if path.is_symlink() or not path.is_file() or not path.resolve().is_relative_to(found.resolve()):
            return None
        return LocalKey(path, path.stat().st_size)

    # --- writing --------------------------------------------------------------------------

    def publish(self, built: Path, name: str, overwrite: bool) -> None:
        """Move the group built at ``built`` (under tmp/) to ``name``; 409 if the name is taken
        and ``overwrite`` is false.

        A new name appears whole in one ``renameat2(RENAME_NOREPLACE)``, so of two publishers
        of one name one wins and the other gets 409. An existing array is replaced by
        ``renameat2(RENAME_EXCHANGE)``: ``arrays/NAME`` goes from the old group to the new one
        in one step, so a reader finds the old array or the new one, never a missing name or
        a mix. The old group (now at ``built``) is moved aside under tmp/ and removed, at once,
        or when the last reader in this process that pinned it (``open(pinned=True)``) lets
        go. Where the C library, kernel or file system lacks renameat2, a check and a rename,
        and two renames to replace (the name absent between them), do instead.
        """
        publish_group(built, self.path(name), name, overwrite, tmp=self.tmp, dispose=self._pins.dispose)

    def delete(self, name: str) -> None:
        """Remove the array: the name disappears at once and whole (one rename under tmp/); its
        files go now, or when the last reader in this process that pinned them lets go."""
        path = self.path(name)
        if not (path / "zarr.json").is_file():
            raise no_such_array(name)
        trash = self.tmp / f"deleted-{uuid.uuid4().hex}"
        try:
            os.rename(path, trash)
        except FileNotFoundError:
            raise no_such_array(name) from None
        self._pins.dispose(trash)
