"""BatchToSpaceND's plan through a scratch store: the tasks of ``_batch_to_space_scratch_tasks``
(ops/space_batch/graph_batch_to_space.py picks it; the task functions: through_scratch.py).

An output block takes, of each of the P groups, a box of input rows: on the batch axis its
batch rows of that group, on each spatial axis the rows ``t`` with ``t*b + j - crop`` in the
block's output rows, on the other axes the block's own. A box may lie across several input
chunks (a crop before the first row shifts the boxes off the chunk boundaries). Each input
chunk is read once, by a split task that writes its intersection with every box to a file of
its own; the output task copies each part of its P boxes straight to its place in the block.
The output blocks can so have any chunks: the Zarr-regular ones counted from the first kept
row when a crop would make the first block short (no rechunk to store the result).
"""

from __future__ import annotations

import bisect
import itertools

from ops._lazy_layer import static
from ops.space_batch.through_scratch import batch_to_space_from_scratch, split_to_scratch


def _bounds(chunks) -> list[int]:
    return list(itertools.accumulate(chunks, initial=0))


def _intersections(bounds: list[int], start: int, stop: int) -> list[tuple[int, slice, int]]:
    """Input rows [start, stop) on one axis as (chunk, slice of the chunk, offset in the box)."""
    if start >= stop:
        return []
    first = bisect.bisect_right(bounds, start) - 1
    parts = []
    for c in range(first, len(bounds) - 1):
        lo, hi = max(start, bounds[c]), min(stop, bounds[c + 1])
        if lo >= hi:
            break
        parts.append((c, slice(lo - bounds[c], hi - bounds[c]), lo - start))
    return parts


def _spatial_rows(out_start: int, out_stop: int, b: int, crop: int) -> tuple[int, int, list[int]]:
    """Output rows [out_start, out_stop) of a spatial axis: the input rows [t0, t1) they come
    from and the block's own crops [before, after] of them."""
    t0 = (out_start + crop) // b
    t1 = -(-(out_stop + crop) // b)
    return t0, t1, [out_start + crop - t0 * b, t1 * b - out_stop - crop]


def scratch_tasks(plan, out_chunks, crops) -> dict:
    """The split and output tasks of BatchToSpaceND of ``plan`` (whose ``x`` is read from its
    source) with output blocks of ``out_chunks``; ``crops`` are the call's."""
    x, block_shape, run = plan.x, list(plan.block_shape), static(plan.scratch)
    m, groups = len(block_shape), plan.groups
    batch = sum(x.chunks[0]) // groups  # the rows of each group
    in_bounds = [_bounds(c) for c in x.chunks]
    split_name = f"batch_to_space_nd-split-{plan.token}"
    splits: dict[tuple, list] = {}  # input chunk -> [(file, slices of the chunk)]
    outputs = []
    out_bounds = [_bounds(c) for c in out_chunks]
    for number, index in enumerate(itertools.product(*map(range, map(len, out_chunks)))):
        ranges = [(out_bounds[a][k], out_bounds[a][k + 1]) for a, k in enumerate(index)]
        spatial = [_spatial_rows(*ranges[1 + i], b, lo) for i, (b, (lo, _)) in enumerate(zip(block_shape, crops))]
        # Per axis, the pieces of the box on that axis; the batch axis's depend on the group.
        axes = [_intersections(in_bounds[1 + i], t0, t1) for i, (t0, t1, _) in enumerate(spatial)]
        axes += [_intersections(in_bounds[a], *ranges[a]) for a in range(1 + m, len(out_chunks))]
        shape_rest = [t1 - t0 for t0, t1, _ in spatial] + [stop - start for start, stop in ranges[1 + m :]]
        boxes = []
        for g in range(groups):
            start, stop = g * batch + ranges[0][0], g * batch + ranges[0][1]
            parts = []
            for p, pieces in enumerate(itertools.product(_intersections(in_bounds[0], start, stop), *axes)):
                chunk = tuple(c for c, _, _ in pieces)
                file = f"{plan.scratch_prefix}-{number}-{g}-{p}"
                slices = tuple(s for _, s, _ in pieces)
                splits.setdefault(chunk, []).append((file, slices))
                shape = tuple(s.stop - s.start for s in slices)
                parts.append((file, shape, tuple(o for _, _, o in pieces), slices, chunk))
            boxes.append(((stop - start, *shape_rest), parts))
        outputs.append((index, [crop for _, _, crop in spatial], boxes))
    split_keys = {chunk: (split_name, n) for n, chunk in enumerate(splits)}
    layer = {split_keys[chunk]: (split_to_scratch, plan.source.read(chunk), run, static(files))
             for chunk, files in splits.items()}
    for index, block_crops, boxes in outputs:
        written = list(dict.fromkeys(split_keys[part[-1]] for _, parts in boxes for part in parts))
        recipe = [(shape, [part[:3] for part in parts]) for shape, parts in boxes]
        # Where each part lies in the source, in recipe order: a block computed again after it
        # took (and removed) its parts, as when its worker died before the result was stored,
        # reads them from there instead.
        every_part = [part for _, parts in boxes for part in parts]
        sources = plan.source.regions([part[-1] for part in every_part], [part[-2] for part in every_part])
        layer[(plan.name, *index)] = (batch_to_space_from_scratch, written, run, static(recipe), x.dtype,
                                      static(block_shape), static(block_crops), plan.source.source, sources)
    return layer
