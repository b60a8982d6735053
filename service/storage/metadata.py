"""An array as its group's consolidated metadata (the root ``zarr.json``) describes it: which
variable is the data, its array metadata and the group's attributes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from service.errors import bad_request


@dataclass
class Located:
    """An array found in the store: its group path, its data variable's name and the
    consolidated metadata of both."""

    name: str
    path: Path
    variable: str
    meta: dict          # the variable's array metadata (shape, data_type, chunk_grid, ...)
    group_attrs: dict


def located(name: str, where, group: dict) -> Located:
    """The array ``name`` as the group's consolidated metadata (``group``: its root
    ``zarr.json``) describes it; ``where`` is the group's location in the store."""
    arrays = group.get("consolidated_metadata", {}).get("metadata", {})
    coords = set()
    for key, child in arrays.items():
        coords.update(str(child.get("attributes", {}).get("coordinates", "")).split())
        if child.get("dimension_names") == [key]:
            coords.add(key)
    variables = [k for k, child in arrays.items()
                 if child.get("node_type") == "array" and "/" not in k and k not in coords]
    if len(variables) != 1:
        raise bad_request(f"array {name!r} holds {len(variables)} data variables, expected one")
    return Located(name, where, variables[0], arrays[variables[0]], group.get("attributes", {}))
