"""``chunked-tensor-ops run``: the real console script (and ``python -m service run``) as
subprocesses on small Zarr inputs written by zarr and xarray, checked against the NumPy
kernels byte for byte; the plan of ``--dry-run`` against Dask's own chunking and the
scheduler's own task count; every exit code with its message; a real scheduler and workers.

Runs that do not depend on each other are started together (``run_all``) to keep this quick.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import dask
import dask.array as da
import numpy as np
import pytest
import xarray as xr
import zarr

import ops
from ops.errors import InvalidArgument
from service.cli import main as cli
from service.cli import flags, run, run_errors
from tests.helpers import assert_same, stores_as_made
from tests.service.processes import dask_processes, free_port

SCRIPT = Path(sys.executable).parent / "chunked-tensor-ops"
RNG = np.random.default_rng(10)
IMAGE = RNG.standard_normal((2, 8, 8, 16), dtype=np.float32)
BATCH = RNG.standard_normal((12, 4, 3, 2), dtype=np.float32)
PARAMS = RNG.standard_normal((10, 8, 3), dtype=np.float32)
POINTS = np.stack([RNG.integers(-10, 10, 40), RNG.integers(0, 8, 40)], axis=1).astype(np.int64)
ACC = RNG.integers(-100000, 100000, size=(16, 48), dtype=np.int32)
SCALE = ops.pack_deq_scale(RNG.uniform(-0.01, 0.01, 48).astype(np.float32))  # uint64, as float16 output takes
QUICK = ["--in-process", "--n-workers", "1", "--threads-per-worker", "2"]


def command(*args: str, module: bool = False) -> list[str]:
    head = [sys.executable, "-m", "service"] if module else [str(SCRIPT)]
    return [*head, "run", *args]


def run_all(commands: list[list[str]], cwd: Path, timeout: float = 240) -> list[subprocess.CompletedProcess]:
    """Run the commands at the same time; their completed processes, in order, each with the
    seconds it ran as ``.seconds``."""
    def one(argv: list[str]) -> subprocess.CompletedProcess:
        started = time.monotonic()
        done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, stdin=subprocess.DEVNULL,
                              timeout=timeout)
        done.seconds = time.monotonic() - started
        return done

    with ThreadPoolExecutor(len(commands)) as pool:
        return list(pool.map(one, commands))


def assert_fails(proc: subprocess.CompletedProcess, code: int, message: str) -> None:
    """Exit ``code``; stderr is exactly one line, ending with ``message``, and no traceback."""
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0] == f"chunked-tensor-ops run: error: {message}", lines[0]


def write_array(path: Path, array: np.ndarray, chunks, dims=None, zarr_format: int = 3) -> Path:
    """A bare Zarr array (no group), with dimension names when given."""
    extra = {"dimension_names": dims} if dims and zarr_format == 3 else {}
    z = zarr.create_array(path, shape=array.shape, chunks=chunks, dtype=array.dtype, zarr_format=zarr_format,
                          **extra)
    z[...] = array
    if dims and zarr_format == 2:
        z.attrs["_ARRAY_DIMENSIONS"] = list(dims)
    return path


def read_output(path: Path, variable: str) -> xr.DataArray:
    return xr.open_zarr(path, mask_and_scale=False)[variable]


def ops_error(function, *args, **kwargs) -> str:
    """The message the operator itself gives on NumPy."""
    with pytest.raises(InvalidArgument) as error:
        function(*args, **kwargs)
    return str(error.value)


# --- the runs, started together ----------------------------------------------------------------


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("cli-inputs")
    write_array(root / "image.zarr", IMAGE, (1, 4, 4, 16))
    # a group of two variables with coordinates, as xarray writes it
    ds = xr.Dataset({"image": (("n", "y", "x", "c"), IMAGE), "mask": (("y", "x"), np.ones((8, 8), bool))},
                    coords={"y": np.arange(8) * 10.0, "x": np.arange(8) * 10.0}, attrs={"title": "scene"})
    ds.chunk({"n": 1, "y": 4, "x": 4}).to_zarr(root / "scene.zarr", zarr_format=3)
    write_array(root / "padded.zarr", np.ascontiguousarray(IMAGE[:, :6, :5]), (1, 3, 2, 8))
    write_array(root / "batch-v2.zarr", BATCH, (6, 2, 3, 2), dims=("b", "h", "w", "c"), zarr_format=2)
    points = xr.Dataset({"params": (("i", "j", "k"), PARAMS), "points": (("p", "q"), POINTS)})
    points.chunk({"i": 5, "j": 4, "p": 10}).to_zarr(root / "points.zarr", zarr_format=3)
    write_array(root / "acc.zarr", ACC, (4, 48))
    write_array(root / "scale.zarr", SCALE, (48,))
    return root


# name: (arguments, the output's variable, the NumPy result)
OPERATORS = {
    "depth_to_space": (["--input", "image.zarr", "--param", "block_size=2"], "result",
                       lambda: ops.depth_to_space(IMAGE, 2)),
    "space_to_depth": (["--input", "scene.zarr", "--variable", "image", "--param", "block_size=2",
                        "--param", "mode=CRD"], "image", lambda: ops.space_to_depth(IMAGE, 2, mode="CRD")),
    "space_to_batch": (["--input", "scene.zarr", "--variable", "image", "--param", "block_size=2",
                        "--param", "paddings=[[0,2],[2,0]]"], "image",
                       lambda: ops.space_to_batch(IMAGE, 2, [[0, 2], [2, 0]])),
    "space_to_batch_nd": (["--input", "padded.zarr", "--param", "block_shape=[2,3]",
                           "--param", "paddings=[[1,1],[0,1]]"], "result",
                          lambda: ops.space_to_batch_nd(IMAGE[:, :6, :5], [2, 3], [[1, 1], [0, 1]])),
    "batch_to_space_nd": (["--input", "batch-v2.zarr", "--param", "block_shape=[2,3]",
                           "--param", "crops=[[1,1],[0,2]]"], "result",
                          lambda: ops.batch_to_space_nd(BATCH, [2, 3], [[1, 1], [0, 2]])),
    "gather_nd": (["--input", "params=points.zarr", "--variable", "params=params", "--input", "indices=points.zarr",
                   "--variable", "indices=points", "--output-variable", "gathered"], "gathered",
                  lambda: ops.gather_nd(PARAMS, POINTS)),
    "ascend_dequant": (["--input", "src=acc.zarr", "--input", "deq_scale=scale.zarr",
                        "--param", 'dst_dtype="float16"'], "result",
                       lambda: ops.ascend_dequant(ACC, SCALE, dst_dtype="float16")),
}
PLAN = ["space_to_batch_nd", "--input", "padded.zarr", "--param", "block_shape=[2,3]",
        "--param", "paddings=[[1,1],[0,1]]", "--output", "plan.zarr", "--dry-run"]


def run_in_process(cwd: Path, argv: list[str]) -> subprocess.CompletedProcess:
    """``argv`` (a ``command(...)``) through the same entry point as the console script, in
    this process: the same code without the seconds an interpreter takes to start here."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.chdir(cwd), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(argv[argv.index("run"):])
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


