"""Building the CRM port for a connection row.

This is the one place that maps a provider name to an adapter (the `crm` part of its registry
entry, shared/providers/registry.py); everything above it sees only `CrmPort`. A static
credential — a token (a private app's) or a service key, `connections.credential_kind` says
which — comes from the environment variable the row names (`connections.api_credentials_env`,
filled from Secret Manager in the cloud), read when the port is built and never stored; it
neither expires nor refreshes, so a 401 for it is final and says which connection's credential
was refused and which variable to put the current one in (`_static_credential`). An
OAuth connection (a public app installed on the portal) has a sealed grant instead: its port
asks shared/accounts/oauth_tokens.py for a live access token on every call (refreshed before it
expires, with the app's OAuth client and the provider's refresher) and, when the provider
answers 401, refreshes once and retries once. Ports are cached per process so a warm instance
keeps each connection's HTTP pool and rate-limit state; a change of base URL or credentials
builds a new one.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shared.accounts import oauth_tokens
from shared.accounts.connections import CREDENTIAL_KINDS, is_connection_id
from shared.accounts.provider_apps import ProviderApp
from shared.core import queries
from shared.core.db import Database, Tx
from shared.core.settings import named_secret
from shared.core.settings import settings as app_settings
from shared.port.interface import CrmPort, PortError, WebhookTargeted, singular_object_type
from shared.port.observed import ObservedPort
from shared.providers import registry
from shared.providers.descriptor import Crm, OAuth, TokenSource

SQL = queries.load("port")
GET = SQL["port_connection_get"]
SET_APP_ID = SQL["port_connection_set_app_id"]


@dataclass(frozen=True)
class PortSettings:
    connection_id: str
    tenant_id: str
    provider: str
    status: str
    api_base_url: str | None
    api_credentials_env: str | None
    provider_app_id: str | None
    idempotency_property: str | None = None
    oauth: bool = False
    oauth_client_id_env: str | None = None
    oauth_client_secret_env: str | None = None  # the app's OAuth client secret
    webhook_secret_env: str | None = None  # the connection's webhook credential
    credential_kind: str = "token"  # shared/accounts/connections.py CREDENTIAL_KINDS


def load_port_settings(tx: Tx, connection_id: str) -> PortSettings:
    """The row's settings; an unknown connection comes back with status `missing` (raising
    inside a transaction would be translated by the pool), and `build_port` refuses it."""
    row = tx.one(GET, connection_id=connection_id) if is_connection_id(connection_id) else None
    return _settings_of(connection_id, row)


def _settings_of(connection_id: str, row: Mapping[str, Any] | None) -> PortSettings:
    if row is None:
        return PortSettings(connection_id, "", "", "missing", None, None, None)
    return PortSettings(
        connection_id=row["id"],
        tenant_id=row["tenant_id"],
        provider=row["provider"],
        status=row["status"],
        api_base_url=row["api_base_url"],
        api_credentials_env=row["api_credentials_env"],
        provider_app_id=row["provider_app_id"],
        idempotency_property=row["idempotency_property"],
        oauth=bool(row["oauth"]),
        oauth_client_id_env=row["oauth_client_id_env"],
        oauth_client_secret_env=row["oauth_client_secret_env"],
        webhook_secret_env=row["webhook_secret_env"],
        credential_kind=row["credential_kind"],
    )


_cache: dict[tuple[str, str, str | None, str, str | None], CrmPort] = {}
_cache_lock = threading.Lock()


def build_port(settings: PortSettings, db: Database) -> CrmPort:
    """The adapter for `settings`, reused while base URL, token and app id stay the same. `db`:
    where an OAuth connection's port reads and refreshes its access token."""
    if settings.status == "missing":
        raise PortError(
            f"connection {settings.connection_id} does not exist",
            code="invalid_request",
            transient=False,
        )
    if settings.status == "needs_reauthorization":
        raise PortError(
            f"connection {settings.connection_id} needs reauthorization: {_title(settings)} "
            "revoked its grant; install the app on the portal again",
            code="unauthorized",
            transient=False,
        )
    if settings.status != "active":
        raise PortError(
            f"connection {settings.connection_id} is {settings.status}",
            code="unauthorized",
            transient=False,
        )
    if settings.oauth:
        return _oauth_port(settings, db)
    if not settings.api_credentials_env:
        raise PortError(
            f"connection {settings.connection_id} names no API credentials variable",
            code="unauthorized",
            transient=False,
        )
    token = named_secret(settings.api_credentials_env)
    if not token:
        raise PortError(
            f"environment variable {settings.api_credentials_env} is not set",
            code="unauthorized",
            transient=False,
        )
    # The token itself (each adapter sends it its vendor's way: a Bearer, Pipedrive's
    # x-api-token), and what a 401 on it means.
    return _cached_port(
        settings, token, token=token, token_source=_static_credential(settings, token)
    )


