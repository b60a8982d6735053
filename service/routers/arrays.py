"""``/arrays``: upload (NPY streamed, or a zipped Zarr v3 store), list, info, NPY download,
read-only Zarr v3 over HTTP (consolidated metadata, Range requests) and delete."""

from __future__ import annotations

import os
import shutil

from fastapi import APIRouter, Depends, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse, Response, StreamingResponse

from schemas.service import ArrayInfo, ArrayList
from service import npy
from service.errors import (RANGE_NOT_SATISFIABLE, UNSUPPORTED_MEDIA_TYPE, ServiceError, bad_request, conflict,
                            no_such_array, too_large)
from service.execution import NPY_MEDIA_TYPE, dtype_header
from service.routers import problems
from service.state import Services, base_url, require_token, services
from service.storage import check_name

router = APIRouter(tags=["arrays"], dependencies=[Depends(require_token)])

ZIP_TYPES = ("application/zip", "application/x-zip-compressed")
ZARR_JSON_TYPE = "application/json"


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
    spool = svc.store.temp_dir("upload-")
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
                NPY_MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}},
                "application/zip": {"schema": {"type": "string", "format": "binary"}}}}},
            responses=problems(400, 401, 409, 413, 415))
async def put_array(name: str, request: Request,
                    chunks: str | None = Query(None, description="chunk lengths, e.g. 1,256,256,-1"),
                    dims: str | None = Query(None, description="dim names, e.g. time,y,x,band"),
                    variable: str | None = Query(None, description="the data variable of a zipped store"),
                    overwrite: bool = Query(False), svc: Services = Depends(services)):
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


@router.get("/arrays", response_model=ArrayList, responses=problems(401))
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


@router.get("/arrays/{name}/info", response_model=ArrayInfo, responses=problems(400, 401, 404))
def array_info(name: str, request: Request, svc: Services = Depends(services)) -> dict:
    """Shape, dtype, chunks, dim names and attrs."""
    return {**svc.store.info(name), "links": _links(base_url(request), name)}


@router.get("/arrays/{name}", responses={200: {"description": "NPY", "content": {NPY_MEDIA_TYPE: {
    "schema": {"type": "string", "format": "binary"}}}}, **problems(400, 401, 404)})
async def download_array(name: str, svc: Services = Depends(services)):
    """The array as NPY, produced block by block (bfloat16/complex32 as raw bits with X-Array-Dtype)."""
    dtype, length, pieces = await run_in_threadpool(svc.store.iter_npy, name)
    headers = {**dtype_header(dtype), "Content-Length": str(length),
               "Content-Disposition": f'attachment; filename="{name}.npy"'}
    return StreamingResponse(pieces, media_type=NPY_MEDIA_TYPE, headers=headers)


_ZARR_KEY_RESPONSES = {200: {"description": "a Zarr key"}, 206: {"description": "a byte range of it"},
                       **problems(400, 401, 404, 416)}


@router.head("/arrays/{name}/zarr/{key:path}", operation_id="head_zarr_key", responses=_ZARR_KEY_RESPONSES)
@router.get("/arrays/{name}/zarr/{key:path}", operation_id="get_zarr_key", responses=_ZARR_KEY_RESPONSES)
def zarr_key(name: str, key: str, request: Request, svc: Services = Depends(services)):
    """The stored Zarr v3 group, read-only: ``zarr.json`` (consolidated metadata) and chunk keys,
    with HTTP Range requests, for ``xarray.open_zarr(".../arrays/NAME/zarr")``."""
    path = svc.store.key_path(name, key)
    if path is None:
        raise ServiceError(404, "https://chunked-tensor-ops.readthedocs.io/exceptions/no-such-key",
                           f"array {name!r} has no Zarr key {key!r}")
    size = os.stat(path).st_size
    wanted = request.headers.get("range")
    if wanted:
        try:
            FileResponse._parse_range_header(wanted, size)
        except Exception:
            raise ServiceError(416, RANGE_NOT_SATISFIABLE, f"Range {wanted!r} cannot be served from {size} bytes",
                               headers={"Content-Range": f"bytes */{size}"}) from None
    media = ZARR_JSON_TYPE if path.name == "zarr.json" else "application/octet-stream"
    return FileResponse(path, media_type=media, headers={"Cache-Control": "no-cache"})


@router.delete("/arrays/{name}", status_code=204, responses=problems(400, 401, 404, 409))
def delete_array(name: str, svc: Services = Depends(services)):
    """Delete the array (409 while a running job reads or writes it)."""
    check_name(name)
    if not svc.store.exists(name):
        raise no_such_array(name)
    _check_free(svc, name, "delete")
    svc.store.delete(name)
    return Response(status_code=204)

