"""``chunked-tensor-ops run``'s flags: ``--param``, ``--input``, ``--variable`` and ``--chunks``
parsed, and the operator's call bound from them by the registry as every door's is (exit 2
with the same message the service and the accessor give).
"""

from __future__ import annotations

import ast
import json
import re

from ops import registry
from ops.errors import InvalidArgument, MissingInput
from service.cli.run_errors import usage

def parse_value(text: str, name: str = "VALUE"):
    """A ``--param`` value: JSON (``2``, ``[[1,1],[0,0]]``, ``true``, ``"DCR"``), or the text
    itself when it is not JSON (``DCR``, ``float16``). Text that starts as a JSON list, object
    or string but does not parse is a usage error naming the parameter, not a string."""
    try:
        return json.loads(text)
    except ValueError as error:
        if text.lstrip()[:1] in ("[", "{", '"'):
            raise usage(f"--param {name}: invalid JSON ({error}): {text}") from None
        return text


def parse_params(items: list[str]) -> dict[str, object]:
    """``["block_size=2", "mode=DCR"]`` -> ``{"block_size": 2, "mode": "DCR"}``."""
    params: dict[str, object] = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or not name:
            raise usage(f"--param must be NAME=VALUE (VALUE as JSON), got {item!r}")
        if name in params:
            raise usage(f"--param {name} is given twice")
        params[name] = parse_value(text, name)
    return params


def _role_and_value(item: str, op: registry.Operator) -> tuple[str, str]:
    """``ROLE=VALUE`` when the text before the first ``=`` names an array input of ``op``, else
    the first array input and the whole text (so values with ``=`` in them work)."""
    role, sep, value = item.partition("=")
    return (role, value) if sep and role in op.array_inputs else (op.array_inputs[0], item)


def parse_inputs(items: list[str], op: registry.Operator) -> dict[str, str]:
    """``--input PATH`` (the operator's first array input) or ``--input ROLE=PATH``."""
    inputs: dict[str, str] = {}
    for item in items:
        role, path = _role_and_value(item, op)
        if role in inputs:
            raise usage(f"--input {role} is given twice; {op.name} takes the array inputs "
                        f"{', '.join(op.array_inputs)} (--input ROLE=PATH)")
        if not path:
            raise usage(f"--input {role} needs a path, got {item!r}")
        inputs[role] = path
    return inputs


def parse_variables(items: list[str], op: registry.Operator) -> dict[str, str]:
    """``--variable NAME`` (the first array input) or ``--variable ROLE=NAME``."""
    return dict(_role_and_value(item, op) for item in items)


def parse_chunks(text: str | None, dims: tuple[str, ...]) -> dict | None:
    """``--chunks``: ``1,64,64,16`` (one length per axis, -1 for a whole axis), ``y=64,x=64``
    (by dim name; other axes keep the stored chunks) or ``auto``. None: the stored chunks."""
    if text is None:
        return None
    if text == "auto":
        return {d: "auto" for d in dims}
    parts = [p.strip() for p in text.split(",")]
    try:
        if all("=" in p for p in parts):
            chunks = {name: int(n) for name, n in (p.split("=", 1) for p in parts)}
            unknown = [d for d in chunks if d not in dims]
            if unknown:
                raise usage(f"--chunks names the dim {unknown[0]!r}, which the input does not have; "
                            f"its dims are {list(dims)}; got {text!r}")
        else:
            lengths = [int(p) for p in parts]
            if len(lengths) != len(dims):
                raise usage(f"--chunks must give one length per axis ({len(dims)}), got {text!r}")
            chunks = dict(zip(dims, lengths))
    except ValueError:
        raise usage(f"--chunks must be comma-separated integers, NAME=INTEGER pairs or auto, got {text!r}") \
            from None
    bad = [n for n in chunks.values() if n < 1 and n != -1]
    if bad:
        raise usage(f"--chunks lengths must be >= 1 (or -1 for a whole axis), got {text!r}")
    return chunks


_NAMING = re.compile(r"\.ops\.\w+\(\.\.\., dims=(\{[^}]*\})\)")
_ADDING = re.compile(r"Add it, of length 1: arr\.((?:expand_dims\([^)]*\)\.?)+)\.ops\.\w+\(\.\.\.\)")


def in_cli_terms(message: str) -> str:
    """An operator's message with its advice in this command's terms: ``.ops.OP(...,
    dims={...})`` becomes ``--param 'dims={...}'`` (JSON); a dim to add, which no flag can
    add, becomes what to do to the input first."""
    def naming(match: re.Match) -> str:
        try:
            mapping = ast.literal_eval(match.group(1))
        except (ValueError, SyntaxError):
            return match.group(0)
        return f"--param 'dims={json.dumps(mapping, separators=(',', ':'))}'"

    def adding(match: re.Match) -> str:
        return f"Add it, of length 1, to the input first (in xarray: ds.{match.group(1)}.to_zarr(...))"

    return _ADDING.sub(adding, _NAMING.sub(naming, message))


def _missing_hint(op: registry.Operator, error: MissingInput) -> str:
    """How to give a missing input on the command line."""
    name = error.input
    if error.kind == "parameter":
        return f"--param {name}=VALUE"
    if name in op.scalar_inputs:
        return f"--input {name}=PATH or --param {name}=NUMBER"
    return "--input PATH" if name == op.array_inputs[0] else f"--input {name}=PATH"


def check_arguments(op: registry.Operator, input_items: list[str], param_items: list[str],
                    variable_items: list[str]) -> tuple[registry.BoundCall, dict, dict]:
    """The flags, checked against the operator before anything is read: the call as the
    registry binds it for every door (array inputs given with ``--input`` stand as their
    paths until they are opened; those given as JSON with ``--param`` are arrays or numbers),
    the input paths by role and the variables by role."""
    params = parse_params(param_items)
    paths = parse_inputs(input_items, op)
    variables = parse_variables(variable_items, op)
    both = [k for k in params if k in paths]
    if both:
        raise usage(f"{both[0]} is given both as --input and as --param; give it once")
    try:
        call = registry.bind(op.name, {**params, **paths})
    except MissingInput as error:
        raise usage(f"{error} ({_missing_hint(op, error)})") from None
    except InvalidArgument as error:
        raise usage(str(error)) from None
    stray = [k for k in variables if k not in paths]
    if stray:
        raise usage(f"--variable {stray[0]}=...: there is no --input {stray[0]}")
    return call, paths, variables
