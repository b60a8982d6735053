"""The rules the Zarr metadata of an uploaded, zipped Zarr v3 store must follow.

:func:`check_array_metadata` checks one array's ``zarr.json`` (data type, shape, chunk grid,
codecs, and the sizes they imply); :func:`check_node` checks a ``zarr.json`` or one entry of a
group's consolidated metadata, recursively. ``service.storage.zip_extract`` runs them on every
``zarr.json`` of an archive after extracting it.

Every refusal raises :class:`ZipStoreError` (a :class:`ValueError`) whose message names the
entry, the rule and the offending value; an archive or array that is too big raises its subclass
:class:`ZipTooLarge` (the service answers 413 for it and 400/422 for the others).

Only the standard library is used: nothing here imports zarr.
"""

from __future__ import annotations

import json
import pathlib

__all__ = [
    "ALLOWED_CODECS",
    "ITEMSIZES",
    "MAX_METADATA_BYTES",
    "ZipStoreError",
    "ZipTooLarge",
    "check_array_metadata",
    "check_node",
    "load_metadata",
]

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

#: The hint every refusal of a Zarr v2 store gives.
V3_HINT = (
    "only Zarr v3 stores are accepted: write it with "
    "to_zarr(..., zarr_format=3) (xarray) or zarr.open(..., zarr_format=3)"
)


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


def is_int(value: object) -> bool:
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
    if not isinstance(value, list) or not all(is_int(n) and n >= low for n in value):
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
# Zarr metadata
# --------------------------------------------------------------------------------------------


def load_metadata(path: pathlib.Path, name: str) -> dict:
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


def check_node(meta: dict, name: str, *, max_bytes: int, max_chunk_bytes: int) -> None:
    """Check one node's metadata (a ``zarr.json`` or one consolidated entry of it)."""
    fmt = meta.get("zarr_format")
    if not (is_int(fmt) and fmt == 3):
        raise ZipStoreError(f"{name}: zarr_format is {fmt!r:.50}, not 3; {V3_HINT}")
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
        check_node(child, where, max_bytes=max_bytes, max_chunk_bytes=max_chunk_bytes)
