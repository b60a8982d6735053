"""The command line end to end (run by hand, not a test): ``python -m bench.cli_end_to_end``.

Starts the cluster of ``bench.out_of_core`` (a ``dask scheduler`` and two ``dask worker
--nthreads 1 --memory-limit 384MiB`` on 127.0.0.1), writes a float32 Zarr v3 group with one
variable ``x`` of [4, 3072, 1024, 64] (3 GiB) in chunks [1, 256, 512, 64] (and, for
AscendDequant, an int32 group ``src`` of the same size), generated on the cluster, and then
times, each as a whole process (wall clock from spawn to exit, on the same cluster):

- **copy**: ``da.from_zarr(input) -> da.store`` into a new Zarr array with the same chunks and
  codec, on a distributed ``Client`` to the scheduler (half its runs before the operators, half
  after; twice at least);
- **library**: the same process with ``ops.<op>`` between the two, stored as
  ``bench.out_of_core`` stores (``da.store`` under ``ops.fusing_stores``), with a scratch
  store beside the output as the command line has (``ops.scratch``);
- **cli**: ``chunked-tensor-ops run OP --input ... --variable ... --output ... --param ...
  --scheduler tcp://127.0.0.1:PORT --quiet``;
- **cli with bar** (``--progress``): the same without ``--quiet``, its progress bar counted by a
  tracker on the scheduler.

Each case keeps the best of ``--repeat`` runs (default 2), library and command line taking
turns. Reported: the times, copy / case (1.0x: as fast as the copy) and library / cli (1.0x:
the command line adds nothing), the CPU seconds the scheduler process spent during the run
(the least of the runs: what the client's way of submitting and waiting costs the scheduler,
on cores the workers need), the tasks each graph hands the scheduler after Dask's optimization (counted in this process on
the same inputs: the library's store graph, and the command line's as ``--dry-run`` counts it),
and the workers' highest RSS over a case's runs and how many times their nannies restarted
them (a worker killed for its memory comes back and the run goes on, slower).
The table is printed and recorded in bench/RESULTS.md (``--no-record``: printed only).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

from bench.common import Processes, cpu_seconds, machine, record_section
from bench.out_of_core import CODEC, SEED, Cluster, _float_block, _int_block, _top

ROOT = Path(__file__).resolve().parent.parent
GiB = 2**30
CLI = [sys.executable, "-m", "service", "run"]  # the console script's code, under this venv's Python

#: The float32 input [N, H, W, C] and its chunks; the int32 one [rows, 4096] as many bytes.
X_SHAPE, X_CHUNKS = (4, 3072, 1024, 64), (1, 256, 512, 64)
X_DIMS = ("n", "h", "w", "c")
SRC_SHAPE, SRC_CHUNKS = (196608, 4096), (2048, 4096)
SRC_DIMS = ("row", "column")


def deq_scale() -> list[float]:
    """AscendDequant's per-column float32 scale, as the JSON the command line takes."""
    rng = np.random.default_rng(SEED)
    return [float(v) for v in rng.uniform(0.001, 0.01, SRC_SHAPE[1]).astype(np.float32)]


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    label: str
    op: str           # registry name; "copy" is the plain copy
    params: dict
    source: str = "x"  # which input group

    def library_call(self) -> str:
        """The Python expression the library process applies to ``x`` (a dask array)."""
        if self.op == "copy":
            return "x"
        if self.op == "ascend_dequant":
            return ("ops.ascend_dequant(x, ops.pack_deq_scale(np.asarray(json.loads(os.environ['SCALE']), "
                    "np.float32)), dst_dtype='float16')")
        args = ", ".join(f"{k}={v!r}" for k, v in self.params.items())
        return f"ops.{self.op}(x, {args})"


