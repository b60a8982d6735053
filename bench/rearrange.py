"""Rearrangement benchmark (run by hand, not a test): ``python -m bench.rearrange [--quick]``.

For each operator on a ~512 MiB input (float32; int32 for AscendDequant, whose rows here are
dequantised to float32 with a per-column scale; GatherNd gathers 2M random rows of 64
float32 by concrete indices), throughput in GB/s (bytes read + written per second) of
- the NumPy path (``ops.<op>`` on a NumPy array, one thread),
- the Dask path (``ops.<op>`` on a chunked Dask array, persisted with the threaded scheduler
  on all cores; the result stays as blocks, as an out-of-core pipeline would keep it),
- the plain NumPy reshape/transpose expression a user would write (np.pad first where the
  operator pads),
beside a plain memory copy of the same bytes: ``np.copyto`` into a ready buffer on one core,
the same copy split over all cores, and ``x.copy()`` (a copy into freshly allocated memory,
which pays the page faults that every operator producing a new array pays too). The last
column is the Dask path against that fresh-memory copy, the in-memory target.
Ratios are taken within one run; machines here are shared and noisy.
"""

from __future__ import annotations

import argparse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

import dask
import dask.array as da
import numpy as np

import ops
from bench.common import CORES, best_seconds, gbps, machine, parallel_copy

@dataclass
class Case:
    name: str
    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    op: Callable  # (array) -> array, through ops
    plain: Callable  # (numpy array) -> numpy array, the expression a user would write
    dtype: str = "float32"


