"""From an execute request to a ``JobPlan``: the inputs resolved (a stored array by its href, an
inline NPY decoded), the parameters and the output checked, before anything is computed.
"""

from __future__ import annotations

import base64
import binascii
import io
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import dask.array as da
import numpy as np

from ops import dtypes, registry
from ops.dims import ROLES
from ops.errors import InvalidArgument
from schemas.service import NPY_MEDIA_TYPE, ExecuteRequest
from service.errors import ServiceError, bad_request, conflict, too_large
from service.storage import npy
from service.storage.local import ArrayStore
from service.storage.names import check_name


@dataclass
class JobPlan:
    """A validated execution request, before anything is computed."""

    job_id: str
    process_id: str
    arrays: dict[str, object]      # input name -> np.ndarray | float | stored array name (str)
    kwargs: dict[str, object]
    dims: Mapping | None
    transmission: str              # "value" | "reference"
    result_name: str
    response: str                  # "raw" | "document"
    reads: list[str] = field(default_factory=list)

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


def _inline_npy(name: str, value: dict, limit: int) -> np.ndarray:
    encoding = value.get("encoding", "base64")
    media = value.get("mediaType", NPY_MEDIA_TYPE)
    if encoding != "base64" or media != NPY_MEDIA_TYPE:
        raise bad_request(
            f"input {name!r}: an inline array must be base64-encoded {NPY_MEDIA_TYPE}, "
            f"got encoding {encoding!r} and mediaType {media!r}"
        )
    text = value.get("value")
    if not isinstance(text, str):
        raise bad_request(f"input {name!r}: value must be a base64 string")
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
        return npy.decode(raw, max_bytes=limit, declared_dtype=value.get("dtype"))
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


def plan_request(process_id: str, request: ExecuteRequest, job_id: str, base_url: str, *, store: ArrayStore,
                 max_inline_bytes: int) -> JobPlan:
    """The request checked against the operator and the store (``Executor.plan``); raises the
    ServiceError (400, 404, 409, 413) a client gets for it."""
    op = registry.OPERATORS[process_id]
    inputs = dict(request.inputs)
    unknown = [k for k in inputs if k not in op.inputs]
    if unknown:
        raise bad_request(f"{process_id} has no input {unknown[0]!r}; its inputs are {', '.join(op.inputs)}")
    arrays, reads = {}, []
    for name in op.array_inputs:
        if name not in inputs:
            raise bad_request(f"{process_id} needs the array input {name!r}")
        value = inputs.pop(name)
        if isinstance(value, bool):
            raise bad_request(f"input {name!r} must be an array ({{\"href\": ...}} or an inline NPY), got {value!r}")
        if name in op.scalar_inputs and isinstance(value, (int, float)):
            arrays[name] = float(value)
        elif isinstance(value, dict) and "href" in value:
            stored = _stored_name(value["href"], base_url)
            if not store.exists(stored):
                raise ServiceError(404, "https://chunked-tensor-ops.readthedocs.io/exceptions/no-such-array",
                                   f"input {name!r}: no array named {stored!r}")
            arrays[name] = stored
            reads.append(stored)
        elif isinstance(value, dict) and "value" in value:
            arrays[name] = _inline_npy(name, value, max_inline_bytes)
        else:
            raise bad_request(
                f"input {name!r} must be {{\"href\": \"/arrays/NAME\"}} or an inline NPY "
                f"{{\"value\": base64, \"encoding\": \"base64\", \"mediaType\": \"{NPY_MEDIA_TYPE}\"}}"
            )
    dims = inputs.pop("dims", None)
    if dims is not None and not (isinstance(dims, dict) and all(
            k in ROLES and isinstance(v, str) for k, v in dims.items())):
        raise bad_request(f"input 'dims' must map roles ({', '.join(ROLES)}) to dim names (strings), "
                          f"e.g. {{\"H\": \"row\"}}; got {dims!r}")
    missing = [k for k, f in op.params.model_fields.items() if f.is_required() and k not in inputs]
    if missing:
        raise bad_request(f"{process_id} needs the input {missing[0]!r}")
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
    return JobPlan(job_id, process_id, arrays, inputs, dims,
                output.transmissionMode if output else "value", result_name, request.response, reads)
