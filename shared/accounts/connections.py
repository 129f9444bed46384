"""Connections: a tenant's link to one CRM provider account.

A connection row names *where* its secrets come from — the environment variable that Secret
Manager fills in the cloud — never the secret itself. The secret is read from the environment
(`shared.core.settings.named_secret`) at the moment it is needed, so rotating it is a redeploy
with a new secret version, not a data migration, and a database dump never holds a usable
credential.

Watched fields (what shadow records track, and so which property changes can fire or resume a
wait) are what the active versions of the tenant's workflows listen to — their property-change
triggers' `watch` lists and their waits' fields (shared/workflows/listening.py, the one home of
that rule, which the provider subscriptions use too) — plus the connection's own
`watched_fields` setting (`{"contact": ["email", ...]}`), which is what counts until
workflows exist. A property-change trigger with an empty `watch` list watches every field of
its object type (`"*"`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from shared.core import queries
from shared.core.db import Tx
from shared.core.settings import named_secret
from shared.workflows import listening
from shared.workflows.listening import ALL_FIELDS

SQL = queries.load("connections")
GET = SQL["connection_get"]
GET_FOR_TENANT = SQL["connection_get_for_tenant"]
INSERT = SQL["connection_insert"]
ACTIVE_LISTENERS = SQL["connection_active_listeners"]

# What a connection's credential is (migrations/0370_connections_credential_kind.sql): a static
# token or service key in the variable `api_credentials_env` names, or an app install's sealed
# OAuth grant. Words for messages, e.g. "its service key was refused".
CREDENTIAL_KINDS = {"token": "API token", "service_key": "service key", "oauth": "OAuth grant"}
STATIC_CREDENTIAL_KINDS = ("token", "service_key")

_UUID = re.compile(r"^[0-9a-fA-F]{8}-?([0-9a-fA-F]{4}-?){3}[0-9a-fA-F]{12}$")


class SecretUnavailable(RuntimeError):
    """The environment variable a connection names is not set in this process."""


@dataclass(frozen=True)
class Connection:
    id: str
    tenant_id: str
    provider: str
    status: str
    webhook_secret_env: str
    api_credentials_env: str | None = None
    signature_versions: tuple[str, ...] = ("v3",)
    api_base_url: str | None = None
    provider_account_id: str | None = None
    watched_fields: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    excluded_authors: tuple[str, ...] = ()
    credential_kind: str = "token"  # CREDENTIAL_KINDS

    def webhook_secret(self) -> str:
        """The webhook secret, read from the environment now (never stored, never logged)."""
        value = named_secret(self.webhook_secret_env)
        if not value:
            raise SecretUnavailable(f"environment variable {self.webhook_secret_env} is not set")
        return value


def is_connection_id(text: str) -> bool:
    return bool(_UUID.match(text))


def _from_row(row: Mapping[str, Any]) -> Connection:
    watched = row["watched_fields"]
    return Connection(
        id=row["id"],
        tenant_id=row["tenant_id"],
        provider=row["provider"],
        status=row["status"],
        webhook_secret_env=row["webhook_secret_env"],
        api_credentials_env=row["api_credentials_env"],
        signature_versions=tuple(row["signature_versions"] or ()),
        api_base_url=row["api_base_url"],
        provider_account_id=row["provider_account_id"],
        watched_fields={
            str(k): tuple(str(f) for f in v)
            for k, v in (watched or {}).items()
            if isinstance(v, list)
        },
        excluded_authors=tuple(row["excluded_authors"] or ()),
        credential_kind=row["credential_kind"],
    )


def get_connection(tx: Tx, connection_id: str) -> Connection | None:
    """The connection by id, for the webhook path (which has no tenant context yet)."""
    if not is_connection_id(connection_id):
        return None
    row = tx.one(GET, connection_id=connection_id)
    return _from_row(row) if row else None


def get_connection_for_tenant(tx: Tx, tenant_id: str, connection_id: str) -> Connection | None:
    """The connection if it belongs to `tenant_id`; another tenant's id reads as unknown."""
    if not is_connection_id(connection_id):
        return None
    row = tx.one(GET_FOR_TENANT, connection_id=connection_id, tenant_id=tenant_id)
    return _from_row(row) if row else None


def create_connection(
    tx: Tx,
    *,
    tenant_id: str,
    provider: str,
    webhook_secret_env: str,
    api_credentials_env: str | None = None,
    signature_versions: tuple[str, ...] = ("v3",),
    api_base_url: str | None = None,
    provider_account_id: str | None = None,
    watched_fields: Mapping[str, list[str]] | None = None,
    provider_app_id: str | None = None,
    provider_user_id: str | None = None,
    credential_kind: str = "token",
) -> str:
    """Insert a connection; its id. With `provider_app_id` and `provider_account_id` (the
    provider's app id and account id) it also receives the events its app's one URL routes to it.
    `provider_user_id`: the provider user its writes act as (migration 0410; echo
    suppression tells its own writes' events by it, shared/ingest/echo.py).
    `credential_kind`: what `api_credentials_env` holds, a static `token` or a `service_key`
    (an OAuth connection becomes `oauth` when its grant is stored)."""
    return str(
        tx.scalar(
            INSERT,
            tenant_id=tenant_id,
            provider=provider,
            webhook_secret_env=webhook_secret_env,
            api_credentials_env=api_credentials_env,
            signature_versions="{" + ",".join(signature_versions) + "}",
            api_base_url=api_base_url,
            provider_account_id=provider_account_id,
            watched_fields=json.dumps(dict(watched_fields or {})),
            provider_app_id=provider_app_id,
            provider_user_id=provider_user_id,
            credential_kind=credential_kind,
        )
    )


@dataclass(frozen=True)
class WatchedFields:
    """Per object type, the fields whose changes matter (`"*"` means all of them)."""

    by_object: Mapping[str, frozenset[str]]

    def watches(self, object_type: str, field_name: str) -> bool:
        fields = self.by_object.get(object_type, frozenset())
        return ALL_FIELDS in fields or field_name in fields


def watched_fields(tx: Tx, connection: Connection) -> WatchedFields:
    """The union of what active workflows listen to and the connection's own setting."""
    union: dict[str, set[str]] = {k: set(v) for k, v in connection.watched_fields.items()}
    rows = tx.all(ACTIVE_LISTENERS, tenant_id=connection.tenant_id)
    listening.watched_by_object(
        connection.provider,
        (
            {
                "trigger": r["trigger"],
                "steps": r["waits"],
                "cancel_on": r["cancel_on"],
                "goal": r["goal"],
            }
            for r in rows
        ),
        union,
    )
    return WatchedFields({k: frozenset(v) for k, v in union.items()})
