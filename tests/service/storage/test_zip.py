"""Tests of service.storage.zip_extract and zip_checks: safe extraction of an uploaded, zipped Zarr v3 store."""

from __future__ import annotations

import copy
import io
import json
import random
import shutil
import stat
import struct
import warnings
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from service.storage.zip_checks import ITEMSIZES, ZipStoreError, ZipTooLarge, check_array_metadata
from service.storage.zip_extract import extract_zarr_zip

MiB = 1024 * 1024
MAX = 64 * MiB  # max_bytes for the cases not about size
TOP = "image.zarr"
CHUNK = f"{TOP}/image/c/0/0/0"  # the one chunk of the "image" array
BOMB_SIZE = 50 * MiB

Entries = list[tuple["str | zipfile.ZipInfo", bytes]]


def _dataset() -> xr.Dataset:
    return xr.Dataset(
        {"image": (("y", "x", "band"), np.arange(24, dtype="float32").reshape(2, 3, 4))},
        coords={"y": [10.0, 20.0]},
        attrs={"title": "t"},
    )


def _write_store(path: Path, zarr_format: int) -> Path:
    with warnings.catch_warnings():
        # zarr warns that consolidated metadata is not part of the Zarr v3 specification
        warnings.simplefilter("ignore")
        _dataset().to_zarr(path, zarr_format=zarr_format, consolidated=True)
    return path


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real Zarr v3 store written by xarray (never modified by the tests)."""
    return _write_store(tmp_path_factory.mktemp("v3") / TOP, zarr_format=3)


@pytest.fixture(scope="module")
def store_v2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write_store(tmp_path_factory.mktemp("v2") / TOP, zarr_format=2)


def _entries(
    store: Path,
    top: str | None = TOP,
    edit: dict[str, bytes | Callable[[dict], None]] | None = None,
) -> Entries:
    """The files of ``store`` as zip entries, optionally edited (by path inside the store)."""
    edit = dict(edit or {})
    out: Entries = []
    for path in sorted(store.rglob("*")):
        if not path.is_file():
            continue
        rel = path.relative_to(store).as_posix()
        data = path.read_bytes()
        change = edit.pop(rel, None)
        if isinstance(change, bytes):
            data = change
        elif change is not None:
            meta = json.loads(data)
            change(meta)
            data = json.dumps(meta).encode()
        out.append((f"{top}/{rel}" if top else rel, data))
    assert not edit, f"not in the store: {sorted(edit)}"
    return out


def _zip(path: Path, entries: Entries, *, encrypted: tuple[str, ...] = ()) -> Path:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Duplicate name", UserWarning)
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
            for name, data in entries:
                zf.writestr(name, data)
            for info in zf.infolist():
                if info.filename in encrypted:  # the central directory, written on close
                    info.flag_bits |= 0x1
    return path


def _patch_bytes(path: Path, old: bytes, new: bytes) -> None:
    """Replace a name in both the local and the central header (same length)."""
    assert len(old) == len(new)
    data = path.read_bytes()
    assert data.count(old) == 2
    path.write_bytes(data.replace(old, new))


def _outside(tmp: Path, dest: Path) -> list[str]:
    return sorted(
        p.relative_to(tmp).as_posix() for p in tmp.rglob("*") if not p.is_relative_to(dest)
    )


def _bytes_in(dest: Path) -> int:
    return sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())


@dataclass
class Upload:
    tmp: Path
    archive: Path
    dest: Path

    def write(self, entries: Entries, **kwargs) -> Upload:
        _zip(self.archive, entries, **kwargs)
        return self

    def extract(self, **limits) -> Path:
        return extract_zarr_zip(self.archive, self.dest, **{"max_bytes": MAX, **limits})

    def refuse(self, error: type[ZipStoreError], match: str, **limits) -> ZipStoreError:
        """Extraction fails with ``error``, and nothing was created outside ``dest``."""
        before = _outside(self.tmp, self.dest)
        with pytest.raises(error, match=match) as info:
            self.extract(**limits)
        if error is ZipStoreError:
            assert not isinstance(info.value, ZipTooLarge)
        assert _outside(self.tmp, self.dest) == before
        return info.value

    def refuse_before(self, error: type[ZipStoreError], match: str, **limits) -> ZipStoreError:
        """As :meth:`refuse`, and nothing was written to ``dest`` either."""
        exc = self.refuse(error, match, **limits)
        assert list(self.dest.iterdir()) == []
        return exc


@pytest.fixture
def upload(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Upload:
    jail = tmp_path / "jail"
    dest = jail / "dest"
    dest.mkdir(parents=True)
    (jail / "sibling.txt").write_text("not to be touched")
    monkeypatch.chdir(jail)  # a name resolved against the working directory stays in tmp_path
    return Upload(tmp_path, tmp_path / "upload.zip", dest)


# --------------------------------------------------------------------------------------------
# Round trip
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["flat", "folder", "make_archive"])
@pytest.mark.smoke
def test_round_trip(upload: Upload, store: Path, layout: str) -> None:
    if layout == "make_archive":  # with folder entries, as `zip -r` makes them
        made = shutil.make_archive(str(upload.tmp / "upload"), "zip", store.parent, TOP)
        assert Path(made) == upload.archive
        with zipfile.ZipFile(upload.archive) as zf:
            assert f"{TOP}/" in zf.namelist()
    else:
        upload.write(_entries(store, top=None if layout == "flat" else TOP))

    root = upload.extract()

    expected = upload.dest.resolve() if layout == "flat" else upload.dest.resolve() / TOP
    assert root == expected
    assert (root / "zarr.json").is_file()
    with xr.open_zarr(root, zarr_format=3) as opened:
        loaded = opened.load()
    xr.testing.assert_identical(loaded, _dataset())
    assert loaded["image"].dims == ("y", "x", "band")
    assert loaded.attrs == {"title": "t"}
    np.testing.assert_array_equal(loaded["y"].values, [10.0, 20.0])


def test_macos_entries_are_checked_but_not_extracted(upload: Upload, store: Path) -> None:
    entries = _entries(store)
    entries += [(f"__MACOSX/{TOP}/._zarr.json", b"\x00\x05\x16\x07"), (f"{TOP}/.DS_Store", b"x")]
    root = upload.write(entries).extract()
    assert root == upload.dest.resolve() / TOP
    assert sorted(p.name for p in upload.dest.iterdir()) == [TOP]
    assert not (root / ".DS_Store").exists()


def test_destination_must_be_empty(upload: Upload, store: Path) -> None:
    upload.write(_entries(store))
    (upload.dest / "old").write_text("x")
    with pytest.raises(ValueError, match="not empty") as info:
        upload.extract()
    assert not isinstance(info.value, ZipStoreError)


# --------------------------------------------------------------------------------------------
# Zip bombs
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bomb() -> bytes:
    """A ~50 KiB archive whose one member inflates to 50 MiB of zeros."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(CHUNK, bytes(BOMB_SIZE))
    assert len(buf.getvalue()) < MiB
    return buf.getvalue()