NO_PAD, PAD = [[0, 0], [0, 0]], [[1, 1], [1, 1]]
CASES = {c.name: c for c in (
    Case("copy", "Zarr copy (float32)", "copy", {}),
    Case("depth_to_space", "DepthToSpace bs=2", "depth_to_space", {"block_size": 2}),
    Case("space_to_depth", "SpaceToDepth bs=2", "space_to_depth", {"block_size": 2}),
    Case("space_to_batch_nd", "SpaceToBatchND [2,2]", "space_to_batch_nd", {"block_shape": [2, 2], "paddings": NO_PAD}),
    Case("space_to_batch_nd_padded", "SpaceToBatchND [2,2] pad 1", "space_to_batch_nd",
         {"block_shape": [2, 2], "paddings": PAD}),
    Case("batch_to_space_nd", "BatchToSpaceND [2,2]", "batch_to_space_nd", {"block_shape": [2, 2], "crops": NO_PAD}),
    Case("batch_to_space_nd_cropped", "BatchToSpaceND [2,2] crop 1", "batch_to_space_nd",
         {"block_shape": [2, 2], "crops": PAD}),
    Case("copy_int32", "Zarr copy (int32)", "copy", {}, source="src"),
    Case("ascend_dequant", "AscendDequant f16, f32 scale", "ascend_dequant", {"dst_dtype": "float16"}, source="src"),
)}
COPIES = {"x": "copy", "src": "copy_int32"}

#: The library process (and the copy): Zarr -> op -> Zarr with Dask on the scheduler, as
#: bench.out_of_core runs it. argv: scheduler, input group, variable, output array.
LIBRARY = """
import json, os, shutil, sys
import numpy as np, dask.array as da, zarr
from distributed import Client, futures_of, wait
import ops
from ops._chunks import zarr_regular
from zarr.codecs import ZstdCodec
address, source, variable, target = sys.argv[1:5]
client = Client(address)
x = da.from_zarr(zarr.open_array(source, path=variable, mode="r"))
scratch = target.rstrip("/") + ".scratch"  # as the command line's: beside the output
with ops.scratch(scratch):
    result = {call}
if not all(map(zarr_regular, result.chunks)):  # Zarr needs equal chunks: as bench.out_of_core's pipeline
    result = result.rechunk(tuple(max(c) for c in result.chunks))
z = zarr.create_array(target, shape=result.shape, chunks=tuple(c[0] for c in result.chunks), dtype=result.dtype,
                      compressors=ZstdCodec(level=0), zarr_format=3, fill_value=0, overwrite=True)
with ops.fusing_stores():
    futures = futures_of(client.persist(da.store(result, z, lock=False, compute=False)))
wait(futures)
client.gather(futures)
client.close()
shutil.rmtree(scratch, ignore_errors=True)
"""


def cli_argv(case: Case, address: str, source: Path, target: Path, quiet: bool = True) -> list[str]:
    params = dict(case.params)
    if case.op == "ascend_dequant":
        params["deq_scale"] = deq_scale()
    argv = [*CLI, case.op, "--input", str(source), "--variable", case.source, "--output", str(target)]
    for name, value in params.items():
        argv += ["--param", f"{name}={json.dumps(value, separators=(',', ':'))}"]
    return argv + ["--scheduler", address, *(["--quiet"] if quiet else [])]


def library_argv(case: Case, address: str, source: Path, target: Path) -> list[str]:
    code = LIBRARY.replace("{call}", case.library_call())
    return [sys.executable, "-c", code, address, str(source), case.source, str(target)]


def timed(argv: list[str], procs: Processes, env: dict | None = None) -> tuple[float, float]:
    """(seconds from spawn to exit of ``argv``, CPU seconds the scheduler spent meanwhile); a
    failure raises."""
    os.sync()  # the previous run's dirty pages are not this run's work
    before = cpu_seconds(procs).get("scheduler", 0.0)
    started = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, env={**os.environ, **(env or {})})
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{argv[:6]} exited with {done.returncode}:\n{done.stderr[-3000:]}")
    return seconds, cpu_seconds(procs).get("scheduler", 0.0) - before


# --- inputs ------------------------------------------------------------------------------------


