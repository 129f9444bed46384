"""The receive path of `POST /{provider}/{connection_id}`: size cap, verify, store, answer.

Order matters: the size is checked before anything is read or looked up, the signature before
anything is stored, and nothing but the inbox insert happens before the answer (HubSpot waits
only a few seconds). Refusals store nothing and log the check that failed, never the secret.

| outcome                                   | status |
|-------------------------------------------|--------|
| not POST                                  | 405    |
| body over the cap (Content-Length or read)| 413    |
| malformed framing (e.g. a bad chunk)      | 400    |
| body not in within the body deadline      | 408    |
| unknown / other provider's / disconnected | 404    |
| missing, bad or stale signature           | 401    |
| the named secret env var is not set       | 503 (the provider retries; nothing stored) |
| database unavailable                      | 503    |
| stored (new or identical retry)           | 200    |

`POST /{provider}/{connection_id}/{workflow}` is a webhook trigger: verified the same way, then
handed to shared/ingest/webhook_trigger.py (404 without an active webhook workflow of that name, 422
when its idempotency key fails on the request, 200 with the event id, or the first POST's
event id for a duplicate).

The full URI HubSpot v3 signs is the one HubSpot called. Behind Cloud Run (and any proxy)
the request's own URL may not be it, so: `PUBLIC_BASE_URL` (e.g.
`https://hooks.example.com/webhook`), when set, is prepended to the request path and query;
otherwise the scheme is the first `X-Forwarded-Proto` value (Cloud Run sets it to https) or
the request's, and the host is the `Host` header (Cloud Run passes the public host through).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shared.accounts import connections
from shared.core import request_body
from shared.core.db import Database, Tx, get_database
from shared.core.errors import TransientError
from shared.core.logs import get_logger, labelled
from shared.core.settings import settings
from shared.ingest import drops, inbox, webhook_trigger
from shared.providers import registry
from shared.providers.descriptor import SignedRequest, Verdict

# Headers worth keeping with the body: what a normalizer or a person needs later (each
# provider declares its own). Never the Authorization header (a sender's Basic credentials)
# and no signatures.
KEPT_HEADERS = ("content-type", "user-agent", *registry.KEPT_HEADERS)
log = get_logger(__name__)


def read_webhook_body(request: WebhookRequest) -> bytes:
    """The request's body, read under the webhook size cap and body deadline; raises
    request_body.BodyRefused with the status and check to answer."""
    return request_body.read_body(
        request.read,
        declared_length=request.content_length,
        cap=settings().webhook_max_body_bytes,
        environ=request.environ,
        deadline_seconds=settings().request_deadline_seconds,
    )


@dataclass(frozen=True)
class WebhookRequest:
    method: str
    path: str  # decoded path, e.g. /<provider>/5b0c…
    query_string: str  # raw, without the "?"
    scheme: str
    host: str
    headers: Mapping[str, str]
    content_length: int | None
    read: Callable[[int], bytes]  # reads at most n bytes of the body
    # The WSGI environ, when there is one: the body deadline cuts its socket (request_body).
    environ: dict[str, Any] | None = None


@dataclass(frozen=True)
class Answer:
    status: int
    body: dict[str, Any] = field(default_factory=dict)
    stored: inbox.Stored | None = None
    event_id: int | None = None  # a webhook trigger emitted this event


def _header(headers: Mapping[str, str], name: str) -> str | None:
    for key, value in headers.items():
        if key.lower() == name:
            return value
    return None


def public_uri(request: WebhookRequest) -> str:
    """The URI the provider called (see the module docstring for the rules)."""
    suffix = request.path + (f"?{request.query_string}" if request.query_string else "")
    base = settings().public_base_url
    if base:
        return base.rstrip("/") + suffix
    forwarded = _header(request.headers, "x-forwarded-proto")
    scheme = forwarded.split(",")[0].strip() if forwarded else request.scheme
    host = _header(request.headers, "host") or request.host
    return f"{scheme}://{host}{suffix}"


def _refuse(status: int, error: str, check: str, **labels: Any) -> Answer:
    log.warning("webhook refused (%d): %s", status, check, extra={"labels": labels})
    return Answer(status, {"error": error, "check": check})


def _verify(
    connection: connections.Connection, request: WebhookRequest, body: bytes, secret: str
) -> Verdict:
    provider = registry.get(connection.provider)
    if provider is None:
        return Verdict.refuse("provider_unsupported")
    return provider.verify(secret, signed_request(request, body, connection.signature_versions))


def signed_request(
    request: WebhookRequest, body: bytes, signature_versions: tuple[str, ...]
) -> SignedRequest:
    """What a provider's signature check reads: the request as the provider sent it, now."""
    return SignedRequest(
        method=request.method,
        uri=public_uri(request),
        body=body,
        headers=request.headers,
        now=time.time(),
        signature_versions=signature_versions,
    )


