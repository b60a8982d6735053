"""service/storage/npy.py: NPY round trips, NumPy compatibility, streaming headers and hostile input."""

from __future__ import annotations

import io
import struct
import tracemalloc

import numpy as np
import pytest

from ops import dtypes
from service.storage import npy
from service.storage.npy import MAGIC, NpyError, NpyHeader, NpyTooLarge
from tests.helpers import assert_same, random_array

LIMIT = 1 << 20
SHAPES = [(), (0,), (1,), (5,), (2, 3), (2, 0, 4), (3, 1, 2, 2)]
ORDINARY = [t for t in dtypes.SUPPORTED if t not in (dtypes.bfloat16, dtypes.complex32)]
MULTIBYTE = [t for t in dtypes.SUPPORTED if t.itemsize > 1 and t.names is None]


def ids(dtype) -> str:
    return dtypes.name(np.dtype(dtype))


def np_save(array, **kwargs) -> bytes:
    buf = io.BytesIO()
    np.save(buf, array, **kwargs)
    return buf.getvalue()


def np_load(data: bytes) -> np.ndarray:
    return np.load(io.BytesIO(data), allow_pickle=False)


def build(header, data: bytes = b"", *, version=(1, 0)) -> bytes:
    """An NPY with ``header`` (a dict, or its text as is) padded to 64 bytes, then ``data``."""
    text = header if isinstance(header, str) else repr(header)
    raw = text.encode("utf8" if version == (3, 0) else "latin1")
    len_size = 2 if version == (1, 0) else 4
    fixed = len(MAGIC) + 2 + len_size
    raw += b" " * (-(fixed + len(raw) + 1) % 64) + b"\n"
    length = struct.pack("<H" if len_size == 2 else "<I", len(raw))
    return MAGIC + bytes(version) + length + raw + data


def simple(descr="<f4", shape=(2,), fortran_order=False, **extra) -> dict:
    return {"descr": descr, "fortran_order": fortran_order, "shape": shape, **extra}


def wire_of(array: np.ndarray) -> tuple[bytes, str | None]:
    return npy.encode(array), npy.wire_dtype(array.dtype)[1]


# ---------------------------------------------------------------------------------------------
# round trips


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", dtypes.SUPPORTED, ids=ids)
def test_round_trip_every_dtype(dtype, shape):
    array = random_array(np.random.default_rng(0), shape, dtype)
    data, declared = wire_of(array)
    assert (declared is not None) == (dtype in (dtypes.bfloat16, dtypes.complex32))
    back = npy.decode(data, max_bytes=LIMIT, declared_dtype=declared)
    assert_same(back, array)
    assert back.flags.c_contiguous and back.flags.writeable
    assert npy.encode(back) == data


@pytest.mark.parametrize("dtype", MULTIBYTE, ids=ids)
@pytest.mark.smoke
def test_round_trip_big_endian(dtype):
    big = dtype.newbyteorder(">")
    array = random_array(np.random.default_rng(1), (3, 4), big)
    data, declared = wire_of(array)
    wire = npy.wire_dtype(big)[0]
    assert wire.byteorder == ">"
    assert f"'descr': '{wire.str}'".encode() in data[:128]
    back = npy.decode(data, max_bytes=LIMIT, declared_dtype=declared)
    assert back.dtype == big and back.dtype.byteorder == ">"
    assert_same(back, array)
    assert npy.encode(back) == data


def test_big_endian_complex32_travels_little_endian():
    array = random_array(np.random.default_rng(2), (4,), dtypes.complex32)
    big = array.astype(dtypes.complex32.newbyteorder(">"))
    assert npy.wire_dtype(big.dtype) == (np.dtype("<u4"), "complex32")
    data = npy.encode(big)
    assert data == npy.encode(array)
    assert_same(npy.decode(data, max_bytes=LIMIT, declared_dtype="complex32"), array)


