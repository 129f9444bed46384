"""OAuth tokens of a connection: sealed at rest, refreshed before they expire, one refresh in
flight per connection across instances.

A HubSpot public app acts on a portal with an OAuth access token that lives 30 minutes
(`expires_in` 1800) and is renewed with a refresh token
(https://developers.hubspot.com/docs/api-reference/legacy/authentication/oauth-tokens/v1/guide).

- Sealed: envelope encryption with AES-256-GCM. Each stored grant gets a fresh random data key;
  the tokens are sealed with it (the connection id as associated data, so a sealed token
  copied to another row does not open), and the data key is sealed with the key-encryption key
  (KEK) read from the environment variable the row names (filled from Secret Manager). The
  database never holds a usable token or key; the logs never see either.
- Refreshed before expiry (`REFRESH_MARGIN_SECONDS`): a caller that finds the token stale
  locks the row (`FOR UPDATE`) and refreshes while holding it; a concurrent caller, on this
  instance or another, waits on the lock and then finds the fresh token — one refresh.
- A revoked refresh token (`RefreshRevoked`: the portal uninstalled the app) moves the
  connection to `needs_reauthorization` (admission then refuses its events as
  `provider_suppressed`) and raises `ReauthorizationNeeded`.

The first grant comes from the install flow (shared/providers/install.py); CRM ports of OAuth
connections read their token here (shared/providers/connect.py).
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from shared.core import queries
from shared.core.db import Database, Tx
from shared.core.settings import named_secret

SQL = queries.load("oauth_tokens")
GET = SQL["oauth_tokens_get"]
LOCK = SQL["oauth_tokens_lock"]
PUT = SQL["oauth_tokens_put"]
NEEDS_REAUTHORIZATION = SQL["oauth_tokens_needs_reauthorization"]

# The key-encryption key's variable in a deployment (infra/ fills it from Secret Manager for
# deployables.OAUTH_CLIENT_USERS only: webhook seals grants at an install's callback, the CRM
# token users refresh them); a stored grant keeps the name it was sealed under.
TOKEN_KEK_ENV = "ONCEFLOW_TOKEN_KEK"  # noqa: S105 - a variable name
REFRESH_MARGIN_SECONDS = 300  # refresh when less than this is left (calls take time too)
_NONCE_BYTES = 12


class TokenKeyUnavailable(RuntimeError):
    """The key-encryption key's environment variable is unset or not 32 base64 bytes."""


class RefreshRevoked(Exception):
    """The provider says the refresh token is no longer valid (raised by a Refresher)."""


class ReauthorizationNeeded(Exception):
    """The connection's grant was revoked: someone must install the app on the portal again."""


class NoGrant(LookupError):
    """The connection has no stored OAuth grant."""


@dataclass(frozen=True)
class Grant:
    access_token: str
    refresh_token: str
    expires_in: int  # seconds


Refresher = Callable[[str], Grant]  # refresh token in, new grant out; raises RefreshRevoked


def key_from_env(kek_env: str) -> bytes:
    value = named_secret(kek_env)
    if not value:
        raise TokenKeyUnavailable(f"environment variable {kek_env} is not set")
    try:
        key = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise TokenKeyUnavailable(f"{kek_env} is not base64") from None
    if len(key) != 32:
        raise TokenKeyUnavailable(f"{kek_env} must hold 32 bytes (AES-256)")
    return key


def seal(key: bytes, plaintext: bytes, aad: bytes) -> bytes:
    nonce = os.urandom(_NONCE_BYTES)
    return nonce + AESGCM(key).encrypt(nonce, plaintext, aad)


def unseal(key: bytes, sealed: bytes, aad: bytes) -> bytes:
    try:
        return AESGCM(key).decrypt(sealed[:_NONCE_BYTES], sealed[_NONCE_BYTES:], aad)
    except InvalidTag:
        raise TokenKeyUnavailable("a sealed token did not open (wrong key or row)") from None


def store_grant(tx: Tx, connection_id: str, grant: Grant, kek_env: str = TOKEN_KEK_ENV) -> None:
    """Seal and keep `grant` (a fresh data key per grant), in the caller's transaction."""
    kek = key_from_env(kek_env)
    aad = connection_id.encode()
    data_key = AESGCM.generate_key(bit_length=256)
    tx.execute(
        PUT,
        connection_id=connection_id,
        kek_env=kek_env,
        data_key_sealed=seal(kek, data_key, aad),
        refresh_token_sealed=seal(data_key, grant.refresh_token.encode(), aad),
        access_token_sealed=seal(data_key, grant.access_token.encode(), aad),
        expires_in=grant.expires_in,
    )


def seal_grant_for_later(grant: Grant, aad: bytes, kek_env: str = TOKEN_KEK_ENV) -> bytes:
    """`grant` sealed with the key in `kek_env`, bound to `aad`, for a grant that has no
    connection yet (an install waiting for its confirmation, shared/providers/install.py)."""
    plain = json.dumps(
        {
            "access_token": grant.access_token,
            "refresh_token": grant.refresh_token,
            "expires_in": grant.expires_in,
        }
    ).encode()
    return seal(key_from_env(kek_env), plain, aad)


def open_grant_kept_for_later(sealed: bytes, aad: bytes, kek_env: str) -> Grant:
    """The grant `seal_grant_for_later` sealed (TokenKeyUnavailable: wrong key or row)."""
    fields = json.loads(unseal(key_from_env(kek_env), sealed, aad))
    return Grant(
        access_token=str(fields["access_token"]),
        refresh_token=str(fields["refresh_token"]),
        expires_in=int(fields["expires_in"]),
    )


def _open(connection_id: str, row: Mapping[str, Any], column: str) -> str:
    aad = connection_id.encode()
    data_key = unseal(key_from_env(str(row["kek_env"])), bytes(row["data_key_sealed"]), aad)
    return unseal(data_key, bytes(row[column]), aad).decode()


def access_token(
    db: Database, connection_id: str, refresh: Refresher, *, rejected: str | None = None
) -> str:
    """A live access token for the connection, refreshing it first when it is stale, or when
    it is `rejected` (the provider just answered 401 to that token; a token someone else has
    already replaced is not refreshed again). Raises NoGrant, ReauthorizationNeeded."""
    margin = REFRESH_MARGIN_SECONDS
    if rejected is None:
        with db.transaction() as tx:  # one statement, committed with it: one round trip
            rows = tx.commit_with(GET, connection_id=connection_id, margin_seconds=margin)
        row = rows[0] if rows else None
        if row is None:
            raise NoGrant(connection_id)
        if row["fresh"]:
            return _open(connection_id, row, "access_token_sealed")
    revoked = False
    with db.transaction() as tx:
        row = tx.one(LOCK, connection_id=connection_id, margin_seconds=margin)
        if row is None:
            raise NoGrant(connection_id)
        current = _open(connection_id, row, "access_token_sealed")
        if row["fresh"] and current != rejected:
            return current  # refreshed meanwhile, by whoever held the lock before us
        try:
            grant = refresh(_open(connection_id, row, "refresh_token_sealed"))
        except RefreshRevoked:
            tx.execute(NEEDS_REAUTHORIZATION, connection_id=connection_id)
            revoked = True
        else:
            store_grant(tx, connection_id, grant, str(row["kek_env"]))
    if revoked:  # raised after the commit, so the state change stays
        raise ReauthorizationNeeded(
            f"connection {connection_id}: the refresh token was revoked; install the app again"
        )
    return grant.access_token
