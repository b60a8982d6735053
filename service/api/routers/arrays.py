"""``/arrays``: upload (NPY streamed, or a zipped Zarr v3 store), list, info, NPY download,
read-only Zarr v3 over HTTP (consolidated metadata, Range requests) and delete."""

from __future__ import annotations

import shutil

from fastapi import APIRouter, Depends, Header, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse, Response, StreamingResponse

from schemas.service import NPY_MEDIA_TYPE, ArrayInfo, ArrayList
from service.api.routers import ArrayName, ZarrKey, dtype_header, problems
from service.api.state import Services, base_url, require_token, services
from service.errors import (
    RANGE_NOT_SATISFIABLE,
    UNSUPPORTED_MEDIA_TYPE,
    ServiceError,
    bad_request,
    conflict,
    no_such_array,
    too_large,
)
from service.storage import npy
from service.storage.base import KEY_PIECE_BYTES
from service.storage.names import check_name
from service.storage.protocol import StoredKey

router = APIRouter(tags=["arrays"], dependencies=[Depends(require_token)])

ZIP_TYPES = ("application/zip", "application/x-zip-compressed")
ZARR_JSON_TYPE = "application/json"
ZARR_CHUNK_TYPE = "application/octet-stream"
_BINARY = {"schema": {"type": "string", "format": "binary"}}
# What a client can do with an array it has just stored (OpenAPI links of the 201).
_NAME = {"name": "$request.path.name"}
_ARRAY_LINKS = {
    "info": {"operationId": "get_array_info", "parameters": _NAME, "description": "its shape, dtype, chunks, dims"},
    "download": {"operationId": "get_array", "parameters": _NAME, "description": "its NPY"},
    "zarr": {"operationId": "get_zarr_key", "parameters": {**_NAME, "key": "zarr.json"},
             "description": "its Zarr v3 metadata (consolidated)"},
    "delete": {"operationId": "delete_array", "parameters": _NAME, "description": "delete it"},
}
STORE_DOWN = "The object store behind an s3:// data root cannot be reached (storage-unavailable)"
# ?chunks= and ?dims= (checked against the array's rank by the store)
CHUNKS_PATTERN = r"^(-1|[1-9][0-9]*)(,(-1|[1-9][0-9]*))*$"
DIMS_PATTERN = r"^[A-Za-z0-9_.-]+(,[A-Za-z0-9_.-]+)*$"


def _links(base: str, name: str) -> list[dict]:
    return [
        {"href": f"{base}/arrays/{name}", "rel": "enclosure", "type": NPY_MEDIA_TYPE, "title": "NPY download"},
        {"href": f"{base}/arrays/{name}/info", "rel": "describedby", "type": "application/json", "title": "info"},
        {"href": f"{base}/arrays/{name}/zarr", "rel": "alternate", "type": "application/vnd+zarr",
         "title": "Zarr v3 store (xarray.open_zarr)"},
    ]


def _check_free(svc: Services, name: str, what: str) -> None:
    job = svc.records.busy_with(name)
    if job is not None:
        raise conflict(f"array {name!r} is in use by running job {job}; {what} it when the job has finished")


async def _upload_npy(request: Request, svc: Services, name: str, dims, chunks, overwrite: bool) -> dict:
    upload = await run_in_threadpool(svc.store.npy_upload, name, dims=dims, chunks=chunks,
                                     declared_dtype=request.headers.get("x-array-dtype"), overwrite=overwrite)
    try:
        async for piece in request.stream():
            upload.feed(piece)
            if upload.pending >= svc.store.chunk_bytes:
                await run_in_threadpool(upload.flush)
        return await run_in_threadpool(upload.finish)
    except npy.NpyTooLarge as error:
        raise too_large(str(error)) from None
    except npy.NpyError as error:
        raise bad_request(str(error)) from None
    finally:
        await run_in_threadpool(upload.abort)


async def _upload_zip(request: Request, svc: Services, name: str, variable, dims, chunks, overwrite: bool) -> dict:
    check_name(name)
    spool = svc.store.spool_dir("upload-")  # local, also for an object store
    archive = spool / "upload.zip"
    try:
        received = 0
        with open(archive, "wb") as out:
            async for piece in request.stream():
                received += len(piece)
                if received > svc.settings.max_upload_bytes:
                    raise too_large(f"the upload is over the {svc.settings.max_upload_bytes}-byte limit")
                await run_in_threadpool(out.write, piece)
        return await run_in_threadpool(svc.store.zip_upload, name, archive, variable=variable, dims=dims,
                                       chunks=chunks, overwrite=overwrite)
    finally:
        await run_in_threadpool(shutil.rmtree, spool, True)