def cases(scale: int) -> list[Case]:
    """Inputs of 512 MiB / scale."""
    n = 8 // scale
    column_scale = np.random.default_rng(1).uniform(1e-3, 1e-2, 16384).astype(np.float32)
    rows = np.random.default_rng(2).integers(0, 2**21 // scale, (2**21 // scale, 1))
    return [
        Case(
            "depth_to_space NHWC DCR bs=2 (C 256 -> 64)",
            (n, 256, 256, 256), (1, 128, 256, 256),
            lambda x: ops.depth_to_space(x, 2),
            lambda x: x.reshape(n, 256, 256, 2, 2, 64).transpose(0, 1, 3, 2, 4, 5).reshape(n, 512, 512, 64),
        ),
        Case(
            "depth_to_space NHWC DCR bs=2 (C 16 -> 4)",
            (n, 1024, 1024, 16), (1, 512, 1024, 16),
            lambda x: ops.depth_to_space(x, 2),
            lambda x: x.reshape(n, 1024, 1024, 2, 2, 4).transpose(0, 1, 3, 2, 4, 5).reshape(n, 2048, 2048, 4),
        ),
        Case(
            "depth_to_space NCHW CRD bs=2 (pixel shuffle, C 16 -> 4)",
            (n, 16, 1024, 1024), (1, 16, 512, 1024),
            lambda x: ops.depth_to_space(x, 2, data_format="NCHW", mode="CRD"),
            lambda x: x.reshape(n, 4, 2, 2, 1024, 1024).transpose(0, 1, 4, 2, 5, 3).reshape(n, 4, 2048, 2048),
        ),
        Case(
            "space_to_depth NHWC DCR bs=2 (C 64 -> 256)",
            (n, 512, 512, 64), (1, 256, 512, 64),
            lambda x: ops.space_to_depth(x, 2),
            lambda x: x.reshape(n, 256, 2, 256, 2, 64).transpose(0, 1, 3, 2, 4, 5).reshape(n, 256, 256, 256),
        ),
        Case(
            "space_to_batch_nd block [2,2] (C 64)",
            (n, 512, 512, 64), (1, 256, 512, 64),
            lambda x: ops.space_to_batch_nd(x, [2, 2], [[0, 0], [0, 0]]),
            lambda x: x.reshape(n, 256, 2, 256, 2, 64).transpose(2, 4, 0, 1, 3, 5).reshape(4 * n, 256, 256, 64),
        ),
        Case(
            "space_to_batch bs=2 paddings [[1,1],[1,1]] (C 64)",
            (n, 512, 512, 64), (1, 256, 512, 64),
            lambda x: ops.space_to_batch(x, 2, [[1, 1], [1, 1]]),
            lambda x: np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)))
            .reshape(n, 257, 2, 257, 2, 64).transpose(2, 4, 0, 1, 3, 5).reshape(4 * n, 257, 257, 64),
        ),
        Case(
            "space_to_batch bs=2 paddings [[1,1],[1,1]] pad_value NaN (C 64)",
            (n, 512, 512, 64), (1, 256, 512, 64),
            lambda x: ops.space_to_batch(x, 2, [[1, 1], [1, 1]], pad_value=np.nan),
            lambda x: np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0)), constant_values=np.nan)
            .reshape(n, 257, 2, 257, 2, 64).transpose(2, 4, 0, 1, 3, 5).reshape(4 * n, 257, 257, 64),
        ),
        Case(
            "space_to_batch_nd block [2,2,2] (5-D, C 32)",
            (n // 4 or 1, 128, 128, 128, 32), (1, 64, 128, 128, 32),
            lambda x: ops.space_to_batch_nd(x, [2, 2, 2], [[0, 0]] * 3),
            lambda x: x.reshape(x.shape[0], 64, 2, 64, 2, 64, 2, 32)
            .transpose(2, 4, 6, 0, 1, 3, 5, 7).reshape(8 * x.shape[0], 64, 64, 64, 32),
        ),
        Case(
            "batch_to_space_nd block [2,2] (C 64)",
            (4 * n, 256, 256, 64), (1, 256, 256, 64),
            lambda x: ops.batch_to_space_nd(x, [2, 2], [[0, 0], [0, 0]]),
            lambda x: x.reshape(2, 2, n, 256, 256, 64).transpose(2, 3, 0, 4, 1, 5).reshape(n, 512, 512, 64),
        ),
        Case(
            "batch_to_space_nd block [2,2] crops [[1,1],[1,1]] (C 64)",
            (4 * n, 256, 256, 64), (1, 256, 256, 64),
            lambda x: ops.batch_to_space_nd(x, [2, 2], [[1, 1], [1, 1]]),
            lambda x: x.reshape(2, 2, n, 256, 256, 64).transpose(2, 3, 0, 4, 1, 5)
            .reshape(n, 512, 512, 64)[:, 1:-1, 1:-1],
        ),
        Case(
            "ascend_dequant int32 -> float32, per-column scale",
            (8192 // scale, 16384), (1024 // scale, 16384),
            lambda x: ops.ascend_dequant(x, column_scale, dst_dtype="float32", mode="multi_row"),
            lambda x: (x.astype(np.float32) * column_scale).astype(np.float32),
            dtype="int32",
        ),
        Case(
            "gather_nd 2M random rows of 64 (concrete indices)",
            (2**21 // scale, 64), (2**18 // scale, 64),
            lambda x: ops.gather_nd(x, rows),
            lambda x: x[rows[:, 0]],
        ),
    ]


def run(scale: int, repeat: int, only: str | None = None) -> None:
    rng = np.random.default_rng(0)
    pool = ThreadPoolExecutor(CORES)
    print(machine())
    print("GB/s = (bytes read + bytes written) / best time; copy columns move the input's bytes once.\n")
    header = (
        "| operator | MiB in | NumPy path | Dask path | plain expr | copyto 1 core | copyto all cores"
        " | x.copy() | NumPy / plain | Dask / all-core copy | Dask / x.copy() |"
    )
    print(header)
    print("|---" * (header.count("|") - 1) + "|")
    with dask.config.set(scheduler="threads", num_workers=CORES):
        for case in cases(scale):
            if only and only not in case.name:
                continue
            x = (rng.integers(-2**20, 2**20, case.shape, dtype=np.int32) if case.dtype == "int32"
                 else rng.standard_normal(case.shape, dtype=np.float32))
            lazy_input = da.from_array(x, chunks=case.chunks)
            y = case.op(x)  # warms the JIT too
            np.testing.assert_array_equal(y, case.plain(x))
            moved = x.nbytes + y.nbytes
            dst = np.empty_like(x)
            dst.fill(0)
            t_numpy = best_seconds(lambda: case.op(x), repeat)
            t_dask = best_seconds(lambda: dask.persist(case.op(lazy_input))[0], repeat)
            t_plain = best_seconds(lambda: case.plain(x), repeat)
            copy_bytes = 2 * x.nbytes
            t_copy = best_seconds(lambda: np.copyto(dst, x), repeat)
            t_copy_all = best_seconds(lambda: parallel_copy(dst, x, pool), repeat)
            t_fresh = best_seconds(lambda: x.copy(), repeat)
            numpy_rate, dask_rate = gbps(moved, t_numpy), gbps(moved, t_dask)
            plain_rate, all_copy = gbps(moved, t_plain), gbps(copy_bytes, t_copy_all)
            fresh_copy = gbps(copy_bytes, t_fresh)
            print(
                f"| {case.name} | {x.nbytes / 2**20:.0f} | {numpy_rate:.1f} | {dask_rate:.1f} | "
                f"{plain_rate:.1f} | {gbps(copy_bytes, t_copy):.1f} | {all_copy:.1f} | "
                f"{fresh_copy:.1f} | {numpy_rate / plain_rate:.2f}x | "
                f"{dask_rate / all_copy:.2f}x | {dask_rate / fresh_copy:.2f}x |",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="64 MiB inputs, 2 repeats (a smoke run)")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--only", metavar="TEXT", help="only the operators whose name contains TEXT")
    args = parser.parse_args()
    run(scale=8 if args.quick else 1, repeat=2 if args.quick else args.repeat, only=args.only)


if __name__ == "__main__":
    main()
