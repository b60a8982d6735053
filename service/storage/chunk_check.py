"""The chunks of an uploaded Zarr store, decoded without trusting them, outside the API process.

``check_chunks(root, budgets)`` runs ``python -m service.storage.chunk_check`` on an extracted
store whose metadata ``service.storage.zip_checks`` has accepted. The subprocess limits its own
address space (``RLIMIT_AS``) once its imports are done, then decodes every chunk that Zarr
would read (the keys of each array's chunk grid) into a buffer of the size the array declares,
stopping at that size: a zstd frame must state its content size and a blosc buffer its decoded
size before either is decoded, gzip is inflated piece by piece, and a shard's index and inner
chunks are checked in turn. A compressed chunk file may be at most an eighth (and 4 KiB)
larger than what it decodes to.

A chunk is refused (400, naming its key) when it cannot be decoded, decodes to another size
than its chunk shape holds, or its checksum does not match; strings longer than
``max_string_bytes``, or more than ``max_strings_bytes`` of them in one array, are a 413. So
once a store has passed, Zarr decodes each of its chunks in the API process to a size known
in advance.

The subprocess imports only the standard library, numcodecs (zstd, blosc) and google_crc32c.
"""

from __future__ import annotations

import importlib
import itertools
import json
import math
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

#: How long one store's chunks may take to check, in seconds.
CHECK_SECONDS = 600
#: Room in the checker's address space beyond what its imports take, on top of a few chunks.
SPARE_ADDRESS_SPACE = 256 * 2**20

_ITEMSIZES = {"bool": 1, "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "float16": 2, "int32": 4, "uint32": 4,
              "float32": 4, "int64": 8, "uint64": 8, "float64": 8, "complex64": 8, "complex128": 16}
_ZSTD_MAGIC = 0xFD2FB528
_MISSING = 2**64 - 1  # a shard index entry of an inner chunk that is not stored


class Refused(Exception):
    """A chunk is refused: ``status`` (400 or 413) and the detail."""

    def __init__(self, status: int, detail: str):
        super().__init__(detail)
        self.status = status
        self.detail = detail


def encoded_limit(decoded: int) -> int:
    """The most bytes a chunk that decodes to ``decoded`` bytes may take stored: compression
    adds little to incompressible data (stored deflate blocks, zstd and blosc headers, a
    checksum)."""
    return decoded + decoded // 8 + 4096


# --- the API process's side -----------------------------------------------------------------


def check_chunks(root: Path, budgets) -> None:
    """Decode every chunk of the Zarr store at ``root`` in a subprocess; raise ``Refused`` for
    the first one refused. ``budgets`` is the service's ``service.storage.budgets.Budgets``."""
    limits = {key: getattr(budgets, key) for key in ("max_chunk_bytes", "max_string_bytes", "max_strings_bytes")}
    request = {"root": str(root), **limits, "over": {key: budgets.over(key) for key in limits}}
    package_root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")])),
           # one thread each: threads reserve address space, which the checker limits
           "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "BLOSC_NTHREADS": "1"}
    try:
        done = subprocess.run([sys.executable, "-m", __name__], input=json.dumps(request).encode(), env=env,
                              capture_output=True, timeout=CHECK_SECONDS, check=False)
    except subprocess.TimeoutExpired:
        raise Refused(413, f"checking the zip's chunks took more than {CHECK_SECONDS} s") from None
    lines = done.stdout.decode(errors="replace").splitlines()
    verdict = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else None
    if verdict is None:  # killed (a signal, or out of its address space before it could answer)
        started = [line for line in lines if line.startswith("key ")]
        where = f"chunk {started[-1][4:]!r}" if started else "the zip's chunks"
        raise Refused(400, f"{where} could not be decoded (the checker exited with {done.returncode})")
    if verdict["status"] != 200:
        raise Refused(verdict["status"], verdict["detail"])


# --- the subprocess -------------------------------------------------------------------------


class _Strings:
    """What the strings of one array may still take (``max_strings_bytes`` less those seen)."""

    def __init__(self, request: dict):
        self.request = request
        self.left = request["max_strings_bytes"]


def _codec(codec) -> tuple[str, dict]:
    return (codec, {}) if isinstance(codec, str) else (codec["name"], codec.get("configuration") or {})


class _TooBig(Refused):
    """A chunk decodes to more than its bound."""


