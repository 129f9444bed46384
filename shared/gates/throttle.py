"""Rate limits that hold across instances: fixed windows in Postgres.

Three scopes, each a window per subject: `connection` (the connection row's
`rate_limit_per_window` per `rate_limit_window_seconds`), `workflow` (the definition's
`rate_limit: {max, per}`) and `host` (the definition's `host_rate_limit`, per tenant and
destination host, for blocks that declare the host gate). Every claim is one
`INSERT … ON CONFLICT … DO UPDATE … RETURNING used` on `throttle_windows`, so racing instances
never admit more than `max` in a window, and a restart keeps the window it found.

Over a limit, a claim is refused (`claim_or_refusal`) with a transient `THROTTLED` failure,
`retry_after` = the end of the window and `consumes_attempt=False`: the engine parks the step in
`waiting_for_retry` until then without using up one of its attempts, and the step's error says
which limit and until when ("throttled until T by workflow limit …"). Claims over the limit
still count (the window ends anyway), which keeps the claim one statement with no
read-then-write race. Who claims: the catalog's limit gates (shared/gates/connection_limit.py,
workflow_limit.py, host_limit.py) run by the step executor, never a block.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from shared.blocks.base import BlockFailure
from shared.core import queries
from shared.core.db import Database, Tx
from shared.core.duty import Duty, SweepConfig

SQL = queries.load("throttle")
CLAIM = SQL["throttle_claim"]
CONNECTION_LIMIT = SQL["throttle_connection_limit"]
DELETE_EXPIRED = SQL["throttle_windows_delete_expired"]

OUTCOME_THROTTLED = "THROTTLED"
# `run_start`: a trigger's throttle on starting runs (shared/admission/run_throttle.py).
Scope = Literal["connection", "workflow", "host", "run_start"]


@dataclass(frozen=True)
class Limit:
    scope: Scope
    subject: str
    max: int
    window_seconds: int


@dataclass(frozen=True)
class ThrottleClaim:
    allowed: bool
    used: int
    limit: int
    seconds_left: float
    window_end: datetime | None = None


def claim(tx: Tx, limit: Limit) -> ThrottleClaim:
    row = tx.one(
        CLAIM,
        scope=limit.scope,
        subject=limit.subject,
        window_seconds=limit.window_seconds,
        limit_max=limit.max,
    )
    assert row is not None  # an upsert always returns its row
    return _claimed(limit, row)


def _claimed(limit: Limit, row: Mapping[str, Any]) -> ThrottleClaim:
    used = int(row["used"])
    return ThrottleClaim(
        used <= limit.max,
        used,
        limit.max,
        max(float(row["seconds_left"]), 0.0),
        row["window_end"],
    )


def connection_limit(tx: Tx, connection_id: str) -> Limit | None:
    """The connection's window, or None for a connection that doesn't exist (nothing to count
    against; the port refuses it clearly)."""
    row = tx.one(CONNECTION_LIMIT, connection_id=connection_id)
    if row is None:
        return None
    return Limit("connection", connection_id, int(row["max"]), int(row["window_seconds"]))


def claim_slot(tx: Tx, connection_id: str) -> ThrottleClaim:
    """A slot in the connection's window."""
    limit = connection_limit(tx, connection_id)
    if limit is None:
        return ThrottleClaim(True, 0, 0, 0.0)
    return claim(tx, limit)


def throttled(limit: Limit, outcome: ThrottleClaim, reason: str | None = None) -> BlockFailure:
    """The parking failure. Its message is also how ops counts the steps parked behind each
    limit (shared/sql/ops.sql `ops_limits_parked_steps` reads scope, subject, max and window
    back out of the step's error): change the wording there too. `reason`: why, after the
    part ops reads (a portal's spent budget, shared/port/budget.py)."""
    until = outcome.window_end.isoformat() if outcome.window_end is not None else "?"
    return BlockFailure(
        f"throttled until {until} by {limit.scope} limit ({limit.subject}: "
        f"{limit.max} per {limit.window_seconds}s)" + (f": {reason}" if reason else ""),
        error_class="transient",
        outcome_code=OUTCOME_THROTTLED,
        retry_after=max(outcome.seconds_left, 0.05),
        consumes_attempt=False,
        not_applied=True,
    )


def claim_or_refusal(tx: Tx, limit: Limit) -> BlockFailure | None:
    """Claim a slot; None when it fits, else the failure that parks the step (the claim
    counts either way, so it commits with `tx` whatever the answer)."""
    outcome = claim(tx, limit)
    return None if outcome.allowed else throttled(limit, outcome)


def claim_or_park(db: Database, limit: Limit) -> None:
    """`claim_or_refusal` in its own committed transaction, raising the refusal."""
    refusal = db.run(lambda tx: claim_or_refusal(tx, limit))
    if refusal is not None:
        raise refusal


def delete_expired_windows(tx: Tx) -> int:
    return tx.execute(DELETE_EXPIRED)


def delete_expired_throttle_windows(db: Database) -> dict[str, int]:
    """Throttle windows are one row per connection per window; ended ones only take space."""
    with db.transaction() as tx:
        return {"deleted": delete_expired_windows(tx)}


def sweep_duties(config: SweepConfig) -> tuple[Duty, ...]:
    return (Duty("delete_expired_throttle_windows", 900.0, delete_expired_throttle_windows),)
