"""One router per resource: landing/conformance, processes, jobs, arrays, health.

What the routers share: the OpenAPI ``responses`` of OGC exception bodies, the path
parameters, whose documented constraints are the ones the service enforces, and the NPY
bytes and ``X-Array-Dtype`` header of an array in a response."""

from typing import Annotated

import numpy as np
from fastapi import Path

from ops import registry
from schemas.service import ARRAY_NAME_PATTERN, JOB_ID_PATTERN, ZARR_KEY_PATTERN, Exception_
from service.storage import npy

_TEXT = {400: "Bad parameters", 401: "Missing or wrong token", 404: "Not found", 409: "Conflict",
         413: "Too large", 415: "Unsupported media type", 416: "Range not satisfiable",
         500: "The service failed", 503: "Dask cluster unreachable",
         507: "The data root is out of space: nothing was stored"}


def problems(*codes: int, **descriptions: str) -> dict:
    """OpenAPI ``responses`` entries for OGC exception bodies (``application/json``) with these
    status codes; ``descriptions`` (``_404="..."``) override the default description of one."""
    return {code: {"model": Exception_, "description": descriptions.get(f"_{code}", _TEXT.get(code, "Error"))}
            for code in codes}


# The path parameters. The constraints below are documentation only (``json_schema_extra``):
# the routes enforce them with their own messages (an ill-formed array name is a 400 from
# ``service.storage.names.check_name``; an unknown process, job or Zarr key, well-formed or not, is a 404),
# and the fuzzing tests check that the document and the service agree.
ArrayName = Annotated[str, Path(
    description="1-128 characters of [A-Za-z0-9._-], not starting with '.'",
    json_schema_extra={"pattern": ARRAY_NAME_PATTERN, "minLength": 1, "maxLength": 128})]
ProcessID = Annotated[str, Path(
    description="an operator, or echo (a test process); any other id is 404 no-such-process",
    json_schema_extra={"enum": [*registry.OPERATORS, "echo"]})]
JobID = Annotated[str, Path(
    description="the id the service gave the job (32 hex digits); any other is 404 no-such-job",
    json_schema_extra={"pattern": JOB_ID_PATTERN})]
ZarrKey = Annotated[str, Path(
    description="a key of the stored Zarr v3 group: zarr.json, or a chunk key such as NAME/c/0/0",
    json_schema_extra={"pattern": ZARR_KEY_PATTERN})]


def dtype_header(dtype) -> dict:
    """The ``X-Array-Dtype`` header for a dtype that NPY cannot name (bfloat16, complex32)."""
    _, declared = npy.wire_dtype(np.dtype(dtype))
    return {"X-Array-Dtype": declared} if declared else {}


def npy_bytes(array: np.ndarray) -> bytes:
    return npy.encode(np.asarray(array))  # np.ascontiguousarray would make a 0-d array 1-d
