"""Who is calling: bearer tokens stored as SHA-256, scoped to one tenant or to admin.

A token is shown once, when it is minted, and only its hash is stored: a database dump does
not hand out access. Every read is scoped by `Principal.tenant_id` (None for admin), and an
id belonging to another tenant is answered exactly like an id that does not exist (404), so
ids don't leak across tenants. Every mutating call leaves an `ops_audit` row, refused ones
included, written in its own transaction so a rolled-back action is still on record.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shared import queries
from shared.db import Database, Tx

SQL = queries.load("ops")
TOKEN_INSERT = SQL["ops_token_insert"]
TOKEN_FIND = SQL["ops_token_find"]
AUDIT_INSERT = SQL["ops_audit_insert"]
TENANT_EXISTS = SQL["ops_tenant_exists"]

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
    tx: Tx, *, tenant_id: str | None, label: str, roles: tuple[str, ...] = ()
) -> tuple[str, str]:
    """A new token (shown once) and its id. tenant_id None mints an admin token. `label` is
    who holds it; `roles`, the tenant roles they have."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    token_id = tx.scalar(
        TOKEN_INSERT,
        token_sha256=hash_token(token),
        tenant_id=tenant_id,
        label=label,
        roles=list(roles),
    )
    return token, str(token_id)


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
    principal: Principal,
    *,
    action: str,
    target: str | None,
    detail: Mapping[str, Any],
    tenant_id: str | None = None,
) -> None:
    """Who did what, when. Its own transaction: the action's rollback must not erase it."""
    with db.transaction() as tx:
        tx.execute(
            AUDIT_INSERT,
            token_id=principal.token_id,
            tenant_id=tenant_id if tenant_id is not None else principal.tenant_id,
            action=action,
            target=target,
            detail=json.dumps(dict(detail), default=str),
        )
