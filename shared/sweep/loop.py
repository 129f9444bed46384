"""The sweep: the scheduled loop over the catalog of repairs and duties.

Cloud Scheduler fires `sweep` at most once a minute. One invocation does passes: every repair
of `shared.sweep.catalog.REPAIRS` (one bounded batch each), then every `Duty` of
`default_duties()`, each run only when no invocation ran it within its period
(`shared.core.duty.run_duty`). A pass whose repair filled its batch is followed at once by
the next. Otherwise the loop asks when a repair will next have work (`next_due_seconds`: an
expiring lease, a wake-up, a dispatch to repeat, an undecided event to re-publish): due
before the budget ends, it sleeps until then (at least `poll_seconds`, so rows a repair
skips as locked can't make it spin) and passes again; nothing due within the budget, it
ends. So an idle sweep is one pass and one query, and the next scheduled invocation picks up
what comes due later (push, not poll: DESIGN.md). A duty that raises is recorded and logged;
it never stops the repairs. What each repair and duty does is said where it is declared
(the catalog names the owners).

Every job is idempotent: sweeping twice changes nothing the first sweep didn't.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence

from shared.core import queries
from shared.core.db import Database
from shared.core.duty import Dispatch, Duty, SweepConfig, SweepReport, run_duty
from shared.core.errors import TransientError
from shared.core.logs import get_logger
from shared.sweep.catalog import REPAIRS, default_duties

NEXT_DUE = queries.load("sweep")["sweep_next_due"]
log = get_logger(__name__)


def default_dispatch(step_ids: Sequence[str]) -> None:
    from shared.core.pubsub import publish_step_ready

    publish_step_ready(step_ids)


# Publishes the outbox after a pass (the entry point's choice; tests that inspect the outbox
# leave it out). Its budget: a pass's events are few; a backlog is the scheduled publisher's.
PUBLISH_AFTER_PASS_SECONDS = 10.0


def publish_committed_events(db: Database) -> None:
    """Send, right after the pass that committed them, the trigger events a pass put in the
    outbox: cron ticks, poll hits, undecided events re-queued. Without it they would wait for
    the next scheduled `publish_outbox` tick; it stays the safety net when this fails."""
    from shared.ingest.outbox import publish_outbox

    try:
        publish_outbox(db, budget_seconds=PUBLISH_AFTER_PASS_SECONDS, until_empty=True)
    except Exception:
        # The events are committed: the scheduled publisher sends them. A publisher that
        # can't start must not stop the repairs.
        log.warning(
            "publishing after the sweep pass failed; the scheduled publisher will", exc_info=True
        )


def next_due_seconds(db: Database, config: SweepConfig) -> float | None:
    """Seconds until a repair next has work by time alone (<= 0: now); None when nothing will."""
    with db.transaction() as tx:
        seconds = tx.scalar(
            NEXT_DUE,
            redispatch_after_seconds=config.redispatch_after_seconds,
            redeliver_after_seconds=config.redeliver_events_after_seconds,
        )
    return None if seconds is None else float(seconds)


def sweep_once(
    db: Database,
    *,
    config: SweepConfig,
    dispatch: Dispatch,
    duties: Sequence[Duty],
    report: SweepReport,
    publish_events: Callable[[Database], None] | None = None,
) -> bool:
    """One pass; True when a repair filled its batch (a backlog: go again at once)."""
    backlog = False
    for repair in REPAIRS:
        if repair(db, config, dispatch, report) >= config.batch:
            backlog = True
    for duty in duties:
        result = run_duty(db, duty)
        if result is not None:
            report.duties[duty.name] = result
    if publish_events is not None:
        publish_events(db)
    report.passes += 1
    return backlog


def run_sweep(
    db: Database,
    budget_seconds: float,
    *,
    config: SweepConfig | None = None,
    dispatch: Dispatch | None = None,
    duties: Sequence[Duty] | None = None,
    publish_events: Callable[[Database], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> SweepReport:
    """Sweep while there is work due within `budget_seconds` (at least one pass).

    `publish_events` runs after each pass (the entry point passes `publish_committed_events`;
    None leaves what a pass committed to the outbox to the scheduled publisher).
    A transient database error ends the invocation early with what was done (the next
    scheduled sweep carries on); anything else is a bug and propagates."""
    config = config or SweepConfig.from_env()
    dispatch = dispatch or default_dispatch
    duties = default_duties(config) if duties is None else duties
    report = SweepReport()
    deadline = clock() + max(budget_seconds, 0.0)
    while True:
        try:
            backlog = sweep_once(
                db,
                config=config,
                dispatch=dispatch,
                duties=duties,
                report=report,
                publish_events=publish_events,
            )
        except TransientError as exc:
            log.warning("sweep pass stopped by a transient error: %s", exc)
            break
        remaining = deadline - clock()
        if remaining <= 0:
            break
        if backlog:
            continue
        try:
            due_in = next_due_seconds(db, config)
        except TransientError as exc:
            log.warning("sweep stopped: the next due time is unreadable: %s", exc)
            break
        pause = None if due_in is None else max(due_in, config.poll_seconds)
        if pause is None or pause >= remaining:
            break  # nothing due before the budget ends: the next scheduled sweep takes it
        sleep(pause)
    log.info("sweep done: %s", json.dumps(report.as_dict(), default=str))
    return report
