"""Credits: `/v1/credits` — a tenant's balance and ledger."""

from __future__ import annotations

from shared.core import queries
from shared.ops.api.http import Call
from shared.ops.cursor import decode_cursor, encode_cursor
from shared.ops.errors import OpsError, not_found
from shared.ops.models import Credits, LedgerEntry, PageQuery

SQL = queries.load("ops")
CREDIT_BALANCE = SQL["ops_credit_balance"]
CREDIT_LEDGER = SQL["ops_credit_ledger"]


class CreditsQuery(PageQuery):
    tenant_id: str | None = None


def credits(call: Call) -> Credits:
    q: CreditsQuery = call.query
    tenant_id = q.tenant_id or call.scope
    if tenant_id is None:
        raise OpsError(422, "tenant_required", "an admin token must name the tenant_id")
    if call.scope is not None and tenant_id != call.scope:
        raise not_found("tenant")
    cur = decode_cursor(q.cursor, {"id": int})
    with call.db.transaction() as tx:
        balance = tx.scalar(CREDIT_BALANCE, tenant_id=tenant_id)
        if balance is None:
            raise not_found("tenant")
        rows = tx.all(
            CREDIT_LEDGER,
            tenant_id=tenant_id,
            cursor_id=cur["id"] if cur else None,
            limit=q.limit + 1,
        )
    more = len(rows) > q.limit
    rows = rows[: q.limit]
    return Credits(
        tenant_id=tenant_id,
        balance=int(balance),
        ledger=[LedgerEntry.model_validate(r) for r in rows],
        next_cursor=encode_cursor({"id": rows[-1]["id"]}) if more else None,
    )
