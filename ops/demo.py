"""``make demo``: every operator on a small chunked Dask array, checked against the NumPy path.

    python -m ops.demo
"""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np

import ops


def _show(title: str, lazy: da.Array, eager: np.ndarray, image: bool = True) -> None:
    """Compute ``lazy``, check it against the NumPy path, print it (an image's first plane)."""
    result = lazy.compute()
    same = result.shape == eager.shape and result.tobytes() == eager.tobytes()
    print(f"{title}\n  lazy: shape {lazy.shape}, {lazy.npartitions} blocks, chunks {lazy.chunks}")
    print(f"  computed == NumPy path: {same}")
    shown = result[0, :, :, 0] if image else result
    print(("  first image, first channel:\n  " if image else "  ")
          + np.array2string(shown, precision=2).replace("\n", "\n  ") + "\n")
    if not same:
        raise SystemExit(f"{title}: the Dask and NumPy results differ")


def main() -> None:
    dask.config.set(scheduler="threads")
    image = np.arange(2 * 4 * 4 * 8, dtype=np.int32).reshape(2, 4, 4, 8)  # NHWC
    x = da.from_array(image, chunks=(1, 2, 2, 8))
    print(f"input: NHWC {image.shape}, chunks {x.chunks}\n")

    _show("depth_to_space(x, 2)", ops.depth_to_space(x, 2), ops.depth_to_space(image, 2))
    _show(
        "depth_to_space(x, 2, mode='CRD')",
        ops.depth_to_space(x, 2, mode="CRD"),
        ops.depth_to_space(image, 2, mode="CRD"),
    )
    _show("space_to_depth(x, 2)", ops.space_to_depth(x, 2), ops.space_to_depth(image, 2))
    padded = [[1, 1], [0, 2]]
    _show(
        "space_to_batch(x, 2, [[1, 1], [0, 2]])",
        ops.space_to_batch(x, 2, padded),
        ops.space_to_batch(image, 2, padded),
    )
    _show(
        "space_to_batch_nd(x, [2, 1], [[0, 0], [1, 1]])",
        ops.space_to_batch_nd(x, [2, 1], [[0, 0], [1, 1]]),
        ops.space_to_batch_nd(image, [2, 1], [[0, 0], [1, 1]]),
    )
    batch = ops.space_to_batch(image, 2, padded)
    _show(
        "batch_to_space_nd(space_to_batch(x), [2, 2], [[1, 1], [0, 2]])  (round trip)",
        ops.batch_to_space_nd(da.from_array(batch, chunks=(2, 3, 3, 8)), [2, 2], padded),
        image,
    )
    table = np.arange(100 * 6, dtype=np.float32).reshape(100, 6)
    lazy_table = da.from_array(table, chunks=(10, 6))
    points = np.array([[3], [97], [-1]])
    _show(
        "gather_nd(table, [[3], [97], [-1]]) on a 10-block table",
        ops.gather_nd(lazy_table, points),
        ops.gather_nd(table, points),
        image=False,
    )
    acc = np.arange(-16, 16, dtype=np.int32).reshape(4, 8)
    scale = np.array([2.2, -2.2, 2.2, -2.2, 2.2, -2.2, 0, 0], np.float32)
    _show(
        "ascend_dequant(acc, scale, dst_dtype='float32', calc_count=6)  (the seed's table)",
        ops.ascend_dequant(da.from_array(acc, chunks=(2, 8)), scale, dst_dtype="float32", calc_count=6),
        ops.ascend_dequant(acc, scale, dst_dtype="float32", calc_count=6),
        image=False,
    )
    try:
        ops.depth_to_space(x, 3)
    except ops.InvalidArgument as error:
        print(f"bad input is refused before any work: {error}")


if __name__ == "__main__":
    main()
