"""The circuit breaker per workflow: a failing workflow pauses itself and pages someone.

States (`workflow_breakers.state`), and who moves a row:

- `closed` — runs are admitted. Each run that ends `failed` adds one to
  `consecutive_failures` (the step executor, after the settle that failed the run; the sweep,
  after the reclaim that failed it `LEASE_EXPIRED` or `OUTCOME_UNKNOWN`, through
  `record_run_failed_by_id`); a run that succeeds resets it. At `after_failures` (the
  definition's `breaker`, default 10; 0 turns it off) the breaker **trips** to `open`.
- `open` — admission refuses the workflow's events with `workflow_paused` (recorded and
  explained like every refusal). Runs admitted before the trip go on. Only a person moves it
  out: `resume` (ops API `POST /v1/workflows/{id}/resume`) to `closed`, or to `half_open`.
- `half_open` — a few runs are admitted again on trial (`HALF_OPEN_PROBES`, claimed one per
  run by admission with a guarded UPDATE, `claim_trials`; the events after them are refused
  `workflow_paused` until a trial decides): the next run that succeeds closes the breaker, the
  next that fails trips it open again at once (a new half-open resume grants new trials).

A trip is one guarded UPDATE (`breaker_trip`) after the failure count in the same transaction,
so when many runs fail at once exactly one of them trips it: that one writes the audit row,
logs the `breaker_tripped` event (matched by the alert in infra/monitoring.tf) and, after the
commit, POSTs the optional `notify_url` through the SSRF guard (shared/core/netguard.py; a failed
notification is logged, never retried into the run's outcome). Rehearsal runs never count.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from shared.core import queries
from shared.core.db import Database, Tx
from shared.core.logs import LogEvent, get_logger, log_event
from shared.core.netguard import NetPolicy, guarded_client
from shared.workflows.definition import DEFAULT_BREAKER_AFTER_FAILURES, Breaker

SQL = queries.load("breaker")
ENSURE = SQL["breaker_ensure"]
COUNT_FAILURE = SQL["breaker_count_failure"]
TRIP = SQL["breaker_trip"]
RECORD_SUCCESS = SQL["breaker_record_success"]
RESUME = SQL["breaker_resume"]
GET = SQL["breaker_get"]
AUDIT = SQL["breaker_audit_insert"]
RUN_SETTINGS = SQL["breaker_run_settings"]
PROBE_CLAIM = SQL["breaker_probe_claim"]

BreakerState = Literal["closed", "open", "half_open"]
# How many trial runs a half-open breaker admits before one of them decides (issue 23 item 16:
# half-open used to admit every event, so a still-broken workflow failed at full rate again).
HALF_OPEN_PROBES = 3
NOTIFY_TIMEOUT_SECONDS = 5.0
log = get_logger(__name__)

# The destination policy for notify URLs; tests replace it (as shared/blocks/http.py's).
net_policy: Callable[[], NetPolicy] = NetPolicy.from_env


@dataclass(frozen=True)
class Trip:
    workflow_id: str
    consecutive_failures: int
    trips: int
    opened_at: datetime
    reason: str


def _threshold(settings: Breaker | None) -> int:
    return DEFAULT_BREAKER_AFTER_FAILURES if settings is None else settings.after_failures


def record_run_failed(
    tx: Tx, workflow_id: str, *, settings: Breaker | None, why: str
) -> Trip | None:
    """Count a failed run; the `Trip` when this failure opened the breaker (exactly one of any
    number of racing failures gets it), else None."""
    threshold = _threshold(settings)
    if threshold <= 0:
        return None
    tx.execute(ENSURE, workflow_id=workflow_id)
    counted = tx.one(COUNT_FAILURE, workflow_id=workflow_id)
    assert counted is not None
    reason = f"{counted['consecutive_failures']} consecutive failed runs; the last: {why}"[:1000]
    row = tx.one(TRIP, workflow_id=workflow_id, threshold=threshold, reason=reason)
    if row is None:
        return None
    trip = Trip(
        workflow_id,
        int(row["consecutive_failures"]),
        int(row["trips"]),
        row["opened_at"],
        reason,
    )
    tx.execute(
        AUDIT,
        workflow_id=workflow_id,
        action="breaker.tripped",
        detail=json.dumps({"reason": reason, "consecutive_failures": trip.consecutive_failures}),
    )
    return trip


@dataclass(frozen=True)
class TrialClaim:
    state: BreakerState
    admitted: int  # trials admitted before this claim
    granted: bool


def claim_trials(tx: Tx, workflow_ids: Sequence[str]) -> dict[str, TrialClaim]:
    """For admission: claim one trial run of each half-open workflow in `workflow_ids`, in
    the admission's transaction (its row locks are held until the decision commits). A
    workflow missing from the answer has no breaker row (closed)."""
    rows = tx.all(PROBE_CLAIM, workflow_ids=list(workflow_ids), probe_limit=HALF_OPEN_PROBES)
    return {
        r["workflow_id"]: TrialClaim(r["state"], int(r["probes_admitted"]), bool(r["granted"]))
        for r in rows
    }


def record_run_succeeded(tx: Tx, workflow_id: str) -> None:
    tx.execute(RECORD_SUCCESS, workflow_id=workflow_id)


def announce_trip(trip: Trip, settings: Breaker | None) -> None:
    """After the trip committed: the alert's log line, then the optional notification."""
    log_event(
        log,
        LogEvent.BREAKER_TRIPPED,
        f"workflow {trip.workflow_id} paused by its circuit breaker: {trip.reason}",
        level=logging.ERROR,
        workflow_id=trip.workflow_id,
        reason=trip.reason,
    )
    if settings is not None and settings.notify_url:
        notify(settings.notify_url, trip)


