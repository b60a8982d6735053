"""Hostile payloads over HTTP: every one is refused with a clear 4xx OGC exception body.

For every case the test also checks, around the one request:

- memory: ``tracemalloc`` (which sees NumPy's buffers too) traces the whole process, app
  threads and in-process Dask workers included; the peak must stay far below what the
  payload declares (a few MiB, never the GiB a header or a zip entry claims);
- disk: ``<root>/arrays`` and ``<root>`` have no new entry, ``<root>/tmp`` is empty, and
  nothing appeared or changed outside the data root (a sibling folder holds a fake array and
  a secret, and arrays/ holds links to it);
- reads: an audit hook records every file the process opens or lists during the request;
  none may resolve outside the data root (symbolic links followed), nor be ``/etc/passwd``.

The codec and the zip extractor have their own unit tests (storage/test_npy.py, storage/test_zip.py),
the tests of api/ cover the ordinary routes and errors; this file is about the HTTP level.
The app runs with small limits (64 KiB uploads, 4 KiB inline arrays, 4 KiB chunks) so that
"over the limit" is cheap to send.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import os
import shutil
import stat
import struct
import sys
import time
import tracemalloc
import uuid
import warnings
import zipfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, unquote_to_bytes

import dask.array as da
import httpx
import numpy as np
import pytest
import xarray as xr
from fastapi.testclient import TestClient

import ops
from ops.errors import InvalidArgument
from service.api.app import create_app
from tests.service.conftest import NPY, assert_problem, inline, make_settings, npy_bytes

KiB, MiB, GiB = 2**10, 2**20, 2**30
MAX_UPLOAD = 64 * KiB
MAX_INLINE = 4 * KiB
MEMORY_BOUND = 64 * MiB  # the largest allocation any of these tiny requests may cause
NPY_MAGIC = b"\x93NUMPY"
MARKER = "OUTSIDE-THE-DATA-ROOT-7f3a"

OGC_EXC = "http://www.opengis.net/def/exceptions/ogcapi-processes-1/1.0/"
INVALID = OGC_EXC + "invalid-parameter"
NO_SUCH_PROCESS = OGC_EXC + "no-such-process"
NO_SUCH_JOB = OGC_EXC + "no-such-job"
PROJECT = "https://chunked-tensor-ops.readthedocs.io/exceptions/"
NO_SUCH_ARRAY = PROJECT + "no-such-array"
TOO_LARGE = PROJECT + "payload-too-large"
ZIP = "application/zip"


# ---------------------------------------------------------------------------------------------
# what every case checks: the problem body, memory, disk and reads


_opened: list[str] | None = None  # paths opened or listed while a request runs, resolved


def _audit(event: str, args: tuple) -> None:
    if _opened is not None and event in ("open", "os.listdir", "os.scandir"):
        path = args[0] if args else None
        if isinstance(path, (str, bytes, os.PathLike)):
            # resolved now: pinned reads go through /proc/self/fd/N, valid while N is open
            _opened.append(os.path.realpath(os.fsdecode(path)))


_hook_installed = False


def _install_audit_hook() -> None:
    global _hook_installed
    if not _hook_installed:  # an audit hook cannot be removed: one, idle outside requests
        sys.addaudithook(_audit)
        _hook_installed = True


@dataclass
class Env:
    client: TestClient
    base: Path        # holds root/ and outside/
    root: Path        # the data root
    outside: Path     # a fake array and a secret, next to the data root

    @property
    def arrays(self) -> Path:
        return self.root / "arrays"

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"

    def forbidden(self, path: str) -> bool:
        real = Path(os.path.realpath(path))
        return real == Path("/etc/passwd") or (real.is_relative_to(self.base)
                                                and not real.is_relative_to(self.root))


def _tree(base: Path, exclude: Path) -> dict[str, tuple]:
    """Every entry under ``base`` but ``exclude``: kind, size and content hash of files."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(base):
        here = Path(dirpath)
        if here == exclude or here.is_relative_to(exclude):
            dirnames[:] = []
            continue
        for name in dirnames + filenames:
            path = here / name
            if path == exclude:
                continue
            info = path.lstat()
            data = path.read_bytes() if stat.S_ISREG(info.st_mode) else None
            out[str(path.relative_to(base))] = (stat.S_IFMT(info.st_mode), info.st_size, hash(data))
    return out


def _top(root: Path) -> set[str]:
    """The data root's own entries (but SQLite's passing journal files)."""
    return {name for name in os.listdir(root) if not name.startswith("jobs.sqlite")}


@contextlib.contextmanager
def _traced_peak():
    """The peak of memory traced while the block runs, in bytes (in ``result[0]``)."""
    result = [0]
    already = tracemalloc.is_tracing()
    if not already:
        tracemalloc.start(1)
    tracemalloc.reset_peak()
    start, _ = tracemalloc.get_traced_memory()
    try:
        yield result
    finally:
        _, peak = tracemalloc.get_traced_memory()
        result[0] = peak - start
        if not already:
            tracemalloc.stop()


def hostile(env: Env, send: Callable[[], httpx.Response], status: int | tuple[int, ...], *needles: str,
            type_: str | None = None, detail: str | None = None) -> dict:
    """Send one hostile request; check the answer and that it cost nothing lasting."""
    global _opened
    arrays_before = set(os.listdir(env.arrays))
    root_before = _top(env.root)
    outside_before = _tree(env.base, env.root)
    _opened = []
    try:
        with _traced_peak() as peak:
            response = send()
    finally:
        opened, _opened = _opened, None
    statuses = (status,) if isinstance(status, int) else status
    assert response.status_code in statuses, (response.status_code, response.text[:2000])
    body = assert_problem(response, response.status_code, type_)
    for needle in needles:
        assert needle.lower() in body["detail"].lower(), (needle, body)
    if detail is not None:
        assert body["detail"] == detail, body
    assert MARKER not in response.text
    assert peak[0] < MEMORY_BOUND, f"the request allocated {peak[0] / MiB:.1f} MiB"
    assert set(os.listdir(env.arrays)) <= arrays_before, "a new entry in arrays/"
    assert _top(env.root) == root_before, "a new entry in the data root"
    assert list(env.tmp.iterdir()) == [], "tmp/ is not empty"
    assert _tree(env.base, env.root) == outside_before, "something changed outside the data root"
    read_outside = sorted({p for p in opened if env.forbidden(p)})
    assert not read_outside, f"the request read outside the data root: {read_outside}"
    return body


# ---------------------------------------------------------------------------------------------
# raw ASGI: exact paths, and bodies whose reading is counted


@dataclass
class Raw:
    response: httpx.Response
    consumed: int  # body bytes the app took


