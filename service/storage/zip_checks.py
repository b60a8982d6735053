"""The rules the Zarr metadata of an uploaded, zipped Zarr v3 store must follow.

:func:`check_array_metadata` checks one array's ``zarr.json`` (data type, shape, chunk grid,
codecs, and the sizes they imply); :func:`check_node` checks a ``zarr.json`` or one entry of a
group's consolidated metadata, recursively. ``service.storage.zip_extract`` runs them on every
``zarr.json`` of an archive after extracting it.

With the service's ``budgets`` (``service.storage.budgets.Budgets``) they also check what an
array may cost before any of it is decoded: its chunk count, the inner chunks of a shard, the
order of its codecs, its chunk key encoding, its ``dimension_names`` and the size of its strings.

Every refusal raises :class:`ZipStoreError` (a :class:`ValueError`) whose message names the
entry, the rule and the offending value; an archive or array that is too big raises its subclass
:class:`ZipTooLarge` (the service answers 413 for it and 400/422 for the others).

Nothing here imports zarr.
"""

from __future__ import annotations

import json
import math
import pathlib

from service.storage.budgets import Budgets, chunk_count, over

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

#: The codecs of each kind, in the order a codec list holds them (Zarr v3: array -> array,
#: one array -> bytes, bytes -> bytes).
ARRAY_TO_ARRAY = frozenset({"transpose"})
ARRAY_TO_BYTES = frozenset({"bytes", "vlen-utf8", "sharding_indexed"})
BYTES_TO_BYTES = frozenset({"zstd", "blosc", "gzip", "crc32c"})

#: The chunk key encodings Zarr v3 defines, and each one's default separator.
KEY_ENCODINGS = {"default": "/", "v2": "."}

#: The longest dimension name accepted, in characters.
MAX_DIMENSION_NAME = 256

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


def _check_chunk_shape(value: object, key: str, shape: list[int], other: str, *, itemsize: int, data_type: str,
                       max_chunk_bytes: int, budgets: Budgets | None) -> list[int]:
    """``value`` as the chunk shape of ``shape`` (``other`` describes its rank): one positive
    length per axis, a chunk at most `max_chunk_bytes` decoded."""
    chunks = _check_shape(value, key, positive=True)
    if len(chunks) != len(shape):
        raise ZipStoreError(f"{key} {chunks!s:.200} has {len(chunks)} dimensions, {other}")
    nbytes = _nbytes(chunks, itemsize, max_chunk_bytes)
    if nbytes > max_chunk_bytes:
        raise ZipTooLarge(f"{key} {chunks!s:.200} of {data_type} is {nbytes} bytes or more, "
                          f"{_more_than(budgets, 'max_chunk_bytes', 'max_chunk_bytes', max_chunk_bytes)}")
    return chunks


def _codec_name(codec: object, where: str) -> tuple[str, object]:
    if isinstance(codec, str):
        return codec, None
    if isinstance(codec, dict) and isinstance(codec.get("name"), str):
        return codec["name"], codec.get("configuration")
    raise ZipStoreError(
        f"{where}: a codec must be a name or an object with a 'name', got {codec!r:.200}"
    )


def _more_than(budgets: Budgets | None, setting: str, argument: str, limit: int) -> str:
    """How a refusal ends: with the service's ``budgets``, the setting that raises ``limit``;
    without, the argument's name."""
    return over(setting, limit) if budgets is not None else f"more than {argument}={limit}"


def _check_codec_order(names: list[str], where: str, *, data_type: str, sharded: bool) -> None:
    """Array -> array codecs, then one array -> bytes codec that fits the data type, then
    bytes -> bytes codecs (none after ``sharding_indexed``, and no sharding inside a shard)."""
    kinds = [0 if n in ARRAY_TO_ARRAY else 1 if n in ARRAY_TO_BYTES else 2 for n in names]
    if kinds != sorted(kinds) or kinds.count(1) != 1:
        raise ZipStoreError(
            f"{where}: codecs {names} must be array -> array codecs ({', '.join(sorted(ARRAY_TO_ARRAY))}), "
            f"then one of {', '.join(sorted(ARRAY_TO_BYTES))}, then bytes -> bytes codecs "
            f"({', '.join(sorted(BYTES_TO_BYTES))})"
        )
    serializer = names[kinds.index(1)]
    if serializer == "sharding_indexed":
        if sharded:
            raise ZipStoreError(f"{where}: sharding_indexed inside a shard is not accepted")
        if kinds[-1] == 2:
            raise ZipStoreError(f"{where}: codecs after sharding_indexed are not accepted (put them inside it)")
    elif (data_type == "string") != (serializer == "vlen-utf8"):
        raise ZipStoreError(
            f"{where}: data_type {data_type} cannot be encoded by {serializer!r} "
            "(strings take vlen-utf8, every other data type bytes)"
        )