def _lie_about_size(blob: bytes, name: str, size: int) -> bytes:
    """Rewrite the uncompressed size of ``name`` in its local and central headers."""
    buf = bytearray(blob)
    eocd = buf.rindex(b"PK\x05\x06")
    (count,) = struct.unpack_from("<H", buf, eocd + 10)
    (pos,) = struct.unpack_from("<I", buf, eocd + 16)
    for _ in range(count):
        assert buf[pos : pos + 4] == b"PK\x01\x02"
        name_len, extra_len, comment_len = struct.unpack_from("<HHH", buf, pos + 28)
        (local,) = struct.unpack_from("<I", buf, pos + 42)
        if buf[pos + 46 : pos + 46 + name_len] == name.encode():
            assert buf[local : local + 4] == b"PK\x03\x04"
            struct.pack_into("<I", buf, pos + 24, size)  # central directory
            struct.pack_into("<I", buf, local + 22, size)  # local file header
        pos += 46 + name_len + extra_len + comment_len
    with zipfile.ZipFile(io.BytesIO(bytes(buf))) as zf:
        assert zf.getinfo(name).file_size == size
    return bytes(buf)


def test_zip_bomb_with_truthful_sizes(upload: Upload, bomb: bytes) -> None:
    upload.archive.write_bytes(bomb)
    rule = rf"'{CHUNK}': the declared .* add up to {BOMB_SIZE} bytes .*max_bytes={MiB}"
    upload.refuse_before(ZipTooLarge, rule, max_bytes=MiB)