def _static_credential(settings: PortSettings, token: str) -> TokenSource:
    """Every call's token; the port asks again only after a 401, and a static credential has
    nothing to refresh: the key was revoked or rotated (a HubSpot service key "can be managed
    or rotated" by the portal's admins,
    https://developers.hubspot.com/docs/apps/developer-platform/build-apps/authentication/account-service-keys),
    so the call fails for good, naming the connection and the variable (never the value)."""

    def source(rejected: str | None) -> str:
        if rejected is None:
            return token
        what = CREDENTIAL_KINDS.get(settings.credential_kind, "credential")
        raise PortError(
            f"connection {settings.connection_id}: {_title(settings)} refused its {what} "
            f"(revoked or rotated?); put the current one in {settings.api_credentials_env}",
            code="unauthorized",
            transient=False,
            status=401,
        )

    return source


def _cached_port(
    settings: PortSettings,
    credential: str,
    *,
    token: str | None = None,
    token_source: TokenSource | None = None,
) -> CrmPort:
    """The connection's observed port, built on first use and reused while its base URL,
    `credential` (its token, or its OAuth client), app id and key property stay the same."""
    key = (
        settings.connection_id,
        settings.provider,
        settings.api_base_url,
        credential,
        f"{settings.provider_app_id}|{settings.idempotency_property}",
    )
    with _cache_lock:
        port = _cache.get(key)
        if port is None:
            crm, _ = _crm(settings.provider)
            _drop_cached(settings.connection_id)
            adapter = crm.port(
                token,
                base_url=settings.api_base_url,
                app_id=settings.provider_app_id,
                idempotency_property=settings.idempotency_property,
                token_source=token_source,
            )
            if isinstance(adapter, WebhookTargeted):
                _target_webhooks(adapter, settings)
            port = ObservedPort(
                adapter,
                settings.connection_id,
                singular_object_type,
                crm.label_properties,
                rate_budget=crm.rate_budget,
            )
            _cache[key] = port
        return port


def _target_webhooks(adapter: WebhookTargeted, settings: PortSettings) -> None:
    """Tell a port that creates its own webhooks where they deliver: this connection's URL at
    the webhook function (`PUBLIC_BASE_URL` + `/<provider>/<connection id>`, the path
    shared/ingest/receive.py takes) and the connection's webhook secret as their credential.
    Without a public base URL the port is told nothing, and creating a subscription fails
    with that reason in the reconcile's record."""
    base = app_settings().public_base_url
    if not base:
        return
    url = f"{base.rstrip('/')}/{settings.provider}/{settings.connection_id}"
    secret = named_secret(settings.webhook_secret_env) if settings.webhook_secret_env else None
    adapter.target_webhooks(url, secret or None)


def _title(settings: PortSettings) -> str:
    found = registry.get(settings.provider)
    return found.title if found is not None else settings.provider


def _crm(provider: str, *, oauth: bool = False) -> tuple[Crm, OAuth | None]:
    """The provider's CRM adapter (and its OAuth half, which `oauth` requires)."""
    found = registry.get(provider)
    if found is None or found.crm is None or (oauth and found.oauth is None):
        raise PortError(
            f"no CRM adapter for provider {provider!r}", code="invalid_request", transient=False
        )
    return found.crm, found.oauth


