"""Installing a HubSpot public app on a portal: authorize URL → browser redirect → code
exchange → the portal's connection, with its grant sealed in shared/oauth_tokens.

- Start (an operator, authenticated by the ops API): a fresh `state` — 32 random bytes,
  unguessable — is stored as its SHA-256 only, bound to the tenant and app, expiring after
  `STATE_TTL_SECONDS`; the operator's browser goes to the app's authorize URL with it.
- Callback (public: HubSpot's redirect carries no login of ours, so the state is the only
  authenticator): the state is consumed by a guarded UPDATE before anything else (used at most
  once, even by two concurrent callbacks), the code is exchanged at the token endpoint, the
  access token tells which portal it is for (`hub_id`), and in one transaction the portal's
  connection for the app is created, or the existing one re-authorized (its grant replaced,
  `needs_reauthorization` cleared).
- Refused (`InstallRefused`, a 4xx for the page; 502 when HubSpot can't be reached): a
  missing, malformed, unknown, expired or used state; HubSpot's `error` parameter; a code the
  token endpoint refuses (HubSpot refuses a code used twice); a token for another app; a portal
  already connected to another tenant. Nothing is created then. Codes and tokens never appear
  in a message, a log line or the audit.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Literal
from urllib.parse import urlsplit

from shared import connections, oauth_tokens, provider_apps, queries
from shared.db import Database, Tx
from shared.port import hubspot_oauth
from shared.port.interface import PortError
from shared.provider_apps import ProviderApp

SQL = queries.load("oauth_install")
STATE_INSERT = SQL["oauth_install_state_insert"]
STATE_CONSUME = SQL["oauth_install_state_consume"]
STATE_WHY = SQL["oauth_install_state_why"]
STATE_DONE = SQL["oauth_install_state_done"]
STATES_TRIM = SQL["oauth_install_states_trim"]
CONNECTION_LOCK = SQL["oauth_install_connection_lock"]
REAUTHORIZED = SQL["oauth_install_reauthorized"]

# Served by the public `webhook` function (functions/webhook.py): HubSpot's redirect is a
# person's browser, which carries no Google identity token, and ops is IAM-gated.
CALLBACK_PATH = "/oauth/hubspot/callback"
# The redirect URI an install sends: the webhook function's public URL + CALLBACK_PATH, given
# to ops as a plain setting (infra/functions.tf; the local stack sets it to its webhook
# process). Behind Cloud Functions' front end no request of ops could tell it.
REDIRECT_URL_ENV = "ONCEFLOW_OAUTH_REDIRECT_URL"
STATE_TTL_SECONDS = 600  # long enough to log in to HubSpot and pick a portal
_STATE = re.compile(r"^[A-Za-z0-9_-]{20,100}$")  # what token_urlsafe makes, bounded


class InstallRefused(Exception):
    """A start or callback that must not go on; `status` is the HTTP status to answer."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        tenant_id: str | None = None,
        started_by: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.tenant_id = tenant_id
        self.started_by = started_by


@dataclass(frozen=True)
class Started:
    authorize_url: str
    redirect_uri: str
    expires_at: datetime


@dataclass(frozen=True)
class Installed:
    tenant_id: str
    app_id: str
    portal_id: str
    connection_id: str
    outcome: Literal["created", "reauthorized"]
    started_by: str | None


def state_hash(state: str) -> bytes:
    return hashlib.sha256(state.encode()).digest()


def configured_redirect_url() -> str:
    """`$ONCEFLOW_OAUTH_REDIRECT_URL`, checked: an install started without it (or with a URL the
    webhook function does not serve the callback at) would send HubSpot's redirect nowhere."""
    url = os.environ.get(REDIRECT_URL_ENV, "").strip()
    if not url:
        raise InstallRefused(
            409,
            "not_configured",
            f"installs are not configured: {REDIRECT_URL_ENV} (the webhook function's URL + "
            f"{CALLBACK_PATH}) is not set",
        )
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.query:
        raise InstallRefused(
            409, "not_configured", f"{REDIRECT_URL_ENV} is not an absolute http(s) URL"
        )
    if not parts.path.endswith(CALLBACK_PATH):
        raise InstallRefused(
            409, "not_configured", f"{REDIRECT_URL_ENV} must end with {CALLBACK_PATH}"
        )
    return url


def _oauth_app(tx: Tx, app_id: str) -> ProviderApp:
    app = provider_apps.get_app(tx, "hubspot", app_id)
    if app is None:
        raise InstallRefused(404, "no_such_app", f"no HubSpot app {app_id!r} is registered")
    if app.kind != "public" or not app.oauth_client_id_env:
        raise InstallRefused(
            409,
            "not_installable",
            f"HubSpot app {app_id} is not a public app with an OAuth client "
            "(provider_apps.oauth_client_id_env)",
        )
    return app


