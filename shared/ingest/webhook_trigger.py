"""Webhook triggers, the receiving half: a verified POST addressed to a workflow, turned into
its trigger event while the sender waits.

    POST /{provider}/{connection_id}/{workflow name}        (the `webhook` function)

shared/ingest/receive.py verifies the request exactly like a provider webhook on that
connection (Standard Webhooks for a `standard` connection, `X-Signature-256` for an `hmac` one:
shared/providers/<provider>/signature.py) and hands it here (`receive_for_workflow`): addressed to
the tenant's active workflow of that name, which must have a webhook trigger. Unlike a CRM webhook
it does not go through the inbox: the answer names the trigger event, so the event is emitted
(shared/ingest/outbox.py) in one short transaction.

Idempotency, declared, never implicit:
- with `idempotency_key`, the expression is evaluated over `headers` (lower-case names; no
  credentials or signatures) and `body` (the parsed JSON, or the text when it is not JSON).
  The key is claimed with an INSERT under `PRIMARY KEY (workflow_id, key)` in the transaction
  that emits the event: a duplicate POST within `idempotency_ttl_seconds` starts nothing and is
  answered 200 with the first POST's event id (`"status": "duplicate"`); after the TTL the key
  names a new occurrence. An expression that fails on a request, or gives no usable key (null,
  empty, a list, over 512 characters), is answered 422 and recorded in
  `webhook_trigger_refusals`: retrying the same request cannot help.
- without it, every accepted POST is a new occurrence: at-least-once. A sender that retries
  after a lost answer starts the workflow again (`validate` warns).

Each occurrence is its own record (`webhook_request` / the key and when it was claimed, or a
random id without a key), so the default dedup `once_per_record` starts one run per
occurrence; a `record:` expression can name a business record instead.

The trigger kind — what `validate`, activation and ops ask about a webhook trigger, and the
sweep duty that expires claimed keys — is shared/triggers/webhook.py. This half lives in
ingest, below the trigger kinds, because the receive path (ingest) hands requests to it.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any
from uuid import UUID

from shared.accounts.connections import Connection
from shared.core import queries
from shared.core.db import Database, Tx
from shared.core.logs import get_logger
from shared.ingest.outbox import TriggerEvent, emit
from shared.providers import registry
from shared.workflows.definition import WebhookTrigger
from shared.workflows.expressions import (
    TEMPLATE,
    ExpressionError,
    compile_expression,
    evaluate,
    to_json,
)

SQL = queries.load("webhook_triggers")
TARGET = SQL["webhook_trigger_target"]
KEY_CLAIM = SQL["webhook_trigger_key_claim"]
KEY_GET = SQL["webhook_trigger_key_get"]
KEY_SET_EVENT = SQL["webhook_trigger_key_set_event"]
REFUSAL_INSERT = SQL["webhook_trigger_refusal_insert"]
KEYS_EXPIRE = SQL["webhook_trigger_keys_expire"]

KEY_ROOTS = frozenset({"headers", "body"})
MAX_KEY_LENGTH = 512
REQUEST_OBJECT_TYPE = "webhook_request"
# Never shown to the key expression nor kept with the event: credentials and signatures.
HIDDEN_HEADERS = frozenset(
    {
        "authorization",
        "cookie",
        "proxy-authorization",
    }
    | registry.HIDDEN_HEADERS  # each provider's signature headers
)
log = get_logger(__name__)


def event_type_for(workflow_id: str) -> str:
    return f"webhook.request.w{UUID(workflow_id).hex}"


def key_expression(source: str) -> str:
    """The expression inside an `idempotency_key` template; ExpressionError if it isn't one."""
    whole = TEMPLATE.fullmatch(source.strip())
    if whole is None:
        raise ExpressionError(
            "an idempotency_key is one `${{ … }}` expression, e.g. "
            "${{ headers['x-idempotency-key'] }} or ${{ body.event_id }}"
        )
    return whole.group(1).strip()


@dataclass(frozen=True)
class Reply:
    status: int
    body: dict[str, Any] = field(default_factory=dict)
    event_id: int | None = None  # a new event was emitted (the caller may nudge the publisher)