def test_raw_bits_on_the_wire():
    """bfloat16 and complex32 are plain uint16 / uint32 NPYs that NumPy itself reads."""
    bf = random_array(np.random.default_rng(3), (2, 3), dtypes.bfloat16)
    assert_same(np_load(npy.encode(bf)), bf.view("<u2"))
    bf_big = bf.astype(dtypes.bfloat16.newbyteorder(">"))
    assert_same(np_load(npy.encode(bf_big)), bf_big.view(">u2"))
    back = npy.decode(npy.encode(bf_big), max_bytes=LIMIT, declared_dtype="bfloat16")
    assert back.dtype == dtypes.bfloat16.newbyteorder(">")
    np.testing.assert_array_equal(back.astype(np.float32), bf.astype(np.float32))
    c32 = random_array(np.random.default_rng(4), (5,), dtypes.complex32)
    assert_same(np_load(npy.encode(c32)), c32.view("<u4"))


def test_decode_copies_the_input():
    array = np.arange(6, dtype=np.int32).reshape(2, 3)
    data = bytearray(npy.encode(array))
    back = npy.decode(data, max_bytes=LIMIT)
    data[-4:] = b"\xff" * 4
    back[0, 0] = 7
    assert back[1, 2] == 5
    assert npy.decode(memoryview(bytes(data)), max_bytes=LIMIT)[1, 2] == -1


# ---------------------------------------------------------------------------------------------
# compatibility with numpy's own reader and writer


@pytest.mark.parametrize("fortran", [False, True], ids=["C", "F"])
@pytest.mark.parametrize("dtype", ORDINARY + [t.newbyteorder(">") for t in MULTIBYTE
                                              if t in ORDINARY], ids=lambda t: t.str)
def test_decode_matches_np_load(dtype, fortran):
    rng = np.random.default_rng(5)
    for shape in SHAPES + [(3, 4, 5)]:
        array = random_array(rng, shape, dtype)
        if fortran:
            array = np.asfortranarray(array)
        data = np_save(array)
        if fortran and array.ndim > 1 and array.size > 1:
            assert b"'fortran_order': True" in data[:128]
        back = npy.decode(data, max_bytes=LIMIT)
        assert_same(back, np_load(data))
        assert back.flags.c_contiguous and back.flags.writeable


def test_decode_np_save_of_complex32_and_noncontiguous():
    c32 = random_array(np.random.default_rng(6), (3, 2), dtypes.complex32)
    data = np_save(c32)
    assert b"'descr': [('real', '<f2'), ('imag', '<f2')]" in data
    assert_same(npy.decode(data, max_bytes=LIMIT), c32)
    assert_same(npy.decode(data, max_bytes=LIMIT, declared_dtype="complex32"), c32)
    strided = np.arange(60, dtype=np.float64).reshape(3, 4, 5)[:, ::2, 1:].transpose(2, 0, 1)
    assert_same(npy.decode(np_save(strided), max_bytes=LIMIT), strided)


@pytest.mark.parametrize("dtype", ORDINARY + [t.newbyteorder(">") for t in MULTIBYTE
                                              if t in ORDINARY], ids=lambda t: t.str)
def test_encode_equals_np_save(dtype):
    rng = np.random.default_rng(7)
    for shape in SHAPES + [(70,) * 2, (1234567,) + (0,) * 10]:
        array = random_array(rng, shape, dtype)
        data = npy.encode(array)
        assert data == np_save(array)
        assert_same(np_load(data), array)
        header = npy.header_bytes(array.dtype, array.shape)
        assert data.startswith(header) and len(header) % 64 == 0
    # Fortran-ordered input is written in C order, as np.save writes C-contiguous arrays.
    fortran = np.asfortranarray(random_array(rng, (3, 4), dtype))
    assert npy.encode(fortran) == np_save(np.ascontiguousarray(fortran))


