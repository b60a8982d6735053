"""Safe extraction of an untrusted zip archive holding a Zarr v3 store.

A client uploads a store written by, for example,
``xarray.Dataset.to_zarr(path, zarr_format=3)`` and then zipped, either flat (``zarr.json`` at
the top of the archive) or under one top-level folder (``image.zarr/zarr.json``).
:func:`extract_zarr_zip` checks every entry of the archive before writing anything, extracts it
with its own bounded loop while counting the bytes actually written, and then validates the Zarr
metadata it finds (:func:`check_array_metadata` for every array).

Every refusal raises :class:`ZipStoreError` (a :class:`ValueError`) whose message names the
entry, the rule and the offending value; an archive or array that is too big raises its subclass
:class:`ZipTooLarge` (the service answers 413 for it and 400/422 for the others).

Only the standard library is used: nothing here imports zarr.
"""

from __future__ import annotations

import errno
import json
import os
import pathlib
import re
import stat
import zipfile
import zlib

__all__ = [
    "ALLOWED_CODECS",
    "ITEMSIZES",
    "MAX_METADATA_BYTES",
    "ZipStoreError",
    "ZipTooLarge",
    "check_array_metadata",
    "extract_zarr_zip",
]

#: Bytes copied per read/write while extracting a member.
_PIECE = 1 << 20

#: A ``zarr.json`` larger than this is refused without being parsed.
MAX_METADATA_BYTES = 10 * 1024 * 1024

#: Size in bytes of one element of every accepted Zarr v3 ``data_type``.
ITEMSIZES: dict[str, int] = {
    "bool": 1,
    "int8": 1,
    "uint8": 1,
    "int16": 2,
    "uint16": 2,
    "float16": 2,
    "int32": 4,
    "uint32": 4,
    "float32": 4,
    "int64": 8,
    "uint64": 8,
    "float64": 8,
    "complex64": 8,
    "complex128": 16,
    # Variable-length strings (xarray writes string coordinates, e.g. band names, this way);
    # 16 bytes an element is the estimate the size limits use. A string *data* variable is
    # still refused later: the operators take fixed-size numbers only.
    "string": 16,
}

#: Codec names accepted in ``codecs`` (and, recursively, inside ``sharding_indexed``).
ALLOWED_CODECS = frozenset(
    {"bytes", "transpose", "zstd", "blosc", "gzip", "crc32c", "sharding_indexed", "vlen-utf8"}
)

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
_V3_HINT = (
    "only Zarr v3 stores are accepted: write it with "
    "to_zarr(..., zarr_format=3) (xarray) or zarr.open(..., zarr_format=3)"
)
_MAX_COMPONENT_BYTES = 255
_MAX_NAME_BYTES = 1024

_ZIP_READ_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, UnicodeDecodeError)


class ZipStoreError(ValueError):
    """The uploaded archive is refused.

    The message names the entry (or ``zarr.json``) at fault, the rule it breaks and the
    offending value.
    """


class ZipTooLarge(ZipStoreError):
    """The archive, one of its arrays or one of their chunks is larger than allowed.

    The service answers 413 (Content Too Large) for it.
    """


# --------------------------------------------------------------------------------------------
# Array metadata
# --------------------------------------------------------------------------------------------


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _nbytes(shape: list[int], itemsize: int, limit: int) -> int:
    """``prod(shape) * itemsize``, stopping as soon as it passes ``limit`` (no huge integers)."""
    if 0 in shape:
        return 0
    total = itemsize
    for n in shape:
        total *= n
        if total > limit:
            return total
    return total


def _check_shape(value: object, key: str, *, positive: bool) -> list[int]:
    low = 1 if positive else 0
    if not isinstance(value, list) or not all(_is_int(n) and n >= low for n in value):
        kind = "positive" if positive else "non-negative"
        raise ZipStoreError(f"{key} must be a list of {kind} integers, got {value!r:.200}")
    return value


def _codec_name(codec: object, where: str) -> tuple[str, object]:
    if isinstance(codec, str):
        return codec, None
    if isinstance(codec, dict) and isinstance(codec.get("name"), str):
        return codec["name"], codec.get("configuration")
    raise ZipStoreError(
        f"{where}: a codec must be a name or an object with a 'name', got {codec!r:.200}"
    )


