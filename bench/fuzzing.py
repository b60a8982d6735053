"""What the schemathesis runs share (``tests/service/test_schemathesis.py`` and ``python -m
bench.fuzz``): the document, the app as schemathesis reaches it, the bodies it cannot make up
from the document (NPY, zipped Zarr stores), and the two checks that do not apply to some
operations, and why (``CONFIG``).

Importing this module registers, for the whole process, how schemathesis generates and
sends ``application/x-npy`` and ``application/zip`` bodies.
"""

from __future__ import annotations

import io
import tempfile
import warnings
import zipfile
from pathlib import Path

import numpy as np
import schemathesis
import xarray as xr
from hypothesis import strategies as st
from schemathesis.config import SchemathesisConfig

from ops import registry
from service.api.app import create_app
from service.settings import Settings

NPY = "application/x-npy"
ZIP_TYPES = ("application/zip", "application/x-zip-compressed")


class Started:
    """An app whose lifespan is already running (entered by a ``TestClient``), as an ASGI app
    for schemathesis: requests go to it; the lifespan messages schemathesis sends are
    acknowledged without starting a second cluster on the same data root."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            else:
                await send({"type": "lifespan.shutdown.complete"})
                return


def document(settings: Settings | None = None) -> dict:
    """The OpenAPI document of ``create_app(settings)``, built without starting the app (the
    tests check that the started app serves this very document at /openapi.json)."""
    return create_app(settings).openapi()


def load_schema(settings: Settings | None = None, config: SchemathesisConfig | None = None):
    """The document as schemathesis sees it, with this module's check policy (``CONFIG``, below)."""
    return schemathesis.openapi.from_dict(document(settings), config=config or CONFIG)


# --- positive_data_acceptance -----------------------------------------------------------
# The check says: a request that the document calls valid must not be refused with 400, 413,
# 415, 416 or 422. For the operations below the contract itself (docs/api.md: "400
# for bad parameters or shapes") refuses some schema-valid requests, for reasons that JSON
# Schema cannot state, so the check cannot hold there and is not run there; every other check
# is. Elsewhere it runs, and the document's constraints are what made it pass: the array
# name, job id, process id, Zarr key, Range, ?chunks= and ?dims= patterns.
#  - PUT /arrays/{name}: the body must be a whole, well-formed NPY or zipped Zarr v3 store
#    (its bytes are "string, format binary" to OpenAPI), ?chunks= / ?dims= must give one
#    entry per axis of the array in that body, and ?variable= must name one of its variables.
#  - POST /processes/{id}/execution (the templated path, whose inputs are those of one of the
#    processes, and each process's own): the arrays and keyword parameters constrain each other
#    through shapes (block_size divides H and W, indices stay in range, deq_scale has one
#    value per column of src, an inline value is a valid NPY of a supported dtype), which the
#    operators check, answering with the messages ops raises.
#  - POST /processes/echo/execution: an output asked for must echo an input the request gives.
#  - GET /jobs/{jobID}/results: a job that failed answers with its own error (400 when its
#    inputs were at fault, 413 when its result is over the inline limit), a fact about the job
#    that no schema of the request can state.
POSITIVE_NOT_APPLICABLE = ("PUT /arrays/{name}", "GET /jobs/{job_id}/results",
                           "POST /processes/{process_id}/execution", "POST /processes/echo/execution",
                           *(f"POST /processes/{name}/execution" for name in registry.OPERATORS))

# --- use_after_free (stateful runs) ------------------------------------------------------
# The check says: after a successful DELETE of a resource, reading it must be a 404.
# DELETE /jobs/{jobID} is OGC API - Processes' dismiss, not a deletion: it cancels the job
# and removes its partial output, and the job stays, with status "dismissed" (OGC 18-062r2
# clause "Dismiss"; docs/api.md), so reading it afterwards is a 200 by contract. The check
# runs on the reads of arrays after DELETE /arrays/{name}, which does delete.
READS_AFTER_DISMISS = ("GET /jobs/{job_id}", "GET /jobs/{job_id}/results")

CONFIG_OPERATIONS = [
    {"include-name": list(POSITIVE_NOT_APPLICABLE), "checks": {"positive_data_acceptance": {"enabled": False}}},
    {"include-name": list(READS_AFTER_DISMISS), "checks": {"use_after_free": {"enabled": False}}},
]
CONFIG = SchemathesisConfig.from_dict({"operations": CONFIG_OPERATIONS})


# --- bodies -----------------------------------------------------------------------------

_DTYPES = ("<f4", "<f8", "<i4", "<i8", "|u1", "|b1", "<f2", "<c8", ">f4", ">i2")


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


@st.composite
def npy_bodies(draw) -> bytes:
    """Whole NPY files of small arrays (0-4 axes, the dtypes the service stores)."""
    shape = tuple(draw(st.lists(st.integers(0, 4), max_size=4)))
    dtype = np.dtype(draw(st.sampled_from(_DTYPES)))
    size = int(np.prod(shape, dtype=np.int64))
    raw = draw(st.binary(min_size=size * dtype.itemsize, max_size=size * dtype.itemsize))
    array = np.frombuffer(raw, dtype=dtype).reshape(shape)
    if dtype.kind == "b":
        array = array.view(np.uint8).astype(bool)
    return _npy(array)


def _zipped_stores() -> list[bytes]:
    """A few zipped Zarr v3 stores as xarray writes them (one or two data variables)."""
    datasets = [
        xr.Dataset({"image": (("y", "x", "band"), np.arange(24, dtype="float32").reshape(2, 3, 4))},
                   coords={"y": [10.0, 20.0]}, attrs={"title": "t"}),
        xr.Dataset({"rain": (("t", "y"), np.ones((2, 3), "int16")), "snow": (("t", "y"), np.zeros((2, 3)))}),
    ]
    stores = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, ds in enumerate(datasets):
            path = Path(tmp) / f"s{i}.zarr"
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # consolidated metadata is not in the v3 spec yet
                ds.to_zarr(path, zarr_format=3, consolidated=True)
            buffer = io.BytesIO()
            with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
                for file in sorted(path.rglob("*")):
                    if file.is_file():
                        archive.write(file, file.relative_to(path).as_posix())
            stores.append(buffer.getvalue())
    return stores


def register() -> None:
    """How schemathesis sends and generates the binary bodies of PUT /arrays/{name} (the
    document can only say "string, format binary"): the bytes as they are, and whole NPY
    files / zipped Zarr stores, so that uploads get past the format check to the store."""
    schemathesis.serializer.alias([NPY, *ZIP_TYPES], "application/octet-stream")
    schemathesis.openapi.media_type(NPY, npy_bodies())
    schemathesis.openapi.media_type(ZIP_TYPES[0], st.sampled_from(_zipped_stores()), aliases=ZIP_TYPES[1:])


register()
