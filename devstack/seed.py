"""The one home for seeding tenants, connections and workflows (`tenant`, `connection`,
`workflow`), used by the tests' support modules, the end-to-end tests and the benches.

Also seeding for the end-to-end tests and benches that drive the local stack with HubSpot
webhooks: a tenant with credits, one HubSpot connection watching `lifecyclestage` (on a portal
of a HubSpot app, when given one), and workflows triggered by its property changes, published
and activated; and the app the stack's fake CRM plays. Test and bench setup, written through
the same `connections`, `provider_apps` and `versions` functions the ops API uses; and
`first_path`, what `make dev` seeds (through the ops API) for the README's first workflow."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import httpx

from shared.accounts import connections, provider_apps
from shared.accounts.provider_apps import AppPlatform
from shared.core.db import Database, Tx
from shared.publishing import versions

PROPERTY_CHANGED = "hubspot.contact.property_changed"

# What `tenant` does when the id exists: raise (a test that means to make a new one), keep the
# row as it is (several helpers each make sure of one tenant), or overwrite what was given
# (a test that re-seeds the same tenant with other credits or signing secret).
Existing = Literal["fail", "keep", "update"]

_ON_CONFLICT: dict[Existing, str] = {
    "fail": "",
    "keep": " ON CONFLICT (id) DO NOTHING",
    "update": " ON CONFLICT (id) DO UPDATE SET credit_balance = EXCLUDED.credit_balance, "
    "excluded_authors = EXCLUDED.excluded_authors, "
    "signing_secret_env = EXCLUDED.signing_secret_env",
}


def tenant(
    tx: Tx,
    tenant_id: str,
    *,
    name: str | None = None,
    credits: int = 0,
    excluded_authors: Sequence[str] = (),
    signing_secret_env: str | None = None,
    existing: Existing = "fail",
) -> str:
    """Insert tenant `tenant_id` (named after its id unless `name`); its id. The defaults are
    the table's: no credits, no excluded authors, no signing secret."""
    tx.execute(
        "INSERT INTO tenants (id, name, credit_balance, excluded_authors, signing_secret_env) "
        "VALUES (:t, :n, :c, CAST(:x AS text[]), :s)" + _ON_CONFLICT[existing],
        t=tenant_id,
        n=name or tenant_id,
        c=credits,
        x=list(excluded_authors),
        s=signing_secret_env,
    )
    return tenant_id


def vertex(
    tx: Tx,
    tenant_id: str,
    *,
    project: str,
    location: str = "global",
    model: str | None = None,
) -> None:
    """Give tenant `tenant_id` the Vertex AI project, location and default model its
    `ai.generate` steps call (tenants.vertex_*; None: the block's default model)."""
    tx.execute(
        "UPDATE tenants SET vertex_project = :p, vertex_location = :l, vertex_model = :m"
        " WHERE id = :t",
        p=project,
        l=location,
        m=model,
        t=tenant_id,
    )


def slack(tx: Tx, tenant_id: str, *, bot_token_env: str, signing_secret_env: str) -> None:
    """Give tenant `tenant_id` its Slack app for approvals (tenants.slack_*_env: the names of
    the variables holding the bot token and the app's signing secret)."""
    tx.execute(
        "UPDATE tenants SET slack_bot_token_env = :b, slack_signing_secret_env = :s WHERE id = :t",
        b=bot_token_env,
        s=signing_secret_env,
        t=tenant_id,
    )


def smtp(
    tx: Tx,
    tenant_id: str,
    *,
    host: str,
    port: int,
    sender: str,
    username: str | None = None,
    password_env: str | None = None,
    starttls: bool = True,
) -> None:
    """Give tenant `tenant_id` the SMTP server its approval emails go through (tenants.smtp_*;
    the password by the name of its variable)."""
    tx.execute(
        "UPDATE tenants SET smtp_host = :h, smtp_port = :p, smtp_from = :f, smtp_username = :u,"
        " smtp_password_env = :pw, smtp_starttls = :tls WHERE id = :t",
        h=host,
        p=port,
        f=sender,
        u=username,
        pw=password_env,
        tls=starttls,
        t=tenant_id,
    )


