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
from typing import Any

from shared.admission.admit import decide_gathered
from shared.admission.debounce import SQL, Fired, fire_in
from shared.core.db import Database
from shared.core.duty import Dispatch, SweepConfig, SweepReport
from shared.core.logs import get_logger

DUE = SQL["debounce_due"]
__all__ = ["DUE", "Fired", "fire_burst", "fire_due_bursts", "fire_in"]
log = get_logger(__name__)


def fire_burst(db: Database, due: Mapping[str, Any]) -> Fired | None:
    """Fire one burst read by `debounce_due` (id, workflow_id, record_key, dedup_mode). None
    when another racer decided it, or it is no longer due; see the module docstring."""
    with db.transaction() as tx:
        return fire_in(tx, due, decide_gathered, commit=True)


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
