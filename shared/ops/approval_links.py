"""Signed links that let a named approver decide an approval without an ops token.

A link names one approval, one user the approval names, and the approval's expiry, signed with
HMAC-SHA256 under `ONCEFLOW_APPROVAL_LINK_SECRET` (no link can be made or used without it).
Opening it (GET) only shows the approval — mail scanners fetch links — and its form posts the
decision, which goes through the same guarded resume as any other (shared/steps/parks.py):
the first decision wins, so a link decides at most once and a second use answers "already
decided by X at T". Every use is audited (`approvals.link_decide`, no token).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

from shared.core.db import Database
from shared.core.settings import settings
from shared.ops.errors import OpsError
from shared.ops.statements import AUDIT_INSERT

SECRET_ENV = "ONCEFLOW_APPROVAL_LINK_SECRET"  # noqa: S105 - a variable name
PATH_PREFIX = "/ui/decide"
# Where an approver's browser opens a link: the public `webhook` function's URL (it serves
# PATH_PREFIX/... and nothing else of the page; functions/webhook.py). Unset (the local stack
# without it, tests): the API answers the path only, to append to the ops URL.
PUBLIC_URL_ENV = "ONCEFLOW_PUBLIC_URL"


@dataclass(frozen=True)
class Link:
    approval_id: int
    user: str
    expires: int  # unix seconds: the approval's expiry

    @property
    def path(self) -> str:
        return f"{PATH_PREFIX}/{self.approval_id}/{self.user}/{self.expires}/{_sign(self)}"


def _secret() -> bytes:
    value = settings().approval_link_secret or ""
    if len(value) < 16:
        raise OpsError(
            409,
            "links_not_configured",
            f"approval links need {SECRET_ENV} (at least 16 characters) on the ops and webhook"
            " functions",
        )
    return value.encode("utf-8")


def _sign(link: Link) -> str:
    message = f"{link.approval_id}:{link.user}:{link.expires}".encode()
    return hmac.new(_secret(), message, hashlib.sha256).hexdigest()


def make_link(approval_id: int, user: str, expires_at: datetime) -> Link:
    return Link(approval_id, user, int(expires_at.timestamp()))


def public_url(link: Link) -> str | None:
    """The link as an approver opens it, on the public function; None when not configured."""
    base = (settings().public_url or "").rstrip("/")
    return f"{base}{link.path}" if base else None


def verified(parts: list[str], now: datetime | None = None) -> Link:
    """The link a `/ui/decide/<id>/<user>/<expires>/<signature>` path names, if its signature
    holds and it has not expired; a 403 or 410 otherwise."""
    if len(parts) != 4 or not parts[0].isdigit() or not parts[2].isdigit():
        raise OpsError(404, "not_found", "there is no such page")
    link = Link(int(parts[0]), parts[1], int(parts[2]))
    if not hmac.compare_digest(parts[3], _sign(link)):
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
