"""The `ops` function's app: the router over the route table, `/openapi.json`, and the switch
that sends `/ui` to the page (shared/ops/page.py).
"""

from __future__ import annotations

import json

from flask import Request, Response
from werkzeug.exceptions import MethodNotAllowed, NotFound
from werkzeug.routing import Map, Rule

from shared.core import request_body
from shared.ops import page
from shared.ops.api.http import (
    MAX_BODY_BYTES,
    Call,
    OpsApi,
    error_response,
    parse_query,
    read_body,
    refusal,
)
from shared.ops.api.routes import ROUTE_BY_NAME, ROUTES
from shared.ops.api.tokens import bootstrap, bootstrap_token
from shared.ops.errors import OpsError
from shared.ops.openapi import openapi_document

_URL_MAP = Map(
    [
        Rule(r.path.replace("{", "<").replace("}", ">"), endpoint=r.name, methods=[r.method])
        for r in ROUTES
    ]
    + [Rule("/openapi.json", endpoint="openapi", methods=["GET"])],
    strict_slashes=False,
)


def answer(api: OpsApi, request: Request) -> Response:
    """The JSON API's answer to a request, its refusals included."""
    try:
        return _answer(api, request)
    except OpsError as err:
        return error_response(err)


def _answer(api: OpsApi, request: Request) -> Response:
    try:
        # Before the token lookup and before a byte is read, as the webhook does.
        request_body.refuse_declared_length(request.content_length, MAX_BODY_BYTES)
    except request_body.BodyRefused as refused:
        raise refusal(refused) from None
    adapter = _URL_MAP.bind("ops", "/")
    try:
        endpoint, params = adapter.match(request.path, method=request.method)
    except MethodNotAllowed:
        raise OpsError(
            405, "method_not_allowed", f"{request.method} is not allowed on {request.path}"
        ) from None
    except NotFound:
        raise OpsError(404, "no_such_route", f"nothing is served at {request.path}") from None
    if endpoint == "openapi":
        return Response(json.dumps(openapi_document(ROUTES)), mimetype="application/json")
    route = ROUTE_BY_NAME[endpoint]
    if route.handler is bootstrap_token:
        return bootstrap(api, request, route)
    principal = api.authenticate(request)
    query = parse_query(request, route.query)
    body = read_body(request, route.body) if route.body is not None else None
    call = Call(
        db=api.db,
        principal=principal,
        path=params,
        query=query,
        body=body,
        dispatch=api.dispatch,
    )
    return api.invoke(route, call)


_default_api: OpsApi | None = None


def default_api() -> OpsApi:
    global _default_api  # noqa: PLW0603 - one per instance, reused across invocations
    if _default_api is None:
        _default_api = OpsApi()
    return _default_api


def handle_request(request: Request) -> Response:
    """The `ops` function's whole job: the JSON API, the page, and /openapi.json."""
    if request.path == "/ui" or request.path.startswith("/ui/"):
        return page.handle(default_api(), request)
    return answer(default_api(), request)