def _too_big(key: str, bound: int) -> Refused:
    return _TooBig(400, f"chunk {key!r} decodes to more than the {bound} bytes its array declares for it")


def _strings_too_big(key: str, count: int, strings: _Strings) -> Refused:
    """The refusal of a vlen-utf8 chunk that decodes past its bound: its strings take more than
    the strings budget leaves, or than ``count`` strings of ``max_string_bytes`` each."""
    request = strings.request
    if strings.left < count * request["max_string_bytes"]:
        return Refused(413, f"the strings of chunk {key!r} and those before it in its array are "
                            f"{request['over']['max_strings_bytes']}")
    return Refused(413, f"the {count} strings of chunk {key!r} take more than {count} x {request['max_string_bytes']} "
                        f"bytes: a string is {request['over']['max_string_bytes']}")


def _corrupt(key: str, why: str) -> Refused:
    return Refused(400, f"chunk {key!r} is corrupt: {why}")


def _zstd_content_size(data: bytes, key: str) -> int:
    """The content size the zstd frames of ``data`` state, walking their block headers; a frame
    without one (or anything that is not a frame) is refused."""
    pos, total = 0, 0
    while pos < len(data):
        if len(data) - pos < 6 or int.from_bytes(data[pos:pos + 4], "little") != _ZSTD_MAGIC:
            raise _corrupt(key, f"no zstd frame at byte {pos}")
        descriptor = data[pos + 4]
        pos += 5
        single_segment = descriptor >> 5 & 1
        size_bytes = (single_segment, 2, 4, 8)[descriptor >> 6]
        if descriptor & 0x08:
            raise _corrupt(key, "a zstd frame header with its reserved bit set")
        if not size_bytes:  # numcodecs would inflate it with no bound but the memory there is
            raise _corrupt(key, "a zstd frame that does not state its content size")
        pos += (not single_segment) + (0, 1, 2, 4)[descriptor & 3]
        total += int.from_bytes(data[pos:pos + size_bytes], "little") + (256 if size_bytes == 2 else 0)
        pos += size_bytes
        last = 0
        while not last:
            if pos + 3 > len(data):
                raise _corrupt(key, "a truncated zstd frame")
            header = int.from_bytes(data[pos:pos + 3], "little")
            last, kind, size = header & 1, header >> 1 & 3, header >> 3
            if kind == 3:
                raise _corrupt(key, "a reserved zstd block type")
            pos += 3 + (1 if kind == 1 else size)
        pos += 4 * (descriptor >> 2 & 1)  # the content checksum
    if pos != len(data):
        raise _corrupt(key, "a truncated zstd frame")
    return total


def _gunzip(data: bytes, bound: int, key: str) -> bytes:
    """gzip members (zero padding between them allowed, as Python's gzip reads them), inflated
    at most ``bound`` + 1 bytes at a time."""
    out = bytearray()
    while True:
        inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
        while not inflate.eof:
            piece = inflate.decompress(data, bound + 1 - len(out))
            out += piece
            if len(out) > bound:
                raise _too_big(key, bound)
            data = inflate.unconsumed_tail
            if not piece and not data:
                raise _corrupt(key, "a truncated gzip member")
        data = inflate.unused_data.lstrip(b"\0")
        if not data:
            return bytes(out)


def _unwrap(name: str, data: bytes, bound: int, key: str) -> bytes:
    """Undo one bytes -> bytes codec, producing at most ``bound`` bytes."""
    if name == "crc32c":
        import google_crc32c

        if len(data) < 4 or google_crc32c.value(data[:-4]) != int.from_bytes(data[-4:], "little"):
            raise _corrupt(key, "its crc32c checksum does not match")
        return data[:-4]
    if name == "gzip":
        return _gunzip(data, bound, key)
    if name == "zstd":
        from numcodecs.zstd import Zstd

        size = _zstd_content_size(data, key)
        if size > bound:
            raise _too_big(key, bound)
        return Zstd().decode(data, out=bytearray(size))
    if name == "blosc":
        from numcodecs import blosc

        if len(data) < 16:
            raise _corrupt(key, "shorter than a blosc header")
        size, _, stored = struct.unpack_from("<III", data, 4)  # the header: decoded size, block size, stored size
        if stored != len(data):
            raise _corrupt(key, f"its blosc header says {stored} bytes, the chunk has {len(data)}")
        if size > bound:
            raise _too_big(key, bound)
        return blosc.Blosc().decode(data, out=bytearray(size))
    raise _corrupt(key, f"unexpected codec {name!r}")


