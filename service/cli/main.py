"""The command line: ``chunked-tensor-ops serve [flags]`` (also ``python -m service [flags]``)
and ``chunked-tensor-ops run OP --input IN.zarr --output OUT.zarr`` (also ``python -m service run``).

Every ``serve`` flag has an environment variable ``CHUNKED_TENSOR_OPS_<FLAG>``; a flag wins over it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
import warnings

from service.cli import run as run_command
from service.cli.run_errors import FAILED, USAGE, RunError
from service.settings import ENV_PREFIX, Settings


def _serve_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    add = parser.add_argument
    add("--host", help=f"address to listen on (default 127.0.0.1; {ENV_PREFIX}HOST)")
    add("--port", type=int, help=f"port (default 8000; {ENV_PREFIX}PORT)")
    add("--data-root", help=f"where arrays and job records live: a directory or s3://BUCKET/PREFIX "
                            f"(docs/storage.md; default ./data; {ENV_PREFIX}DATA_ROOT)")
    add("--scheduler", help=f"tcp://HOST:PORT of an existing Dask scheduler; default: an embedded "
                            f"LocalCluster ({ENV_PREFIX}SCHEDULER)")
    add("--token", help=f"require Authorization: Bearer TOKEN; every local user can read it in the process "
                        f"list: prefer --token-file or {ENV_PREFIX}TOKEN")
    add("--token-file", help=f"read the token from the first line of this file ({ENV_PREFIX}TOKEN_FILE)")
    add("--allowed-hosts", type=_names, metavar="HOST[:PORT],...",
        help=f"the Host header values to answer, * for any (default: the --host address and, for loopback, "
             f"localhost, 127.0.0.1 and [::1], with and without the port; any for 0.0.0.0; "
             f"{ENV_PREFIX}ALLOWED_HOSTS as a JSON list)")
    add("--cors-origins", type=_names, metavar="ORIGIN,...",
        help=f"origins whose web pages may call the API (default none; {ENV_PREFIX}CORS_ORIGINS as a JSON list)")
    add("--max-connections", type=int, help=f"connections served at once, more get 503 "
                                            f"(default 256; {ENV_PREFIX}MAX_CONNECTIONS)")
    add("--read-timeout", type=float, help=f"seconds a client may take to send its request's head or the next "
                                           f"piece of its body (default 30; {ENV_PREFIX}READ_TIMEOUT)")
    add("--dashboard", action="store_true",
        help="embedded cluster: start the Dask dashboard (127.0.0.1; /healthz links to it)")
    add("--n-workers", type=int, help=f"embedded cluster: worker processes (default 2; {ENV_PREFIX}N_WORKERS)")
    add("--threads-per-worker", type=int, help=f"embedded cluster: threads each ({ENV_PREFIX}THREADS_PER_WORKER)")
    add("--memory-limit", help=f"embedded cluster: memory limit per worker, e.g. 2GiB ({ENV_PREFIX}MEMORY_LIMIT)")
    add("--max-upload-bytes", type=int, help=f"largest upload ({ENV_PREFIX}MAX_UPLOAD_BYTES)")
    add("--max-inline-bytes", type=int, help=f"largest inline input or result ({ENV_PREFIX}MAX_INLINE_BYTES)")
    add("--log-level", default="info", help="uvicorn log level")
    return parser


def _names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


def settings_from(args: argparse.Namespace) -> Settings:
    given = {k: v for k, v in vars(args).items()
             if v is not None and k not in ("log_level", "command", "dashboard")}
    return Settings(**given)


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from service.api.app import create_app
    from service.api.edge import MAX_HEAD_BYTES, head_timed_protocol

    if args.token is not None:
        print("chunked-tensor-ops: warning: --token is visible to every local user in the process list; "
              f"use --token-file or {ENV_PREFIX}TOKEN", file=sys.stderr, flush=True)
    settings = settings_from(args)
    try:
        app = create_app(settings, dashboard=args.dashboard)
    except (OSError, ValueError) as error:  # the token file; its message never holds the token
        print(f"chunked-tensor-ops: error: {error}", file=sys.stderr)
        return USAGE
    print(f"chunked-tensor-ops: serving on http://{settings.host}:{settings.port} "
          f"(data root {settings.data_root_text()}, "
          f"{'scheduler ' + settings.scheduler if settings.scheduler else 'embedded Dask cluster'})", flush=True)
    uvicorn.run(app, host=settings.host, port=settings.port, log_level=args.log_level,
                # h11 always (httptools, when installed, would be chosen otherwise), with a deadline
                # on each request head and a bound on its size
                http=head_timed_protocol(settings.read_timeout), h11_max_incomplete_event_size=MAX_HEAD_BYTES,
                limit_concurrency=settings.max_connections, timeout_keep_alive=min(5.0, settings.read_timeout),
                # on SIGTERM, requests still open (a synchronous execution) get this long before the
                # app's shutdown stops their jobs; otherwise the service waits for them to finish
                timeout_graceful_shutdown=3, server_header=False)
    return 0


RUN_EPILOG = """\
parameters:
  --param NAME=VALUE   VALUE is JSON: block_size=2, paddings=[[1,1],[0,0]], align_output=true;
                       a value that is not JSON is taken as a string: mode=DCR, dst_dtype=float16
  array inputs         --input PATH is the operator's first array input (x, params, src);
                       others by role: --input indices=idx.zarr, --input deq_scale=scale.zarr,
                       or as a JSON value: --param deq_scale=0.5, --param indices=[[0,1],[2,3]]
  --variable NAME      the variable of a group input (--variable ROLE=NAME for another input)
  dims                 --param 'dims={"H":"row","W":"col"}' names the roles' dims (as the service)
  s3:// URLs           endpoint and keys from CHUNKED_TENSOR_OPS_S3_ENDPOINT_URL, _S3_KEY, _S3_SECRET
                       (or s3fs's own lookup: AWS_* variables, a profile, a role)

exit codes:
  0  done (or --dry-run printed the plan)
  1  the computation failed on the cluster
  2  usage or a bad parameter (the operator's own message), before any work is scheduled
  3  an input not found or not readable as Zarr, the output exists (see --overwrite),
     or the object store cannot be reached
  4  the Dask cluster is unreachable (or was lost while computing)
  130  interrupted (Ctrl-C or SIGTERM); the temporary output is removed
Errors are one line on stderr; --verbose adds the traceback. See docs/cli.md.
"""


def _run_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    add = parser.add_argument
    add("op", metavar="OP", help="the operator: depth_to_space, space_to_depth, space_to_batch, "
                                 "space_to_batch_nd, batch_to_space_nd, gather_nd, ascend_dequant")
    add("--input", action="append", default=[], metavar="[ROLE=]PATH",
        help="a Zarr array or group (v3, or v2), a path or a URL (s3://BUCKET/PREFIX); repeat with "
             "ROLE= for several array inputs")
    add("--output", required=True, metavar="PATH", help="the Zarr group to write: a path or a URL (s3://BUCKET/PREFIX)")
    add("--variable", action="append", default=[], metavar="[ROLE=]NAME",
        help="which variable of a group input to read (needed when it has several)")
    add("--output-variable", metavar="NAME",
        help=f"the output's variable (default: the input's variable, or '{run_command.RESULT_VARIABLE}')")
    add("--param", action="append", default=[], metavar="NAME=VALUE", help="an operator parameter, VALUE as JSON")
    add("--chunks", metavar="SPEC", help="read the first input in these chunks: 1,64,64,16 (-1: whole axis), "
                                         "y=64,x=64 or auto (default: its stored chunks)")
    add("--overwrite", action="store_true", help="replace an existing output")
    add("--dry-run", action="store_true", help="print the plan (chunks, tasks, bytes) and exit")
    add("--scheduler", metavar="tcp://HOST:PORT", help="an existing Dask scheduler (its workers must see local "
                                                       "input and output paths); default: an embedded LocalCluster")
    add("--scheduler-timeout", type=float, metavar="SECONDS",
        help="how long to wait for the scheduler (default 5)")
    add("--n-workers", type=int, metavar="N", help="embedded cluster: worker processes (default 2)")
    add("--threads-per-worker", type=int, metavar="N", help="embedded cluster: threads each (default 1)")
    add("--memory-limit", metavar="SIZE", help="embedded cluster: memory limit per worker, e.g. 2GiB (default 2GiB)")
    add("--in-process", action="store_true",
        help="embedded cluster: workers as threads of this process (quick start, small inputs)")
    add("--dashboard", action="store_true", help="print the link to the Dask dashboard (an embedded cluster "
                                                 "starts one only then)")
    add("--quiet", action="store_true", help="no progress bar")
    add("--verbose", action="store_true", help="tracebacks with errors")
    return parser


def _one_line_errors(parser: argparse.ArgumentParser) -> None:
    """Usage errors of ``run`` as one line on stderr, exit 2 (argparse also prints the usage)."""
    def error(message: str):
        parser.exit(USAGE, f"{parser.prog}: error: {message}\n")

    parser.error = error


@contextlib.contextmanager
def _quiet_dask(quiet: bool):
    """Dask's own logs (a worker's "Compute Failed" with its traceback, shutdown notices) off:
    the one-line error says what failed; --verbose keeps them. Worker processes inherit the
    environment variable (and a nanny hands its worker the config); in-process workers and
    the scheduler share the loggers. All restored afterwards (``main`` may run in a process
    that goes on)."""
    import logging

    import dask

    if not quiet:
        yield
        return
    logger = logging.getLogger("distributed")
    level, env = logger.level, os.environ.get("DASK_LOGGING__DISTRIBUTED")
    os.environ["DASK_LOGGING__DISTRIBUTED"] = "critical"
    logger.setLevel(logging.CRITICAL)
    try:
        with dask.config.set({"logging.distributed": "critical"}):
            yield
    finally:
        logger.setLevel(level)
        if env is None:
            os.environ.pop("DASK_LOGGING__DISTRIBUTED", None)
        else:
            os.environ["DASK_LOGGING__DISTRIBUTED"] = env


def _interrupted(signum, frame):
    raise KeyboardInterrupt


def run(args: argparse.Namespace) -> int:
    """``chunked-tensor-ops run``: exit codes as in RUN_EPILOG; one-line errors on stderr."""
    given = {"scheduler": args.scheduler, "scheduler_timeout": args.scheduler_timeout,
             "n_workers": args.n_workers, "threads_per_worker": args.threads_per_worker,
             "memory_limit": args.memory_limit, "cluster_processes": False if args.in_process else None}
    try:
        settings = Settings(**{k: v for k, v in given.items() if v is not None})
    except ValueError as error:  # pydantic: e.g. --n-workers 0
        print(f"chunked-tensor-ops run: error: {error}".replace("\n", " "), file=sys.stderr)
        return USAGE
    # SIGTERM cleans up as Ctrl-C does (no temporary output left); the previous handler is back after
    previous = signal.signal(signal.SIGTERM, _interrupted) if threading.current_thread() is threading.main_thread() \
        else None
    try:
        with _quiet_dask(not args.verbose), warnings.catch_warnings():
            # xarray's consolidated metadata in Zarr v3 is not in the spec yet; nothing for the user to do
            warnings.filterwarnings("ignore", message="Consolidated metadata is currently not part")
            return run_command.run(args, settings)
    except RunError as error:
        if args.verbose:
            import traceback

            traceback.print_exc()
        print(f"chunked-tensor-ops run: error: {error}", file=sys.stderr)
        return error.code
    except KeyboardInterrupt:
        print("chunked-tensor-ops run: interrupted; no output was written", file=sys.stderr)
        return 130
    except Exception as error:
        if args.verbose:
            raise
        print(f"chunked-tensor-ops run: error: {type(error).__name__}: {error}".replace("\n", " "),
              file=sys.stderr)
        return FAILED
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def main(argv: list[str] | None = None) -> int:
    """``chunked-tensor-ops serve ...`` or ``chunked-tensor-ops run ...``."""
    parser = argparse.ArgumentParser(prog="chunked-tensor-ops", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    _serve_parser(commands.add_parser("serve", help="run the REST service"))
    runner = _run_parser(commands.add_parser(
        "run", help="run one operator Zarr to Zarr on a Dask cluster, without the service",
        description="Run one operator on a Zarr input and write a Zarr output, on an embedded Dask "
                    "cluster or an existing one (--scheduler).",
        epilog=RUN_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter))
    _one_line_errors(runner)
    args = parser.parse_args(argv)
    return run(args) if args.command == "run" else serve(args)


def serve_main(argv: list[str] | None = None) -> int:
    """``python -m service ...``: the same flags as ``chunked-tensor-ops serve``; ``python -m
    service run ...`` is ``chunked-tensor-ops run ...``."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["run"]:
        return main(argv)
    parser = _serve_parser(argparse.ArgumentParser(prog="python -m service", description="Run the REST service."))
    return serve(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
