"""The one registry of readers behind pinned reads, for a local data root and an object store
alike: what readers in this process hold, counted by key, and the replaced or deleted things
whose removal waits for their last reader (removed then off the releasing thread).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")
V = TypeVar("V")


class Readers(Generic[K, T]):
    """Reader counts by key, and the things disposed of while read.

    Parameters
    ----------
    remove : callable
        ``remove(thing)``: removes a disposed thing (it may block: it runs on its own thread
        when a release triggers it).
    name : str
        The name of those removal threads.
    remove_at_shutdown : bool
        Whether a removal that cannot get a thread (interpreter shutdown) runs on the
        releasing one instead of being left to the next start-up sweep.
    """

    def __init__(self, remove: Callable[[T], None], name: str, remove_at_shutdown: bool):
        self._remove = remove
        self._name = name
        self._remove_at_shutdown = remove_at_shutdown
        self._lock = threading.Lock()
        self._readers: dict[K, int] = {}
        self._doomed: dict[K, T] = {}

    def hold(self, open_: Callable[[], tuple[K, V]]) -> tuple[K, V]:
        """Count one more reader of what ``open_()`` opens, ``(key, handle)``; ``open_`` runs
        under the lock, so that a ``dispose`` after it sees the count."""
        with self._lock:
            key, handle = open_()
            self._readers[key] = self._readers.get(key, 0) + 1
        return key, handle

    def release(self, key: K) -> None:
        """One reader fewer (any thread, maybe inside garbage collection or on the event loop):
        never raises or blocks; the last reader of a disposed thing starts its removal."""
        with self._lock:
            left = self._readers.get(key, 1) - 1
            if left > 0:
                self._readers[key] = left
                return
            self._readers.pop(key, None)
            doomed = self._doomed.pop(key, None)
        if doomed is None:
            return
        try:
            threading.Thread(target=self._remove, args=(doomed,), name=self._name, daemon=True).start()
        except RuntimeError:  # interpreter shutdown: no new threads
            if self._remove_at_shutdown:
                self._remove(doomed)

    def dispose(self, key: K, thing: T) -> None:
        """Remove ``thing`` (replaced or deleted; read under ``key``) now, or when its last
        reader lets go."""
        with self._lock:
            if key in self._readers:
                self._doomed[key] = thing
                return
        self._remove(thing)

    def waiting(self) -> list[T]:
        """The disposed things kept for their readers (for tests)."""
        with self._lock:
            return list(self._doomed.values())