def raw(env: Env, method: str, raw_path: bytes, *, headers: dict | None = None,
        body: bytes | Iterable[bytes] = b"", query: bytes = b"") -> Raw:
    """One request straight to the ASGI app (on the TestClient's event loop): the path exactly
    as given (httpx would resolve ``..``), and a body fed piece by piece, counting what the app
    reads; no Content-Length unless ``headers`` give one."""
    pieces: Iterator[bytes] = iter([body] if isinstance(body, bytes) else body)
    consumed = [0]

    async def run() -> httpx.Response:
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
                 "scheme": "http", "path": unquote_to_bytes(raw_path).decode("latin-1"), "raw_path": raw_path,
                 "query_string": query, "root_path": "",
                 "headers": [(b"host", b"testserver")] + [(k.lower().encode("latin-1"), v.encode("latin-1"))
                                                          for k, v in (headers or {}).items()],
                 "client": ("127.0.0.1", 5000), "server": ("testserver", 80), "state": {}}
        sent, start, done = [], {}, asyncio.Event()
        finished = [False]

        async def receive():
            if done.is_set() or finished[0]:
                await done.wait()
                return {"type": "http.disconnect"}
            piece = next(pieces, None)
            if piece is None:
                finished[0] = True
                return {"type": "http.request", "body": b"", "more_body": False}
            consumed[0] += len(piece)
            return {"type": "http.request", "body": piece, "more_body": True}

        async def send(message):
            if message["type"] == "http.response.start":
                start.update(message)
            elif message["type"] == "http.response.body":
                sent.append(message.get("body", b""))
                if not message.get("more_body"):
                    done.set()

        await env.client.app(scope, receive, send)
        decoded = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in start["headers"]]
        return httpx.Response(start["status"], headers=decoded, content=b"".join(sent))

    response = env.client.portal.call(run)
    return Raw(response, consumed[0])


def endless(piece: bytes = b"\0" * (64 * KiB), limit: int = 256 * MiB) -> Iterator[bytes]:
    """A body that would go on far past every limit (up to ``limit`` bytes)."""
    sent = 0
    while sent < limit:
        yield piece
        sent += len(piece)


# ---------------------------------------------------------------------------------------------
# the app, a fake array outside the data root, and symbolic links to it


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> Iterator[Env]:
    _install_audit_hook()
    base = tmp_path_factory.mktemp("hostile")
    root, outside = base / "root", base / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text(f"{MARKER}: not to be served\n")
    settings = make_settings(root, max_upload_bytes=MAX_UPLOAD, max_inline_bytes=MAX_INLINE, chunk_bytes=4096)
    with TestClient(create_app(settings)) as client:
        e = Env(client, base, root, outside)
        # A real array, copied out of the data root with a marker in its attrs: the fake.
        template = np.arange(16, dtype=np.int32).reshape(1, 2, 2, 4)
        assert client.put("/arrays/template", content=npy_bytes(template),
                          headers={"Content-Type": NPY}).status_code == 201
        fake = outside / "fake"
        shutil.copytree(root / "arrays" / "template", fake)
        group = json.loads((fake / "zarr.json").read_text())
        group["attributes"] = {"secret": MARKER}
        (fake / "zarr.json").write_text(json.dumps(group))
        assert client.delete("/arrays/template").status_code == 204
        # arrays/evil -> outside/fake (the whole group is a link)
        os.symlink(fake, root / "arrays" / "evil", target_is_directory=True)
        # arrays/halfevil: a real folder whose zarr.json is a link to the fake's
        half = root / "arrays" / "halfevil"
        shutil.copytree(fake, half)
        (half / "zarr.json").unlink()
        os.symlink(fake / "zarr.json", half / "zarr.json")
        # arrays/chunkevil: a real folder whose one chunk is a link to a file outside
        chunky = root / "arrays" / "chunkevil"
        shutil.copytree(fake, chunky)
        (chunky / "zarr.json").write_text(json.dumps({**group, "attributes": {}}))
        chunk = next(p for p in (chunky / "template").rglob("*") if p.is_file() and p.name != "zarr.json")
        chunk.unlink()
        os.symlink(outside / "secret.txt", chunk)
        yield e


def _ints(shape, dtype=np.int32) -> np.ndarray:
    return np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape)


def put(env: Env, name: str, array: np.ndarray) -> None:
    response = env.client.put(f"/arrays/{name}", content=npy_bytes(array), headers={"Content-Type": NPY})
    assert response.status_code == 201, response.text


def execute(env: Env, process: str, inputs: dict, *, mode: str = "value", name: str | None = None,
            headers: dict | None = None) -> httpx.Response:
    output = {"format": {"mediaType": NPY}, "transmissionMode": mode}
    if name:
        output["name"] = name
    return env.client.post(f"/processes/{process}/execution",
                           json={"inputs": inputs, "outputs": {"result": output}}, headers=headers or {})


def ops_message(call: Callable[[], object]) -> str:
    with pytest.raises((InvalidArgument, IndexError)) as info:
        call()
    return str(info.value)


# ---------------------------------------------------------------------------------------------
# 1. NPY bodies: PUT /arrays/NAME and inline base64 inputs


def npy_raw(header: str, *, version: tuple[int, int] = (1, 0), data: bytes = b"") -> bytes:
    """An NPY with this header text (padded as NumPy pads it) and data."""
    text = header.encode("latin1" if version < (3, 0) else "utf8")
    size = 2 if version == (1, 0) else 4
    pad = -(len(NPY_MAGIC) + 2 + size + len(text) + 1) % 64
    text += b" " * pad + b"\n"
    return NPY_MAGIC + bytes(version) + struct.pack("<H" if size == 2 else "<I", len(text)) + text + data


def _header(descr="'<f4'", fortran="False", shape="(1, 2, 2, 4)", extra="") -> str:
    return f"{{'descr': {descr}, 'fortran_order': {fortran}, 'shape': {shape}, {extra}}}"


def _pickled() -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, np.array([{"a": 1}, None, print], dtype=object).reshape(1, 1, 3, 1), allow_pickle=True)
    return buffer.getvalue()


_GOOD = npy_bytes(_ints((1, 2, 2, 4), np.float32))
_BIG_HEADER = _header(extra="'pad': '" + "x" * 10_050 + "'")