@pytest.fixture(scope="module")
def runs(inputs) -> dict[str, subprocess.CompletedProcess]:
    """Every successful run of this module that needs no external cluster: one through the
    console script, one through ``python -m service run`` and the dry run as processes (started
    together), the other operators in this process meanwhile."""
    commands = {name: command(name, *args, "--output", f"{name}.zarr", *QUICK)
                for name, (args, _, _) in OPERATORS.items()}
    commands["depth_to_space"] = command("depth_to_space", *OPERATORS["depth_to_space"][0], "--output",
                                         "depth_to_space.zarr", *QUICK, module=True)  # python -m service run
    commands["plan"] = command(*PLAN)
    processes = ["depth_to_space", "space_to_depth", "plan"]
    with ThreadPoolExecutor(1) as pool:
        started = pool.submit(run_all, [commands[name] for name in processes], inputs)
        done = {name: run_in_process(inputs, argv) for name, argv in commands.items() if name not in processes}
        done.update(zip(processes, started.result()))
    return done


@pytest.mark.parametrize("name", list(OPERATORS))
def test_every_operator_matches_the_numpy_kernel(runs, inputs, name):
    proc = runs[name]
    assert proc.returncode == 0, (name, proc.stderr)
    _, variable, expected = OPERATORS[name]
    assert re.search(r"100% (\d+)/\1 tasks", proc.stderr), proc.stderr  # the progress bar's end
    assert f"wrote {inputs / (name + '.zarr')} (variable {variable})" in proc.stdout
    assert_same(read_output(inputs / f"{name}.zarr", variable).values, expected())
    assert not [p.name for p in inputs.iterdir() if p.name.startswith(f".{name}.zarr")]  # no temporary left


def test_dims_coordinates_and_attrs_of_a_group_variable(runs, inputs):
    assert runs["space_to_depth"].returncode == 0
    result = read_output(inputs / "space_to_depth.zarr", "image")
    assert result.dims == ("n", "y", "x", "c")  # the input's dims, by name
    # the group's attrs stay the group's (not copied into the variable's)
    assert xr.open_zarr(inputs / "space_to_depth.zarr").attrs["title"] == "scene"
    assert "title" not in result.attrs
    # evenly spaced coordinates coarsened by 2 stay true: the centres of 2x2 blocks
    np.testing.assert_array_equal(result["y"].values, np.arange(4) * 20.0 + 5.0)
    assert set(xr.open_zarr(inputs / "space_to_depth.zarr").data_vars) == {"image"}


