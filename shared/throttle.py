"""Per-connection throttling that holds across instances: a fixed window in Postgres.

Every outbound provider call claims a slot with one `INSERT … ON CONFLICT … DO UPDATE …
RETURNING used` on `throttle_windows` (connection, window start). Over the connection's limit,
the block raises a transient `THROTTLED` failure with `retry_after` = the end of the window and
`consumes_attempt=False`: the engine parks the step in `waiting_for_retry` until then without
using up one of its attempts. Claims over the limit still count (the window ends anyway), which
keeps the claim to one statement with no read-then-write race.
"""

from __future__ import annotations

from dataclasses import dataclass

from shared import queries
from shared.blocks.base import BlockFailure
from shared.db import Tx, get_database

SQL = queries.load("throttle")
CLAIM = SQL["throttle_claim"]
DELETE_EXPIRED = SQL["throttle_windows_delete_expired"]

OUTCOME_THROTTLED = "THROTTLED"


@dataclass(frozen=True)
class ThrottleClaim:
    allowed: bool
    used: int
    limit: int
    seconds_left: float


def claim_slot(tx: Tx, connection_id: str) -> ThrottleClaim:
    row = tx.one(CLAIM, connection_id=connection_id)
    if row is None:
        # No such connection: nothing to throttle against; the port will refuse it clearly.
        return ThrottleClaim(True, 0, 0, 0.0)
    used, limit = int(row["used"]), int(row["limit_per_window"])
    return ThrottleClaim(used <= limit, used, limit, max(float(row["seconds_left"]), 0.0))


def claim_or_park(connection_id: str) -> ThrottleClaim:
    """Claim a slot in its own transaction, or raise the failure that parks the step."""
    claim = get_database().run(lambda tx: claim_slot(tx, connection_id))
    if not claim.allowed:
        raise BlockFailure(
            f"connection {connection_id} used {claim.limit} calls in this window; "
            f"waiting {claim.seconds_left:.1f}s for the next one",
            error_class="transient",
            outcome_code=OUTCOME_THROTTLED,
            retry_after=max(claim.seconds_left, 0.05),
            consumes_attempt=False,
        )
    return claim


def delete_expired_windows(tx: Tx) -> int:
    return tx.execute(DELETE_EXPIRED)