# (id, NPY bytes, PUT status, needles in the detail). Inline inputs get the same status
# (413 stays 413), or the operator's own refusal for a well-formed NPY of a dtype it refuses.
NPY_CASES = [
    ("pickle", _pickled(), 400, ("descr", "|O")),
    ("bad-magic", b"\x93NUMPZ\x01\x00" + _GOOD[8:], 400, ("magic",)),
    ("no-magic", b"PK\x03\x04" + b"\0" * 60, 400, ("magic",)),
    ("version-4.0", NPY_MAGIC + b"\x04\x00" + _GOOD[8:], 400, ("version", "got 4.")),
    ("version-1.1", NPY_MAGIC + b"\x01\x01" + _GOOD[8:], 400, ("version", "1.1")),
    ("v2-4GiB-header-in-12-bytes", NPY_MAGIC + b"\x02\x00" + b"\xff\xff\xff\xff", 400,
     ("length", "4294967295", "10000")),
    ("v1-64KiB-header-in-10-bytes", NPY_MAGIC + b"\x01\x00" + b"\xff\xff", 400, ("length", "65535")),
    ("header-over-10000-bytes", npy_raw(_BIG_HEADER, version=(2, 0)), 400, ("length", "10000")),
    ("header-a-list", npy_raw("[1, 2, 3]"), 400, ("dict",)),
    ("header-a-string", npy_raw("'descr'"), 400, ("dict",)),
    ("header-not-python", npy_raw("{'descr': '<f4', "), 400, ("dict",)),
    ("header-a-call", npy_raw(_header(descr="__import__('os').system('true')")), 400, ("literal",)),
    ("header-a-lambda", npy_raw(_header(shape="(lambda: 1)()")), 400, ("literal",)),
    ("header-bad-utf8-v3", NPY_MAGIC + b"\x03\x00" + struct.pack("<I", 4) + b"{\xff}\n", 400, ("utf8",)),
    ("header-nested-deep", npy_raw("{'descr': " + "[" * 5000 + "]" * 5000 + "}", version=(2, 0)), 400, ("header",)),
    ("extra-key", npy_raw(_header(extra="'evil': 1"), data=_GOOD[128:]), 400, ("unexpected 'evil'",)),
    ("missing-key", npy_raw("{'descr': '<f4', 'fortran_order': False}"), 400, ("missing 'shape'",)),
    ("repeated-key", npy_raw("{'descr': '<f4', 'descr': '<f8', 'fortran_order': False, 'shape': (2,)}"), 400,
     ("repeat",)),
    ("fortran-order-int", npy_raw(_header(fortran="1")), 400, ("fortran_order",)),
    ("fortran-order-str", npy_raw(_header(fortran="'yes'")), 400, ("fortran_order",)),
    ("fortran-order-none", npy_raw(_header(fortran="None")), 400, ("fortran_order",)),
    ("shape-a-list", npy_raw(_header(shape="[1, 2, 2, 4]")), 400, ("shape",)),
    ("shape-float", npy_raw(_header(shape="(1, 2.0, 2, 4)")), 400, ("shape",)),
    ("shape-bool", npy_raw(_header(shape="(True, 2, 2, 4)")), 400, ("shape",)),
    ("shape-negative", npy_raw(_header(shape="(1, -2, 2, 4)")), 400, (">= 0", "-2")),
    ("shape-65-dims", npy_raw(_header(shape="(" + "1, " * 65 + ")")), 400, ("64 dimensions",)),
    ("element-count-overflows-int64", npy_raw(_header(shape="(4294967296, 4294967296)")), 400,
     ("element count", "int64")),
    ("element-count-overflows-with-a-0", npy_raw(_header(shape="(0, 4294967296, 4294967296)")), 400,
     ("element count", "int64")),
    ("byte-count-overflows-int64", npy_raw(_header(descr="'<f8'", shape="(2305843009213693952,)")), 400,
     ("byte count", "int64")),
    ("declares-8TiB", npy_raw(_header(shape="(1048576, 1048576, 2, 1)")), 413, ("exceeds the limit",)),
    ("declares-just-over-the-limit", npy_raw(_header(descr="'|u1'", shape=f"({MAX_UPLOAD + 1},)")), 413,
     ("exceeds the limit",)),
    ("truncated", _GOOD[:-5], 400, ("declare", "64", "got 59")),
    ("header-only", _GOOD[:128], 400, ("declare", "64", "got 0")),
    ("trailing", _GOOD + b"\0" * 7, 400, ("declare", "64", "got")),
    ("half-a-header", _GOOD[:40], 400, ("header",)),
    ("empty", b"", 400, ("header",)),
    ("descr-V0", npy_raw(_header(descr="'|V0'")), 400, ("descr", "|V0")),
    ("descr-V8", npy_raw(_header(descr="'|V8'")), 400, ("descr", "|V8")),
    ("descr-U0", npy_raw(_header(descr="'<U0'")), 400, ("descr", "<U0")),
    ("descr-U3", npy_raw(_header(descr="'<U3'")), 400, ("descr", "<U3")),
    ("descr-U3-400MB-shape", npy_raw(_header(descr="'<U3'", shape="(1, 2048, 2048, 8)")), 400, ("descr", "<U3")),
    ("descr-S", npy_raw(_header(descr="'|S'")), 400, ("descr", "|S")),
    ("descr-S0-huge-shape", npy_raw(_header(descr="'|S0'", shape="(4294967296, 4294967296, 1, 1)")), 400,
     ("descr", "|S0")),
    ("descr-O", npy_raw(_header(descr="'|O'")), 400, ("descr", "|O")),
    ("descr-O-huge-shape", npy_raw(_header(descr="'|O'", shape="(1048576, 1048576, 2, 1)")), 400, ("descr",)),
    ("descr-M8", npy_raw(_header(descr="'<M8[ns]'")), 400, ("descr",)),
    ("descr-structured", npy_raw(_header(descr="[('a', '<f4'), ('b', '<f4')]")), 400, ("descr",)),
    ("descr-subarray", npy_raw(_header(descr="('<f4', (2,))")), 400, ("descr",)),
    ("descr-huge-itemsize", npy_raw(_header(descr="'|V9999999999999'")), 400, ("descr",)),
    ("descr-int", npy_raw(_header(descr="4")), 400, ("descr",)),
]


@pytest.mark.parametrize(("body", "status", "needles"), [c[1:] for c in NPY_CASES], ids=[c[0] for c in NPY_CASES])
def test_npy_put(env, body, status, needles):
    name = f"npy-{uuid.uuid4().hex[:8]}"
    send = lambda: env.client.put(f"/arrays/{name}", content=body, headers={"Content-Type": NPY})  # noqa: E731
    hostile(env, send, status, *needles, type_=INVALID if status == 400 else TOO_LARGE)
    # the same bytes in pieces (the header split across them), without Content-Length
    pieces = [body[i:i + 7] for i in range(0, len(body), 7)] or [b""]
    answer = hostile(env, lambda: raw(env, "PUT", f"/arrays/{name}".encode(), headers={"Content-Type": NPY},
                                      body=pieces).response, status, *needles)
    assert answer["type"] == (INVALID if status == 400 else TOO_LARGE)