def write_group(cluster: Cluster, path: Path, variable: str, shape, chunks, dims, dtype) -> None:
    """A Zarr v3 group with one variable, its blocks generated and written on the cluster."""
    import dask.array as da
    import xarray as xr

    block = _float_block if np.dtype(dtype) == np.float32 else _int_block
    data = da.map_blocks(block, chunks=da.core.normalize_chunks(chunks, shape), dtype=dtype)
    ds = xr.Dataset({variable: (dims, data)})
    with warnings.catch_warnings():  # consolidated metadata in v3: what the command line reads first
        warnings.filterwarnings("ignore", message="Consolidated metadata is currently not part")
        delayed = ds.to_zarr(path, zarr_format=3, consolidated=True, compute=False, mode="w",
                             encoding={variable: {"chunks": chunks, "compressors": [CODEC]}})
    cluster.client.compute(delayed).result()


# --- task counts -------------------------------------------------------------------------------


def library_tasks(case: Case, source: Path, work: Path) -> int:
    """Tasks the library's store graph hands the scheduler (optimized under ``fusing_stores``)."""
    import dask.array as da
    import zarr

    import ops
    from ops._chunks import zarr_regular
    from service.cli.run import _scheduled_tasks

    env = {"SCALE": json.dumps(deq_scale())}
    x = da.from_zarr(zarr.open_array(source, path=case.source, mode="r"))
    os.environ.update(env)
    with ops.scratch(work / "count.scratch"):  # as the library process builds it (nothing is written)
        result = eval(case.library_call(), {"ops": ops, "np": np, "json": json, "os": os, "x": x})
    if not all(map(zarr_regular, result.chunks)):
        result = result.rechunk(tuple(max(c) for c in result.chunks))
    z = zarr.create_array(zarr.storage.MemoryStore(), shape=result.shape,
                          chunks=tuple(c[0] for c in result.chunks), dtype=result.dtype, zarr_format=3)
    with ops.fusing_stores():
        return _scheduled_tasks(da.store(result, z, lock=False, compute=False))


def cli_tasks(case: Case, source: Path, work: Path) -> int | None:
    """Tasks ``--dry-run`` counts for the command line's graph."""
    argv = cli_argv(case, "tcp://127.0.0.1:1", source, work / "dry-run.zarr")
    argv = [a for a in argv if a != "--quiet"][:-2] + ["--dry-run"]
    out = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True).stdout
    line = next((line for line in out.splitlines() if line.startswith("tasks: ")), "")
    return int(line.split()[1]) if line.split()[1:2] and line.split()[1].isdigit() else None


# --- the run -------------------------------------------------------------------------------------