def approver_identity(tx: Tx, tenant_id: str, *, channel: str, external_id: str, user: str) -> None:
    """Map a Slack user id or an email address (`channel`: slack | email) to onceflow user
    `user` in the tenant: who a click or a mailbox is, for approvals."""
    tx.execute(
        "INSERT INTO approver_identities (tenant_id, channel, external_id, onceflow_user)"
        " VALUES (:t, :c, :e, :u)",
        t=tenant_id,
        c=channel,
        e=external_id,
        u=user,
    )


def connection(
    tx: Tx,
    tenant_id: str,
    *,
    provider: str = "hubspot",
    webhook_secret_env: str = "HUBSPOT_SECRET",  # noqa: S107 - a variable name, not a secret
    api_credentials_env: str | None = None,
    api_base_url: str | None = None,
    provider_account_id: str | None = None,
    provider_app_id: str | None = None,
    signature_versions: tuple[str, ...] = ("v3",),
    watched_fields: Mapping[str, list[str]] | None = None,
    status: str = "active",
    excluded_authors: Sequence[str] = (),
    connection_id: str | None = None,
    provider_user_id: str | None = None,
    credential_kind: str = "token",
) -> str:
    """A connection of `tenant_id`, made by `connections.create_connection` as the ops API
    makes it; its id. What an operator changes later (a status other than active, excluded
    authors) and a fixed id (a definition that names its connection) are set after."""
    made = connections.create_connection(
        tx,
        tenant_id=tenant_id,
        provider=provider,
        webhook_secret_env=webhook_secret_env,
        api_credentials_env=api_credentials_env,
        signature_versions=signature_versions,
        api_base_url=api_base_url,
        provider_account_id=provider_account_id,
        watched_fields=watched_fields,
        provider_app_id=provider_app_id,
        provider_user_id=provider_user_id,
        credential_kind=credential_kind,
    )
    if status == "active" and not excluded_authors and connection_id is None:
        return made
    return str(
        tx.scalar(
            "UPDATE connections SET status = :s, excluded_authors = CAST(:x AS text[]), "
            "id = COALESCE(CAST(:new AS uuid), id) WHERE id = CAST(:id AS uuid) "
            "RETURNING id::text",
            s=status,
            x=list(excluded_authors),
            new=connection_id,
            id=made,
        )
    )


def workflow(
    tx: Tx,
    tenant_id: str,
    name: str,
    trigger: Mapping[str, Any],
    steps: Sequence[Mapping[str, Any]] = ({"id": "done", "type": "end"},),
) -> str:
    """Publish workflow `name` of `tenant_id` and activate that version; the workflow id."""
    source: dict[str, Sequence[Any] | Mapping[str, Any] | str] = {
        "name": name,
        "tenant": tenant_id,
        "trigger": dict(trigger),
        "steps": [dict(step) for step in steps],
    }
    return activate_source(tx, json.dumps(source), tenant_id=tenant_id)


def activate_source(tx: Tx, source_text: str, *, tenant_id: str) -> str:
    """Publish the definition `source_text` (YAML or JSON) of `tenant_id` and activate that
    version, through `shared.publishing.versions` (so its bindings are the real ones); the
    workflow id."""
    published = versions.publish(tx, source_text, tenant_id=tenant_id)
    versions.activate(
        tx, tenant_id=tenant_id, workflow_id=published.workflow_id, version_id=published.version_id
    )
    return str(published.workflow_id)


