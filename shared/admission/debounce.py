"""Debounce per record, admission's side: an event joins its burst instead of starting a run.

A trigger with `debounce: {period, max_wait, key}` (shared/workflows/definition.py) folds
the events for one key (default: the trigger's record) that arrive within `period` of each
other into one burst, one `debounce_bursts` row. The burst starts exactly one run, `period`
after its last event or `max_wait` after its first, whichever is sooner, with the last event
as `event` and the burst's events listed in `event.burst`; every other event of the burst is
refused `superseded`, naming that run. Admission does the first half here, the sweep the
second (shared/admission/debounce_fire.py).

The promises, and what keeps them:

- One decision per (event, workflow) pairing. An event that passes everything decided
  without other runs (provider, echo, identity, rule, credits, breaker: admit.py) joins a
  burst in admission's transaction (`debounce_join`): its membership row, unique per
  pairing, holds the pairing until the fire decides it — the last event by admission's own
  decision statement (its run, or `duplicate`/`already_running`), the others `superseded`.
  A redelivery finds the membership row and changes nothing.
- Nothing lost. The join commits with the event's `decided_at` stamp: from then on the burst
  row, not the event, is what the sweep looks for (by its due index), and the fire is one
  transaction that decides every member. A crash after the join and before the fire loses
  nothing: the row is there and comes due.
- Never two runs for a burst, never an event in a fired burst. The join and the fire are
  guarded UPDATEs of the same row with inverse guards on `fire_at`; the row lock orders them
  (the comments in shared/sql/debounce.sql say how). The run's start key is the last event's,
  and its id is chosen when the burst opens.

Refusals decided before the join are written by admission as usual, immediately: an event the
rule refuses never joins a burst. A half-open breaker's trial slots are not claimed for a
join (the fire starts the run later); the breaker is read again only at the next join.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from shared.core import queries
from shared.core.db import Tx
from shared.workflows.definition import Debounce
from shared.workflows.expressions import (
    CompiledExpression,
    ExpressionError,
    PreparedScope,
    evaluate,
)

SQL = queries.load("debounce")
CLOSE_OVERDUE = SQL["debounce_close_overdue"]
JOIN = SQL["debounce_join"]


@dataclass(frozen=True)
class BurstJoin:
    """One binding's event joining its burst: what the fire needs to start the run of the
    burst's last event without evaluating the trigger again."""

    workflow_id: str
    version_id: str
    dedup_mode: str
    record_key: str | None
    burst_key: str
    # The record the rule saw, as JSON (the run's `trigger_record`).
    trigger_record: str
    entry_node: str
    entry_type: str
    debounce: Debounce


@dataclass(frozen=True)
class Joined:
    workflow_id: str
    burst_id: str
    run_id: str
    fire_at: datetime
    event_count: int
    # A new burst (False: an open one took the event); `held`: a redelivery found it there.
    opened: bool
    held: bool

    @property
    def detail(self) -> str:
        if self.held:
            return f"held in burst {self.burst_id} (a redelivery: nothing changed)"
        how = "opened" if self.opened else f"joined ({self.event_count} events so far)"
        return (
            f"{how} burst {self.burst_id}: it starts run {self.run_id} at "
            f"{self.fire_at.isoformat()} unless another event of the burst comes first"
        )


def burst_key(
    debounce: Debounce,
    key_expression: CompiledExpression | None,
    record_key: str | None,
    scope: PreparedScope | Mapping[str, Any],
) -> tuple[str | None, str | None]:
    """(the burst's key, why there is none): the trigger's record, or the `key` expression
    over the rule scope (the record the rule saw)."""
    if debounce.key is None or key_expression is None:
        if record_key is None:
            return None, "a debounced trigger groups events by record, and this event names none"
        return record_key, None
    try:
        value = evaluate(key_expression, scope)
    except ExpressionError as exc:
        return None, f"the debounce key `{debounce.key}` could not be evaluated: {exc}"
    if value is None or value == "" or isinstance(value, Mapping | list):
        return None, f"the debounce key `{debounce.key}` gave {value!r:.80}, not a key"
    return f"key:{value}", None


def join_bursts(tx: Tx, *, event_id: int, tenant_id: str, joins: list[BurstJoin]) -> list[Joined]:
    """Each binding's event joins its (workflow, key)'s open burst or opens one, in admission's
    transaction (one or two statements per debounced binding; bindings in workflow order, as
    admission locks them). A unique violation (two admissions opening one burst) propagates
    as ConflictError: admission decides the event again and then joins."""
    out: list[Joined] = []
    for j in sorted(joins, key=lambda j: j.workflow_id):
        tx.all(CLOSE_OVERDUE, workflow_id=j.workflow_id, burst_key=j.burst_key)
        row = tx.one(
            JOIN,
            event_id=event_id,
            workflow_id=j.workflow_id,
            tenant_id=tenant_id,
            burst_key=j.burst_key,
            burst_id=str(uuid.uuid4()),
            run_id=str(uuid.uuid4()),
            version_id=j.version_id,
            dedup_mode=j.dedup_mode,
            record_key=j.record_key,
            trigger_record=j.trigger_record,
            entry_node=j.entry_node,
            entry_type=j.entry_type,
            period_seconds=float(j.debounce.period_seconds),
            max_wait_seconds=float(j.debounce.max_wait_seconds),
        )
        assert row is not None  # joined, opened or held: one row, always
        out.append(
            Joined(
                workflow_id=j.workflow_id,
                burst_id=row["burst_id"],
                run_id=row["run_id"],
                fire_at=row["fire_at"],
                event_count=int(row["event_count"]),
                opened=bool(row["opened"]),
                held=bool(row["held"]),
            )
        )
    return out


def record_json(record: Mapping[str, Any]) -> str:
    return json.dumps(record, default=str)
