"""The command line and settings: flags, environment variables, the console script."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from service.cli.main import _serve_parser, settings_from
from service.settings import Settings


def _parse(argv):
    return _serve_parser(argparse.ArgumentParser()).parse_args(argv)


@pytest.mark.smoke
def test_environment_variables_set_every_setting_and_flags_win(monkeypatch, tmp_path):
    monkeypatch.setenv("CHUNKED_TENSOR_OPS_PORT", "9001")
    monkeypatch.setenv("CHUNKED_TENSOR_OPS_SCHEDULER", "tcp://127.0.0.1:8786")
    monkeypatch.setenv("CHUNKED_TENSOR_OPS_MAX_INLINE_BYTES", "1024")
    monkeypatch.setenv("CHUNKED_TENSOR_OPS_DATA_ROOT", str(tmp_path))
    from_env = settings_from(_parse([]))
    assert (from_env.port, from_env.scheduler, from_env.max_inline_bytes) == (9001, "tcp://127.0.0.1:8786", 1024)
    assert from_env.data_root == tmp_path
    flagged = settings_from(_parse(["--port", "9002", "--token", "t", "--n-workers", "3"]))
    assert (flagged.port, flagged.token, flagged.n_workers, flagged.scheduler) == (9002, "t", 3, "tcp://127.0.0.1:8786")


def test_defaults_are_a_local_embedded_service():
    s = Settings(_env_file=None)
    assert (s.host, s.port, s.scheduler, s.token) == ("127.0.0.1", 8000, None, None)


def test_console_script_and_module_share_the_flags():
    script = Path(sys.executable).parent / "chunked-tensor-ops"
    as_script = subprocess.run([str(script), "serve", "--help"], capture_output=True, text=True, timeout=60)
    as_module = subprocess.run([sys.executable, "-m", "service", "--help"], capture_output=True, text=True,
                               timeout=60)
    assert as_script.returncode == 0 and as_module.returncode == 0, (as_script.stderr, as_module.stderr)
    for flag in ("--host", "--port", "--data-root", "--scheduler", "--token", "--memory-limit"):
        assert flag in as_script.stdout and flag in as_module.stdout
    assert "CHUNKED_TENSOR_OPS_SCHEDULER" in as_module.stdout


def _sigint_as_in_a_terminal():
    """In the child before it starts: SIGINT's default action, as a terminal's shell gives it.
    A process started with SIGINT ignored keeps it ignored (Python too), and the tests may run
    with it ignored: a shell without job control starts a command put in the background
    (``make test &``, ``nohup ... &``) so, and its children inherit it. The run then went on
    to its end and exited 0."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_during_a_run_ends_in_one_line(tmp_path):
    """Ctrl-C reaches every process of the terminal's foreground group: the run's own and its
    embedded cluster's workers, which each printed a traceback (30 lines and more) after the
    run's one-line message. Now the message is all."""
    import os
    import signal
    import time

    import zarr

    # 1 GiB of a stored fill value: nothing on disk to read, seconds of work to interrupt (on a
    # loaded machine half of it took 1.4 s from the bar's first line, and the run ended first)
    zarr.create_array(str(tmp_path / "in.zarr"), shape=(64, 512, 512, 16), chunks=(1, 256, 256, 16),
                      dtype="float32", fill_value=1.0)
    script = Path(sys.executable).parent / "chunked-tensor-ops"
    run = subprocess.Popen([str(script), "run", "depth_to_space", "--input", str(tmp_path / "in.zarr"), "--param",
                            "block_size=2", "--output", str(tmp_path / "out.zarr"), "--n-workers", "2"],
                           stderr=subprocess.PIPE, text=True, start_new_session=True,
                           preexec_fn=_sigint_as_in_a_terminal)
    try:
        first = run.stderr.readline()  # the progress bar's first line: the workers are computing
        assert "%" in first or "tasks" in first, first
        time.sleep(0.2)
        os.killpg(run.pid, signal.SIGINT)  # as the terminal does: to the whole group
        rest = run.communicate(timeout=120)[1]
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    lines = [line for line in rest.splitlines() if line.strip() and "%" not in line]
    assert run.returncode == 130, rest
    assert lines == ["chunked-tensor-ops run: interrupted; no output was written"], rest
    assert not (tmp_path / "out.zarr").exists()


def test_a_run_does_not_import_the_web_framework():
    """What ``chunked-tensor-ops run`` imports to run (its modules, the cluster, the wait loop)
    leaves FastAPI and Starlette out: a run pays for no web service at start-up."""
    code = ("import sys; import service.cli.main, service.cli.run, service.jobs.cluster, service.jobs.runner; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('fastapi', 'starlette', 'uvicorn')))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                            cwd=Path(__file__).resolve().parents[3]).stdout.strip()
    assert loaded == "[]", loaded
