"""The ops API's HTTP layer: what a request is to a handler (`Call`), what a route declares
(`Route`), and what every route shares — the bearer-token check, query and body parsing against
the route's models (unknown fields, wrong types, malformed JSON and oversized bodies are 4xx
with a code and a message), the error model, and the audit row of every mutating call, refused
ones included.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from flask import Request, Response
from pydantic import BaseModel, ValidationError

from shared.core import pubsub, request_body
from shared.core.db import Database, get_database
from shared.core.errors import ConflictError, TransientError
from shared.core.logs import get_logger
from shared.core.settings import settings
from shared.ops import auth, replay
from shared.ops.errors import OpsError, not_found
from shared.ops.models import ErrorBody, FieldProblem

# Requests are small JSON documents; a workflow source is at most 64 KiB of it.
MAX_BODY_BYTES = 96 * 1024


log = get_logger(__name__)


@dataclass(frozen=True)
class Call:
    """One authenticated, validated request, as a handler sees it."""

    db: Database
    principal: auth.Principal
    path: Mapping[str, str]
    query: Any
    body: Any
    dispatch: replay.Dispatch

    @property
    def scope(self) -> str | None:
        return self.principal.tenant_id


Handler = Callable[[Call], BaseModel]


class EmptyQuery(BaseModel):
    model_config = {"extra": "forbid"}


@dataclass(frozen=True)
class Route:
    name: str
    method: str
    path: str  # OpenAPI form: /v1/runs/{run_id}
    handler: Handler
    response: type[BaseModel]
    summary: str
    query: type[BaseModel] = EmptyQuery
    body: type[BaseModel] | None = None
    status: int = 200
    errors: tuple[int, ...] = ()
    path_params: tuple[str, ...] = field(default=())  # the first is the audit row's target
    # Path parameters that are not ids but one of a closed set (a provider's name): documented
    # as that set rather than as a uuid. Pairs, not a dict: a route is hashable (the OpenAPI
    # document is cached per route table).
    path_choices: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # The audit action when it is not the route's name: a template filled from the path
    # (`apps.{provider}.install`), so one route per provider audits as it did per provider.
    action: str | None = None
    # For a 303: where the answer sends the client, taken from the result.
    location: Callable[[Any], str] | None = None

    @property
    def mutating(self) -> bool:
        return self.method != "GET"


def uuid_param(call: Call, name: str, what: str) -> str:
    """A path id; one that is not a UUID names nothing, so it is a 404 like any unknown id."""
    try:
        return str(UUID(call.path[name]))
    except ValueError:
        raise not_found(what) from None


def named_tenant(call: Call, named: str | None) -> str:
    """The tenant a request names: a tenant token's own (naming another is a 404, as for any
    id of another tenant); an admin token must name one."""
    tenant_id = named or call.scope
    if tenant_id is None:
        raise OpsError(422, "tenant_required", "an admin token must name the tenant_id")
    if call.scope is not None and tenant_id != call.scope:
        raise not_found("tenant")
    return tenant_id


def int_param(call: Call, name: str, what: str) -> int:
    """A numeric path id; anything else names nothing (404)."""
    raw = call.path[name]
    if not raw.isascii() or not raw.isdigit() or not 0 < int(raw) < 2**63:
        raise not_found(what)
    return int(raw)


def json_response(
    model: BaseModel, status: int = 200, headers: Mapping[str, str] | None = None
) -> Response:
    return Response(
        model.model_dump_json(),
        status=status,
        headers=dict(headers or {}),
        mimetype="application/json",
    )


def error_response(err: OpsError) -> Response:
    body = ErrorBody(code=err.code, message=err.message, problems=err.problems)
    return json_response(body, err.status, err.headers)


def _problems(exc: ValidationError, where: str) -> list[FieldProblem]:
    return [
        FieldProblem(location=".".join([where, *(str(p) for p in e["loc"])]), problem=e["msg"])
        for e in exc.errors(include_url=False, include_input=False)
    ]


def refusal(refused: request_body.BodyRefused) -> OpsError:
    """A body `shared.core.request_body` refused (too large, malformed, stalled), as the
    API's error."""
    return OpsError(refused.status, refused.code, refused.message)


