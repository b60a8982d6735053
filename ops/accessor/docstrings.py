"""The ``Dataset.ops`` methods' docstrings, made from the ``DataArray.ops`` methods' they apply to
each data variable: the description, parameters, other errors and See Also have one source.

What differs is generated: the summary (every data variable that has the dims), the Returns
section (a Dataset) and the Dataset's own DimensionError. Each Dataset method's own docstring
holds only what is its own: optional notes, then its Examples section.
"""

from __future__ import annotations

import inspect
import textwrap

_WIDTH = 96
# Per variable, these errors mean "not applicable": the Dataset leaves such a variable untouched
# (ops.errors.MissingDims is both), so the DataArray's entries for them do not hold for a Dataset.
_UNTOUCHED = ("DimensionError", "NotApplicable")


def from_dataarray(method, *, applies_to: str = "has the dims it needs"):
    """Decorator: the Dataset method's docstring made from ``method``'s (a ``DataArray.ops`` method
    of the same name and parameters), with the decorated method's own docstring (optional
    notes, then an Examples section) added.

    ``applies_to`` completes "every data variable that ...": which variables the method
    transforms; the others are left untouched.
    """

    def decorate(dataset_method):
        parameters = list(inspect.signature(dataset_method).parameters)
        if dataset_method.__name__ != method.__name__ or parameters != list(inspect.signature(method).parameters):
            raise TypeError(f"Dataset.ops.{dataset_method.__name__} does not take the parameters of "
                            f"DataArray.ops.{method.__name__}, whose docstring it would show")
        dataset_method.__doc__ = dataset_docstring(method, applies_to, dataset_method.__doc__ or "")
        return dataset_method

    return decorate


def dataset_docstring(method, applies_to: str, own: str) -> str:
    """The numpydoc text of the Dataset form of ``method`` (see ``from_dataarray``)."""
    name = method.__name__
    description, sections = _split(method.__doc__)
    notes, own_sections = _split(own)
    dimension_error = (f"If no data variable {applies_to}, or an untouched one shares a dim whose size changes; "
                       f"also where ``DataArray.ops.{name}`` raises it for a variable, except for a missing "
                       "dim (such a variable is left untouched).")
    raises = [entry for entry in _entries(sections["Raises"]) if entry[0] not in _UNTOUCHED]
    see_also = ", ".join([f"DataArray.ops.{name}", *filter(None, [sections.get("See Also", "").strip()])])
    parts = [
        f"``DataArray.ops.{name}`` on every data variable that {applies_to}.",
        _fill("The other data variables are left untouched, and none of them may share a dim whose size "
              "changes. ``keep_attrs`` applies to the Dataset's attrs and to each variable's."
              + (f" {' '.join(notes.split())}" if notes else "")),
        f"On each variable it transforms, as ``DataArray.ops.{name}``:",
        description,
        _section("Parameters", sections["Parameters"]),
        _section("Returns", "xarray.Dataset\n" + _fill(
            f"The result of ``DataArray.ops.{name}`` for each data variable that {applies_to}, "
            "beside the untouched ones.", indent="    ")),
        _section("Raises", "\n".join(["DimensionError", _fill(dimension_error, indent="    "),
                                      *("\n".join(entry) for entry in raises)])),
        _section("See Also", see_also),
        _section("Examples", own_sections["Examples"]),
    ]
    return "\n\n".join(parts) + "\n"


def _split(doc: str) -> tuple[str, dict[str, str]]:
    """(the text before the first section, {section title: its body}) of a numpydoc docstring."""
    lines = inspect.cleandoc(doc).splitlines()
    heads = [k for k in range(len(lines) - 1) if lines[k] and lines[k + 1] == "-" * len(lines[k])]
    before = "\n".join(lines[: heads[0] if heads else len(lines)]).strip()
    bodies = {}
    for k, start in enumerate(heads):
        end = heads[k + 1] if k + 1 < len(heads) else len(lines)
        bodies[lines[start]] = "\n".join(lines[start + 2:end]).strip("\n")
    return before, bodies


def _entries(body: str) -> list[list[str]]:
    """The entries of a Raises-like section: each a list of its type line and description lines."""
    entries = []
    for line in body.splitlines():
        if line and not line[0].isspace():
            entries.append([line])
        elif entries and line.strip():
            entries[-1].append(line)
    return entries


def _section(title: str, body: str) -> str:
    return f"{title}\n{'-' * len(title)}\n{body}"


def _fill(text: str, indent: str = "") -> str:
    return textwrap.fill(text, width=_WIDTH, initial_indent=indent, subsequent_indent=indent)
