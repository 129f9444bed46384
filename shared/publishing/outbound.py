"""Sending outbound events (shared/ingest/outbound.py writes them): the sweep's repair.

Per pass (`deliver_due`):
1. claim: one short statement leases up to a batch of due `pending` deliveries and counts the
   attempt (`outbound_claim`, FOR UPDATE SKIP LOCKED + a lease: two sweeps never send one
   attempt at once);
2. POST each, outside any transaction, through the SSRF guard the `http.request` block and the
   breaker's notify use (shared/core/netguard.py: resolved once, every address checked, the
   checked one connected to, no redirects, no proxies), signed with Standard Webhooks;
3. record the answer fenced on the lease: 2xx delivered; anything else back to pending after
   an exponential backoff (`backoff_seconds`), or given up after `MAX_ATTEMPTS` (recorded with
   the last status and error, visible and re-sendable in ops).
A sender that dies between 2 and 3 leaves its lease to expire and the next claim sends again:
at least once, the receiver dedupes on `webhook-id`, which is the delivery's id on every
attempt.

Standard Webhooks (https://www.standardwebhooks.com/, spec "Signature scheme"): headers
`webhook-id`, `webhook-timestamp` (unix seconds) and `webhook-signature` = 'v1,' +
base64(HMAC-SHA256(key, f"{id}.{timestamp}.{body}")), the key being the base64 after 'whsec_'
in the secret.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from shared.core import queries
from shared.core.db import Database
from shared.core.duty import Dispatch, Duty, SweepConfig, SweepReport
from shared.core.logs import get_logger
from shared.core.netguard import (
    AddressRefused,
    InvalidDestination,
    NetPolicy,
    guarded_client,
    parse_destination,
)
from shared.core.settings import named_secret

SQL = queries.load("outbound")
CLAIM = SQL["outbound_claim"]
MARK_DELIVERED = SQL["outbound_mark_delivered"]
MARK_FAILED = SQL["outbound_mark_failed"]
RESEND = SQL["outbound_resend"]
DELIVERIES_LIST = SQL["outbound_deliveries_list"]
EXPIRE = SQL["outbound_deliveries_expire"]

MAX_ATTEMPTS = 8
BACKOFF_BASE_SECONDS = 30.0
BACKOFF_CAP_SECONDS = 6 * 3600.0
SEND_TIMEOUT_SECONDS = 5.0
# Longer than a send can take (connect + read timeouts), so a live sender keeps its lease.
LEASE_SECONDS = 60.0
BATCH = 20
SECRET_PREFIX = "whsec_"  # noqa: S105 - the format's prefix, not a secret
log = get_logger(__name__)

# The destination policy; tests replace it as they replace shared/blocks/http.py's.
net_policy: Callable[[], NetPolicy] = NetPolicy.from_env


def sign(secrets: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """The `webhook-signature` header value for one attempt. `secrets` may hold several
    space-separated 'whsec_' secrets (a rotation: the new one added, the old one removed once
    the receiver moved): one signature each, space-separated, as the spec lists them."""
    signed = msg_id.encode() + b"." + str(timestamp).encode() + b"." + body
    signatures = []
    for secret in secrets.split():
        key = base64.b64decode(secret.removeprefix(SECRET_PREFIX))
        digest = hmac.new(key, signed, hashlib.sha256).digest()
        signatures.append("v1," + base64.b64encode(digest).decode())
    return " ".join(signatures)


def backoff_seconds(attempt: int, base: float = BACKOFF_BASE_SECONDS) -> float:
    """Delay after failed attempt number `attempt` (1-based): base, 2·base, 4·base, … capped."""
    return float(min(base * 2 ** max(attempt - 1, 0), BACKOFF_CAP_SECONDS))


def destination_refusal(url: str) -> str | None:
    """Why a subscription to `url` is refused now (invalid, or an address the guard refuses),
    or None. The sender checks again at every attempt (DNS may change)."""
    try:
        destination = parse_destination(url)
        net_policy().checked_addresses(destination.host, destination.port)
    except (InvalidDestination, AddressRefused) as exc:
        return str(exc)
    except Exception as exc:  # a name that doesn't resolve now
        return f"cannot resolve the URL's host: {exc}"
    return None


def body_of(event_type: str, created_at: datetime, data: Mapping[str, Any]) -> bytes:
    """The payload, Standard Webhooks' shape: type, timestamp, data. The same bytes on every
    attempt (built from the stored row)."""
    payload = {"type": event_type, "timestamp": created_at.isoformat(), "data": data}
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str).encode()


@dataclass
class DeliveryPass:
    delivered: list[str] = field(default_factory=list)
    retrying: list[str] = field(default_factory=list)
    given_up: list[str] = field(default_factory=list)
    # Deliveries whose lease was taken over before the answer was recorded.
    fenced_out: list[str] = field(default_factory=list)

    @property
    def touched(self) -> int:
        return len(self.delivered) + len(self.retrying) + len(self.given_up) + len(self.fenced_out)


def _send(row: Mapping[str, Any]) -> tuple[int | None, str | None]:
    """POST one attempt: (status, error) — error None only for a 2xx."""
    secret = named_secret(str(row["secret_env"]))
    if not secret:
        return None, f"the subscription's secret variable {row['secret_env']} is not set"
    body = body_of(str(row["event_type"]), row["created_at"], row["data"])
    timestamp = int(time.time())
    headers = {
        "content-type": "application/json",
        "webhook-id": str(row["id"]),
        "webhook-timestamp": str(timestamp),
        "webhook-signature": sign(secret, str(row["id"]), timestamp, body),
    }
    try:
        with guarded_client(net_policy(), timeout=SEND_TIMEOUT_SECONDS) as client:
            response = client.post(str(row["url"]), content=body, headers=headers)
    except Exception as exc:  # refused address, connect error, timeout: all an attempt's error
        return None, f"{type(exc).__name__}: {exc}"[:1000]
    if 200 <= response.status_code < 300:
        return response.status_code, None
    return response.status_code, f"HTTP {response.status_code}: {response.text[:500]}"


def deliver_due(
    db: Database,
    *,
    batch: int = BATCH,
    max_attempts: int = MAX_ATTEMPTS,
    backoff_base: float = BACKOFF_BASE_SECONDS,
    lease_seconds: float = LEASE_SECONDS,
) -> DeliveryPass:
    """One pass: claim, send, record (module docstring)."""
    lease_id = str(uuid.uuid4())
    with db.transaction() as tx:
        rows = tx.all(CLAIM, lease_id=lease_id, lease_seconds=lease_seconds, limit=batch)
    done = DeliveryPass()
    for row in rows:
        status, error = _send(row)
        with db.transaction() as tx:
            if error is None:
                marked = tx.one(MARK_DELIVERED, id=row["id"], lease_id=lease_id, last_status=status)
                state = None if marked is None else "delivered"
            else:
                attempt = int(row["attempts"]) - int(row["retry_from"])
                marked = tx.one(
                    MARK_FAILED,
                    id=row["id"],
                    lease_id=lease_id,
                    last_status=status,
                    last_error=error,
                    max_attempts=max_attempts,
                    delay_seconds=backoff_seconds(attempt, backoff_base),
                )
                state = None if marked is None else str(marked["status"])
        if state is None:
            done.fenced_out.append(row["id"])
        elif state == "delivered":
            done.delivered.append(row["id"])
        elif state == "given_up":
            log.warning("outbound delivery %s given up: %s", row["id"], error)
            done.given_up.append(row["id"])
        else:
            done.retrying.append(row["id"])
    return done


def deliver_outbound_events(
    db: Database, config: SweepConfig, dispatch: Dispatch, report: SweepReport
) -> int:
    """The sweep's repair (every pass): the rows touched. `dispatch` is for steps, unused."""
    return deliver_due(db, batch=min(config.batch, BATCH)).touched


