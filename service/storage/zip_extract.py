"""Safe extraction of an untrusted zip archive holding a Zarr v3 store.

A client uploads a store written by, for example,
``xarray.Dataset.to_zarr(path, zarr_format=3)`` and then zipped, either flat (``zarr.json`` at
the top of the archive) or under one top-level folder (``image.zarr/zarr.json``).
:func:`extract_zarr_zip` checks every entry of the archive before writing anything, extracts it
with its own bounded loop while counting the bytes actually written, and then validates the Zarr
metadata it finds (``service.storage.zip_checks``: :func:`check_array_metadata` for every array).

Every refusal raises :class:`ZipStoreError` (a :class:`ValueError`) whose message names the
entry, the rule and the offending value; an archive or array that is too big raises its subclass
:class:`ZipTooLarge` (the service answers 413 for it and 400/422 for the others).

Nothing here imports zarr.
"""

from __future__ import annotations

import errno
import os
import pathlib
import re
import stat
import zipfile
import zlib

from service.storage.budgets import Budgets
from service.storage.zip_checks import V3_HINT, ZipStoreError, ZipTooLarge, check_node, is_int, load_metadata

__all__ = ["extract_zarr_zip"]

#: Bytes copied per read/write while extracting a member.
_PIECE = 1 << 20

#: The first bytes of a zip member ("local file header"): a nested archive.
_ZIP_MAGIC = b"PK\x03\x04"

#: Compression methods the bounded reader handles. bzip2 and LZMA are refused: the standard
#: library decompresses them without an output limit per read, so one read could expand a
#: megabyte of input into gigabytes of memory.
_COMPRESSIONS = {zipfile.ZIP_STORED: "stored", zipfile.ZIP_DEFLATED: "deflate"}

#: General-purpose flag bits: traditional encryption, compressed patched data, strong encryption.
_FLAG_ENCRYPTED = 0x0001
_FLAG_PATCHED = 0x0020
_FLAG_STRONG_ENCRYPTION = 0x0040

#: Entries macOS Finder adds to the archives it makes: checked like any entry, never extracted,
#: and ignored when looking for the single top-level folder.
_MACOS_FOLDER = "__MACOSX"
_MACOS_FILES = frozenset({".DS_Store"})

_DRIVE = re.compile(r"^[A-Za-z]:")
_V2_FILES = (".zgroup", ".zarray", ".zattrs", ".zmetadata")
_MAX_COMPONENT_BYTES = 255
_MAX_NAME_BYTES = 1024

_ZIP_READ_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, UnicodeDecodeError)


# --------------------------------------------------------------------------------------------
# Entries
# --------------------------------------------------------------------------------------------


def _refuse(name: str, rule: str) -> ZipStoreError:
    shown = name if len(name) <= 200 else f"{name[:200]}..."
    return ZipStoreError(f"zip entry {shown!r}: {rule}")


def _components(info: zipfile.ZipInfo) -> tuple[str, ...]:
    """The path components of an entry, after checking its name; raise if it is unsafe."""
    raw = info.orig_filename  # zipfile cuts ``filename`` at a NUL; the original keeps it
    if "\x00" in raw:
        raise _refuse(raw, "name contains a NUL byte")
    if "\\" in raw:
        raise _refuse(raw, "name contains a backslash (only '/' separates folders)")
    if raw.startswith("/"):
        raise _refuse(raw, "name is an absolute path")
    if _DRIVE.match(raw):
        raise _refuse(raw, f"name starts with a drive letter {raw[:2]!r}")
    if len(raw.encode("utf-8", "surrogateescape")) > _MAX_NAME_BYTES:
        raise _refuse(raw, f"name is longer than {_MAX_NAME_BYTES} bytes")
    path = raw[:-1] if raw.endswith("/") else raw
    parts = tuple(path.split("/"))
    for part in parts:
        if part == "":
            raise _refuse(raw, "name has an empty component ('//', or is empty)")
        if part in {".", ".."}:
            raise _refuse(raw, f"name has a {part!r} component")
        if len(part.encode("utf-8", "surrogateescape")) > _MAX_COMPONENT_BYTES:
            raise _refuse(raw, f"name has a component longer than {_MAX_COMPONENT_BYTES} bytes")
    return parts


