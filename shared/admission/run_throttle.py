"""A throttle on starting runs: `throttle: {limit, period, key}` on a trigger.

At most `limit` runs of the workflow start per fixed window of `period` per key (default: the
whole workflow; `key` is CEL over the rule scope, e.g. `record.company_id`). An event over the
limit is not refused: its pairing waits in `run_start_queue`, in arrival order, and the sweep
starts it when a later window has room. Counted in `throttle_windows` (scope `run_start`,
shared/gates/throttle.py), the same one-statement upsert as the step limits, so the limit
holds across instances and restarts.

Admission (`admit_or_queue`, in its transaction, after its record locks) takes the
(workflow, key) queue lock, then: when nothing waits for the key, claims a slot; a granted
slot means the run starts now by admission's own decision statement. Otherwise the pairing is
queued behind the others with `due_at` = the end of the window, so a new event never
overtakes a waiting one.

The sweep (`start_due_runs` in shared/admission/run_throttle_start.py, a repair) takes each
due queue head in turn: the head's record lock (the dedup lock admission takes), the queue
lock, the head read again under it, a slot claimed, then the guarded `queued → started` and
admission's decision statement for the pairing (`decide_held_pairing`: its run, or
`duplicate`/`already_running`), all in one transaction; a full window defers the whole queue
to its end. Two sweeps serialize on the queue lock and the guarded start, so a window never
starts more than `limit` runs, and a crash before a commit leaves the entry queued and due.

A claim that turns out over the limit still counts (the window ends anyway), and a slot whose
pairing is then refused by dedup is spent: the promise is "at most", not "exactly".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from shared.core import queries
from shared.core.db import Tx
from shared.gates import throttle
from shared.workflows.definition import RunThrottle
from shared.workflows.expressions import (
    CompiledExpression,
    ExpressionError,
    PreparedScope,
    evaluate,
)

SQL = queries.load("run_throttle")
LOCK = SQL["run_throttle_lock"]
QUEUED = SQL["run_throttle_queued"]
ENQUEUE = SQL["run_throttle_enqueue"]
DUE_HEADS = SQL["run_throttle_due_heads"]
HEAD = SQL["run_throttle_head"]
START = SQL["run_throttle_start"]
OUTCOME = SQL["run_throttle_outcome"]
DEFER = SQL["run_throttle_defer"]
WHOLE_WORKFLOW = "workflow"


@dataclass(frozen=True)
class Throttled:
    """One binding's pairing under a throttle: what starting its run later needs."""

    workflow_id: str
    version_id: str
    dedup_mode: str
    record_key: str | None
    throttle_key: str
    # The record the rule saw, as JSON (the run's `trigger_record`).
    trigger_record: str
    entry_node: str
    entry_type: str
    throttle: RunThrottle
    run_id: str
    # The run's priority, as admitted (shared/admission/priority.py).
    priority: int = 0


@dataclass(frozen=True)
class Queued:
    workflow_id: str
    queue_id: int
    due_at: datetime
    # False: a redelivery found the pairing already waiting.
    queued_now: bool

    @property
    def detail(self) -> str:
        return (
            f"waiting in the workflow's run-start queue (entry {self.queue_id}): the throttle's "
            f"window is full; it starts in order once a window has room (next at "
            f"{self.due_at.isoformat()})"
        )


def throttle_key(
    th: RunThrottle,
    key_expression: CompiledExpression | None,
    scope: PreparedScope | Mapping[str, Any],
) -> tuple[str | None, str | None]:
    """(the key the limit is counted per, why there is none)."""
    if th.key is None or key_expression is None:
        return WHOLE_WORKFLOW, None
    return key_of("throttle", th.key, key_expression, scope)


def key_of(
    what: str,
    source: str,
    key_expression: CompiledExpression,
    scope: PreparedScope | Mapping[str, Any],
) -> tuple[str | None, str | None]:
    """A limit's key from its CEL expression over the rule scope: `key:<value>`, or (None,
    why there is none). The throttle's and keyed concurrency's one rule."""
    try:
        value = evaluate(key_expression, scope)
    except ExpressionError as exc:
        return None, f"the {what} key `{source}` could not be evaluated: {exc}"
    if value is None or value == "" or isinstance(value, Mapping | list):
        return None, f"the {what} key `{source}` gave {value!r:.80}, not a key"
    return f"key:{value}", None


def limit_of(workflow_id: str, key: str, limit: int, window_seconds: int) -> throttle.Limit:
    return throttle.Limit("run_start", f"{workflow_id}|{key}", limit, window_seconds)


def admit_or_queue(tx: Tx, *, event_id: int, tenant_id: str, item: Throttled) -> Queued | None:
    """None: a slot was claimed, admission starts the run now. Otherwise the pairing waits."""
    tx.one(LOCK, workflow_id=item.workflow_id, throttle_key=item.throttle_key)
    waiting = int(tx.scalar(QUEUED, workflow_id=item.workflow_id, throttle_key=item.throttle_key))
    due_at: datetime | None = None
    if waiting == 0:
        claim = throttle.claim(
            tx,
            limit_of(
                item.workflow_id,
                item.throttle_key,
                item.throttle.limit,
                item.throttle.window_seconds,
            ),
        )
        if claim.allowed:
            return None
        due_at = claim.window_end
    row = tx.one(
        ENQUEUE,
        tenant_id=tenant_id,
        workflow_id=item.workflow_id,
        throttle_key=item.throttle_key,
        event_id=event_id,
        run_id=item.run_id,
        version_id=item.version_id,
        dedup_mode=item.dedup_mode,
        record_key=item.record_key,
        trigger_record=item.trigger_record,
        entry_node=item.entry_node,
        entry_type=item.entry_type,
        limit_per_window=item.throttle.limit,
        window_seconds=item.throttle.window_seconds,
        due_at=None if due_at is None else due_at.isoformat(),
        priority=item.priority,
    )
    assert row is not None
    return Queued(item.workflow_id, int(row["id"]), row["due_at"], bool(row["queued_now"]))
