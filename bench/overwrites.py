"""Overwrites under readers, the long run (by hand, not a test):
``python -m bench.overwrites [--overwrites 100] [--rows 64] [--readers 2]``.

Starts ``python -m service`` on 127.0.0.1 with its embedded Dask cluster on a temporary data
root, stores an array of ``rows`` x 4096 float32 in chunks of one row (16 KiB each), and
overwrites it ``overwrites`` times with constant arrays of other values while ``readers``
threads download it (NPY) and one thread reads its ``zarr/zarr.json`` and ``info`` in a loop.
Every answer must be 200, every download one of the versions whole (never a mix of two, never
a missing name), every JSON document whole; at the end the last version is what is stored and
the replaced versions are gone from the data root's ``tmp/``. Prints the counts; exits 1 on
any problem. Records nothing in RESULTS.md.

``tests/service/test_data_safety.py`` runs the same (``hammer``), smaller, on an app served in
its own process.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import requests

from bench.common import load_npy, npy_bytes

NPY = "application/x-npy"
HTTP_TIMEOUT = 30
NAME = "hammered"


@dataclass
class Hammered:
    """What the readers saw: every problem, and how many answers of each kind."""

    problems: list[str] = field(default_factory=list)
    seen: dict[str, list] = field(default_factory=lambda: {"npy": [], "zarr.json": [], "info": []})
    final: np.ndarray | None = None

    def counts(self) -> dict[str, int]:
        return {kind: len(answers) for kind, answers in self.seen.items()}


def _put(url: str, body: bytes, overwrite: bool) -> None:
    answer = requests.put(f"{url}/arrays/{NAME}", data=body, headers={"Content-Type": NPY},
                          params={"chunks": "1,-1", **({"overwrite": "true"} if overwrite else {})}, timeout=HTTP_TIMEOUT)
    assert answer.status_code == 201, answer.text


def hammer(url: str, *, rows: int, overwrites: int, readers: int = 2, pause: float = 0.05) -> Hammered:
    """Store ``NAME`` (``rows`` x 4096 float32, a chunk per row), then overwrite it
    ``overwrites`` times while ``readers`` threads download it and one reads its metadata."""
    shape = (rows, 4096)
    values = list(range(1, overwrites + 2))
    _put(url, npy_bytes(np.full(shape, values[0], np.float32)), overwrite=False)
    stop = threading.Event()
    out = Hammered()

    def download():
        with requests.Session() as session:
            while not stop.is_set():
                answer = session.get(f"{url}/arrays/{NAME}", timeout=HTTP_TIMEOUT)
                if answer.status_code != 200:
                    out.problems.append(f"GET /arrays/{NAME}: {answer.status_code} {answer.text[:300]}")
                    continue
                got = load_npy(answer.content)
                if got.shape != shape or got.dtype != np.float32:
                    out.problems.append(f"download of shape {got.shape} {got.dtype}")
                    continue
                first = got.flat[0]
                if not (got == first).all() or first not in values:
                    out.problems.append(f"a mixed download: values {np.unique(got)[:10]}")
                out.seen["npy"].append(float(first))

    def metadata():
        with requests.Session() as session:
            while not stop.is_set():
                for path, kind in (("zarr/zarr.json", "zarr.json"), ("info", "info")):
                    answer = session.get(f"{url}/arrays/{NAME}/{path}", timeout=HTTP_TIMEOUT)
                    if answer.status_code != 200:
                        out.problems.append(f"GET {path}: {answer.status_code} {answer.text[:300]}")
                        continue
                    document = answer.json()  # whole JSON, never a torn file
                    if kind == "info" and document["shape"] != list(shape):
                        out.problems.append(f"info {document}")
                    out.seen[kind].append(1)

    with ThreadPoolExecutor(readers + 1) as pool:
        running = [pool.submit(download) for _ in range(readers)] + [pool.submit(metadata)]
        try:
            for value in values[1:]:
                _put(url, npy_bytes(np.full(shape, value, np.float32)), overwrite=True)
                time.sleep(pause)
        finally:
            stop.set()
            for reader in running:
                reader.result()
    out.final = load_npy(requests.get(f"{url}/arrays/{NAME}", timeout=HTTP_TIMEOUT).content)
    assert (out.final == values[-1]).all(), "the last overwrite is not what is stored"
    return out


def main() -> None:
    from bench.load import start_service, stop_service

    parser = argparse.ArgumentParser(prog="python -m bench.overwrites", description=__doc__.splitlines()[0])
    parser.add_argument("--overwrites", type=int, default=100)
    parser.add_argument("--rows", type=int, default=64, help="rows of 16 KiB, one chunk each")
    parser.add_argument("--readers", type=int, default=2, help="threads downloading the array")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-overwrites-"))
    proc, url = start_service(work)
    try:
        started = time.monotonic()
        out = hammer(url, rows=args.rows, overwrites=args.overwrites, readers=args.readers)
        wall = time.monotonic() - started
        deadline = time.monotonic() + 30
        while any((work / "data" / "tmp").iterdir()) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = sorted(p.name for p in (work / "data" / "tmp").iterdir())
    finally:
        stop_service(proc)
    shutil.rmtree(work, ignore_errors=True)
    distinct = len(set(out.seen["npy"]))
    print(f"{args.overwrites} overwrites of {args.rows} x 4096 float32 in {wall:.1f} s; answers {out.counts()}; "
          f"downloads saw {distinct} versions; problems {len(out.problems)}; left in tmp/ {len(left)}")
    for problem in out.problems[:20]:
        print("  ", problem)
    if out.problems or left or distinct < 2:
        sys.exit(1)


if __name__ == "__main__":
    main()
