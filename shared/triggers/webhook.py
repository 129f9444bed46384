"""Webhook triggers: a workflow started by a POST addressed to it.

    POST /{provider}/{connection_id}/{workflow name}        (the `webhook` function)
    trigger:
      webhook:
        idempotency_key: "${{ headers['x-idempotency-key'] }}"   # optional
        idempotency_ttl_seconds: 86400

This module is the trigger kind: what `validate` says about the trigger, the event type its
workflow is bound to, what ops shows (recent refusals), and the sweep duty that expires claimed
idempotency keys. The request itself is verified and turned into a trigger event on the
receive path, shared/ingest/webhook_trigger.py (its docstring says how idempotency works).
"""

from __future__ import annotations

from typing import Any

from shared.core import queries
from shared.core.db import Tx
from shared.core.duty import Duty
from shared.ingest.webhook_trigger import KEY_ROOTS, event_type_for, expire_keys, key_expression
from shared.triggers import AddProblem, TriggerKind
from shared.workflows.definition import Trigger
from shared.workflows.expressions import ExpressionError, compile_expression

REFUSALS_RECENT = queries.load("webhook_triggers")["webhook_trigger_refusals_recent"]


def check(t: Trigger, add: AddProblem) -> None:
    assert t.webhook is not None
    if t.webhook.idempotency_key is None:
        add(
            "warning",
            ("trigger", "webhook"),
            "without idempotency_key every accepted POST is a new occurrence (at-least-once): "
            "a sender that retries after a lost answer starts the workflow again; declare one, "
            "e.g. idempotency_key: ${{ headers['webhook-id'] }}",
        )
        return
    try:
        compile_expression(key_expression(t.webhook.idempotency_key), KEY_ROOTS)
    except ExpressionError as exc:
        add("error", ("trigger", "webhook", "idempotency_key"), str(exc))


def status(tx: Tx, t: Trigger, workflow_id: str) -> dict[str, Any]:
    assert t.webhook is not None
    refusals = tx.all(REFUSALS_RECENT, workflow_id=workflow_id, limit=20)
    return {
        "idempotency_key": t.webhook.idempotency_key,
        "idempotency_ttl_seconds": t.webhook.idempotency_ttl_seconds,
        "recent_refusals": [
            {
                "connection_id": r["connection_id"],
                "reason": r["reason"],
                "detail": r["detail"],
                "at": r["created_at"].isoformat(),
            }
            for r in refusals
        ],
    }


KIND = TriggerKind(
    name="webhook",
    fields=("webhook",),
    applies=lambda t: t.webhook is not None,
    check=check,
    event_types=lambda _t, workflow_id: (event_type_for(workflow_id),),
    duties=lambda: (Duty("expire_webhook_trigger_keys", 300.0, expire_keys),),
    status=status,
)
