"""The decoded blocks of one download (``DecodedBlocks``): an NPY download reads a stored array
in C-order pieces of about ``chunk_bytes``, and a stored chunk larger than a piece (or one
that many pieces cross) is decoded once and kept while later pieces still need it, instead
of once per piece.
"""

from __future__ import annotations

import itertools
from bisect import bisect_right

import dask
import dask.array as da
import numpy as np


class DecodedBlocks:
    """Regions of a Dask array whose blocks are stored chunks, read in C order
    (``service.storage.chunk_order.c_order_regions``), each block decoded once while it fits.

    Parameters
    ----------
    data : dask.array.Array
        The stored array, one block per stored chunk.
    budget : int
        The most bytes of decoded blocks kept at a time. A block is dropped once the regions
        have moved past it; a block that does not fit beside those still needed is decoded
        for each region that needs it.
    """

    def __init__(self, data: da.Array, budget: int):
        self.data = data
        self.budget = budget
        self._bounds = [list(itertools.accumulate(c, initial=0)) for c in data.chunks]
        self._kept: dict[tuple[int, ...], np.ndarray] = {}

    def read(self, region: tuple) -> np.ndarray:
        """The values of ``region``: leading ints, then slices of step 1 (axes left out are whole)."""
        if self.data.ndim == 0:
            return np.asarray(self.data.compute(scheduler="sync"))
        region = (*region, *(slice(0, n) for n in self.data.shape[len(region):]))
        spans = [(r, r + 1) if isinstance(r, int) else (r.start, r.stop) for r in region]
        self._drop_passed(tuple(r for r in region if isinstance(r, int)))
        out = np.empty([stop - start for (start, stop), r in zip(spans, region) if isinstance(r, slice)],
                       dtype=self.data.dtype)
        ranges = [range(bisect_right(b, start) - 1, bisect_right(b, stop - 1)) for b, (start, stop) in
                  zip(self._bounds, spans)]
        blocks = self._blocks(list(itertools.product(*ranges)))
        for index, block in blocks.items():
            source, target = [], []
            for b, i, (start, stop), r in zip(self._bounds, index, spans, region):
                low, high = max(start, b[i]), min(stop, b[i + 1])
                source.append(low - b[i] if isinstance(r, int) else slice(low - b[i], high - b[i]))
                if isinstance(r, slice):
                    target.append(slice(low - start, high - start))
            out[tuple(target)] = block[tuple(source)]
        return out

    def _blocks(self, indices: list[tuple[int, ...]]) -> dict[tuple[int, ...], np.ndarray]:
        """The blocks at ``indices``: those kept, and the others decoded together (in Dask's
        threads, as a region was before); those that fit are kept."""
        missing = [index for index in indices if index not in self._kept]
        decoded = dask.compute(*(self.data.blocks[index] for index in missing), scheduler="threads")
        decoded = [np.asarray(block) for block in decoded]
        for index, block in zip(missing, decoded):
            if block.nbytes + sum(b.nbytes for b in self._kept.values()) <= self.budget:
                self._kept[index] = block
        found = dict(zip(missing, decoded))
        return {index: self._kept[index] if index in self._kept else found[index] for index in indices}

    def _drop_passed(self, lead: tuple[int, ...]) -> None:
        """Drop the blocks that no region from ``lead`` on needs: in C order the leading ints
        only grow, so a block whose last leading position is before ``lead`` is done with."""
        for index in list(self._kept):
            last = tuple(b[i + 1] - 1 for b, i in zip(self._bounds, index[:len(lead)]))
            if last < lead:
                del self._kept[index]
