"""BatchToSpaceND's exchange through a scratch store (``ops.scratch``, ops/_scratch.py): the
two task functions of the plan that reads every source chunk once when a task cannot hold
the P chunks an output block takes a part of.

With the batch axis chunked, an output block takes 1/P of one chunk of each of the P groups,
and each of those chunks feeds P output blocks. Without a scratch store the plan either holds
P chunks in one task (a bundle) or reads every chunk P times. Through a scratch store a split
task reads a chunk once and writes the part each output block takes to a file of its own; an
output task reads its parts back one at a time, copies each to its place in the block
(``kernel.place_batch_part``) and removes them. A task holds about one chunk, or one output
block and one part, and the store holds the parts written and not yet taken (at most the input's size).
An output block computed again after it took its parts (its worker died before the result was
stored) reads them from the input's source instead.
"""

from __future__ import annotations

import itertools

import numpy as np

from ops._block_reads import Regions
from ops._scratch import Scratch
from ops.space_batch.kernel import _space_shape, place_batch_part


def split_to_scratch(chunk: np.ndarray, run: Scratch, parts) -> int:
    """Write each part of ``chunk`` that an output block takes to its own file under ``run``.

    ``parts`` are ``(file name, slices of chunk)``. Returns the number of files written (the
    output tasks wait on this task, not on its result).
    """
    for name, slices in parts:
        run.write(name, memoryview(np.ascontiguousarray(chunk[slices])).cast("B"))
    return len(parts)


def batch_to_space_from_scratch(written, run: Scratch, boxes, dtype, block_shape, crops, source,
                                regions: Regions) -> np.ndarray:
    """One output block from the P boxes of input rows it takes (one per group, in group
    order), cropped by ``crops``; the files of their parts are removed once it is made.

    ``boxes``: ``(shape, parts)`` per group, each part ``(file name, shape, offsets in the
    box)``. ``written``: the results of the split tasks that wrote the parts (only waited on).
    ``regions``: where each part lies in ``source`` (the input's source array), in the order
    of ``boxes``: a part whose file is gone (the block is computed again after it took its
    parts) is read from there.
    """
    box = boxes[0][0]  # every group's box has this shape; the P of them make the input
    y = np.empty(_space_shape((box[0] * len(boxes), *box[1:]), block_shape, crops), dtype)
    # Each part goes straight to its place in the block (no box assembled first), read one at
    # a time: the task holds the block and one part.
    numbered = itertools.count()
    for (_, parts), j in zip(boxes, np.ndindex(*block_shape)):
        for name, shape, offsets in parts:
            k = next(numbered)
            try:
                part = np.frombuffer(run.read_view(name), dtype=dtype).reshape(shape)
            except FileNotFoundError:
                part = regions.read(source, k)
            place_batch_part(y, part, offsets, j, block_shape, [before for before, _ in crops])
    # Each part is taken by this block alone: the store holds what is still to be taken.
    run.remove_files([name for _, parts in boxes for name, _, _ in parts])
    return y
