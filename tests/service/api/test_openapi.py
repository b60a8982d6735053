"""The OpenAPI document describes what the service takes, from the same models as ops."""

from __future__ import annotations

import json
import re

import pytest

from ops import registry
from service.api.app import create_app


@pytest.mark.smoke
def test_execute_inputs_are_the_params_models_of_every_operator():
    document = create_app().openapi()
    body = document["paths"]["/processes/{process_id}/execution"]["post"]["requestBody"]
    variants = body["content"]["application/json"]["schema"]["properties"]["inputs"]["anyOf"]
    assert len(variants) == len(registry.OPERATORS)
    executions = [path for path in document["paths"] if path.endswith("/execution")]
    assert executions == [f"/processes/{name}/execution" for name in registry.OPERATORS] + [
        "/processes/{process_id}/execution"]
    for op, variant in zip(registry.OPERATORS.values(), variants):
        # each process's own execution operation has the same inputs as its variant
        own = document["paths"][f"/processes/{op.name}/execution"]["post"]["requestBody"]
        assert own["content"]["application/json"]["schema"]["properties"]["inputs"] == {
            **variant, "description": "array inputs and keyword parameters"}
        model = op.params.model_json_schema()
        for name in op.keywords:
            # the same rules: bounds and enums straight from the schemas model (FastAPI drops nulls)
            published = {k: v for k, v in variant["properties"][name].items() if v is not None}
            expected = {k: v for k, v in model["properties"][name].items()
                        if k not in ("title", "description") and v is not None}
            if "$ref" not in json.dumps(expected):
                assert published == expected, name
        assert set(variant["required"]) == set(op.array_inputs) | set(model.get("required", []))


def test_every_reference_resolves():
    document = create_app().openapi()
    refs = set(re.findall(r'"\$ref": "([^"]+)"', json.dumps(document)))
    known = {f"#/components/schemas/{name}" for name in document["components"]["schemas"]}
    assert refs <= known, refs - known
