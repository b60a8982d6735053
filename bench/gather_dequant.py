"""GatherNd and AscendDequant benchmark (run by hand): ``python -m bench.gather_dequant [--quick]``.

GatherNd: 1,000,000 index tuples into a ~256 MiB float32 table, as row gathers ([2**20, 64]
table, tuples of 1) and element gathers ([8192, 8192] table, tuples of 2). Paths: the NumPy
path, the Dask path with concrete (NumPy) indices, and the Dask path with lazy indices
(params over ``array.chunk-size``, so the shuffle plan), beside NumPy fancy indexing of the
same rows. Dask times include building the graph (bucketing concrete indices happens there).

AscendDequant: int32 [8192, 8192] to float16 / bfloat16 / float32 with a per-column scale
(uint64 for float16, float32 otherwise), NumPy and Dask paths, beside the plain expression
``(src.astype(np.float32) * scale).astype(dst)`` and a memory copy of the int32 input.
Dask paths persist on all cores with the threaded scheduler.
"""

from __future__ import annotations

import argparse
from concurrent.futures import ThreadPoolExecutor

import dask
import dask.array as da
import numpy as np

import ops
from bench.common import CORES, best_seconds, gbps, machine, parallel_copy


def gather(scale: int, repeat: int) -> None:
    rng = np.random.default_rng(0)
    count = 1_000_000 // scale
    print("GatherNd (tuples per second, millions; ratio against NumPy fancy indexing)\n")
    print("| gather | table | NumPy path | Dask, concrete indices | Dask, lazy indices | fancy indexing | NumPy / fancy | Dask concrete / fancy | Dask lazy / fancy |")
    print("|---|---|---|---|---|---|---|---|---|")
    for label, shape, chunks in [
        ("rows (c = 1)", (2**20 // scale, 64), (2**16 // scale, 64)),
        ("elements (c = 2)", (8192 // scale, 8192), (1024 // scale, 8192)),
    ]:
        table = rng.standard_normal(shape, dtype=np.float32)
        c = 1 if shape[1] == 64 else 2
        indices = np.stack([rng.integers(0, n, count) for n in shape[:c]], axis=-1)
        fancy = (lambda: table[indices[:, 0]]) if c == 1 else (lambda: table[indices[:, 0], indices[:, 1]])
        np.testing.assert_array_equal(ops.gather_nd(table, indices), fancy())
        lazy_table = da.from_array(table, chunks=chunks)
        lazy_indices = da.from_array(indices, chunks=(count // 8, c))
        with dask.config.set(scheduler="threads", num_workers=CORES):
            t_numpy = best_seconds(lambda: ops.gather_nd(table, indices), repeat)
            t_concrete = best_seconds(lambda: dask.persist(ops.gather_nd(lazy_table, indices))[0], repeat)
            t_lazy = best_seconds(lambda: dask.persist(ops.gather_nd(lazy_table, lazy_indices))[0], repeat)
        t_fancy = best_seconds(fancy, repeat)
        rate = lambda t: count / t / 1e6  # noqa: E731
        print(
            f"| {label} | {list(shape)} {table.nbytes / 2**20:.0f} MiB | {rate(t_numpy):.1f} | "
            f"{rate(t_concrete):.1f} | {rate(t_lazy):.1f} | {rate(t_fancy):.1f} | "
            f"{t_fancy / t_numpy:.2f}x | {t_fancy / t_concrete:.2f}x | {t_fancy / t_lazy:.2f}x |",
            flush=True,
        )


def dequant(scale: int, repeat: int) -> None:
    rng = np.random.default_rng(1)
    side = 8192 // scale
    src = rng.integers(-2**20, 2**20, size=(side, side), dtype=np.int32)
    lazy_src = da.from_array(src, chunks=(side // 16, side))
    pool = ThreadPoolExecutor(CORES)
    copy_dst = np.empty_like(src)
    copy_dst.fill(0)
    t_copy = best_seconds(lambda: np.copyto(copy_dst, src), repeat)
    t_copy_all = best_seconds(lambda: parallel_copy(copy_dst, src, pool), repeat)
    print(f"\nAscendDequant [{side}, {side}] int32 (GB/s of bytes read + written; memory copy of the "
          f"int32 input: {gbps(2 * src.nbytes, t_copy):.1f} GB/s on 1 core, "
          f"{gbps(2 * src.nbytes, t_copy_all):.1f} on all cores)\n")
    print("| dst | scale | NumPy path | Dask path | plain expr | NumPy / plain | Dask / NumPy |")
    print("|---|---|---|---|---|---|---|")
    for dst, scale_dtype in [("float16", np.uint64), ("bfloat16", np.float32), ("float32", np.float32)]:
        values = rng.uniform(1e-5, 1e-4, side).astype(np.float32)  # int32 accumulators -> O(1..100)
        deq_scale = values.view(np.uint32).astype(np.uint64) if scale_dtype == np.uint64 else values
        dst_dtype = np.dtype(ops.dtypes.bfloat16 if dst == "bfloat16" else dst)
        plain = lambda: (src.astype(np.float32) * values).astype(dst_dtype)  # noqa: E731
        run = lambda s: ops.ascend_dequant(s, deq_scale, dst_dtype=dst, mode="multi_row")  # noqa: E731
        assert run(src).tobytes() == plain().tobytes()
        with dask.config.set(scheduler="threads", num_workers=CORES):
            t_numpy = best_seconds(lambda: run(src), repeat)
            t_dask = best_seconds(lambda: dask.persist(run(lazy_src))[0], repeat)
        t_plain = best_seconds(plain, repeat)
        moved = src.nbytes + src.size * dst_dtype.itemsize
        print(
            f"| {dst} | {np.dtype(scale_dtype)} | {gbps(moved, t_numpy):.1f} | {gbps(moved, t_dask):.1f} | "
            f"{gbps(moved, t_plain):.1f} | {t_plain / t_numpy:.2f}x | {t_numpy / t_dask:.2f}x |",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="inputs 1/8 the size, 2 repeats")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    scale, repeat = (8, 2) if args.quick else (1, args.repeat)
    print(machine())
    gather(scale, repeat)
    dequant(scale, repeat)


if __name__ == "__main__":
    main()
