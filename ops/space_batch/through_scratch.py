"""BatchToSpaceND's exchange through a scratch store (``ops.scratch``, ops/_scratch.py): the
two task functions of the plan that reads every source chunk once when a task cannot hold
the P chunks an output block takes a part of.

With the batch axis chunked, an output block takes 1/P of one chunk of each of the P groups,
and each of those chunks feeds P output blocks. Without a scratch store the plan either holds
P chunks in one task (a bundle) or reads every chunk P times. Through a scratch store a split
task reads a chunk once and writes the part each output block takes to a file of its own; an
output task reads its P parts back, interleaves them and removes them. A task holds about one
chunk, and the store holds the parts written and not yet taken (at most the input's size).
"""

from __future__ import annotations

import numpy as np

from ops._scratch import Scratch
from ops.space_batch.kernel import batch_to_space_nd_kernel


def split_to_scratch(chunk: np.ndarray, run: Scratch, parts) -> int:
    """Write each part of ``chunk`` that an output block takes to its own file under ``run``.

    ``parts`` are ``(file name, slices of chunk)``. Returns the number of files written (the
    output tasks wait on this task, not on its result).
    """
    for name, slices in parts:
        run.write(name, memoryview(np.ascontiguousarray(chunk[slices])).cast("B"))
    return len(parts)


def batch_to_space_from_scratch(written, run: Scratch, boxes, dtype, block_shape, crops) -> np.ndarray:
    """One output block from the P boxes of input rows it takes (one per group, in group
    order), cropped by ``crops``; the files of their parts are removed once it is made.

    ``boxes``: ``(shape, parts)`` per group, each part ``(file name, shape, offsets in the
    box)``. ``written``: the results of the split tasks that wrote the parts (only waited on).
    """
    groups = []
    for shape, parts in boxes:
        if len(parts) == 1:  # the box is one part (no crop shifting it across chunks)
            (name, _, _), = parts
            groups.append(np.frombuffer(run.read(name), dtype=dtype).reshape(shape))
            continue
        box = np.empty(shape, dtype)
        for name, part_shape, offsets in parts:
            where = tuple(slice(o, o + n) for o, n in zip(offsets, part_shape))
            box[where] = np.frombuffer(run.read(name), dtype=dtype).reshape(part_shape)
        groups.append(box)
    out = batch_to_space_nd_kernel(groups, block_shape, crops)
    # Each part is taken by this block alone: the store holds what is still to be taken.
    run.remove_files([name for _, parts in boxes for name, _, _ in parts])
    return out