# Well-formed NPYs of a dtype no operator takes: an inline input gets the operator's own
# refusal for an array of that dtype and shape (as docs/api.md promises), its data (a pickle) never read.
_OPS_REFUSES = {
    "pickle": (object, (1, 1, 3, 1)),
    "descr-U0": ("<U0", (1, 2, 2, 4)),
    "descr-U3": ("<U3", (1, 2, 2, 4)),
    "descr-U3-400MB-shape": ("<U3", (1, 2048, 2048, 8)),
    "descr-S": ("|S", (1, 2, 2, 4)),
    "descr-O": (object, (1, 2, 2, 4)),
    "descr-O-huge-shape": (object, (1048576, 1048576, 2, 1)),
    "descr-V0": ("|V0", (1, 2, 2, 4)),
    "descr-V8": ("|V8", (1, 2, 2, 4)),
    "descr-M8": ("<M8[ns]", (1, 2, 2, 4)),
    "descr-structured": ([("a", "<f4"), ("b", "<f4")], (1, 2, 2, 4)),
}


def _lazy(dtype, shape) -> da.Array:
    """A never-allocated array of that dtype and shape."""
    standin = np.broadcast_to(np.zeros((), dtype), shape)
    return da.zeros(standin.shape, dtype=standin.dtype, chunks=tuple(max(1, n) for n in shape))


@pytest.mark.parametrize(("case", "body", "status", "needles"), [(c[0], *c[1:]) for c in NPY_CASES],
                         ids=[c[0] for c in NPY_CASES])
def test_npy_inline(env, case, body, status, needles):
    value = {"value": base64.b64encode(body).decode(), "encoding": "base64", "mediaType": NPY}
    send = lambda: execute(env, "depth_to_space", {"x": value, "block_size": 2})  # noqa: E731
    if case in _OPS_REFUSES:
        message = ops_message(lambda: ops.depth_to_space(_lazy(*_OPS_REFUSES[case]), 2))
        hostile(env, send, 400, type_=INVALID, detail=message)
        return
    needles = needles if status == 413 or case == "empty" else ("'x'", *needles)
    hostile(env, send, status, *needles, type_=INVALID if status == 400 else TOO_LARGE)


@pytest.mark.smoke
def test_npy_over_the_limit_with_content_length_is_refused_unread(env):
    header = npy_raw(_header(descr="'|u1'", shape=f"({GiB},)"))
    got = None

    def send(length: int) -> httpx.Response:
        nonlocal got
        got = raw(env, "PUT", b"/arrays/npy-cl", body=[header, *endless()],
                  headers={"Content-Type": NPY, "Content-Length": str(length)})
        return got.response

    for length in (GiB + len(header), MAX_UPLOAD + 10_000 + 1):
        hostile(env, lambda: send(length), 413, str(length), type_=TOO_LARGE)
        assert got.consumed == 0, got.consumed
    # through httpx as well: a real body with its real Content-Length
    body = npy_raw(_header(descr="'|u1'", shape=f"({2 * MAX_UPLOAD},)"), data=bytes(2 * MAX_UPLOAD))
    hostile(env, lambda: env.client.put("/arrays/npy-cl", content=body, headers={"Content-Type": NPY}), 413,
            "limit", type_=TOO_LARGE)


def test_npy_over_the_limit_without_content_length(env):
    # An honest NPY over the limit: its header declares it, 413 at the first piece.
    header = npy_raw(_header(descr="'|u1'", shape=f"({GiB},)"))
    got = None

    def send():
        nonlocal got
        got = raw(env, "PUT", b"/arrays/npy-chunked", headers={"Content-Type": NPY},
                  body=[header, *endless()])
        return got.response

    hostile(env, send, 413, "exceeds the limit", type_=TOO_LARGE)
    assert got.consumed <= len(header) + 64 * KiB, got.consumed
    # A header declaring little, then a body that never stops: refused as soon as the data
    # outgrows the header, long before the limit.
    small = npy_raw(_header(descr="'|u1'", shape="(100,)"))

    def send_lying():
        nonlocal got
        got = raw(env, "PUT", b"/arrays/npy-chunked", headers={"Content-Type": NPY},
                  body=[small, *endless(b"\0" * 1000)])
        return got.response

    hostile(env, send_lying, 400, "declared 100 data bytes, got more", type_=INVALID)
    assert got.consumed <= len(small) + 2000, got.consumed

    # httpx sends a generator with Transfer-Encoding: chunked and no Content-Length
    def chunks():
        yield header
        for _ in range(4):
            yield bytes(MAX_UPLOAD)

    def send_chunked():
        response = env.client.put("/arrays/npy-chunked", content=chunks(), headers={"Content-Type": NPY})
        assert "content-length" not in {k.lower() for k in response.request.headers}
        return response

    hostile(env, send_chunked, 413, "exceeds the limit", type_=TOO_LARGE)


@pytest.mark.parametrize(("query", "needle"), [
    (b"chunks=99999999999999999999999", "chunks"),
    (b"chunks=0", "chunks"),
    (b"chunks=-5", "chunks"),
    (b"chunks=1,1", "chunks"),
    (b"chunks=1e3", "chunks"),
    (b"chunks=" + b"1," * 5000 + b"1", "chunks"),
    (b"dims=a", "dims"),
    (b"dims=a,a,b,c", "dims"),
    (b"dims=../x,b,c,d", "dims"),
    (b"overwrite=maybe", "overwrite"),
])
def test_npy_put_bad_query(env, query, needle):
    body = npy_bytes(_ints((1, 2, 2, 4)))
    hostile(env, lambda: raw(env, "PUT", b"/arrays/query", headers={"Content-Type": NPY}, body=body,
                             query=query).response, 400, needle, type_=INVALID)


# ---------------------------------------------------------------------------------------------
# 2. zipped Zarr stores: PUT /arrays/NAME (application/zip)


def _store_entries(tmp: Path) -> dict[str, bytes]:
    path = tmp / f"store-{uuid.uuid4().hex[:6]}.zarr"
    ds = xr.Dataset({"v": (("y", "x"), np.arange(12, dtype=np.float32).reshape(3, 4))})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds.to_zarr(path, zarr_format=3, mode="w", consolidated=True)
    entries = {p.relative_to(path).as_posix(): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}
    shutil.rmtree(path)
    return entries


@pytest.fixture(scope="module")
def store_entries(tmp_path_factory) -> dict[str, bytes]:
    return _store_entries(tmp_path_factory.mktemp("zarr-store"))


def zip_of(entries: Iterable[tuple[str | zipfile.ZipInfo, bytes]]) -> bytes:
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # duplicate names
        with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
            for name, data in entries:
                archive.writestr(name, data)
    return buffer.getvalue()


def _edited(entries: dict[str, bytes], path: str, change: Callable[[dict], None]) -> dict[str, bytes]:
    meta = json.loads(entries[path])
    change(meta)
    return {**entries, path: json.dumps(meta).encode()}