def _check_strings(data: bytes, count: int, strings: _Strings, key: str) -> None:
    """numcodecs' vlen-utf8 layout: the item count, then each item's length and UTF-8 bytes."""
    limits = strings.request
    if len(data) < 4 or int.from_bytes(data[:4], "little") != count:
        raise _corrupt(key, f"its vlen-utf8 buffer does not hold the {count} strings of its chunk")
    pos = 4
    for _ in range(count):
        if pos + 4 > len(data):
            raise _corrupt(key, "a truncated vlen-utf8 buffer")
        length = int.from_bytes(data[pos:pos + 4], "little")
        if length > limits["max_string_bytes"]:
            raise Refused(413, f"chunk {key!r} holds a string of {length} bytes, {limits['over']['max_string_bytes']}")
        strings.left -= length
        if strings.left < 0:
            raise Refused(413, f"the strings of chunk {key!r} and those before it in its array are "
                               f"{limits['over']['max_strings_bytes']}")
        try:
            data[pos + 4:pos + 4 + length].decode("utf-8")
        except UnicodeDecodeError as error:
            raise _corrupt(key, f"a string that is not UTF-8 ({error})") from None
        pos += 4 + length
    if pos != len(data):
        raise _corrupt(key, "bytes after the last string of its vlen-utf8 buffer")


def _decoded_bound(shape: list[int], itemsize: int, strings: _Strings) -> int:
    """The most bytes a chunk of ``shape`` decodes to: its elements, or for strings
    (``itemsize`` 0) numcodecs' vlen-utf8 layout of what the string budgets leave."""
    count = math.prod(shape)
    if itemsize:
        return count * itemsize
    return 4 + 4 * count + min(strings.left, count * strings.request["max_string_bytes"])