def test_dry_run_plan_matches_dask_and_the_scheduler(runs, inputs):
    planned, ran = runs["plan"], runs["space_to_batch_nd"]
    assert planned.returncode == 0, planned.stderr
    x = da.from_zarr(str(inputs / "padded.zarr"))  # read from Zarr as the run reads it (the plan depends on it)
    expected = ops.space_to_batch_nd(x, [2, 3], [[1, 1], [0, 1]])
    out_chunks = [max(c) for c in expected.chunks]
    lines = dict(line.split(": ", 1) for line in planned.stdout.splitlines())
    assert lines["operator"] == 'space_to_batch_nd {"block_shape":[2,3],"paddings":[[1,1],[0,1]]}'
    assert lines["input x"] == (f"padded.zarr: shape [2, 6, 5, 16] float32 dims ['dim_0', 'dim_1', 'dim_2', "
                                f"'dim_3'] chunks [1, 3, 2, 8] ({x.npartitions} chunks) {x.nbytes} bytes")
    assert lines["output"] == (f"{inputs / 'plan.zarr'} variable result: shape {list(expected.shape)} float32 "
                               f"dims ['batch', 'dim_1', 'dim_2', 'dim_3'] chunks {out_chunks} "
                               f"({expected.npartitions} chunks) {expected.nbytes} bytes")
    assert lines["bytes read"].startswith(f"{x.nbytes} ")
    assert lines["bytes written"].startswith(f"{expected.nbytes} ")
    tasks = int(lines["tasks"].split()[0])
    assert re.search(rf"100% {tasks}/{tasks} tasks", ran.stderr), (tasks, ran.stderr)  # the scheduler's count
    assert not (inputs / "plan.zarr").exists()  # a dry run writes nothing
    assert not [p for p in inputs.iterdir() if p.name.startswith(".plan.zarr")]


def test_a_dry_run_past_the_counted_blocks_prints_the_plan_without_making_tasks(tmp_path, capsys, monkeypatch):
    # Counting makes every task (a minute per 100,000 blocks): past COUNTED_BLOCKS the plan
    # is printed without them, and no graph is made at all.
    path = write_array(tmp_path / "rows.zarr", BATCH, (1, 2, 3, 2))
    monkeypatch.setattr(run, "COUNTED_BLOCKS", 3)
    monkeypatch.setattr(run.RunPlan, "store_graph", lambda *_: pytest.fail("the store graph was built"))
    code, out, err = main_in_process(capsys, "batch_to_space_nd", "--input", str(path), "--param",
                                     "block_shape=[2,3]", "--param", "crops=[[0,0],[0,2]]", "--output",
                                     str(tmp_path / "o.zarr"), "--dry-run")
    assert code == 0, err
    blocks = ops.batch_to_space_nd(da.from_zarr(str(path)), [2, 3], [[0, 0], [0, 2]]).npartitions
    assert f"tasks: not counted for {blocks} output blocks (--dry-run counts them up to 3)" in out.splitlines()
    assert not (tmp_path / "o.zarr").exists()


def test_batch_to_space_bundles_store_their_own_blocks(tmp_path, capsys):
    # One batch row per chunk: each task reads the P = 6 chunks that feed 6 output blocks, and
    # in the run's store graph it writes them itself (ops.fusing_stores), the same bytes.
    path = write_array(tmp_path / "rows.zarr", BATCH, (1, 2, 3, 2))
    out = tmp_path / "o.zarr"
    params = ["block_shape=[2,3]", "crops=[[0,0],[0,2]]"]  # no rechunk of the output for its Zarr chunks
    plan = run.build("batch_to_space_nd", [str(path)], str(out), param_items=params, variable_items=[],
                       chunks=None, overwrite=False, output_variable=None, dry_run=True)
    # optimized where it is computed (the scheduler), as dask.optimize does here
    (optimized,) = dask.optimize(plan.store_graph(zarr.storage.MemoryStore()))
    assert len(stores_as_made(optimized)) == 4  # 2 batch x 2 row blocks
    code, _, err = main_in_process(capsys, "batch_to_space_nd", "--input", str(path), "--param", params[0],
                                   "--param", params[1], "--output", str(out), *QUICK)
    assert code == 0, err
    assert_same(xr.open_zarr(out)["result"].values, ops.batch_to_space_nd(BATCH, [2, 3], [[0, 0], [0, 2]]))