def _consolidated(meta: dict) -> dict:
    return meta["consolidated_metadata"]["metadata"]["v"]


def _symlink(name: str, target: str) -> tuple[zipfile.ZipInfo, bytes]:
    info = zipfile.ZipInfo(name)
    info.external_attr = (stat.S_IFLNK | 0o777) << 16
    return info, target.encode()


def _zip_cases(entries: dict[str, bytes]) -> list[tuple[str, bytes, int, tuple[str, ...]]]:
    good = list(entries.items())
    shape = lambda value: lambda m: m.update(shape=value)  # noqa: E731
    chunks = lambda value: lambda m: m["chunk_grid"]["configuration"].update(chunk_shape=value)  # noqa: E731
    codecs = lambda m: m.update(codecs=[{"name": "bytes", "configuration": {"endian": "little"}},  # noqa: E731
                                        {"name": "evil_codec", "configuration": {"cmd": "rm -rf /"}}])
    return [
        ("bomb", zip_of(good + [("v/c/9/9", bytes(16 * MiB))]), 413, ("declared uncompressed sizes",)),
        ("bomb-over-entries", zip_of(good + [(f"v/c/{i}/0", bytes(40 * KiB)) for i in range(5, 7)]), 413,
         ("add up",)),
        ("nested-by-name", zip_of(good + [("inner.zip", zip_of(good))]), 400, ("nested",)),
        ("nested-by-content", zip_of(good + [("v/c/0/1", zip_of(good))]), 400, ("nested",)),
        ("slip-dotdot", zip_of(good + [("../evil.txt", b"x")]), 400, ("'..' component",)),
        ("slip-deep", zip_of(good + [("../../../outside/evil.txt", b"x")]), 400, ("'..' component",)),
        ("slip-inner", zip_of(good + [("v/../../evil.txt", b"x")]), 400, ("'..' component",)),
        ("slip-absolute", zip_of(good + [("/tmp/evil.txt", b"x")]), 400, ("absolute",)),
        ("slip-backslash", zip_of(good + [("..\\evil.txt", b"x")]), 400, ("backslash",)),
        ("slip-drive", zip_of(good + [("C:/evil.txt", b"x")]), 400, ("drive",)),
        ("symlink", zip_of(good + [_symlink("v/c/0/1", "/etc/passwd")]), 400, ("symbolic link",)),
        ("symlink-as-store", zip_of([_symlink("zarr.json", "../../outside/fake/zarr.json")]), 400,
         ("symbolic link",)),
        ("symlink-folder", zip_of([_symlink("v", "/etc")] + [(k, d) for k, d in good if not k.startswith("v/")]),
         400, ("symbolic link",)),
        ("duplicate", zip_of(good + [("zarr.json", entries["zarr.json"])]), 400, ("duplicate",)),
        ("duplicate-folder", zip_of(good + [("v/", b""), ("v", b"")]), 400, ("duplicate",)),
        ("huge-shape", zip_of(_edited(entries, "v/zarr.json", shape([2**40, 2**40])).items()), 413, ("shape",)),
        ("huge-shape-consolidated",
         zip_of(_edited(entries, "zarr.json", lambda m: _consolidated(m).update(shape=[2**40, 2**40])).items()),
         413, ("shape",)),
        ("overflowing-shape", zip_of(_edited(entries, "v/zarr.json", shape([2**62, 2**62, 2**62])).items()), 413,
         ("shape",)),
        ("negative-shape", zip_of(_edited(entries, "v/zarr.json", shape([-3, 4])).items()), 400, ("shape",)),
        ("huge-chunk", zip_of(_edited(entries, "v/zarr.json", chunks([2**20, 2**20])).items()), 413, ("chunk",)),
        ("zero-chunk", zip_of(_edited(entries, "v/zarr.json", chunks([0, 4])).items()), 400, ("chunk",)),
        ("unknown-codec", zip_of(_edited(entries, "v/zarr.json", codecs).items()), 400, ("evil_codec",)),
        ("unknown-codec-consolidated",
         zip_of(_edited(entries, "zarr.json", lambda m: codecs(_consolidated(m))).items()), 400, ("evil_codec",)),
        ("object-dtype", zip_of(_edited(entries, "v/zarr.json", lambda m: m.update(data_type="object")).items()),
         400, ("data_type",)),
        ("zarr-json-not-json", zip_of({**entries, "zarr.json": b"{not json"}.items()), 400, ("not valid json",)),
        ("zarr-json-deep", zip_of({**entries, "zarr.json": b"[" * 20_000 + b"]" * 20_000}.items()), 400,
         ("zarr.json",)),
        ("zarr-json-a-list", zip_of({**entries, "zarr.json": b"[1, 2]"}.items()), 400, ("json object",)),
        ("zarr-json-binary", zip_of({**entries, "v/zarr.json": b"\xff\xfe\x00garbage"}.items()), 400,
         ("not valid json",)),
        ("zarr-v2", zip_of([(".zgroup", b'{"zarr_format": 2}'), ("v/.zarray", b"{}")]), 400, ("zarr_format=3",)),
        ("no-zarr-json", zip_of([("readme.txt", b"hello")]), 400, ("no zarr.json",)),
        ("empty-zip", b"PK\x05\x06" + b"\0" * 18, 400, ("no zarr.json",)),
        ("not-a-zip", b"PK\x03\x04" + b"\0" * 100, 400, ("not a zip",)),
        ("empty", b"", 400, ("not a zip",)),
        ("random-bytes", os.urandom(1000), 400, ("not a zip",)),
    ]


def test_zip_put(env, store_entries):
    cases = _zip_cases(store_entries)
    for case, body, status, needles in cases:
        name = f"zip-{case}"
        assert len(body) < MAX_UPLOAD, (case, len(body))
        send = lambda: env.client.put(f"/arrays/{name}", content=body, headers={"Content-Type": ZIP})  # noqa: E731
        try:
            hostile(env, send, status, *needles, type_=INVALID if status == 400 else TOO_LARGE)
        except AssertionError as error:
            raise AssertionError(f"zip case {case!r}: {error}") from None
    # the good store itself is accepted (so the refusals above are about the edits)
    good = zip_of(store_entries.items())
    response = env.client.put("/arrays/zip-good", content=good, headers={"Content-Type": ZIP})
    assert response.status_code == 201, response.text
    assert env.client.delete("/arrays/zip-good").status_code == 204