def visible_headers(headers: Mapping[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items() if k.lower() not in HIDDEN_HEADERS}


def parse_body(body: bytes) -> Any:
    """The parsed JSON, or the text when the body isn't JSON (a form post, plain text)."""
    text = body.decode("utf-8", errors="replace")
    try:
        return json.loads(text)
    except ValueError:
        return text


def occurrence_key(config: WebhookTrigger, headers: dict[str, str], body: Any) -> str | None:
    """The request's idempotency key (None when the trigger declares none); ExpressionError
    when the expression fails on this request or gives nothing usable."""
    if config.idempotency_key is None:
        return None
    expression = compile_expression(key_expression(config.idempotency_key), KEY_ROOTS)
    value = to_json(evaluate(expression, {"headers": headers, "body": body}))
    if isinstance(value, bool) or not isinstance(value, str | int | float) or value == "":
        raise ExpressionError(
            f"gave {json.dumps(value)[:80]}, not a key (a non-empty string or a number)",
            source=expression.source,
        )
    key = str(value)
    if len(key) > MAX_KEY_LENGTH:
        raise ExpressionError(
            f"gave a key of {len(key)} characters; the limit is {MAX_KEY_LENGTH}",
            source=expression.source,
        )
    return key


def receive_for_workflow(
    db: Database,
    connection: Connection,
    workflow_name: str,
    headers: Mapping[str, str],
    body: bytes,
) -> Reply:
    """Start (or recognise) one occurrence of a verified request addressed to a workflow."""
    with db.transaction() as tx:
        target = tx.one(TARGET, tenant_id=connection.tenant_id, name=workflow_name)
    if target is None:
        return Reply(404, {"error": "unknown_trigger", "check": "no_active_webhook_workflow"})
    workflow_id = str(target["workflow_id"])
    config = WebhookTrigger.model_validate(target["webhook"])
    shown = visible_headers(headers)
    parsed = parse_body(body)
    try:
        key = occurrence_key(config, shown, parsed)
    except ExpressionError as exc:
        detail = f"idempotency_key `{config.idempotency_key}` {exc}"
        with db.transaction() as tx:
            tx.one(
                REFUSAL_INSERT,
                workflow_id=workflow_id,
                connection_id=connection.id,
                reason="idempotency_key_failed",
                detail=detail,
            )
        log.warning("webhook trigger refused: %s", detail)
        return Reply(422, {"error": "idempotency_key_failed", "detail": detail})
    payload = {"headers": shown, "body": parsed}
    with db.transaction() as tx:
        return _occurrence(
            tx, connection, workflow_id=workflow_id, config=config, key=key, payload=payload
        )


def _occurrence(
    tx: Tx,
    connection: Connection,
    *,
    workflow_id: str,
    config: WebhookTrigger,
    key: str | None,
    payload: dict[str, Any],
) -> Reply:
    event = TriggerEvent(
        tenant_id=connection.tenant_id,
        connection_id=connection.id,
        event_type=event_type_for(workflow_id),
        payload=payload,
        record_object_type=REQUEST_OBJECT_TYPE,
        record_object_id=uuid.uuid4().hex,
    )
    if key is None:
        event_id = emit(tx, event)
        return Reply(200, {"status": "accepted", "event_id": event_id}, event_id)
    claim = tx.one(
        KEY_CLAIM, workflow_id=workflow_id, key=key, ttl_seconds=config.idempotency_ttl_seconds
    )
    if claim is None:
        first = tx.one(KEY_GET, workflow_id=workflow_id, key=key)
        assert first is not None  # the claim conflicted with this very row
        return Reply(
            200,
            {
                "status": "duplicate",
                "event_id": first["event_id"],
                "first_seen_at": first["claimed_at"].isoformat(),
                "key_expires_at": first["expires_at"].isoformat(),
            },
        )
    claimed = claim["claimed_at"].isoformat()
    digest = hashlib.sha256(key.encode()).hexdigest()[:32]
    event_id = emit(
        tx,
        replace(
            event,
            # The key's claim is the guard; this makes the outbox's unique index a second one
            # for the same occurrence (a later claim of the key has a later instant).
            source_event_id=f"webhook:{workflow_id}:{digest}:{claimed}",
            record_object_id=f"{key}@{claimed}",
        ),
    )
    tx.execute(KEY_SET_EVENT, workflow_id=workflow_id, key=key, event_id=event_id)
    return Reply(200, {"status": "accepted", "event_id": event_id}, event_id)


def expire_keys(db: Database, batch: int = 5000) -> dict[str, int]:
    with db.transaction() as tx:
        return {"deleted": tx.execute(KEYS_EXPIRE, batch=batch)}
