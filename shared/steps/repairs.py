"""The step engine's repairs: what makes steps survive crashes and lost messages.

The sweep (shared/sweep/loop.py) runs these on every pass, each a bounded batch answered from a
small partial index (registered in shared/sweep/catalog.py):

- `reclaim_expired_leases` — a running step whose lease expired (its process died): back to
  pending and dispatched, or failed `OUTCOME_UNKNOWN` when its at-most-once side effect may
  have started (unless its block decides such a retry itself: then pending, and the block
  asks the provider), or failed `LEASE_EXPIRED` when it used up its block's `max_attempts`;
  in a run that ended meanwhile, skipped (failed `OUTCOME_UNKNOWN` when marked). Whatever
  the dead attempt was charged or reserved is recorded outcome-unknown. A failed step fails
  its run, or, when the run's version declares `compensate:` or `finally:`, does what a
  settle's failure does (its compensations, then its finally steps);
- `wake_due_steps` — due `waiting_for_delay` / `waiting_for_retry` rows to pending, dispatched;
- `redispatch_lost_steps` — pending steps whose `step-ready` evidently never arrived
  (stamped longer ago than `redispatch_after_seconds`), re-stamped so there is no storm.

And one duty (`sweep_duties`): trimming the lease history of runs that finished more than
`lease_history_days` ago (hourly).

Every repair is idempotent: sweeping twice changes nothing the first sweep didn't.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from shared.core import queries
from shared.core.db import Database, Tx
from shared.core.duty import Dispatch, Duty, SweepConfig, SweepReport
from shared.core.logs import LogEvent, get_logger, log_event

STEPS_SQL = queries.load("steps")
SWEEP_SQL = queries.load("sweep")
RECLAIM_EXPIRED = STEPS_SQL["steps_reclaim_expired"]
WAKE_DUE = STEPS_SQL["steps_wake_due"]
REDISPATCH_LOST = STEPS_SQL["steps_redispatch_lost"]
TRIM_LEASE_HISTORY = SWEEP_SQL["step_leases_trim"]

log = get_logger(__name__)


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
        epilogue = _fail_through_phases(db, tx, [r for r in rows if r["epilogue_version_id"]])
    pending = [r["id"] for r in rows if r["status"] == "pending"]
    for r in rows:
        run_failed = r["run_failed"] or r["run_id"] in epilogue.runs_failed
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
        if run_failed:
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
    # The reclaimed steps, and the compensation or finally steps their failures created.
    _publish(dispatch, pending + epilogue.to_dispatch, report)
    return len(rows)


@dataclass(frozen=True)
class _ReclaimedStep:
    """A step the reclaim failed, as the run's phases read it (shared/steps/claim.StepOfRun)."""

    run_id: str
    step_key: str
    lineage_root: str


@dataclass
class _Epilogue:
    to_dispatch: list[str] = field(default_factory=list)
    runs_failed: set[str] = field(default_factory=set)


def _fail_through_phases(db: Database, tx: Tx, failed: Sequence[dict[str, Any]]) -> _Epilogue:
    """Steps the reclaim failed in running runs whose version declares `compensate:` or
    `finally:` (the statement left those runs running): each does what a settle's failure
    does — compensations, then the finally steps — in the reclaim's transaction, under the run
    row's lock it took. A version that no longer loads fails its run as the statement would."""
    from pydantic import ValidationError

    from shared.core.errors import PermanentError
    from shared.steps.advance import load_graph
    from shared.steps.finale import Finale
    from shared.steps.saga import Saga
    from shared.steps.settle import fail_in_phase, run_error

    out = _Epilogue()
    for r in failed:
        step = _ReclaimedStep(str(r["run_id"]), str(r["step_key"]), str(r["lineage_root"]))
        try:
            graph = load_graph(db, str(r["epilogue_version_id"]), tx=tx)
            saga, final = Saga.of(graph), Finale.of(graph)
        except (PermanentError, ValidationError):
            # A stored definition that no longer parses: the run fails as without them.
            log.warning("run %s: its version does not load; failed uncompensated", step.run_id)
            saga = final = None
        error = run_error(step.step_key, str(r["outcome_code"]), r["error"])
        ids, run_failed = fail_in_phase(tx, step, error, saga=saga, final=final)
        out.to_dispatch += ids
        if run_failed:
            out.runs_failed.add(step.run_id)
    return out


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


def sweep_duties(config: SweepConfig) -> tuple[Duty, ...]:
    days = config.lease_history_days
    return (Duty("trim_lease_history", 3600.0, lambda db: trim_lease_history(db, days)),)