def start(
    tx: Tx, *, tenant_id: str, app_id: str, redirect_uri: str, started_by: str | None
) -> Started:
    """A new install of `app_id` for `tenant_id`: the URL to send the operator's browser to."""
    app = _oauth_app(tx, app_id)
    try:
        client_id, _ = app.oauth_client()
        oauth_tokens.key_from_env(oauth_tokens.TOKEN_KEK_ENV)  # the grant could not be kept
    except (provider_apps.SecretUnavailable, oauth_tokens.TokenKeyUnavailable) as exc:
        raise InstallRefused(409, "not_configured", str(exc)) from None
    state = secrets.token_urlsafe(32)
    expires_at = tx.scalar(
        STATE_INSERT,
        state_sha256=state_hash(state),
        tenant_id=tenant_id,
        provider=app.provider,
        app_id=app.app_id,
        redirect_uri=redirect_uri,
        started_by=started_by,
        ttl_seconds=STATE_TTL_SECONDS,
    )
    url = hubspot_oauth.authorize_url(
        client_id=client_id,
        redirect_uri=redirect_uri,
        scopes=app.oauth_scopes,
        state=state,
        base=app.oauth_authorize_url,
    )
    return Started(url, redirect_uri, expires_at)


def _consume(db: Database, state: str | None) -> dict[str, str]:
    if not state or not _STATE.match(state):
        raise InstallRefused(400, "bad_state", "the install link is not valid (no or bad state)")
    digest = state_hash(state)
    with db.transaction() as tx:
        row = tx.one(STATE_CONSUME, state_sha256=digest)
        why = None if row is not None else tx.one(STATE_WHY, state_sha256=digest)
    if row is not None:
        return {k: str(v) if v is not None else "" for k, v in row.items()}
    if why is None:
        raise InstallRefused(400, "bad_state", "the install link is not valid (unknown state)")
    who = {"tenant_id": why["tenant_id"], "started_by": why["started_by"]}
    if why["used"]:
        raise InstallRefused(
            400, "state_used", "this install link was already used; start the install again", **who
        )
    raise InstallRefused(
        400, "state_expired", "this install link has expired; start the install again", **who
    )


def finish(db: Database, *, state: str | None, code: str | None, error: str | None) -> Installed:
    """The callback: consume the state, exchange the code, create or re-authorize the portal's
    connection. Raises InstallRefused; creates nothing then."""
    bound = _consume(db, state)  # first, so a replayed or forged callback stops here
    tenant_id, started_by = bound["tenant_id"], bound["started_by"] or None

    def refused(status: int, code_: str, message: str) -> InstallRefused:
        return InstallRefused(status, code_, message, tenant_id=tenant_id, started_by=started_by)

    if error:
        # HubSpot's own words are shown but bounded: the parameter is attacker-controlled text.
        raise refused(400, "authorization_refused", f"HubSpot did not authorize: {error[:100]}")
    if not code or len(code) > 512:
        raise refused(400, "no_code", "HubSpot's redirect carried no authorization code")
    with db.transaction() as tx:
        app = _oauth_app(tx, bound["app_id"])
    try:
        client_id, client_secret = app.oauth_client()
        oauth_tokens.key_from_env(oauth_tokens.TOKEN_KEK_ENV)
    except (provider_apps.SecretUnavailable, oauth_tokens.TokenKeyUnavailable) as exc:
        raise refused(409, "not_configured", str(exc)) from None
    try:
        grant = hubspot_oauth.exchange_code(
            client_id=client_id,
            client_secret=client_secret,
            redirect_uri=bound["redirect_uri"],
            code=code,
            base_url=app.api_base_url,
        )
        info = hubspot_oauth.token_info(grant.access_token, base_url=app.api_base_url)
    except hubspot_oauth.CodeRefused as exc:
        raise refused(
            400,
            "code_refused",
            f"HubSpot refused the authorization code ({exc.status}); start the install again",
        ) from None
    except PortError as exc:
        status = 502 if exc.transient else 400
        raise refused(status, "exchange_failed", f"the code exchange failed: {exc.code}") from None
    if info.app_id is not None and info.app_id != app.app_id:
        raise refused(400, "other_app", "the token HubSpot gave is for another app")
    taken = False
    with db.transaction() as tx:
        existing = tx.one(
            CONNECTION_LOCK, provider=app.provider, app_id=app.app_id, account_id=info.hub_id
        )
        if existing is not None and existing["tenant_id"] != tenant_id:
            taken = True  # raised after the transaction (the pool translates what escapes it)
        elif existing is None:
            connection_id = connections.create_connection(
                tx,
                tenant_id=tenant_id,
                provider=app.provider,
                # Events arrive on the app's one URL, signed with its client secret.
                webhook_secret_env=app.client_secret_env,
                api_base_url=app.api_base_url,
                provider_account_id=info.hub_id,
                provider_app_id=app.app_id,
            )
            outcome: Literal["created", "reauthorized"] = "created"
        else:
            connection_id = str(existing["id"])
            tx.execute(REAUTHORIZED, connection_id=connection_id)
            outcome = "reauthorized"
        if not taken:
            oauth_tokens.store_grant(tx, connection_id, grant, oauth_tokens.TOKEN_KEK_ENV)
            tx.execute(
                STATE_DONE, state_sha256=state_hash(state or ""), connection_id=connection_id
            )
    if taken:
        raise refused(
            409,
            "portal_taken",
            f"portal {info.hub_id} is already connected to another tenant for this app",
        )
    return Installed(tenant_id, app.app_id, info.hub_id, connection_id, outcome, started_by)


def trim_install_states(db: Database, keep_hours: int = 24) -> dict[str, int]:
    """The sweep's duty: delete install states expired more than `keep_hours` ago."""
    with db.transaction() as tx:
        return {"deleted": tx.execute(STATES_TRIM, keep_hours=keep_hours)}
