"""Chunk plans of DepthToSpace and SpaceToDepth: input chunks in, (rechunked input, output) chunks out.

Each output block comes from exactly one input block.
- DepthToSpace: batch/H/W keep their chunks and output H/W chunks are the input's times
  block_size. Channels: DCR needs every channel of a pixel together (one chunk); CRD only
  needs whole groups of block_size**2 channels, so its channel chunks are aligned to that.
- SpaceToDepth: H/W chunks aligned to multiples of block_size; channels one chunk for DCR,
  kept as they are for CRD (input channel c lands in output channels c*bs*bs .. +bs*bs-1).
- NCHW_VECT_C keeps the channel and vector axes in one chunk each.
"""

from __future__ import annotations

import math

from ops import _chunks, _limits


def _channel_axes(data_format: str) -> tuple[int, ...]:
    return {"NHWC": (3,), "NCHW": (1,), "NCHW_VECT_C": (1, 4)}[data_format]


def _spatial_axes(data_format: str) -> tuple[int, int]:
    return (1, 2) if data_format == "NHWC" else (2, 3)


def depth_to_space_chunks(chunks, bs: int, data_format: str, mode: str):
    """(input chunks after rechunking, output chunks) for DepthToSpace: the plan, as a pure function."""
    given = tuple(tuple(c) for c in chunks)
    chunks = list(given)
    channel_axes = _channel_axes(data_format)
    for axis in channel_axes:
        if mode == "CRD" and data_format != "NCHW_VECT_C":
            chunks[axis] = _chunks.align(chunks[axis], bs * bs)
        else:
            chunks[axis] = _chunks.single(chunks[axis])
    out = list(chunks)
    for axis in _spatial_axes(data_format):
        out[axis] = _chunks.scaled(chunks[axis], bs)
    out[channel_axes[0]] = _chunks.divided(chunks[channel_axes[0]], bs * bs)
    _check_size("depth_to_space", given, chunks, out)
    return tuple(chunks), tuple(out)


def space_to_depth_chunks(chunks, bs: int, data_format: str, mode: str):
    """(input chunks after rechunking, output chunks) for SpaceToDepth."""
    given = tuple(tuple(c) for c in chunks)
    chunks = list(given)
    channel_axes = _channel_axes(data_format)
    if not (mode == "CRD" and data_format != "NCHW_VECT_C"):
        for axis in channel_axes:
            chunks[axis] = _chunks.single(chunks[axis])
    for axis in _spatial_axes(data_format):
        chunks[axis] = _chunks.align(chunks[axis], bs)
    out = list(chunks)
    for axis in _spatial_axes(data_format):
        out[axis] = _chunks.divided(chunks[axis], bs)
    out[channel_axes[0]] = _chunks.scaled(chunks[channel_axes[0]], bs * bs)
    _check_size("space_to_depth", given, chunks, out)
    return tuple(chunks), tuple(out)


def _check_size(op: str, given, chunks, out) -> None:
    """Refuse (``_limits.check``) a plan past the call's limits. Tasks: one per output block,
    and where boundaries move (a rechunk) about one per input block and one per rechunked
    block more. An axis merged into one chunk costs none: the graph's blockwise layer takes
    all its blocks into each task."""
    blocks = math.prod(map(len, out))
    tasks = blocks
    moved = tuple(axis if len(planned) == 1 else planned for axis, planned in zip(given, chunks))
    if moved != given:
        tasks += math.prod(map(len, given)) + math.prod(map(len, chunks))
    _limits.check(op, blocks, tasks)
