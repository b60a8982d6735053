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

``--dry-run`` stops after step 2 and prints the plan instead.
"""

from __future__ import annotations

import json
import math
import sys
import time
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import xarray as xr

import ops
from ops import _validate, dtypes, registry
from ops._chunks import zarr_chunks
from ops.errors import InvalidArgument
from service.storage import run_storage
from service.storage.run_storage import LocalOutput, ObjectOutput

# Exit codes (documented in docs/cli.md and the --help epilog).
OK, FAILED, USAGE, INPUT, CLUSTER = 0, 1, 2, 3, 4
RESULT_VARIABLE = "result"  # the output's variable when the input was a bare array


class RunError(Exception):
    """A failure with its exit code and a one-line message for stderr."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


def usage(message: str) -> RunError:
    return RunError(USAGE, message)


# --- command-line values --------------------------------------------------------------------


def parse_value(text: str):
    """A ``--param`` value: JSON (``2``, ``[[1,1],[0,0]]``, ``true``, ``"DCR"``), or the text
    itself when it is not JSON (``DCR``, ``float16``)."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def parse_params(items: list[str]) -> dict[str, object]:
    """``["block_size=2", "mode=DCR"]`` -> ``{"block_size": 2, "mode": "DCR"}``."""
    params: dict[str, object] = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or not name:
            raise usage(f"--param must be NAME=VALUE (VALUE as JSON), got {item!r}")
        if name in params:
            raise usage(f"--param {name} is given twice")
        params[name] = parse_value(text)
    return params


def parse_inputs(items: list[str], op: registry.Operator) -> dict[str, str]:
    """``--input PATH`` (the operator's first array input) or ``--input ROLE=PATH``."""
    inputs: dict[str, str] = {}
    for item in items:
        role, sep, path = item.partition("=")
        if not (sep and role in op.array_inputs):
            role, path = op.array_inputs[0], item
        if role in inputs:
            raise usage(f"--input {role} is given twice; {op.name} takes the array inputs "
                        f"{', '.join(op.array_inputs)} (--input ROLE=PATH)")
        if not path:
            raise usage(f"--input {role} needs a path, got {item!r}")
        inputs[role] = path
    return inputs


def parse_variables(items: list[str], op: registry.Operator) -> dict[str, str]:
    """``--variable NAME`` (the first array input) or ``--variable ROLE=NAME``."""
    variables: dict[str, str] = {}
    for item in items:
        role, sep, name = item.partition("=")
        if not (sep and role in op.array_inputs):
            role, name = op.array_inputs[0], item
        variables[role] = name
    return variables


def parse_chunks(text: str | None, dims: tuple[str, ...]) -> dict | None:
    """``--chunks``: ``1,64,64,16`` (one length per axis, -1 for a whole axis), ``y=64,x=64``
    (by dim name; other axes keep the stored chunks) or ``auto``. None: the stored chunks."""
    if text is None:
        return None
    if text == "auto":
        return {d: "auto" for d in dims}
    parts = [p.strip() for p in text.split(",")]
    try:
        if all("=" in p for p in parts):
            chunks = {name: int(n) for name, n in (p.split("=", 1) for p in parts)}
            unknown = [d for d in chunks if d not in dims]
            if unknown:
                raise usage(f"--chunks names the dim {unknown[0]!r}, which the input does not have; "
                            f"its dims are {list(dims)}; got {text!r}")
        else:
            lengths = [int(p) for p in parts]
            if len(lengths) != len(dims):
                raise usage(f"--chunks must give one length per axis ({len(dims)}), got {text!r}")
            chunks = dict(zip(dims, lengths))
    except ValueError:
        raise usage(f"--chunks must be comma-separated integers, NAME=INTEGER pairs or auto, got {text!r}") \
            from None
    bad = [n for n in chunks.values() if n < 1 and n != -1]
    if bad:
        raise usage(f"--chunks lengths must be >= 1 (or -1 for a whole axis), got {text!r}")
    return chunks


# --- inputs -----------------------------------------------------------------------------------


@dataclass
class Input:
    """An opened input: where it came from and the lazy array the graph reads."""

    role: str
    path: str
    variable: str | None  # None: a bare Zarr array
    array: xr.DataArray


def _zarr_source(path: str, settings):
    """What Zarr and xarray read for ``path``: the path, or a read-only store on a URL."""
    if not run_storage.is_url(path):
        if not Path(path).exists():
            raise RunError(INPUT, f"input {path}: no such file or directory")
        return path
    try:
        found = run_storage.url_exists(path, settings)
    except Exception as error:  # an unreachable endpoint, refused credentials, a missing bucket
        raise RunError(INPUT, f"input {path} cannot be read: {type(error).__name__}: {error}") from None
    if not found:
        raise RunError(INPUT, f"input {path}: nothing is stored there")
    return run_storage.read_store(path, settings)


def _zarr_node(path: str, source):
    import zarr

    try:
        return zarr.open(source, mode="r")
    except Exception as error:  # not Zarr, a v2/v3 metadata error, permissions...
        raise RunError(INPUT, f"input {path} is not a readable Zarr array or group: "
                              f"{type(error).__name__}: {error}") from None


def _bare_array(node, chunks_text: str | None) -> xr.DataArray:
    """A Zarr array as a Dask-backed DataArray; dims from Zarr v3 ``dimension_names`` or
    xarray's v2 ``_ARRAY_DIMENSIONS`` (else xarray's dim_0, dim_1, ...)."""
    import dask.array as da

    attrs = dict(node.attrs)
    names = getattr(node.metadata, "dimension_names", None) or attrs.pop("_ARRAY_DIMENSIONS", None)
    attrs.pop("_ARRAY_DIMENSIONS", None)
    dims = tuple(str(n) for n in names) if names and all(names) else tuple(f"dim_{k}" for k in range(node.ndim))
    chunks = parse_chunks(chunks_text, dims)
    lazy = da.from_zarr(node, chunks=tuple(chunks.get(d, c) for d, c in zip(dims, node.chunks)) if chunks
                        else node.chunks)
    return xr.DataArray(lazy, dims=dims, attrs=attrs)


def _open_dataset(path, chunks) -> xr.Dataset:
    """The group as xarray reads it, values as stored (no masking, scaling or time decoding)."""
    with warnings.catch_warnings():  # a group without consolidated metadata is read all the same
        warnings.filterwarnings("ignore", message="Failed to open Zarr store with consolidated metadata")
        return xr.open_zarr(path, chunks=chunks, mask_and_scale=False, decode_times=False,
                            decode_timedelta=False)


def _group_variable(path: str, source, node, variable: str | None,
                    chunks_text: str | None) -> tuple[str, xr.DataArray]:
    """A variable of a group, opened with xarray (coordinates kept) when xarray can read it."""
    try:
        ds = _open_dataset(source, chunks={})
    except Exception:  # e.g. Zarr v2 arrays without _ARRAY_DIMENSIONS: read them as bare arrays
        ds = None
    candidates = list(ds.data_vars) if ds is not None else [k for k, _ in node.arrays()]
    if variable is None:
        if len(candidates) != 1:
            raise usage(f"input {path} is a group with {len(candidates)} variables "
                        f"({', '.join(map(str, candidates)) or 'none'}); pick one with --variable NAME")
        variable = str(candidates[0])
    elif variable not in candidates and not (ds is not None and variable in ds.variables):
        raise RunError(INPUT, f"input {path} has no variable {variable!r}; its variables are "
                              f"{', '.join(map(str, candidates)) or 'none'}")
    if ds is None:
        return variable, _bare_array(node[variable], chunks_text)
    arr = ds[variable]
    chunks = parse_chunks(chunks_text, tuple(map(str, arr.dims)))
    if chunks:
        arr = _open_dataset(source, chunks=chunks)[variable]
    arr.attrs.pop("_FillValue", None)
    arr.attrs = {**ds.attrs, **arr.attrs}
    return variable, arr


def open_input(role: str, path: str, variable: str | None, chunks_text: str | None, settings) -> Input:
    """Open ``path`` (a local path or an fsspec URL) lazily: a bare Zarr array, or one
    variable of a group."""
    import zarr

    from service.storage.raw_dtypes import from_stored  # bfloat16/complex32 stored as raw bits + ops_dtype

    source = _zarr_source(path, settings)
    node = _zarr_node(path, source)
    if isinstance(node, zarr.Array):
        if variable is not None:
            raise usage(f"--variable {variable}: input {path} is a bare Zarr array, not a group")
        arr = _bare_array(node, chunks_text)
    else:
        variable, arr = _group_variable(path, source, node, variable, chunks_text)
    arr.encoding = {}
    return Input(role, path, variable, from_stored(arr))


def scalar_or_array(role: str, value, op: registry.Operator):
    """An array input given with ``--param`` (JSON): a number for a scalar input, else an array."""
    if role in op.scalar_inputs and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    try:
        return np.asarray(value)
    except ValueError as error:
        raise usage(f"--param {role} must be a JSON array (or give --input {role}=PATH): {error}") from None


# --- the plan ---------------------------------------------------------------------------------


@dataclass
class Plan:
    """Everything decided before the cluster is involved."""

    op: registry.Operator
    kwargs: dict
    inputs: list[Input]
    result: xr.DataArray          # rechunked to the output's Zarr chunks
    output: LocalOutput | ObjectOutput
    variable: str
    dims: dict | None = None      # roles -> dim names (--param dims=...)
    scratch: str | None = None    # GatherNd's intermediate files (ops.scratch), beside the output

    def store_graph(self, target):
        """The Dask graph (a Delayed) that writes the data to ``target``; metadata written now."""
        from service.storage.raw_dtypes import to_stored

        ds = to_stored(self.result).to_dataset(name=self.variable)
        for name in ds.variables:  # the inputs' encodings (their chunks, codecs) are not the output's
            ds[name].encoding = {}
        encoding = {self.variable: {"chunks": self.output_chunks}} if self.result.ndim else {}
        with ops.fusing_stores():  # to_zarr optimizes the graph it returns as it builds it
            return ds.to_zarr(target, zarr_format=3, consolidated=True, compute=False, mode="w", encoding=encoding)

    @property
    def output_chunks(self) -> tuple[int, ...]:
        return tuple(c[0] for c in self.result.chunks) if self.result.ndim else ()


def check_arguments(op: registry.Operator, input_items: list[str], param_items: list[str],
                    variable_items: list[str]) -> tuple[dict, dict, dict, dict]:
    """The flags, checked against the operator before anything is read: (keyword parameters,
    input paths by role, variables by role, array inputs given as JSON values, the ``dims``
    mapping of roles to dim names or None)."""
    params = parse_params(param_items)
    paths = parse_inputs(input_items, op)
    variables = parse_variables(variable_items, op)
    literal_arrays = {k: params.pop(k) for k in list(params) if k in op.array_inputs}
    dims = params.pop("dims", None) if op.accepts_dims else None
    if dims is not None and not (isinstance(dims, dict) and all(isinstance(v, str) for v in dims.values())):
        raise usage(f"--param dims must map roles to dim names as JSON, e.g. dims={{\"H\":\"row\"}}; got {dims!r}")
    both = [k for k in literal_arrays if k in paths]
    if both:
        raise usage(f"{both[0]} is given both as --input and as --param; give it once")
    unknown = [k for k in params if k not in op.keywords]
    if unknown:
        raise usage(f"{op.name} has no parameter {unknown[0]!r}; its parameters are {', '.join(op.keywords)}")
    missing = [k for k in op.array_inputs if k not in paths and k not in literal_arrays]
    if missing:
        hint = (f"--input {missing[0]}=PATH or --param {missing[0]}=NUMBER" if missing[0] in op.scalar_inputs
                else f"--input {missing[0]}=PATH" if missing[0] != op.array_inputs[0] else "--input PATH")
        raise usage(f"{op.name} needs the array input {missing[0]!r} ({hint})")
    required = [k for k, f in op.params.model_fields.items() if f.is_required() and k not in params]
    if required:
        raise usage(f"{op.name} needs the parameter {required[0]!r} (--param {required[0]}=VALUE)")
    stray = [k for k in variables if k not in paths]
    if stray:
        raise usage(f"--variable {stray[0]}=...: there is no --input {stray[0]}")
    try:
        _validate.params(op.params, **params)  # the operator's own message
    except InvalidArgument as error:
        raise usage(str(error)) from None
    return params, paths, variables, literal_arrays, dims


def check_output(output: str, paths: dict[str, str], settings, *, overwrite: bool,
                 dry_run: bool) -> LocalOutput | ObjectOutput:
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
          dry_run: bool, settings=None) -> Plan:
    """Check everything, open the inputs and build the lazy result; nothing is computed.
    ``settings`` (``service.settings.Settings``, default from the environment) give the
    storage options of URLs."""
    from service.settings import Settings

    settings = settings or Settings()
    try:
        op = registry.get(op_name)
    except InvalidArgument as error:
        raise usage(str(error)) from None
    params, paths, variables, literal_arrays, dims = check_arguments(op, input_items, param_items, variable_items)
    target = check_output(output, paths, settings, overwrite=overwrite, dry_run=dry_run)
    opened = [open_input(role, path, variables.get(role), chunks if role == op.array_inputs[0] else None,
                         settings) for role, path in paths.items()]
    arrays = {i.role: i.array for i in opened}
    arrays.update({k: scalar_or_array(k, v, op) for k, v in literal_arrays.items()})
    # Created only if a plan writes there: on this machine's disk for the embedded cluster,
    # else beside the output, where the workers write anyway.
    scratch, scratch_options = target.scratch(workers_local=settings.scheduler is None)
    try:
        with ops.scratch(scratch, scratch_options):
            result = registry.apply(op.name, arrays, params, dims)  # the graph, as the service builds it
    except (InvalidArgument, IndexError) as error:  # rules on shapes and dtypes
        raise usage(str(error)) from None
    result.encoding = {}
    if result.ndim:
        result = result.chunk(dict(zip(result.dims, zarr_chunks(result.chunks))))
    first = next((i for i in opened if i.role == op.array_inputs[0]), None)
    variable = output_variable or (first.variable if first and first.variable else RESULT_VARIABLE)
    return Plan(op, params, opened, result, target, variable, dims, scratch)


