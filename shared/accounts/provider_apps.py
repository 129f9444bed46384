"""Provider apps: one webhook URL for every account that installed the app.

A HubSpot public app has one target URL and app-level subscriptions; every portal that installs
it gets the same ones, and one delivery can carry events of several portals, each naming its
`portalId` and `appId` (https://developers.hubspot.com/docs/api/webhooks). A private app is the
same with one portal. So a delivery is verified against the app (its client secret), stored
once, and each event is routed to its connection by (app id, account id) when drained.

An event no live connection takes is recorded in `unrouted_provider_events` (per app and
portal, for ops; re-routed by the sweep once its portal's connection appears, see
`REROUTE_LOOKBACK_SECONDS`) and acknowledged: answering 5xx would only make HubSpot retry the
whole batch, including the events that were routed, for a day; dropping it silently would hide
a portal that installed the app but has no connection.

Like connections, an app row names the environment variables that hold its secrets. Deployed,
those are the names the provider's `secret_env` gives (shared/providers/<provider>/apps.py): infra/
declares one Secret Manager secret per app and secret and hands it to the functions
`APP_SECRET_READERS` lists, and only to those.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from shared.core import queries
from shared.core.db import Tx
from shared.core.deployables import OAUTH_CLIENT_USERS
from shared.core.settings import named_secret
from shared.normalize import NormalizedEvent

SQL = queries.load("provider_apps")
GET = SQL["provider_app_get"]
UPSERT = SQL["provider_app_upsert"]
LIVE_CONNECTIONS = SQL["provider_app_live_connections"]
RECORD_UNROUTED = SQL["provider_app_record_unrouted"]
UNROUTED_SUMMARY = SQL["provider_app_unrouted_summary"]
REROUTE_CLAIM = SQL["provider_app_reroute_claim"]
PROJECT_DECLARED = SQL["provider_app_project_declared"]

# How long before a portal's connection was created an unrouted event of that portal may have
# arrived and still be routed to it by the sweep (shared/ingest/inbox.py reroute_unrouted): HubSpot
# installs the app at consent and sends the portal's events from then on, while the
# connection appears when the install is confirmed, at most shared/providers/install.py
# CONFIRM_TTL_SECONDS (30 min) after the callback. An hour covers that with room; an event
# older than that predates the install (say, the portal kept the app after its previous
# connection was disconnected) and is left for ops, never run late on a tenant's behalf.
REROUTE_LOOKBACK_SECONDS = 3600

AppKind = Literal["public", "private"]
# Where the app's webhook subscriptions are declared (migrations/0390_provider_apps_platform.sql):
# `legacy`, HubSpot's legacy apps — a public app's through the subscriptions API, a private
# app's in the provider's UI; `project`, a project-based app (developer platform 2026.03) —
# in its project files, deployed with the vendor's CLI, which onceflow writes and compares.
AppPlatform = Literal["legacy", "project"]
APP_PLATFORMS: tuple[AppPlatform, ...] = ("legacy", "project")
UnroutedReason = Literal["no_live_connection", "other_app", "no_account"]
UNROUTED_REASONS: dict[UnroutedReason, str] = {
    "no_live_connection": "the portal has no live connection for this app",
    "other_app": "the event names another app than the URL it was sent to",
    "no_account": "the event names no (numeric) portal",
}


AppSecretName = Literal["client_secret", "client_id", "developer_key"]

# Which function reads which secret of an app, by kind. The client secret keys the webhook
# signatures, and (public apps) the OAuth code exchange (webhook, at an install's callback) and
# refresh (the CRM token users), with the client id; the
# developer key is what the subscriptions API takes (reconciled hourly by sweep and on
# activation by ops). A private app has one portal, a static token and no subscriptions API:
# only its signatures need a secret. An app that reads a webhooks journal authenticates as
# itself with the same client id and secret (client-credentials grant): its reader runs in
# sweep and its journal subscriptions are reconciled by sweep and ops, all among
# OAUTH_CLIENT_USERS (shared/ingest/journal.py). infra/secrets.tf mirrors this table.
APP_SECRET_READERS: dict[AppKind, dict[AppSecretName, tuple[str, ...]]] = {
    "public": {
        "client_secret": OAUTH_CLIENT_USERS,  # webhook: signatures and install callbacks
        "client_id": OAUTH_CLIENT_USERS,
        "developer_key": ("sweep", "ops"),
    },
    "private": {"client_secret": ("webhook",)},
}


class SecretUnavailable(RuntimeError):
    """The environment variable an app names is not set in this process."""


@dataclass(frozen=True)
class ProviderApp:
    provider: str
    app_id: str
    kind: AppKind
    client_secret_env: str
    developer_credential_env: str | None = None
    signature_versions: tuple[str, ...] = ("v3",)
    api_base_url: str | None = None
    # The OAuth client a public app installs with (env var names; shared/providers/install.py).
    oauth_client_id_env: str | None = None
    oauth_scopes: tuple[str, ...] = ()
    oauth_authorize_url: str | None = None
    platform: AppPlatform = "legacy"
    # What its project files declare, as last written (`project_declared` of the row: the
    # `{"subscriptions": [...]}` document, or None when never written).
    project_declared: dict[str, Any] | None = None
    project_declared_at: datetime | None = None

    def client_secret(self) -> str:
        """The webhook signing secret, read from the environment now (never stored)."""
        return _secret(self.client_secret_env)

    def oauth_client(self) -> tuple[str, str]:
        """(client id, client secret) of the app's OAuth client, read from the environment now
        (HubSpot's OAuth client secret is the app's client secret); SecretUnavailable when the
        app names no client id or a variable is unset."""
        if not self.oauth_client_id_env:
            raise SecretUnavailable(f"app {self.app_id} names no OAuth client id variable")
        return _secret(self.oauth_client_id_env), self.client_secret()


def _secret(env: str) -> str:
    value = named_secret(env)
    if not value:
        raise SecretUnavailable(f"environment variable {env} is not set")
    return value


def is_app_id(text: str) -> bool:
    return text.isascii() and text.isdigit() and 0 < len(text) <= 20


def get_app(tx: Tx, provider: str, app_id: str) -> ProviderApp | None:
    if not is_app_id(app_id):
        return None
    row = tx.one(GET, provider=provider, app_id=app_id)
    if row is None:
        return None
    return ProviderApp(
        provider=row["provider"],
        app_id=row["app_id"],
        kind=row["kind"],
        client_secret_env=row["client_secret_env"],
        developer_credential_env=row["developer_credential_env"],
        signature_versions=tuple(row["signature_versions"] or ()),
        api_base_url=row["api_base_url"],
        oauth_client_id_env=row["oauth_client_id_env"],
        oauth_scopes=tuple(row["oauth_scopes"] or ()),
        oauth_authorize_url=row["oauth_authorize_url"],
        platform=row["platform"],
        project_declared=row["project_declared"],
        project_declared_at=row["project_declared_at"],
    )


def register_app(
    tx: Tx,
    *,
    provider: str,
    app_id: str,
    client_secret_env: str,
    kind: AppKind = "public",
    developer_credential_env: str | None = None,
    signature_versions: tuple[str, ...] = ("v3",),
    api_base_url: str | None = None,
    oauth_client_id_env: str | None = None,
    oauth_scopes: tuple[str, ...] = (),
    oauth_authorize_url: str | None = None,
    platform: AppPlatform = "legacy",
) -> None:
    tx.execute(
        UPSERT,
        provider=provider,
        app_id=app_id,
        kind=kind,
        client_secret_env=client_secret_env,
        developer_credential_env=developer_credential_env,
        signature_versions="{" + ",".join(signature_versions) + "}",
        api_base_url=api_base_url,
        oauth_client_id_env=oauth_client_id_env,
        oauth_scopes="{" + ",".join(oauth_scopes) + "}",
        oauth_authorize_url=oauth_authorize_url,
        platform=platform,
    )


def record_project_declared(tx: Tx, provider: str, app_id: str, declared: dict[str, Any]) -> bool:
    """Keep what a project app's files declare (`{"subscriptions": [...]}`); False when the app
    is not a registered project app (nothing kept)."""
    return (
        tx.one(PROJECT_DECLARED, provider=provider, app_id=app_id, declared=json.dumps(declared))
        is not None
    )


# --- routing a batch --------------------------------------------------------------------------


@dataclass(frozen=True)
class Unrouted:
    event: NormalizedEvent
    account_id: str
    reason: UnroutedReason


@dataclass
class Routes:
    by_connection: dict[str, list[NormalizedEvent]] = field(default_factory=dict)
    unrouted: list[Unrouted] = field(default_factory=list)


# (account id, app id) an event names, as its provider reads them (shared/providers/<provider>/
# apps.py): None where the event names none.
EventAccount = Callable[[NormalizedEvent], tuple[str | None, str | None]]


def split_by_account(
    app: ProviderApp, events: Sequence[NormalizedEvent], event_account: EventAccount
) -> tuple[dict[str, list[NormalizedEvent]], list[Unrouted]]:
    """Pure: events grouped by the account they name (keeping their order), and those that can't
    be routed by what they say alone."""
    by_account: dict[str, list[NormalizedEvent]] = {}
    unrouted: list[Unrouted] = []
    for event in events:
        account, event_app = event_account(event)
        if account is None or not is_app_id(account):  # portal ids are numeric like app ids
            unrouted.append(Unrouted(event, (account or "")[:40], "no_account"))
        elif event_app is not None and event_app != app.app_id:
            unrouted.append(Unrouted(event, account, "other_app"))
        else:
            by_account.setdefault(account, []).append(event)
    return by_account, unrouted


def route_events(
    tx: Tx, app: ProviderApp, events: Sequence[NormalizedEvent], event_account: EventAccount
) -> Routes:
    """Each event to its live connection by (app, account); one lookup for the whole batch."""
    by_account, unrouted = split_by_account(app, events, event_account)
    routes = Routes(unrouted=unrouted)
    if not by_account:
        return routes
    found = {
        str(r["account_id"]): str(r["connection_id"])
        for r in tx.all(
            LIVE_CONNECTIONS,
            provider=app.provider,
            app_id=app.app_id,
            accounts="{" + ",".join(by_account) + "}",
        )
    }
    for account, group in by_account.items():
        connection_id = found.get(account)
        if connection_id is None:
            routes.unrouted.extend(Unrouted(e, account, "no_live_connection") for e in group)
        else:
            routes.by_connection.setdefault(connection_id, []).extend(group)
    return routes


def record_unrouted(tx: Tx, app: ProviderApp, inbox_id: int, unrouted: Unrouted) -> None:
    event = unrouted.event
    tx.execute(
        RECORD_UNROUTED,
        provider=app.provider,
        app_id=app.app_id,
        account_id=unrouted.account_id,
        reason=unrouted.reason,
        source_event_id=event.source_event_id or "",
        event_type=event.event_type,
        payload=json.dumps(event.payload, default=str),
        inbox_id=inbox_id,
    )


def unrouted_summary(tx: Tx, provider: str, app_id: str) -> list[dict[str, Any]]:
    """Ops: per portal and reason, the events this app received that nobody took."""
    return [
        {**row, "explanation": UNROUTED_REASONS.get(row["reason"], row["reason"])}
        for row in tx.all(UNROUTED_SUMMARY, provider=provider, app_id=app_id)
    ]
