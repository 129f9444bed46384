"""Connections: `/v1/connections` — a tenant's CRM accounts, by the names of the environment
variables that hold their secrets."""

from __future__ import annotations

from shared.accounts import connections
from shared.ops.api.http import Call
from shared.ops.api.tenants import tenant_of
from shared.ops.errors import OpsError
from shared.ops.models import ConnectionCreate, ConnectionList, ConnectionSummary
from shared.ops.statements import CONNECTIONS_LIST
from shared.providers import registry


def create_connection(call: Call) -> ConnectionSummary:
    """A CRM connection of a tenant. It names environment variables, never secrets."""
    body: ConnectionCreate = call.body
    tenant_id = tenant_of(call, body.tenant_id)
    kinds = registry.static_credential_kinds(body.provider)
    if body.credential_kind not in kinds:
        raise OpsError(
            422,
            "credential_kind_unsupported",
            f"a {body.provider} connection holds one of {', '.join(kinds)}, "
            f"not a {body.credential_kind}",
        )
    with call.db.transaction() as tx:
        connection_id = connections.create_connection(
            tx,
            tenant_id=tenant_id,
            provider=body.provider,
            webhook_secret_env=body.webhook_secret_env,
            api_credentials_env=body.api_credentials_env,
            api_base_url=body.api_base_url,
            provider_account_id=body.provider_account_id,
            watched_fields=body.watched_fields,
            provider_app_id=body.provider_app_id,
            provider_user_id=body.provider_user_id,
            credential_kind=body.credential_kind,
        )
        rows = tx.all(CONNECTIONS_LIST, tenant_id=tenant_id)
    return next(ConnectionSummary.model_validate(r) for r in rows if str(r["id"]) == connection_id)


def list_connections(call: Call) -> ConnectionList:
    with call.db.transaction() as tx:
        rows = tx.all(CONNECTIONS_LIST, tenant_id=call.scope)
    return ConnectionList(items=[ConnectionSummary.model_validate(r) for r in rows])
