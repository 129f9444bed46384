"""Signed links that let a named approver decide an approval without an ops token.

A link names one approval, one user the approval names, and the approval's expiry, signed with
HMAC-SHA256 under `ONCEFLOW_APPROVAL_LINK_SECRET` (no link can be made or used without it).
Opening it (GET) only shows the approval — mail scanners fetch links — and its form posts the
decision, which goes through the same guarded resume as any other (shared/steps/parks.py):
the first decision wins, so a link decides at most once and a second use answers "already
decided by X at T". Every use is audited (`approvals.link_decide`, no token). The signature
itself is shared/steps/link_signing.py's (the sweep's approval email makes links too); here, the
ops side: a 409 when links are not configured, and the check of an opened link.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Mapping
from datetime import UTC, datetime

from shared.core.db import Database
from shared.ops.errors import OpsError
from shared.ops.statements import AUDIT_INSERT
from shared.steps import link_signing as signing
from shared.steps.link_signing import (
    PATH_PREFIX,
    PUBLIC_URL_ENV,
    SECRET_ENV,
    Link,
    configured,
    public_url,
    signature,
)

__all__ = ["PATH_PREFIX", "PUBLIC_URL_ENV", "SECRET_ENV", "Link", "make_link", "public_url"]


def _require_secret() -> None:
    if not configured():
        raise OpsError(
            409,
            "links_not_configured",
            f"approval links need {SECRET_ENV} (at least 16 characters) on the ops and webhook"
            " functions",
        )


def make_link(approval_id: int, user: str, expires_at: datetime) -> Link:
    """A link (the signing is shared/steps/link_signing.py's); a 409 when links can't be made."""
    _require_secret()
    return signing.make_link(approval_id, user, expires_at)


def verified(parts: list[str], now: datetime | None = None) -> Link:
    """The link a `/ui/decide/<id>/<user>/<expires>/<signature>` path names, if its signature
    holds and it has not expired; a 403 or 410 otherwise."""
    if len(parts) != 4 or not parts[0].isdigit() or not parts[2].isdigit():
        raise OpsError(404, "not_found", "there is no such page")
    link = Link(int(parts[0]), parts[1], int(parts[2]))
    _require_secret()
    if not hmac.compare_digest(parts[3], signature(link)):
        raise OpsError(403, "bad_link", "this approval link is not valid")
    if (now or datetime.now(UTC)).timestamp() > link.expires:
        raise OpsError(410, "link_expired", "this approval link has expired")
    return link


def record_use(
    db: Database, link: Link, tenant_id: str | None, detail: Mapping[str, object]
) -> None:
    """The audit row of a link's use (there is no token to name: the link's user is)."""
    with db.transaction() as tx:
        tx.execute(
            AUDIT_INSERT,
            token_id=None,
            tenant_id=tenant_id,
            action="approvals.link_decide",
            target=str(link.approval_id),
            detail=json.dumps({"user": link.user, **detail}, default=str),
        )
