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

from ops import _chunks


def _channel_axes(data_format: str) -> tuple[int, ...]:
    return {"NHWC": (3,), "NCHW": (1,), "NCHW_VECT_C": (1, 4)}[data_format]


def _spatial_axes(data_format: str) -> tuple[int, int]:
    return (1, 2) if data_format == "NHWC" else (2, 3)


def depth_to_space_chunks(chunks, bs: int, data_format: str, mode: str):
    """(input chunks after rechunking, output chunks) for DepthToSpace: the plan, as a pure function."""
    chunks = [tuple(c) for c in chunks]
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
    return tuple(chunks), tuple(out)


def space_to_depth_chunks(chunks, bs: int, data_format: str, mode: str):
    """(input chunks after rechunking, output chunks) for SpaceToDepth."""
    chunks = [tuple(c) for c in chunks]
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
    return tuple(chunks), tuple(out)