def read_bounded(request: Request, cap: int) -> bytes:
    """A request's body, read boundedly: oversize 413 before reading, malformed framing 400,
    a stalled body 408. The API's bodies and the page's forms are read this way."""
    try:
        return request_body.read_body(
            request.stream.read,
            declared_length=request.content_length,
            cap=cap,
            environ=request.environ,
            deadline_seconds=settings().request_deadline_seconds,
        )
    except request_body.BodyRefused as refused:
        raise refusal(refused) from None


def _validated(
    model: type[BaseModel], data: Any, where: str, *, status: int, code: str, message: str
) -> Any:
    """`data` as the route's model, or the refusal listing every problem located under
    `where` (query.x, body.y.z)."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise OpsError(status, code, message, _problems(exc, where)) from None


def parse_query(request: Request, model: type[BaseModel]) -> Any:
    raw: dict[str, str] = {}
    for key in request.args:
        values = request.args.getlist(key)
        if len(values) != 1:
            raise OpsError(400, "invalid_query", f"query parameter {key!r} is given twice")
        raw[key] = values[0]
    return _validated(
        model,
        raw,
        "query",
        status=400,
        code="invalid_query",
        message="the query parameters are not valid",
    )


def read_body(request: Request, model: type[BaseModel]) -> Any:
    """The route's body model from a bounded read (`read_bounded`); malformed JSON and too
    deep nesting 400, anything but a JSON object 422."""
    raw = read_bounded(request, MAX_BODY_BYTES)
    try:
        data = request_body.parse_json(raw) if raw.strip() else {}
    except request_body.BodyRefused as refused:
        raise refusal(refused) from None
    if not isinstance(data, dict):
        raise OpsError(422, "invalid_body", "the request body must be a JSON object")
    return _validated(
        model,
        data,
        "body",
        status=422,
        code="invalid_body",
        message="the request body is not valid",
    )


class OpsApi:
    """The API bound to a database and a step dispatcher (Pub/Sub in production)."""

    def __init__(
        self, db: Database | None = None, dispatch: replay.Dispatch = pubsub.publish_step_ready
    ) -> None:
        self._db = db
        self.dispatch = dispatch

    @property
    def db(self) -> Database:
        return self._db or get_database()

    def authenticate(self, request: Request) -> auth.Principal:
        token = auth.bearer_from_header(request.headers.get("Authorization"))
        try:
            principal = auth.authenticate(self.db, token)
        except TransientError as exc:
            raise unavailable(exc) from exc
        if principal is None:
            raise OpsError(
                401,
                "unauthenticated",
                "send a valid ops token as 'Authorization: Bearer <token>'",
                headers={"WWW-Authenticate": 'Bearer realm="onceflow-ops"'},
            )
        return principal

    def invoke(self, route: Route, call: Call) -> Response:
        result = self.run_route(route, call)
        headers = {"Location": route.location(result)} if route.location else None
        return json_response(result, route.status, headers)

    def run_route(self, route: Route, call: Call) -> BaseModel:
        """The handler's result; errors as OpsError; mutating calls audited either way."""
        target = next((call.path[p] for p in route.path_params), None)
        try:
            result = route.handler(call)
        except OpsError as err:
            if route.mutating:
                self._audit(
                    call,
                    route,
                    target,
                    {"outcome": "refused", "code": err.code, "status": err.status},
                )
            raise
        except TransientError as exc:
            raise unavailable(exc) from exc
        except ConflictError as exc:
            raise OpsError(
                409, "conflict", f"the change conflicts with existing data: {exc}"
            ) from exc
        except Exception as exc:
            log.exception("ops %s failed", route.name)
            raise OpsError(500, "internal", "the request failed; it was logged") from exc
        if route.mutating:
            self._audit(
                call,
                route,
                target,
                {"outcome": "done", "status": route.status, "body": _audited_body(call.body)},
            )
        return result

    def _audit(self, call: Call, route: Route, target: str | None, detail: dict[str, Any]) -> None:
        action = route.action.format(**call.path) if route.action else route.name
        auth.record_audit(call.db, call.principal, action=action, target=target, detail=detail)


def _audited_body(body: BaseModel | None) -> Any:
    if body is None:
        return None
    dumped = body.model_dump(mode="json")
    # A definition's source is kept in its version row; the audit notes only its size.
    if isinstance(dumped.get("source"), str):
        dumped["source"] = {"chars": len(dumped["source"])}
    return dumped


def unavailable(exc: TransientError) -> OpsError:
    return OpsError(
        503,
        "unavailable",
        f"try again shortly: {exc}",
        headers={"Retry-After": str(int(exc.retry_after or 1))},
    )