def _nbytes(shape, dtype) -> int:
    return math.prod(shape) * np.dtype(dtype).itemsize


def _describe(arr: xr.DataArray) -> str:
    chunks = [c[0] for c in arr.chunks] if arr.chunks else []
    count = math.prod(len(c) for c in arr.chunks) if arr.chunks else 1
    return (f"shape {list(arr.shape)} {dtypes.name(np.dtype(arr.dtype))} dims {list(map(str, arr.dims))} "
            f"chunks {chunks} ({count} chunks) {_nbytes(arr.shape, arr.dtype)} bytes")


def describe_plan(plan: Plan) -> list[str]:
    """The ``--dry-run`` report: inputs, output, tasks, bytes read and written."""
    import zarr

    import dask

    graph = plan.store_graph(zarr.storage.MemoryStore())  # the very graph a run computes
    (optimized,) = dask.optimize(graph)  # as the client optimizes it before the scheduler gets it
    read = 0
    shown = {**plan.kwargs, **({"dims": plan.dims} if plan.dims else {})}
    lines = [f"operator: {plan.op.name} {json.dumps(shown, separators=(',', ':'))}"]
    for i in plan.inputs:
        where = f"{i.path} variable {i.variable}" if i.variable else i.path
        lines.append(f"input {i.role}: {where}: {_describe(i.array)}")
        read += _nbytes(i.array.shape, i.array.dtype)
    taken = " (exists: the run needs --overwrite)" if plan.output.exists() else ""
    lines.append(f"output: {plan.output}{taken} variable {plan.variable}: {_describe(plan.result)}")
    lines.append(f"tasks: {len(optimized.__dask_graph__())} (after Dask's graph optimization; "
                 f"{len(graph.__dask_graph__())} before)")
    lines.append(f"bytes read: {read} (every input chunk once, uncompressed)")
    lines.append(f"bytes written: {_nbytes(plan.result.shape, plan.result.dtype)} (uncompressed)")
    return lines