def _check_shard(config: dict, where: str, *, shard: list[int], inner: list[int], budgets: Budgets) -> None:
    """A shard's inner grid and index: whole inner chunks, at most ``max_shard_chunks`` of them,
    and an index Zarr reads with a fixed size (``bytes``, optionally ``crc32c``) at either end."""
    if any(s % c for s, c in zip(shard, inner)):
        raise ZipStoreError(f"{where}: the shard shape {shard} is not a multiple of sharding_indexed chunk_shape {inner}")
    count = math.prod(s // c for s, c in zip(shard, inner))
    if count > budgets.max_shard_chunks:
        raise ZipTooLarge(
            f"{where}: shards of {shard} hold {count} inner chunks of {inner}, {budgets.over('max_shard_chunks')}"
        )
    index = [_codec_name(codec, where)[0] for codec in config.get("index_codecs") or ["bytes", "crc32c"]]
    if index not in (["bytes"], ["bytes", "crc32c"]):
        raise ZipStoreError(f"{where}: sharding_indexed index_codecs must be bytes, optionally then crc32c, got {index}")
    if config.get("index_location", "end") not in ("start", "end"):
        raise ZipStoreError(f"{where}: sharding_indexed index_location must be 'start' or 'end', "
                            f"got {config.get('index_location')!r:.50}")


def _check_codecs(
    codecs: object,
    where: str,
    *,
    chunk_shape: list[int],
    itemsize: int,
    data_type: str,
    max_chunk_bytes: int,
    budgets: Budgets | None = None,
    sharded: bool = False,
) -> None:
    if not isinstance(codecs, list):
        raise ZipStoreError(f"{where} must be a list of codecs, got {codecs!r:.200}")
    names = []
    for codec in codecs:
        name, config = _codec_name(codec, where)
        names.append(name)
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
        limits = dict(itemsize=itemsize, max_chunk_bytes=max_chunk_bytes, budgets=budgets)
        inner = _check_chunk_shape(config.get("chunk_shape"), "sharding_indexed chunk_shape", chunk_shape,
                                   f"the array has {len(chunk_shape)}", data_type=data_type, **limits)
        _check_codecs(config.get("codecs"), f"{where} > sharding_indexed codecs", chunk_shape=inner,
                      data_type=data_type, sharded=True, **limits)
        if config.get("index_codecs") is not None:
            _check_codecs(config["index_codecs"], f"{where} > sharding_indexed index_codecs",
                          chunk_shape=inner, data_type=data_type, **{**limits, "budgets": None})
        if budgets is not None:
            _check_shard(config, where, shard=chunk_shape, inner=inner, budgets=budgets)
    if budgets is not None:
        _check_codec_order(names, where, data_type=data_type, sharded=sharded)


def _fixed_length_string(data_type) -> int | None:
    """The item size of xarray's fixed-length unicode coordinates (NumPy ``<U``), else None."""
    if not isinstance(data_type, dict) or data_type.get("name") != "fixed_length_utf32":
        return None
    length = (data_type.get("configuration") or {}).get("length_bytes")
    if not isinstance(length, int) or isinstance(length, bool) or not 0 < length <= 4096:
        raise ZipStoreError(f"fixed_length_utf32 length_bytes must be an integer in 1..4096, got {length!r:.100}")
    return length


def _check_dimension_names(names: object, ndim: int) -> None:
    """None, or one name per axis: distinct strings of 1-256 printable characters, or None."""
    if names is None:
        return
    if not isinstance(names, list) or len(names) != ndim:
        raise ZipStoreError(f"dimension_names must be a list of {ndim} names (one per axis) or null, "
                            f"got {names!r:.200}")
    for name in names:
        if name is not None and not (isinstance(name, str) and 0 < len(name) <= MAX_DIMENSION_NAME
                                     and name.isprintable()):
            raise ZipStoreError(f"dimension_names {names!r:.200}: each must be null or a string of 1-"
                                f"{MAX_DIMENSION_NAME} printable characters, got {name!r:.100}")
    named = [name for name in names if name is not None]
    if len(set(named)) != len(named):
        raise ZipStoreError(f"dimension_names {names!r:.200} repeat a name")


def _check_key_encoding(encoding: object) -> None:
    """``default`` or ``v2``, with a separator of ``/`` or ``.`` (absent: ``default``, ``/``)."""
    if encoding is None:
        return
    name, config = _codec_name(encoding, "chunk_key_encoding")
    separator = (config or {}).get("separator", KEY_ENCODINGS.get(name)) if isinstance(config, dict | None) else None
    if name not in KEY_ENCODINGS or separator not in ("/", "."):
        raise ZipStoreError(f"chunk_key_encoding must be 'default' or 'v2' with separator '/' or '.', "
                            f"got {encoding!r:.200}")


def _check_budgets(meta: dict, *, shape: list[int], chunk_shape: list[int], itemsize: int, data_type: str,
                   max_bytes: int, budgets: Budgets) -> None:
    """What decoding the array would cost: its chunk count, every chunk decoded (edge chunks are
    stored whole), and the bytes of its fixed-length strings."""
    count = chunk_count(shape, chunk_shape)
    if count > budgets.max_chunks:
        raise ZipTooLarge(f"chunk_shape {chunk_shape} cuts shape {shape!s:.200} into {count} chunks, "
                          f"{budgets.over('max_chunks')}")
    decoded = 0 if 0 in shape else count * math.prod(chunk_shape) * itemsize
    if decoded > max_bytes:
        raise ZipTooLarge(f"its {count} chunks of {chunk_shape} decode to {decoded} bytes in all, "
                          f"{over('max_upload_bytes', max_bytes)}")
    if data_type == "fixed_length_utf32":
        nbytes = math.prod(shape) * itemsize
        if nbytes > budgets.max_strings_bytes:
            raise ZipTooLarge(f"its strings of shape {shape} are {nbytes} bytes, {budgets.over('max_strings_bytes')}")
    _check_dimension_names(meta.get("dimension_names"), len(shape))
    _check_key_encoding(meta.get("chunk_key_encoding"))


def check_array_metadata(meta: dict, *, max_bytes: int, max_chunk_bytes: int, budgets: Budgets | None = None) -> None:
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
    budgets : service.storage.budgets.Budgets, optional
        The service's budgets (``max_bytes`` is then its ``max_upload_bytes``): also check the
        chunk count, all chunks decoded together against `max_bytes`, the inner chunks of a
        shard, fixed-length strings, the order of the codecs, ``dimension_names`` and
        ``chunk_key_encoding``; refusals name the settings.

    Raises
    ------
    ZipTooLarge
        The array (``shape`` times the item size of ``data_type``) is larger than `max_bytes`,
        or a chunk is larger than `max_chunk_bytes`; the message names the shape. With
        `budgets`: a budget is exceeded.
    ZipStoreError
        ``data_type`` is not one of :data:`ITEMSIZES` (the message lists them); ``shape`` is not
        a list of integers >= 0; ``chunk_grid`` is not a ``regular`` grid whose
        ``chunk_shape`` holds one positive integer per dimension; ``codecs`` is not a list, or
        names a codec outside :data:`ALLOWED_CODECS` (checked recursively inside
        ``sharding_indexed``'s ``codecs`` and ``index_codecs``). With `budgets`: codecs out of
        order, sharding inside a shard, a shard index Zarr cannot size, bad
        ``dimension_names`` or an unknown ``chunk_key_encoding``.

    Notes
    -----
    Only what decides memory use and decoding is checked: ``fill_value``, ``attributes`` and
    the codecs' own configurations are left to zarr.
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
            f"{_more_than(budgets, 'max_upload_bytes', 'max_bytes', max_bytes)}"
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
    chunk_shape = _check_chunk_shape(config["chunk_shape"], "chunk_shape", shape,
                                     f"shape {shape!s:.200} has {len(shape)}", itemsize=itemsize,
                                     data_type=data_type, max_chunk_bytes=max_chunk_bytes, budgets=budgets)
    if budgets is not None:
        _check_budgets(meta, shape=shape, chunk_shape=chunk_shape, itemsize=itemsize, data_type=data_type,
                       max_bytes=max_bytes, budgets=budgets)

    _check_codecs(
        meta.get("codecs"),
        "codecs",
        chunk_shape=chunk_shape,
        itemsize=itemsize,
        data_type=data_type,
        max_chunk_bytes=max_chunk_bytes,
        budgets=budgets,
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


def check_node(meta: dict, name: str, *, max_bytes: int, max_chunk_bytes: int, budgets: Budgets | None = None) -> None:
    """Check one node's metadata (a ``zarr.json`` or one consolidated entry of it); ``budgets``
    as for :func:`check_array_metadata`."""
    fmt = meta.get("zarr_format")
    if not (is_int(fmt) and fmt == 3):
        raise ZipStoreError(f"{name}: zarr_format is {fmt!r:.50}, not 3; {V3_HINT}")
    node_type = meta.get("node_type")
    if node_type not in {"group", "array"}:
        raise ZipStoreError(f"{name}: node_type is {node_type!r:.50}, not 'group' or 'array'")
    if node_type == "array":
        try:
            check_array_metadata(meta, max_bytes=max_bytes, max_chunk_bytes=max_chunk_bytes, budgets=budgets)
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
        check_node(child, where, max_bytes=max_bytes, max_chunk_bytes=max_chunk_bytes, budgets=budgets)