def _check_codecs(
    codecs: object,
    where: str,
    *,
    ndim: int,
    itemsize: int,
    data_type: str,
    max_chunk_bytes: int,
) -> None:
    if not isinstance(codecs, list):
        raise ZipStoreError(f"{where} must be a list of codecs, got {codecs!r:.200}")
    for codec in codecs:
        name, config = _codec_name(codec, where)
        if name not in ALLOWED_CODECS:
            raise ZipStoreError(
                f"{where}: unknown codec {name!r:.200}; allowed codecs: "
                f"{', '.join(sorted(ALLOWED_CODECS))}"
            )
        if name != "sharding_indexed":
            continue
        if not isinstance(config, dict):
            raise ZipStoreError(
                f"{where}: codec 'sharding_indexed' needs a 'configuration' object, "
                f"got {config!r:.200}"
            )
        inner = _check_shape(
            config.get("chunk_shape"), "sharding_indexed chunk_shape", positive=True
        )
        if len(inner) != ndim:
            raise ZipStoreError(
                f"sharding_indexed chunk_shape {inner} has {len(inner)} dimensions, "
                f"the array has {ndim}"
            )
        nbytes = _nbytes(inner, itemsize, max_chunk_bytes)
        if nbytes > max_chunk_bytes:
            raise ZipTooLarge(
                f"sharding_indexed chunk_shape {inner} of {data_type} is {nbytes} bytes or more, "
                f"more than max_chunk_bytes={max_chunk_bytes}"
            )
        _check_codecs(
            config.get("codecs"),
            f"{where} > sharding_indexed codecs",
            ndim=ndim,
            itemsize=itemsize,
            data_type=data_type,
            max_chunk_bytes=max_chunk_bytes,
        )
        if config.get("index_codecs") is not None:
            _check_codecs(
                config["index_codecs"],
                f"{where} > sharding_indexed index_codecs",
                ndim=ndim,
                itemsize=itemsize,
                data_type=data_type,
                max_chunk_bytes=max_chunk_bytes,
            )


def _fixed_length_string(data_type) -> int | None:
    """The item size of xarray's fixed-length unicode coordinates (NumPy ``<U``), else None."""
    if not isinstance(data_type, dict) or data_type.get("name") != "fixed_length_utf32":
        return None
    length = (data_type.get("configuration") or {}).get("length_bytes")
    if not isinstance(length, int) or isinstance(length, bool) or not 0 < length <= 4096:
        raise ZipStoreError(f"fixed_length_utf32 length_bytes must be an integer in 1..4096, got {length!r:.100}")
    return length


def check_array_metadata(meta: dict, *, max_bytes: int, max_chunk_bytes: int) -> None:
    """Check that one parsed Zarr v3 array ``zarr.json`` is small and uses known encodings.

    Parameters
    ----------
    meta : dict
        The parsed ``zarr.json`` of an array (``"node_type": "array"``).
    max_bytes : int
        Largest allowed uncompressed size of the whole array, in bytes.
    max_chunk_bytes : int
        Largest allowed uncompressed size of one chunk (for a sharded array: of one shard, and
        of one inner chunk), in bytes.

    Raises
    ------
    ZipTooLarge
        The array (``shape`` times the item size of ``data_type``) is larger than `max_bytes`,
        or a chunk is larger than `max_chunk_bytes`; the message names the shape.
    ZipStoreError
        ``data_type`` is not one of :data:`ITEMSIZES` (the message lists them); ``shape`` is not
        a list of integers >= 0; ``chunk_grid`` is not a ``regular`` grid whose
        ``chunk_shape`` holds one positive integer per dimension; ``codecs`` is not a list, or
        names a codec outside :data:`ALLOWED_CODECS` (checked recursively inside
        ``sharding_indexed``'s ``codecs`` and ``index_codecs``).

    Notes
    -----
    Only what decides memory use and decoding is checked: ``fill_value``,
    ``chunk_key_encoding``, ``attributes`` and the codecs' own configurations are left to zarr.
    """
    if not isinstance(meta, dict):
        raise ZipStoreError(f"array metadata must be a JSON object, got {type(meta).__name__}")

    data_type = meta.get("data_type")
    itemsize = _fixed_length_string(data_type)
    if itemsize is None:
        if not isinstance(data_type, str) or data_type not in ITEMSIZES:
            raise ZipStoreError(
                f"unsupported data_type {data_type!r:.200}; supported data types: "
                f"{', '.join(ITEMSIZES)}, fixed_length_utf32"
            )
        itemsize = ITEMSIZES[data_type]
        data_type = str(data_type)
    else:
        data_type = "fixed_length_utf32"

    shape = _check_shape(meta.get("shape"), "shape", positive=False)
    nbytes = _nbytes(shape, itemsize, max_bytes)
    if nbytes > max_bytes:
        raise ZipTooLarge(
            f"array shape {shape!s:.200} of {data_type} is {nbytes} bytes or more, "
            f"more than max_bytes={max_bytes}"
        )

    grid = meta.get("chunk_grid")
    config = grid.get("configuration") if isinstance(grid, dict) else None
    if (
        not isinstance(grid, dict)
        or grid.get("name") != "regular"
        or not isinstance(config, dict)
        or "chunk_shape" not in config
    ):
        raise ZipStoreError(
            "chunk_grid must be {'name': 'regular', 'configuration': {'chunk_shape': [...]}}, "
            f"got {grid!r:.200}"
        )
    chunk_shape = _check_shape(config["chunk_shape"], "chunk_shape", positive=True)
    if len(chunk_shape) != len(shape):
        raise ZipStoreError(
            f"chunk_shape {chunk_shape!s:.200} has {len(chunk_shape)} dimensions, "
            f"shape {shape!s:.200} has {len(shape)}"
        )
    chunk_bytes = _nbytes(chunk_shape, itemsize, max_chunk_bytes)
    if chunk_bytes > max_chunk_bytes:
        raise ZipTooLarge(
            f"chunk_shape {chunk_shape} of {data_type} is {chunk_bytes} bytes or more, "
            f"more than max_chunk_bytes={max_chunk_bytes}"
        )

    _check_codecs(
        meta.get("codecs"),
        "codecs",
        ndim=len(shape),
        itemsize=itemsize,
        data_type=data_type,
        max_chunk_bytes=max_chunk_bytes,
    )


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


