"""OpenAPI 3.0 from the JSON Schema (2020-12) that pydantic and FastAPI write: ``schema``
turns one schema into an OpenAPI 3.0 Schema Object, ``document`` a whole OpenAPI document
into a 3.0.3 one. The service publishes 3.0 (OGC API - Processes 1.0's ``oas30`` class, and
its process descriptions' ``schema`` members are OpenAPI 3.0 Schema Objects too)."""

from __future__ import annotations

import copy
import json
from typing import Any

VERSION = "3.0.3"

# The Schema Object's fields in OpenAPI 3.0 (and the ``$ref`` of a Reference Object).
_FIELDS = {
    "title", "multipleOf", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum", "maxLength",
    "minLength", "pattern", "maxItems", "minItems", "uniqueItems", "maxProperties", "minProperties",
    "required", "enum", "type", "allOf", "oneOf", "anyOf", "not", "items", "properties",
    "additionalProperties", "description", "format", "default", "nullable", "discriminator", "readOnly",
    "writeOnly", "xml", "externalDocs", "example", "deprecated", "$ref",
}
# JSON Schema annotations that 3.0 has no field for and that say nothing a validator checks.
_DROPPED = {"$schema", "$id", "$comment", "$anchor"}
# OGC API - Processes' schema.yaml adds these to the 3.0 fields (for binary inputs and outputs).
CONTENT = {"contentMediaType", "contentEncoding"}


def schema(node: Any, *, content: bool = False, components: dict | None = None) -> Any:
    """``node`` (a JSON Schema) as an OpenAPI 3.0 Schema Object, a new object. ``content``:
    keep ``contentMediaType``/``contentEncoding`` (OGC process descriptions allow them; an
    OpenAPI document says base64 as ``format: byte``). ``components``: the document's
    ``components/schemas``, to know the type behind a ``$ref`` made nullable. ValueError for
    a keyword that 3.0 cannot say and whose loss would loosen the schema."""
    if not isinstance(node, dict):
        return node
    node = {k: v for k, v in node.items() if k not in _DROPPED}
    if "$defs" in node:
        raise ValueError("$defs: inline or move the definitions to components/schemas first")
    convert = lambda child: schema(child, content=content, components=components)  # noqa: E731
    for key in ("properties",):
        if isinstance(node.get(key), dict):
            node[key] = {name: convert(child) for name, child in node[key].items()}
    for key in ("items", "additionalProperties", "not", "propertyNames"):
        if isinstance(node.get(key), dict):
            node[key] = convert(node[key])
    for key in ("allOf", "anyOf", "oneOf", "prefixItems"):
        if isinstance(node.get(key), list):
            node[key] = [convert(child) for child in node[key]]

    if "const" in node:
        node["enum"] = [node.pop("const")]
    if "examples" in node:
        examples = node.pop("examples")
        if isinstance(examples, list) and examples and "example" not in node:
            node["example"] = examples[0]
    for bound, exclusive in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        value = node.get(exclusive)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            node[bound] = value  # 2020-12's number form: 3.0 says the bound, and that it is exclusive
            node[exclusive] = True
    _tuple_items(node)
    _property_names(node)
    _content(node, content)
    node = _null_alternatives(node, components)
    if isinstance(node.get("type"), list):
        node = _type_list(node)
    _one_of_types(node)

    unknown = set(node) - _FIELDS - (CONTENT if content else set())
    unknown = {key for key in unknown if not key.startswith("x-")}
    if unknown:
        raise ValueError(f"OpenAPI 3.0 has no {', '.join(sorted(unknown))} (in {json.dumps(node)[:200]})")
    return node


def _tuple_items(node: dict) -> None:
    """``prefixItems`` (a tuple): 3.0's ``items`` is one schema for every item, so it becomes
    the one the positions share (or ``anyOf`` the distinct ones); the length stays in
    ``minItems``/``maxItems``."""
    if "prefixItems" not in node:
        return
    alternatives = list(node.pop("prefixItems"))
    extra = node.pop("items", None)
    if isinstance(extra, dict):
        alternatives.append(extra)
    distinct = []
    for alternative in alternatives:
        if alternative not in distinct:
            distinct.append(alternative)
    node["items"] = distinct[0] if len(distinct) == 1 else {"anyOf": distinct}
    if extra is False or extra is None:
        node.setdefault("maxItems", len(alternatives))


def _property_names(node: dict) -> None:
    """``propertyNames`` with an ``enum``: each allowed name becomes a property with the
    ``additionalProperties`` schema, and no other is allowed (the same rule, in 3.0 terms)."""
    names = node.pop("propertyNames", None)
    if names is None:
        return
    if set(names) - {"enum", "type", "description", "title"} or not isinstance(names.get("enum"), list):
        raise ValueError(f"OpenAPI 3.0 cannot say propertyNames {json.dumps(names)[:200]}")
    value = node.get("additionalProperties", {})
    value = {} if value is True else value
    node["properties"] = {name: copy.deepcopy(value) for name in names["enum"]} | node.get("properties", {})
    node["additionalProperties"] = False


