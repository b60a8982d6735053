"""Shared by the benchmarks: timing, the memory-copy yardsticks, the machine line and the
processes (Dask scheduler, workers, the service) a benchmark starts on 127.0.0.1."""

from __future__ import annotations

import contextlib
import datetime
import io
import os
import re
import signal
import socket
import subprocess
import platform
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import dask
import numpy as np

CORES = os.cpu_count() or 1
ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "RESULTS.md"
HISTORY = ROOT / "bench" / "history"


def best_seconds(run: Callable[[], object], repeat: int) -> float:
    """The best of ``repeat`` wall-clock times (results are dropped between runs)."""
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        result = run()
        best = min(best, time.perf_counter() - started)
        del result
    return best


def gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9


def parallel_copy(dst: np.ndarray, src: np.ndarray, pool: ThreadPoolExecutor) -> None:
    """np.copyto split into one contiguous slice per core (NumPy releases the GIL)."""
    flat_dst, flat_src = dst.reshape(-1), src.reshape(-1)
    edges = np.linspace(0, flat_src.size, CORES + 1).astype(int)
    list(pool.map(lambda k: np.copyto(flat_dst[edges[k]:edges[k + 1]], flat_src[edges[k]:edges[k + 1]]), range(CORES)))


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    import numba

    return (
        f"machine: {cpu}, {CORES} cores, {memory:.0f} GiB; Python {platform.python_version()}, "
        f"NumPy {np.__version__}, Dask {dask.__version__}, numba {numba.__version__}\n"
    )


def npy_bytes(array: np.ndarray) -> bytes:
    """The array as the bytes of an .npy file."""
    buffer = io.BytesIO()
    np.save(buffer, array, allow_pickle=False)
    return buffer.getvalue()


def load_npy(content: bytes) -> np.ndarray:
    return np.load(io.BytesIO(content), allow_pickle=False)


def cpu_seconds(procs: Processes) -> dict[str, float]:
    """User + system CPU seconds so far of each process ``procs`` started (its children
    included: a Dask worker runs under its nanny), by name."""
    import psutil  # distributed's own dependency

    seconds = {}
    for name, proc in procs.started:
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(proc.pid)
            seconds[name] = sum(sum(p.cpu_times()[:2]) for p in [root, *root.children(recursive=True)])
    return seconds


def stop_process(proc: subprocess.Popen, wait: float = 20.0) -> None:
    """SIGTERM, SIGKILL after ``wait`` seconds, then SIGKILL what is left of its process group
    (a worker or nanny child that outlived it)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(wait)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Processes:
    """The processes this harness starts, each in its own session, stopped by their ids."""

    def __init__(self, logs: Path):
        self.logs = logs
        self.started: list[tuple[str, subprocess.Popen]] = []

    def start(self, name: str, argv: list[str], env: dict | None = None) -> subprocess.Popen:
        log = open(self.logs / f"{name}.log", "wb")
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=ROOT,
                                start_new_session=True, env={**os.environ, **(env or {})})
        log.close()
        self.started.append((name, proc))
        return proc

    def check(self) -> None:
        for name, proc in self.started:
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}:\n{self.tail(name)}")

    def log(self, name: str) -> str:
        path = self.logs / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def tail(self, name: str, lines: int = 30) -> str:
        return "\n".join(self.log(name).splitlines()[-lines:])

    def stop(self) -> None:
        """SIGTERM each, last started first (workers before the scheduler), then SIGKILL leftovers."""
        for _, proc in reversed(self.started):
            stop_process(proc, wait=15)


def wait_until(what: str, ready: Callable[[], object], procs: Processes, timeout: float = 90.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        procs.check()
        with contextlib.suppress(Exception):
            value = ready()
            if value:
                return value
        time.sleep(0.2)
    raise TimeoutError(f"{what} was not ready after {timeout:.0f} s")


def commit() -> str:
    """The checkout's short commit, with "+changes" when its tracked files differ from it.

    What the benchmarks themselves write (this file of results, its history, their plots) is
    not a change of the code measured: a run that plots before it records would otherwise
    always say "+changes".
    """
    own_output = [":(exclude)bench/RESULTS.md", ":(exclude)bench/history", ":(exclude,glob)bench/*.png"]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", ".", *own_output], cwd=ROOT).returncode != 0
    except (OSError, subprocess.CalledProcessError):
        return "not recorded"
    return head + ("+changes" if dirty else "")


def record_section(module: str, body: str, results: Path = RESULTS, history: Path = HISTORY) -> str:
    """Make ``body`` the current section of ``python -m <module>`` in bench/RESULTS.md.

    RESULTS.md keeps one section per benchmark, its latest run; the section it replaces moves,
    unchanged and dated, to the end of this month's file under bench/history/, so that no
    recorded run is lost. Returns the new section's text.
    """
    today = datetime.date.today()
    heading = f"## `python -m {module}`"
    body = body.strip()
    section = f"{heading}\n\nLatest run: {today.isoformat()}, code at {commit()}. {body[:1].upper()}{body[1:]}\n"
    text = results.read_text()
    match = re.search(rf"^{re.escape(heading)}[^\n]*\n.*?(?=^## |\Z)", text, flags=re.M | re.S)
    if match is None:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        old = match.group(0).rstrip("\n") + "\n"
        archive = history / f"RESULTS-{today:%Y-%m}.md"
        history.mkdir(exist_ok=True)
        if not archive.exists():
            archive.write_text("> Earlier runs of the benchmarks, moved here from bench/RESULTS.md when a newer run "
                               "replaced them; the current numbers are in [bench/RESULTS.md](../RESULTS.md).\n")
        moved = old.replace(heading, f"{heading} (replaced on {today.isoformat()})", 1)
        with open(archive, "a") as f:
            f.write("\n" + moved)
        text = text[: match.start()] + section + ("\n" if text[match.end():] else "") + text[match.end():]
    results.write_text(text)
    return section
