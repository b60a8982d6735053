"""A graph layer of several stages whose tasks are made only when the graph is materialised
(a ``LazyLayer`` whose keys and count are known without making them).

Dask's own array operations build in constant time because their layers are symbolic: a
``Blockwise`` layer knows how to make the task of any block and makes them all only when the
graph is optimised or run. ``StagedLayer`` does the same for a plan of several stages (its
intermediate keys included): building it costs the description of its stages, and its task
count is arithmetic, so neither a call nor ``len(graph)`` loops over blocks.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ops._lazy_layer import LazyLayer


def unravel(flat: int, shape) -> tuple[int, ...]:
    """``np.unravel_index`` of one int, in Python: stages call it once per task they make,
    where NumPy's round trip through arrays would cost more than the task."""
    index = []
    for n in reversed(shape):
        flat, i = divmod(flat, n)
        index.append(i)
    return tuple(reversed(index))


def ravel(index, shape) -> int:
    """``np.ravel_multi_index`` of one index, in Python (C order; 0 for a 0-d shape)."""
    flat = 0
    for i, n in zip(index, shape):
        flat = flat * n + i
    return flat


@dataclass(frozen=True)
class Stage:
    """The tasks ``(name, *index) -> make(index)`` for every index of the grid ``shape``.

    ``make`` gets the index as a tuple of ints and returns a task (Dask's tuple form).
    """

    name: str
    shape: tuple[int, ...]
    make: Callable[[tuple[int, ...]], object]

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def keys(self):
        return ((self.name, *index) for index in itertools.product(*map(range, self.shape)))


class StagedLayer(LazyLayer):
    """The tasks of ``stages``, made on first use; ``literals`` are data keys (key -> value).

    Every key of every stage is an output key (Dask culls a layer by following the keys it
    lists there, so intermediates must be listed too); listing them makes no task.
    """

    def __init__(self, stages: list[Stage], literals: dict | None = None):
        stages, literals = list(stages), dict(literals or {})
        super().__init__(stages[-1].name, stages[-1].shape, _staged_tasks, stages, literals)
        self.stages, self.literals = stages, literals

    def get_output_keys(self):
        return {*self.literals, *(key for stage in self.stages for key in stage.keys())}

    def __len__(self) -> int:
        return len(self.literals) + sum(stage.size for stage in self.stages)

    def __contains__(self, key) -> bool:
        if self._tasks is not None:
            return key in self._tasks
        if key in self.literals:
            return True
        if isinstance(key, tuple) and key:
            for stage in self.stages:
                if key[0] == stage.name and len(key) == 1 + len(stage.shape):
                    return all(isinstance(i, (int, np.integer)) and 0 <= i < n for i, n in zip(key[1:], stage.shape))
        return False

    def __repr__(self) -> str:
        state = "materialised" if self.is_materialized() else "lazy"
        return f"StagedLayer<{self.stages[-1].name}, {len(self.stages)} stages, {len(self)} tasks, {state}>"


def _staged_tasks(stages: list[Stage], literals: dict) -> dict:
    """The tasks of a ``StagedLayer``: its literals, then every stage's task of every index."""
    tasks = dict(literals)
    for stage in stages:
        make, name = stage.make, stage.name
        for index in itertools.product(*map(range, stage.shape)):
            tasks[(name, *index)] = make(index)
    return tasks
