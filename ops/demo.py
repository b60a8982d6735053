"""``make demo``: every operator on a small chunked Dask array, checked against the NumPy path.

    python -m ops.demo
"""

from __future__ import annotations

import dask
import dask.array as da
import numpy as np

import ops


def _show(title: str, lazy: da.Array, eager: np.ndarray) -> None:
    result = lazy.compute()
    same = result.shape == eager.shape and result.tobytes() == eager.tobytes()
    print(f"{title}\n  lazy: shape {lazy.shape}, {lazy.npartitions} blocks, chunks {lazy.chunks}")
    print(f"  computed == NumPy path: {same}")
    print("  first image, first channel:")
    print("  " + np.array2string(result[0, :, :, 0]).replace("\n", "\n  ") + "\n")
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
    try:
        ops.depth_to_space(x, 3)
    except ops.InvalidArgument as error:
        print(f"bad input is refused before any work: {error}")


if __name__ == "__main__":
    main()