def test_zip_bomb_with_lying_sizes(env, store_entries):
    blob = bytearray(zip_of(list(store_entries.items()) + [("v/c/9/9", bytes(16 * MiB))]))
    # rewrite the declared size of the bomb entry to 1000 bytes in both headers
    eocd = blob.rindex(b"PK\x05\x06")
    (count,) = struct.unpack_from("<H", blob, eocd + 10)
    (pos,) = struct.unpack_from("<I", blob, eocd + 16)
    for _ in range(count):
        name_len, extra_len, comment_len = struct.unpack_from("<HHH", blob, pos + 28)
        (local,) = struct.unpack_from("<I", blob, pos + 42)
        if blob[pos + 46:pos + 46 + name_len] == b"v/c/9/9":
            struct.pack_into("<I", blob, pos + 24, 1000)
            struct.pack_into("<I", blob, local + 22, 1000)
        pos += 46 + name_len + extra_len + comment_len
    hostile(env, lambda: env.client.put("/arrays/zip-liar", content=bytes(blob), headers={"Content-Type": ZIP}),
            (400, 413), "v/c/9/9")


def test_zip_over_the_limit(env):
    # with Content-Length: refused before a byte is read
    got = None

    def send():
        nonlocal got
        got = raw(env, "PUT", b"/arrays/zip-big", body=endless(),
                  headers={"Content-Type": ZIP, "Content-Length": str(GiB)})
        return got.response

    hostile(env, send, 413, str(GiB), type_=TOO_LARGE)
    assert got.consumed == 0
    # without: reading stops at the limit

    def send_endless():
        nonlocal got
        got = raw(env, "PUT", b"/arrays/zip-big", body=endless(), headers={"Content-Type": ZIP})
        return got.response

    hostile(env, send_endless, 413, "limit", type_=TOO_LARGE)
    assert got.consumed <= MAX_UPLOAD + 64 * KiB, got.consumed

    def chunks():  # httpx: Transfer-Encoding: chunked
        for _ in range(3):
            yield os.urandom(MAX_UPLOAD)

    hostile(env, lambda: env.client.put("/arrays/zip-big", content=chunks(), headers={"Content-Type": ZIP}),
            413, "limit", type_=TOO_LARGE)


# ---------------------------------------------------------------------------------------------
# 3. names and links


HOSTILE_NAMES = [
    "../x", "/etc/passwd", "file:///etc/passwd", "http://169.254.169.254/latest", "s3://bucket/key",
    "simplecache::file:///etc/passwd", "zip://x::file.zip", "%2e%2e%2fx", "..%2fx", "..", ".", "...",
    ".hidden", "x\x00y", "a" * 129, "evil", "halfevil",
]


def _paths(name: str) -> list[tuple[str, bytes]]:
    """The array routes for ``name``, sent raw: as is, and fully percent-encoded."""
    out = []
    for encoded in {name.encode("latin-1", "replace"), quote(name, safe="").encode()}:
        for method, suffix in (("GET", b"/info"), ("GET", b""), ("GET", b"/zarr/zarr.json"),
                               ("GET", b"/zarr/template/zarr.json"), ("HEAD", b"/zarr/zarr.json"),
                               ("DELETE", b""), ("PUT", b"")):
            out.append((method, b"/arrays/" + encoded + suffix))
    return out


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_hostile_array_names(env, name):
    body = npy_bytes(_ints((1, 2, 2, 4)))
    for method, path in _paths(name):
        headers = {"Content-Type": NPY} if method == "PUT" else {}
        got = None

        def send():
            nonlocal got
            got = raw(env, method, path, headers=headers, body=body if method == "PUT" else b"",
                      query=b"overwrite=true" if method == "PUT" else b"")
            if method == "HEAD":  # no body: answer the same route with GET for the checks
                assert 400 <= got.response.status_code < 500, (path, got.response.status_code)
                return raw(env, "GET", path).response
            return got.response

        try:
            hostile(env, send, (400, 404, 405))
        except AssertionError as error:
            raise AssertionError(f"{method} {path!r}: {error}") from None
    # the links are still there and the fake array outside is untouched (hostile() checked it)
    assert (env.arrays / "evil").is_symlink() and (env.arrays / "halfevil" / "zarr.json").is_symlink()


@pytest.mark.parametrize("name", ["evil", "halfevil"])
def test_linked_arrays_are_not_served(env, name):
    for path in (f"/arrays/{name}/info", f"/arrays/{name}", f"/arrays/{name}/zarr/zarr.json",
                 f"/arrays/{name}/zarr/template/zarr.json"):
        hostile(env, lambda: env.client.get(path), 400, "data root", type_=INVALID)
    hostile(env, lambda: env.client.delete(f"/arrays/{name}"), 400, "data root", type_=INVALID)
    body = npy_bytes(_ints((1, 2, 2, 4)))
    hostile(env, lambda: env.client.put(f"/arrays/{name}", content=body, headers={"Content-Type": NPY},
                                        params={"overwrite": "true"}), 400, "data root", type_=INVALID)
    hostile(env, lambda: execute(env, "depth_to_space", {"x": {"href": f"/arrays/{name}"}, "block_size": 2}),
            400, "data root", type_=INVALID)
    hostile(env, lambda: execute(env, "depth_to_space", {"x": inline(_ints((1, 2, 2, 4))), "block_size": 2},
                                 mode="reference", name=name), 400, "data root", type_=INVALID)
    listing = env.client.get("/arrays")
    assert listing.status_code == 200 and MARKER not in listing.text
    assert name not in [a["name"] for a in listing.json()["arrays"]]


def test_array_holding_a_link_is_not_read(env):
    """A chunk file inside an array that is a link out of the data root (not something an
    upload can make) is never followed: the array is refused before any chunk is read."""
    for send in (lambda: env.client.get("/arrays/chunkevil"),
                 lambda: execute(env, "depth_to_space", {"x": {"href": "/arrays/chunkevil"}, "block_size": 2})):
        hostile(env, send, 400, "symbolic link", type_=INVALID)
    chunk = next(p for p in (env.arrays / "chunkevil").rglob("*") if p.is_symlink())
    key = chunk.relative_to(env.arrays / "chunkevil").as_posix()
    hostile(env, lambda: env.client.get(f"/arrays/chunkevil/zarr/{key}"), 404, key)


HOSTILE_HREFS = [
    "../x", "/etc/passwd", "file:///etc/passwd", "http://169.254.169.254/latest", "s3://bucket/key",
    "simplecache::file:///etc/passwd", "zip://x::file.zip", "/arrays/%2e%2e%2fx", "/arrays/..%2fx",
    "arrays/../../etc/passwd", "/arrays/../jobs.sqlite", "/arrays/..", "/arrays/", "arrays", "/arrays/evil/zarr",
    "/arrays/x/../../etc/passwd", "http://testserver/arrays/../../etc/passwd", "http://testserver:80@evil/arrays/x",
    "//169.254.169.254/arrays/x", "\\\\server\\share", "/arrays/x\x00", "/arrays/x#frag", "data:,hello",
    "memory://x", "/arrays/" + "a" * 200, "https://testserver/arrays/x",
]


