"""What the sweep runs, in the shape every owner declares it: `Duty` and its runner.

The scheduled `sweep` (shared/sweep/loop.py) is only a loop over a catalog
(shared/sweep/catalog.py). What it does is declared where the rule lives — echo marker expiry
in shared/ingest/echo.py, throttle windows in shared/gates/throttle.py, the step repairs in
shared/steps/repairs.py, a trigger kind's ticks and polls in its module — and those owners
sit in every wing from accounts up, so the shape they declare in sits here on the ground
floor, below all of them:

- a `Duty` is periodic: claimed once per period across all sweep instances through its row in
  `sweep_duties` (`run_duty`), its JSON-able summary recorded there;
- a `Repair` runs on every pass of every invocation, a bounded batch answered from a small
  partial index; the number of rows it touched says whether its batch filled (a backlog: the
  loop goes again at once). Repairs count what they did into the `SweepReport`.

`SweepConfig` is what the sweep is configured with (one environment read per invocation),
handed to every repair and to each owner's `sweep_duties(config)`.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shared.core import queries
from shared.core.db import Database
from shared.core.logs import get_logger
from shared.core.settings import DEFAULTS, settings_from

Dispatch = Callable[[Sequence[str]], None]
log = get_logger(__name__)


@dataclass(frozen=True)
class SweepConfig:
    batch: int = DEFAULTS.sweep_batch
    # Pub/Sub delivers in milliseconds; two minutes without a claim means the message is lost
    # (or stuck in nack backoff, where a duplicate is harmless: the claim is conditional).
    redispatch_after_seconds: float = DEFAULTS.redispatch_after_seconds
    # A published trigger event without an admission decision this long after its publish is
    # published again; after this many re-publishes it is given up as undelivered. With the
    # defaults every published event is decided, or explained, within about
    # (redeliveries + 1) * after + the publisher's cadence ≈ 12 minutes.
    redeliver_events_after_seconds: float = DEFAULTS.redeliver_events_after_seconds
    max_event_redeliveries: int = DEFAULTS.max_event_redeliveries
    poll_seconds: float = DEFAULTS.sweep_poll_seconds
    # The per-attempt lease history of a finished run is kept this long (its run longer).
    lease_history_days: int = DEFAULTS.lease_history_days
    # Pre-admission drops (shared/ingest/drops.py) hold changed property values: kept this long.
    drop_retention_days: int = DEFAULTS.drop_retention_days
    # Retention (shared/sweep/retention.py): days kept after a run finished, an event was decided,
    # an inbox row was processed, a rehearsal finished; runs per deletion batch.
    run_retention_days: int = DEFAULTS.run_retention_days
    decision_retention_days: int = DEFAULTS.decision_retention_days
    inbox_retention_days: int = DEFAULTS.inbox_retention_days
    rehearsal_retention_days: int = DEFAULTS.rehearsal_retention_days
    retention_batch: int = DEFAULTS.retention_batch

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> SweepConfig:
        s = settings_from(env)
        return cls(
            batch=s.sweep_batch,
            redispatch_after_seconds=s.redispatch_after_seconds,
            redeliver_events_after_seconds=s.redeliver_events_after_seconds,
            max_event_redeliveries=s.max_event_redeliveries,
            poll_seconds=s.sweep_poll_seconds,
            lease_history_days=s.lease_history_days,
            drop_retention_days=s.drop_retention_days,
            run_retention_days=s.run_retention_days,
            decision_retention_days=s.decision_retention_days,
            inbox_retention_days=s.inbox_retention_days,
            rehearsal_retention_days=s.rehearsal_retention_days,
            retention_batch=s.retention_batch,
        )


@dataclass(frozen=True)
class Duty:
    """A periodic job of the sweep. `run` returns a JSON-able summary, recorded with it."""

    name: str
    every_seconds: float
    run: Callable[[Database], Any]


@dataclass
class SweepReport:
    passes: int = 0
    reclaimed: int = 0
    reclaimed_failed: int = 0
    # Expired leases of runs that had ended meanwhile (cancelled, or failed by another branch).
    reclaimed_skipped: int = 0
    woken: int = 0
    redispatched: int = 0
    publish_failures: int = 0
    events_requeued: int = 0
    events_undelivered: int = 0
    # Debounce bursts fired (shared/admission/debounce_fire.py).
    bursts_fired: int = 0
    # Runs started from a throttle's queue (shared/admission/run_throttle.py).
    runs_started_from_queue: int = 0
    # Steps granted a slot from a limit's line (shared/gates/limit_queue.py).
    limit_grants: int = 0
    duties: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "passes": self.passes,
            "reclaimed": self.reclaimed,
            "reclaimed_failed": self.reclaimed_failed,
            "reclaimed_skipped": self.reclaimed_skipped,
            "woken": self.woken,
            "redispatched": self.redispatched,
            "publish_failures": self.publish_failures,
            "events_requeued": self.events_requeued,
            "events_undelivered": self.events_undelivered,
            "bursts_fired": self.bursts_fired,
            "runs_started_from_queue": self.runs_started_from_queue,
            "limit_grants": self.limit_grants,
            "duties": self.duties,
        }


# A repair: one bounded batch on every pass; the number of rows touched (`>= config.batch`
# means a backlog). `dispatch` publishes step-ready for the step ids it made pending.
Repair = Callable[[Database, SweepConfig, Dispatch, SweepReport], int]


# A duty is due a little before its period has passed: the sweep ends when nothing is due, so
# a 60 s duty runs once per scheduler tick, and a tick that fires slightly under 60 s after the
# previous one (scheduler jitter, a slower first pass) must not skip it to the tick after.
# Concurrent sweeps still run it once: they race for the same row inside one tick.
SCHEDULE_JITTER_SECONDS = 5.0


def claim_period(every_seconds: float) -> float:
    """How long after its last run a periodic job may be claimed again: its period less the
    scheduler's jitter (sweep duties here, poll sources in shared/triggers/poll.py)."""
    return max(every_seconds - SCHEDULE_JITTER_SECONDS, 0.0)


@functools.cache
def _statements() -> tuple[queries.Query, queries.Query]:
    # Loaded on first use: every owner imports this module for `Duty`, and the functions that
    # never sweep (webhook, admission) should not read the sweep's SQL on a cold start.
    sql = queries.load("sweep")
    return sql["sweep_duty_claim"], sql["sweep_duty_record"]


def run_duty(db: Database, duty: Duty) -> Any:
    """Run `duty` if no invocation ran it within its period; its summary, or None if skipped."""
    claim, record = _statements()
    with db.transaction() as tx:
        owned = tx.one(
            claim,
            name=duty.name,
            every_seconds=claim_period(duty.every_seconds),
        )
    if owned is None:
        return None
    ok, result, error = True, None, None
    try:
        result = duty.run(db)
    except Exception as exc:  # one broken duty must not stop the sweep
        ok, error = False, f"{type(exc).__name__}: {exc}"
        log.exception("sweep duty %s failed", duty.name)
    with db.transaction() as tx:
        tx.execute(
            record,
            name=duty.name,
            ok=ok,
            result=json.dumps(result, default=str),
            error=error,
        )
    return result if ok else {"error": error}
