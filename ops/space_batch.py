"""SpaceToBatch(ND) and BatchToSpaceND: the NumPy kernels and the Dask builders, side by side.

Both operators pair a *space* array ``[B, s_1..s_M, rest...]`` with a *batch* array
``[P*B, t_1..t_M, rest...]`` (``P = prod(block_shape)``): batch group ``g`` (block offsets
``j``, ``g = ravel(j)``) holds the space rows ``r`` with ``r + offset = t*b + j`` on every
spatial axis, where ``offset`` is the leading padding (SpaceToBatch) or leading crop
(BatchToSpace). Away from a partial first and last block that pairing is a plain reshape and
transpose of both arrays, so each kernel is a few ``copy_into`` calls over views
(``_pairs``); padding is never materialised (the batch side starts as zeros) and cropped rows
are never read.

Chunk plans (DESIGN.md):
- SpaceToBatchND: spatial chunks are aligned so that every interior boundary falls on a block
  boundary of the padded array; each input block then is a complete SpaceToBatchND problem
  with its own share of the padding, giving P output blocks (one per group, each holding the
  input's batch chunks). Output rows that are pure padding are separate zero blocks that read
  no input, chunked like the neighbouring data blocks.
- BatchToSpaceND: batch chunks are aligned to the group size B so no chunk straddles two
  groups; each output block interleaves the same block from each of the P groups. Crops only
  trim edge blocks; input blocks that are cropped away entirely are not read.
"""

from __future__ import annotations

import itertools
import math

import dask.array as da
import numpy as np
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph

from ops import _chunks, _lazy, _validate
from ops._copy import copy_into
from ops.errors import InvalidArgument
from schemas import BatchToSpaceNDParams, SpaceToBatchNDParams, SpaceToBatchParams

# ---------------------------------------------------------------------------------------------
# NumPy kernels


