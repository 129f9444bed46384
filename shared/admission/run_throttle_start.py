"""A throttle on starting runs, the sweep's side: due queue heads start when a window has room
(see shared/admission/run_throttle.py for the whole story)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shared.admission.admit import LOCK_RECORDS, decide_held_pairing, paused_now
from shared.admission.run_throttle import DEFER, DUE_HEADS, HEAD, LOCK, OUTCOME, START, limit_of
from shared.core.db import Database
from shared.core.duty import Dispatch, SweepConfig, SweepReport
from shared.core.logs import get_logger
from shared.gates import throttle

log = get_logger(__name__)


@dataclass(frozen=True)
class Started:
    queue_id: int
    outcome: str
    run_id: str | None
    step_id: str | None


def start_head(db: Database, due: Mapping[str, Any]) -> tuple[Started | None, bool]:
    """Start the (workflow, key)'s queue head `due` if a slot is free. (what started, whether
    to go on with the next head: False when the window is full or the head moved on)."""
    with db.transaction() as tx:
        if due["dedup_mode"] != "every_time" and due["record_key"] is not None:
            tx.one(LOCK_RECORDS, lock_keys=[f"{due['workflow_id']}|{due['record_key']}"])
        tx.one(LOCK, workflow_id=due["workflow_id"], throttle_key=due["throttle_key"])
        head = tx.one(HEAD, workflow_id=due["workflow_id"], throttle_key=due["throttle_key"])
        if head is None or int(head["id"]) != int(due["id"]):
            return None, False  # started by another sweep meanwhile: read the heads again
        claim = throttle.claim(
            tx,
            limit_of(
                due["workflow_id"],
                due["throttle_key"],
                int(head["limit_per_window"]),
                int(head["window_seconds"]),
            ),
        )
        if not claim.allowed:
            tx.execute(
                DEFER,
                workflow_id=due["workflow_id"],
                throttle_key=due["throttle_key"],
                due_at=claim.window_end.isoformat() if claim.window_end else None,
            )
            return None, False
        entry = tx.one(START, id=int(due["id"]))
        if entry is None:
            return None, False
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
        tx.commit_with(OUTCOME, id=int(entry["id"]), outcome=outcome)
    admitted = outcome == "admitted"
    return Started(
        int(entry["id"]),
        outcome,
        row["run_id"] if outcome in ("admitted", "handled") else None,
        row["step_id"] if admitted else None,
    ), True


def next_head(db: Database, workflow_id: str, key: str) -> Mapping[str, Any] | None:
    with db.transaction() as tx:
        head = tx.one(HEAD, workflow_id=workflow_id, throttle_key=key)
    if head is None:
        return None
    return {**head, "workflow_id": workflow_id, "throttle_key": key}


def start_due_runs(
    db: Database, config: SweepConfig, dispatch: Dispatch, report: SweepReport
) -> int:
    """The sweep repair: for each due queue, start heads in order while its window has room
    (at most `config.batch` starts a pass); the number started."""
    with db.transaction() as tx:
        heads = tx.all(DUE_HEADS, batch=config.batch)
    steps: list[str] = []
    started = 0
    for h in heads:
        due: Mapping[str, Any] | None = h
        while due is not None and started < config.batch:
            done, go_on = start_head(db, due)
            if done is not None:
                started += 1
                if done.step_id is not None:
                    steps.append(done.step_id)
            if not go_on:
                break
            due = next_head(db, h["workflow_id"], h["throttle_key"])
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
        log.warning("publish of %d queued runs' first steps failed: %s", len(ids), exc)
