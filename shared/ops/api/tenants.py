"""Tenants: `/v1/tenants` — created by admins with their starting credits, and listed."""

from __future__ import annotations

from shared.gates import credits as credit_ledger
from shared.ops.api.http import Call, named_tenant
from shared.ops.errors import OpsError, not_found
from shared.ops.models import Tenant, TenantCreate, TenantList
from shared.ops.statements import TENANT_EXISTS, TENANT_INSERT, TENANTS_LIST


def admin_only(call: Call, what: str) -> None:
    if not call.principal.is_admin:
        raise OpsError(403, "admin_required", f"{what} needs an admin token")


def tenant_of(call: Call, named: str | None) -> str:
    """The tenant a create names: a tenant token's own (naming another is a 404, as for any
    id of another tenant); an admin token must name one, and it must exist."""
    tenant_id = named_tenant(call, named)
    with call.db.transaction() as tx:
        if tx.one(TENANT_EXISTS, tenant_id=tenant_id) is None:
            raise not_found("tenant")
    return tenant_id


def create_tenant(call: Call) -> Tenant:
    """A tenant, with the credits it starts with: admin only (a tenant token is one tenant's)."""
    admin_only(call, "creating a tenant")
    body: TenantCreate = call.body
    with call.db.transaction() as tx:
        row = tx.one(TENANT_INSERT, tenant_id=body.id, name=body.name or body.id)
        if row is None:
            raise OpsError(409, "tenant_exists", f"a tenant named {body.id!r} exists")
        balance = credit_ledger.grant(tx, body.id, body.credits) if body.credits else 0
    return Tenant.model_validate({**row, "credit_balance": balance})


def list_tenants(call: Call) -> TenantList:
    with call.db.transaction() as tx:
        rows = tx.all(TENANTS_LIST, tenant_id=call.scope)
    return TenantList(items=[Tenant.model_validate(r) for r in rows])