def test_zip_bomb_with_lying_sizes_is_refused_by_the_reader(upload: Upload, bomb: bytes) -> None:
    # The standard library stops at the declared size, then finds that the CRC does not match.
    upload.archive.write_bytes(_lie_about_size(bomb, CHUNK, 1000))
    upload.refuse(ZipStoreError, rf"'{CHUNK}'.*cannot be read", max_bytes=MiB)
    assert _bytes_in(upload.dest) <= MiB


def test_zip_bomb_with_lying_sizes_is_caught_while_writing(
    upload: Upload, bomb: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The headers declare 1000 bytes, so the declared sum passes; a reader that trusts the
    # compressed stream instead of the header (as lenient unzippers do) leaves only the count
    # of the bytes actually written to stop the bomb.
    upload.archive.write_bytes(_lie_about_size(bomb, CHUNK, 1000))
    real_open = zipfile.ZipFile.open

    def lenient_open(self, name, mode="r", pwd=None, **kwargs):
        if isinstance(name, zipfile.ZipInfo) and name.filename == CHUNK:
            name = copy.copy(name)
            name.file_size = BOMB_SIZE
        return real_open(self, name, mode, pwd, **kwargs)

    monkeypatch.setattr(zipfile.ZipFile, "open", lenient_open)
    rule = rf"'{CHUNK}': expands past max_bytes={MiB} while being written.*declared size is 1000"
    upload.refuse(ZipTooLarge, rule, max_bytes=MiB)
    assert _bytes_in(upload.dest) <= MiB


def test_sizes_add_up_over_entries(upload: Upload) -> None:
    upload.write([(f"{TOP}/a", bytes(600_000)), (f"{TOP}/b", bytes(600_000))])
    upload.refuse_before(ZipTooLarge, rf"'{TOP}/b'.*1200000 bytes.*max_bytes={MiB}", max_bytes=MiB)


# --------------------------------------------------------------------------------------------
# Hostile entries, refused before anything is written
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "rule"),
    [
        ("../evil", r"'\.\.' component"),
        ("../../evil", r"'\.\.' component"),
        (f"{TOP}/../../evil", r"'\.\.' component"),
        ("./zarr.json", r"'\.' component"),
        ("/abs", "absolute"),
        ("a\\b", "backslash"),
        ("..\\evil", "backslash"),
        ("C:\\evil", "backslash"),
        ("C:/evil", "drive letter"),
        ("\\\\server\\share\\evil", "backslash"),
        (f"{TOP}//evil", "empty component"),
        ("x" * 300, "longer than 255 bytes"),
    ],
)
def test_unsafe_names(upload: Upload, store: Path, name: str, rule: str) -> None:
    if name == "/abs":
        name = f"{upload.tmp}/evil"  # were it written, the listing of tmp_path would show it
    upload.write([*_entries(store), (name, b"evil")])
    exc = upload.refuse_before(ZipStoreError, rule)
    assert repr(name if len(name) <= 200 else f"{name[:200]}...") in str(exc)
    assert not (upload.tmp / "evil").exists()