def _check_entry(info: zipfile.ZipInfo) -> bool:
    """Check the type, encryption and compression of an entry; return whether it is a folder."""
    name = info.orig_filename
    is_dir = name.endswith("/")
    mode = info.external_attr >> 16
    kind = stat.S_IFMT(mode)
    if kind == stat.S_IFLNK:
        raise _refuse(name, f"symbolic links are not allowed (mode {mode:#o})")
    if kind not in {0, stat.S_IFREG, stat.S_IFDIR}:
        raise _refuse(name, f"only regular files and folders are allowed (mode {mode:#o})")
    if kind == stat.S_IFDIR and not is_dir:
        raise _refuse(name, f"a folder (mode {mode:#o}) whose name does not end in '/'")
    if kind == stat.S_IFREG and is_dir:
        raise _refuse(name, f"a regular file (mode {mode:#o}) whose name ends in '/'")
    if info.flag_bits & (_FLAG_ENCRYPTED | _FLAG_STRONG_ENCRYPTION):
        raise _refuse(name, f"encrypted entries are not allowed (flags {info.flag_bits:#06x})")
    if info.flag_bits & _FLAG_PATCHED:
        raise _refuse(name, f"patched data is not allowed (flags {info.flag_bits:#06x})")
    if not is_dir:
        if info.compress_type not in _COMPRESSIONS:
            raise _refuse(
                name,
                f"compression method {info.compress_type} is not allowed "
                f"(allowed: {', '.join(f'{k} ({v})' for k, v in _COMPRESSIONS.items())})",
            )
        if name.lower().endswith(".zip"):
            raise _refuse(name, "nested zip archives are not allowed (name ends in '.zip')")
    return is_dir


def _is_macos_junk(parts: tuple[str, ...]) -> bool:
    return parts[0] == _MACOS_FOLDER or parts[-1] in _MACOS_FILES


def _plan(
    infos: list[zipfile.ZipInfo], *, archive_size: int, max_bytes: int, max_entries: int
) -> list[tuple[zipfile.ZipInfo, tuple[str, ...], bool]]:
    """Check every entry before anything is written; return ``(info, parts, is_dir)`` to extract."""
    if len(infos) > max_entries:
        raise ZipStoreError(
            f"the archive has {len(infos)} entries, more than max_entries={max_entries}"
        )
    seen: dict[tuple[str, ...], str] = {}
    files: dict[tuple[str, ...], str] = {}
    folders: set[tuple[str, ...]] = set()
    plan = []
    declared = 0
    for info in infos:
        parts = _components(info)
        is_dir = _check_entry(info)
        if not 0 <= info.header_offset < archive_size or info.compress_size > archive_size:
            raise _refuse(
                info.orig_filename,
                f"corrupt header (offset {info.header_offset}, compressed size "
                f"{info.compress_size}, in an archive of {archive_size} bytes)",
            )
        if parts in seen:
            raise _refuse(info.orig_filename, f"duplicate of entry {seen[parts]!r}")
        seen[parts] = info.orig_filename
        folders.update(parts[:i] for i in range(1, len(parts)))
        if is_dir:
            folders.add(parts)
        else:
            files[parts] = info.orig_filename
            declared += info.file_size
            if declared > max_bytes:
                raise ZipTooLarge(
                    f"zip entry {info.orig_filename!r}: the declared uncompressed sizes add up "
                    f"to {declared} bytes by this entry, more than max_bytes={max_bytes}"
                )
        plan.append((info, parts, is_dir))
    for parts in files.keys() & folders:
        raise _refuse(files[parts], "is a file, but other entries use it as a folder")
    return [entry for entry in plan if not _is_macos_junk(entry[1])]


def _inside(path: pathlib.Path, root: pathlib.Path, name: str) -> pathlib.Path:
    resolved = path.resolve()
    if resolved == root or not resolved.is_relative_to(root):
        raise _refuse(name, f"resolves to {str(resolved)!r}, outside the destination")
    return resolved


