"""The NPY header of bytes from an untrusted client, read and validated (:func:`parse_header`).

Nothing here uses ``eval`` or pickle: the header is checked to be a dict literal of plain
literals before :func:`ast.literal_eval` reads it, every field is validated, and sizes are
checked against int64 and the caller's byte limit before anything is allocated. The
``X-Array-Dtype`` header (``declared_dtype``) turns the raw-bit wire types back into bfloat16
or complex32. ``service.storage.npy`` is the codec built on it.
"""

from __future__ import annotations

import ast
import math
import re
import struct
import threading
from dataclasses import dataclass

import numpy as np

from ops import dtypes as ops_dtypes
from ops.errors import InvalidArgument

__all__ = [
    "BFLOAT16",
    "COMPLEX32",
    "MAGIC",
    "MAX_HEADER_BYTES",
    "NpyError",
    "NpyTooLarge",
    "NpyHeader",
    "parse_header",
]

MAGIC = b"\x93NUMPY"
#: The longest header accepted, in bytes (NumPy's ``max_header_size`` default).
MAX_HEADER_BYTES = 10_000

_INT64_MAX = 2**63 - 1
#: NumPy's NPY_MAXDIMS.
_MAX_NDIM = 64
#: Bytes of the header-length field and the header's text encoding, by format version.
_VERSIONS = {(1, 0): (2, "latin1"), (2, 0): (4, "latin1"), (3, 0): (4, "utf8")}
_KEYS = ("descr", "fortran_order", "shape")
#: What a descr string may look like before np.dtype sees it: a type code or name with an
#: optional byte-order character. Rules out subarray ("(2,)f4") and structured ("f4,f4")
#: spellings and anything long.
_DESCR_STRING = re.compile(r"[<>|=]?[A-Za-z][A-Za-z0-9]{0,15}")
#: The descr np.save writes for a complex32 array.
_COMPLEX32_DESCR = ops_dtypes.complex32.descr
#: The ``X-Array-Dtype`` values of the two dtypes NPY has no name for.
BFLOAT16 = "bfloat16"
COMPLEX32 = "complex32"


class NpyError(ValueError):
    """A malformed or refused NPY.

    The message names the field, the rule and the offending value, e.g.
    ``NPY header: version must be 1.0, 2.0 or 3.0, got 4.0``.
    """


class NpyTooLarge(NpyError):
    """The NPY declares more data than the byte limit allows (the service answers 413)."""


@dataclass(frozen=True)
class NpyHeader:
    """A validated NPY header.

    Attributes
    ----------
    dtype : numpy.dtype
        The element type as declared (byte order kept), already resolved through
        ``X-Array-Dtype`` when one was given (so bfloat16 or complex32 rather than their
        raw-bit wire types).
    shape : tuple of int
        The array's shape; every dimension is a non-negative Python int.
    fortran_order : bool
        Whether the data that follows is in Fortran (column-major) order.
    data_offset : int
        The number of bytes before the data: magic, version, header length and header.
    """

    dtype: np.dtype
    shape: tuple[int, ...]
    fortran_order: bool
    data_offset: int

    @property
    def nbytes(self) -> int:
        """The number of data bytes that follow the header.

        Returns
        -------
        int
            ``prod(shape) * dtype.itemsize``.
        """
        return math.prod(self.shape) * self.dtype.itemsize


def _supported_names() -> str:
    return ", ".join(ops_dtypes.SUPPORTED_NAMES)


def _dtype_name(dtype: np.dtype) -> str:
    """The byte-order-free name X-Array-Dtype may repeat (``float32`` for ``>f4``)."""
    if dtype.names is not None and dtype == ops_dtypes.complex32:
        return COMPLEX32
    return dtype.name


def _check_magic_and_version(prefix: bytes) -> tuple[int, str] | None:
    """Check what is there of magic and version; return (length-field size, encoding)."""
    head = bytes(prefix[: len(MAGIC)])
    if head != MAGIC[: len(head)]:
        raise NpyError(f"NPY header: magic string must be {MAGIC!r}, got {head!r}")
    if len(prefix) < len(MAGIC) + 2:
        if len(prefix) > len(MAGIC) and prefix[len(MAGIC)] not in (1, 2, 3):
            raise NpyError(
                f"NPY header: version must be 1.0, 2.0 or 3.0, got {prefix[len(MAGIC)]}.x"
            )
        return None
    version = (prefix[len(MAGIC)], prefix[len(MAGIC) + 1])
    if version not in _VERSIONS:
        raise NpyError(
            f"NPY header: version must be 1.0, 2.0 or 3.0, got {version[0]}.{version[1]}"
        )
    return _VERSIONS[version]


