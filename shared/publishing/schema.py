"""The JSON Schema editors use to check workflow files as they are typed (`make schema`).

It is the definition models' schema, plus, per registered block type, the schema of that
block's config (`if type == X then config matches X's model`). A config value may always be a
`${{ … }}` template instead of its declared type, since its value is only known at run time.
"""

from __future__ import annotations

import json
from typing import Any

from shared.blocks import registry
from shared.workflows.definition import WorkflowDefinition
from shared.workflows.scope import ROOTS, RULE_ROOTS

SCHEMA_ID = "https://onceflow.dev/schema/workflow.schema.json"
TEMPLATE_STRING = {"type": "string", "pattern": r"\$\{\{.*\}\}"}


def build_schema() -> dict[str, Any]:
    schema = WorkflowDefinition.model_json_schema(ref_template="#/$defs/{model}")
    defs: dict[str, Any] = schema.setdefault("$defs", {})
    rules: list[dict[str, Any]] = []
    for spec in registry.all_specs():
        config = spec.config_model.model_json_schema(ref_template="#/$defs/{model}")
        for name, sub in config.pop("$defs", {}).items():
            if name in defs and defs[name] != _templatable(sub):
                raise ValueError(f"two block configs define different schemas named {name!r}")
            defs[name] = _templatable(sub)
        rules.append(
            {
                "if": {"properties": {"type": {"const": spec.type_name}}, "required": ["type"]},
                "then": {"properties": {"config": _templatable(config)}},
            }
        )
    defs["ExpressionScope"] = expression_scope()
    known = [s.type_name for s in registry.all_specs()]
    step = defs["Step"]
    step["properties"]["type"]["examples"] = known
    step["allOf"] = rules
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        **schema,
    }


def expression_scope() -> dict[str, Any]:
    """What CEL expressions read (rules, record expressions, branch conditions, templates),
    from its one description in shared/workflows/scope.py."""
    return {
        "title": "ExpressionScope",
        "description": "The names a CEL expression can read. A trigger rule and a record "
        f"expression read {', '.join(sorted(RULE_ROOTS))}; steps read all of them.",
        "type": "object",
        "properties": {name: {"description": text} for name, text in ROOTS.items()},
    }


def _templatable(schema: dict[str, Any]) -> dict[str, Any]:
    """Every property may also be a `${{ … }}` string."""
    out = dict(schema)
    props = out.get("properties")
    if isinstance(props, dict):
        out["properties"] = {
            name: {"anyOf": [_templatable(p), TEMPLATE_STRING]} for name, p in props.items()
        }
    return out


def render_schema() -> str:
    return json.dumps(build_schema(), indent=2, sort_keys=True) + "\n"
