"""OGC process summaries and descriptions, generated from the registry and the ``schemas``
models (so the schema of every parameter is the one ``ops`` validates with, as the OpenAPI 3.0
Schema Object that OGC API - Processes 1.0 asks a description for)."""

from __future__ import annotations

import copy

from ops import registry
from ops.dims import ROLES
from schemas.service import ARRAY_NAME_PATTERN, NPY_MEDIA_TYPE, OGC_REL
from service.api import oas30

JOB_CONTROL = ["sync-execute", "async-execute", "dismiss"]
TRANSMISSION = ["value", "reference"]

_ARRAY_ROLES = {
    "x": "the input tensor",
    "params": "the tensor to gather from",
    "indices": "int32/int64 index tuples along the last axis",
    "src": "the quantised values, [m, n] or [n]",
    "deq_scale": "the scale: a number, or a stored/inline array",
}

# A link to a stored array: /arrays/NAME, arrays/NAME, or this service's own absolute URL of it.
HREF_PATTERN = r"^((https?://[^/?#]+)?(/[^?#]*)?/)?arrays/" + ARRAY_NAME_PATTERN.removeprefix("^")
BASE64_PATTERN = r"^([A-Za-z0-9+/]{4})*([A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"

# oneOf: exactly one form applies to any value. An object with both href and value is taken
# as the link, so the inline form is an object with a value and no href.
ARRAY_INPUT_SCHEMA = {
    "oneOf": [
        {"type": "object", "required": ["href"],
         "properties": {"href": {"type": "string", "pattern": HREF_PATTERN,
                                 "description": "/arrays/NAME (or this service's absolute URL of it)"},
                        "type": {"description": "a media type hint, not used"}}},
        {"type": "object", "required": ["value"], "not": {"required": ["href"]},
         "properties": {"value": {"type": "string", "contentEncoding": "base64", "contentMediaType": NPY_MEDIA_TYPE,
                                  "pattern": BASE64_PATTERN},
                        "encoding": {"type": "string", "enum": ["base64"]},
                        "mediaType": {"type": "string", "enum": [NPY_MEDIA_TYPE]},
                        "dtype": {"type": "string", "enum": ["bfloat16", "complex32", None], "nullable": True,
                                  "description": "bfloat16 / complex32 when value holds those types' raw bits"}}},
    ]
}

# The roles as properties, no others: OpenAPI 3.0 has no propertyNames.
DIMS_SCHEMA = {
    "description": f"Roles ({', '.join(ROLES)}) mapped to dim names of the input, as the accessor's dims= "
                   "(null: not given)",
    "type": "object", "nullable": True,
    "properties": {role: {"type": "string"} for role in ROLES}, "additionalProperties": False,
}


def inline_refs(schema: dict, defs: dict):
    """``schema`` with every ``$ref`` into ``defs`` replaced by its definition."""
    if isinstance(schema, dict):
        if "$ref" in schema:
            return inline_refs(copy.deepcopy(defs[schema["$ref"].split("/")[-1]]), defs)
        return {k: inline_refs(v, defs) for k, v in schema.items()}
    if isinstance(schema, list):
        return [inline_refs(v, defs) for v in schema]
    return schema


def _links(base: str, op: registry.Operator) -> list[dict]:
    return [
        {"href": f"{base}/processes/{op.name}", "rel": "self", "type": "application/json", "title": op.title},
        {"href": f"{base}/processes/{op.name}/execution", "rel": OGC_REL + "execute",
         "type": "application/json", "title": f"Execute {op.title}"},
    ]


def summary(op: registry.Operator, base: str) -> dict:
    return {
        "id": op.name,
        "version": registry.VERSION,
        "title": op.title,
        "description": op.description,
        "jobControlOptions": JOB_CONTROL,
        "outputTransmission": TRANSMISSION,
        "links": _links(base, op),
    }


def description(op: registry.Operator, base: str) -> dict:
    model_schema = op.params.model_json_schema()
    defs = model_schema.get("$defs", {})
    required = set(model_schema.get("required", []))
    inputs = {}
    for name in op.array_inputs:
        schema = copy.deepcopy(ARRAY_INPUT_SCHEMA)
        if name in op.scalar_inputs:
            schema["oneOf"].append({"type": "number"})
        inputs[name] = {"title": name, "description": _ARRAY_ROLES.get(name, ""), "schema": schema,
                        "minOccurs": 1, "maxOccurs": 1}
    for name, prop in model_schema["properties"].items():
        prop = oas30.schema(inline_refs(prop, defs), content=True)
        inputs[name] = {"title": prop.pop("title", name), "description": prop.get("description", ""),
                        "schema": prop, "minOccurs": 1 if name in required else 0, "maxOccurs": 1}
    if op.accepts_dims:
        inputs["dims"] = {"title": "dims", "description": DIMS_SCHEMA["description"], "schema": DIMS_SCHEMA,
                          "minOccurs": 0, "maxOccurs": 1}
    outputs = {"result": {"title": "result", "description": f"The {op.title} result, as NPY or a stored array",
                          "schema": {"type": "string", "contentMediaType": NPY_MEDIA_TYPE, "contentEncoding": "binary"}}}
    return {**summary(op, base), "inputs": inputs, "outputs": outputs}
