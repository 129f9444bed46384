"""Events and inbox rows that never reached a decision: `/v1/events/…`, `/v1/inbox/…`."""

from __future__ import annotations

from shared.core import queries
from shared.ingest import outbox
from shared.ops import explain
from shared.ops.api.http import Call, int_param
from shared.ops.errors import not_found
from shared.ops.models import RequeueResult, StuckInboxList, StuckInboxQuery

INBOX_REQUEUE_DEAD = queries.load("inbox")["inbox_requeue_dead"]


def requeue_event(call: Call) -> RequeueResult:
    """An undelivered (or still undecided) trigger event back into the outbox, its redelivery
    budget reset. Repeating it is harmless: admission decides each pairing once."""
    event_id = int_param(call, "event_id", "undecided event")
    with call.db.transaction() as tx:
        if not outbox.requeue_event(tx, event_id=event_id, tenant_id=call.scope):
            raise not_found("undecided event")
    return RequeueResult(id=event_id)


def list_stuck_inbox(call: Call) -> StuckInboxList:
    q: StuckInboxQuery = call.query
    with call.db.transaction() as tx:
        rows = tx.all(
            explain.STUCK_INBOX,
            tenant_id=call.scope,
            connection_id=str(q.connection_id) if q.connection_id else None,
            limit=q.limit,
        )
    return StuckInboxList(rows=explain.stuck_inbox_rows(rows))


def requeue_inbox_row(call: Call) -> RequeueResult:
    """A dead inbox row back to pending with a fresh attempt budget; the drain takes it."""
    inbox_id = int_param(call, "inbox_id", "dead inbox row")
    with call.db.transaction() as tx:
        if tx.one(INBOX_REQUEUE_DEAD, inbox_id=inbox_id, tenant_id=call.scope) is None:
            raise not_found("dead inbox row")
    return RequeueResult(id=inbox_id)