def test_nul_in_name(upload: Upload, store: Path) -> None:
    # zipfile cuts a name at a NUL, so write "zarr.jsonXjunk" and patch the byte afterwards.
    upload.write([*_entries(store, top=None, edit={"zarr.json": b"{}"}), ("zarr.jsonXjunk", b"{}")])
    _patch_bytes(upload.archive, b"zarr.jsonXjunk", b"zarr.json\x00junk")
    upload.refuse_before(ZipStoreError, r"'zarr\.json\\x00junk': name contains a NUL byte")


@pytest.mark.parametrize(
    ("kind", "rule"),
    [
        (stat.S_IFLNK, "symbolic links are not allowed"),
        (stat.S_IFIFO, "only regular files and folders are allowed"),
    ],
)
def test_links_and_special_files(upload: Upload, store: Path, kind: int, rule: str) -> None:
    info = zipfile.ZipInfo(f"{TOP}/image/c/0/0/1")
    info.external_attr = (kind | 0o777) << 16
    upload.write([*_entries(store), (info, b"/etc/passwd")])
    mode = f"0o{kind | 0o777:o}"
    upload.refuse_before(ZipStoreError, rf"'{TOP}/image/c/0/0/1': {rule} \(mode {mode}\)")


@pytest.mark.parametrize(
    ("extra", "rule"),
    [
        ([(f"{TOP}/zarr.json", b"{}")], rf"'{TOP}/zarr\.json': duplicate of entry '{TOP}/zarr"),
        ([(f"{TOP}/y/", b"")], rf"'{TOP}/y/': duplicate of entry '{TOP}/y'"),
    ],
)
def test_duplicates(upload: Upload, store: Path, extra: Entries, rule: str) -> None:
    entries = _entries(store)
    if extra[0][0].endswith("/"):
        entries.insert(0, (f"{TOP}/y", b"a file named y"))
    upload.write([*entries, *extra])
    upload.refuse_before(ZipStoreError, rule)


def test_file_used_as_folder(upload: Upload, store: Path) -> None:
    upload.write([*_entries(store), (f"{TOP}/image/c/0/0/0/1", b"x")])
    rule = rf"'{TOP}/image/c/0/0/0': is a file, but other entries use it as a folder"
    upload.refuse_before(ZipStoreError, rule)


def test_too_many_entries(upload: Upload, store: Path) -> None:
    entries = _entries(store)
    assert len(entries) == 5
    upload.write(entries).extract(max_entries=5)  # the limit itself is allowed
    shutil.rmtree(upload.dest)
    upload.dest.mkdir()
    upload.refuse_before(ZipStoreError, "5 entries, more than max_entries=4", max_entries=4)


def test_encrypted_entry(upload: Upload, store: Path) -> None:
    upload.write(_entries(store), encrypted=(CHUNK,))
    upload.refuse_before(ZipStoreError, rf"'{CHUNK}': encrypted entries are not allowed")


def test_bzip2_entry(upload: Upload, store: Path) -> None:
    info = zipfile.ZipInfo(f"{TOP}/image/c/0/0/1")
    info.compress_type = zipfile.ZIP_BZIP2
    upload.write([*_entries(store), (info, b"data")])
    rule = rf"'{TOP}/image/c/0/0/1': compression method 12 is not allowed"
    upload.refuse_before(ZipStoreError, rule)


def test_not_a_zip(upload: Upload) -> None:
    upload.archive.write_bytes(b"this is not a zip archive\n" * 10)
    upload.refuse_before(ZipStoreError, "not a zip file")


# --------------------------------------------------------------------------------------------
# Nested archives
# --------------------------------------------------------------------------------------------


def _inner_zip() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("zarr.json", b"{}")
    return buf.getvalue()


def test_nested_zip_by_name(upload: Upload, store: Path) -> None:
    upload.write([*_entries(store), (f"{TOP}/inner.ZIP", b"not even a zip")])
    upload.refuse_before(ZipStoreError, rf"'{TOP}/inner\.ZIP': nested zip archives.*'\.zip'")


def test_nested_zip_by_content(upload: Upload, store: Path) -> None:
    upload.write(_entries(store, edit={"image/c/0/0/0": _inner_zip()}))
    upload.refuse(ZipStoreError, rf"'{CHUNK}': nested zip archives.*PK")