def test_header_bytes():
    assert npy.header_bytes(np.dtype("<f8"), (np.int64(2), 3)) == npy.header_bytes(
        np.dtype("<f8"), (2, 3))
    assert b"'descr': '<u2'" in npy.header_bytes(dtypes.bfloat16, (4,))
    assert b"'descr': '>u2'" in npy.header_bytes(dtypes.bfloat16.newbyteorder(">"), (4,))
    assert b"'descr': '<u4'" in npy.header_bytes(dtypes.complex32, (4,))
    assert b"'descr': '>c16'" in npy.header_bytes(np.dtype(">c16"), ())
    with pytest.raises(ValueError, match="dtype must be one of"):
        npy.header_bytes(np.dtype(object), (1,))


def test_wire_dtype():
    assert npy.wire_dtype(dtypes.bfloat16) == (np.dtype("<u2"), "bfloat16")
    wire, declared = npy.wire_dtype(dtypes.bfloat16.newbyteorder(">"))
    assert (wire, wire.byteorder, declared) == (np.dtype(">u2"), ">", "bfloat16")
    assert npy.wire_dtype(dtypes.complex32) == (np.dtype("<u4"), "complex32")
    for t in ORDINARY:
        assert npy.wire_dtype(t) == (t, None)
    assert npy.wire_dtype(np.dtype(">f4"))[0].byteorder == ">"


def test_encode_refuses_unsupported():
    with pytest.raises(ValueError, match="dtype must be one of"):
        npy.encode(np.array(["a"]))


# ---------------------------------------------------------------------------------------------
# streaming: parse_header on growing prefixes


@pytest.mark.parametrize("version", [(1, 0), (2, 0), (3, 0)], ids=lambda v: f"v{v[0]}")
def test_parse_header_waits_for_the_whole_header(version):
    array = np.arange(12, dtype=">i4").reshape(3, 4)
    data = build(simple(">i4", (3, 4)), array.tobytes(), version=version)
    expected = NpyHeader(np.dtype(">i4"), (3, 4), False, len(data) - 48)
    assert expected.data_offset % 64 == 0 and expected.nbytes == 48
    for k in range(expected.data_offset):
        assert npy.parse_header(data[:k], max_bytes=LIMIT) is None, k
    for k in (expected.data_offset, expected.data_offset + 1, len(data)):
        assert npy.parse_header(data[:k], max_bytes=LIMIT) == expected
    assert_same(npy.decode(data, max_bytes=LIMIT), array)


def test_parse_header_of_np_save_output():
    data = np_save(np.asfortranarray(np.zeros((2, 3), dtype=np.complex64)))
    header = npy.parse_header(data, max_bytes=LIMIT)
    assert header == NpyHeader(np.dtype("<c8"), (2, 3), True, 128)
    assert header.data_offset + header.nbytes == len(data)
    assert npy.parse_header(memoryview(data)[:127], max_bytes=LIMIT) is None


def test_parse_header_declared_dtype():
    def parse(descr, declared, shape=(2,)):
        return npy.parse_header(build(simple(descr, shape)), max_bytes=LIMIT,
                                declared_dtype=declared)

    assert parse("<u2", "bfloat16").dtype == dtypes.bfloat16
    big = parse(">u2", "bfloat16")
    assert big.dtype == dtypes.bfloat16.newbyteorder(">") and big.dtype.byteorder == ">"
    assert parse("<u2", "bfloat16").nbytes == 4
    assert parse("<u4", "complex32").dtype == dtypes.complex32
    assert parse(dtypes.complex32.descr, "complex32").dtype == dtypes.complex32
    assert parse(dtypes.complex32.descr, None).dtype == dtypes.complex32
    # the NPY's own dtype name is a no-op, whatever the byte order
    assert parse(">f4", "float32").dtype == np.dtype(">f4")
    assert parse("|b1", "bool").dtype == np.bool_
    assert parse("<u2", "uint16").dtype == np.uint16
    assert parse(dtypes.complex32.descr, "complex32", (3,)).nbytes == 12


