"""Array names, Zarr keys and the ``?dims=`` / ``?chunks=`` texts of an upload, checked.

An array name (``check_name``) is 1-128 characters of ``[A-Za-z0-9._-]`` not starting with
``.``: it is a directory (or a pointer object) under the data root, so nothing else may pass.
"""

from __future__ import annotations

import re

from service.errors import bad_request

NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}")
# One part of a Zarr key (``NAME/c/0/0``) that the HTTP route serves.
KEY_PART = re.compile(r"[A-Za-z0-9_.-]+")


def check_name(name: str, what: str = "array name") -> str:
    """An array name: 1-128 characters of ``[A-Za-z0-9._-]``, not starting with ``.``."""
    if not isinstance(name, str) or not NAME.fullmatch(name) or name.startswith("."):
        raise bad_request(
            f"{what} must be 1-128 characters of [A-Za-z0-9._-] not starting with '.', got {name!r}"
        )
    return name


def parse_dims(text: str | None, ndim: int) -> tuple[str, ...] | None:
    """``?dims=n,y,x,c`` as a tuple of distinct names, one per axis."""
    if text is None:
        return None
    names = tuple(part.strip() for part in text.split(","))
    if len(names) != ndim or len(set(names)) != ndim or not all(NAME.fullmatch(n) for n in names):
        raise bad_request(f"dims must be {ndim} distinct comma-separated names of [A-Za-z0-9._-], got {text!r}")
    return names


def check_variable_dims(variable: str, dims, what: str) -> None:
    """400 when a stored variable would be named like one of its dims: xarray reads such a
    variable as that dim's coordinate, so ``xr.open_zarr`` would show no data at all."""
    if variable in tuple(map(str, dims)):
        raise bad_request(
            f"{what} {variable!r} is also one of its dims {tuple(map(str, dims))}: xarray would read it as the "
            f"coordinate of dim {variable!r}, not as data; name the array or that dim otherwise"
        )


def parse_chunks(text: str | None, shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """``?chunks=1,256,256,-1`` (``-1``: the whole axis) as one positive chunk length per axis;
    a length past its axis is the whole axis (Zarr would allocate a chunk that long)."""
    if text is None:
        return None
    try:
        values = [int(part) for part in text.split(",")] if shape else []
    except ValueError:
        raise bad_request(f"chunks must be comma-separated integers, got {text!r}") from None
    if len(values) != len(shape) or any(v == 0 or v < -1 for v in values):
        raise bad_request(f"chunks must give {len(shape)} positive lengths (or -1 for a whole axis), got {text!r}")
    # How many chunks (files) they make is the upload's budget to check (``Budgets.check_grid``).
    return tuple(max(1, n) if v == -1 else min(v, max(1, n)) for v, n in zip(values, shape))