# --------------------------------------------------------------------------------------------
# Zarr metadata
# --------------------------------------------------------------------------------------------


def test_no_zarr_json(upload: Upload) -> None:
    upload.write([(f"{TOP}/data.bin", b"\x00" * 10), (f"{TOP}/readme.txt", b"hello")])
    upload.refuse(ZipStoreError, rf"no zarr\.json at the store root '{TOP}/'")


def test_store_two_folders_deep(upload: Upload, store: Path) -> None:
    upload.write(_entries(store, top=f"upload/{TOP}"))
    upload.refuse(ZipStoreError, r"no zarr\.json at the store root 'upload/'")


def test_zarr_v2_store(upload: Upload, store_v2: Path) -> None:
    upload.write(_entries(store_v2))
    upload.refuse(ZipStoreError, r"Zarr v2 store.*only Zarr v3.*to_zarr\(\.\.\., zarr_format=3\)")


def test_zarr_json_says_format_2(upload: Upload, store: Path) -> None:
    upload.write(_entries(store, edit={"zarr.json": lambda m: m.update(zarr_format=2)}))
    upload.refuse(ZipStoreError, r"zarr_format is 2, not 3; only Zarr v3.*zarr_format=3")


@pytest.mark.parametrize(
    ("path", "content", "rule"),
    [
        ("zarr.json", b"{not json", r"zarr\.json is not valid JSON"),
        ("zarr.json", b"\xff\xfe garbage", r"zarr\.json is not valid JSON"),
        ("zarr.json", b"[" * 100_000 + b"]" * 100_000, r"zarr\.json is not valid JSON"),
        ("zarr.json", b"[1, 2]", "must hold a JSON object, got list"),
        ("zarr.json", b" " * (10 * MiB + 1) + b"{}", r"zarr\.json is too large"),
        ("image/zarr.json", b"{not json", r"zarr\.json is not valid JSON"),
        ("y/zarr.json", b'{"zarr_format": 3}', "node_type is None"),
        ("y/zarr.json", b'{"zarr_format": "3", "node_type": "array"}', "zarr_format is '3', not 3"),
    ],
)
def test_bad_zarr_json(upload: Upload, store: Path, path: str, content: bytes, rule: str) -> None:
    upload.write(_entries(store, edit={path: content}))
    exc = upload.refuse(ZipStoreError, rule)
    assert str(exc).startswith(f"'{TOP}/{path}'")


def _set(key: str, value: object) -> Callable[[dict], None]:
    return lambda meta: meta.update({key: value})


def _set_chunks(chunks: list[int]) -> Callable[[dict], None]:
    return lambda meta: meta["chunk_grid"]["configuration"].update(chunk_shape=chunks)


def _set_codec(name: str) -> Callable[[dict], None]:
    return lambda meta: meta["codecs"][1].update(name=name)


@pytest.mark.parametrize(
    ("edit", "error", "rule", "limits"),
    [
        pytest.param(
            _set("shape", [10**6, 10**6, 4]),
            ZipTooLarge,
            r"array shape \[1000000, 1000000, 4\] of float32 .*max_bytes=67108864",
            {},
            id="huge-shape",
        ),
        pytest.param(
            _set_chunks([10**7, 3, 4]),
            ZipTooLarge,
            r"chunk_shape \[10000000, 3, 4\] of float32 .*max_chunk_bytes=67108864",
            {},
            id="huge-chunk",
        ),
        pytest.param(
            _set_chunks([2, 3, 4]),
            ZipTooLarge,
            r"chunk_shape \[2, 3, 4\] of float32 is 96 bytes.*max_chunk_bytes=64",
            {"max_chunk_bytes": 64},
            id="chunk-over-max_chunk_bytes",
        ),
        pytest.param(
            _set_codec("evil_codec"),
            ZipStoreError,
            r"unknown codec 'evil_codec'; allowed codecs: blosc, bytes, crc32c",
            {},
            id="unknown-codec",
        ),
        pytest.param(
            _set("data_type", "r16"),
            ZipStoreError,
            r"unsupported data_type 'r16'; supported data types: bool, int8, .*complex128",
            {},
            id="unsupported-data-type",
        ),
    ],
)
def test_bad_array_metadata(
    upload: Upload, store: Path, edit: Callable[[dict], None], error: type, rule: str, limits: dict
) -> None:
    upload.write(_entries(store, edit={"image/zarr.json": edit}))
    exc = upload.refuse(error, rule, **limits)
    # The consolidated copy in the root zarr.json is checked first; either names the array.
    assert str(exc).startswith(
        (f"'{TOP}/image/zarr.json': ", f"'{TOP}/zarr.json' (consolidated_metadata 'image'): ")
    )


