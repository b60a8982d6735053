"""Stable reads of a local data root: an array directory held open (``/proc/self/fd/N``) by
the readers in this process, and removed, once replaced or deleted, when the last one lets go.
"""

from __future__ import annotations

import itertools
import os
import shutil
import weakref
from pathlib import Path

import zarr

from service.storage.readers import Readers

PROC_FD = Path("/proc/self/fd")


class Pin:
    """One reader's hold on one array directory: an open descriptor of it, so that
    ``path`` (``/proc/self/fd/N``) names that directory wherever it is moved; released (the
    descriptor closed, the count dropped) when the last object referring to it is gone."""

    _serial = itertools.count()

    def __init__(self, pins: Pins, key: tuple[int, int], fd: int):
        self.key, self.fd = key, fd
        self.path = PROC_FD / str(fd)
        self.serial = next(self._serial)
        weakref.finalize(self, pins.release, key, fd)


class Pins:
    """Array directories being read in this process, counted by (device, inode), and the
    replaced or deleted ones whose removal waits for their last reader."""

    def __init__(self):
        self.supported = PROC_FD.is_dir()
        self._readers: Readers[tuple[int, int], Path] = Readers(
            lambda path: shutil.rmtree(path, ignore_errors=True), "remove-replaced-array", remove_at_shutdown=True)

    def pin(self, path: Path) -> Pin:
        """Hold the directory at ``path`` (FileNotFoundError if there is none). Opened under the
        registry's lock, so that ``dispose`` of a directory moved away after this open sees
        the count."""
        def open_directory() -> tuple[tuple[int, int], int]:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            stat = os.fstat(fd)
            return (stat.st_dev, stat.st_ino), fd

        key, fd = self._readers.hold(open_directory)
        return Pin(self, key, fd)

    def release(self, key: tuple[int, int], fd: int) -> None:
        """A pin's finalizer (any thread, maybe inside garbage collection): never raises."""
        try:
            os.close(fd)
        except OSError:
            pass
        self._readers.release(key)

    def dispose(self, path: Path) -> None:
        """Remove ``path`` (a replaced or deleted group, moved under tmp/) now, or when the last
        reader holding it lets go."""
        try:
            stat = os.stat(path)
        except OSError:
            return
        self._readers.dispose((stat.st_dev, stat.st_ino), path)

    def waiting(self) -> list[Path]:
        """Replaced or deleted groups kept for their readers (for tests)."""
        return self._readers.waiting()


class PinnedStore(zarr.storage.LocalStore):
    """A read-only Zarr LocalStore on a pinned directory (``/proc/self/fd/N``) that keeps the
    pin while it, or a copy of it, is referenced (by xarray, zarr, a Dask graph)."""

    def __init__(self, root, *, pin: Pin, read_only: bool = True):
        super().__init__(root, read_only=True)  # always: an input is never written through it
        self.pin = pin

    def with_read_only(self, read_only: bool = False):
        return type(self)(self.root, pin=self.pin)

    def __dask_tokenize__(self):
        # /proc/self/fd/N is reused by later pins: name the graph after this pin, not the path.
        return ("pinned-array-store", self.pin.key, self.pin.serial)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PinnedStore) and other.pin is self.pin

    __hash__ = object.__hash__
