"""The sweep: the scheduled repair loop that makes steps survive crashes and lost messages.

Cloud Scheduler fires `sweep` at most once a minute, so one invocation loops for its budget
(default 50 s, under the scheduler's cadence) doing passes of three core jobs, each a bounded
batch answered from a small partial index:

- `reclaim_expired_leases` — a running step whose lease expired (its process died): back to
  pending and dispatched, or failed `OUTCOME_UNKNOWN` when its at-most-once side effect may
  have started (unless its block decides such a retry itself: then pending, and the block
  asks the provider), or failed `LEASE_EXPIRED` when it used up its block's `max_attempts`;
  in a run that ended meanwhile, skipped (failed `OUTCOME_UNKNOWN` when marked). Whatever
  the dead attempt was charged or reserved is recorded outcome-unknown;
- `wake_due_steps` — due `waiting_for_delay` / `waiting_for_retry` rows to pending, dispatched;
- `redispatch_lost_steps` — pending steps whose `step-ready` evidently never arrived
  (stamped longer ago than `redispatch_after_seconds`), re-stamped so there is no storm;
- `requeue_undecided_events` — published trigger events that admission has not decided after
  `redeliver_events_after_seconds` go back into the outbox and are published again (admission
  is idempotent); after `max_event_redeliveries` an event is given up as undelivered, visibly.
  So "every published event gets a decision, or an explanation why not" is onceflow's
  guarantee, not the transport's (Pub/Sub may drop a push to a restarting endpoint, dead-letter
  after its attempts, or back off for minutes).

Then the registered `Duty`s, each claimed once per period across all instances through a row
in `sweep_duties`: the backlog report the alerts read (every minute), marker expiry, provider
subscription repair (hourly), trimming the lease history of runs that finished more than
`lease_history_days` ago (hourly), retention of finished runs, decided events and processed
inbox rows (`shared/sweep/retention.py`, every five minutes), and the duties of the trigger kinds
(cron ticks, webhook-trigger key expiry, table and CRM polls: `shared/triggers/`).
`default_duties()` is the one list: the sweep's own duties are written there, a trigger kind's
come from its module through the kind registry, and the loop doesn't change.
A duty that raises is recorded and logged; it never stops the core jobs.

Every job is idempotent: sweeping twice changes nothing the first sweep didn't.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shared.core import queries
from shared.core.db import Database
from shared.core.errors import TransientError
from shared.core.logs import LogEvent, get_logger, log_event
from shared.ingest.drops import trim_drops
from shared.providers.install import trim_install_states
from shared.sweep.backlog import read_backlog

STEPS_SQL = queries.load("steps")
SWEEP_SQL = queries.load("sweep")
RECLAIM_EXPIRED = STEPS_SQL["steps_reclaim_expired"]
WAKE_DUE = STEPS_SQL["steps_wake_due"]
REDISPATCH_LOST = STEPS_SQL["steps_redispatch_lost"]
DUTY_CLAIM = SWEEP_SQL["sweep_duty_claim"]
DUTY_RECORD = SWEEP_SQL["sweep_duty_record"]
TRIM_LEASE_HISTORY = SWEEP_SQL["step_leases_trim"]

Dispatch = Callable[[Sequence[str]], None]
log = get_logger(__name__)


@dataclass(frozen=True)
class SweepConfig:
    batch: int = 500
    # Pub/Sub delivers in milliseconds; two minutes without a claim means the message is lost
    # (or stuck in nack backoff, where a duplicate is harmless: the claim is conditional).
    redispatch_after_seconds: float = 120.0
    # A published trigger event without an admission decision this long after its publish is
    # published again; after this many re-publishes it is given up as undelivered. With the
    # defaults every published event is decided, or explained, within about
    # (redeliveries + 1) * after + the publisher's cadence ≈ 12 minutes.
    redeliver_events_after_seconds: float = 120.0
    max_event_redeliveries: int = 5
    poll_seconds: float = 2.0
    # The per-attempt lease history of a finished run is kept this long (its run longer).
    lease_history_days: int = 30
    # Pre-admission drops (shared/ingest/drops.py) hold changed property values: kept this long.
    drop_retention_days: int = 14
    # Retention (shared/sweep/retention.py): days kept after a run finished, an event was decided,
    # an inbox row was processed, a rehearsal finished; runs per deletion batch.
    run_retention_days: int = 90
    decision_retention_days: int = 90
    inbox_retention_days: int = 30
    rehearsal_retention_days: int = 7
    retention_batch: int = 500

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> SweepConfig:
        env = os.environ if env is None else env
        d = cls()
        return cls(
            batch=int(env.get("ONCEFLOW_SWEEP_BATCH", d.batch)),
            redispatch_after_seconds=float(
                env.get("ONCEFLOW_REDISPATCH_AFTER_SECONDS", d.redispatch_after_seconds)
            ),
            redeliver_events_after_seconds=float(
                env.get("ONCEFLOW_REDELIVER_EVENTS_AFTER_SECONDS", d.redeliver_events_after_seconds)
            ),
            max_event_redeliveries=_positive_int(
                env, "ONCEFLOW_MAX_EVENT_REDELIVERIES", d.max_event_redeliveries
            ),
            poll_seconds=float(env.get("ONCEFLOW_SWEEP_POLL_SECONDS", d.poll_seconds)),
            lease_history_days=_positive_int(
                env, "ONCEFLOW_LEASE_HISTORY_DAYS", d.lease_history_days
            ),
            drop_retention_days=_positive_int(
                env, "ONCEFLOW_DROP_RETENTION_DAYS", d.drop_retention_days
            ),
            run_retention_days=_positive_int(
                env, "ONCEFLOW_RUN_RETENTION_DAYS", d.run_retention_days
            ),
            decision_retention_days=_positive_int(
                env, "ONCEFLOW_DECISION_RETENTION_DAYS", d.decision_retention_days
            ),
            inbox_retention_days=_positive_int(
                env, "ONCEFLOW_INBOX_RETENTION_DAYS", d.inbox_retention_days
            ),
            rehearsal_retention_days=_positive_int(
                env, "ONCEFLOW_REHEARSAL_RETENTION_DAYS", d.rehearsal_retention_days
            ),
            retention_batch=_positive_int(env, "ONCEFLOW_RETENTION_BATCH", d.retention_batch),
        )


def _positive_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{name} must be a whole number of at least 1, not {raw!r}")
    return value


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
            "duties": self.duties,
        }


def default_dispatch(step_ids: Sequence[str]) -> None:
    from shared.core.pubsub import publish_step_ready

    publish_step_ready(step_ids)


def _publish(dispatch: Dispatch, ids: Sequence[str], report: SweepReport) -> None:
    if not ids:
        return
    try:
        dispatch(ids)
    except Exception as exc:
        # The rows are committed and stamped: the next redispatch pass after the threshold
        # publishes them again. Raising here would only abort the other jobs.
        report.publish_failures += 1
        log.warning("sweep publish of %d steps failed; retried after threshold: %s", len(ids), exc)


@functools.cache
def reclaim_rules() -> dict[str, Any]:
    """What the reclaim needs from the catalog, per block type. How many attempts a step gets,
    whatever ended each one (a retryable failure, or a lease that expired because its process
    died): the block's own `max_attempts`, one number, so a step whose process keeps dying
    stops where the block's retry policy says (the first release capped crashes at a separate
    5 against a policy of 3); unknown types get the default policy's number. And which blocks
    decide an ambiguous retry themselves (`BlockSpec.decides_ambiguous_retry`): a marked step
    of one goes back to pending for its block to decide (crm.create asks the CRM by its key),
    where any other fails OUTCOME_UNKNOWN. Computed once per process: the catalog is fixed for
    a deployment, and the sweep runs a reclaim pass every few seconds."""
    from shared.blocks import registry
    from shared.blocks.base import RetryPolicy

    registry.load_catalog()
    specs = registry.all_specs()
    return {
        "block_types": [spec.type_name for spec in specs],
        "block_max_attempts": [spec.max_attempts for spec in specs],
        "default_max_attempts": RetryPolicy().max_attempts,
        "deciding_types": [spec.type_name for spec in specs if spec.decides_ambiguous_retry],
    }


def reclaim_expired_leases(
    db: Database, config: SweepConfig, dispatch: Dispatch, report: SweepReport
) -> int:
    """Reclaim one batch of expired leases; the number of rows touched."""
    from shared.gates.catalog import record_outcome_unknown

    with db.transaction() as tx:
        rows = tx.all(RECLAIM_EXPIRED, batch=config.batch, **reclaim_rules())
        for r in rows:
            # The dead attempt may have sent what it was charged for (and reserved): in the
            # same transaction, so no later "not applied" refunds or releases it.
            record_outcome_unknown(tx, str(r["idempotency_key"]), str(r["id"]))
    pending = [r["id"] for r in rows if r["status"] == "pending"]
    for r in rows:
        # After the commit: a rolled-back reclaim must not page anyone.
        outcome = "pending" if r["status"] == "pending" else str(r["outcome_code"])
        log_event(
            log,
            LogEvent.LEASE_EXPIRED,
            f"step lease expired; reclaimed as {r['status']} ({outcome})",
            level=logging.WARNING,
            step_id=r["id"],
            run_id=r["run_id"],
            outcome=outcome,
        )
        if r["run_failed"]:
            log_event(
                log,
                LogEvent.RUN_FAILED,
                f"run failed: its step's lease expired ({r['outcome_code']})",
                level=logging.WARNING,
                run_id=r["run_id"],
                outcome_code=str(r["outcome_code"]),
            )
            _count_failed_run_for_breaker(db, r["run_id"], str(r["outcome_code"]))
    skipped = sum(1 for r in rows if r["status"] == "skipped")
    report.reclaimed += len(pending)
    report.reclaimed_skipped += skipped
    report.reclaimed_failed += len(rows) - len(pending) - skipped
    _publish(dispatch, pending, report)
    return len(rows)


def _count_failed_run_for_breaker(db: Database, run_id: str, outcome_code: str) -> None:
    """A run the reclaim failed counts toward its workflow's circuit breaker like one its
    step executor failed (shared/gates/breaker.py). After the commit; a failure here is logged and
    the streak misses one run, as in the executor."""
    from shared.gates import breaker

    try:
        breaker.record_run_failed_by_id(
            db, run_id, why=f"a step's lease expired and the sweep failed it ({outcome_code})"
        )
    except Exception:
        log.warning("circuit breaker not updated for run %s", run_id, exc_info=True)


def wake_due_steps(
    db: Database, config: SweepConfig, dispatch: Dispatch, report: SweepReport
) -> int:
    with db.transaction() as tx:
        ids = [r["id"] for r in tx.all(WAKE_DUE, batch=config.batch)]
    report.woken += len(ids)
    _publish(dispatch, ids, report)
    return len(ids)


def redispatch_lost_steps(
    db: Database, config: SweepConfig, dispatch: Dispatch, report: SweepReport
) -> int:
    with db.transaction() as tx:
        ids = [
            r["id"]
            for r in tx.all(
                REDISPATCH_LOST,
                batch=config.batch,
                after_seconds=config.redispatch_after_seconds,
            )
        ]
    report.redispatched += len(ids)
    _publish(dispatch, ids, report)
    return len(ids)


def requeue_undecided_events(
    db: Database, config: SweepConfig, dispatch: Dispatch, report: SweepReport
) -> int:
    """Undecided published events back into the outbox (the publisher sends them), or given
    up at the cap; the number of rows touched. `dispatch` is for steps and not used here."""
    from shared.ingest.outbox import requeue_undecided

    done = requeue_undecided(
        db,
        after_seconds=config.redeliver_events_after_seconds,
        max_redeliveries=config.max_event_redeliveries,
        batch=config.batch,
    )
    report.events_requeued += len(done.requeued)
    report.events_undelivered += len(done.given_up)
    return len(done.requeued) + len(done.given_up)


CORE_JOBS = (
    reclaim_expired_leases,
    wake_due_steps,
    redispatch_lost_steps,
    requeue_undecided_events,
)


def run_duty(db: Database, duty: Duty) -> Any:
    """Run `duty` if no invocation ran it within its period; its summary, or None if skipped."""
    with db.transaction() as tx:
        owned = tx.one(DUTY_CLAIM, name=duty.name, every_seconds=duty.every_seconds)
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
            DUTY_RECORD,
            name=duty.name,
            ok=ok,
            result=json.dumps(result, default=str),
            error=error,
        )
    return result if ok else {"error": error}


def expire_echo_markers(db: Database) -> dict[str, int]:
    """Markers expired for longer than their grace (shared/admission/echo.py owns the rule)."""
    from shared.admission import echo

    with db.transaction() as tx:
        return {"expired": echo.expire_echo_markers(tx)}


def reroute_unrouted_app_events(db: Database) -> dict[str, int]:
    """App events that arrived before their portal's connection existed, routed to it now
    (shared/ingest/inbox.py owns the rule)."""
    from shared.ingest.inbox import reroute_unrouted

    return reroute_unrouted(db)


def reconcile_subscriptions(db: Database) -> dict[str, int]:
    """Hourly provider subscription repair (the workflows issue's reconcile)."""
    from shared.providers.connect import port_for, port_for_app
    from shared.publishing.subscriptions import reconcile_all

    results = reconcile_all(db, port_for, port_for_app)
    return {"connections": len(results), "failed": sum(1 for r in results if not r.ok)}


def delete_expired_throttle_windows(db: Database) -> dict[str, int]:
    """Throttle windows are one row per connection per window; ended ones only take space."""
    from shared.gates.throttle import delete_expired_windows

    with db.transaction() as tx:
        return {"deleted": delete_expired_windows(tx)}


def reconcile_budget_reservations(db: Database) -> dict[str, int]:
    """Budget reservations whose step ended without settling them (shared/gates/budgets.py)."""
    from shared.gates.budgets import reconcile

    return reconcile(db)


def trim_lease_history(
    db: Database, days: int, *, batch: int = 5000, max_batches: int = 20
) -> dict[str, int]:
    """Delete the lease history of runs finished more than `days` ago, a batch per
    transaction so no pass holds locks on a large backlog; what is left waits for the next
    period."""
    deleted = 0
    for _ in range(max_batches):
        with db.transaction() as tx:
            n = tx.execute(TRIM_LEASE_HISTORY, days=days, batch=batch)
        deleted += n
        if n < batch:
            break
    return {"deleted": deleted}


def report_backlog(db: Database) -> dict[str, float]:
    """Log the age of the oldest unfinished work per queue: the line the backlog alerts read
    (infra/monitoring.tf). Once a minute across all sweep instances, through the duty row."""
    with db.transaction() as tx:
        backlog = read_backlog(tx)
    ages = {
        "inbox_oldest_seconds": backlog.inbox_oldest_seconds,
        "outbox_oldest_seconds": backlog.outbox_oldest_seconds,
        "steps_oldest_pending_seconds": backlog.steps_oldest_pending_seconds,
    }
    log_event(
        log,
        LogEvent.BACKLOG_AGE,
        "backlog ages",
        inbox_oldest_seconds=backlog.inbox_oldest_seconds,
        outbox_oldest_seconds=backlog.outbox_oldest_seconds,
        steps_oldest_pending_seconds=backlog.steps_oldest_pending_seconds,
    )
    return ages


def default_duties(config: SweepConfig | None = None) -> list[Duty]:
    """Every periodic duty: the sweep's own, then each trigger kind's (shared/triggers/)."""
    # Imported here: trigger kinds import `Duty` from this module.
    from shared import triggers
    from shared.sweep import retention

    config = config or SweepConfig.from_env()
    days, drop_days = config.lease_history_days, config.drop_retention_days
    return [
        Duty("report_backlog", 60.0, report_backlog),
        Duty("expire_echo_markers", 300.0, expire_echo_markers),
        Duty("reroute_unrouted_app_events", 60.0, reroute_unrouted_app_events),
        Duty("delete_expired_throttle_windows", 900.0, delete_expired_throttle_windows),
        Duty("reconcile_budget_reservations", 300.0, reconcile_budget_reservations),
        Duty("reconcile_subscriptions", 3600.0, reconcile_subscriptions),
        Duty("trim_lease_history", 3600.0, lambda db: trim_lease_history(db, days)),
        Duty("trim_pre_admission_drops", 3600.0, lambda db: trim_drops(db, drop_days)),
        Duty("trim_oauth_install_states", 3600.0, trim_install_states),
        retention.duty(config),
        *triggers.duties(),
    ]


def sweep_once(
    db: Database,
    *,
    config: SweepConfig,
    dispatch: Dispatch,
    duties: Sequence[Duty],
    report: SweepReport,
) -> bool:
    """One pass; True when a core job filled its batch (a backlog: go again at once)."""
    backlog = False
    for job in CORE_JOBS:
        if job(db, config, dispatch, report) >= config.batch:
            backlog = True
    for duty in duties:
        result = run_duty(db, duty)
        if result is not None:
            report.duties[duty.name] = result
    report.passes += 1
    return backlog


def run_sweep(
    db: Database,
    budget_seconds: float,
    *,
    config: SweepConfig | None = None,
    dispatch: Dispatch | None = None,
    duties: Sequence[Duty] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> SweepReport:
    """Sweep repeatedly until `budget_seconds` is spent (at least one pass).

    A transient database error ends the invocation early with what was done (the next
    scheduled sweep carries on); anything else is a bug and propagates."""
    config = config or SweepConfig.from_env()
    dispatch = dispatch or default_dispatch
    duties = default_duties(config) if duties is None else duties
    report = SweepReport()
    deadline = clock() + max(budget_seconds, 0.0)
    while True:
        try:
            backlog = sweep_once(db, config=config, dispatch=dispatch, duties=duties, report=report)
        except TransientError as exc:
            log.warning("sweep pass stopped by a transient error: %s", exc)
            break
        remaining = deadline - clock()
        if backlog and remaining > 0:
            continue
        if remaining <= config.poll_seconds:
            break
        sleep(config.poll_seconds)
    log.info("sweep done: %s", json.dumps(report.as_dict(), default=str))
    return report
