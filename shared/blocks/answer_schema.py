"""The JSON Schema an `ai.generate` answer must satisfy: which part of JSON Schema onceflow
checks on receipt, the check itself, and a stand-in answer built from a schema (rehearsals).

Only a subset is accepted, and a schema using any other keyword is refused when the workflow
is validated, so the check on receipt is never silently weaker than the schema the author
wrote. The subset is what structured output needs for classification and extraction (and what
Vertex AI's own `responseSchema` supports: type, properties, required, enum, items, and the
numeric and length bounds; https://docs.cloud.google.com/vertex-ai/generative-ai/docs/multimodal/control-generated-output).
No JSON-Schema library is a runtime dependency (jsonschema_rs is a test-only one), and this
subset is small enough to check here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

SUPPORTED = frozenset(
    {
        "type",
        "properties",
        "required",
        "enum",
        "items",
        "additionalProperties",
        "minimum",
        "maximum",
        "minLength",
        "maxLength",
        "minItems",
        "maxItems",
        "description",
        "title",
        "nullable",
    }
)
TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})


def unsupported(schema: Any, path: str = "$") -> list[str]:
    """Why `schema` is outside the checked subset (empty: it is inside)."""
    if not isinstance(schema, Mapping):
        return [f"{path}: a schema must be an object"]
    problems = [f"{path}: unsupported keyword {k!r}" for k in schema if k not in SUPPORTED]
    kind = schema.get("type")
    if kind is not None and kind not in TYPES:
        problems.append(f"{path}: unknown type {kind!r}")
    for name, sub in (schema.get("properties") or {}).items():
        problems += unsupported(sub, f"{path}.{name}")
    if "items" in schema:
        problems += unsupported(schema["items"], f"{path}[]")
    extra = schema.get("additionalProperties")
    if extra is not None and not isinstance(extra, bool):
        problems.append(f"{path}: additionalProperties must be true or false")
    return problems


def _is_type(value: Any, kind: str) -> bool:
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    python = {"object": dict, "array": list, "string": str, "boolean": bool}
    return value is None if kind == "null" else isinstance(value, python[kind])


def violations(value: Any, schema: Mapping[str, Any], path: str = "$") -> list[str]:
    """Where `value` breaks `schema` (a schema `unsupported` accepted); empty: it conforms."""
    if value is None and schema.get("nullable"):
        return []
    kind = schema.get("type")
    if kind is not None and not _is_type(value, kind):
        return [f"{path}: expected {kind}, got {type(value).__name__}"]
    found: list[str] = []
    if "enum" in schema and value not in schema["enum"]:
        found.append(f"{path}: {value!r} is not one of {schema['enum']!r}")
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        found += [f"{path}: missing {k!r}" for k in schema.get("required", ()) if k not in value]
        if schema.get("additionalProperties") is False:
            found += [f"{path}: unexpected {k!r}" for k in value if k not in props]
        for name, sub in props.items():
            if name in value:
                found += violations(value[name], sub, f"{path}.{name}")
    if isinstance(value, list):
        found += _bounds(len(value), schema, "minItems", "maxItems", path, unit="items")
        for i, item in enumerate(value):
            found += violations(item, schema.get("items") or {}, f"{path}[{i}]")
    if isinstance(value, str):
        found += _bounds(len(value), schema, "minLength", "maxLength", path, unit="characters")
    if _is_type(value, "number"):
        found += _bounds(value, schema, "minimum", "maximum", path, unit="")
    return found


def _bounds(
    n: float, schema: Mapping[str, Any], low: str, high: str, path: str, *, unit: str
) -> list[str]:
    what = f"{n} {unit}".strip()
    if low in schema and n < schema[low]:
        return [f"{path}: {what} is below {low} {schema[low]}"]
    if high in schema and n > schema[high]:
        return [f"{path}: {what} is above {high} {schema[high]}"]
    return []


_SCALAR_EXAMPLES: dict[str, Any] = {"boolean": False, "null": None}


def example(schema: Mapping[str, Any]) -> Any:
    """The smallest answer that satisfies `schema`: the rehearsal's stand-in when the step
    declares no `rehearsal_answer` (first enum value, lower bounds, required properties)."""
    if schema.get("enum"):
        return schema["enum"][0]
    kind = schema.get("type")
    if kind == "object":
        props = schema.get("properties") or {}
        return {k: example(props.get(k) or {}) for k in schema.get("required", props)}
    if kind == "array":
        return [example(schema.get("items") or {}) for _ in range(int(schema.get("minItems", 0)))]
    if kind == "string":
        return "x" * int(schema.get("minLength", 0))
    if kind in ("number", "integer"):
        return schema.get("minimum", 0)
    return _SCALAR_EXAMPLES.get(str(kind))
