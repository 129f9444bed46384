"""Outbound events: `/v1/outbound/…` — a tenant's subscriptions (a URL, the event types, the
name of the variable holding its Standard Webhooks secret) and their deliveries (status,
attempts, last error), each re-sendable with the same id (shared/ingest/outbound.py writes
them, shared/publishing/outbound.py sends them)."""

from __future__ import annotations

from shared.ingest import outbound as events
from shared.ops.api.http import Call, uuid_param
from shared.ops.api.tenants import tenant_of
from shared.ops.errors import OpsError, not_found
from shared.ops.models import (
    OutboundDeliveriesQuery,
    OutboundDelivery,
    OutboundDeliveryList,
    OutboundResendResult,
    OutboundSubscription,
    OutboundSubscriptionCreate,
    OutboundSubscriptionEnable,
    OutboundSubscriptionList,
)
from shared.publishing import outbound


def create_subscription(call: Call) -> OutboundSubscription:
    """Refused (422 `destination_refused`, with the guard's reason) when the URL's address is
    one the SSRF guard refuses now; the sender checks again at every attempt."""
    body: OutboundSubscriptionCreate = call.body
    tenant_id = tenant_of(call, body.tenant_id)
    reason = outbound.destination_refusal(body.url)
    if reason is not None:
        raise OpsError(422, "destination_refused", f"the URL is refused: {reason}")
    with call.db.transaction() as tx:
        row = events.subscribe(
            tx,
            tenant_id=tenant_id,
            url=body.url,
            event_types=list(body.event_types),
            secret_env=body.secret_env,
        )
    return OutboundSubscription.model_validate(row)


def list_subscriptions(call: Call) -> OutboundSubscriptionList:
    with call.db.transaction() as tx:
        rows = events.subscriptions(tx, call.scope)
    return OutboundSubscriptionList(items=[OutboundSubscription.model_validate(r) for r in rows])


def enable_subscription(call: Call) -> OutboundSubscription:
    """Enable or disable: a disabled subscription gets no new deliveries (those written go on)."""
    body: OutboundSubscriptionEnable = call.body
    subscription_id = uuid_param(call, "subscription_id", "subscription")
    with call.db.transaction() as tx:
        row = events.set_enabled(tx, subscription_id, enabled=body.enabled, tenant_id=call.scope)
    if row is None:
        raise not_found("subscription")
    return OutboundSubscription.model_validate(row)


def list_deliveries(call: Call) -> OutboundDeliveryList:
    q: OutboundDeliveriesQuery = call.query
    rows = outbound.deliveries(call.db, tenant_id=call.scope, status=q.status, limit=q.limit)
    return OutboundDeliveryList(items=[OutboundDelivery.model_validate(r) for r in rows])


def resend_delivery(call: Call) -> OutboundResendResult:
    """A new round of attempts now, same `webhook-id`. 404: no such delivery for the token's
    tenant, or an attempt of it is under way (try again when it has answered)."""
    delivery_id = call.path["delivery_id"]
    if not outbound.resend(call.db, delivery_id, tenant_id=call.scope):
        raise not_found("delivery not being attempted now")
    return OutboundResendResult(id=delivery_id)