def expire_finished(db: Database, *, days: int, batch: int) -> int:
    """Delete delivered and given-up deliveries finished more than `days` ago, batch by batch
    (each its own transaction); how many. Pending ones are never deleted."""
    deleted = 0
    while True:
        with db.transaction() as tx:
            n = tx.execute(EXPIRE, days=days, batch=batch)
        deleted += n
        if n < batch:
            return deleted


def sweep_duties(config: SweepConfig) -> tuple[Duty, ...]:
    """Finished deliveries are kept as long as decisions are (`decision_retention_days`)."""

    def expire(db: Database) -> dict[str, int]:
        days, batch = config.decision_retention_days, config.retention_batch
        return {"deleted": expire_finished(db, days=days, batch=batch)}

    return (Duty("expire_outbound_deliveries", 3600.0, expire),)


def resend(db: Database, delivery_id: str, *, tenant_id: str | None) -> bool:
    """Ops: a new round of attempts now, same id. False: no such delivery (for the tenant), or
    an attempt is under way."""
    with db.transaction() as tx:
        return tx.one(RESEND, id=delivery_id, tenant_id=tenant_id) is not None


def deliveries(
    db: Database, *, tenant_id: str | None, status: str | None = None, limit: int = 100
) -> list[dict[str, Any]]:
    with db.transaction() as tx:
        rows = tx.all(DELIVERIES_LIST, tenant_id=tenant_id, status=status, limit=limit)
    return [dict(r) for r in rows]