# --- running ----------------------------------------------------------------------------------


def connect(settings, *, dashboard: bool = False):
    """A ``service.jobs.cluster.Cluster``, started and answering (exit 4 otherwise). The embedded
    cluster gets a dashboard only when asked: it costs the start-up more than a small run."""
    from service.jobs.cluster import Cluster, ClusterUnavailable

    cluster = Cluster(settings, dashboard=dashboard)
    try:
        if cluster.embedded:
            cluster.start()
        cluster.live_client()
    except ClusterUnavailable as error:
        cluster.close()
        raise RunError(CLUSTER, error.detail) from None
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


def _wait(client, future, bar: ProgressBar, patience: float, bound: float):
    """Wait for ``future`` with a progress bar; a scheduler silent for ``patience`` s is lost."""
    from service.jobs import progress

    job = uuid.uuid4().hex
    try:
        bar.show(0, client.run_on_scheduler(progress.start, key=future.key, job_id=job, callback_timeout=bound))
    except Exception:  # progress is a courtesy; the run goes on without it
        # (a start that timed out here may still have begun tracking on the scheduler: the
        # counts below then draw the bar, and the stop below removes the tracker)
        pass
    answered = time.monotonic()
    try:
        while not future.done():
            try:  # also the scheduler's sign of life (None when it does not track the run)
                counts = client.run_on_scheduler(progress.count, job_id=job, callback_timeout=bound)
                answered = time.monotonic()
                if counts:
                    bar.show(counts[0] - counts[1], counts[0])
            except Exception as error:  # a frozen scheduler keeps its connection open: only silence tells
                if time.monotonic() - answered > patience and not future.done():
                    raise RunError(CLUSTER, f"the Dask scheduler has not answered for {patience:.0f} s "
                                            f"({type(error).__name__}: {error})") from None
            time.sleep(0.1)
        if future.status == "finished":
            bar.finish()
    finally:
        try:
            client.run_on_scheduler(progress.stop, job_id=job, callback_timeout=bound)
        except Exception:
            pass
    if future.status == "error":
        error = future.exception()
        if isinstance(error, (InvalidArgument, IndexError)):  # e.g. an index out of range (GatherNd)
            raise RunError(USAGE, str(error))
        raise RunError(FAILED, f"the computation failed: {type(error).__name__}: {error}")
    if future.status == "cancelled":
        raise RunError(CLUSTER, "the computation was cancelled by the cluster (lost workers or scheduler)")
    return future.result()


def execute(plan: Plan, settings, *, overwrite: bool, show_progress: bool, dashboard: bool = False) -> dict:
    """Compute the plan on the cluster and publish the output. Returns a summary."""
    from distributed.comm.core import CommClosedError

    cluster = connect(settings, dashboard=dashboard)
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


def _clean_up(plan: Plan, embedded: bool, published: bool) -> None:
    """Remove the scratch and an unpublished output."""
    def remove() -> bool:
        left = not published and plan.output.discard()
        if plan.scratch is not None:
            left = plan.output.remove_scratch(plan.scratch) or left
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
                      dashboard=args.dashboard)
    print(f"wrote {summary['output']} (variable {plan.variable}): {_describe(plan.result)} "
          f"in {summary['seconds']:.1f} s")
    return OK
