"""Seeding for the end-to-end tests and benches that drive the local stack with HubSpot
webhooks: a tenant with credits, one HubSpot connection watching `lifecyclestage`, and workflows
triggered by its property changes, published and activated. Test and bench setup only: it
writes through the same `connections` and `versions` functions the ops API uses."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from shared import connections
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
) -> tuple[str, list[str]]:
    """(connection id, workflow ids in the order of `triggers`). `triggers` maps a workflow
    name to its trigger fields besides `events` (rule, dedup, …); each workflow is one `end`
    step."""
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
        )
        workflow_ids = [
            _activate(tx, tenant, name, {"events": [PROPERTY_CHANGED], **trigger})
            for name, trigger in triggers.items()
        ]
    return connection_id, workflow_ids


def _activate(tx: Any, tenant: str, name: str, trigger: Mapping[str, Any]) -> str:
    source: dict[str, Sequence[Any] | Mapping[str, Any] | str] = {
        "name": name,
        "tenant": tenant,
        "trigger": dict(trigger),
        "steps": [{"id": "done", "type": "end"}],
    }
    published = versions.publish(tx, json.dumps(source), tenant_id=tenant)
    versions.activate(
        tx, tenant_id=tenant, workflow_id=published.workflow_id, version_id=published.version_id
    )
    return str(published.workflow_id)