def _copy(
    zf: zipfile.ZipFile, info: zipfile.ZipInfo, target: pathlib.Path, written: int, max_bytes: int
) -> int:
    """Copy one member to ``target`` in bounded pieces; return the new total of bytes written."""
    name = info.orig_filename
    with zf.open(info) as src, open(target, "xb") as dst:
        head = b""
        while True:
            piece = src.read(_PIECE)
            if not piece:
                break
            if len(head) < len(_ZIP_MAGIC):
                head += piece[: len(_ZIP_MAGIC) - len(head)]
                if head.startswith(_ZIP_MAGIC):
                    raise _refuse(
                        name, "nested zip archives are not allowed (starts with 'PK\\x03\\x04')"
                    )
            if written + len(piece) > max_bytes:
                raise ZipTooLarge(
                    f"zip entry {name!r}: expands past max_bytes={max_bytes} while being "
                    f"written (the archive reaches {written + len(piece)} bytes or more with "
                    f"this entry, whose declared size is {info.file_size} bytes)"
                )
            dst.write(piece)
            written += len(piece)
    return written


def _extract(
    zf: zipfile.ZipFile,
    entries: list[tuple[zipfile.ZipInfo, tuple[str, ...], bool]],
    root: pathlib.Path,
    written: int,
    max_bytes: int,
) -> int:
    """Extract planned entries under ``root``; return the new total of bytes written."""
    for info, parts, is_dir in entries:
        name = info.orig_filename
        target = _inside(root.joinpath(*parts), root, name)
        try:
            if is_dir:
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            written = _copy(zf, info, target, written, max_bytes)
        except _ZIP_READ_ERRORS as exc:
            raise _refuse(name, f"cannot be read ({type(exc).__name__}: {exc})") from None
        except NotImplementedError as exc:
            raise _refuse(name, f"cannot be read ({exc})") from None
        except (FileExistsError, NotADirectoryError, IsADirectoryError) as exc:
            raise _refuse(name, f"clashes with another entry ({exc.strerror})") from None
        except OSError as exc:
            if exc.errno != errno.ENAMETOOLONG:
                raise  # a fault of this machine (disk full...), not of the archive
            raise _refuse(name, f"cannot be created ({exc.strerror})") from None
    return written


def _check_metadata(
    root: pathlib.Path,
    plan: list[tuple[zipfile.ZipInfo, tuple[str, ...], bool]],
    *,
    max_bytes: int,
    max_chunk_bytes: int,
    budgets: Budgets | None,
) -> None:
    """Check every extracted ``zarr.json``."""
    metadata = sorted(
        (parts for _, parts, is_dir in plan if parts[-1] == "zarr.json"),
        key=lambda parts: (len(parts), parts),  # the root zarr.json first
    )
    for parts in metadata:
        name = "/".join(parts)
        meta = load_metadata(root.joinpath(*parts), name)
        check_node(meta, repr(name), max_bytes=max_bytes, max_chunk_bytes=max_chunk_bytes, budgets=budgets)


def _store_root(root: pathlib.Path, plan: list[tuple[zipfile.ZipInfo, tuple[str, ...], bool]]) -> pathlib.Path:
    """The store root: ``root`` or its one top-level folder, which must hold a ``zarr.json``."""
    tops = {parts[0] for _, parts, _ in plan}
    nested = len(tops) == 1 and all(len(parts) > 1 or is_dir for _, parts, is_dir in plan)
    prefix = f"{next(iter(tops))}/" if nested else ""
    store = root / prefix if nested else root

    if not (store / "zarr.json").exists():
        found = sorted(
            (_V2_FILES.index(parts[-1]), len(parts), info.orig_filename)
            for info, parts, _ in plan
            if parts[-1] in _V2_FILES
        )
        if found:
            raise ZipStoreError(
                f"the archive holds a Zarr v2 store ({found[0][2]!r}); {V3_HINT}"
            )
        raise ZipStoreError(
            f"no zarr.json at the store root {prefix or '(top of the archive)'!r}: zip the "
            "store folder itself, flat or under one top-level folder"
        )
    return store


# --------------------------------------------------------------------------------------------
# Extraction
# --------------------------------------------------------------------------------------------