def shapes(gib: float) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(x's shape, src's shape) for inputs of about ``gib`` GiB (whole chunks along H and rows)."""
    scale = gib / 3
    height = max(1, round(X_SHAPE[1] * scale / X_CHUNKS[1])) * X_CHUNKS[1]
    rows = max(1, round(SRC_SHAPE[0] * scale / SRC_CHUNKS[0])) * SRC_CHUNKS[0]
    return (X_SHAPE[0], height, *X_SHAPE[2:]), (rows, SRC_SHAPE[1])


def measure(names: list[str], repeat: int, gib: float = 3.0, progress: bool = False, log=print) -> list[dict]:
    """One row per case: the copy of its input, then the case by the library and the command
    line (``progress``: and by the command line with its progress bar, without ``--quiet``)."""
    x_shape, src_shape = shapes(gib)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-cli-", dir=os.environ.get("BENCH_TMP")) as tmp:
        work = Path(tmp)
        procs = Processes(work)
        cluster = None
        try:
            cluster = Cluster(procs, work)
            sources = {CASES[n].source for n in names}
            paths = {"x": work / "x.zarr", "src": work / "src.zarr"}
            started = time.perf_counter()
            if "x" in sources:
                write_group(cluster, paths["x"], "x", x_shape, X_CHUNKS, X_DIMS, np.float32)
            if "src" in sources:
                write_group(cluster, paths["src"], "src", src_shape, SRC_CHUNKS, SRC_DIMS, np.int32)
            log(f"inputs written in {time.perf_counter() - started:.1f} s")
            # Fresh workers: writing the inputs leaves them near their memory limit for a while,
            # which slowed whatever ran first.
            cluster.client.restart(timeout=120)
            cluster.restarts()  # that restart is not a run's
            env = {"SCALE": json.dumps(deq_scale())}
            out = work / "out.zarr"

            def run(kind: str, argv: list[str], row: dict) -> None:
                since = cluster.reset_peaks()
                seconds, scheduler = timed(argv, procs, env)
                shutil.rmtree(out, ignore_errors=True)
                row[kind].append(seconds)
                row[f"{kind}_scheduler"] = min(row.get(f"{kind}_scheduler", scheduler), scheduler)
                # A worker killed for its memory is restarted by its nanny and the run still
                # succeeds, slower: each run's restarts and the workers' highest RSS are shown.
                row["peak"] = max(row.get("peak", 0), _top({"peaks": cluster.peaks(since)}))
                restarts = cluster.restarts()
                row["restarts"] = row.get("restarts", 0) + len(restarts)
                if restarts:
                    log(f"{row['name']} ({kind}): {'; '.join(restarts)}")

            copies = {}

            def run_copies() -> None:
                # Half the copy runs before the operators and half after, so that a drift of
                # the machine over the run weighs on the yardstick too.
                for source in sorted(sources):
                    case = CASES[COPIES[source]]
                    row = copies.setdefault(source, {"name": case.name, "label": case.label, "copy": [],
                                                     "library": None, "cli": None})
                    for _ in range(max(1, repeat // 2)):
                        run("copy", library_argv(case, cluster.address, paths[source], out), row)
                    log(f"{case.name}: {', '.join(f'{s:.1f}' for s in row['copy'])} s")

            run_copies()
            cases = []
            for name in names:
                case = CASES[name]
                row = {"name": name, "label": case.label, "copy": copies[case.source]["copy"], "library": [],
                       "cli": [], **({"cli_progress": []} if progress else {})}
                for _ in range(repeat):
                    run("library", library_argv(case, cluster.address, paths[case.source], out), row)
                    run("cli", cli_argv(case, cluster.address, paths[case.source], out), row)
                    if progress:
                        run("cli_progress", cli_argv(case, cluster.address, paths[case.source], out, quiet=False),
                            row)
                procs.check()
                row["tasks_library"] = library_tasks(case, paths[case.source], work)
                row["tasks_cli"] = cli_tasks(case, paths[case.source], work)
                log(f"{name}: library {', '.join(f'{s:.1f}' for s in row['library'])} s, "
                    f"cli {', '.join(f'{s:.1f}' for s in row['cli'])} s, "
                    f"{'cli with bar ' + ', '.join(f'{s:.1f}' for s in row['cli_progress']) + ' s, ' if progress else ''}"
                    f"scheduler CPU "
                    f"{row['library_scheduler']:.2f} / {row['cli_scheduler']:.2f} s"
                    f"{' / %.2f s' % row['cli_progress_scheduler'] if progress else ''}, "
                    f"tasks {row['tasks_library']} / {row['tasks_cli']}")
                cases.append(row)
            run_copies()
            rows = [*copies.values(), *cases]
        finally:
            if cluster:
                cluster.close()
            procs.stop()
    return rows


def table(rows: list[dict]) -> str:
    """The Markdown table; with the columns of the command line with its bar when it was run."""
    bar = any("cli_progress" in r for r in rows)
    head = ("| run | copy | library | cli | copy / library | copy / cli | library / cli "
            + ("| cli with bar | library / cli with bar " if bar else "")
            + f"| scheduler CPU s: library / cli{' / cli with bar' if bar else ''} | tasks: library / cli "
            + "| worker peak RSS (MiB) | worker restarts |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]

    def times(values):
        return ", ".join(f"{s:.1f}" for s in values) + " s" if values else "-"

    for r in rows:
        if r["library"] is None:
            lines.append(f"| {r['label']} | {times(r['copy'])} |" + " - |" * (head.count("|") - 5)
                         + f" {r['peak'] / 2**20:.0f} | {r['restarts']} |")
            continue
        copy, lib, cli = min(r["copy"]), min(r["library"]), min(r["cli"])
        with_bar = f"| {times(r['cli_progress'])} | {lib / min(r['cli_progress']):.2f}x " if bar else ""
        scheduler = " / ".join(f"{r[k + '_scheduler']:.2f}" for k in ("library", "cli", *(("cli_progress",) if bar else ())))
        lines.append(f"| {r['label']} | {min(r['copy']):.1f} s | {times(r['library'])} | {times(r['cli'])} "
                     f"| {copy / lib:.2f}x | {copy / cli:.2f}x | {lib / cli:.2f}x {with_bar}| {scheduler} "
                     f"| {r['tasks_library']} / {r['tasks_cli']} | {r['peak'] / 2**20:.0f} | {r['restarts']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", nargs="+", default=[n for n in CASES if CASES[n].op != "copy"],
                        choices=[n for n in CASES if CASES[n].op != "copy"])
    parser.add_argument("--repeat", type=int, default=2, help="runs of each case; the fastest counts (2)")
    parser.add_argument("--gib", type=float, default=3.0, help="input size (default 3; smaller for a quick try)")
    parser.add_argument("--progress", action="store_true",
                        help="also run the command line with its progress bar (without --quiet)")
    parser.add_argument("--no-record", action="store_true", help="print only; no RESULTS.md")
    parser.add_argument("--note", default="", help="a sentence on the run (e.g. the machine's load) for RESULTS.md")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error(f"--repeat must be at least 1, got {args.repeat}")
    load = os.getloadavg()[0]
    x_shape, src_shape = shapes(args.gib)
    rows = measure(args.ops, args.repeat, args.gib, args.progress)
    text = table(rows)
    print(text)
    if not args.no_record:
        record_section("bench.cli_end_to_end", (
            f"{machine().strip()}. Load average {load:.2f} at the start. {args.note}\n"
            f"Cluster: `dask scheduler` (worker-saturation 1.0) + 2 x `dask worker --nthreads 1 --memory-limit "
            f"384MiB` on 127.0.0.1 (bench.out_of_core's). Inputs on local disk, Zarr v3 groups with zstd level 0: "
            f"`x` float32 {list(x_shape)} chunks {list(X_CHUNKS)} ({np.prod(x_shape) * 4 / GiB:.1f} GiB), "
            f"`src` int32 {list(src_shape)} chunks {list(SRC_CHUNKS)}. Each run is a whole process, timed from "
            f"spawn to exit: *copy*, `da.from_zarr -> da.store` with a `Client` to the scheduler; *library*, the "
            f"same with `ops.<op>` between, stored under `ops.fusing_stores`; *cli*, `chunked-tensor-ops run OP "
            f"--input ... --variable ... --output ... --param ... --scheduler tcp://127.0.0.1:PORT --quiet` (as "
            f"`python -m service run`){'; *cli with bar*, the same without `--quiet` (a progress tracker on the scheduler)' if args.progress else ''}. "
            f"{args.repeat} run(s) of each case, library and command line taking turns; the copies half before the "
            f"operators and half after (2 at least); all times shown, each ratio of the fastest.\n\n{text}\n\n"
            f"*copy / X*: the copy's time over X's (1.0x: X streams as fast as a plain copy of its input; the "
            f"target is 0.85x for the command line). *library / cli*: the library path's time over the command "
            f"line's (1.0x: the command line adds nothing; the target is 0.9x). *tasks*: what each graph hands "
            f"the scheduler after Dask's optimization (the command line's as `--dry-run` counts it). *scheduler CPU*: "
            f"the CPU seconds of the scheduler process during the run (the least over the runs). *Worker peak RSS*: "
            f"the highest of either worker's RSS over all runs of the case (its system monitor's samples and the "
            f"kernel's high-water mark; the nanny kills a worker at 95% of 384 MiB, 365 MiB). *Worker restarts*: "
            f"over all runs of the case (a killed worker is restarted and the run goes on, slower)."
        ))


if __name__ == "__main__":
    main()
