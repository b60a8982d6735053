"""The exit codes of ``chunked-tensor-ops run`` and ``RunError``, the failure that carries one
(documented in docs/cli.md and the ``--help`` epilog)."""

from __future__ import annotations

OK, FAILED, USAGE, INPUT, CLUSTER = 0, 1, 2, 3, 4


class RunError(Exception):
    """A failure with its exit code and a one-line message for stderr."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


def usage(message: str) -> RunError:
    return RunError(USAGE, message)