def hubspot_tenant(
    db: Database,
    *,
    tenant_id: str,
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
        tenant(tx, tenant_id, credits=credits)
        connection_id = connection(
            tx,
            tenant_id,
            webhook_secret_env=secret_env,
            provider_account_id=str(portal),
            watched_fields={"contact": ["lifecyclestage"]},
            provider_app_id=app_id,
        )
        workflow_ids = [
            workflow(tx, tenant_id, name, {"events": [PROPERTY_CHANGED], **trigger}, steps)
            for name, trigger in triggers.items()
        ]
    return connection_id, workflow_ids


def hubspot_app(
    db: Database, *, app_id: str, secret_env: str, platform: AppPlatform = "legacy"
) -> str:
    """Register (or keep) the public HubSpot app `app_id` whose webhooks are signed with the
    secret in `secret_env`, a legacy app or a project-based one (`platform`); its webhook path,
    `hubspot/app/<app id>`."""
    with db.transaction() as tx:
        provider_apps.register_app(
            tx, provider="hubspot", app_id=app_id, client_secret_env=secret_env, platform=platform
        )
    return f"hubspot/app/{app_id}"


# ---- the README's first path ----------------------------------------------------------------

FIRST_TENANT = "acme"  # what every example names as `tenant`
FIRST_CREDITS = 1000
FAKE_PORTAL = "62515"  # the fake CRM's default portal (devstack/fakecrm/__main__.py)
ENV_FILE = "onceflow.env"


def first_path(
    root: Path, *, ops_url: str, admin_token: str, fakecrm_url: str | None, webhook_url: str
) -> list[str]:
    """What `make dev` adds so the README's "Your first workflow" works as written: the
    examples' tenant `acme` with credits and a HubSpot connection to the fake CRM (watching
    `lifecyclestage`), made through the ops API as an operator would (kept when they exist),
    the fake CRM's webhooks sent to that connection, and `<root>/onceflow.env` with the
    variables the commands use. The lines to print."""
    with httpx.Client(
        base_url=ops_url, headers={"Authorization": f"Bearer {admin_token}"}, timeout=30
    ) as ops:
        made = ops.post("/v1/tenants", json={"id": FIRST_TENANT, "credits": FIRST_CREDITS})
        if made.status_code not in (201, 409):  # 409: kept from an earlier `make dev`
            made.raise_for_status()
        if fakecrm_url is None:
            return [f"tenant {FIRST_TENANT} (no fake CRM in this stack: no connection)"]
        listed = ops.get("/v1/connections").json()["items"]
        mine = [
            c
            for c in listed
            if c["tenant_id"] == FIRST_TENANT
            and c["provider_account_id"] == FAKE_PORTAL
            and c["api_base_url"] == fakecrm_url
        ]
        if mine:
            connection_id = mine[0]["id"]
        else:
            created = ops.post(
                "/v1/connections",
                json={
                    "tenant_id": FIRST_TENANT,
                    "provider": "hubspot",
                    "webhook_secret_env": "ONCEFLOW_DEMO_HUBSPOT_APP_SECRET",
                    "api_credentials_env": "ONCEFLOW_DEMO_HUBSPOT_TOKEN",
                    "api_base_url": fakecrm_url,
                    "provider_account_id": FAKE_PORTAL,
                    "watched_fields": {"contact": ["lifecyclestage"]},
                },
            )
            created.raise_for_status()
            connection_id = created.json()["id"]
    hook = f"{webhook_url.rstrip('/')}/hubspot/{connection_id}"
    httpx.post(
        f"{fakecrm_url}/_admin/config",
        json={"webhook_url": hook, "delivery": "serial"},
        timeout=10,
    ).raise_for_status()
    env_file = root / ENV_FILE
    fd = os.open(env_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(
            f"export ONCEFLOW_OPS_URL={ops_url.rstrip('/')}\n"
            f"export ONCEFLOW_OPS_TOKEN={admin_token}\n"
            f"export FAKECRM_URL={fakecrm_url}\n"
        )
    return [
        f"tenant {FIRST_TENANT}: a HubSpot connection {connection_id} to the fake CRM "
        f"({fakecrm_url}, portal {FAKE_PORTAL}), whose webhooks go to it",
        f"`. {env_file}` sets ONCEFLOW_OPS_URL, ONCEFLOW_OPS_TOKEN and FAKECRM_URL",
    ]