# --------------------------------------------------------------------------------------------
# Zarr metadata
# --------------------------------------------------------------------------------------------


def _load_metadata(path: pathlib.Path, name: str) -> dict:
    if not path.is_file():
        raise ZipStoreError(f"{name!r}: zarr.json is not a file")
    size = path.stat().st_size
    if size > MAX_METADATA_BYTES:
        raise ZipStoreError(
            f"{name!r}: zarr.json is too large ({size} bytes, more than {MAX_METADATA_BYTES})"
        )
    try:
        meta = json.loads(path.read_bytes())
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError
        raise ZipStoreError(f"{name!r}: zarr.json is not valid JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise ZipStoreError(
            f"{name!r}: zarr.json must hold a JSON object, got {type(meta).__name__}"
        )
    return meta


def _check_node(meta: dict, name: str, *, max_bytes: int, max_chunk_bytes: int) -> None:
    """Check one node's metadata (a ``zarr.json`` or one consolidated entry of it)."""
    fmt = meta.get("zarr_format")
    if not (_is_int(fmt) and fmt == 3):
        raise ZipStoreError(f"{name}: zarr_format is {fmt!r:.50}, not 3; {_V3_HINT}")
    node_type = meta.get("node_type")
    if node_type not in {"group", "array"}:
        raise ZipStoreError(f"{name}: node_type is {node_type!r:.50}, not 'group' or 'array'")
    if node_type == "array":
        try:
            check_array_metadata(meta, max_bytes=max_bytes, max_chunk_bytes=max_chunk_bytes)
        except ZipStoreError as exc:
            raise type(exc)(f"{name}: {exc}") from None
        return
    consolidated = meta.get("consolidated_metadata")
    if consolidated is None:
        return
    children = consolidated.get("metadata") if isinstance(consolidated, dict) else None
    if not isinstance(children, dict):
        raise ZipStoreError(
            f"{name}: consolidated_metadata must be an object with a 'metadata' object"
        )
    for key, child in children.items():
        where = f"{name} (consolidated_metadata {key!r:.200})"
        if not isinstance(child, dict):
            raise ZipStoreError(f"{where}: must be a JSON object, got {type(child).__name__}")
        _check_node(child, where, max_bytes=max_bytes, max_chunk_bytes=max_chunk_bytes)


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
) -> pathlib.Path:
    """Extract an untrusted zip archive holding a Zarr v3 store, refusing anything unsafe.

    Every entry is checked before anything is written. Members are then copied in 1 MiB
    pieces to files created exclusively under `destination`, counting the bytes actually
    written (declared sizes can lie). Finally the Zarr metadata is checked.

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
        (a nested zip) or a corrupt member. Refused after: no ``zarr.json`` at the store
        root (a Zarr v2 store is told to use ``to_zarr(..., zarr_format=3)``); a
        ``zarr.json`` over 10 MiB, not valid JSON, not an object, without
        ``"zarr_format": 3`` or without ``node_type`` ``"group"``/``"array"``; array
        metadata refused by :func:`check_array_metadata` (also for the arrays listed in a
        group's consolidated metadata).
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
        if not _is_int(value) or value < 1:
            raise ValueError(f"{key} must be a positive integer, got {value!r}")
    if max_chunk_bytes is None:
        max_chunk_bytes = max_bytes
    elif not _is_int(max_chunk_bytes) or max_chunk_bytes < 1:
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

        written = 0
        for info, parts, is_dir in plan:
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
                f"the archive holds a Zarr v2 store ({found[0][2]!r}); {_V3_HINT}"
            )
        raise ZipStoreError(
            f"no zarr.json at the store root {prefix or '(top of the archive)'!r}: zip the "
            "store folder itself, flat or under one top-level folder"
        )

    metadata = sorted(
        (parts for _, parts, is_dir in plan if parts[-1] == "zarr.json"),
        key=lambda parts: (len(parts), parts),  # the root zarr.json first
    )
    for parts in metadata:
        name = "/".join(parts)
        meta = _load_metadata(root.joinpath(*parts), name)
        _check_node(meta, repr(name), max_bytes=max_bytes, max_chunk_bytes=max_chunk_bytes)
    return store