def extract_zarr_zip(
    archive: str | os.PathLike,
    destination: str | os.PathLike,
    *,
    max_bytes: int,
    max_entries: int = 100_000,
    max_chunk_bytes: int | None = None,
    budgets: Budgets | None = None,
) -> pathlib.Path:
    """Extract an untrusted zip archive holding a Zarr v3 store, refusing anything unsafe.

    Every entry is checked before anything is written. Members are then copied in 1 MiB
    pieces to files created exclusively under `destination`, counting the bytes actually
    written (declared sizes can lie): first the folders and every ``zarr.json``, whose Zarr
    metadata is then checked, and only then the other files (the chunks).

    Parameters
    ----------
    archive : str or os.PathLike
        Path of the uploaded zip file.
    destination : str or os.PathLike
        An existing, empty directory owned by the caller. On any error it may hold part of
        the archive: the caller deletes it.
    max_bytes : int
        Largest allowed total uncompressed size, in bytes: of the declared sizes, of the bytes
        actually written, and of every array (``shape`` times item size).
    max_entries : int, default 100_000
        Largest allowed number of entries (files and folders) in the archive.
    max_chunk_bytes : int, optional
        Largest allowed uncompressed size of one chunk (or shard) of an array, in bytes;
        passed to :func:`check_array_metadata`. Defaults to `max_bytes`.
    budgets : service.storage.budgets.Budgets, optional
        The service's budgets, passed to :func:`check_array_metadata`.

    Returns
    -------
    pathlib.Path
        The resolved store root, the folder holding the root ``zarr.json``: `destination`
        itself, or ``destination/<folder>`` when every entry lies under one top-level folder
        (macOS ``__MACOSX/`` and ``.DS_Store`` entries are checked but neither extracted nor
        counted as top-level folders).

    Raises
    ------
    ZipTooLarge
        The declared sizes add up to more than `max_bytes`, the members expand past it while
        being written, or an array or chunk is larger than allowed.
    ZipStoreError
        Refused before writing anything: not a zip file; more than `max_entries` entries;
        an entry name that is absolute (``/x``, ``C:...``), holds ``..``, ``.``, an empty
        component, a backslash or a NUL; a symbolic link or other non-regular entry; a
        duplicate name (ignoring a trailing ``/``); a file that other entries use as a
        folder; an encrypted entry; a compression other than stored or deflate; a name
        ending in ``.zip``. Refused while writing: a member starting with ``PK\\x03\\x04``
        (a nested zip) or a corrupt member. Refused once the metadata is written, before
        the chunks are: a ``zarr.json`` over 10 MiB, not valid JSON, not an object, without
        ``"zarr_format": 3`` or without ``node_type`` ``"group"``/``"array"``; array
        metadata refused by :func:`check_array_metadata` (also for the arrays listed in a
        group's consolidated metadata). Refused at the end: no ``zarr.json`` at the store
        root (a Zarr v2 store is told to use ``to_zarr(..., zarr_format=3)``).
    ValueError
        `destination` is not empty, or a limit is not a positive integer.
    NotADirectoryError
        `destination` is not an existing directory.

    Notes
    -----
    Files are created with ``open(path, "xb")`` (never overwriting, never following a
    symbolic link) with the process umask; the archive's permission bits and timestamps are
    ignored. Nothing is ever written outside `destination`.
    """
    for key, value in (("max_bytes", max_bytes), ("max_entries", max_entries)):
        if not is_int(value) or value < 1:
            raise ValueError(f"{key} must be a positive integer, got {value!r}")
    if max_chunk_bytes is None:
        max_chunk_bytes = max_bytes
    elif not is_int(max_chunk_bytes) or max_chunk_bytes < 1:
        raise ValueError(f"max_chunk_bytes must be a positive integer, got {max_chunk_bytes!r}")

    root = pathlib.Path(destination).resolve()
    if not root.is_dir():
        raise NotADirectoryError(f"destination {str(root)!r} is not an existing directory")
    if any(root.iterdir()):
        raise ValueError(f"destination {str(root)!r} is not empty")

    try:
        zf = zipfile.ZipFile(archive)
    except (zipfile.BadZipFile, EOFError, ValueError, NotImplementedError) as exc:
        raise ZipStoreError(f"the upload is not a zip file ({exc})") from None
    with zf:
        plan = _plan(
            zf.infolist(),
            archive_size=os.stat(archive).st_size,
            max_bytes=max_bytes,
            max_entries=max_entries,
        )

        # The metadata first: a store whose zarr.json is refused leaves its chunks unwritten.
        first = [entry for entry in plan if entry[2] or entry[1][-1] == "zarr.json"]
        written = _extract(zf, first, root, 0, max_bytes)
        _check_metadata(root, plan, max_bytes=max_bytes, max_chunk_bytes=max_chunk_bytes, budgets=budgets)
        _extract(zf, [entry for entry in plan if not (entry[2] or entry[1][-1] == "zarr.json")], root, written,
                 max_bytes)
    return _store_root(root, plan)
