"""The command line: ``chunked-tensor-ops serve [flags]`` (also ``python -m service [flags]``).

Every flag has an environment variable ``CHUNKED_TENSOR_OPS_<FLAG>``; a flag wins over it.
"""

from __future__ import annotations

import argparse
import sys

from service.settings import ENV_PREFIX, Settings


def _serve_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    add = parser.add_argument
    add("--host", help=f"address to listen on (default 127.0.0.1; {ENV_PREFIX}HOST)")
    add("--port", type=int, help=f"port (default 8000; {ENV_PREFIX}PORT)")
    add("--data-root", help=f"where arrays and job records live (default ./data; {ENV_PREFIX}DATA_ROOT)")
    add("--scheduler", help=f"tcp://HOST:PORT of an existing Dask scheduler; default: an embedded "
                            f"LocalCluster ({ENV_PREFIX}SCHEDULER)")
    add("--token", help=f"require Authorization: Bearer TOKEN ({ENV_PREFIX}TOKEN)")
    add("--n-workers", type=int, help=f"embedded cluster: worker processes (default 2; {ENV_PREFIX}N_WORKERS)")
    add("--threads-per-worker", type=int, help=f"embedded cluster: threads each ({ENV_PREFIX}THREADS_PER_WORKER)")
    add("--memory-limit", help=f"embedded cluster: memory limit per worker, e.g. 2GiB ({ENV_PREFIX}MEMORY_LIMIT)")
    add("--max-upload-bytes", type=int, help=f"largest upload ({ENV_PREFIX}MAX_UPLOAD_BYTES)")
    add("--max-inline-bytes", type=int, help=f"largest inline input or result ({ENV_PREFIX}MAX_INLINE_BYTES)")
    add("--log-level", default="info", help="uvicorn log level")
    return parser


def settings_from(args: argparse.Namespace) -> Settings:
    given = {k: v for k, v in vars(args).items() if v is not None and k not in ("log_level", "command")}
    return Settings(**given)


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from service.app import create_app

    settings = settings_from(args)
    print(f"chunked-tensor-ops: serving on http://{settings.host}:{settings.port} "
          f"(data root {settings.data_root.resolve()}, "
          f"{'scheduler ' + settings.scheduler if settings.scheduler else 'embedded Dask cluster'})", flush=True)
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level=args.log_level)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``chunked-tensor-ops serve ...``."""
    parser = argparse.ArgumentParser(prog="chunked-tensor-ops", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    _serve_parser(commands.add_parser("serve", help="run the REST service"))
    args = parser.parse_args(argv)
    return serve(args)


def serve_main(argv: list[str] | None = None) -> int:
    """``python -m service ...``: the same flags as ``chunked-tensor-ops serve``."""
    parser = _serve_parser(argparse.ArgumentParser(prog="python -m service", description="Run the REST service."))
    return serve(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