def test_chunks_read_the_input_in_other_chunks(inputs, tmp_path, capsys):
    padded = inputs / "padded.zarr"
    code, out, err = main_in_process(capsys, "space_to_batch_nd", "--input", str(padded), "--param",
                                     "block_shape=[2,3]", "--param", "paddings=[[1,1],[0,1]]", "--output",
                                     str(tmp_path / "o.zarr"), "--dry-run", "--chunks", "2,6,-1,4")
    assert code == 0, err
    x = da.from_array(np.ascontiguousarray(IMAGE[:, :6, :5]), chunks=(2, 6, -1, 4))
    assert f"input x: {padded}: shape [2, 6, 5, 16] float32 dims ['dim_0', 'dim_1', 'dim_2', 'dim_3'] " \
           f"chunks [2, 6, 5, 4] ({x.npartitions} chunks)" in out
    plan = run.build("space_to_depth", [str(inputs / "scene.zarr")], str(tmp_path / "o.zarr"),
                       param_items=["block_size=2"], variable_items=["image"], chunks="y=8,x=8",
                       overwrite=False, output_variable=None, dry_run=True)
    assert plan.inputs[0].array.chunks == ((1, 1), (8,), (8,), (16,))  # by name; others as stored
    assert_same(plan.result.values, ops.space_to_depth(IMAGE, 2))


def test_array_inputs_as_json_values(inputs, tmp_path):
    """--param deq_scale=NUMBER and --param indices=[[...]] instead of --input ROLE=PATH."""
    def result(op, input_items, params, variables=()):
        return run.build(op, input_items, str(tmp_path / "o.zarr"), param_items=params,
                           variable_items=list(variables), chunks=None, overwrite=False, output_variable=None,
                           dry_run=True).result.values

    assert_same(result("ascend_dequant", [str(inputs / "acc.zarr")], ["deq_scale=0.0078125", "dst_dtype=float32"]),
                ops.ascend_dequant(ACC, 0.0078125, dst_dtype="float32"))
    points = POINTS[:5].tolist()
    assert_same(result("gather_nd", [str(inputs / "points.zarr")], [f"indices={json.dumps(points)}"], ["params"]),
                ops.gather_nd(PARAMS, np.array(points)))


def test_dims_by_name_in_any_order(tmp_path, capsys):
    """--param dims=... names the roles, as the service's dims input and the accessor's dims=."""
    stored = IMAGE.transpose(0, 3, 1, 2)  # N, C, H, W under names no rule recognises
    xr.Dataset({"img": (("t", "b", "row", "col"), stored)}).to_zarr(tmp_path / "odd.zarr", zarr_format=3)
    dims = '{"N":"t","C":"b","H":"row","W":"col"}'
    args = ["depth_to_space", "--input", str(tmp_path / "odd.zarr"), "--param", "block_size=2",
            "--param", f"dims={dims}", "--output", str(tmp_path / "o.zarr")]
    plan = run.build(args[0], [args[2]], args[-1], param_items=[args[4], args[6]], variable_items=[],
                       chunks=None, overwrite=False, output_variable=None, dry_run=True)
    assert plan.result.dims == ("t", "b", "row", "col")
    assert_same(plan.result.values, ops.depth_to_space(stored, 2, data_format="NCHW"))
    code, out, _ = main_in_process(capsys, *args, "--dry-run")
    assert code == 0 and out.startswith(f'operator: depth_to_space {{"block_size":2,"dims":{dims}}}\n')
    code, _, err = main_in_process(capsys, *args[:5], "--param", "dims=[1]", "--output", args[-1])
    assert (code, err) == (2, "chunked-tensor-ops run: error: dims must map roles (N, H, W, C, V) to dim names, "
                              "e.g. {'H': 'row'}; got [1]\n")


# --- exit codes -------------------------------------------------------------------------------


def test_exit_codes_one_line_each(inputs, tmp_path):
    """One run per exit code through the console script; the messages of every usage error
    are checked in process below (the same code without the process start)."""
    image = str(inputs / "image.zarr")
    out = str(tmp_path / "out.zarr")
    broken = write_array(tmp_path / "broken.zarr", IMAGE, (1, 8, 8, 16))
    (broken / "c" / "1" / "0" / "0" / "0").write_bytes(b"not a compressed chunk")  # read only on a worker
    address = f"tcp://127.0.0.1:{free_port()}"  # nobody listens there
    bad_param, missing, unreachable, failed = run_all([
        command("depth_to_space", "--input", image, "--output", out, "--param", "block_size=1"),
        command("depth_to_space", "--input", str(tmp_path / "missing.zarr"), "--output", out,
                "--param", "block_size=2"),
        command("depth_to_space", "--input", image, "--output", out, "--param", "block_size=2",
                "--scheduler", address, "--scheduler-timeout", "2"),
        # the default embedded cluster (worker processes), whose logs stay quiet too
        command("depth_to_space", "--input", str(broken), "--output", out, "--param", "block_size=2",
                "--n-workers", "1"),
    ], tmp_path)
    assert_fails(bad_param, 2, ops_error(ops.depth_to_space, IMAGE, 1))
    assert_fails(missing, 3, f"input {tmp_path / 'missing.zarr'}: no such file or directory")
    assert unreachable.returncode == 4, unreachable.stderr
    assert unreachable.stderr.startswith(f"chunked-tensor-ops run: error: the Dask scheduler at {address} is "
                                         "unreachable"), unreachable.stderr
    assert len(unreachable.stderr.strip().splitlines()) == 1
    # no hang: the wait for the scheduler is bounded by --scheduler-timeout (the rest is the
    # start-up that the bad parameter's run has too, on a machine that may be busy)
    assert unreachable.seconds - bad_param.seconds < 2 + 15, (unreachable.seconds, bad_param.seconds)
    # the computation failed on a worker (which codec error is zarr's business)
    assert failed.returncode == 1, (failed.returncode, failed.stderr)
    assert failed.returncode == 1, (failed.returncode, failed.stderr)
    *progress, last = failed.stderr.strip().splitlines()
    assert last.startswith("chunked-tensor-ops run: error: the computation failed: "), failed.stderr
    assert all(re.fullmatch(r"\[[# ]+\] +\d+% \d+/\d+ tasks [\d.]+ s", line) for line in progress), progress
    assert not (tmp_path / "out.zarr").exists()  # no output from any failure, not even a partial one
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out.zarr")] == []