def notify(url: str, trip: Trip) -> bool:
    """POST the trip to `url` through the SSRF guard. Best effort: False (and a warning) on
    any failure, a forbidden address included."""
    body = {
        "event": str(LogEvent.BREAKER_TRIPPED),
        "workflow_id": trip.workflow_id,
        "reason": trip.reason,
        "consecutive_failures": trip.consecutive_failures,
        "opened_at": trip.opened_at.isoformat(),
    }
    try:
        with guarded_client(net_policy(), timeout=NOTIFY_TIMEOUT_SECONDS) as client:
            response = client.post(url, json=body)
        if response.status_code >= 300:
            log.warning("breaker notify %s answered %s", url, response.status_code)
            return False
        return True
    except Exception as exc:
        log.warning("breaker notify %s failed: %s", url, exc)
        return False


def record_run_outcome(
    db: Database, workflow_id: str, *, failed: bool, settings: Breaker | None, why: str = ""
) -> Trip | None:
    """What the step executor calls once a live run ended (its own transaction)."""
    if failed:
        trip = db.run(lambda tx: record_run_failed(tx, workflow_id, settings=settings, why=why))
        if trip is not None:
            announce_trip(trip, settings)
        return trip
    db.run(lambda tx: record_run_succeeded(tx, workflow_id))
    return None


def record_run_failed_by_id(db: Database, run_id: str, *, why: str) -> Trip | None:
    """`record_run_outcome` for a run that its step executor did not end (the sweep failed
    it): the workflow and its pinned version's settings are read from the run. Call once, after
    the statement that failed the run committed (only that statement reports the run failed, so
    the run is counted once). A rehearsal never counts."""
    row = db.run(lambda tx: tx.one(RUN_SETTINGS, run_id=run_id))
    if row is None or row["namespace"] != "live":
        return None
    settings = None if row["breaker"] is None else Breaker.model_validate(row["breaker"])
    return record_run_outcome(db, row["workflow_id"], failed=True, settings=settings, why=why)


def resume(tx: Tx, workflow_id: str, *, half_open: bool = False) -> BreakerState | None:
    """Move an open breaker to closed (or half_open); None when it was not open."""
    row = tx.one(RESUME, workflow_id=workflow_id, to_state="half_open" if half_open else "closed")
    return None if row is None else row["state"]


def status(tx: Tx, workflow_id: str) -> dict[str, Any]:
    """The breaker row, or a closed breaker that never counted anything."""
    row = tx.one(GET, workflow_id=workflow_id)
    if row is None:
        return {
            "workflow_id": workflow_id,
            "state": "closed",
            "consecutive_failures": 0,
            "trips": 0,
            "opened_at": None,
            "reason": None,
            "updated_at": None,
        }
    return dict(row)