def _env(name: str | None, what: str) -> str:
    value = named_secret(name) if name else None
    if not value:
        raise PortError(
            f"{what}: environment variable {name} is not set"
            if name
            else f"{what}: the app names no variable",
            code="unauthorized",
            transient=False,
        )
    return value


def _oauth_port(settings: PortSettings, db: Database) -> CrmPort:
    """The port of an OAuth connection: no token of its own, a token source instead, reading
    through `db` — the pool of the caller that built it (a step's, whose connection is
    pinned to its thread: the token is read on the step's own connection). The port is
    kept per pool (its key names it), so a token source never outlives its pool."""
    _, oauth = _crm(settings.provider, oauth=True)
    assert oauth is not None  # _crm refused a provider without one
    client_id = _env(settings.oauth_client_id_env, "the app's OAuth client id")
    client_secret = _env(settings.oauth_client_secret_env, "the app's OAuth client secret")
    refresher = oauth.refresher(
        client_id=client_id, client_secret=client_secret, base_url=settings.api_base_url
    )
    connection_id = settings.connection_id

    def token_source(rejected: str | None) -> str:
        try:
            return oauth_tokens.access_token(db, connection_id, refresher, rejected=rejected)
        except oauth_tokens.ReauthorizationNeeded as exc:
            raise PortError(str(exc), code="unauthorized", transient=False) from None
        except oauth_tokens.NoGrant:
            raise PortError(
                f"connection {connection_id} has no OAuth grant",
                code="unauthorized",
                transient=False,
            ) from None
        except oauth_tokens.TokenKeyUnavailable as exc:
            raise PortError(str(exc), code="unauthorized", transient=False) from None

    return _cached_port(
        settings, f"oauth:{client_id}:{client_secret}:pool{id(db)}", token_source=token_source
    )


def _drop_cached(connection_id: str) -> None:
    """Close and forget the connection's older port (caller holds `_cache_lock`)."""
    for k in [k for k in _cache if k[0] == connection_id]:
        old = _cache.pop(k)
        close = getattr(old, "close", None)
        if callable(close):
            close()


def port_for_app(app: ProviderApp) -> CrmPort | None:
    """A port acting with the app's developer credential (for its webhook subscriptions); None
    when the app names none. A private app has no subscriptions API at all."""
    found = registry.get(app.provider)
    if found is None or found.crm is None or not found.crm.app_subscriptions:
        raise PortError(
            f"no adapter for provider {app.provider!r}", code="invalid_request", transient=False
        )
    crm = found.crm
    if not app.developer_credential_env:
        return None
    key = named_secret(app.developer_credential_env)
    if not key:
        raise PortError(
            f"environment variable {app.developer_credential_env} is not set",
            code="unauthorized",
            transient=False,
        )
    cache_key = (f"app:{app.app_id}", app.provider, app.api_base_url, key, app.app_id)
    with _cache_lock:
        port = _cache.get(cache_key)
        if port is None:  # kept like a connection's, so a warm instance reuses its pool
            port = crm.port(
                None, base_url=app.api_base_url, app_id=app.app_id, developer_api_key=key
            )
            _cache[cache_key] = port
        return port


def set_provider_app_id(tx: Tx, connection_id: str, app_id: str | None) -> int:
    return tx.execute(SET_APP_ID, connection_id=connection_id, provider_app_id=app_id)


def forget_ports() -> None:
    """Drop cached ports (tests that restart the fake CRM)."""
    with _cache_lock:
        for port in _cache.values():
            close = getattr(port, "close", None)
            if callable(close):
                close()
        _cache.clear()


def port_for(db: Database, connection_id: str) -> CrmPort:
    """The port for a connection, reading its row on `db` (one statement, committed with it:
    one round trip; a step's is its pinned connection). Raises `PortError` (not a translated
    database error) for unknown, paused or secretless rows."""

    def read(tx: Tx) -> PortSettings:
        if not is_connection_id(connection_id):
            return load_port_settings(tx, connection_id)  # `missing`, with no statement
        rows = tx.commit_with(GET, connection_id=connection_id)
        return _settings_of(connection_id, rows[0] if rows else None)

    return build_port(db.run(read), db)