@pytest.mark.parametrize("href", HOSTILE_HREFS)
def test_hostile_hrefs(env, href):
    inputs = {"x": {"href": href}, "block_size": 2}
    body = hostile(env, lambda: execute(env, "depth_to_space", inputs), 400, "href", type_=INVALID)
    assert "name" in body["detail"] or "/arrays/NAME" in body["detail"]
    hostile(env, lambda: execute(env, "gather_nd", {"params": inline(_ints((2, 3))), "indices": {"href": href}}),
            400, "href", type_=INVALID)


@pytest.mark.parametrize("name", HOSTILE_NAMES[:-2])
def test_hostile_result_names(env, name):
    inputs = {"x": inline(_ints((1, 2, 2, 4))), "block_size": 2}
    hostile(env, lambda: execute(env, "depth_to_space", inputs, mode="reference", name=name), 400,
            "outputs.result.name", type_=INVALID)


# ---------------------------------------------------------------------------------------------
# 4. operators over HTTP


URL = "/processes/depth_to_space/execution"
JSON = {"Content-Type": "application/json"}


def _post(env: Env, content: bytes, headers: dict | None = None):
    return lambda: env.client.post(URL, content=content, headers=headers or JSON)


@pytest.mark.parametrize("value", ["!!!not base64###", "AAA", "QUJD\nRA==", "QUJD RA==", "====", "\u00e9t\u00e9",
                                   "QUJDRA==" * 3 + "=", ""])
def test_not_base64(env, value):
    inputs = {"x": {"value": value, "encoding": "base64", "mediaType": NPY}, "block_size": 2}
    hostile(env, lambda: execute(env, "depth_to_space", inputs), 400, "'x'", type_=INVALID)


def test_inline_over_the_limit(env):
    x = np.zeros((1, 4, 4, 80), np.float32)  # 5 KiB, over the 4 KiB limit
    hostile(env, lambda: execute(env, "depth_to_space", {"x": inline(x), "block_size": 2}), 413,
            "PUT /arrays/", type_=TOO_LARGE)
    huge = {"value": "A" * (64 * KiB), "encoding": "base64", "mediaType": NPY}
    hostile(env, lambda: execute(env, "depth_to_space", {"x": huge, "block_size": 2}), 413, "/arrays/",
            type_=TOO_LARGE)
    # a whole request body over its limit: with Content-Length refused unread, without at the limit
    got = None

    def send(headers):
        nonlocal got
        got = raw(env, "POST", URL.encode(), headers=headers, body=endless())
        return got.response

    hostile(env, lambda: send({**JSON, "Content-Length": str(GiB)}), 413, str(GiB), type_=TOO_LARGE)
    assert got.consumed == 0
    hostile(env, lambda: send(JSON), 413, "limit", type_=TOO_LARGE)
    assert got.consumed <= 2 * MAX_INLINE + MiB + 64 * KiB


@pytest.mark.parametrize(("content", "needle"), [
    (b"[" * 100_000 + b"]" * 100_000, "json"),
    (b'{"inputs": {"x": ' + b"[" * 100_000 + b"]" * 100_000 + b', "block_size": 2}}', "json"),
    (b'{"inputs": ' + b'{"a": ' * 100_000 + b"1" + b"}" * 100_000 + b"}", "json"),
    (b'{"inputs": {"x": ' + b"[" * 100_000, "json"),
    (b"[1, 2]", "execute request"),
    (b'"a string"', "execute request"),
    (b"null", "execute request"),
    (b"42", "execute request"),
    (b"true", "execute request"),
    (b"", "json"),
    (b"{not json", "json"),
    (b"\xff\xfe\x00\x00", "json"),
    (b'{"inputs": []}', "inputs"),
    (b'{"inputs": null}', "inputs"),
    (b'{"inputs": {"x": 1}, "response": {"a": 1}}', "response"),
    (b'{"inputs": {}, "outputs": []}', "outputs"),
    (b'{"inputs": {}, "outputs": {"result": "x"}}', "outputs"),
    (b'{"inputs": {}, "outputs": {"result": {"transmissionMode": ["value"]}}}', "transmissionMode"),
])
def test_bad_json_bodies(env, content, needle):
    hostile(env, _post(env, content), 400, needle, type_=INVALID)


def test_deep_but_parsable_parameters(env):
    # Deep enough to parse, deep enough to break a recursive validator.
    x = inline(_ints((1, 4, 4, 1), np.float32))
    for depth in (100, 900):
        paddings = "[" * depth + "]" * depth
        content = ('{"inputs": {"x": %s, "block_size": 2, "paddings": %s}}' % (json.dumps(x), paddings)).encode()
        hostile(env, lambda: env.client.post("/processes/space_to_batch/execution", content=content, headers=JSON),
                400, "paddings", type_=INVALID)
        content = ('{"inputs": {"x": %s, "block_size": %s}}' % (json.dumps(x), paddings)).encode()
        hostile(env, _post(env, content), 400, "block_size", type_=INVALID)


X = _ints((1, 2, 2, 8), np.float32)
Y = _ints((1, 4, 4, 1), np.float32)
KEYWORD_CASES = [
    # (process, JSON text of the keyword inputs, the ops call with the same values)
    ("depth_to_space", '"block_size": "2"', lambda: ops.depth_to_space(X, "2")),
    ("depth_to_space", '"block_size": {"a": 1}', lambda: ops.depth_to_space(X, {"a": 1})),
    ("depth_to_space", '"block_size": [2]', lambda: ops.depth_to_space(X, [2])),
    ("depth_to_space", '"block_size": null', lambda: ops.depth_to_space(X, None)),
    ("depth_to_space", f'"block_size": {2**70}', lambda: ops.depth_to_space(X, 2**70)),
    ("depth_to_space", f'"block_size": -{2**70}', lambda: ops.depth_to_space(X, -2**70)),
    ("depth_to_space", '"block_size": 1' + "0" * 4000, lambda: ops.depth_to_space(X, 10**4000)),
    ("depth_to_space", '"block_size": 1e308', lambda: ops.depth_to_space(X, 1e308)),
    ("depth_to_space", '"block_size": 2.0', lambda: ops.depth_to_space(X, 2.0)),
    ("depth_to_space", '"block_size": NaN', lambda: ops.depth_to_space(X, float("nan"))),
    ("depth_to_space", '"block_size": Infinity', lambda: ops.depth_to_space(X, float("inf"))),
    ("depth_to_space", '"block_size": -Infinity', lambda: ops.depth_to_space(X, float("-inf"))),
    ("depth_to_space", '"block_size": 2, "data_format": 7', lambda: ops.depth_to_space(X, 2, data_format=7)),
    ("depth_to_space", '"block_size": 2, "mode": {"x": "DCR"}',
     lambda: ops.depth_to_space(X, 2, mode={"x": "DCR"})),
    ("space_to_batch", '"block_size": 2, "paddings": {"a": 1}', lambda: ops.space_to_batch(Y, 2, {"a": 1})),
    ("space_to_batch", '"block_size": 2, "paddings": "[[0, 0], [0, 0]]"',
     lambda: ops.space_to_batch(Y, 2, "[[0, 0], [0, 0]]")),
    ("space_to_batch", f'"block_size": 2, "paddings": [[{2**70}, 0], [0, 0]]',
     lambda: ops.space_to_batch(Y, 2, [[2**70, 0], [0, 0]])),
    ("space_to_batch", '"block_size": 2, "paddings": [[1e308, 0], [0, 0]]',
     lambda: ops.space_to_batch(Y, 2, [[1e308, 0], [0, 0]])),
    ("space_to_batch", '"block_size": 2, "paddings": [[NaN, 0], [0, 0]]',
     lambda: ops.space_to_batch(Y, 2, [[float("nan"), 0], [0, 0]])),
    ("space_to_batch", f'"block_size": 2, "paddings": [[{2**62}, {2**62}], [0, 0]]',
     lambda: ops.space_to_batch(Y, 2, [[2**62, 2**62], [0, 0]])),
    ("space_to_batch_nd", f'"block_shape": [{2**31}, {2**31}], "paddings": [[0, 0], [0, 0]]',
     lambda: ops.space_to_batch_nd(Y, [2**31, 2**31], [[0, 0], [0, 0]])),
    ("space_to_batch_nd", '"block_shape": [[[[2]]]], "paddings": [[0, 0]]',
     lambda: ops.space_to_batch_nd(Y, [[[[2]]]], [[0, 0]])),
]