def _axis_pieces(length: int, offset: int, b: int):
    """Split space rows [0, length) into runs (start, K, L, t0, j0): row start + k*L + l pairs
    with batch-side row t0 + k at block offset j0 + l. A partial first block, the whole
    blocks (L == b) and a partial last block: at most three runs."""
    pieces = []
    head = min(length, (-offset) % b)
    if head:
        pieces.append((0, 1, head, offset // b, offset % b))
    whole = (length - head) // b
    if whole:
        pieces.append((head, whole, b, (head + offset) // b, 0))
    tail_start = head + whole * b
    if tail_start < length:
        pieces.append((tail_start, 1, length - tail_start, (tail_start + offset) // b, 0))
    return pieces


def _boxes(space: np.ndarray, batch: np.ndarray, block_shape, offsets):
    """Equal-shape (space view, batch view) pairs that together pair every element once.

    ``batch`` is split into ``[b_1..b_M, B, t_1..t_M, rest]`` (its batch index is the group
    index times B plus b); each combination of per-axis runs is then one view on each side,
    so a whole operator is at most 3**M copies, each streamed in one pass.
    """
    m = len(block_shape)
    rows = space.shape[0]
    rest = space.shape[1 + m :]
    split = batch.reshape(*block_shape, rows, *batch.shape[1:])
    # From [L_1..L_M, B, K_1..K_M, rest] to the space view's [B, K_1, L_1, ..., rest].
    order = [m, *(a for i in range(m) for a in (m + 1 + i, i)), *range(2 * m + 1, split.ndim)]
    axes = [_axis_pieces(space.shape[1 + i], offsets[i], b) for i, b in enumerate(block_shape)]
    for runs in itertools.product(*axes):
        space_index = (slice(None), *(slice(r, r + k * n) for r, k, n, _, _ in runs))
        space_view = space[space_index].reshape(rows, *(v for _, k, n, _, _ in runs for v in (k, n)), *rest)
        batch_index = (
            *(slice(j, j + n) for _, _, n, _, j in runs),
            slice(None),
            *(slice(t, t + k) for _, k, _, t, _ in runs),
        )
        yield space_view, split[batch_index].transpose(order)


def _lattice(space_len: int, offset: int, b: int, j: int) -> tuple[slice, slice]:
    """Slices pairing space rows r with batch-side rows t where r + offset == t*b + j."""
    first = (j - offset) % b
    count = max(0, -(-(space_len - first) // b))
    t0 = (first + offset - j) // b
    return slice(first, first + (count - 1) * b + 1 if count else first, b), slice(t0, t0 + count)


def _pairs(space: np.ndarray, batch, block_shape, offsets):
    """Equal-shape (space view, batch view) pairs covering every element.

    ``batch`` is one array (a whole input or block: ``_boxes``), or the list of its P groups
    held in separate arrays (the blocks a Dask BatchToSpaceND task receives): one strided
    view per group.
    """
    if not isinstance(batch, list):
        yield from _boxes(space, batch, block_shape, offsets)
        return
    for group, j in zip(batch, np.ndindex(*block_shape)):
        space_index, group_index = [slice(None)], [slice(None)]
        for axis, (b, offset, jj) in enumerate(zip(block_shape, offsets, j), start=1):
            s, t = _lattice(space.shape[axis], offset, b, jj)
            space_index.append(s)
            group_index.append(t)
        yield space[tuple(space_index)], group[tuple(group_index)]


def _batch_shape(shape, block_shape, paddings) -> tuple[int, ...]:
    m = len(block_shape)
    spatial = [
        (shape[1 + i] + paddings[i][0] + paddings[i][1]) // block_shape[i] for i in range(m)
    ]
    return (shape[0] * math.prod(block_shape), *spatial, *shape[1 + m :])


def _space_shape(shape, block_shape, crops) -> tuple[int, ...]:
    m = len(block_shape)
    spatial = [shape[1 + i] * block_shape[i] - crops[i][0] - crops[i][1] for i in range(m)]
    return (shape[0] // math.prod(block_shape), *spatial, *shape[1 + m :])


def space_to_batch_nd_kernel(x: np.ndarray, block_shape, paddings) -> np.ndarray:
    """SpaceToBatchND of one NumPy array (a whole input or one Dask block)."""
    shape = _batch_shape(x.shape, block_shape, paddings)
    padded = any(lo or hi for lo, hi in paddings)
    # Fresh zeroed pages cost nothing extra, and only padding relies on them.
    y = np.zeros(shape, x.dtype) if padded else np.empty(shape, x.dtype)
    for space_view, batch_view in _pairs(x, y, block_shape, [lo for lo, _ in paddings]):
        copy_into(batch_view, space_view)
    return y


def batch_to_space_nd_kernel(batch, block_shape, crops) -> np.ndarray:
    """BatchToSpaceND of one NumPy array, or of its P groups given as separate arrays."""
    groups = batch if isinstance(batch, list) else [batch]
    rows = sum(group.shape[0] for group in groups)
    y = np.empty(_space_shape((rows, *groups[0].shape[1:]), block_shape, crops), groups[0].dtype)
    for space_view, batch_view in _pairs(y, batch, block_shape, [lo for lo, _ in crops]):
        copy_into(space_view, batch_view)
    return y


# ---------------------------------------------------------------------------------------------
# Validation


def _validate_block_and_pairs(x, block_shape, pairs, pairs_name: str, model):
    x = _validate.array("x", x)
    shape, flat = _validate.integers("block_shape", block_shape)
    if len(shape) != 1:
        raise InvalidArgument(f"block_shape must be 1-D [M], got shape {list(shape)}")
    m = len(flat)
    rows = _validate.pairs(pairs_name, pairs, m) if m else []
    p = _validate.params(model, block_shape=flat, **{pairs_name: rows})
    if not 1 <= m < x.ndim or x.ndim > 8:
        raise InvalidArgument(
            f"x must have rank M+1..8 for block_shape of length M = {m}, "
            f"got rank {x.ndim} (shape {list(x.shape)})"
        )
    return x, p


def _validate_space_to_batch_nd(x, block_shape, paddings):
    x, p = _validate_block_and_pairs(x, block_shape, paddings, "paddings", SpaceToBatchNDParams)
    for i, (b, (lo, hi)) in enumerate(zip(p.block_shape, p.paddings)):
        padded = x.shape[1 + i] + lo + hi
        if padded % b:
            raise InvalidArgument(
                f"padded size of spatial dim {i} (x.shape[{1 + i}] + paddings[{i}] = "
                f"{x.shape[1 + i]} + {lo} + {hi} = {padded}) must be divisible by "
                f"block_shape[{i}] = {b}"
            )
    _validate.output_shape(_batch_shape(x.shape, p.block_shape, p.paddings), x.dtype.itemsize)
    return x, p


def _validate_batch_to_space_nd(x, block_shape, crops):
    x, p = _validate_block_and_pairs(x, block_shape, crops, "crops", BatchToSpaceNDParams)
    groups = math.prod(p.block_shape)
    if x.shape[0] % groups:
        raise InvalidArgument(
            f"batch size x.shape[0] = {x.shape[0]} must be divisible by prod(block_shape) = {groups}"
        )
    for i, (b, (lo, hi)) in enumerate(zip(p.block_shape, p.crops)):
        full = x.shape[1 + i] * b
        if lo + hi > full:
            raise InvalidArgument(
                f"crops[{i}] = [{lo}, {hi}] removes more than spatial dim {i} holds "
                f"(x.shape[{1 + i}] * block_shape[{i}] = {full})"
            )
    _validate.output_shape(_space_shape(x.shape, p.block_shape, p.crops), x.dtype.itemsize)
    return x, p


# ---------------------------------------------------------------------------------------------
# Chunk plans (pure functions)


def _core_paddings(length: int, b: int, before: int) -> tuple[int, int]:
    """The padding that stays inside data blocks; the rest becomes whole zero rows."""
    lo = before % b
    return lo, (-(length + lo)) % b


def space_to_batch_nd_chunks(chunks, block_shape, paddings):
    """Plan: (aligned input chunks, output chunks of the data part, zero rows (before, after) per axis).

    The full output's spatial chunks are ``regular(before) + data + regular(after)``, with the
    zero runs cut like the data chunks (see ``_zero_run``).
    """
    chunks = [tuple(c) for c in chunks]
    groups = math.prod(block_shape)
    out = list(chunks)
    zero_rows = []
    blocks = len(chunks[0]) * groups * math.prod(len(c) for c in chunks[1 + len(block_shape):])
    for i, (b, (before, after)) in enumerate(zip(block_shape, paddings)):
        axis = 1 + i
        length = sum(chunks[axis])
        lo, hi = _core_paddings(length, b, before)
        aligned = _chunks.align(chunks[axis], b, lo)
        chunks[axis] = aligned
        data = [c for c in aligned]
        data[0] += lo
        data[-1] += hi
        out[axis] = tuple(c // b for c in data) if length or lo else (0,)
        total = (length + before + after) // b
        zero_before = before // b
        zero_rows.append((zero_before, total - zero_before - sum(out[axis])))
        size = max(max(out[axis]), 1)
        blocks *= len(out[axis]) + sum(-(-rows // size) for rows in zero_rows[-1])
    # Checked before any tuple of output chunks is built: padding can ask for more blocks
    # than any graph can hold, and the tuples alone would exhaust memory.
    _chunks.check_block_count("space_to_batch_nd", blocks)
    out[0] = tuple(chunks[0]) * groups
    return tuple(chunks), tuple(out), tuple(zero_rows)


def _zero_run(rows: int, data_chunks: tuple[int, ...]) -> tuple[int, ...]:
    return _chunks.regular(rows, max(data_chunks))


def batch_to_space_nd_chunks(chunks, block_shape, crops):
    """Plan: (aligned input chunks, kept input chunk range per spatial axis, output chunks).

    The batch axis is cut into equal groups; on each spatial axis the input chunks whose rows
    are cropped away entirely are dropped (``kept[i] = (first, stop)`` chunk indices).
    """
    chunks = [tuple(c) for c in chunks]
    groups = math.prod(block_shape)
    batch = sum(chunks[0]) // groups
    chunks[0] = _chunks.groups(chunks[0], batch, groups)
    out = list(chunks)
    out[0] = chunks[0][: len(chunks[0]) // groups] if groups and batch else (0,)
    kept = []
    for i, (b, (lo, hi)) in enumerate(zip(block_shape, crops)):
        axis = 1 + i
        bounds = _chunks.boundaries(chunks[axis])
        length = bounds[-1] * b - lo - hi
        sizes = [
            max(0, min(stop * b, lo + length) - max(start * b, lo))
            for start, stop in zip(bounds, bounds[1:])
        ]
        live = [k for k, n in enumerate(sizes) if n > 0]
        if not live:
            kept.append((0, 0))
            out[axis] = (0,)
            continue
        kept.append((live[0], live[-1] + 1))
        out[axis] = tuple(sizes[live[0] : live[-1] + 1])
    return tuple(chunks), tuple(kept), tuple(out)


# ---------------------------------------------------------------------------------------------
# Dask builders


def _space_to_batch_block(block, block_shape, core_paddings, numblocks, block_id=None):
    """Kernel of one input block: its share of the padding is the core padding at the edges."""
    local = [
        (lo if block_id[1 + i] == 0 else 0, hi if block_id[1 + i] == numblocks[1 + i] - 1 else 0)
        for i, (lo, hi) in enumerate(core_paddings)
    ]
    return space_to_batch_nd_kernel(block, block_shape, local)


def _group_rows(block, groups: int, g: int):
    rows = block.shape[0] // groups
    return block[g * rows : (g + 1) * rows]


def _build_space_to_batch_nd(x: da.Array, block_shape, paddings) -> da.Array:
    in_chunks, out_chunks, zero_rows = space_to_batch_nd_chunks(x.chunks, block_shape, paddings)
    if in_chunks != x.chunks:
        x = x.rechunk(in_chunks)
    groups = math.prod(block_shape)
    core = [
        _core_paddings(x.shape[1 + i], b, before)
        for i, (b, (before, _)) in enumerate(zip(block_shape, paddings))
    ]
    token = tokenize(x, block_shape, paddings)
    # One task per input block computes all P groups at once (one pass over the block) ...
    all_groups = x.map_blocks(
        _space_to_batch_block, block_shape, core, x.numblocks,
        chunks=(tuple(c * groups for c in x.chunks[0]), *out_chunks[1:]),
        dtype=x.dtype, meta=_lazy.meta(x.ndim, x.dtype), name=f"space_to_batch_nd-all-{token}",
    )
    # ... and output block (g, k, ...) is group g's rows of block k: a view, no copy.
    name = f"space_to_batch_nd-{token}"
    batch_blocks = x.numblocks[0]
    layer = {
        (name, g * batch_blocks + key[1], *key[2:]): (_group_rows, key, groups, g)
        for g in range(groups)
        for key in _keys(all_groups)
    }
    graph = HighLevelGraph.from_collections(name, layer, dependencies=[all_groups])
    y = da.Array(graph, name, chunks=out_chunks, meta=_lazy.meta(x.ndim, x.dtype))
    for i, (before, after) in enumerate(zero_rows):
        y = _pad_with_zero_blocks(y, 1 + i, before, after)
    return y


def _keys(array: da.Array):
    """Every block key of ``array``, in block order."""
    return [(array.name, *index) for index in np.ndindex(*array.numblocks)]


def _pad_with_zero_blocks(y: da.Array, axis: int, before: int, after: int) -> da.Array:
    """Whole rows of padding as zero blocks that read nothing, chunked like their neighbours."""
    pieces = [y]
    for rows, at_start in ((before, True), (after, False)):
        if rows:
            chunks = list(y.chunks)
            chunks[axis] = _zero_run(rows, y.chunks[axis])
            zeros = da.zeros(tuple(map(sum, chunks)), dtype=y.dtype, chunks=tuple(chunks))
            pieces.insert(0 if at_start else len(pieces), zeros)
    return da.concatenate(pieces, axis=axis) if len(pieces) > 1 else y


def _batch_to_space_block(blocks, block_shape, crops):
    return batch_to_space_nd_kernel(list(blocks), block_shape, crops)


def _local_crops(chunks, kept, b: int, lo: int, length: int) -> list[tuple[int, int]]:
    """(crop before, crop after) of each kept input chunk of one spatial axis."""
    bounds = _chunks.boundaries(chunks)
    result = []
    for k in range(*kept):
        start, stop = bounds[k] * b, bounds[k + 1] * b
        result.append((max(0, lo - start), max(0, stop - (lo + length))))
    return result


def _build_batch_to_space_nd(x: da.Array, block_shape, crops, out_shape) -> da.Array:
    in_chunks, kept, out_chunks = batch_to_space_nd_chunks(x.chunks, block_shape, crops)
    if in_chunks != x.chunks:
        x = x.rechunk(in_chunks)
    m = len(block_shape)
    groups = math.prod(block_shape)
    batch_blocks = x.numblocks[0] // groups
    local_crops = [
        _local_crops(x.chunks[1 + i], kept[i], b, lo, out_shape[1 + i])
        for i, (b, (lo, _)) in enumerate(zip(block_shape, crops))
    ]
    name = f"batch_to_space_nd-{tokenize(x, block_shape, crops)}"
    layer = {}
    for index in np.ndindex(*map(len, out_chunks)):
        # Spatial block k of the output is input chunk kept[i][0] + k of every group.
        source = [index[1 + i] + kept[i][0] for i in range(m)]
        blocks = [
            (x.name, g * batch_blocks + index[0], *source, *index[1 + m :]) for g in range(groups)
        ]
        block_crops = [local_crops[i][index[1 + i]] for i in range(m)]
        layer[(name, *index)] = (_batch_to_space_block, blocks, list(block_shape), block_crops)
    graph = HighLevelGraph.from_collections(name, layer, dependencies=[x])
    return da.Array(graph, name, chunks=out_chunks, meta=_lazy.meta(x.ndim, x.dtype))


# ---------------------------------------------------------------------------------------------
# Public functions


def space_to_batch_nd(x, block_shape, paddings):
    """Zero-pad the spatial dims and move each offset inside a block into the batch (SpaceToBatchND).

    TensorFlow's N-D form. ``x`` is ``[B, s_1, ..., s_M, rest...]``; each spatial dim is
    padded with ``paddings[i]`` zeros before and after and cut into blocks of
    ``block_shape[i]``; the in-block offsets ``j_0..j_{M-1}`` of batch entry ``b`` go to
    output batch index ``((j_0*b_1 + j_1)*b_2 + ... + j_{M-1})*B + b`` (the input batch
    index varies fastest). Padding is the dtype's zero. The full reference is
    docs/operators.md.

    Parameters
    ----------
    x : numpy.ndarray or dask.array.Array
        ``[B, s_1, ..., s_M, rest...]``, rank <= 8, any supported dtype.
    block_shape : sequence of int or array of int
        ``M`` block sizes >= 1, ``1 <= M < x.ndim``.
    paddings : sequence of (int, int) or array of int
        ``[M, 2]``: zeros ``[before, after]`` each spatial dim, >= 0, with
        ``(s_i + before_i + after_i) % block_shape[i] == 0``.

    Returns
    -------
    numpy.ndarray or dask.array.Array
        ``[B*prod(block_shape), (s_i + before_i + after_i) / block_shape[i]..., rest...]``,
        same dtype. Dask in: lazy; the padding costs no input reads.

    Raises
    ------
    ops.InvalidArgument
        Block sizes < 1 or whose product overflows int64, ``paddings`` of the wrong shape or
        negative, a padded size not divisible by its block size, floats or booleans where
        integers are required, an unsupported dtype.

    See Also
    --------
    batch_to_space_nd : the inverse.
    space_to_batch : the 4-D NHWC form with a square block.

    Examples
    --------
    >>> import numpy as np, ops
    >>> x = np.array([[1, 2, 3], [4, 5, 6]])   # B = 2 rows, one spatial dim of 3
    >>> y = ops.space_to_batch_nd(x, [2], [[1, 0]])   # pad one zero in front: [0 1 2 3], [0 4 5 6]
    >>> y   # rows: offset 0 of batch 0, of batch 1, then offset 1 of batch 0, of batch 1
    array([[0, 2],
           [0, 5],
           [1, 3],
           [4, 6]])
    """
    x, p = _validate_space_to_batch_nd(x, block_shape, paddings)
    out_shape = _batch_shape(x.shape, p.block_shape, p.paddings)
    if 0 in out_shape:  # nothing to move, however many block offsets there are
        return _lazy.empty(out_shape, x.dtype) if isinstance(x, da.Array) else np.zeros(out_shape, x.dtype)
    if isinstance(x, da.Array):
        return _build_space_to_batch_nd(x, p.block_shape, p.paddings)
    return space_to_batch_nd_kernel(x, p.block_shape, p.paddings)


def space_to_batch(x, block_size, paddings):
    """Zero-pad an NHWC image batch and move square spatial blocks into the batch (SpaceToBatch).

    The 4-D operator: with ``Hp = H + pad_top + pad_bottom`` and
    ``Wp = W + pad_left + pad_right``, both divisible by ``bs = block_size``, the result is
    ``[N*bs*bs, Hp/bs, Wp/bs, C]`` and ::

        n = n_out % N ; rem = n_out // N ; bh = rem // bs ; bw = rem % bs
        h_in = h_out*bs + bh - pad_top ; w_in = w_out*bs + bw - pad_left
        y[n_out, h_out, w_out, c] = x[n, h_in, w_in, c]  (0 outside x)

    It equals ``space_to_batch_nd(x, [bs, bs], np.reshape(paddings, (2, 2)))``. The full
    reference is docs/operators.md.

    Parameters
    ----------
    x : numpy.ndarray or dask.array.Array
        ``[N, H, W, C]``, any supported dtype.
    block_size : int
        Integer >= 1 (1 is allowed, as in the Ascend description: only the padding applies).
    paddings : array_like of int
        4 integers >= 0, ``[pad_top, pad_bottom, pad_left, pad_right]``, given as shape
        ``[2, 2]``, ``[4]`` or ``[1, 4]``.

    Returns
    -------
    numpy.ndarray or dask.array.Array
        ``[N*bs*bs, Hp/bs, Wp/bs, C]``, same dtype; lazy for Dask input.

    Raises
    ------
    ops.InvalidArgument
        ``x`` not 4-D, ``block_size`` < 1 or not an integer, ``paddings`` not 4 integers >= 0,
        ``Hp`` or ``Wp`` not divisible by ``block_size``, an unsupported dtype.

    See Also
    --------
    space_to_batch_nd : the N-D form.
    batch_to_space_nd : the inverse.

    Examples
    --------
    >>> import numpy as np, ops
    >>> x = np.arange(1, 7).reshape(1, 2, 3, 1)   # one 2 x 3 image: rows [1 2 3] and [4 5 6]
    >>> y = ops.space_to_batch(x, 2, [[0, 0], [0, 1]])   # one zero column on the right
    >>> y.shape
    (4, 1, 2, 1)
    >>> y[:, 0, :, 0]   # batch entries = offsets (0, 0), (0, 1), (1, 0), (1, 1) in each 2 x 2 block
    array([[1, 3],
           [2, 0],
           [4, 6],
           [5, 0]])
    """
    x = _validate.array("x", x)
    _validate.rank("x", x, "4 (NHWC)", x.ndim == 4)
    shape, flat = _validate.integers("paddings", paddings)
    if shape not in ((2, 2), (4,), (1, 4)):
        raise InvalidArgument(
            f"paddings must have 4 elements as shape [2, 2], [4] or [1, 4], got shape {list(shape)}"
        )
    pairs = ((flat[0], flat[1]), (flat[2], flat[3]))
    p = _validate.params(
        SpaceToBatchParams, block_size=_validate.integer("block_size", block_size), paddings=pairs
    )
    return space_to_batch_nd(x, [p.block_size] * 2, [list(pair) for pair in p.paddings])


def batch_to_space_nd(x, block_shape, crops):
    """Move batch groups back into spatial blocks, then crop (BatchToSpaceND).

    The inverse of :func:`space_to_batch_nd` (TensorFlow). With
    ``B = x.shape[0] / prod(block_shape)``::

        y[b, s_1*b_0 + j_0 - c_00, ..., s_M*b_{M-1} + j_{M-1} - c_{M-1,0}, rest...]
            = x[((j_0*b_1 + j_1)*... + j_{M-1})*B + b, s_1, ..., s_M, rest...]

    The full reference is docs/operators.md.

    Parameters
    ----------
    x : numpy.ndarray or dask.array.Array
        ``[B*prod(block_shape), s_1, ..., s_M, rest...]``, rank 2..8, any supported dtype.
    block_shape : sequence of int or array of int
        ``M`` block sizes >= 1, ``1 <= M < x.ndim``.
    crops : sequence of (int, int) or array of int
        ``[M, 2]``: elements removed ``[before, after]`` each spatial dim, >= 0, never more
        than ``x.shape[i+1] * block_shape[i]``.

    Returns
    -------
    numpy.ndarray or dask.array.Array
        ``[B, x.shape[i+1]*block_shape[i] - before_i - after_i..., rest...]``, same dtype.
        Dask in: lazy; each output block interleaves one block of every group.

    Raises
    ------
    ops.InvalidArgument
        ``x.shape[0]`` not divisible by ``prod(block_shape)``, crops larger than the dim,
        wrong shapes, negative or non-integer block sizes or crops, a rank outside 2..8.

    See Also
    --------
    space_to_batch_nd : the inverse.

    Examples
    --------
    >>> import numpy as np, ops
    >>> y = np.array([[0, 2], [0, 5], [1, 3], [4, 6]])   # space_to_batch_nd([[1, 2, 3], [4, 5, 6]], [2], [[1, 0]])
    >>> ops.batch_to_space_nd(y, [2], [[1, 0]])   # interleave the 2 groups, crop the leading 0
    array([[1, 2, 3],
           [4, 5, 6]])
    """
    x, p = _validate_batch_to_space_nd(x, block_shape, crops)
    out_shape = _space_shape(x.shape, p.block_shape, p.crops)
    if 0 in out_shape:  # nothing to move, however many block offsets there are
        return _lazy.empty(out_shape, x.dtype) if isinstance(x, da.Array) else np.zeros(out_shape, x.dtype)
    if isinstance(x, da.Array):
        return _build_batch_to_space_nd(x, p.block_shape, p.crops, out_shape)
    return batch_to_space_nd_kernel(x, p.block_shape, p.crops)
