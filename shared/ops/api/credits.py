"""Credits: `/v1/credits` — a tenant's balance and ledger."""

from __future__ import annotations

from shared.ops.api.http import Call, named_tenant
from shared.ops.cursor import BY_ID
from shared.ops.errors import not_found
from shared.ops.models import Credits, LedgerEntry, PageQuery
from shared.ops.statements import CREDIT_BALANCE, CREDIT_LEDGER


class CreditsQuery(PageQuery):
    tenant_id: str | None = None


def credits(call: Call) -> Credits:
    q: CreditsQuery = call.query
    tenant_id = named_tenant(call, q.tenant_id)
    window = BY_ID.window(q.cursor, q.limit)
    with call.db.transaction() as tx:
        balance = tx.scalar(CREDIT_BALANCE, tenant_id=tenant_id)
        if balance is None:
            raise not_found("tenant")
        rows = tx.all(CREDIT_LEDGER, tenant_id=tenant_id, **window)
    shown, next_cursor = BY_ID.page(rows, q.limit)
    return Credits(
        tenant_id=tenant_id,
        balance=int(balance),
        ledger=[LedgerEntry.model_validate(r) for r in shown],
        next_cursor=next_cursor,
    )