def test_bad_consolidated_metadata(upload: Upload, store: Path) -> None:
    # xarray reads the consolidated copy in the root zarr.json, not image/zarr.json
    def edit(meta: dict) -> None:
        meta["consolidated_metadata"]["metadata"]["image"]["shape"] = [10**9, 3, 4]

    upload.write(_entries(store, edit={"zarr.json": edit}))
    rule = rf"'{TOP}/zarr\.json' \(consolidated_metadata 'image'\): array shape"
    upload.refuse(ZipTooLarge, rule)


# --------------------------------------------------------------------------------------------
# check_array_metadata on its own
# --------------------------------------------------------------------------------------------


def _grid(*chunk_shape: int) -> dict:
    return {"name": "regular", "configuration": {"chunk_shape": list(chunk_shape)}}


def _array(**changes: object) -> dict:
    """A valid uint16 array of 100 x 200 (40000 bytes) in chunks of 10 x 20 (400 bytes)."""
    meta = {
        "zarr_format": 3,
        "node_type": "array",
        "shape": [100, 200],
        "data_type": "uint16",
        "chunk_grid": _grid(10, 20),
        "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "gzip"}],
    }
    meta.update(changes)
    return meta


def _sharded(codecs: list, index_codecs: list, chunk_shape: tuple[int, ...] = (5, 10)) -> dict:
    config = {"chunk_shape": list(chunk_shape), "codecs": codecs, "index_codecs": index_codecs}
    return _array(codecs=[{"name": "sharding_indexed", "configuration": config}])


BYTES = {"name": "bytes"}


def test_check_array_metadata_accepts() -> None:
    limits = {"max_bytes": 40_000, "max_chunk_bytes": 400}
    check_array_metadata(_array(), **limits)
    check_array_metadata(_array(codecs=["bytes", "zstd"]), **limits)  # names without config
    check_array_metadata(_array(shape=[0, 10**30], chunk_grid=_grid(1, 1)), **limits)
    check_array_metadata(_sharded([BYTES, {"name": "zstd"}], [BYTES, {"name": "crc32c"}]), **limits)
    scalar = _array(shape=[], chunk_grid=_grid(), data_type="int16")
    check_array_metadata(scalar, max_bytes=2, max_chunk_bytes=2)
    for data_type, itemsize in ITEMSIZES.items():
        meta = _array(data_type=data_type, shape=[3], chunk_grid=_grid(3))
        check_array_metadata(meta, max_bytes=3 * itemsize, max_chunk_bytes=3 * itemsize)
        with pytest.raises(ZipTooLarge):
            check_array_metadata(meta, max_bytes=3 * itemsize - 1, max_chunk_bytes=10**6)
        with pytest.raises(ZipTooLarge):
            check_array_metadata(meta, max_bytes=10**6, max_chunk_bytes=3 * itemsize - 1)


NESTED_SHARDING = {
    "name": "sharding_indexed",
    "configuration": {"chunk_shape": [1, 1], "codecs": ["evil"]},
}


