"""`/openapi.json`, generated from the route table it is given (the app passes its one
`ROUTES`) and the pydantic models that validate requests, so the document and the handlers
can't disagree."""

from __future__ import annotations

from functools import cache
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from shared.ops.api.http import EmptyQuery, Route
from shared.ops.models import ErrorBody

REF = "#/components/schemas/{model}"
STATUS_WORDS = {
    200: "OK",
    201: "Created",
    303: "See Other: send the browser to the Location",
    400: "Bad request (malformed JSON or body framing, JSON nested too deep, bad query or cursor)",
    408: "The body did not arrive within the body deadline",
    401: "No valid bearer token",
    404: "Not found (or another tenant's)",
    409: "Conflicts with the current state",
    410: "Gone: too late (an approval past its expiry)",
    413: "Body too large",
    422: "Body or parameters not valid",
    501: "Not available in this build",
}


def _query_parameters(model: type[BaseModel]) -> list[dict[str, Any]]:
    if model is EmptyQuery:
        return []
    schema = model.model_json_schema(ref_template=REF)
    required = set(schema.get("required", []))
    params = []
    for name, declared in schema.get("properties", {}).items():
        prop = dict(declared)
        description = prop.pop("description", None)
        prop.pop("title", None)
        param: dict[str, Any] = {
            "name": name,
            "in": "query",
            "required": name in required,
            "schema": prop,
        }
        if description:
            param["description"] = description
        params.append(param)
    return params


def _error_response(code: int) -> dict[str, Any]:
    return {
        "description": STATUS_WORDS.get(code, ""),
        "content": {"application/json": {"schema": {"$ref": REF.format(model="ErrorBody")}}},
    }


def _operation(r: Route) -> dict[str, Any]:
    op: dict[str, Any] = {
        "operationId": r.name,
        "summary": r.summary,
        "parameters": [
            {
                "name": p,
                "in": "path",
                "required": True,
                "schema": (
                    {"type": "string", "enum": list(dict(r.path_choices)[p])}
                    if p in dict(r.path_choices)
                    else {"type": "string", "format": "uuid"}
                ),
            }
            for p in r.path_params
        ]
        + _query_parameters(r.query),
        "responses": {
            str(r.status): {
                "description": STATUS_WORDS.get(r.status, ""),
                "content": {
                    "application/json": {"schema": {"$ref": REF.format(model=r.response.__name__)}}
                },
            },
            **{
                str(code): _error_response(code)
                # Any route that reads a body can time out reading it (request_body).
                for code in sorted({*r.errors, *((408,) if r.body is not None else ())})
            },
        },
    }
    if r.body is not None:
        op["requestBody"] = {
            "required": True,
            "content": {
                "application/json": {"schema": {"$ref": REF.format(model=r.body.__name__)}}
            },
        }
    return op


# The document's own route: served without a token, so it says so.
OPENAPI_PATH = {
    "get": {
        "operationId": "openapi",
        "summary": "This document",
        "security": [],
        "responses": {
            "200": {
                "description": "OK",
                "content": {"application/json": {"schema": {"type": "object"}}},
            }
        },
    }
}


@cache
def openapi_document(routes: tuple[Route, ...]) -> dict[str, Any]:
    """The document for `routes` (shared/ops/api/routes.py ROUTES, as the app serves it)."""
    bodies = {r.body for r in routes if r.body is not None}
    responses = {r.response for r in routes} | {ErrorBody}
    keyed: list[tuple[type[BaseModel], Any]] = [(m, "validation") for m in bodies]
    keyed += [(m, "serialization") for m in responses]
    _, top = models_json_schema(keyed, ref_template=REF)
    paths: dict[str, dict[str, Any]] = {}
    for r in routes:
        paths.setdefault(r.path, {})[r.method.lower()] = _operation(r)
    paths["/openapi.json"] = OPENAPI_PATH
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "onceflow ops",
            "version": "1",
            "description": "Runs, journals, refusals, replay, credits and workflows.",
        },
        "paths": paths,
        "components": {
            "schemas": top.get("$defs", {}),
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
    }
