"""The chunk plan of AscendDequant: src row chunks in, (aligned src row chunks, scale row chunks) out.

Row blocks with all n columns in one chunk; per-row scales are chunked with the rows, and for
per_group with k_dim=0 the row chunks are aligned to multiples of group_size so each block
sees whole scale rows.
"""

from __future__ import annotations

from ops import _chunks, _limits


def dequant_chunks(row_chunks, row_div: int):
    """Plan: (src row chunks, scale row chunks or None). Columns are always one chunk.

    ``row_div`` 0: one scale row for all (classic); 1: a scale row per src row; g: one per
    g rows, with src row chunks aligned to multiples of g.
    """
    given = tuple(row_chunks)
    if row_div > 1:
        row_chunks = _chunks.align(row_chunks, row_div)
    # A task per block and at most one scale block each; where row boundaries move to whole
    # groups, one task more per block that joins its pieces.
    blocks = len(row_chunks)
    tasks = 2 * blocks + (blocks if tuple(row_chunks) != given else 0)
    _limits.check("ascend_dequant", blocks, tasks, "give src larger row chunks")
    if row_div == 0:
        return row_chunks, None
    return row_chunks, tuple(-(-c // row_div) for c in row_chunks)
