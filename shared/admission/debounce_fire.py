"""Debounce per record, the sweep's side: a due burst starts its one run.

`fire_due_bursts` is a sweep repair (shared/sweep/catalog.py `REPAIRS`, every pass): it reads
the bursts due now from their due index (`debounce_due`) and fires each in one transaction:

1. the dedup lock of the burst's last record (`admission_lock_records`, the very lock
   admission takes for that (workflow, record)), taken before the burst's row so the fire and
   an admission that joins lock in the same order;
2. `debounce_fire`, the guarded UPDATE open/closed → fired: the one decision that this burst
   fires now. Zero rows: another sweep instance fired it, or an event joined since and moved
   its fire time (it fires later, with that event as its last), or the burst moved on to
   another record's event (read again next pass);
3. admission's own decision statement (`admission_admit`) for the burst's last event and
   this workflow, with the run id the burst chose when it opened: the run (start key
   `workflow_event:<last event>`, invariant 2), its first step, the delivery claim, or the
   last event's `duplicate`/`already_running` refusal — the same rules as any admission;
4. `debounce_settle_members`: every other event of the burst claimed and refused
   `superseded`, naming the run; the burst keeps its events for the run's scope.

Then commit and publish step-ready for the first step; a publish lost after commit is
repaired by the sweep's re-dispatch, like admission's. A crash anywhere before the commit
leaves the burst open and due: the next pass fires it. Two sweeps firing one burst: one
UPDATE wins, the other finds zero rows (the race test holds them at a barrier).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shared.admission.admit import LOCK_RECORDS, decide_held_pairing, paused_now
from shared.admission.debounce import SQL
from shared.core.db import Database, Tx
from shared.core.duty import Dispatch, SweepConfig, SweepReport
from shared.core.logs import get_logger

DUE = SQL["debounce_due"]
FIRE = SQL["debounce_fire"]
SETTLE_MEMBERS = SQL["debounce_settle_members"]
log = get_logger(__name__)


@dataclass(frozen=True)
class Fired:
    burst_id: str
    # `admitted` (run_id is the run), `handled` (the pairing was decided before), or the
    # last event's refusal reason (duplicate, already_running).
    outcome: str
    run_id: str | None
    last_event_id: int
    superseded: int
    step_id: str | None


def fire_burst(db: Database, due: Mapping[str, Any]) -> Fired | None:
    """Fire one burst read by `debounce_due` (id, workflow_id, record_key, dedup_mode). None
    when another racer decided it, or it is no longer due; see the module docstring."""
    with db.transaction() as tx:
        return fire_in(tx, due, commit=True)


def fire_in(tx: Tx, due: Mapping[str, Any], *, commit: bool = False) -> Fired | None:
    """Steps 1 to 4 in the caller's transaction: the sweep's own (`commit`: the settle commits
    in its round trip), or the admission whose event filled a batch (shared/admission/
    admit.py), which fires it before its own decision statement and commits both at once —
    so a batch is never left full and unfired, and a crash before that commit leaves the
    event undecided and the batch as it was (the event's redelivery fills it again)."""
    if due["dedup_mode"] != "every_time" and due["record_key"] is not None:
        tx.one(LOCK_RECORDS, lock_keys=[f"{due['workflow_id']}|{due['record_key']}"])
    burst = tx.one(FIRE, burst_id=due["id"], record_key=due["record_key"])
    if burst is None:
        return None
    last = int(burst["last_event_id"])
    row = decide_held_pairing(
        tx,
        event_id=last,
        workflow_id=burst["workflow_id"],
        version_id=burst["version_id"],
        dedup_mode=burst["dedup_mode"],
        run_id=burst["run_id"],
        record_key=burst["record_key"],
        entry_node=burst["entry_node"],
        entry_type=burst["entry_type"],
        trigger_record=burst["trigger_record"],
        refusal=paused_now(burst),
    )
    outcome = str(row["outcome"])
    run_id = row["run_id"] if outcome in ("admitted", "handled") else None
    settled = (tx.commit_with if commit else tx.all)(
        SETTLE_MEMBERS,
        burst_id=burst["id"],
        outcome=outcome,
        run_id=run_id,
        outcome_detail=row["detail"],
    )
    return Fired(
        burst_id=burst["id"],
        outcome=outcome,
        run_id=run_id,
        last_event_id=last,
        superseded=int(settled[0]["superseded"]) if settled else 0,
        step_id=row["step_id"] if outcome == "admitted" else None,
    )


def fire_due_bursts(
    db: Database, config: SweepConfig, dispatch: Dispatch, report: SweepReport
) -> int:
    """The sweep repair: fire every burst due now (one bounded batch); the number read, so a
    full batch makes the loop go again at once."""
    with db.transaction() as tx:
        due = tx.all(DUE, batch=config.batch)
    steps: list[str] = []
    for d in due:
        fired = fire_burst(db, d)
        if fired is None:
            continue
        report.bursts_fired += 1
        if fired.step_id is not None:
            steps.append(fired.step_id)
    _publish(dispatch, steps, report)
    return len(due)


def _publish(dispatch: Dispatch, ids: Sequence[str], report: SweepReport) -> None:
    if not ids:
        return
    try:
        dispatch(ids)
    except Exception as exc:
        # Committed: the sweep's re-dispatch of pending steps publishes them after its
        # threshold. Raising would only stop the other repairs.
        report.publish_failures += 1
        log.warning("publish of %d fired bursts' first steps failed: %s", len(ids), exc)