@router.put("/arrays/{name}", status_code=201, response_model=ArrayInfo,
            openapi_extra={"requestBody": {"required": True, "content": {
                NPY_MEDIA_TYPE: _BINARY, "application/zip": _BINARY, "application/x-zip-compressed": _BINARY}}},
            operation_id="put_array",
            responses={201: {"description": "Stored; ``Location`` is the array's URL", "headers": {
                "Location": {"description": "the array's URL", "schema": {"type": "string"}}},
                "links": _ARRAY_LINKS},
                **problems(400, 401, 409, 413, 415, 503, 507, _503=STORE_DOWN,
                           _400="Not an NPY / Zarr v3 zip (a chunk that does not decode to its declared size, "
                                "bad dimension_names), or ?chunks= / ?dims= / ?variable= do not fit it (?chunks= "
                                "past max_chunks or max_chunk_bytes)",
                           _409="The name exists (without ?overwrite=true), or a running job uses it",
                           _413="Past max_upload_bytes, a budget of one stored array (max_chunks, max_shard_chunks, "
                                "max_chunk_bytes, max_string_bytes, max_strings_bytes) or disk_quota_bytes; the "
                                "detail names the setting")})
async def put_array(name: ArrayName, request: Request,
                    chunks: str = Query(None, description="chunk lengths, e.g. 1,256,256,-1 (-1: the whole "
                                               "axis), one per axis; at most max_chunks chunks of at most "
                                               "max_chunk_bytes each", pattern=CHUNKS_PATTERN),
                    dims: str = Query(None, description="dim names, e.g. time,y,x,band, one per axis",
                                             pattern=DIMS_PATTERN),
                    variable: str = Query(None, description="the data variable of a zipped store"),
                    overwrite: bool = Query(False), svc: Services = Depends(services),
                    x_array_dtype: str = Header(  # documented here, read by the NPY upload
                        None, alias="X-Array-Dtype",
                        description="NPY bodies: bfloat16 or complex32 when the NPY holds those types' raw bits "
                                    "(<u2, <u4), or the NPY's own dtype; anything else is a 400. Not used for a "
                                    "zipped store, whose metadata says its dtypes")):
    """Store an array: an NPY body (streamed into Zarr chunk by chunk) or a zipped Zarr v3 store."""
    check_name(name)
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media not in (NPY_MEDIA_TYPE, *ZIP_TYPES):
        raise ServiceError(415, UNSUPPORTED_MEDIA_TYPE,
                           f"Content-Type must be {NPY_MEDIA_TYPE} or application/zip, got {media or 'none'!r}")
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > svc.settings.max_upload_bytes + npy.MAX_HEADER_BYTES:
        raise too_large(f"the upload is {declared} bytes, over the {svc.settings.max_upload_bytes}-byte limit")
    await run_in_threadpool(_check_free, svc, name, "replace")
    if media == NPY_MEDIA_TYPE:
        info = await _upload_npy(request, svc, name, dims, chunks, overwrite)
    else:
        info = await _upload_zip(request, svc, name, variable, dims, chunks, overwrite)
    info["links"] = _links(base_url(request), name)
    return Response(ArrayInfo(**info).model_dump_json(), status_code=201, media_type="application/json",
                    headers={"Location": f"{base_url(request)}/arrays/{name}"})


@router.get("/arrays", response_model=ArrayList, responses=problems(401, 503, _503=STORE_DOWN))
def list_arrays(request: Request, svc: Services = Depends(services)) -> dict:
    """Every stored array with its shape, dtype, chunks and dims."""
    base = base_url(request)
    arrays = []
    for name in svc.store.names():
        try:
            info = svc.store.info(name)
        except ServiceError:
            continue  # removed between the listing and the read
        info.pop("attrs")
        arrays.append({**info, "links": _links(base, name)})
    return {"arrays": arrays, "links": [{"href": f"{base}/arrays", "rel": "self", "type": "application/json"}]}


@router.get("/arrays/{name}/info", operation_id="get_array_info", response_model=ArrayInfo,
            responses=problems(400, 401, 404, 503, _503=STORE_DOWN))
def array_info(name: ArrayName, request: Request, svc: Services = Depends(services)) -> dict:
    """Shape, dtype, chunks, dim names and attrs."""
    return {**svc.store.info(name), "links": _links(base_url(request), name)}


@router.get("/arrays/{name}", operation_id="get_array", response_class=StreamingResponse, responses={
    200: {"description": "The array as NPY (bfloat16 / complex32 as their raw bits, named by X-Array-Dtype)",
          "content": {NPY_MEDIA_TYPE: _BINARY}, "headers": {"X-Array-Dtype": {
              "description": "bfloat16 or complex32 when the NPY holds those types' raw bits",
              "schema": {"type": "string", "enum": ["bfloat16", "complex32"]}}}},
    **problems(400, 401, 404, 503, _503=STORE_DOWN)})
async def download_array(name: ArrayName, svc: Services = Depends(services)):
    """The array as NPY, produced block by block (bfloat16/complex32 as raw bits with X-Array-Dtype)."""
    dtype, length, pieces = await run_in_threadpool(svc.store.iter_npy, name)
    headers = {**dtype_header(dtype), "Content-Length": str(length),
               "Content-Disposition": f'attachment; filename="{name}.npy"'}
    return StreamingResponse(pieces, media_type=NPY_MEDIA_TYPE, headers=headers)


