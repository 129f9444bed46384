"""App installs on the ops function: the operator's start and confirmation (ops API routes).
The flow itself, and why an install needs both, is shared/providers/install.py.

The vendor's browser redirect back is not served here: ops is IAM-gated in the cloud (only
`ops_invokers` may call it, and Cloud Run IAM is per service, not per path), so a browser
without a Google identity token could never reach it. The callback is on the public `webhook`
function (shared/ops/install_callback.py); the redirect URI an install sends is that
function's URL, which ops learns from `ONCEFLOW_OAUTH_REDIRECT_URL`
(oauth_install.configured_redirect_url).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from shared.accounts.provider_apps import is_app_id
from shared.core.db import Database
from shared.ops import auth
from shared.ops.errors import OpsError
from shared.ops.models import (
    InstallClaim,
    InstallConfirm,
    InstallConfirmed,
    InstallRequest,
    InstallStarted,
)
from shared.ops.statements import TENANT_EXISTS
from shared.providers import install as oauth_install
from shared.providers.install import Installed, InstallRefused


@contextmanager
def _refusals_answered() -> Iterator[None]:
    """The install flow's refusals, as the API's errors (their status, code and words)."""
    try:
        yield
    except InstallRefused as refused:
        raise OpsError(refused.status, refused.code, refused.message) from None


def _confirmed(done: Installed) -> InstallConfirmed:
    return InstallConfirmed(
        tenant_id=done.tenant_id,
        app_id=done.app_id,
        portal_id=done.portal_id,
        connection_id=done.connection_id,
        outcome=done.outcome,
    )


def _tenant(principal: auth.Principal, named: str | None) -> str:
    """The tenant an install is for: a tenant token's own (naming another reads as unknown),
    or the one an admin token names."""
    tenant_id = named or principal.tenant_id
    if principal.tenant_id is not None and tenant_id != principal.tenant_id:
        raise OpsError(404, "not_found", "no such tenant")  # another tenant reads as unknown
    if tenant_id is None:
        raise OpsError(422, "invalid_body", "an admin token must name the tenant (tenant_id)")
    return tenant_id


def start(
    db: Database, principal: auth.Principal, provider: str, app_id: str, body: InstallRequest
) -> InstallStarted:
    """The ops API handler's work (shared/ops/api/apps.py routes `apps.install` here)."""
    tenant_id = _tenant(principal, body.tenant_id)
    if not is_app_id(app_id):
        raise OpsError(404, "not_found", "no such provider app")
    with _refusals_answered():
        redirect_uri = oauth_install.configured_redirect_url()
    with db.transaction() as tx:
        if tx.one(TENANT_EXISTS, tenant_id=tenant_id) is None:
            raise OpsError(404, "not_found", "no such tenant")
        with _refusals_answered():
            started = oauth_install.start(
                tx,
                tenant_id=tenant_id,
                app_id=app_id,
                redirect_uri=redirect_uri,
                started_by=principal.token_id,
                provider=provider,
            )
    return InstallStarted(
        tenant_id=tenant_id,
        app_id=app_id,
        authorize_url=started.authorize_url,
        redirect_uri=started.redirect_uri,
        expires_at=started.expires_at,
    )


def confirm(
    db: Database, principal: auth.Principal, provider: str, app_id: str, body: InstallConfirm
) -> InstallConfirmed:
    """The ops API handler of `apps.install.confirm`: the token that started the install sends
    the code its callback page showed."""
    if not is_app_id(app_id):
        raise OpsError(404, "not_found", "no such install waiting for confirmation")
    with _refusals_answered():
        done = oauth_install.confirm(
            db,
            app_id=app_id,
            confirm_code=body.confirm_code,
            token_id=principal.token_id,
            provider=provider,
        )
    return _confirmed(done)


def claim(
    db: Database, principal: auth.Principal, provider: str, app_id: str, body: InstallClaim
) -> InstallConfirmed:
    """The ops API handler of `apps.install.claim`: an operator of a tenant claims an install
    that started at the provider, with the code and portal its callback page showed
    (shared/providers/install.py `claim` says why the code is the proof)."""
    tenant_id = _tenant(principal, body.tenant_id)
    if not is_app_id(app_id):
        raise OpsError(404, "not_found", "no such install waiting to be claimed")
    with db.transaction() as tx:
        known = tx.one(TENANT_EXISTS, tenant_id=tenant_id) is not None
    if not known:
        raise OpsError(404, "not_found", "no such tenant")
    with _refusals_answered():
        done = oauth_install.claim(
            db,
            app_id=app_id,
            portal_id=body.portal_id,
            claim_code=body.claim_code,
            tenant_id=tenant_id,
            token_id=principal.token_id,
            provider=provider,
        )
    return _confirmed(done)
