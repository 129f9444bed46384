"""The signature of an approval link: one approval, one user it names, its expiry, signed with
HMAC-SHA256 under `ONCEFLOW_APPROVAL_LINK_SECRET`. Here, below the ops wing, because two
wings make links: the ops API (a link asked for, shared/ops/approval_links.py, which also
checks them when opened) and the sweep's approval email (shared/steps/approval_messages.py).
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from datetime import datetime

from shared.core.errors import OnceflowError
from shared.core.settings import settings

SECRET_ENV = "ONCEFLOW_APPROVAL_LINK_SECRET"  # noqa: S105 - a variable name
SECRET_MIN = 16
PATH_PREFIX = "/ui/decide"
# Where an approver's browser opens a link: the public `webhook` function's URL (it serves
# PATH_PREFIX/... and nothing else of the page; functions/webhook.py). Unset (the local stack
# without it, tests): the API answers the path only, to append to the ops URL.
PUBLIC_URL_ENV = "ONCEFLOW_PUBLIC_URL"


class LinksNotConfigured(OnceflowError):
    """No link can be made or checked: the secret is unset or too short."""


@dataclass(frozen=True)
class Link:
    approval_id: int
    user: str
    expires: int  # unix seconds: the approval's expiry

    @property
    def path(self) -> str:
        return f"{PATH_PREFIX}/{self.approval_id}/{self.user}/{self.expires}/{signature(self)}"


def configured() -> bool:
    return len(settings().approval_link_secret or "") >= SECRET_MIN


def signature(link: Link) -> str:
    if not configured():
        raise LinksNotConfigured(
            f"approval links need {SECRET_ENV} (at least {SECRET_MIN} characters)"
        )
    secret = (settings().approval_link_secret or "").encode("utf-8")
    message = f"{link.approval_id}:{link.user}:{link.expires}".encode()
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def make_link(approval_id: int, user: str, expires_at: datetime) -> Link:
    return Link(approval_id, user, int(expires_at.timestamp()))


def public_url(link: Link) -> str | None:
    """The link as an approver opens it, on the public function; None when not configured."""
    base = (settings().public_url or "").rstrip("/")
    return f"{base}{link.path}" if base else None
