"""From an execute request to a ``JobPlan``: each input parsed by its wire model (a stored array
by its href, an inline NPY decoded, a qualified value unwrapped), the call bound and checked by
the operator registry as every door's is, and the output checked, before anything is computed.
"""

from __future__ import annotations

import base64
import binascii
import io
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import dask.array as da
import numpy as np
from pydantic import ValidationError

from ops import dtypes, registry
from ops.errors import InvalidArgument
from schemas.service import (NPY_MEDIA_TYPE, ArrayInput, ArrayReference, ExecuteRequest, InlineArray,
                             ParameterInput, QualifiedValue)
from service.errors import ServiceError, bad_request, conflict, too_large
from service.storage import npy
from service.storage.protocol import ArrayStorage
from service.storage.names import check_name


@dataclass
class JobPlan:
    """A validated execution request, before anything is computed."""

    job_id: str
    call: registry.BoundCall       # array inputs: np.ndarray | float | a stored array's name (str)
    transmission: str              # "value" | "reference"
    result_name: str
    response: str                  # "raw" | "document"
    reads: list[str] = field(default_factory=list)

    @property
    def process_id(self) -> str:
        return self.call.op.name

    @property
    def inline_only(self) -> bool:
        return not self.reads


def _stored_name(href: str, base_url: str) -> str:
    """``/arrays/NAME``, ``arrays/NAME`` or this server's absolute URL of it -> NAME."""
    if not isinstance(href, str):
        raise bad_request(f"href must be a string, got {href!r}")
    try:
        parts = urlsplit(href)
    except ValueError:  # e.g. "http://[/arrays/x": an unclosed IPv6 host
        raise bad_request(f"href must be /arrays/NAME, got {href!r}") from None
    path = href
    if parts.scheme or parts.netloc:
        base = urlsplit(base_url)
        if (parts.scheme, parts.netloc) != (base.scheme, base.netloc):
            raise bad_request(
                f"href must name an array of this service (/arrays/NAME), got {href!r}; "
                "upload the data with PUT /arrays/NAME first"
            )
        path = parts.path
    elif parts.query or parts.fragment:
        raise bad_request(f"href must be /arrays/NAME, got {href!r}")
    prefix = urlsplit(base_url).path.rstrip("/") + "/arrays/"
    for start in (prefix, "/arrays/", "arrays/"):
        if path.startswith(start):
            return check_name(path[len(start):], "the array name in href")
    raise bad_request(f"href must be /arrays/NAME, got {href!r}")


def _inline_npy(name: str, value: InlineArray, limit: int) -> np.ndarray:
    text = value.value
    if len(text) * 3 // 4 > limit + npy.MAX_HEADER_BYTES:
        raise too_large(
            f"input {name!r}: the inline array is over the {limit}-byte inline limit; "
            "upload it with PUT /arrays/NAME, pass {\"href\": \"/arrays/NAME\"} and use transmissionMode "
            "\"reference\""
        )
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise bad_request(f"input {name!r}: value is not valid base64") from None
    try:
        return npy.decode(raw, max_bytes=limit, declared_dtype=value.dtype)
    except npy.NpyTooLarge as error:
        raise too_large(f"input {name!r}: {error}; upload it with PUT /arrays/NAME, pass its href and "
                        "use transmissionMode \"reference\"") from None
    except npy.NpyError as error:
        standin = _refused_dtype_standin(raw)
        if standin is not None:
            return standin  # the operator refuses it, with its own message for the same call
        raise bad_request(f"input {name!r}: {error}") from None


def _refused_dtype_standin(raw: bytes):
    """For an NPY with a well-formed header naming a dtype no operator takes (object,
    strings, ...): a never-allocated Dask stand-in of that dtype and shape, so that the
    operator refuses it with the message it gives for the same call. The data (a
    pickle, for objects) is never read. None for any other NPY error."""
    try:
        stream = io.BytesIO(raw)
        version = np.lib.format.read_magic(stream)
        read = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}[version]
        shape, _, dtype = read(stream, max_header_size=npy.MAX_HEADER_BYTES)
        if dtype.subdtype is not None or dtype.itemsize > 1024:
            return None
        dtypes.check_supported("NPY", dtype)
        return None  # a supported dtype: the NPY is wrong in another way
    except InvalidArgument:
        pass
    except Exception:
        return None
    try:
        standin = np.broadcast_to(np.zeros((), dtype), shape)
    except Exception:
        return None
    # not da.from_array: it copies its argument, allocating the whole declared size
    return da.zeros(standin.shape, dtype=standin.dtype, chunks=tuple(max(1, n) for n in standin.shape))


def _parsed(adapter, name: str, value):
    """``value`` parsed by a wire model; a 400 naming the input and the broken rule otherwise."""
    try:
        return adapter.validate_python(value)
    except ValidationError as error:
        first = error.errors(include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"] if part not in ("reference", "inline", "qualified"))
        shown = repr(first["input"])
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        rule = first["msg"].removeprefix("Input ")  # "Input should be ...": the field is named here
        raise bad_request(f"input {name!r}{': ' + where if where else ''} {rule}, got {shown}") from None


def _array_input(name: str, value, base_url: str, store: ArrayStorage, max_inline_bytes: int):
    """An array input as the executor takes it: a stored array's name (str), a decoded inline
    NPY, or a number (scalar inputs)."""
    parsed = _parsed(ArrayInput, name, value)
    if isinstance(parsed, ArrayReference):
        stored = _stored_name(parsed.href, base_url)
        if not store.exists(stored):
            raise ServiceError(404, "https://chunked-tensor-ops.readthedocs.io/exceptions/no-such-array",
                               f"input {name!r}: no array named {stored!r}")
        return stored
    if isinstance(parsed, InlineArray):
        return _inline_npy(name, parsed, max_inline_bytes)
    return parsed.value if isinstance(parsed, QualifiedValue) else parsed


def plan_request(process_id: str, request: ExecuteRequest, job_id: str, base_url: str, *, store: ArrayStorage,
                 max_inline_bytes: int) -> JobPlan:
    """The request checked against the operator and the store (``Executor.plan``); raises the
    ServiceError (400, 404, 409, 413) a client gets for it."""
    op = registry.OPERATORS[process_id]
    inputs = {}
    for name, value in request.inputs.items():
        if name in op.array_inputs:
            inputs[name] = _array_input(name, value, base_url, store, max_inline_bytes)
        else:
            parsed = _parsed(ParameterInput, name, value)
            inputs[name] = parsed.value if isinstance(parsed, QualifiedValue) else parsed
    try:
        call = registry.bind(process_id, inputs)
    except InvalidArgument as error:
        raise bad_request(str(error)) from None
    reads = [v for v in call.arrays.values() if isinstance(v, str)]
    output = (request.outputs or {}).get("result")
    if request.outputs and set(request.outputs) != {"result"}:
        raise bad_request(f"{process_id} has one output, 'result'; got {sorted(request.outputs)}")
    media = output.format.mediaType if output and output.format else None
    if media not in (None, NPY_MEDIA_TYPE):
        raise bad_request(f"outputs.result.format.mediaType must be {NPY_MEDIA_TYPE}, got {media!r}")
    named = output is not None and output.name is not None  # "" is not a name (400), nor the default
    result_name = check_name(output.name, "outputs.result.name") if named else job_id
    if store.exists(result_name):
        raise conflict(f"an array named {result_name!r} exists; choose another outputs.result.name")
    if result_name in reads:
        raise conflict(f"the result cannot overwrite its input {result_name!r}")
    return JobPlan(job_id, call, output.transmissionMode if output else "value", result_name, request.response,
                   reads)