@pytest.mark.parametrize(("process", "keywords", "call"), KEYWORD_CASES,
                         ids=[f"{c[0]}-{c[1][:40]}" for c in KEYWORD_CASES])
def test_keyword_parameters_of_wrong_types(env, process, keywords, call):
    message = ops_message(call)
    x = inline(Y if process.startswith("space_to_batch") else X)
    content = f'{{"inputs": {{"x": {json.dumps(x)}, {keywords}}}}}'.encode()
    hostile(env, lambda: env.client.post(f"/processes/{process}/execution", content=content, headers=JSON),
            400, type_=INVALID, detail=message)


# ---------------------------------------------------------------------------------------------
# 5. unknown ids, dismiss, arrays in use


def test_unknown_ids(env):
    for job in ("no-such-job", "x" * 5000, "%00", "' OR 1=1 --"):
        for method, suffix in (("GET", ""), ("GET", "/results"), ("DELETE", "")):
            hostile(env, lambda: env.client.request(method, f"/jobs/{quote(job, safe='')}{suffix}"), 404,
                    type_=NO_SUCH_JOB)
    for process in ("no-such-process", "__init__", "registry", "apply", "depth_to_space ", "DEPTH_TO_SPACE"):
        hostile(env, lambda: env.client.get(f"/processes/{quote(process, safe='')}"), 404, repr(process),
                type_=NO_SUCH_PROCESS)
        hostile(env, lambda: env.client.post(f"/processes/{quote(process, safe='')}/execution", json={"inputs": {}}),
                404, type_=NO_SUCH_PROCESS)
    for method, suffix in (("GET", "/info"), ("GET", ""), ("GET", "/zarr/zarr.json"), ("DELETE", "")):
        hostile(env, lambda: env.client.request(method, f"/arrays/no-such-array{suffix}"), 404, "no-such-array",
                type_=NO_SUCH_ARRAY)
    hostile(env, lambda: execute(env, "depth_to_space", {"x": {"href": "/arrays/no-such-array"}, "block_size": 2}),
            404, "no-such-array", type_=NO_SUCH_ARRAY)


def test_dismiss_twice(env):
    put(env, "dismiss-in", _ints((4, 8, 8, 4)))
    response = execute(env, "space_to_depth", {"x": {"href": "/arrays/dismiss-in"}, "block_size": 2},
                       mode="reference", name="dismiss-out", headers={"Prefer": "respond-async"})
    assert response.status_code == 201, response.text
    job = response.json()["jobID"]
    for _ in range(2):
        again = env.client.delete(f"/jobs/{job}")
        assert again.status_code == 200, again.text
        assert again.json()["status"] == "dismissed" and again.json()["jobID"] == job
    assert env.client.get(f"/jobs/{job}").json()["status"] == "dismissed"
    # nothing left behind: no result, and tmp/ empties once the job's thread has stopped
    deadline = time.monotonic() + 20
    while list(env.tmp.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert list(env.tmp.iterdir()) == []
    assert env.client.get("/arrays/dismiss-out/info").status_code == 404
    assert env.client.delete("/arrays/dismiss-in").status_code == 204


def test_delete_an_array_a_running_job_reads(env):
    put(env, "busy-in", _ints((2, 2)))
    records = env.client.app.state.services.records
    job = uuid.uuid4().hex
    records.create(job, "depth_to_space", ["busy-in"], "busy-out", "reference", status="running")
    try:
        hostile(env, lambda: env.client.delete("/arrays/busy-in"), 409, job)
        hostile(env, lambda: env.client.put("/arrays/busy-in", content=npy_bytes(_ints((3,))),
                                            headers={"Content-Type": NPY}, params={"overwrite": "true"}), 409, job)
        hostile(env, lambda: env.client.put("/arrays/busy-out", content=npy_bytes(_ints((3,))),
                                            headers={"Content-Type": NPY}), 409, job)
        assert env.client.get("/arrays/busy-in/info").status_code == 200
    finally:
        records.finish(job, "failed", "test over")
    assert env.client.delete("/arrays/busy-in").status_code == 204


def test_chunks_that_would_make_millions_of_files_are_refused(client, service_root):
    """?chunks=1,1 on a 2000 x 1000 array would write 2,000,000 chunk files: 400, nothing stored."""
    before = sorted(p.name for p in (service_root / "arrays").iterdir())
    response = client.put("/arrays/many-chunks?chunks=1,1", content=npy_bytes(np.zeros((2000, 1000), np.uint8)),
                          headers={"Content-Type": "application/x-npy"})
    assert response.status_code == 400
    detail = response.json()["detail"]
    assert "?chunks=: chunks [1, 1] cut shape [2000, 1000] into 2000000 chunks" in detail, detail
    assert "max_chunks" in detail, detail
    assert sorted(p.name for p in (service_root / "arrays").iterdir()) == before
    assert client.put("/arrays/many-chunks?chunks=20,1000", content=npy_bytes(np.zeros((2000, 1000), np.uint8)),
                      headers={"Content-Type": "application/x-npy"}).status_code == 201
    assert client.delete("/arrays/many-chunks").status_code == 204
