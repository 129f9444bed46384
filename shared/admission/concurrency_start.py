"""Keyed concurrency, the starting side: an entry a run's end handed a slot starts its run
(see shared/admission/concurrency.py for the whole story)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shared.admission.admit import LOCK_RECORDS, decide_held_pairing, paused_now
from shared.admission.concurrency import GRANTED, LOCK, OUTCOME, PASS_SLOT, START
from shared.core.db import Database
from shared.core.duty import Dispatch, SweepConfig, SweepReport
from shared.core.logs import get_logger

log = get_logger(__name__)


@dataclass(frozen=True)
class Started:
    queue_id: int
    outcome: str
    run_id: str | None
    step_id: str | None
    # The entry the slot passed to when this one started no run (it is due now).
    passed_to: int | None = None


def start_granted(db: Database, due: Mapping[str, Any]) -> Started | None:
    """Start the granted entry `due` (id, workflow_id, throttle_key, record_key, dedup_mode)
    in one transaction: the record's dedup lock, the key's lock, the guarded start, admission's
    decision statement. None: another starter started it first."""
    with db.transaction() as tx:
        if due["dedup_mode"] != "every_time" and due["record_key"] is not None:
            tx.one(LOCK_RECORDS, lock_keys=[f"{due['workflow_id']}|{due['record_key']}"])
        tx.one(LOCK, workflow_id=due["workflow_id"], concurrency_key=due["throttle_key"])
        entry = tx.one(START, id=int(due["id"]))
        if entry is None:
            return None
        row = decide_held_pairing(
            tx,
            event_id=int(entry["event_id"]),
            workflow_id=entry["workflow_id"],
            version_id=entry["version_id"],
            dedup_mode=entry["dedup_mode"],
            run_id=entry["run_id"],
            record_key=entry["record_key"],
            entry_node=entry["entry_node"],
            entry_type=entry["entry_type"],
            trigger_record=entry["trigger_record"],
            priority=int(entry["priority"]),
            refusal=paused_now(entry),
        )
        outcome = str(row["outcome"])
        passed_to = None
        if outcome != "admitted":
            # No run holds the slot it was granted: the next waiting entry gets it now.
            passed = tx.one(PASS_SLOT, run_id=entry["run_id"])
            passed_to = None if passed is None or passed["granted"] is None else passed["granted"]
        tx.commit_with(OUTCOME, id=int(entry["id"]), outcome=outcome)
    return Started(
        int(entry["id"]),
        outcome,
        row["run_id"] if outcome in ("admitted", "handled") else None,
        row["step_id"] if outcome == "admitted" else None,
        passed_to,
    )


def start_granted_runs(
    db: Database, config: SweepConfig, dispatch: Dispatch, report: SweepReport
) -> int:
    """Start every entry holding a granted slot (one bounded batch, from the due index); the
    number started. The sweep's repair, and what the step function calls once a run ended."""
    steps: list[str] = []
    started = 0
    while started < config.batch:
        with db.transaction() as tx:
            granted = tx.all(GRANTED, batch=config.batch - started)
        progressed = False
        for g in granted:
            done = start_granted(db, g)
            if done is None:
                continue
            started += 1
            progressed = True
            if done.step_id is not None:
                steps.append(done.step_id)
        # Again only when a refused start may have passed its slot on (that entry is due now).
        if not progressed or len(granted) == 0:
            break
    report.runs_started_from_queue += started
    _publish(dispatch, steps, report)
    return started


def _publish(dispatch: Dispatch, ids: Sequence[str], report: SweepReport) -> None:
    if not ids:
        return
    try:
        dispatch(ids)
    except Exception as exc:
        # Committed: the sweep's re-dispatch of pending steps publishes them after its threshold.
        report.publish_failures += 1
        log.warning("publish of %d granted runs' first steps failed: %s", len(ids), exc)


def after_run_ended(db: Database, dispatch: Dispatch) -> None:
    """What the step function does once a step ended its run: the statement that ended it
    handed the run's slot (if it held one) to its key's next waiting run; start it now rather
    than at the sweep's next pass. Best effort: the step is settled and must be acked, and the
    sweep's repair (`start_granted_runs`) starts whatever this leaves."""
    try:
        start_granted_runs(db, SweepConfig(), dispatch, SweepReport())
    except Exception:
        log.warning("runs granted a concurrency slot left to the sweep", exc_info=True)
