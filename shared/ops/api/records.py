"""Records and refusals: `/v1/refusals`, `/v1/records/…` — "why didn't it run?" and search."""

from __future__ import annotations

from shared.core import queries
from shared.ops import explain
from shared.ops.api.http import Call
from shared.ops.cursor import decode_cursor, encode_cursor
from shared.ops.models import (
    RecordExplanation,
    RecordQuery,
    RecordSearch,
    RecordSearchQuery,
    Refusal,
    RefusalPage,
    RefusalsQuery,
)

SQL = queries.load("ops")
REFUSALS_LIST = SQL["ops_refusals_list"]


def list_refusals(call: Call) -> RefusalPage:
    q: RefusalsQuery = call.query
    cur = decode_cursor(q.cursor, {"id": int})
    with call.db.transaction() as tx:
        rows = tx.all(
            REFUSALS_LIST,
            tenant_id=call.scope,
            workflow_id=str(q.workflow_id) if q.workflow_id else None,
            record_key=q.record_key,
            event_id=q.event_id,
            cursor_id=cur["id"] if cur else None,
            limit=q.limit + 1,
        )
    more = len(rows) > q.limit
    rows = rows[: q.limit]
    items = [
        Refusal.model_validate({**r, "explanation": explain.explain_reason(r["reason"])})
        for r in rows
    ]
    return RefusalPage(
        items=items, next_cursor=encode_cursor({"id": rows[-1]["id"]}) if more else None
    )


def explain_record(call: Call) -> RecordExplanation:
    from shared.port.record_labels import shown_for

    q: RecordQuery = call.query
    with call.db.transaction() as tx:
        found = explain.explain_record(tx, record_key=q.record_key, tenant_scope=call.scope)
        shown = shown_for(tx, [found.record_key])
    return found.model_copy(update={"record_label": shown.get(found.record_key)})


def search_records(call: Call) -> RecordSearch:
    from shared.ops import search

    q: RecordSearchQuery = call.query
    with call.db.transaction() as tx:
        return search.search(tx, q.q, tenant_scope=call.scope)