# CPython 3.11 keeps the AST constructor's recursion depth in interpreter-wide state: two
# threads in ast.parse at once (a thread switch inside it, e.g. through a garbage-collection
# callback) fail with "SystemError: AST constructor recursion depth mismatch" (CPython
# gh-106905). Concurrent sync requests with inline NPY inputs hit it (tests/service/test_load.py).
AST_LOCK = threading.Lock()


def _literal_header(text: str) -> dict:
    """Read the header text as a dict literal of plain literals, or raise NpyError."""
    try:
        with AST_LOCK:
            tree = ast.parse(text.strip(" \t\r\n\x00"), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise NpyError(
            f"NPY header: must be a Python dict literal, got {text[:80]!r} ({exc})"
        ) from None
    if not isinstance(tree.body, ast.Dict):
        raise NpyError(f"NPY header: must be a Python dict literal, got {text[:80]!r}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant):
            if not isinstance(node.value, (str, bytes, int, float, bool, type(None))):
                raise NpyError(
                    f"NPY header: may only contain plain literals, got {ast.unparse(node)!r}"
                )
        elif isinstance(node, ast.UnaryOp):
            if not (
                isinstance(node.op, (ast.USub, ast.UAdd))
                and isinstance(node.operand, ast.Constant)
                and type(node.operand.value) in (int, float)
            ):
                raise NpyError(
                    f"NPY header: may only contain plain literals, got {ast.unparse(node)!r}"
                )
        elif not isinstance(
            node, (ast.Expression, ast.Dict, ast.Tuple, ast.List, ast.Load, ast.USub, ast.UAdd)
        ):
            raise NpyError(
                f"NPY header: may only contain plain literals, got {ast.unparse(node)[:80]!r}"
            )
    keys = []
    for key in tree.body.keys:
        if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
            shown = "**" if key is None else ast.unparse(key)
            raise NpyError(f"NPY header: keys must be strings, got {shown[:80]!r}")
        if key.value in keys:
            raise NpyError(f"NPY header: keys must not repeat, got {key.value!r} twice")
        keys.append(key.value)
    try:
        return ast.literal_eval(tree)
    except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError) as exc:
        raise NpyError(
            f"NPY header: must be a dict of plain literals, got {text[:80]!r} ({exc})"
        ) from None


def _descr_dtype(descr: object) -> np.dtype:
    """The supported dtype ``descr`` names, or raise NpyError."""
    if isinstance(descr, list):
        if descr == _COMPLEX32_DESCR:
            return ops_dtypes.complex32
        raise NpyError(
            f"NPY header: descr may only be a structured layout for complex32 "
            f"({_COMPLEX32_DESCR!r}), got {descr!r}"
        )
    if not isinstance(descr, str):
        raise NpyError(f"NPY header: descr must be a string, got {descr!r}")
    refused = NpyError(
        f"NPY header: descr must be one of the supported dtypes ({_supported_names()}), "
        f"got {descr!r}"
    )
    if not _DESCR_STRING.fullmatch(descr):
        raise refused
    try:
        dtype = ops_dtypes.named(descr)
    except Exception:  # np.dtype raises TypeError, ValueError, or a DeprecationWarning
        raise refused from None
    if dtype.names is not None or dtype.subdtype is not None or dtype.hasobject:
        raise refused
    try:
        return ops_dtypes.check_supported("descr", dtype)
    except InvalidArgument:
        raise refused from None


def _resolve_declared(dtype: np.dtype, declared_dtype: str | None) -> np.dtype:
    """Apply X-Array-Dtype to the NPY's dtype, or raise NpyError."""
    if declared_dtype is None:
        return dtype
    if declared_dtype == BFLOAT16:
        if dtype.kind == "u" and dtype.itemsize == 2:
            return ops_dtypes.bfloat16.newbyteorder(dtype.byteorder)
        if dtype == ops_dtypes.bfloat16:  # descr 'bfloat16': already resolved
            return dtype
        raise NpyError(
            f"X-Array-Dtype: bfloat16 requires the NPY dtype to be uint16 (<u2 or >u2), "
            f"got {dtype.str}"
        )
    if declared_dtype == COMPLEX32:
        if dtype.names is None and dtype == np.dtype("<u4"):
            return ops_dtypes.complex32
        if dtype.names is not None and dtype == ops_dtypes.complex32:
            return dtype
        shown = COMPLEX32 if dtype.names is not None else dtype.str
        raise NpyError(
            f"X-Array-Dtype: complex32 requires the NPY dtype to be little-endian uint32 "
            f"(<u4) or complex32, got {shown}"
        )
    if declared_dtype == _dtype_name(dtype):
        return dtype
    raise NpyError(
        f"X-Array-Dtype: must be 'bfloat16', 'complex32' or the NPY's own dtype "
        f"({_dtype_name(dtype)!r}), got {declared_dtype!r}"
    )


def _check_shape(shape: object) -> tuple[int, ...]:
    if not isinstance(shape, tuple):
        raise NpyError(f"NPY header: shape must be a tuple of ints, got {shape!r}")
    if len(shape) > _MAX_NDIM:
        raise NpyError(
            f"NPY header: shape must have at most {_MAX_NDIM} dimensions, got {len(shape)}"
        )
    for dim in shape:
        if type(dim) is not int:
            raise NpyError(
                f"NPY header: shape dimensions must be ints (not bools), got {dim!r} "
                f"in {shape!r}"
            )
        if dim < 0:
            raise NpyError(f"NPY header: shape dimensions must be >= 0, got {dim} in {shape!r}")
    return shape


def parse_header(
    prefix: bytes, *, max_bytes: int, declared_dtype: str | None = None
) -> NpyHeader | None:
    """Parse and validate the header at the start of an NPY.

    Parameters
    ----------
    prefix : bytes-like
        The first bytes of the NPY received so far; it may hold data after the header.
    max_bytes : int
        The largest number of data bytes accepted.
    declared_dtype : str, optional
        The ``X-Array-Dtype`` header value: ``"bfloat16"`` (the NPY must be uint16 of
        either byte order), ``"complex32"`` (the NPY must be ``<u4`` or complex32), or the
        name of the NPY's own dtype (a no-op). None when the header is absent.

    Returns
    -------
    NpyHeader or None
        The header, or None while ``prefix`` is too short to hold all of it (call again with
        more bytes).

    Raises
    ------
    NpyError
        As soon as what is there is invalid: bad magic, a version other than 1.0, 2.0 or
        3.0, a declared header length over :data:`MAX_HEADER_BYTES`, a header that is not a
        dict literal with exactly the keys ``descr``, ``fortran_order`` and ``shape``, an
        unsupported dtype, a bad shape, element or byte counts that overflow int64, or a
        bad ``declared_dtype``.
    NpyTooLarge
        The declared data is larger than ``max_bytes``.
    """
    version = _check_magic_and_version(prefix)
    if version is None:
        return None
    len_size, encoding = version
    start = len(MAGIC) + 2
    if len(prefix) < start + len_size:
        return None
    (header_len,) = struct.unpack("<H" if len_size == 2 else "<I", prefix[start : start + len_size])
    if header_len > MAX_HEADER_BYTES:
        raise NpyError(
            f"NPY header: length must be at most {MAX_HEADER_BYTES} bytes, got {header_len}"
        )
    data_offset = start + len_size + header_len
    if len(prefix) < data_offset:
        return None
    try:
        text = bytes(prefix[start + len_size : data_offset]).decode(encoding)
    except UnicodeDecodeError as exc:
        raise NpyError(f"NPY header: must be valid {encoding} text ({exc})") from None

    header = _literal_header(text)
    missing = [k for k in _KEYS if k not in header]
    extra = sorted(k for k in header if k not in _KEYS)
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing {', '.join(map(repr, missing))}")
        if extra:
            parts.append(f"unexpected {', '.join(map(repr, extra))}")
        raise NpyError(
            f"NPY header: keys must be exactly 'descr', 'fortran_order', 'shape'; "
            f"{'; '.join(parts)}"
        )
    fortran_order = header["fortran_order"]
    if type(fortran_order) is not bool:
        raise NpyError(f"NPY header: fortran_order must be True or False, got {fortran_order!r}")
    shape = _check_shape(header["shape"])
    dtype = _resolve_declared(_descr_dtype(header["descr"]), declared_dtype)

    # A zero dimension makes the count 0, but NumPy still refuses the array if the other
    # dimensions (or the strides they imply) overflow, so check the product without zeros.
    count = math.prod(max(d, 1) for d in shape)
    if count > _INT64_MAX:
        raise NpyError(
            f"NPY header: element count of shape {shape} must fit in int64, got {count}"
        )
    if count * dtype.itemsize > _INT64_MAX:
        raise NpyError(
            f"NPY header: byte count of shape {shape} x {dtype.itemsize}-byte {_dtype_name(dtype)} "
            f"must fit in int64, got {count * dtype.itemsize}"
        )
    result = NpyHeader(
        dtype=dtype, shape=shape, fortran_order=fortran_order, data_offset=data_offset
    )
    if result.nbytes > max_bytes:
        raise NpyTooLarge(
            f"NPY data: declared size of {result.nbytes} bytes exceeds the limit of "
            f"{max_bytes} bytes"
        )
    return result