def _stored_limit(codecs: list, shape: list[int], itemsize: int, strings: _Strings) -> int:
    """The most bytes a chunk of ``shape`` may take stored: its decoded bound, compressed
    (``encoded_limit``); a shard, its index and every inner chunk so."""
    sharding = [config for name, config in map(_codec, codecs) if name == "sharding_indexed"]
    if not sharding:
        return encoded_limit(_decoded_bound(shape, itemsize, strings))
    inner = sharding[0]["chunk_shape"]
    count = math.prod(s // c for s, c in zip(shape, inner))
    return 16 * count + 4 + count * _stored_limit(sharding[0]["codecs"], inner, itemsize, strings)


def _check_shard(config: dict, data: bytes, shard: list[int], itemsize: int, strings: _Strings, key: str) -> None:
    """A shard's index (``bytes``, optionally ``crc32c``, at its start or end) and every inner
    chunk it lists."""
    inner = config["chunk_shape"]
    count = math.prod(s // c for s, c in zip(shard, inner))
    index_codecs = [_codec(c) for c in config.get("index_codecs") or ["bytes", "crc32c"]]
    size = 16 * count + 4 * (len(index_codecs) == 2)
    if len(data) < size:
        raise _corrupt(key, f"shorter than its shard index of {size} bytes")
    index = data[:size] if config.get("index_location", "end") == "start" else data[len(data) - size:]
    if len(index_codecs) == 2:
        index = _unwrap("crc32c", index, size, f"{key} (shard index)")
    order = ">" if index_codecs[0][1].get("endian") == "big" else "<"
    entries = struct.unpack(f"{order}{2 * count}Q", index)
    for n in range(count):
        offset, length = entries[2 * n], entries[2 * n + 1]
        if offset == _MISSING and length == _MISSING:
            continue
        where = f"{key} (inner chunk {n})"
        if offset + length > len(data) or length > _stored_limit(config["codecs"], inner, itemsize, strings):
            raise _corrupt(where, f"{length} bytes at {offset} do not fit its shard of {len(data)} bytes")
        _decode(config["codecs"], data[offset:offset + length], inner, itemsize, strings, where)


def _decode(codecs: list, data: bytes, shape: list[int], itemsize: int, strings: _Strings, key: str) -> None:
    """Decode one (inner) chunk of ``shape`` through ``codecs`` (in the order zip_checks has
    checked), bounding every step; ``itemsize`` 0 means vlen-utf8 strings."""
    parsed = [_codec(c) for c in codecs]
    names = [name for name, _ in parsed]
    serializer = next(i for i, name in enumerate(names) if name in ("bytes", "vlen-utf8", "sharding_indexed"))
    bound = len(data) if names[serializer] == "sharding_indexed" else _decoded_bound(shape, itemsize, strings)
    stages = names[serializer + 1:]
    try:
        for n, name in enumerate(reversed(stages)):
            data = _unwrap(name, data, bound if n == len(stages) - 1 else encoded_limit(bound), key)
    except _TooBig:
        if names[serializer] != "vlen-utf8":
            raise
        raise _strings_too_big(key, math.prod(shape), strings) from None
    if names[serializer] == "bytes" and len(data) != bound:
        raise _corrupt(key, f"it decodes to {len(data)} bytes, not the {bound} of its chunk shape {shape}")
    if names[serializer] == "vlen-utf8":
        _check_strings(data, math.prod(shape), strings, key)
    if names[serializer] == "sharding_indexed":
        _check_shard(parsed[serializer][1], data, shape, itemsize, strings, key)


def _chunk_keys(meta: dict):
    """The key of every chunk of the array's grid, as its chunk key encoding writes it."""
    shape, chunks = meta["shape"], meta["chunk_grid"]["configuration"]["chunk_shape"]
    name, config = _codec(meta.get("chunk_key_encoding") or "default")
    separator = config.get("separator", "/" if name == "default" else ".")
    for index in itertools.product(*(range(-(-n // c)) for n, c in zip(shape, chunks))):
        yield separator.join(map(str, ("c", *index))) if name == "default" else separator.join(map(str, index)) or "0"


def _check_array(root: Path, folder: Path, meta: dict, request: dict) -> None:
    """Decode every stored chunk of the array whose metadata ``meta`` is ``folder/zarr.json``."""
    data_type = meta["data_type"]
    if isinstance(data_type, dict):  # fixed_length_utf32
        itemsize = data_type["configuration"]["length_bytes"]
    else:
        itemsize = 0 if data_type == "string" else _ITEMSIZES[data_type]
    shape = meta["chunk_grid"]["configuration"]["chunk_shape"]
    strings = _Strings(request)
    for chunk in _chunk_keys(meta):
        path = folder / chunk
        if not path.is_file():
            continue  # not stored: Zarr reads the fill value
        key = path.relative_to(root).as_posix()
        size, limit = path.stat().st_size, _stored_limit(meta["codecs"], shape, itemsize, strings)
        if size > limit and not itemsize:
            raise _strings_too_big(key, math.prod(shape), strings)
        if size > limit:
            raise _corrupt(key, f"{size} bytes stored, more than its chunk can take encoded ({limit})")
        print(f"key {key}", flush=True)
        try:
            _decode(meta["codecs"], path.read_bytes(), shape, itemsize, strings, key)
        except Refused:
            raise
        except MemoryError:
            raise Refused(400, f"chunk {key!r} needs more memory to decode than its array declares") from None
        except Exception as error:  # numcodecs, zlib and struct each refuse damaged bytes their own way
            raise _corrupt(key, f"{type(error).__name__}: {error}") from None


def _limit_address_space(request: dict) -> None:
    """Cap this process's address space at what it uses now plus a few chunks."""
    import resource

    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return  # no /proc: the decoding is bounded all the same
    used = next(int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmSize:"))
    limit = used + 4 * encoded_limit(request["max_chunk_bytes"]) + request["max_strings_bytes"] + SPARE_ADDRESS_SPACE
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    resource.setrlimit(resource.RLIMIT_AS, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))


def main() -> None:
    request = json.loads(sys.stdin.buffer.read())
    for module in ("google_crc32c", "numcodecs.zstd", "numcodecs.blosc"):
        importlib.import_module(module)  # before the address space is limited
    from numcodecs import blosc

    blosc.use_threads = False
    _limit_address_space(request)
    root = Path(request["root"])
    verdict = {"status": 200}
    try:
        for path in sorted(root.rglob("zarr.json")):
            meta = json.loads(path.read_bytes())
            if meta.get("node_type") == "array" and 0 not in meta["shape"]:
                _check_array(root, path.parent, meta, request)
    except Refused as refusal:
        verdict = {"status": refusal.status, "detail": refusal.detail}
    print(json.dumps(verdict), flush=True)


if __name__ == "__main__":
    main()
