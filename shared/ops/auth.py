"""Who is calling: bearer tokens stored as SHA-256, scoped to one tenant or to admin.

A token is shown once, when it is minted, and only its hash is stored: a database dump does
not hand out access. Every read is scoped by `Principal.tenant_id` (None for admin), and an
id belonging to another tenant is answered exactly like an id that does not exist (404), so
ids don't leak across tenants. Every mutating call leaves an `ops_audit` row, refused ones
included, written in its own transaction so a rolled-back action is still on record.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from shared.core.db import Database, Tx
from shared.core.errors import OnceflowError
from shared.core.settings import settings
from shared.ops.statements import (
    AUDIT_INSERT,
    BOOTSTRAP_CLAIM,
    TOKEN_FIND,
    TOKEN_INSERT,
)

# The first admin token of a deployment, without a database session: the `ops` function
# accepts this secret (Secret Manager `onceflow-ops-bootstrap`) at POST /v1/bootstrap exactly
# once. See mint_bootstrap_token.
BOOTSTRAP_SECRET_ENV = "ONCEFLOW_OPS_BOOTSTRAP_SECRET"  # noqa: S105 - a variable's name
BOOTSTRAP_SECRET_MIN = 32

TOKEN_PREFIX = "ofo_"  # noqa: S105 - a prefix that makes leaked tokens greppable
# Anything longer is not a token we minted; refuse it before hashing attacker-sized input.
MAX_TOKEN_LENGTH = 200


@dataclass(frozen=True)
class Principal:
    token_id: str
    tenant_id: str | None  # None: admin, sees every tenant
    label: str
    # The tenant roles its holder has (approvals name a role that may decide them).
    roles: tuple[str, ...] = ()

    @property
    def is_admin(self) -> bool:
        return self.tenant_id is None


def hash_token(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8")).digest()


def mint_token(
    tx: Tx,
    *,
    tenant_id: str | None,
    label: str,
    roles: tuple[str, ...] = (),
    expires_at: datetime | None = None,
    created_by: str | None = None,
) -> tuple[str, str]:
    """A new token (shown once) and its id. tenant_id None mints an admin token. `label` is
    who holds it; `roles`, the tenant roles they have; after `expires_at` it is refused like a
    revoked one; `created_by`, the token that minted it."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token_id = tx.scalar(
        TOKEN_INSERT,
        token_sha256=hash_token(token),
        tenant_id=tenant_id,
        label=label,
        roles=list(roles),
        expires_at=expires_at,
        created_by=created_by,
    )
    return token, str(token_id)


def bootstrap_secret_matches(offered: str | None) -> bool:
    """Is `offered` the deployment's bootstrap secret (BOOTSTRAP_SECRET_ENV)? Without one set,
    or one shorter than BOOTSTRAP_SECRET_MIN, nothing matches. Compared in constant time."""
    expected = settings().ops_bootstrap_secret or ""
    if len(expected) < BOOTSTRAP_SECRET_MIN or not offered:
        return False
    return hmac.compare_digest(offered.encode("utf-8"), expected.encode("utf-8"))


def mint_bootstrap_token(db: Database, label: str) -> tuple[str, str] | None:
    """The deployment's first admin token, once ever: (token, id), or None when a bootstrap
    already happened (ops_bootstrap_claim says why exactly one caller wins)."""
    try:
        with db.transaction() as tx:
            token, token_id = mint_token(tx, tenant_id=None, label=label)
            if tx.one(BOOTSTRAP_CLAIM, token_id=token_id) is None:
                raise _AlreadyBootstrapped  # rolls the token just minted back
    except _AlreadyBootstrapped:
        return None
    return token, token_id


class _AlreadyBootstrapped(OnceflowError):
    """Raised inside the bootstrap transaction to roll it back."""


def bearer_from_header(value: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, or None."""
    if not value:
        return None
    scheme, _, token = value.partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or len(token) > MAX_TOKEN_LENGTH:
        return None
    return token


def authenticate(db: Database, token: str | None) -> Principal | None:
    """The principal a token stands for, or None (unknown, revoked or missing)."""
    if not token or len(token) > MAX_TOKEN_LENGTH:
        return None
    with db.transaction() as tx:
        row = tx.one(TOKEN_FIND, token_sha256=hash_token(token))
    if row is None:
        return None
    return Principal(
        token_id=str(row["id"]),
        tenant_id=row["tenant_id"],
        label=row["label"],
        roles=tuple(row["roles"] or ()),
    )


def record_audit(
    db: Database,
    principal: Principal | None,
    *,
    action: str,
    target: str | None,
    detail: Mapping[str, Any],
    tenant_id: str | None = None,
) -> None:
    """Who did what, when. Its own transaction: the action's rollback must not erase it.
    `principal` None: a call no ops token made (the bootstrap, which holds a secret instead)."""
    with db.transaction() as tx:
        tx.execute(
            AUDIT_INSERT,
            token_id=principal.token_id if principal else None,
            tenant_id=tenant_id
            if tenant_id is not None
            else (principal.tenant_id if principal else None),
            action=action,
            target=target,
            detail=json.dumps(dict(detail), default=str),
        )
