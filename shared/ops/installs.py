"""App installs on the ops function: the operator's start (an ops API route) and HubSpot's
browser redirect back (a public page: it carries no ops login, its `state` is what
authenticates it). The flow itself is shared/oauth_install.py; this module is HTTP and audit.

The callback URL HubSpot must be given (the app's redirect URL) is
`$ONCEFLOW_OPS_PUBLIC_URL/oauth/hubspot/callback`: behind Cloud Functions' front end the
request's own URL is not the one the browser used, exactly as for webhooks. Locally, without
the variable, the request's own origin is used.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from flask import Request, Response

from shared import oauth_install
from shared.db import Database
from shared.errors import ConflictError, TransientError
from shared.logs import get_logger
from shared.oauth_install import CALLBACK_PATH, InstallRefused
from shared.ops import auth
from shared.ops.errors import OpsError
from shared.ops.models import InstallRequest, InstallStarted
from shared.provider_apps import is_app_id

PUBLIC_URL_ENV = "ONCEFLOW_OPS_PUBLIC_URL"
CALLBACK_ACTION = "apps.hubspot.callback"

log = get_logger(__name__)


def callback_url(origin: str) -> str:
    base = os.environ.get(PUBLIC_URL_ENV) or origin
    return base.rstrip("/") + CALLBACK_PATH


def start(
    db: Database, principal: auth.Principal, app_id: str, body: InstallRequest, origin: str
) -> InstallStarted:
    """The ops API handler's work (shared/ops/api.py routes `apps.hubspot.install` here)."""
    tenant_id = body.tenant_id or principal.tenant_id
    if principal.tenant_id is not None and tenant_id != principal.tenant_id:
        raise OpsError(404, "not_found", "no such tenant")  # another tenant reads as unknown
    if tenant_id is None:
        raise OpsError(422, "invalid_body", "an admin token must name the tenant (tenant_id)")
    if not is_app_id(app_id):
        raise OpsError(404, "not_found", "no such provider app")
    with db.transaction() as tx:
        if tx.one(auth.TENANT_EXISTS, tenant_id=tenant_id) is None:
            raise OpsError(404, "not_found", "no such tenant")
        try:
            started = oauth_install.start(
                tx,
                tenant_id=tenant_id,
                app_id=app_id,
                redirect_uri=callback_url(origin),
                started_by=principal.token_id,
            )
        except InstallRefused as refused:
            raise OpsError(refused.status, refused.code, refused.message) from None
    return InstallStarted(
        tenant_id=tenant_id,
        app_id=app_id,
        authorize_url=started.authorize_url,
        redirect_uri=started.redirect_uri,
        expires_at=started.expires_at,
    )


def _audit(
    db: Database, tenant_id: str | None, started_by: str | None, detail: Mapping[str, Any]
) -> None:
    """The callback's audit row, in its own transaction; it names who started the install (no
    token came with the redirect). Never the code, the state or a token."""
    with db.transaction() as tx:
        tx.execute(
            auth.AUDIT_INSERT,
            token_id=started_by,
            tenant_id=tenant_id,
            action=CALLBACK_ACTION,
            target=detail.get("app_id"),
            detail=json.dumps(dict(detail), default=str),
        )


def callback(db: Database, request: Request) -> Response:
    """`GET /oauth/hubspot/callback?code=...&state=...` (or `?error=...&state=...`)."""
    from shared.ops.page import render

    if request.method != "GET":
        return render("error.html", "Install", message="use GET", status=405)
    args = request.args
    try:
        done = oauth_install.finish(
            db, state=args.get("state"), code=args.get("code"), error=args.get("error")
        )
    except InstallRefused as refused:
        try:
            _audit(
                db,
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
            done.tenant_id,
            done.started_by,
            {
                "outcome": done.outcome,
                "app_id": done.app_id,
                "portal_id": done.portal_id,
                "connection_id": done.connection_id,
            },
        )
    except TransientError:  # the install is committed; say so rather than answer 503
        log.warning("install of portal %s done; its audit row was not written", done.portal_id)
    verb = "connected" if done.outcome == "created" else "re-authorized"
    return render(
        "install.html",
        "Installed",
        message=f"HubSpot portal {done.portal_id} is {verb} for tenant {done.tenant_id} "
        f"(connection {done.connection_id}). You can close this page.",
        error=False,
        status=200,
    )
