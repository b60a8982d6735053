"""Stable reads of an object store data root: the version of an array that readers in this
process hold (a pin), removed, once replaced or deleted, when the last one lets go."""

from __future__ import annotations

import itertools
import weakref
from dataclasses import dataclass

from zarr.storage import FsspecStore

from service.storage.readers import Readers


@dataclass
class Version:
    """One array version's prefix (``versions/<id>``); ``published`` once a pointer names it,
    after which ``discard`` leaves it alone."""

    id: str
    path: str           # bucket/prefix/versions/<id>, as s3fs names it
    published: bool = False

    @property
    def url(self) -> str:
        return f"s3://{self.path}"


class VersionPin:
    """One reader's hold on one version, released when the last object referring to it
    (a Zarr store, a key being served) is garbage-collected."""

    _serial = itertools.count()

    def __init__(self, pins: VersionPins, version: Version):
        self.version = version
        self.serial = next(self._serial)
        weakref.finalize(self, pins.release, version.id)


class VersionPins:
    """Versions being read in this process, and the replaced or deleted ones whose removal
    waits for their last reader."""

    def __init__(self, remove):
        # remove(version) blocks on the store; at shutdown the next start-up sweep removes it.
        self._readers: Readers[str, Version] = Readers(remove, "remove-replaced-version", remove_at_shutdown=False)

    def pin(self, version: Version) -> VersionPin:
        self._readers.hold(lambda: (version.id, None))
        return VersionPin(self, version)

    def release(self, version_id: str) -> None:
        """A pin's finalizer (any thread, maybe the event loop's): never raises or blocks."""
        self._readers.release(version_id)

    def dispose(self, version: Version) -> None:
        """Remove a version no pointer names any more: now, or when its last reader lets go."""
        self._readers.dispose(version.id, version)

    def waiting(self) -> list[Version]:
        return self._readers.waiting()


class PinnedFsspecStore(FsspecStore):
    """A read-only FsspecStore on one version that keeps its pin while it, or a copy of it,
    is referenced (by xarray, zarr, a Dask graph run in this process)."""

    def __init__(self, fs, *, pin: VersionPin, path: str = "/", read_only: bool = True,
                 allowed_exceptions=None):
        kwargs = {} if allowed_exceptions is None else {"allowed_exceptions": allowed_exceptions}
        super().__init__(fs, path=path, read_only=True, **kwargs)
        self.pin = pin

    def with_read_only(self, read_only: bool = False):
        return type(self)(self.fs, pin=self.pin, path=self.path, allowed_exceptions=self.allowed_exceptions)