def _content(node: dict, keep: bool) -> None:
    if keep:
        return
    encoding = node.pop("contentEncoding", None)
    node.pop("contentMediaType", None)
    if encoding in ("base64", "binary") and "format" not in node:
        node["format"] = "byte" if encoding == "base64" else "binary"


_ANNOTATIONS = {"title", "description", "default", "example", "nullable"}


def _one_of_types(node: dict) -> None:
    """``anyOf`` whose alternatives are of different types is ``oneOf`` (OGC API - Processes
    asks inputs of mixed type for ``oneOf``): exactly one matches any value. A bare integer
    beside a bare number is dropped first (every integer is a number)."""
    alternatives = node.get("anyOf")
    if not isinstance(alternatives, list) or not all(isinstance(a.get("type"), str) for a in alternatives):
        return
    if any(a["type"] == "number" and not set(a) - _ANNOTATIONS - {"type"} for a in alternatives):
        alternatives = [a for a in alternatives if a["type"] != "integer" or set(a) - _ANNOTATIONS - {"type"}]
    types = [a["type"] for a in alternatives]
    number_twice = "number" in types and "integer" in types
    if len(set(types)) < len(types) or number_twice:
        return
    node.pop("anyOf")
    if len(alternatives) == 1:
        node.update({k: v for k, v in alternatives[0].items() if k not in node})
    else:
        node["oneOf"] = alternatives


def _is_null(alternative: Any) -> bool:
    return isinstance(alternative, dict) and alternative.get("type") == "null" and len(alternative) == 1


def _null_alternatives(node: dict, components: dict | None) -> dict:
    """``anyOf``/``oneOf`` with a ``{"type": "null"}`` alternative: the others, ``nullable``."""
    for key in ("anyOf", "oneOf"):
        alternatives = node.get(key)
        if not isinstance(alternatives, list) or not any(_is_null(a) for a in alternatives):
            continue
        rest = [a for a in alternatives if not _is_null(a)]
        node.pop(key)
        if len(rest) == 1:
            only = rest[0]
            if "$ref" in only:  # siblings of $ref are ignored in 3.0: wrap it
                only = {"allOf": [only], **_referenced_type(only["$ref"], components)}
            # the alternative's rules, the outer schema's annotations (title, description, default)
            node = {**only, **node}
            _nullable(node)
        else:
            node[key] = [_made_nullable(a, components) for a in rest]
    return node


def _referenced_type(ref: str, components: dict | None) -> dict:
    target = (components or {}).get(ref.rsplit("/", 1)[-1], {})
    return {"type": target["type"]} if isinstance(target.get("type"), str) else {}


def _made_nullable(alternative: dict, components: dict | None) -> dict:
    if "$ref" in alternative:
        alternative = {"allOf": [alternative], **_referenced_type(alternative["$ref"], components)}
    alternative = dict(alternative)
    _nullable(alternative)
    return alternative


def _nullable(node: dict) -> None:
    """``nullable: true``, and null among the ``enum`` values if there is one (an enum
    without null forbids it, nullable or not: OpenAPI 3.0.3)."""
    node["nullable"] = True
    if isinstance(node.get("enum"), list) and None not in node["enum"]:
        node["enum"] = [*node["enum"], None]


def _type_list(node: dict) -> dict:
    types = [t for t in node["type"] if t != "null"]
    nullable = len(types) < len(node["type"])
    if len(types) == 1:
        node["type"] = types[0]
    else:
        node.pop("type")
        node["anyOf"] = [{"type": t} for t in types]
    if nullable:
        _nullable(node)
    return node


def document(openapi: dict) -> dict:
    """An OpenAPI document (FastAPI's 3.1) as a new 3.0.3 one: every schema converted."""
    openapi = copy.deepcopy(openapi)
    openapi["openapi"] = VERSION
    components = openapi.get("components", {})
    originals = dict(components.get("schemas", {}))
    convert = lambda node: schema(node, components=originals)  # noqa: E731
    if "schemas" in components:
        components["schemas"] = {name: convert(node) for name, node in components["schemas"].items()}
    for item in openapi.get("paths", {}).values():
        for parameter in item.get("parameters", []):
            _parameter(parameter, convert)
        for method, operation in item.items():
            if method == "parameters" or not isinstance(operation, dict):
                continue
            for parameter in operation.get("parameters", []):
                _parameter(parameter, convert)
            _contents(operation.get("requestBody", {}), convert)
            for response in operation.get("responses", {}).values():
                _contents(response, convert)
                for header in response.get("headers", {}).values():
                    _parameter(header, convert)
    return openapi


def _parameter(parameter: dict, convert) -> None:
    if "schema" in parameter:
        parameter["schema"] = convert(parameter["schema"])
    _contents(parameter, convert)


def _contents(holder: dict, convert) -> None:
    for media in holder.get("content", {}).values():
        if "schema" in media:
            media["schema"] = convert(media["schema"])
