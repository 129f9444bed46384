"""A portal's shared rate budget (issue 29, item 5): the one place the vendor's rate-limit
headers narrow a connection's window.

After every call, a port whose provider declares `Crm.rate_budget` (shared/providers/
descriptor.py) hands what its vendor's headers said (`RateLimitState.remaining`,
`reset_seconds`, `daily_remaining`: each vendor folder's `read_rate_limit` parses them) to
`observe`, and a 429 to `shrink`; shared/port/observed.py queues both and the step's executor
writes them after its settle. The connection-limit gate's claim (`limit_queue_claim`,
shared/sql/limit_queue.sql) takes one call from the budget in the statement that claims a slot
in the connection's window (or takes the slot a grant counted), so every workflow and every
instance on the connection counts against the same Postgres row, and a step parks THROTTLED
with the reason instead of spending a request on a certain 429. The portal's budget is
shared by every app and token on it (another integration spends it too), which is why the
headers, not our own count, are the truth: our count only ever narrows it further until the
next answer.

- Short window: `remaining` until the window ends (`reset_seconds`); at 0 the gate parks.
- Daily budget: `daily_remaining` until the next whole UTC hour. Neither vendor says when its
  day ends in UTC (HubSpot: midnight in the account's time zone, docs/vendors/hubspot-2026.md
  §5; Pipedrive: midnight in a server time zone it does not name, docs/vendors/pipedrive.md
  §4), but a midnight in any whole-hour time zone is a whole UTC hour: parked until the next
  one, a step re-probes at most once an hour, and the answer's headers say again.
- A 429: nothing left until its Retry-After, and the connection's window halved (again for
  another 429) until `QUIET_WINDOWS` of its windows pass without one.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from shared.core import queries
from shared.core.db import Tx
from shared.port.interface import RateLimitState

SQL = queries.load("connection_budget")
OBSERVE = SQL["connection_budget_observe"]
SHRINK = SQL["connection_budget_shrink"]
NARROWED = SQL["connection_budget_narrowed"]

# How many of the connection's windows must pass without a 429 before a shrunk window is
# restored to the configured one.
QUIET_WINDOWS = 3


# An answer is written down only when the portal is getting low (the rest would cost every
# CRM step a write for nothing: an untouched row narrows nothing): at most a quarter of the
# short window left, or this few calls of the day.
LOW_WINDOW_FRACTION = 0.25
LOW_DAILY_CALLS = 1000


def worth_noting(state: RateLimitState) -> bool:
    if state.daily_remaining is not None and state.daily_remaining <= LOW_DAILY_CALLS:
        return True
    if state.remaining is None:
        return False
    return state.max is None or state.remaining <= state.max * LOW_WINDOW_FRACTION


def seconds_to_next_utc_hour(now: datetime | None = None) -> float:
    now = now or datetime.now(UTC)
    hour = now.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    return max((hour - now).total_seconds(), 1.0)


def observe(tx: Tx, connection_id: str, state: RateLimitState) -> None:
    if state.remaining is None and state.daily_remaining is None:
        return  # the answer carried no rate-limit headers
    reset = state.reset_seconds
    if reset is None and state.interval_ms:
        reset = state.interval_ms / 1000  # where in the window we are is unknown: a whole one
    tx.execute(
        OBSERVE,
        connection_id=connection_id,
        remaining=state.remaining if reset is not None else None,
        reset_seconds=reset or 0.0,
        daily_remaining=state.daily_remaining,
        daily_reset_seconds=seconds_to_next_utc_hour(),
    )


def shrink(tx: Tx, connection_id: str, retry_after: float) -> None:
    tx.execute(
        SHRINK,
        connection_id=connection_id,
        retry_after=max(retry_after, 0.0),
        quiet_windows=QUIET_WINDOWS,
    )


def reason(kind: str, until: datetime | None) -> str:
    at = until.isoformat() if until is not None else "?"
    if kind == "daily":
        return f"the portal's daily API budget is spent (0 left by its headers); next try {at}"
    if kind == "window":
        return f"the portal's rate window is spent (0 left by its headers) until {at}"
    return f"a 429 shrank the connection's window until {at} (restored after a quiet period)"


def narrowed_reason(row: Mapping[str, Any]) -> str:
    """Why a `connection_budget_narrowed` row narrows its connection now, for people."""
    return reason(str(row["kind"]), row["until"])
