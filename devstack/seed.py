"""Seeding for the end-to-end tests and benches that drive the local stack with HubSpot
webhooks: a tenant with credits, one HubSpot connection watching `lifecyclestage` (on a portal
of a HubSpot app, when given one), and workflows triggered by its property changes, published
and activated; and the app the stack's fake CRM plays. Test and bench setup only: it writes
through the same `connections`, `provider_apps` and `versions` functions the ops API uses."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from shared import connections, provider_apps
from shared.db import Database
from shared.workflows import versions

PROPERTY_CHANGED = "hubspot.contact.property_changed"


def hubspot_tenant(
    db: Database,
    *,
    tenant: str,
    portal: int,
    secret_env: str,
    credits: int,
    triggers: Mapping[str, Mapping[str, Any]],
    app_id: str | None = None,
    steps: Sequence[Mapping[str, Any]] = ({"id": "done", "type": "end"},),
) -> tuple[str, list[str]]:
    """(connection id, workflow ids in the order of `triggers`). `triggers` maps a workflow
    name to its trigger fields besides `events` (rule, dedup, …); every workflow runs `steps`
    (one `end` step unless the caller gives its own graph). With `app_id` the connection is
    the app's for `portal`: the app's one webhook URL routes that portal's events to it."""
    with db.transaction() as tx:
        tx.execute(
            "INSERT INTO tenants (id, name, credit_balance) VALUES (:t, :t, :c)",
            t=tenant,
            c=credits,
        )
        connection_id = connections.create_connection(
            tx,
            tenant_id=tenant,
            provider="hubspot",
            webhook_secret_env=secret_env,
            provider_account_id=str(portal),
            watched_fields={"contact": ["lifecyclestage"]},
            provider_app_id=app_id,
        )
        workflow_ids = [
            _activate(tx, tenant, name, {"events": [PROPERTY_CHANGED], **trigger}, steps)
            for name, trigger in triggers.items()
        ]
    return connection_id, workflow_ids


def hubspot_app(db: Database, *, app_id: str, secret_env: str) -> str:
    """Register (or keep) the public HubSpot app `app_id` whose webhooks are signed with the
    secret in `secret_env`; its webhook path, `hubspot/app/<app id>`."""
    with db.transaction() as tx:
        provider_apps.register_app(
            tx, provider="hubspot", app_id=app_id, client_secret_env=secret_env
        )
    return f"hubspot/app/{app_id}"


def _activate(
    tx: Any,
    tenant: str,
    name: str,
    trigger: Mapping[str, Any],
    steps: Sequence[Mapping[str, Any]],
) -> str:
    source: dict[str, Sequence[Any] | Mapping[str, Any] | str] = {
        "name": name,
        "tenant": tenant,
        "trigger": dict(trigger),
        "steps": [dict(step) for step in steps],
    }
    published = versions.publish(tx, json.dumps(source), tenant_id=tenant)
    versions.activate(
        tx, tenant_id=tenant, workflow_id=published.workflow_id, version_id=published.version_id
    )
    return str(published.workflow_id)