def test_sigterm_stops_the_run_and_leaves_nothing(tmp_path):
    """Interrupted while the workers compute: exit 130, no output, no temporary directory."""
    many = write_array(tmp_path / "many.zarr", np.zeros((2, 32, 32, 16), np.float32), (1, 2, 2, 16))  # 512 chunks
    out = tmp_path / "out.zarr"
    proc = subprocess.Popen(command("depth_to_space", "--input", str(many), "--param", "block_size=2",
                                    "--output", str(out), *QUICK), cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    try:
        first = proc.stderr.readline()  # the progress bar's first line: the tasks are on the cluster
        assert re.match(r"\[ *\] +0% 0/\d+ tasks", first), first
        assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out.zarr.tmp-")]  # being written
        proc.terminate()
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, (proc.returncode, err)
    assert err.splitlines()[-1] == "chunked-tensor-ops run: interrupted; no output was written"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["many.zarr"]


def main_in_process(capsys, *args: str) -> tuple[int, str, str]:
    code = cli.main(["run", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def usage_cases(inputs: Path, tmp_path: Path):
    image = str(inputs / "image.zarr")
    out = str(tmp_path / "out.zarr")
    scene = inputs / "scene.zarr"
    (tmp_path / "not-zarr").mkdir(exist_ok=True)
    (tmp_path / "taken.zarr").mkdir(exist_ok=True)
    (tmp_path / "taken.zarr" / "keep.txt").write_text("mine")
    return [
        # (arguments, exit code, message)
        (["depth_to_space", "--input", image, "--output", out, "--param", "block_size=3"], 2,
         ops_error(ops.depth_to_space, IMAGE, 3)),
        (["depth_to_space", "--input", image, "--output", out, "--param", "block_size=2", "--param", "mode=XYZ"],
         2, ops_error(ops.depth_to_space, IMAGE, 2, mode="XYZ")),
        (["space_to_batch_nd", "--input", image, "--output", out, "--param", "block_shape=[2,2]",
          "--param", "paddings=[[1,0],[0,0]]"], 2,
         ops_error(ops.space_to_batch_nd, IMAGE, [2, 2], [[1, 0], [0, 0]])),
        (["depth_to_space", "--input", image, "--output", out, "--param", "block_size=2.0"], 2,
         ops_error(ops.depth_to_space, IMAGE, 2.0)),
        (["depth_to_space", "--input", image, "--output", out, "--param", "blocksize=2"], 2,
         "depth_to_space has no input 'blocksize'; its inputs are x, block_size, data_format, mode, dims"),
        (["depth_to_space", "--input", image, "--output", out], 2,
         "depth_to_space needs the parameter 'block_size' (--param block_size=VALUE)"),
        (["depth_to_space", "--input", image, "--output", out, "--param", "block_size"], 2,
         "--param must be NAME=VALUE (VALUE as JSON), got 'block_size'"),
        (["depthtospace", "--input", image, "--output", out], 2,
         "operator must be one of depth_to_space, space_to_depth, space_to_batch, space_to_batch_nd, "
         "batch_to_space_nd, gather_nd, ascend_dequant, got 'depthtospace'"),
        (["gather_nd", "--input", image, "--output", out], 2,
         "gather_nd needs the array input 'indices' (--input indices=PATH)"),
        (["ascend_dequant", "--input", image, "--output", out, "--param", "dst_dtype=float32"], 2,
         "ascend_dequant needs the array input 'deq_scale' (--input deq_scale=PATH or --param deq_scale=NUMBER)"),
        (["depth_to_space", "--output", out, "--param", "block_size=2"], 2,
         "depth_to_space needs the array input 'x' (--input PATH)"),
        (["depth_to_space", "--input", image, "--param", "block_size=2"], 2,
         "the following arguments are required: --output"),
        (["depth_to_space", "--input", image, "--output", image, "--param", "block_size=2", "--overwrite"], 2,
         f"--output {image} is the input x; write the result elsewhere"),
        (["depth_to_space", "--input", str(scene), "--output", out, "--param", "block_size=2"], 2,
         f"input {scene} is a group with 2 variables (image, mask); pick one with --variable NAME"),
        (["depth_to_space", "--input", image, "--variable", "image", "--output", out, "--param", "block_size=2"], 2,
         f"--variable image: input {image} is a bare Zarr array, not a group"),
        (["depth_to_space", "--input", image, "--output", out, "--param", "block_size=2", "--chunks", "1,2"], 2,
         "--chunks must give one length per axis (4), got '1,2'"),
        (["depth_to_space", "--input", str(scene), "--variable", "nope", "--output", out,
          "--param", "block_size=2"], 3, f"input {scene} has no variable 'nope'; its variables are image, mask"),
        (["depth_to_space", "--input", image, "--output", str(tmp_path / "no" / "out.zarr"),
          "--param", "block_size=2"], 3, f"output {tmp_path / 'no' / 'out.zarr'}: the directory "
                                         f"{tmp_path / 'no'} does not exist"),
        (["depth_to_space", "--input", image, "--output", str(tmp_path / "taken.zarr"), "--param", "block_size=2"],
         3, f"output {tmp_path / 'taken.zarr'} exists; pass --overwrite to replace it"),
    ]


def test_usage_errors_name_the_parameter_the_rule_and_the_value(inputs, tmp_path, capsys):
    for args, code, message in usage_cases(inputs, tmp_path):
        try:
            got, out, err = main_in_process(capsys, *args)
        except SystemExit as stop:  # argparse's own errors exit from parse_args
            got, out, err = stop.code, *capsys.readouterr()
        assert (got, out, err) == (code, "", f"chunked-tensor-ops run: error: {message}\n"), args
    code, out, err = main_in_process(capsys, "depth_to_space", "--input", str(tmp_path / "not-zarr"),
                                     "--output", str(tmp_path / "out.zarr"), "--param", "block_size=2")
    assert code == 3 and err.startswith(f"chunked-tensor-ops run: error: input {tmp_path / 'not-zarr'} is not a "
                                        "readable Zarr array or group: ") and err.count("\n") == 1
    assert (tmp_path / "taken.zarr" / "keep.txt").read_text() == "mine"  # refused, untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["not-zarr", "taken.zarr"]


def test_verbose_shows_the_traceback(inputs, tmp_path, capsys):
    code, _, err = main_in_process(capsys, "depth_to_space", "--input", str(inputs / "image.zarr"), "--output",
                                   str(tmp_path / "o.zarr"), "--param", "block_size=1", "--verbose")
    assert code == 2
    assert "Traceback" in err and err.strip().endswith(ops_error(ops.depth_to_space, IMAGE, 1))


# --- a real scheduler and workers ---------------------------------------------------------------


@pytest.fixture(scope="module")
def scheduler(tmp_path_factory):
    """(address, process) of a ``dask scheduler`` with one ``dask worker``, each its own process."""
    with dask_processes(tmp_path_factory.mktemp("cli-dask-logs"), workers=1, nthreads=2) as (address, procs, _):
        yield address, procs[0]


@pytest.mark.smoke
def test_existing_scheduler_and_overwrite(scheduler, inputs, tmp_path):
    scheduler, _ = scheduler
    out, existing = tmp_path / "d2s.zarr", tmp_path / "existing.zarr"
    xr.Dataset({"image": (("n", "y", "x", "c"), IMAGE)}).to_zarr(existing, zarr_format=3)
    scene = str(inputs / "scene.zarr")
    fresh, replaced = run_all([
        # (a scheduler on a busy test machine may take more than the default 5 s to answer)
        command("depth_to_space", "--input", scene, "--variable", "image", "--param", "block_size=2",
                "--param", "mode=CRD", "--output", str(out), "--scheduler", scheduler, "--scheduler-timeout", "30"),
        command("space_to_depth", "--input", scene, "--variable", "image", "--param", "block_size=2",
                "--output", str(existing), "--scheduler", scheduler, "--overwrite", "--scheduler-timeout", "30"),
    ], tmp_path)
    assert fresh.returncode == 0, fresh.stderr
    assert re.search(r"100% (\d+)/\1 tasks", fresh.stderr), fresh.stderr
    assert_same(read_output(out, "image").values, ops.depth_to_space(IMAGE, 2, mode="CRD"))
    assert replaced.returncode == 0, replaced.stderr
    assert_same(read_output(existing, "image").values, ops.space_to_depth(IMAGE, 2))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d2s.zarr", "existing.zarr"]  # nothing left aside


def test_a_frozen_scheduler_is_exit_4_not_a_hang(scheduler, tmp_path):
    """The scheduler stops answering mid-run (SIGSTOP keeps its connections open): the run
    gives up after 3 x --scheduler-timeout of silence."""
    address, process = scheduler
    many = write_array(tmp_path / "many.zarr", np.zeros((2, 32, 32, 16), np.float32), (1, 2, 2, 16))
    proc = subprocess.Popen(command("depth_to_space", "--input", str(many), "--param", "block_size=2",
                                    "--output", str(tmp_path / "out.zarr"), "--scheduler", address,
                                    "--scheduler-timeout", "1"),
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL)
    try:
        first = proc.stderr.readline()  # the tasks are on the cluster
        assert re.match(r"\[ *\] +0% 0/\d+ tasks", first), first
        process.send_signal(signal.SIGSTOP)
        frozen = time.monotonic()
        _, err = proc.communicate(timeout=120)
        waited = time.monotonic() - frozen
    finally:
        process.send_signal(signal.SIGCONT)
        proc.kill()
    assert proc.returncode == 4, (proc.returncode, err)
    assert re.fullmatch(r"chunked-tensor-ops run: error: the Dask scheduler has not answered for 3 s \(.*\)",
                        err.splitlines()[-1]), err
    assert waited < 60, waited
    assert not (tmp_path / "out.zarr").exists()


class _SlowStartClient:
    """A client whose scheduler began tracking the run, but whose answer to ``start`` came
    too late (a busy machine): only the counts reach the bar, the last one short of done."""

    def __init__(self, counts):
        self.counts, self.calls = list(counts), []

    def run_on_scheduler(self, function, **kwargs):
        self.calls.append(function.__name__)
        if function.__name__ == "start":
            raise TimeoutError("start answered after its callback timeout")
        if function.__name__ == "count":
            return self.counts.pop(0) if self.counts else (11, 2)
        return None


class _FinishingFuture:
    def __init__(self, polls: int):
        self.polls, self.status, self.key = polls, "pending", "x"

    def done(self) -> bool:
        self.polls -= 1
        if self.polls < 0:
            self.status = "finished"
        return self.polls < 0

    def result(self):
        return "stored"

    def add_done_callback(self, callback) -> None:  # the executor's wake-up; polling suffices here
        pass


@pytest.mark.smoke
def test_the_progress_bar_of_a_successful_run_ends_on_100_percent(capsys):
    """Even when the scheduler's answer to ``start`` times out and the last count seen is
    9 of 11 (the old bar ended there), and the tracker is removed from the scheduler."""
    client = _SlowStartClient([(11, 11), (11, 6), (11, 2)])
    bar = run.ProgressBar(enabled=True)
    assert run._wait(client, _FinishingFuture(polls=3), bar, patience=30, bound=5) == "stored"
    lines = capsys.readouterr().err.splitlines()
    assert re.search(r"\] +0% 0/11 tasks", lines[0]), lines
    assert re.search(r"\] +81% 9/11 tasks", lines[-2]), lines
    assert re.search(r"\[#{30}\] 100% 11/11 tasks", lines[-1]), lines
    assert client.calls[-1] == "stop"


class _IdentityClient:
    """A client whose scheduler answers ``identity`` (or, ``silent``, never does) and records
    what the wait asked of it."""

    def __init__(self, silent: bool = False):
        self.silent, self.calls = silent, []
        self.scheduler = SimpleNamespace(identity=lambda: {"type": "Scheduler"})

    def sync(self, function, callback_timeout=None):
        self.calls.append("identity")
        if self.silent:
            raise TimeoutError("no answer")
        return function()

    def run_on_scheduler(self, function, **kwargs):
        self.calls.append(function.__name__)

    def cancel(self, futures, force=False):
        self.calls.append("cancel")


def test_a_quiet_run_tracks_no_tasks_on_the_scheduler(capsys, monkeypatch):
    """--quiet: no progress tracker is started on the scheduler (it would watch every task's
    transitions) and nothing is polled but whether the scheduler answers."""
    monkeypatch.setattr(run, "QUIET_POLL", 0.01)
    client = _IdentityClient()
    bar = run.ProgressBar(enabled=False)
    assert run._wait(client, _FinishingFuture(polls=3), bar, patience=30, bound=5) == "stored"
    assert client.calls and set(client.calls) == {"identity"}, client.calls
    assert capsys.readouterr().err == ""


def test_a_quiet_run_still_gives_up_on_a_silent_scheduler(monkeypatch):
    monkeypatch.setattr(run, "QUIET_POLL", 0.01)
    client = _IdentityClient(silent=True)
    with pytest.raises(run_errors.RunError) as error:
        run._wait(client, _FinishingFuture(polls=300), run.ProgressBar(enabled=False), patience=0.2, bound=5)
    assert error.value.code == run_errors.CLUSTER
    assert "has not answered for 0 s" in str(error.value)
    assert "start" not in client.calls and "count" not in client.calls


def test_a_service_job_records_progress_when_the_start_answered_late():
    """The service's job executor, with the same late answer: its record gets the counts'
    progress (before, it stayed at 0 until the end), and the tracker is removed."""

    from service.jobs.execution import Executor

    recorded = []
    executor = SimpleNamespace(
        _running={}, records=SimpleNamespace(update=lambda job, progress: recorded.append(progress)),
        cluster=SimpleNamespace(settings=SimpleNamespace(scheduler_timeout=5), patience=15))
    client = _SlowStartClient([(11, 11), (11, 6), (11, 2)])
    client.status = "running"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("service.jobs.execution.POLL_SECONDS", 0.01)
        assert Executor._wait(executor, "job", client, _FinishingFuture(polls=3)) == "stored"
    assert recorded == [0, 45, 81]
    assert client.calls[-1] == "stop"


# --- parsing (in process) -----------------------------------------------------------------------


@pytest.mark.parametrize("text, value", [
    ("2", 2), ("[[1,1],[0,0]]", [[1, 1], [0, 0]]), ("true", True), ('"DCR"', "DCR"), ("DCR", "DCR"),
    ("float16", "float16"), ("0.0078125", 0.0078125), ("null", None),
])
def test_param_values_are_json_or_a_bare_string(text, value):
    assert flags.parse_params([f"p={text}"]) == {"p": value}


def test_chunks_forms():
    dims = ("n", "y", "x", "c")
    assert flags.parse_chunks("1,64,-1,16", dims) == {"n": 1, "y": 64, "x": -1, "c": 16}
    assert flags.parse_chunks("y=64,x=32", dims) == {"y": 64, "x": 32}
    assert flags.parse_chunks("auto", dims) == dict.fromkeys(dims, "auto")
    for bad in ("1,2", "a,b,c,d", "z=3", "0,1,1,1"):
        with pytest.raises(run_errors.RunError) as error:
            flags.parse_chunks(bad, dims)
        assert error.value.code == run_errors.USAGE and repr(bad) in str(error.value)


def test_help_documents_the_parameter_forms_and_the_exit_codes(capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(["run", "--help"])
    assert stop.value.code == 0
    text = capsys.readouterr().out
    for code in (run_errors.OK, run_errors.FAILED, run_errors.USAGE, run_errors.INPUT, run_errors.CLUSTER, 130):
        assert re.search(rf"^  {code}  \S", text, flags=re.M), code
    for flag in ("--input", "--output", "--variable", "--param", "--scheduler", "--chunks", "--dry-run",
                 "--overwrite", "--n-workers", "--memory-limit", "--in-process"):
        assert flag in text
    assert "mode=DCR" in text and "--input indices=" in text


@pytest.mark.parametrize("bad, setting", [(False, False), (True, False), (False, True)],
                         ids=["ok", "bad-index", "scratch-setting"])
def test_a_large_gather_writes_its_scratch_beside_the_output_and_removes_it(inputs, tmp_path, capsys, monkeypatch,
                                                                            bad, setting):
    """Params past the broadcast limit (array.chunk-size lowered to 1 KiB): GatherNd's
    all-to-all goes through a scratch directory beside the output, gone when the run ends;
    under the ``scratch`` setting (CHUNKED_TENSOR_OPS_SCRATCH) when it is set, as for the
    service's jobs."""
    gather_module = sys.modules["ops.gather_nd.scratch_graph"]  # the scratch strategy's module

    used = []
    build_scratch = gather_module._build_scratch

    def recording(*args):
        used.append(Path(args[-1].url))
        return build_scratch(*args)

    monkeypatch.setattr(gather_module, "_build_scratch", recording)
    shared = tmp_path / "shared"
    if setting:
        shared.mkdir()
        monkeypatch.setenv("CHUNKED_TENSOR_OPS_SCRATCH", str(shared))
    points = POINTS.copy()
    if bad:
        points[33, 1] = 8
    xr.Dataset({"points": (("p", "q"), points)}).chunk({"p": 10}).to_zarr(tmp_path / "idx.zarr", zarr_format=3)
    out = tmp_path / "gathered.zarr"
    with dask.config.set({"array.chunk-size": "1KiB"}):
        code, _, err = main_in_process(capsys, "gather_nd", "--input", f"params={inputs / 'points.zarr'}",
                                       "--variable", "params=params", "--input", f"indices={tmp_path / 'idx.zarr'}",
                                       "--output", str(out), *QUICK)
    if setting:
        assert len(used) == 1 and used[0].parent == shared and used[0].name.startswith("run-"), used
        assert list(shared.iterdir()) == []
        shared.rmdir()
    else:
        assert len(used) == 1 and used[0].parent == tmp_path and used[0].name.startswith(".gathered.zarr.scratch-")
    if bad:
        assert code == 2, err  # bad input, found while computing
        assert "indices[33, 1] = 8 is out of range for dimension 1 of size 8" in err
    else:
        assert code == 0, err
        assert_same(read_output(out, "params").values, ops.gather_nd(PARAMS, points))  # named after params
    assert sorted(p.name for p in tmp_path.iterdir()) == ([] if bad else ["gathered.zarr"]) + ["idx.zarr"]
