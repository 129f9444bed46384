"""Installing a provider's public app on an account (a HubSpot portal, say), with the vendor's
half of OAuth from its registry entry (`Provider.oauth`): authorize URL → browser redirect → code
exchange → confirmation by the operator who started it → the portal's connection, with its
grant sealed in shared/oauth_tokens.

- Start (an operator, authenticated by the ops API): a fresh `state` — 32 random bytes,
  unguessable — is stored as its SHA-256 only, bound to the tenant, the app and the ops token
  that started it, expiring after `STATE_TTL_SECONDS`; the operator's browser goes to the
  app's authorize URL with it.
- Callback (public: HubSpot's redirect carries no login of ours): the state is consumed by a
  guarded UPDATE before anything else (used at most once, even by two concurrent callbacks),
  the code is exchanged at the token endpoint and the access token tells which portal it is
  for (`hub_id`). Nothing is connected yet: the grant is kept sealed with the state, and the
  page names the tenant and the portal and shows a confirmation code (only its hash is kept).
- Confirmation (ops, authenticated): the ops token that started the install sends the code
  within `CONFIRM_TTL_SECONDS`; then, in one transaction, the portal's connection for the app
  is created, or the existing one re-authorized (its grant replaced, `needs_reauthorization`
  cleared).

Why the confirmation (issue 23, item 11): the state proves that an install was started, not
that the browser HubSpot sends back belongs to whoever started it. An operator of tenant A
could start an install and send the authorize link to another company's HubSpot admin; their
consent would connect their portal to tenant A (OAuth's login-CSRF shape, turned around). The
usual fix, a cookie set when the flow starts and checked at the callback, does not fit here:
the start is an API call (often from the CLI, with a bearer token), not a page the consenting
browser loaded, and ops and the webhook function live on different hosts under
`run.app`/`cloudfunctions.net`, public suffixes on which no cookie can be shared — and a link
that sets the cookie could itself be forwarded. What does bind the two is asking both halves
to meet: the code is shown only to the browser that consented, and it is accepted only from
the ops token that started the install. The victim's admin sees a page naming a tenant that
is not theirs and nothing happens; the operator who sent the link never sees the code.

Installs that start at the provider (issue 26, item 5: the app's install URL, a Marketplace
listing) come back to the app's own callback (`app_callback_path`) with a code and no state.
They are accepted by `finish_unclaimed` — exchanged, kept pending and bound to no tenant, with
a claim code shown once — and attached only when an operator of a tenant `claim`s them with
that code and the portal; `finish_unclaimed` says which threats that closes.

Refused (`InstallRefused`, a 4xx for the page; 502 when HubSpot can't be reached): a missing,
malformed, unknown, expired or used state; HubSpot's `error` parameter; a code the token
endpoint refuses (HubSpot refuses a code used twice); a token for another app; a portal
already connected to another tenant (at the callback, and again at the confirmation). At the
confirmation: an unknown, wrong, late or already used code, or another token than the one that
started the install (all answered alike, 404). Nothing is created then. Codes, confirmation
codes and tokens never appear in a message, a log line or the audit.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal
from urllib.parse import urlsplit

from shared.accounts import connections, oauth_tokens, provider_apps
from shared.accounts.provider_apps import ProviderApp
from shared.accounts.token_endpoint import CodeRefused
from shared.core import queries
from shared.core.db import Database, Tx
from shared.core.duty import Duty, SweepConfig
from shared.core.settings import settings
from shared.port.interface import PortError
from shared.providers import registry
from shared.providers.descriptor import OAuth, Provider, TokenAccount

SQL = queries.load("oauth_install")
STATE_INSERT = SQL["oauth_install_state_insert"]
STATE_CONSUME = SQL["oauth_install_state_consume"]
STATE_WHY = SQL["oauth_install_state_why"]
STATE_PEND = SQL["oauth_install_state_pend"]
CONFIRM = SQL["oauth_install_confirm"]
STATE_DONE = SQL["oauth_install_state_done"]
PORTAL_OWNER = SQL["oauth_install_portal_owner"]
STATES_TRIM = SQL["oauth_install_states_trim"]
LAPSED_GRANTS_CLEAR = SQL["oauth_install_lapsed_grants_clear"]
CONNECTION_LOCK = SQL["oauth_install_connection_lock"]
REAUTHORIZED = SQL["oauth_install_reauthorized"]
PENDING_INSERT = SQL["pending_install_insert"]
PENDING_LOCK = SQL["pending_install_lock"]
PENDING_CLAIM = SQL["pending_install_claim"]
PENDING_DONE = SQL["pending_install_done"]
PENDING_WAITING = SQL["pending_installs_waiting"]
PENDING_TRIM = SQL["pending_installs_trim"]
PENDING_GRANTS_CLEAR = SQL["pending_lapsed_grants_clear"]


# Served by the public `webhook` function (functions/webhook.py): HubSpot's redirect is a
# person's browser, which carries no Google identity token, and ops is IAM-gated.
def callback_path(provider: str) -> str:
    return f"/oauth/{provider}/callback"


def _install_provider() -> str:
    """The provider an install is for when the caller names none: ops' install routes and
    `ONCEFLOW_OAUTH_REDIRECT_URL` name one provider today (the first with OAuth installs)."""
    return registry.oauth_providers()[0]


def app_callback_path(provider: str, app_id: str) -> str:
    """The app's own callback, where an install that starts at the provider comes back: the
    path names the app, since such a redirect carries no state of ours to tell it (and the code
    can only be exchanged with the app's client)."""
    return f"{callback_path(provider)}/{app_id}"


_APP_CALLBACK = re.compile(r"^/oauth/(?P<provider>[a-z_]+)/callback/(?P<app_id>[0-9]{1,20})$")


def app_callback_of(path: str) -> tuple[str, str] | None:
    """(provider, app id) when `path` is an app's own callback."""
    found = _APP_CALLBACK.match(path)
    if found is None or found["provider"] not in registry.oauth_providers():
        return None
    return found["provider"], found["app_id"]


CALLBACK_PATH = callback_path(_install_provider())
# Every callback the webhook function serves, one per provider with OAuth installs.
CALLBACK_PATHS = frozenset(callback_path(p) for p in registry.oauth_providers())
# The redirect URI an install sends: the webhook function's public URL + CALLBACK_PATH, given
# to ops as a plain setting (infra/functions.tf; the local stack sets it to its webhook
# process). Behind Cloud Functions' front end no request of ops could tell it.
REDIRECT_URL_ENV = "ONCEFLOW_OAUTH_REDIRECT_URL"
STATE_TTL_SECONDS = 600  # long enough to log in to HubSpot and pick a portal
# Long enough to copy the code from the page into ops; the grant waits sealed meanwhile.
CONFIRM_TTL_SECONDS = 1800
# An install that started at the provider waits for its claim longer: the admin who installed
# it has to reach an operator of their tenant with the code. The refresh token keeps the
# grant usable; the sweep drops a lapsed one.
CLAIM_TTL_SECONDS = 24 * 3600
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
class Pending:
    """A callback's result: the portal HubSpot authorized, waiting for the confirmation."""

    tenant_id: str
    app_id: str
    portal_id: str
    confirm_code: str  # shown on the page, once; only its hash is kept
    confirm_by: datetime
    started_by: str | None
    provider: str  # whose app it is: the confirmation's route names it


@dataclass(frozen=True)
class Unclaimed:
    """An install that started at the provider, waiting for a tenant's operator to claim it."""

    provider: str
    app_id: str
    portal_id: str
    claim_code: str  # shown on the page, once; only its hash is kept
    claim_by: datetime


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
    url = (settings().oauth_redirect_url or "").strip()
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


def _oauth(provider: str) -> tuple[Provider, OAuth]:
    found = registry.get(provider)
    if found is None or found.oauth is None:
        raise InstallRefused(404, "no_such_app", f"no {provider} app is installed with OAuth")
    return found, found.oauth


def _oauth_app(tx: Tx, app_id: str, provider: str | None = None) -> ProviderApp:
    found, _ = _oauth(provider or _install_provider())
    app = provider_apps.get_app(tx, found.name, app_id)
    if app is None:
        raise InstallRefused(404, "no_such_app", f"no {found.title} app {app_id!r} is registered")
    if app.kind != "public" or not app.oauth_client_id_env:
        raise InstallRefused(
            409,
            "not_installable",
            f"{found.title} app {app_id} is not a public app with an OAuth client "
            "(provider_apps.oauth_client_id_env)",
        )
    return app


def start(
    tx: Tx,
    *,
    tenant_id: str,
    app_id: str,
    redirect_uri: str,
    started_by: str | None,
    provider: str | None = None,
) -> Started:
    """A new install of `app_id` for `tenant_id`: the URL to send the operator's browser to."""
    app = _oauth_app(tx, app_id, provider)
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
    _, oauth = _oauth(app.provider)
    url = oauth.authorize_url(
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


Refusal = Callable[[int, str, str], InstallRefused]


def _exchange(
    app: ProviderApp, code: str, redirect_uri: str, refused: Refusal
) -> tuple[oauth_tokens.Grant, TokenAccount]:
    """The code exchanged with the app's client, and the account (portal) its token is for;
    `refused` makes the refusals (the caller's, naming whoever started the install)."""
    found, oauth = _oauth(app.provider)
    try:
        client_id, client_secret = app.oauth_client()
        oauth_tokens.key_from_env(oauth_tokens.TOKEN_KEK_ENV)  # the grant could not be kept
    except (provider_apps.SecretUnavailable, oauth_tokens.TokenKeyUnavailable) as exc:
        raise refused(409, "not_configured", str(exc)) from None
    try:
        grant = oauth.exchange_code(
            client_id=client_id,
            client_secret=client_secret,
            redirect_uri=redirect_uri,
            code=code,
            base_url=app.api_base_url,
        )
        info = oauth.token_account(
            grant.access_token,
            client_id=client_id,
            client_secret=client_secret,
            base_url=app.api_base_url,
        )
    except CodeRefused as exc:
        raise refused(
            400,
            "code_refused",
            f"{found.title} refused the authorization code ({exc.status}); start the install again",
        ) from None
    except PortError as exc:
        status = 502 if exc.transient else 400
        raise refused(status, "exchange_failed", f"the code exchange failed: {exc.code}") from None
    if info.app_id is not None and info.app_id != app.app_id:
        raise refused(400, "other_app", f"the token {found.title} gave is for another app")
    return grant, info


def _grant_aad(state_sha256: bytes) -> bytes:
    """What a pending grant is sealed to: its install, so it opens for no other row."""
    return b"oauth-install:" + state_sha256


def finish(db: Database, *, state: str | None, code: str | None, error: str | None) -> Pending:
    """The callback: consume the state, exchange the code, keep the grant for the confirmation.
    Raises InstallRefused; connects nothing either way (see the module docstring)."""
    bound = _consume(db, state)  # first, so a replayed or forged callback stops here
    tenant_id, started_by = bound["tenant_id"], bound["started_by"] or None

    def refused(status: int, code_: str, message: str) -> InstallRefused:
        return InstallRefused(status, code_, message, tenant_id=tenant_id, started_by=started_by)

    found = registry.get(bound["provider"])
    title = found.title if found is not None else bound["provider"]
    if error:
        # The provider's own words are shown but bounded: the parameter is attacker-controlled.
        raise refused(400, "authorization_refused", f"{title} did not authorize: {error[:100]}")
    if not code or len(code) > 512:
        raise refused(400, "no_code", f"{title}'s redirect carried no authorization code")
    try:
        app = _oauth_app_outside(db, bound["app_id"], bound["provider"])
    except InstallRefused as gone:  # the app was changed since the install started
        raise refused(gone.status, gone.code, gone.message) from None
    grant, info = _exchange(app, code, bound["redirect_uri"], refused)
    digest = state_hash(state or "")
    # Hex, not urlsafe: a person passes it to `onceflow confirm-install`, where a code that
    # starts with "-" (1 in 64 urlsafe codes) would be read as an option.
    confirm_code = secrets.token_hex(16)
    with db.transaction() as tx:
        owner = tx.one(
            PORTAL_OWNER, provider=app.provider, app_id=app.app_id, account_id=info.account_id
        )
        confirm_by = (
            None
            if owner is not None and owner["tenant_id"] != tenant_id
            else tx.scalar(
                STATE_PEND,
                state_sha256=digest,
                portal_id=info.account_id,
                grant_sealed=oauth_tokens.seal_grant_for_later(grant, _grant_aad(digest)),
                grant_kek_env=oauth_tokens.TOKEN_KEK_ENV,
                confirm_code_sha256=state_hash(confirm_code),
                confirm_ttl_seconds=CONFIRM_TTL_SECONDS,
            )
        )
    if confirm_by is None:
        raise refused(
            409,
            "portal_taken",
            f"portal {info.account_id} is already connected to another tenant for this app",
        )
    return Pending(
        tenant_id, app.app_id, info.account_id, confirm_code, confirm_by, started_by, app.provider
    )


def app_callback_url(app_id: str, provider: str | None = None) -> str:
    """The app's own callback URL: `ONCEFLOW_OAUTH_REDIRECT_URL` (checked) + `/<app id>`, on the
    same webhook function. It goes in the app's redirect URLs (its project's
    `auth.redirectUrls`), for the installs that start at the provider."""
    base = configured_redirect_url()
    return base[: -len(CALLBACK_PATH)] + app_callback_path(provider or _install_provider(), app_id)


def _claim_aad(claim_code_sha256: bytes) -> bytes:
    """What a pending install's grant is sealed to: its row (by its claim code's hash)."""
    return b"pending-install:" + claim_code_sha256


def finish_unclaimed(
    db: Database, *, provider: str, app_id: str, code: str | None, error: str | None
) -> Unclaimed:
    """The app's own callback without a state of ours: an install that started at the provider
    (its install URL, a Marketplace listing). Nobody here started it, so it is bound to no
    tenant: the code is exchanged, the portal learnt, the grant kept sealed, and the page shows
    a claim code (only its hash is kept). Raises InstallRefused; connects nothing.

    The threat closed: an install arriving unasked must not land in any tenant by itself (a
    stranger installing the app on their portal would otherwise feed some tenant's workflows,
    or be attached to whoever claims first), nor be claimable by a tenant that merely knows
    the portal id (portal ids are in every HubSpot URL; a tenant "declaring" someone else's
    portal would capture its install). The claim code is the proof: only the browser that
    consented on the portal saw it, so only someone that admin hands it to — an operator of
    their own tenant — can claim it, once, within `CLAIM_TTL_SECONDS`."""
    found, _ = _oauth(provider)

    def refused(status: int, code_: str, message: str) -> InstallRefused:
        return InstallRefused(status, code_, message)

    if error:
        # The provider's own words, bounded: the parameter is whoever-sent-it's.
        raise refused(
            400, "authorization_refused", f"{found.title} did not authorize: {error[:100]}"
        )
    if not code or len(code) > 512:
        raise refused(400, "no_code", f"{found.title}'s redirect carried no authorization code")
    app = _oauth_app_outside(db, app_id, provider)
    grant, info = _exchange(app, code, app_callback_url(app.app_id, app.provider), refused)
    claim_code = secrets.token_hex(16)  # hex: typed as an argument (see `finish`)
    digest = state_hash(claim_code)
    with db.transaction() as tx:
        claim_by = tx.scalar(
            PENDING_INSERT,
            provider=app.provider,
            app_id=app.app_id,
            portal_id=info.account_id,
            grant_sealed=oauth_tokens.seal_grant_for_later(grant, _claim_aad(digest)),
            grant_kek_env=oauth_tokens.TOKEN_KEK_ENV,
            claim_code_sha256=digest,
            claim_ttl_seconds=CLAIM_TTL_SECONDS,
        )
    return Unclaimed(app.provider, app.app_id, info.account_id, claim_code, claim_by)


def waiting_claims(tx: Tx) -> list[dict[str, Any]]:
    """Installs that started at the provider and wait for a claim (at most 50, newest first):
    for the operator's health page, never a tenant's (the portals are nobody's yet)."""
    return tx.all(PENDING_WAITING)


def claim(
    db: Database,
    *,
    app_id: str,
    portal_id: str,
    claim_code: str,
    tenant_id: str,
    token_id: str | None,
    provider: str | None = None,
) -> Installed:
    """An operator of `tenant_id` claims an install that started at the provider, with the
    code its callback page showed and the portal it names: the portal's connection is created
    (or, the tenant's own, re-authorized) in the claim's transaction. InstallRefused: 404 for
    a wrong code or portal, a lapsed or an already claimed install (alike); 409 when the portal
    is connected to another tenant (the install stays claimable by that tenant)."""
    unknown = InstallRefused(404, "not_found", "no such install waiting to be claimed")
    if not _STATE.match(claim_code) or not provider_apps.is_app_id(portal_id):
        raise unknown
    app = _oauth_app_outside(db, app_id, provider)
    with db.transaction() as tx:
        result = (
            _claim_in(tx, app, portal_id, claim_code, tenant_id=tenant_id, token_id=token_id)
            or unknown
        )
    if isinstance(result, InstallRefused):  # raised after the transaction (see `confirm`)
        raise result
    return result


def _claim_in(
    tx: Tx,
    app: ProviderApp,
    portal_id: str,
    claim_code: str,
    *,
    tenant_id: str,
    token_id: str | None,
) -> Installed | InstallRefused | None:
    """The claim in one transaction; None: nothing to claim (the caller's 404)."""
    row = tx.one(
        PENDING_LOCK,
        claim_code_sha256=state_hash(claim_code),
        provider=app.provider,
        app_id=app.app_id,
        portal_id=portal_id,
    )
    if row is None:
        return None
    existing = tx.one(
        CONNECTION_LOCK, provider=app.provider, app_id=app.app_id, account_id=portal_id
    )
    if existing is not None and existing["tenant_id"] != tenant_id:
        # Checked before the claim moves: the tenant that holds the portal can still claim it.
        return InstallRefused(
            409,
            "portal_taken",
            f"portal {portal_id} is already connected to another tenant for this app",
            tenant_id=tenant_id,
            started_by=token_id,
        )
    if tx.one(PENDING_CLAIM, id=row["id"], tenant_id=tenant_id, token_id=token_id) is None:
        return None  # lapsed between the lock and now
    kept = oauth_tokens.open_grant_kept_for_later(
        bytes(row["grant_sealed"]),
        _claim_aad(bytes(row["claim_code_sha256"])),
        str(row["grant_kek_env"]),
    )
    connection_id, outcome = _attach(
        tx, app, tenant_id, portal_id, existing=existing, grant=_aged(kept, row["pending_seconds"])
    )
    tx.execute(PENDING_DONE, id=row["id"], connection_id=connection_id)
    return Installed(tenant_id, app.app_id, portal_id, connection_id, outcome, token_id)


def confirm(
    db: Database,
    *,
    app_id: str,
    confirm_code: str,
    token_id: str | None,
    provider: str | None = None,
) -> Installed:
    """The confirmation: the ops token that started the install sends the code its callback
    page showed; the portal's connection is created or re-authorized. InstallRefused (404) for
    an unknown, wrong, late or used code or another token; nothing is connected then."""
    unknown = InstallRefused(404, "not_found", "no such install waiting for confirmation")
    if not _STATE.match(confirm_code):
        raise unknown
    app = _oauth_app_outside(db, app_id, provider)
    with db.transaction() as tx:
        row = tx.one(
            CONFIRM,
            confirm_code_sha256=state_hash(confirm_code),
            provider=app.provider,
            app_id=app.app_id,
            token_id=token_id,
        )
        result = unknown if row is None else _connect_confirmed(tx, app, row)
    # Raised after the transaction: the pool translates whatever escapes one, and a portal
    # found taken still spends the confirmation (committed).
    if isinstance(result, InstallRefused):
        raise result
    return result


def _oauth_app_outside(db: Database, app_id: str, provider: str | None = None) -> ProviderApp:
    """`_oauth_app` in a transaction of its own, its refusal raised after it."""
    with db.transaction() as tx:
        try:
            return _oauth_app(tx, app_id, provider)
        except InstallRefused as refused:
            refusal = refused
    raise refusal


def _connect_confirmed(tx: Tx, app: ProviderApp, row: dict[str, Any]) -> InstallRefused | Installed:
    """The confirmed install's connection, created or re-authorized with the kept grant, in
    the confirmation's transaction; or the refusal when another tenant holds the portal."""
    digest, tenant_id, portal_id = bytes(row["state_sha256"]), row["tenant_id"], row["portal_id"]
    kept = oauth_tokens.open_grant_kept_for_later(
        bytes(row["grant_sealed"]), _grant_aad(digest), str(row["grant_kek_env"])
    )
    existing = tx.one(
        CONNECTION_LOCK, provider=app.provider, app_id=app.app_id, account_id=portal_id
    )
    if existing is not None and existing["tenant_id"] != tenant_id:
        return InstallRefused(
            409,
            "portal_taken",
            f"portal {portal_id} is already connected to another tenant for this app",
            tenant_id=tenant_id,
            started_by=row["started_by"],
        )
    connection_id, outcome = _attach(
        tx, app, tenant_id, portal_id, existing=existing, grant=_aged(kept, row["pending_seconds"])
    )
    tx.execute(STATE_DONE, state_sha256=digest, connection_id=connection_id)
    return Installed(tenant_id, app.app_id, portal_id, connection_id, outcome, row["started_by"])


def _aged(kept: oauth_tokens.Grant, pending_seconds: Any) -> oauth_tokens.Grant:
    """A kept grant as it is now: the access token aged while it waited; the refresh token
    renews it when due."""
    return oauth_tokens.Grant(
        kept.access_token, kept.refresh_token, max(0, kept.expires_in - int(pending_seconds))
    )


def _attach(
    tx: Tx,
    app: ProviderApp,
    tenant_id: str,
    portal_id: str,
    *,
    existing: dict[str, Any] | None,
    grant: oauth_tokens.Grant,
) -> tuple[str, Literal["created", "reauthorized"]]:
    """The portal's connection for the app, created for the tenant or (`existing`, locked, the
    tenant's own) re-authorized, holding `grant`; in the caller's transaction."""
    outcome: Literal["created", "reauthorized"]
    if existing is None:
        connection_id = connections.create_connection(
            tx,
            tenant_id=tenant_id,
            provider=app.provider,
            # Events arrive on the app's one URL, signed with its client secret.
            webhook_secret_env=app.client_secret_env,
            api_base_url=app.api_base_url,
            provider_account_id=portal_id,
            provider_app_id=app.app_id,
        )
        outcome = "created"
    else:
        connection_id = str(existing["id"])
        tx.execute(REAUTHORIZED, connection_id=connection_id)
        outcome = "reauthorized"
    oauth_tokens.store_grant(tx, connection_id, grant, oauth_tokens.TOKEN_KEK_ENV)
    return connection_id, outcome


def trim_install_states(db: Database, keep_hours: int = 24) -> dict[str, int]:
    """The sweep's duty: drop the grants of installs not confirmed or claimed in time, and
    delete install states and pending installs lapsed more than `keep_hours` ago."""
    with db.transaction() as tx:
        return {
            "grants_dropped": tx.execute(LAPSED_GRANTS_CLEAR) + tx.execute(PENDING_GRANTS_CLEAR),
            "deleted": tx.execute(STATES_TRIM, keep_hours=keep_hours),
            "pending_deleted": tx.execute(PENDING_TRIM, keep_hours=keep_hours),
        }


def sweep_duties(config: SweepConfig) -> tuple[Duty, ...]:
    return (Duty("trim_oauth_install_states", 3600.0, trim_install_states),)
