"""Keyed concurrency: `concurrency: {key, limit}` on a workflow.

At most `limit` runs of the workflow are running at once per key (`key` is CEL over the rule
scope, e.g. `record.company_id`), beyond the trigger's `dedup`. A run over the limit is not
refused: its pairing waits in `run_start_queue` (gate `concurrency`: the queue the run-start
throttle keeps, one home for "a pairing waiting to start"), in admission order, and starts
when a slot frees.

Slots (`concurrency_slots`, migrations/0551_keyed_concurrency.sql), and what keeps the limit:

- Admission (`take_or_wait`, in its transaction, after its record locks) takes the key's
  advisory lock, reads the slots taken and the entries waiting; when nothing waits and fewer
  than `limit` are taken, the run about to be admitted takes a slot (keyed by the run id
  admission chose) and admission starts it as usual; otherwise the pairing waits. A slot taken
  for a pairing the decision then refuses (duplicate, already_running) is given back before
  commit (`release_unstarted`), still under the lock.
- The statement that ends a run — whichever ends it: a step's settle, a cancel, a goal, a
  repair — frees its slot and hands it to the key's oldest waiting entry in that same
  statement (a trigger on workflow_runs calls `onceflow_concurrency_pass_slot`, under the same
  key lock). A slot is never free while a run of its key waits, and the count never exceeds
  the limit: slots only move one to one, or are taken under the lock with the count read.
- The granted entry's run is started by `start_granted` (here): right after the run's end
  commits, by the step function that ended it (functions/advance_step.py), and by the sweep's
  repair (`start_granted_runs`, by the queue's due index: a granted entry is due at its grant)
  for any end the step function did not see (a cancel, a goal, a crash in between). The start
  is admission's own decision statement for the pairing (`decide_held_pairing`) under the
  record's dedup lock; guarded `queued → started`, so two starters start it once. If the
  pairing is refused then (a run of the record started meanwhile), its slot passes on to the
  next waiting entry in the same transaction.

A version that changes `limit` applies to what it admits: a run's end hands its slot to the
next waiting entry only while the key holds fewer slots than the limit that entry was queued
under (`onceflow_concurrency_grant_next`), so a lowered limit drains as its entries come up.
A raised one lets the next admission of the key grant the free slots to the oldest waiting
entries first (this pairing queues behind them: no new event overtakes a waiting one).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shared.admission.run_throttle import OUTCOME, key_of
from shared.core import queries
from shared.core.db import Tx
from shared.workflows.definition import Concurrency
from shared.workflows.expressions import CompiledExpression, PreparedScope

SQL = queries.load("concurrency")
LOCK = SQL["concurrency_lock"]
STATE = SQL["concurrency_state"]
TAKE = SQL["concurrency_take"]
RELEASE_UNSTARTED = SQL["concurrency_release_unstarted"]
ENQUEUE = SQL["concurrency_enqueue"]
GRANTED = SQL["concurrency_granted"]
START = SQL["concurrency_start"]
PASS_SLOT = SQL["concurrency_pass_slot"]
GRANT_NEXT = SQL["concurrency_grant_next"]
NEXT_WAITING = SQL["concurrency_next_waiting"]
__all__ = ["OUTCOME"]


@dataclass(frozen=True)
class Limited:
    """One binding's pairing under a concurrency limit: what starting its run later needs."""

    workflow_id: str
    version_id: str
    dedup_mode: str
    record_key: str | None
    concurrency_key: str
    trigger_record: str
    entry_node: str
    entry_type: str
    limit: int
    run_id: str
    # The run's priority, as admitted (shared/admission/priority.py).
    priority: int = 0


@dataclass(frozen=True)
class Waiting:
    workflow_id: str
    queue_id: int
    concurrency_key: str
    limit: int
    # False: a redelivery found the pairing already waiting.
    queued_now: bool

    @property
    def detail(self) -> str:
        return (
            f"waiting for a slot (entry {self.queue_id}): {self.limit} run(s) for "
            f"{self.concurrency_key} are running; it starts, in order, when one of them ends"
        )


def concurrency_key(
    limit: Concurrency,
    key_expression: CompiledExpression,
    scope: PreparedScope | Mapping[str, Any],
) -> tuple[str | None, str | None]:
    """(the key the limit is counted per, why there is none)."""
    return key_of("concurrency", limit.key, key_expression, scope)


def take_or_wait(tx: Tx, *, event_id: int, tenant_id: str, item: Limited) -> Waiting | None:
    """None: a slot was taken for `item.run_id`, admission starts the run now. Otherwise the
    pairing waits behind the key's others."""
    keys = {"workflow_id": item.workflow_id, "concurrency_key": item.concurrency_key}
    tx.one(LOCK, **keys)
    state = tx.one(STATE, **keys)
    assert state is not None
    taken, waiting = int(state["taken"]), int(state["waiting"])
    if waiting == 0 and taken < item.limit:
        tx.execute(TAKE, run_id=item.run_id, **keys)
        return None
    # Slots free while others wait (a newer version raised the limit): the oldest get them
    # first, in order (started by the repair, due now); this pairing queues behind them.
    while waiting > 0 and taken < item.limit:
        tx.one(GRANT_NEXT, limit=item.limit, **keys)
        taken, waiting = taken + 1, waiting - 1
    row = tx.one(
        ENQUEUE,
        tenant_id=tenant_id,
        event_id=event_id,
        run_id=item.run_id,
        version_id=item.version_id,
        dedup_mode=item.dedup_mode,
        record_key=item.record_key,
        trigger_record=item.trigger_record,
        entry_node=item.entry_node,
        entry_type=item.entry_type,
        limit=item.limit,
        priority=item.priority,
        **keys,
    )
    assert row is not None
    return Waiting(
        item.workflow_id, int(row["id"]), item.concurrency_key, item.limit, bool(row["queued_now"])
    )


def release_unstarted(tx: Tx, run_ids: Sequence[str]) -> None:
    """After admission's decision statement: give back the slots of runs it did not create."""
    if run_ids:
        tx.execute(RELEASE_UNSTARTED, run_ids=list(run_ids))