# ---------------------------------------------------------------------------------------------
# hostile input

FOUR_GIB_HEADER = MAGIC + b"\x02\x00" + struct.pack("<I", 2**32 - 1)
PICKLED = np_save(np.array([1, "a", None], dtype=object), allow_pickle=True)

HOSTILE = {
    # name: (NPY bytes, declared dtype, error class, distinctive part of the message)
    "object-pickle": (PICKLED, None, NpyError, "descr must be one of the supported dtypes"),
    "object-descr": (build(simple("|O")), None, NpyError, "got '|O'"),
    "bad-magic": (b"PK\x03\x04" + bytes(200), None, NpyError, "magic string must be"),
    "bad-magic-late": (b"\x93NUMPX\x01\x00" + bytes(120), None, NpyError, "magic string"),
    "version-4.0": (build(simple()).replace(b"\x01\x00", b"\x04\x00", 1), None, NpyError,
                    "version must be 1.0, 2.0 or 3.0, got 4.0"),
    "version-1.1": (MAGIC + b"\x01\x01" + bytes(200), None, NpyError, "got 1.1"),
    "4-GiB-header": (FOUR_GIB_HEADER, None, NpyError,
                     "length must be at most 10000 bytes, got 4294967295"),
    "header-over-10000": (build(simple() | {"pad": "x" * 10_000}, version=(2, 0)), None,
                          NpyError, "length must be at most 10000 bytes, got 10"),
    "not-a-dict": (build("[('descr', '<f4')]"), None, NpyError, "must be a Python dict literal"),
    "syntax-error": (build("{'descr': '<f4',"), None, NpyError, "must be a Python dict literal"),
    "call": (build("__import__('os').system('true')"), None, NpyError, "dict literal"),
    "call-inside": (build("{'descr': __import__('os'), 'fortran_order': False, 'shape': ()}"),
                    None, NpyError, "may only contain plain literals"),
    "set-inside": (build("{'descr': '<f4', 'fortran_order': False, 'shape': {1}}"), None,
                   NpyError, "may only contain plain literals, got '{1}'"),
    "dict-unpack": (build("{**{'descr': '<f4'}, 'fortran_order': False, 'shape': ()}"), None,
                    NpyError, "keys must be strings"),
    "duplicate-key": (build("{'descr': '<f4', 'descr': '<f8', 'fortran_order': False, "
                            "'shape': ()}"), None, NpyError, "must not repeat, got 'descr'"),
    "deep-nesting": (build("{'shape': " + "(" * 500 + ")" * 500 + "}"), None, NpyError,
                     "dict literal"),
    "huge-int-literal": (build("{'descr': '<f4', 'fortran_order': False, 'shape': (" +
                               "9" * 5000 + ",)}"), None, NpyError, "dict literal"),
    "bad-utf8-v3": (build("{'descr': '<f4'}", version=(3, 0)).replace(b"<f4", b"\xff\xfe4"),
                    None, NpyError, "must be valid utf8 text"),
    "extra-key": (build(simple(extra=1)), None, NpyError, "unexpected 'extra'"),
    "missing-key": (build({"descr": "<f4", "fortran_order": False}), None, NpyError,
                    "missing 'shape'"),
    "fortran-order-int": (build(simple(fortran_order=1)), None, NpyError,
                          "fortran_order must be True or False, got 1"),
    "shape-list": (build(simple(shape=[2])), None, NpyError, "shape must be a tuple of ints"),
    "negative-dim": (build(simple(shape=(2, -1))), None, NpyError,
                     "shape dimensions must be >= 0, got -1"),
    "bool-dim": (build(simple(shape=(True, 2))), None, NpyError, "not bools), got True"),
    "float-dim": (build(simple(shape=(2.0,))), None, NpyError, "must be ints (not bools), got 2.0"),
    "too-many-dims": (build(simple(shape=(1,) * 65)), None, NpyError,
                      "at most 64 dimensions, got 65"),
    "element-count-overflow": (build(simple("|u1", (2**32, 2**32))), None, NpyError,
                               "element count of shape (4294967296, 4294967296) must fit in int64"),
    "element-count-overflow-zero-size": (build(simple("|u1", (0, 2**40, 2**40))), None, NpyError,
                                         "element count"),
    "byte-count-overflow": (build(simple("<f8", (2**62,))), None, NpyError,
                            "byte count of shape (4611686018427387904,) x 8-byte float64"),
    "over-max-bytes": (build(simple("<f8", (LIMIT // 8 + 1,))), None, NpyTooLarge,
                       f"declared size of {LIMIT + 8} bytes exceeds the limit of {LIMIT} bytes"),
    "huge-shape": (build(simple("<c16", (2**20, 2**20))), None, NpyTooLarge,
                   f"declared size of {2**44} bytes exceeds the limit"),
    "truncated-data": (build(simple("<f4", (3,)), bytes(11)), None, NpyError,
                       "truncated; the header declares 12 bytes of data (140 bytes in all), "
                       "got 11"),
    "trailing-data": (build(simple("<f4", (3,)), bytes(13)), None, NpyError,
                      "has trailing bytes; the header declares 12 bytes of data"),
    "truncated-header": (build(simple())[:70], None, NpyError, "NPY header: truncated"),
    "unicode-dtype": (build(simple("<U3")), None, NpyError, "got '<U3'"),
    "bytes-dtype": (build(simple("|S3")), None, NpyError, "got '|S3'"),
    "void-dtype": (build(simple("|V8")), None, NpyError, "got '|V8'"),
    "bfloat16-as-void": (np_save(np.zeros(2, dtypes.bfloat16)), None, NpyError, "got '<V2'"),
    "datetime-dtype": (build(simple("<M8[ns]")), None, NpyError, "got '<M8[ns]'"),
    "datetime-no-unit": (build(simple("<M8")), None, NpyError, "got '<M8'"),
    "timedelta-dtype": (build(simple("<m8[s]")), None, NpyError, "got '<m8[s]'"),
    "longdouble": (build(simple("<f16")), None, NpyError, "got '<f16'"),
    "subarray-descr": (build(simple("(2,)<f4")), None, NpyError, "got '(2,)<f4'"),
    "comma-descr": (build(simple("f4,f4")), None, NpyError, "got 'f4,f4'"),
    "nonsense-descr": (build(simple("<q9")), None, NpyError, "supported dtypes (bool, int8"),
    "descr-not-string": (build(simple(5)), None, NpyError, "descr must be a string, got 5"),
    "structured": (build(simple([("a", "<f4"), ("b", "<i4")])), None, NpyError,
                   "descr may only be a structured layout for complex32"),
    "structured-f4-pair": (build(simple([("real", "<f4"), ("imag", "<f4")])), None, NpyError,
                           "structured layout for complex32"),
    "structured-big-complex32": (build(simple([("real", ">f2"), ("imag", ">f2")])), None,
                                 NpyError, "structured layout for complex32"),
    "xdtype-unknown": (build(simple("<f4")), "float64", NpyError,
                       "X-Array-Dtype: must be 'bfloat16', 'complex32' or the NPY's own dtype "
                       "('float32'), got 'float64'"),
    "xdtype-case": (build(simple("<u2")), "BFLOAT16", NpyError, "X-Array-Dtype: must be"),
    "xdtype-empty": (build(simple("<u2")), "", NpyError, "X-Array-Dtype: must be"),
    "xdtype-byte-order": (build(simple(">f4")), ">f4", NpyError, "got '>f4'"),
    "xdtype-bfloat16-on-f4": (build(simple("<f4")), "bfloat16", NpyError,
                              "X-Array-Dtype: bfloat16 requires the NPY dtype to be uint16"),
    "xdtype-bfloat16-on-i2": (build(simple("<i2")), "bfloat16", NpyError, "got <i2"),
    "xdtype-bfloat16-on-c32": (build(simple(dtypes.complex32.descr)), "bfloat16", NpyError,
                               "bfloat16 requires"),
    "xdtype-complex32-on-big-u4": (build(simple(">u4")), "complex32", NpyError,
                                   "X-Array-Dtype: complex32 requires the NPY dtype to be "
                                   "little-endian uint32 (<u4) or complex32, got >u4"),
    "xdtype-complex32-on-u2": (build(simple("<u2")), "complex32", NpyError, "got <u2"),
    "xdtype-complex32-on-c8": (build(simple("<c8")), "complex32", NpyError, "complex32 requires"),
    "xdtype-complex64-on-c32": (build(simple(dtypes.complex32.descr)), "complex64", NpyError,
                                "own dtype ('complex32'), got 'complex64'"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_input_is_refused(name):
    data, declared, error, message = HOSTILE[name]
    with pytest.raises(error) as info:
        npy.decode(data, max_bytes=LIMIT, declared_dtype=declared)
    assert message in str(info.value)
    assert isinstance(info.value, ValueError)
    # parse_header refuses it as well, unless the header is fine and only the data is wrong
    if name.startswith(("truncated", "trailing")):
        return
    with pytest.raises(error) as info:
        npy.parse_header(data, max_bytes=LIMIT, declared_dtype=declared)
    assert message in str(info.value)


@pytest.mark.parametrize("prefix, message", [
    (b"P", "magic string"),
    (b"\x93NUMPZ", "magic string"),
    (b"\x93NUMPYZ", "got 90.x"),
    (MAGIC + b"\x04", "version must be 1.0, 2.0 or 3.0, got 4"),
    (MAGIC + b"\x04\x00", "got 4.0"),
    (MAGIC + b"\x01\x00" + struct.pack("<H", 10_001), "length must be at most 10000 bytes"),
    (FOUR_GIB_HEADER, "got 4294967295"),
], ids=["1-byte", "6-bytes", "7-bytes-Z", "7-bytes", "8-bytes", "v1-10001", "v2-4GiB"])
def test_parse_header_raises_at_once(prefix, message):
    """Invalid prefixes are refused before the rest of the header arrives."""
    with pytest.raises(NpyError, match=message.replace(".", r"\.")):
        npy.parse_header(prefix, max_bytes=LIMIT)


def test_too_large_is_an_npy_error():
    assert issubclass(NpyTooLarge, NpyError) and issubclass(NpyError, ValueError)
    data = build(simple("<f4", (4,)), bytes(16))
    assert npy.decode(data, max_bytes=16).shape == (4,)
    with pytest.raises(NpyTooLarge, match="declared size of 16 bytes exceeds the limit of 15"):
        npy.decode(data, max_bytes=15)


@pytest.mark.parametrize("data, max_bytes", [
    (FOUR_GIB_HEADER, LIMIT),
    (build(simple("<c16", (2**30, 2**30))), LIMIT),
    (build(simple("<c16", (2**30, 2**30))), 2**63),  # allowed by the limit: truncated
    (build(simple("|u1", (2**32, 2**32))), 2**63),
    (build(simple("<f8", (2**62,))), 2**63),
], ids=["4-GiB-header", "huge-shape", "huge-shape-no-limit", "count-overflow", "byte-overflow"])
def test_hostile_sizes_allocate_little(data, max_bytes):
    tracemalloc.start()
    try:
        with pytest.raises(NpyError):
            npy.decode(data, max_bytes=max_bytes)
        try:  # the header alone may be acceptable under a limit of 2**63; decode refused the data
            assert npy.parse_header(data, max_bytes=max_bytes).nbytes > len(data)
        except NpyError:
            pass
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak
