"""Outbound events: what a tenant subscribed to, written in the transaction of the fact.

A subscription (`outbound_subscriptions`) names a URL, the event types it wants
(`EVENT_TYPES`) and the variable that holds its Standard Webhooks secret ('whsec_' + base64,
read through `shared.core.settings.named_secret`, never stored, as every tenant secret). A fact
becomes one `outbound_deliveries` row per listening subscription through ONE function,
`outbound_emit` in the database (migrations/0520_outbound_events.sql): `emit(tx, …)` here calls
it from Python (approval.requested), and triggers call it for the facts written by single
statements — a live run's end (run.failed, run.succeeded, whichever statement ends it, the
one-statement settle included), a refusal (event.refused), an event given up by the outbox
sweep (event.undelivered), a breaker trip (breaker.tripped). So the event commits or rolls
back with its fact (a transactional outbox), and its id, 'msg_' + md5(subscription ':' key),
is the same however often the transaction is re-executed: the row is written once.

Delivery (the sweep, signing, retries) is shared/publishing/outbound.py.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from shared.core import queries
from shared.core.db import Tx

SQL = queries.load("outbound")
EMIT = SQL["outbound_emit"]
SUBSCRIPTION_INSERT = SQL["outbound_subscription_insert"]
SUBSCRIPTIONS_LIST = SQL["outbound_subscriptions_list"]
SUBSCRIPTION_SET_ENABLED = SQL["outbound_subscription_set_enabled"]

# Also the CHECK on outbound_subscriptions.event_types (migrations/0520_outbound_events.sql).
EVENT_TYPES = (
    "run.failed",
    "run.succeeded",
    "event.refused",
    "event.undelivered",
    "breaker.tripped",
    "approval.requested",
)


def emit(tx: Tx, *, tenant_id: str, event_type: str, key: str, data: Mapping[str, Any]) -> int:
    """Write `event_type` for every subscription of `tenant_id` listening to it, in `tx`.
    `key` names the fact (e.g. 'approval.requested:<step id>'): the same key writes nothing
    the second time. The number of delivery rows written."""
    if event_type not in EVENT_TYPES:
        raise ValueError(f"unknown outbound event type {event_type!r}")
    written = tx.scalar(
        EMIT,
        tenant_id=tenant_id,
        event_type=event_type,
        event_key=key,
        data=json.dumps(data, default=str),
    )
    return int(written or 0)


def approval_requested(tx: Tx, tenant_id: str, park_id: int, **data: Any) -> int:
    """approval.requested, written with the approval's park row (shared/steps/parks.py
    `open_park`); keyed by the park, so the open that returns an existing park adds nothing.
    `data`: what the event carries (run, step, summary, approvers, deadline)."""
    key = f"approval.requested:{park_id}"
    data = {"park_id": park_id, **data}
    return emit(tx, tenant_id=tenant_id, event_type="approval.requested", key=key, data=data)


def subscribe(
    tx: Tx, *, tenant_id: str, url: str, event_types: Sequence[str], secret_env: str
) -> dict[str, Any]:
    """A new enabled subscription. The URL's destination policy is the caller's to check
    (shared/publishing/outbound.py `destination_refusal`, which the sender checks again)."""
    unknown = sorted(set(event_types) - set(EVENT_TYPES))
    if unknown or not event_types:
        raise ValueError(f"event types must be some of {', '.join(EVENT_TYPES)}; got {unknown}")
    row = tx.one(
        SUBSCRIPTION_INSERT,
        tenant_id=tenant_id,
        url=url,
        event_types=sorted(set(event_types)),
        secret_env=secret_env,
    )
    assert row is not None
    return dict(row)


def subscriptions(tx: Tx, tenant_id: str | None) -> list[dict[str, Any]]:
    return [dict(r) for r in tx.all(SUBSCRIPTIONS_LIST, tenant_id=tenant_id)]


def set_enabled(
    tx: Tx, subscription_id: str, *, enabled: bool, tenant_id: str | None
) -> dict[str, Any] | None:
    row = tx.one(
        SUBSCRIPTION_SET_ENABLED,
        subscription_id=subscription_id,
        enabled=enabled,
        tenant_id=tenant_id,
    )
    return None if row is None else dict(row)
