"""A safe NPY (NumPy ``.npy`` format) codec for bytes received from untrusted clients.

The service accepts arrays as NPY, either inline (base64 in a JSON body, decoded whole with
:func:`decode`) or streamed (the caller feeds the first bytes to :func:`parse_header` until it
returns a header, then reads exactly :attr:`NpyHeader.nbytes` of data). The header is read by
``service.storage.npy_header`` (never with ``eval`` or pickle; every field validated, sizes
checked before anything is allocated); this module adds the whole-array :func:`decode`, the
writing side (:func:`header_bytes`, :func:`encode`) and :func:`wire_dtype`, and is the one
import for both.

NPY has no bfloat16 or complex32. On the wire they travel as NPY of their raw bits (``<u2``
for bfloat16, in either byte order; ``<u4`` for complex32) together with the HTTP header
``X-Array-Dtype: bfloat16`` / ``complex32``; see :func:`wire_dtype` and the
``declared_dtype`` argument of :func:`parse_header` and :func:`decode`.
"""

from __future__ import annotations

import io
import math
import operator

import numpy as np
import numpy.lib.format as npy_format

from ops import dtypes as ops_dtypes
from service.storage.npy_header import (BFLOAT16, COMPLEX32, MAGIC, MAX_HEADER_BYTES, NpyError, NpyHeader,
                                        NpyTooLarge, parse_header)

__all__ = [
    "MAGIC",
    "MAX_HEADER_BYTES",
    "NpyError",
    "NpyTooLarge",
    "NpyHeader",
    "parse_header",
    "header_bytes",
    "wire_dtype",
    "decode",
    "encode",
]


def wire_dtype(dtype: np.dtype) -> tuple[np.dtype, str | None]:
    """The dtype an array travels as in NPY, and the ``X-Array-Dtype`` value to send with it.

    Parameters
    ----------
    dtype : numpy.dtype
        The array's element type.

    Returns
    -------
    tuple of (numpy.dtype, str or None)
        ``(uint16 of the same byte order, "bfloat16")`` for bfloat16,
        ``(<u4, "complex32")`` for complex32 (either byte order; :func:`encode` writes its
        bits little-endian), and ``(dtype, None)`` for every other type.
    """
    dtype = np.dtype(dtype)
    if ops_dtypes.is_bfloat16(dtype):
        return np.dtype(np.uint16).newbyteorder(dtype.byteorder), BFLOAT16
    if dtype.names is not None and dtype.newbyteorder("<") == ops_dtypes.complex32:
        return np.dtype("<u4"), COMPLEX32
    return dtype, None


def header_bytes(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    """The NPY header for C-order data of ``dtype`` and ``shape``.

    Parameters
    ----------
    dtype : numpy.dtype
        A supported element type; bfloat16 and complex32 are written as their raw-bit wire
        types (see :func:`wire_dtype`), big-endian types as declared.
    shape : tuple of int
        The array's shape.

    Returns
    -------
    bytes
        Magic, version, header length and the padded header ending in a newline, exactly as
        ``numpy.lib.format`` writes it (version 1.0 unless the header needs 2.0); the total
        length is a multiple of 64.

    Raises
    ------
    ops.errors.InvalidArgument
        ``dtype`` is not supported.
    """
    dtype = ops_dtypes.check_supported("NPY", dtype)
    shape = tuple(int(operator.index(d)) for d in shape)  # np.int64 would repr as "np.int64(3)"
    header = {
        "descr": npy_format.dtype_to_descr(wire_dtype(dtype)[0]),
        "fortran_order": False,
        "shape": shape,
    }
    buf = io.BytesIO()
    try:
        npy_format.write_array_header_1_0(buf, header)
    except ValueError:  # header longer than 1.0's 65535 bytes
        buf = io.BytesIO()
        npy_format.write_array_header_2_0(buf, header)
    return buf.getvalue()


def decode(data: bytes, *, max_bytes: int, declared_dtype: str | None = None) -> np.ndarray:
    """Decode a whole NPY held in memory.

    Parameters
    ----------
    data : bytes-like
        The complete NPY: header and data, nothing more.
    max_bytes : int
        The largest number of data bytes accepted.
    declared_dtype : str, optional
        The ``X-Array-Dtype`` header value, as for :func:`parse_header`.

    Returns
    -------
    numpy.ndarray
        A new C-contiguous, writeable array of the resolved dtype (Fortran-order data is
        reordered). Never unpickles anything; allocates O(len(data)).

    Raises
    ------
    NpyError
        The header is invalid (see :func:`parse_header`), or ``data`` is not exactly
        header plus declared data (truncated or trailing bytes).
    NpyTooLarge
        The declared data is larger than ``max_bytes``.
    """
    header = parse_header(data, max_bytes=max_bytes, declared_dtype=declared_dtype)
    if header is None:
        raise NpyError(f"NPY header: truncated, the NPY is only {len(data)} bytes")
    expected = header.data_offset + header.nbytes
    if len(data) != expected:
        problem = "truncated" if len(data) < expected else "has trailing bytes"
        raise NpyError(
            f"NPY data: {problem}; the header declares {header.nbytes} bytes of data "
            f"({expected} bytes in all), got {len(data) - header.data_offset} "
            f"({len(data)} bytes in all)"
        )
    flat = np.frombuffer(
        data, dtype=header.dtype, count=math.prod(header.shape), offset=header.data_offset
    )
    if header.fortran_order:
        return np.ascontiguousarray(flat.reshape(header.shape[::-1]).transpose())
    return flat.reshape(header.shape).copy()


def encode(array: np.ndarray) -> bytes:
    """Encode an array as NPY.

    Parameters
    ----------
    array : array_like
        An array of a supported dtype.

    Returns
    -------
    bytes
        :func:`header_bytes` followed by the array's bytes in C order; bfloat16 and
        complex32 as their raw bits (complex32 little-endian). Send ``wire_dtype(dtype)[1]``
        as ``X-Array-Dtype`` when it is not None.

    Raises
    ------
    ops.errors.InvalidArgument
        The array's dtype is not supported.
    """
    array = np.asarray(array)
    ops_dtypes.check_supported("NPY", array.dtype)
    if array.dtype.names is not None and array.dtype != ops_dtypes.complex32:
        array = array.astype(ops_dtypes.complex32)  # big-endian complex32 travels as <u4
    flat = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
    return b"".join([header_bytes(array.dtype, array.shape), flat])