_ZARR_KEY_CONTENT = {ZARR_JSON_TYPE: {"schema": {"type": "object", "description": "zarr.json: Zarr v3 metadata"}},
                     ZARR_CHUNK_TYPE: _BINARY}
_ZARR_KEY_RESPONSES = {
    200: {"description": "The key: zarr.json (application/json) or a chunk (application/octet-stream)",
          "content": _ZARR_KEY_CONTENT},
    206: {"description": "The byte range of it that the Range header asked for", "content": _ZARR_KEY_CONTENT,
          "headers": {"Content-Range": {"description": "bytes FIRST-LAST/SIZE", "schema": {"type": "string"}}}},
    **problems(400, 401, 404, 416, 503, _503=STORE_DOWN, _404="No such array, or the array has no such key",
               _416="The Range cannot be served from the key's size"),
}
# RFC 9110 byte ranges: bytes=FIRST-[LAST] or bytes=-SUFFIX, comma-separated
RANGE_PATTERN = r"^bytes=([0-9]+-[0-9]*|-[0-9]+)(, *([0-9]+-[0-9]*|-[0-9]+))*$"


@router.head("/arrays/{name}/zarr/{key:path}", operation_id="head_zarr_key", response_class=FileResponse,
             responses=_ZARR_KEY_RESPONSES)
@router.get("/arrays/{name}/zarr/{key:path}", operation_id="get_zarr_key", response_class=FileResponse,
            responses=_ZARR_KEY_RESPONSES)
def zarr_key(name: ArrayName, key: ZarrKey, request: Request, svc: Services = Depends(services),
             byte_range: str = Header(None, alias="Range",
                                             description="a byte range of the key (206), e.g. bytes=0-99",
                                             json_schema_extra={"pattern": RANGE_PATTERN})):
    """The stored Zarr v3 group, read-only: ``zarr.json`` (consolidated metadata) and chunk keys,
    with HTTP Range requests, for ``xarray.open_zarr(".../arrays/NAME/zarr")``."""
    stored = svc.store.open_key(name, key)
    if stored is None:
        raise ServiceError(404, "https://chunked-tensor-ops.readthedocs.io/exceptions/no-such-key",
                           f"array {name!r} has no Zarr key {key!r}")
    if stored.local_path is None:
        return _streamed_key(stored, request.method, byte_range)
    _parse_range(byte_range, stored.size)  # a 416 here, before FileResponse starts
    return FileResponse(stored.local_path, media_type=_key_media(stored),
                        headers={"Cache-Control": "no-cache"})


def _key_media(stored: StoredKey) -> str:
    return ZARR_JSON_TYPE if stored.name == "zarr.json" else ZARR_CHUNK_TYPE


def _parse_range(byte_range: str | None, size: int) -> list[tuple[int, int]]:
    """The ranges (first, end exclusive) of a Range header; [] for none; 416 if unsatisfiable."""
    if not byte_range:
        return []
    try:
        return FileResponse._parse_range_header(byte_range, size)
    except Exception:
        raise ServiceError(416, RANGE_NOT_SATISFIABLE, f"Range {byte_range!r} cannot be served from {size} bytes",
                           headers={"Content-Range": f"bytes */{size}"}) from None


def _streamed_key(key: StoredKey, method: str, byte_range: str | None) -> Response:
    """A key without a local file (an object store's), as FileResponse serves a file: one
    Range is a 206, several (rare for Zarr readers) get the whole key. Bytes come straight
    from the store; a key up to ``KEY_PIECE_BYTES`` is read before the response starts, so a
    storage failure is a 503."""
    ranges = _parse_range(byte_range, key.size)
    start, end = ranges[0] if len(ranges) == 1 else (0, key.size)
    headers = {"Cache-Control": "no-cache", "Accept-Ranges": "bytes", "Content-Length": str(end - start)}
    status = 200
    if len(ranges) == 1:
        status = 206
        headers["Content-Range"] = f"bytes {start}-{end - 1}/{key.size}"
    media = _key_media(key)
    if method == "HEAD":
        return Response(status_code=status, headers=headers, media_type=media)
    if end - start <= KEY_PIECE_BYTES:
        return Response(key.read(start, end), status_code=status, headers=headers, media_type=media)
    return StreamingResponse(key.pieces(start, end), status_code=status, headers=headers, media_type=media)


@router.delete("/arrays/{name}", operation_id="delete_array", status_code=204, response_class=Response,
               responses={204: {"description": "Deleted"},
                          **problems(400, 401, 404, 409, 503, _503=STORE_DOWN,
                                     _409="A running job reads or writes the array")})
def delete_array(name: ArrayName, svc: Services = Depends(services)):
    """Delete the array (409 while a running job reads or writes it)."""
    check_name(name)
    if not svc.store.exists(name):
        raise no_such_array(name)
    with svc.records.unused(name) as job:  # no job can start reading it while it goes
        if job is not None:
            raise conflict(f"array {name!r} is in use by running job {job}; delete it when the job has finished")
        svc.store.delete(name)
    return Response(status_code=204)

