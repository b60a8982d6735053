"""Atomic publication on a local data root: a group built under ``tmp/`` becomes the array
``arrays/NAME`` in one rename, and replaces an existing one in one exchange.

``renameat2`` (glibc >= 2.28, called through ctypes) gives both steps: ``RENAME_NOREPLACE``
for a new name (of two publishers one wins, the other gets 409) and ``RENAME_EXCHANGE`` to
swap the new group for the old (a reader finds one or the other, never a missing name or a
mix). Where the C library, the kernel or the file system lacks it, a check and a rename, and
two renames to replace, do instead.
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

from service.errors import conflict

_AT_FDCWD = -100
_RENAME_NOREPLACE = 1  # <linux/fs.h>
_RENAME_EXCHANGE = 2


def _load_renameat2():
    try:
        function = ctypes.CDLL(None, use_errno=True).renameat2  # glibc >= 2.28
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


_renameat2 = _load_renameat2()


def _rename2(src: Path, dst: Path, flags: int) -> bool:
    """``renameat2(src, dst, flags)``: True when done, False where the C library, the kernel or
    the file system lacks it or the flag (then the caller falls back to plain renames); any
    other failure raises OSError (FileNotFoundError, FileExistsError, ...)."""
    if _renameat2 is None:
        return False
    if _renameat2(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), flags) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    if code == errno.ENOTEMPTY:
        code = errno.EEXIST
    raise OSError(code, os.strerror(code), str(src), None, str(dst))


def publish_group(built: Path, target: Path, name: str, overwrite: bool, *, tmp: Path,
                  dispose: Callable[[Path], None]) -> None:
    """Move the group at ``built`` to ``target``, the directory of the array ``name`` (see
    ``ArrayStore.publish``); 409 if it is taken and ``overwrite`` is false. A replaced group is
    moved aside under ``tmp`` and handed to ``dispose``."""
    for _ in range(16):  # each turn loses only to another writer of this name
        if overwrite and target.exists():
            try:
                swapped = _rename2(built, target, _RENAME_EXCHANGE)
            except FileNotFoundError:
                continue  # deleted meanwhile: publish it as a new name
            aside = tmp / f"replaced-{uuid.uuid4().hex}"
            if swapped:
                os.rename(built, aside)  # the old group, out of the caller's cleanup of built
            else:
                try:
                    os.rename(target, aside)
                except FileNotFoundError:
                    continue  # deleted meanwhile: publish it as a new name
                os.rename(built, target)
            dispose(aside)
            return
        try:
            if not _rename2(built, target, _RENAME_NOREPLACE):
                if target.exists():
                    raise FileExistsError(errno.EEXIST, "exists", str(target))
                os.rename(built, target)  # fails (ENOTEMPTY) if a group appeared meanwhile
            return
        except OSError as error:
            if error.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
        if not overwrite:
            shutil.rmtree(built, ignore_errors=True)
            raise conflict(f"an array named {name!r} exists; use ?overwrite=true to replace it")
    raise conflict(f"the array {name!r} is being replaced by other requests; try again")
