"""``chunked-tensor-ops run``: one operator, Zarr in, Zarr out, on a Dask cluster, no service.

The steps, each failing with its own exit code before the next starts:

1. parameters (``--param NAME=VALUE``, JSON) checked against the operator's ``schemas`` model
   (exit 2, the operator's own message);
2. inputs opened lazily (a bare Zarr array or a variable of a group, a local path or an
   fsspec URL such as ``s3://bucket/in.zarr``; exit 3 if unreadable) and the result's graph
   built through ``ops.registry.apply``, as the service builds it (the operator's rules on
   shapes and dtypes: exit 2); the output checked (exit 3 if taken);
3. the cluster: an embedded ``LocalCluster`` or ``--scheduler`` (exit 4 if unreachable);
4. the result written with ``to_zarr`` by the workers and published whole
   (``service.storage.run_storage``: a renamed sibling directory, or an object store prefix whose root
   metadata is stored last); a failed computation (exit 1) leaves no output.

``--dry-run`` stops after step 2 and prints the plan instead. The flags of step 1 are
``service.cli.flags``, the inputs of step 2 ``service.cli.inputs``, the exit codes
``service.cli.run_errors``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import time
import uuid
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import xarray as xr

from ops import dtypes, registry
from ops._chunks import zarr_chunks
from ops.errors import InvalidArgument
from service.cli.run_errors import CLUSTER, FAILED, INPUT, OK, USAGE, RunError, usage
from ops.accessor.conventions import cf_encoding
from service.cli.flags import check_arguments, in_cli_terms
from service.cli.inputs import Input, open_input
from service.storage import run_storage, variables
from service.storage.run_storage import RunOutput
from service.storage.scratch import configured_scratch, scratch_root

RESULT_VARIABLE = "result"  # the output's variable when the input was a bare array


# --- the plan ---------------------------------------------------------------------------------


@dataclass
class RunPlan:
    """Everything decided before the cluster is involved."""

    call: registry.BoundCall     # the operator's call, its array inputs opened
    inputs: list[Input]
    result: xr.DataArray          # rechunked to the output's Zarr chunks
    output: RunOutput
    variable: str
    scratch: dict | None = None   # GatherNd's intermediate files: {"url", "storage_options"}
    remove_scratch: Callable[[], bool] = lambda: False  # whether anything was there
    overwrite: bool = False       # --overwrite: an existing output is replaced

    @property
    def op(self) -> registry.Operator:
        return self.call.op

    def store_graph(self, target):
        """The Dask graph (a Delayed) that writes the data to ``target``; metadata written now."""
        first = next((i for i in self.inputs if i.role == self.op.array_inputs[0]), None)
        ds, encoding = variables.output_dataset(self.result, self.variable, self.output_chunks,
                                                first.global_attrs if first else None,
                                                first.companions if first else None)
        with warnings.catch_warnings():
            # Consolidated metadata is what xarray opens fastest; zarr's note that v3 has no such
            # thing yet is not the user's business.
            warnings.filterwarnings("ignore", message="Consolidated metadata is currently not part")
            return variables.store_graph(ds, encoding, self.variable, target)

    @property
    def output_chunks(self) -> tuple[int, ...]:
        return tuple(c[0] for c in self.result.chunks) if self.result.ndim else ()


def check_output(output: str, paths: dict[str, str], settings, *, overwrite: bool,
                 dry_run: bool) -> RunOutput:
    """The output (a local path or an fsspec URL): not an input, free (or ``overwrite``), in a
    directory or bucket that exists."""
    try:
        target = run_storage.output_for(output, settings)
        for role, path in paths.items():
            if target.is_input(path, settings):
                raise usage(f"--output {output} is the input {role}; write the result elsewhere")
        missing = target.parent_missing()
        if missing:
            raise RunError(INPUT, f"output {output}: {missing}")
        if not overwrite and not dry_run and target.exists():
            raise RunError(INPUT, f"output {output} exists; pass --overwrite to replace it")
    except RunError:
        raise
    except Exception as error:  # an unreachable endpoint, refused credentials
        raise RunError(INPUT, f"output {output} cannot be written: {type(error).__name__}: {error}") from None
    return target


def build(op_name: str, input_items: list[str], output: str, *, param_items: list[str],
          variable_items: list[str], chunks: str | None, overwrite: bool, output_variable: str | None,
          dry_run: bool, settings=None) -> RunPlan:
    """Check everything, open the inputs and build the lazy result; nothing is computed.
    ``settings`` (``service.settings.Settings``, default from the environment) give the
    storage options of URLs."""
    from service.settings import Settings

    settings = settings or Settings()
    try:
        op = registry.get(op_name)
    except InvalidArgument as error:
        raise usage(str(error)) from None
    call, paths, variables = check_arguments(op, input_items, param_items, variable_items)
    target = check_output(output, paths, settings, overwrite=overwrite, dry_run=dry_run)
    opened = [open_input(role, path, variables.get(role), chunks if role == op.array_inputs[0] else None,
                         settings) for role, path in paths.items()]
    call = call.with_arrays({i.role: i.array for i in opened})
    scratch, remove_scratch = _scratch(target, settings)
    try:
        result = call.run(scratch=scratch)  # the graph, as the service builds it
    except (InvalidArgument, IndexError) as error:  # rules on shapes and dtypes
        raise usage(in_cli_terms(str(error))) from None
    result.encoding = cf_encoding(result)  # the input's packing; its chunks and codecs are not the output's
    if result.ndim:
        # the data only: coordinates keep their own (one chunk), not one file per output block
        result = result.copy(data=result.data.rechunk(zarr_chunks(result.chunks)))
    first = next((i for i in opened if i.role == op.array_inputs[0]), None)
    variable = output_variable or (first.variable if first and first.variable else RESULT_VARIABLE)
    return RunPlan(call, opened, result, target, variable, scratch, remove_scratch, overwrite)


def _scratch(target, settings) -> tuple[dict, Callable[[], bool]]:
    """Where GatherNd's intermediate files go, created only if its plan writes there, and their
    removal: under the ``scratch`` setting (``CHUNKED_TENSOR_OPS_SCRATCH``) as for the service's
    jobs; else on this machine's disk for the embedded cluster, or beside the output, where
    the workers write anyway."""
    root = scratch_root(settings)
    if root is not None:
        location, remove = configured_scratch(*root, "run-")

        def removed() -> bool:
            remove()
            return False  # removed or logged; nothing the run waits for

        return location, removed
    url, options = target.scratch(workers_local=settings.scheduler is None)
    return {"url": url, "storage_options": options}, lambda: target.remove_scratch(url)


def _nbytes(shape, dtype) -> int:
    return math.prod(shape) * np.dtype(dtype).itemsize


def _describe(arr: xr.DataArray) -> str:
    chunks = [c[0] for c in arr.chunks] if arr.chunks else []
    count = math.prod(len(c) for c in arr.chunks) if arr.chunks else 1
    return (f"shape {list(arr.shape)} {dtypes.name(np.dtype(arr.dtype))} dims {list(map(str, arr.dims))} "
            f"chunks {chunks} ({count} chunks) {_nbytes(arr.shape, arr.dtype)} bytes")


def _scheduled_tasks(graph) -> int:
    """The tasks the scheduler runs for ``client.compute(graph)``: the graph optimized, and
    the task that gathers its result (as distributed's ``Client.compute`` makes them)."""
    from dask._expr import FinalizeCompute
    from dask.base import collections_to_expr

    return len(FinalizeCompute(collections_to_expr([graph], True)).optimize().__dask_graph__())


# The output blocks up to which --dry-run counts the tasks of the run's graph.
COUNTED_BLOCKS = 100_000


def describe_plan(plan: RunPlan) -> list[str]:
    """The ``--dry-run`` report: inputs, output, tasks, bytes read and written."""
    import zarr

    blocks = plan.result.data.npartitions if plan.result.chunks else 1
    if blocks <= COUNTED_BLOCKS:
        graph = plan.store_graph(zarr.storage.MemoryStore())  # the very graph a run computes
        tasks = (f"tasks: {_scheduled_tasks(graph)} (after Dask's graph optimization; "
                 f"{len(graph.__dask_graph__())} before)")
    else:
        # Counting means making every task, about a minute per 100,000 blocks in one process:
        # the run itself sends the graph unmade and the scheduler makes it.
        tasks = f"tasks: not counted for {blocks} output blocks (--dry-run counts them up to {COUNTED_BLOCKS})"
    read = 0
    shown = {**plan.call.kwargs, **({"dims": plan.call.dims} if plan.call.dims else {})}
    lines = [f"operator: {plan.op.name} {json.dumps(shown, separators=(',', ':'))}"]
    for i in plan.inputs:
        where = f"{i.path} variable {i.variable}" if i.variable else i.path
        lines.append(f"input {i.role}: {where}: {_describe(i.array)}")
        read += _nbytes(i.array.shape, i.array.dtype)
    taken = (" (exists: the run replaces it)" if plan.overwrite else " (exists: the run needs --overwrite)") \
        if plan.output.exists() else ""
    lines.append(f"output: {plan.output}{taken} variable {plan.variable}: {_describe(plan.result)}")
    lines.append(tasks)
    lines.append(f"bytes read: {read} (every input chunk once, uncompressed)")
    lines.append(f"bytes written: {_nbytes(plan.result.shape, plan.result.dtype)} (uncompressed)")
    return lines


# --- running ----------------------------------------------------------------------------------


@contextlib.contextmanager
def _children_silent(silent: bool):
    """Processes started inside write their stderr nowhere: the embedded cluster's workers,
    which would otherwise print a traceback each when Ctrl-C reaches them (the terminal sends
    it to every process of the foreground group) or when the run ends while they start. The
    run's own one-line errors say what failed; --verbose keeps the workers' output."""
    if not silent:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def connect(settings, *, dashboard: bool = False, silent_workers: bool = False):
    """A ``service.jobs.cluster.Cluster``, started and answering (exit 4 otherwise). The embedded
    cluster gets a dashboard only when asked: it costs the start-up more than a small run;
    ``silent_workers``: its worker processes' stderr goes nowhere (``_children_silent``)."""
    from service.jobs.cluster import Cluster, ClusterUnavailable

    cluster = Cluster(settings, dashboard=dashboard)
    try:
        if cluster.embedded:
            with _children_silent(silent_workers):
                cluster.start()
        cluster.live_client()
    except ClusterUnavailable as error:
        cluster.close()
        raise RunError(CLUSTER, error.full) from None
    except Exception as error:  # e.g. a LocalCluster that cannot start its workers
        cluster.close()
        raise RunError(CLUSTER, f"the Dask cluster could not start: {type(error).__name__}: {error}") from None
    return cluster


class ProgressBar:
    """Finished tasks out of all, from the scheduler's own count (``service.jobs.progress``), on
    stderr: redrawn in place on a terminal, one line per tenth otherwise."""

    WIDTH = 30

    def __init__(self, stream=None, enabled: bool = True):
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = self.stream.isatty()
        self.last = -1
        self.total = 0
        self.started = time.monotonic()

    def show(self, done: int, total: int) -> None:
        if not self.enabled or total <= 0:
            return
        self.total = total
        percent = int(100 * done / total)
        step = percent if self.tty else percent // 10 * 10
        if step == self.last:
            return
        self.last = step
        filled = self.WIDTH * done // total
        text = (f"[{'#' * filled}{' ' * (self.WIDTH - filled)}] {percent:3d}% {done}/{total} tasks "
                f"{time.monotonic() - self.started:.1f} s")
        self.stream.write(("\r" + text) if self.tty else text + "\n")
        self.stream.flush()

    def finish(self) -> None:
        """A successful run: the bar ends on 100% of the last total it was shown, however many
        tasks it last saw finished (the scheduler may finish the rest between two polls)."""
        if self.total > 0:
            self.show(self.total, self.total)

    def close(self) -> None:
        if self.enabled and self.tty and self.last >= 0:
            self.stream.write("\n")
            self.stream.flush()


# Seconds between two checks that the scheduler answers when no progress bar is shown (the end
# of the computation ends the wait at once; a frozen scheduler is found within ``patience``).
QUIET_POLL = 1.0


def _wait(client, future, bar: ProgressBar, patience: float, bound: float):
    """Wait for ``future`` with a progress bar (``service.jobs.runner``, the loop the service's
    jobs wait with too); a scheduler silent for ``patience`` s is lost. Without a bar
    (``--quiet``) nothing tracks the tasks on the scheduler: it only has to answer."""
    from service.jobs.runner import SchedulerSilent, wait_with_progress

    if bar.enabled:
        waiting = {"on_start": lambda total: bar.show(0, total), "on_progress": bar.show}
    else:
        waiting = {"on_progress": None, "poll": min(QUIET_POLL, patience / 3)}
    try:
        wait_with_progress(client, future, tracker=uuid.uuid4().hex, bound=bound, patience=patience, **waiting)
    except SchedulerSilent as silent:  # a frozen scheduler keeps its connection open: only silence tells
        raise RunError(CLUSTER, f"the Dask scheduler has not answered for {patience:.0f} s "
                                f"({type(silent.error).__name__}: {silent.error})") from None
    if future.status == "finished":
        bar.finish()
    if future.status == "error":
        error = future.exception()
        if isinstance(error, (InvalidArgument, IndexError)):  # e.g. an index out of range (GatherNd)
            raise RunError(USAGE, str(error))
        raise RunError(FAILED, f"the computation failed: {type(error).__name__}: {error}")
    if future.status == "cancelled":
        raise RunError(CLUSTER, "the computation was cancelled by the cluster (lost workers or scheduler)")
    return future.result()


def execute(plan: RunPlan, settings, *, overwrite: bool, show_progress: bool, dashboard: bool = False,
            silent_workers: bool = False) -> dict:
    """Compute the plan on the cluster and publish the output. Returns a summary."""
    from distributed.comm.core import CommClosedError

    cluster = connect(settings, dashboard=dashboard, silent_workers=silent_workers)
    started = time.monotonic()
    future = None
    bar = ProgressBar(enabled=show_progress)
    published = False
    try:
        client = cluster.live_client()
        if dashboard and client.dashboard_link:
            print(f"dashboard: {client.dashboard_link}", file=sys.stderr, flush=True)
        graph = plan.store_graph(plan.output.target())
        future = client.compute(graph)
        try:
            _wait(client, future, bar, cluster.patience, settings.scheduler_timeout)
        finally:
            bar.close()
        plan.output.publish(overwrite)
        published = True
    except FileExistsError as error:  # the output appeared while computing
        raise RunError(INPUT, str(error)) from None
    except (CommClosedError, TimeoutError) as error:
        raise RunError(CLUSTER, f"lost the Dask cluster: {type(error).__name__}: {error}") from None
    except OSError as error:  # writing the output's metadata or publishing it
        raise RunError(FAILED, f"{type(error).__name__}: {error}") from None
    finally:
        if future is not None and not future.done():
            try:
                future.cancel(force=True)
            except Exception:
                pass
        cluster.close()  # an embedded cluster's workers stop here: none writes after
        _clean_up(plan, cluster.embedded, published)
    seconds = time.monotonic() - started
    return {"output": str(plan.output), "seconds": seconds,
            "bytes": _nbytes(plan.result.shape, plan.result.dtype)}


def _clean_up(plan: RunPlan, embedded: bool, published: bool) -> None:
    """Remove the scratch and an unpublished output."""
    def remove() -> bool:
        left = not published and plan.output.discard()
        left = plan.remove_scratch() or left
        return left

    if remove() and not embedded:  # a task already on an external worker may still write
        time.sleep(1.0)
        remove()


def run(args, settings) -> int:
    """The ``run`` subcommand: build the plan, then print it (``--dry-run``) or execute it."""
    plan = build(args.op, args.input, args.output, param_items=args.param, variable_items=args.variable,
                 chunks=args.chunks, overwrite=args.overwrite, output_variable=args.output_variable,
                 dry_run=args.dry_run, settings=settings)
    if args.dry_run:
        print("\n".join(describe_plan(plan)))
        return OK
    summary = execute(plan, settings, overwrite=args.overwrite, show_progress=not args.quiet,
                      dashboard=args.dashboard, silent_workers=not args.verbose)
    print(f"wrote {summary['output']} (variable {plan.variable}): {_describe(plan.result)} "
          f"in {summary['seconds']:.1f} s")
    return OK