@pytest.mark.parametrize(
    ("meta", "error", "rule"),
    [
        (
            _array(shape=[100, 201]),
            ZipTooLarge,
            r"array shape \[100, 201\] of uint16 is 40200 bytes or more, more than max_bytes=40000",
        ),
        (_array(shape=[10**100, 10**100]), ZipTooLarge, "more than max_bytes=40000"),
        (_array(shape=[-1, 2]), ZipStoreError, "shape must be a list of non-negative integers"),
        (_array(shape=[True, 2]), ZipStoreError, "shape must be a list of non-negative integers"),
        (_array(shape="100"), ZipStoreError, "shape must be a list"),
        (_array(data_type={"name": "uint16"}), ZipStoreError, r"data_type \{'name': 'uint16'\}"),
        (_array(data_type="datetime64"), ZipStoreError, "data_type 'datetime64'.*bool, int8"),
        (_array(chunk_grid=_grid(1, 1) | {"name": "rect"}), ZipStoreError, "chunk_grid must"),
        (_array(chunk_grid=None), ZipStoreError, "chunk_grid must be"),
        (_array(chunk_grid=_grid(10, 0)), ZipStoreError, "chunk_shape must be a list of positive"),
        (_array(chunk_grid=_grid(10)), ZipStoreError, r"chunk_shape \[10\] has 1 dimensions"),
        (_array(chunk_grid=_grid(100, 200)), ZipTooLarge, r"chunk_shape \[100, 200\] of uint16 is"),
        (_array(chunk_grid=_grid(1, 10**9)), ZipTooLarge, r"chunk_shape \[1, 1000000000\]"),
        (_array(codecs={"name": "bytes"}), ZipStoreError, "codecs must be a list"),
        (_array(codecs=[BYTES, {"name": "numcodecs.pickle"}]), ZipStoreError, "'numcodecs.pickle'"),
        (_array(codecs=[{"configuration": {}}]), ZipStoreError, "a codec must be a name or an"),
        (_sharded([BYTES, {"name": "lz4"}], [BYTES]), ZipStoreError, "codecs: unknown codec 'lz4'"),
        (_sharded([BYTES], [BYTES, "evil"]), ZipStoreError, "index_codecs: unknown codec 'evil'"),
        (
            _sharded([NESTED_SHARDING], []),
            ZipStoreError,
            "codecs > sharding_indexed codecs > sharding_indexed codecs: unknown codec 'evil'",
        ),
        (_sharded([BYTES], [BYTES], (5,)), ZipStoreError, r"chunk_shape \[5\] has 1 dimensions"),
        (_sharded([BYTES], [BYTES], (10, 21)), ZipTooLarge, r"ed chunk_shape \[10, 21\] of"),
        (_array(codecs=["sharding_indexed"]), ZipStoreError, "needs a 'configuration' object"),
    ],
)
def test_check_array_metadata_refuses(meta: dict, error: type, rule: str) -> None:
    with pytest.raises(error, match=rule) as info:
        check_array_metadata(meta, max_bytes=40_000, max_chunk_bytes=400)
    if error is ZipStoreError:
        assert not isinstance(info.value, ZipTooLarge)


def test_corrupted_archives_are_refused_cleanly(upload: Upload, store: Path) -> None:
    # Random damage anywhere (headers, central directory, data) ends in a ZipStoreError or,
    # when harmless, an extracted store: never another exception, never a file outside dest.
    good = _zip(upload.tmp / "good.zip", _entries(store)).read_bytes()
    rng = random.Random(1234)
    before = _outside(upload.tmp, upload.dest)
    for _ in range(300):
        damaged = bytearray(good)
        for _ in range(rng.randint(1, 4)):
            damaged[rng.randrange(len(damaged))] = rng.randrange(256)
        upload.archive.write_bytes(damaged)
        shutil.rmtree(upload.dest)
        upload.dest.mkdir()
        try:
            upload.extract(max_bytes=MiB)
        except ZipStoreError:
            pass
        assert _outside(upload.tmp, upload.dest) == before + ["upload.zip"]
