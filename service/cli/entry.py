"""The ``chunked-tensor-ops`` console script. Importing the command line takes seconds (xarray,
zarr, distributed); a Ctrl-C meanwhile ends in one line, as one during a run does, instead of
an import traceback."""

from __future__ import annotations

import sys

INTERRUPTED = 130  # 128 + SIGINT, as shells report it


def main() -> int:
    """``service.cli.main.main``, imported here so that an interrupt while importing it is caught."""
    try:
        from service.cli.main import main as command_line
    except KeyboardInterrupt:
        print("chunked-tensor-ops: interrupted", file=sys.stderr)
        return INTERRUPTED
    return command_line()
