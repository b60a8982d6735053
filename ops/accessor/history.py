"""``attrs["ops_history"]``: each accessor result records its operator and parameters there, and
``.ops.invert()`` undoes the last recorded step.

The record is a JSON list of ``{"operator": ..., "parameters": ...}`` steps (plain JSON, so it
survives netCDF and Zarr); the coordinate rules add ``"coords"``/``"drop_coords"`` to a step
(``ops.accessor.coords``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import numpy as np

from ops.errors import InvalidArgument, NotApplicable

HISTORY = "ops_history"


def with_step(arr, operator: str, **parameters) -> dict:
    """attrs of the result: the input's, plus this step appended to ``ops_history``."""
    attrs = dict(arr.attrs)
    steps = json.loads(attrs.get(HISTORY, "[]"))
    steps.append({"operator": operator, "parameters": parameters})
    attrs[HISTORY] = json.dumps(steps)
    return attrs


def plain_ints(mapping: Mapping) -> dict:
    """{dim: int or (int, int)} as JSON-friendly values (NumPy ints included)."""
    return {str(k): (int(v) if np.ndim(v) == 0 else [int(x) for x in v]) for k, v in mapping.items()}


def undo_last(accessor):
    """The array of ``accessor`` (a ``DataArray.ops``) before its last recorded step, with the
    attrs from before that step."""
    arr = accessor._obj
    steps = json.loads(arr.attrs.get(HISTORY, "[]"))
    if not steps:
        raise NotApplicable("invert: attrs has no ops_history; nothing to undo")
    last = steps[-1]
    operator, p = last["operator"], last["parameters"]
    if operator in ("depth_to_space", "space_to_depth"):
        inverse = "space_to_depth" if operator == "depth_to_space" else "depth_to_space"
        out = accessor._depth(inverse, p["block_size"], p["mode"], accessor._depth_roles(inverse, p["dims"]))
    elif operator in ("space_to_batch_nd", "batch_to_space_nd"):
        pairs = p.get("paddings", p.get("crops"))
        if operator == "space_to_batch_nd":
            out = accessor.batch_to_space_nd(p["block_shape"], pairs, dims=p["dims"])
        else:
            out = accessor.space_to_batch_nd(p["block_shape"], pairs, dims=p["dims"])
    else:
        raise InvalidArgument(f"invert: {operator} has no inverse")
    # The result is new: give it the attrs from before the undone step.
    out.attrs = {k: v for k, v in out.attrs.items() if k != HISTORY}
    if steps[:-1]:
        out.attrs[HISTORY] = json.dumps(steps[:-1])
    return out
