"""The copy engine under every rearrangement kernel.

``copy_into(dst, src)`` copies ``src`` into ``dst`` (same shape, any strides) bit for bit,
like ``np.copyto``, but walks the data in the order that keeps memory traffic sequential.

Why not ``np.copyto``: NumPy always iterates in the destination's memory order and calls its
inner loop once per contiguous run. For the permutations of DepthToSpace and friends that means
strided reads plus a call per few hundred bytes, and measured on this project's machines it
reaches half the memory-copy bandwidth. Reading the source in its own memory order, with a
compiled loop that writes each contiguous run, gets close to ``memcpy`` on a ready buffer
(see bench/RESULTS.md).

Elements are moved as unsigned machine words of their byte size, so every fixed-size dtype
(bool, bfloat16, complex32, ...) is copied exactly, NaN payloads included.

Where ``ops._compiled.use_compiled_kernels()`` says no (a small Dask worker), the copy is
``np.copyto`` of the same raw words: the same bits, about half the in-memory speed for short
runs, far above the disk and network speeds such a worker waits on.
"""

from __future__ import annotations

import math

import numpy as np

from ops._compiled import use_compiled_kernels

# Runs (bytes contiguous on both sides) shorter than this are too short to stream well in the
# source's order; see _loop_plan.
_SHORT_RUN_BYTES = 128


class _Interface:
    """Carrier of an ``__array_interface__`` that keeps the owning array alive."""

    def __init__(self, interface: dict, owner: np.ndarray):
        self.__array_interface__ = interface
        self.owner = owner


def _words(a: np.ndarray, word: int, count: int) -> np.ndarray:
    """``count`` unsigned ``word``-byte ints starting at a's first element, sharing a's memory."""
    interface = {
        "shape": (count,),
        "typestr": f"<u{word}",
        "data": (a.__array_interface__["data"][0], not a.flags.writeable),
        "version": 3,
    }
    return np.asarray(_Interface(interface, a))


def _loop_plan(shape, src_strides, dst_strides):
    """Loop axes outermost first (shape and both strides, in bytes), coalesced.

    The innermost axis is the run, contiguous on both sides. Around it, the axis next to the
    run in the source (``src_next``) and the one next to it in the destination (``dst_next``)
    form a tile, so that the tile touches whole cache lines on both sides and each side sees
    at most a few sequential streams; every other axis loops in the source's memory order.
    The best tile order depends on the run:
    - one machine word: the longer of the two axes innermost (a long strided loop);
    - short runs: ``dst_next`` inside ``src_next`` (sequential writes, reads from L2);
    - long runs: the shorter axis inside the longer (block_size streams on one side).
    """
    order = sorted(range(len(shape)), key=lambda k: src_strides[k], reverse=True)
    plan = _coalesce(*([v[k] for k in order] for v in (shape, src_strides, dst_strides)))
    shape, src_strides, dst_strides = plan
    run = len(shape) - 1
    if run < 2:
        return plan
    src_next = min(range(run), key=lambda k: src_strides[k])
    dst_next = min(range(run), key=lambda k: dst_strides[k])
    if src_next == dst_next:
        return plan
    shorter, longer = sorted((src_next, dst_next), key=lambda k: shape[k])
    if shape[run] <= 8:
        tile = [shorter, longer]
    elif shape[run] < _SHORT_RUN_BYTES:
        tile = [src_next, dst_next]
    else:
        tile = [longer, shorter]
    order = [k for k in range(run) if k not in tile] + tile + [run]
    return _coalesce(*([v[k] for k in order] for v in plan))


def copy_into(dst: np.ndarray, src: np.ndarray) -> None:
    """Copy ``src`` into ``dst`` element for element (same shape and itemsize, bytes exact)."""
    if dst.shape != src.shape:
        raise ValueError(f"copy_into: shapes differ, {dst.shape} vs {src.shape}")
    if dst.dtype.itemsize != src.dtype.itemsize:
        raise ValueError(f"copy_into: itemsizes differ, {dst.dtype} vs {src.dtype}")
    if dst.size == 0:
        return
    if not use_compiled_kernels() or any(
        s <= 0 for n, s in zip(src.shape + dst.shape, src.strides + dst.strides) if n > 1
    ):
        # NumPy where the compiled loop is not wanted (ops/_compiled.py), and for broadcast (0)
        # or reversed (<0) strides, which are rare here and which NumPy handles correctly.
        _numpy_copy(dst, src)
        return
    # Describe both sides in bytes, the element's own bytes as the innermost axis.
    axes = [k for k, n in enumerate(dst.shape) if n > 1]
    shape = [dst.shape[k] for k in axes] + [dst.dtype.itemsize]
    src_strides = [src.strides[k] for k in axes] + [1]
    dst_strides = [dst.strides[k] for k in axes] + [1]
    shape, src_strides, dst_strides = _loop_plan(shape, src_strides, dst_strides)
    # Move the widest machine word that every offset allows (uint64 where runs permit).
    src_address = src.__array_interface__["data"][0]
    dst_address = dst.__array_interface__["data"][0]
    word = math.gcd(8, shape[-1], src_address, dst_address, *src_strides[:-1], *dst_strides[:-1])
    shape[-1] //= word
    src_strides = [s // word for s in src_strides[:-1]] + [1]
    dst_strides = [s // word for s in dst_strides[:-1]] + [1]
    if shape[-1] == 1 and len(shape) > 1:
        # One word per run: the next axis becomes a strided inner loop.
        del shape[-1], src_strides[-1], dst_strides[-1]
    while len(shape) < 2:
        shape.insert(0, 1)
        src_strides.insert(0, 1)
        dst_strides.insert(0, 1)
    src_span = sum((n - 1) * s for n, s in zip(shape, src_strides)) + 1
    dst_span = sum((n - 1) * s for n, s in zip(shape, dst_strides)) + 1
    from ops._copy_jit import copy_words  # numba on first use (see ops/_copy_jit.py)

    copy_words(
        _words(src, word, src_span), np.array(src_strides, np.int64),
        _words(dst, word, dst_span), np.array(dst_strides, np.int64),
        np.array(shape, np.int64),
    )


def _numpy_copy(dst: np.ndarray, src: np.ndarray) -> None:
    """np.copyto as raw words of the itemsize: every dtype bit for bit, NaN payloads included."""
    size = dst.dtype.itemsize
    word = np.dtype(f"u{size}") if size in (1, 2, 4, 8) else np.dtype(f"V{size}")
    np.copyto(dst.view(word), src.view(word), casting="no")


def _coalesce(shape, src_strides, dst_strides):
    """Merge neighbouring loop axes that are contiguous on both sides (fewer, longer loops)."""
    if not shape:
        return [], [], []
    out_shape, out_src, out_dst = [shape[0]], [src_strides[0]], [dst_strides[0]]
    for n, s, d in zip(shape[1:], src_strides[1:], dst_strides[1:]):
        if out_src[-1] == s * n and out_dst[-1] == d * n:
            out_shape[-1] *= n
            out_src[-1] = s
            out_dst[-1] = d
        else:
            out_shape.append(n)
            out_src.append(s)
            out_dst.append(d)
    return out_shape, out_src, out_dst
