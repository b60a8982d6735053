"""Per-call limits on the graphs the operators build: the blocks of an output, the tasks of a
graph and the bytes of an output, checked from chunk metadata before any graph is built.

The limits live in a ``contextvars.ContextVar``: each thread (and each asyncio task) sees the
limits set in its own context, so concurrent builds with different limits do not see each
other's, and no lock is taken.
"""

from __future__ import annotations

import contextlib
import math
from contextvars import ContextVar
from dataclasses import dataclass, replace

from ops.errors import InvalidArgument

# More blocks than this is no graph Dask can schedule (each block is at least one task).
MAX_BLOCKS = 10_000_000


@dataclass(frozen=True)
class Limits:
    """The limits in force: None is no limit."""

    max_blocks: int | None = MAX_BLOCKS
    max_tasks: int | None = None
    max_bytes: int | None = None


_current: ContextVar[Limits] = ContextVar("ops_limits", default=Limits())


class LimitExceeded(InvalidArgument):
    """A call whose graph or output would pass a limit of ``ops.limits``.

    Attributes
    ----------
    limit : str
        The limit passed: ``"max_blocks"``, ``"max_tasks"`` or ``"max_bytes"``.
    count, allowed : int
        What the call would need, and the limit.
    """

    def __init__(self, message: str, limit: str, count: int, allowed: int):
        super().__init__(message)
        self.limit, self.count, self.allowed = limit, count, allowed


def _checked(name: str, value):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer or None, got {value!r}")
    return value


@contextlib.contextmanager
def limits(*, max_blocks: int | None = None, max_tasks: int | None = None, max_bytes: int | None = None):
    """Limit the graphs the operators build inside the ``with`` block.

    Every operator counts the blocks of its output and estimates the tasks of its graph from
    the chunks of its inputs, before it builds anything, and raises ``LimitExceeded`` (an
    ``InvalidArgument``) when they pass these limits: a refusal costs no more than the count.
    The limits hold for the calls made in the current thread (or asyncio task) only, so
    concurrent builds in other threads keep theirs; nested blocks override the limits they
    name and restore the enclosing ones on exit.

    Parameters
    ----------
    max_blocks : int, optional
        Blocks of an operator's output. Unset (outside any block): 10,000,000.
    max_tasks : int, optional
        Tasks of the graph an operator adds (an estimate from the chunks: for GatherNd with
        lazy indices, about 4 x (indices blocks + params blocks)). Unset: no limit.
    max_bytes : int, optional
        Bytes of an operator's output, checked where the output's shape and dtype are known
        before the graph is built. Unset: no limit.

    Yields
    ------
    Limits
        The limits in force inside the block.

    Raises
    ------
    ValueError
        A limit that is not a positive integer.

    Examples
    --------
    >>> import dask.array as da, ops
    >>> x = da.zeros((1, 4, 1), chunks=1)
    >>> with ops.limits(max_blocks=1000):
    ...     ops.space_to_batch_nd(x, [1], [[500000, 0]])
    Traceback (most recent call last):
        ...
    ops._limits.LimitExceeded: space_to_batch_nd: the output would have 500004 blocks, more than the 1000 allowed (max_blocks); give the input larger chunks, or less padding
    """
    given = {"max_blocks": max_blocks, "max_tasks": max_tasks, "max_bytes": max_bytes}
    changes = {name: _checked(name, value) for name, value in given.items() if value is not None}
    current = replace(_current.get(), **changes)
    token = _current.set(current)
    try:
        yield current
    finally:
        _current.reset(token)


def current() -> Limits:
    """The limits in force in this context."""
    return _current.get()


def check(op: str, blocks: int, tasks: int | None = None, fix: str = "give the input larger chunks") -> None:
    """Refuse a graph of ``blocks`` output blocks and about ``tasks`` tasks past the limits.

    ``fix`` says how the caller gets under them; the message names the operator, the count
    and the limit."""
    now = _current.get()
    for limit, what, count in (("max_blocks", "the output would have", blocks),
                               ("max_tasks", "the graph would have about", tasks)):
        allowed = getattr(now, limit)
        if count is not None and allowed is not None and count > allowed:
            unit = limit.removeprefix("max_")
            raise LimitExceeded(f"{op}: {what} {count} {unit}, more than the {allowed} allowed ({limit}); {fix}",
                                limit, count, allowed)


def check_bytes(op: str, shape, itemsize: int) -> None:
    """Refuse an output of ``shape`` and ``itemsize`` past ``max_bytes``."""
    allowed = _current.get().max_bytes
    nbytes = math.prod(shape) * itemsize
    if allowed is not None and nbytes > allowed:
        raise LimitExceeded(f"{op}: the output would be {nbytes} bytes, more than the {allowed} allowed (max_bytes)",
                            "max_bytes", nbytes, allowed)