def receive_webhook(  # noqa: PLR0911 - one return per row of the outcome table
    request: WebhookRequest, db: Database | None = None
) -> Answer:
    """Size-check, verify and store one webhook delivery; the answer to give."""
    if request.method != "POST":
        return _refuse(405, "method_not_allowed", "method")
    parts = request.path.strip("/").split("/")
    if (
        len(parts) not in (2, 3)
        or parts[0] not in registry.PROVIDERS
        or not connections.is_connection_id(parts[1])
        or (len(parts) == 3 and parts[0] not in registry.WEBHOOK_TRIGGER_PROVIDERS)
        or (len(parts) == 2 and parts[0] in registry.TRIGGER_ONLY_PROVIDERS)
    ):
        return _refuse(404, "unknown_connection", "path")
    provider, connection_id = parts[:2]
    workflow_name = parts[2] if len(parts) == 3 else None
    try:
        body = read_webhook_body(request)
    except request_body.BodyRefused as refused:
        return _refuse(refused.status, refused.code, refused.check, connection_id=connection_id)
    db = db or get_database()
    try:
        with db.transaction() as tx:
            connection = connections.get_connection(tx, connection_id)
    except TransientError as exc:
        log.warning("webhook: database unavailable: %s", exc)
        return Answer(503, {"error": "unavailable"})
    if connection is None:
        return _refuse(
            404, "unknown_connection", "connection_not_found", connection_id=connection_id
        )
    with labelled(connection_id=connection.id, tenant=connection.tenant_id):
        if connection.provider != provider:
            return _refuse(404, "unknown_connection", "provider_mismatch")
        if connection.status == "disconnected":
            drops.count_webhook_refusal(db, connection.id, "connection_disconnected")
            return _refuse(404, "unknown_connection", "connection_disconnected")
        try:
            secret = connection.webhook_secret()
        except connections.SecretUnavailable as exc:
            log.error("webhook: cannot verify: %s", exc)
            return Answer(503, {"error": "verification_unavailable"})
        verdict = _verify(connection, request, body, secret)
        if not verdict.ok:
            drops.count_webhook_refusal(db, connection.id, verdict.check)
            return _refuse(401, "invalid_signature", verdict.check)
        if workflow_name is not None:
            return _to_workflow(db, connection, workflow_name, request.headers, body)
        kept = kept_headers(request.headers)
        return store_and_answer(
            db, lambda tx: inbox.store(tx, connection.id, body, kept), verdict.check
        )


def kept_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The request headers stored with a verified body (`KEPT_HEADERS`, names lowercased)."""
    return {name: value for name in KEPT_HEADERS if (value := _header(headers, name)) is not None}


def store_and_answer(
    db: Database, store: Callable[[Tx], inbox.Stored], check: str, what: str = "webhook"
) -> Answer:
    """Store a verified body in its own transaction and answer 200 at once (503 when the
    database is unavailable: the provider retries). Every verified path ends here."""
    try:
        with db.transaction() as tx:
            stored = store(tx)
    except TransientError as exc:
        log.warning("%s: could not store: %s", what, exc)
        return Answer(503, {"error": "unavailable"})
    log.info(
        "%s stored (%s, delivery %d)",
        what,
        check,
        stored.deliveries,
        extra={"labels": {"inbox_id": stored.inbox_id}},
    )
    return Answer(
        200,
        {"status": "accepted", "inbox_id": stored.inbox_id, "deliveries": stored.deliveries},
        stored,
    )


def _to_workflow(
    db: Database,
    connection: connections.Connection,
    workflow_name: str,
    headers: Mapping[str, str],
    body: bytes,
) -> Answer:
    """A verified request addressed to a workflow's webhook trigger."""
    try:
        reply = webhook_trigger.receive_for_workflow(db, connection, workflow_name, headers, body)
    except TransientError as exc:
        log.warning("webhook trigger: database unavailable: %s", exc)
        return Answer(503, {"error": "unavailable"})
    if reply.status >= 400:
        log.warning("webhook trigger %s refused (%d): %s", workflow_name, reply.status, reply.body)
    else:
        log.info("webhook trigger %s: %s", workflow_name, reply.body.get("status"))
    return Answer(reply.status, reply.body, event_id=reply.event_id)
