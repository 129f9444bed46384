"""A vendor's browser redirect back from an app install: `GET /oauth/<provider>/callback`
(`CALLBACK_PATHS`, one per provider with OAuth installs) and an app's own
`GET /oauth/<provider>/callback/<app id>` (where an install that started at the provider comes
back, without our state: kept pending for a tenant's claim), served by the public `webhook`
function (functions/webhook.py).

Public on purpose: the redirect is a person's browser, carrying no ops login and no Google
identity token, and the ops function is IAM-gated in the cloud (Cloud Run IAM is per service,
not per path). What authenticates it is the install's single-use `state`
(shared/providers/install.py consumes it before anything else). The answer is a small HTML
page rendered with the ops templates; every outcome, refused or pending, leaves an audit row
naming who started the install. Nothing is connected here: the page shows the code with which
the operator who started the install confirms it on ops (shared/providers/install.py says
why).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from flask import Request, Response

from shared.core.db import Database
from shared.core.errors import ConflictError, TransientError
from shared.core.logs import get_logger
from shared.ops.statements import AUDIT_INSERT
from shared.providers import install as oauth_install
from shared.providers import registry
from shared.providers.install import InstallRefused, app_callback_of, callback_path


def callback_action(provider: str) -> str:
    """The callback's audit action, beside the ops routes' `apps.<provider>.install`."""
    return f"apps.{provider}.callback"


def _provider_of(path: str) -> str:
    """The provider whose callback `path` is (functions/webhook.py only routes those here)."""
    own = app_callback_of(path)
    if own is not None:
        return own[0]
    return next(
        (p for p in registry.oauth_providers() if callback_path(p) == path),
        registry.oauth_providers()[0],
    )


def is_callback(path: str) -> bool:
    """Whether the webhook function should answer `path` here: a provider's callback, or an
    app's own (shared/providers/install.py app_callback_path)."""
    return path in oauth_install.CALLBACK_PATHS or app_callback_of(path) is not None


log = get_logger(__name__)


def _audit(
    db: Database,
    provider: str,
    tenant_id: str | None,
    started_by: str | None,
    detail: Mapping[str, Any],
) -> None:
    """The callback's audit row, in its own transaction; it names who started the install (no
    token came with the redirect). Never the code, the state or a token."""
    with db.transaction() as tx:
        tx.execute(
            AUDIT_INSERT,
            token_id=started_by,
            tenant_id=tenant_id,
            action=callback_action(provider),
            target=detail.get("app_id"),
            detail=json.dumps(dict(detail), default=str),
        )


def callback(db: Database, request: Request) -> Response:
    """`GET /oauth/<provider>/callback?code=...&state=...` (or `?error=...&state=...`)."""
    # Jinja and the page's templates load when a callback arrives, not on every cold start
    # of the webhook function.
    from shared.ops.html import render

    if request.method != "GET":
        return render("error.html", "Install", message="use GET", status=405)
    args = request.args
    provider = _provider_of(request.path)
    own = app_callback_of(request.path)
    if own is not None and not args.get("state"):
        return _unclaimed(db, own[0], own[1], request)
    try:
        done = oauth_install.finish(
            db, state=args.get("state"), code=args.get("code"), error=args.get("error")
        )
    except InstallRefused as refused:
        try:
            _audit(
                db,
                provider,
                refused.tenant_id,
                refused.started_by,
                {"outcome": "refused", "code": refused.code, "status": refused.status},
            )
        except TransientError:
            log.warning(
                "install callback refused (%s); its audit row was not written", refused.code
            )
        return render(
            "install.html",
            "Install refused",
            message=refused.message,
            error=True,
            status=refused.status,
        )
    except ConflictError:  # two installs of one portal at once: the other one won
        return render(
            "install.html",
            "Install refused",
            error=True,
            status=409,
            message="the portal was connected by another install just now; reload",
        )
    except TransientError:
        return render(
            "install.html",
            "Busy",
            error=True,
            status=503,
            message="the database is busy; start the install again",
        )
    try:
        _audit(
            db,
            done.provider,
            done.tenant_id,
            done.started_by,
            {"outcome": "pending_confirmation", "app_id": done.app_id, "portal_id": done.portal_id},
        )
    except TransientError:  # the pending install is committed; say so rather than answer 503
        log.warning("install of portal %s pending; its audit row was not written", done.portal_id)
    page = render(
        "install.html",
        "Confirm the install",
        message=f"{_title(done.provider)} portal {done.portal_id} asks to be connected to "
        f"onceflow tenant {done.tenant_id}. Nothing is connected yet.",
        confirm_code=done.confirm_code,
        confirm_path=f"/v1/apps/{done.provider}/{done.app_id}/installs/confirm",
        confirm_by=done.confirm_by,
        tenant_id=done.tenant_id,
        app_id=done.app_id,
        error=False,
        status=200,
    )
    page.headers["Cache-Control"] = "no-store"  # the code is for this browser, this once
    return page


def _title(provider: str) -> str:
    found = registry.get(provider)
    return found.title if found is not None else provider


def _unclaimed(db: Database, provider: str, app_id: str, request: Request) -> Response:
    """An install that started at the provider (no state of ours): kept pending, bound to no
    tenant, with a claim code for the page (shared/providers/install.py finish_unclaimed)."""
    from shared.ops.html import render

    args = request.args
    try:
        done = oauth_install.finish_unclaimed(
            db, provider=provider, app_id=app_id, code=args.get("code"), error=args.get("error")
        )
    except InstallRefused as refused:
        try:
            _audit(
                db,
                provider,
                None,
                None,
                {
                    "outcome": "refused",
                    "code": refused.code,
                    "status": refused.status,
                    "app_id": app_id,
                },
            )
        except TransientError:
            log.warning(
                "unclaimed install refused (%s); its audit row was not written", refused.code
            )
        return render(
            "install.html",
            "Install refused",
            message=refused.message,
            error=True,
            status=refused.status,
        )
    except TransientError:
        return render(
            "install.html",
            "Busy",
            error=True,
            status=503,
            message="the database is busy; install the app again",
        )
    try:
        _audit(
            db,
            done.provider,
            None,
            None,
            {"outcome": "pending_claim", "app_id": done.app_id, "portal_id": done.portal_id},
        )
    except TransientError:  # the pending install is committed; say so rather than answer 503
        log.warning("install of portal %s pending a claim; no audit row", done.portal_id)
    page = render(
        "install.html",
        "Claim the install",
        message=f"{_title(done.provider)} portal {done.portal_id} installed the app. Nothing is"
        " connected yet: an operator of your onceflow tenant claims it with the code below.",
        claim_code=done.claim_code,
        claim_path=f"/v1/apps/{done.provider}/{done.app_id}/installs/claim",
        claim_by=done.claim_by,
        portal_id=done.portal_id,
        app_id=done.app_id,
        provider=done.provider,
        error=False,
        status=200,
    )
    page.headers["Cache-Control"] = "no-store"  # the code is for this browser, this once
    return page
