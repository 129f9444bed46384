"""Gatherings, admission's side: an event joins its debounce burst or its batch instead of
starting a run.

A gathering is events held in one `debounce_bursts` row until it fires one run; two close
rules (`Gathering`): a debounce burst fires `period` after its last event (or `max_wait` after
its first); a batch (`batch: {max_size, max_wait, key}`) fires when full — by the admission
whose event fills it, in that admission's transaction (`Joined.full`, then
shared/admission/debounce_fire.py `fire_in`) — or `max_wait` after its first event (the
sweep, by the same due index). One row kind, one join, one fire, one settle: a batch differs
only in its close rule, in the default key (the whole workflow, not the record), in its
members' reason (`batched`, not `superseded`) and in the scope's name for its events
(`event.batch`, not `event.burst`).

The debounce, in detail:

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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from shared.core import queries
from shared.core.db import Tx
from shared.workflows.definition import Batch, Debounce
from shared.workflows.expressions import (
    CompiledExpression,
    ExpressionError,
    PreparedScope,
    evaluate,
)

SQL = queries.load("debounce")
CLOSE_OVERDUE = SQL["debounce_close_overdue"]
JOIN = SQL["debounce_join"]
FIRE = SQL["debounce_fire"]
SETTLE_MEMBERS = SQL["debounce_settle_members"]
# Admission's own dedup lock on a (workflow, record), taken by the fire as admission takes it.
LOCK_RECORDS = queries.load("admission")["admission_lock_records"]
# Admission's decision statement for the burst's last event (admit.py `decide_gathered`),
# passed in: this module is admission's dependency, not the other way round.
Decide = Callable[[Tx, Mapping[str, Any]], Mapping[str, Any]]


# The key of a batch without `key`: one batch at a time for the whole workflow.
WHOLE_WORKFLOW = "workflow"


@dataclass(frozen=True)
class Gathering:
    """A trigger's close rule for its gatherings: `debounce` (quiet time `period`, at most
    `max_wait`, grouped by record by default) or `batch` (full at `max_size`, at most
    `max_wait`, one batch for the workflow by default). A batch's `period` is its max_wait, so
    its fire time stays at first event + max_wait until the event that fills it."""

    kind: Literal["debounce", "batch"]
    period_seconds: int
    max_wait_seconds: int
    max_size: int | None
    # The `key` expression's source (None: the default key).
    key: str | None
    # How the rule reads in a message: `5s` (a debounce's period), `100 events or 1m`.
    said: str

    @classmethod
    def of(cls, debounce: Debounce | None, batch: Batch | None) -> Gathering | None:
        if debounce is not None:
            return cls(
                "debounce",
                debounce.period_seconds,
                debounce.max_wait_seconds,
                None,
                debounce.key,
                debounce.period,
            )
        if batch is not None:
            return cls(
                "batch",
                batch.max_wait_seconds,
                batch.max_wait_seconds,
                batch.max_size,
                batch.key,
                f"{batch.max_size} events or {batch.max_wait}",
            )
        return None


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
    gathering: Gathering
    # The run's priority, as admitted (shared/admission/priority.py).
    priority: int = 0


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
    # A batch this event filled: it fires now, in the admission's transaction.
    full: bool = False
    kind: str = "debounce"

    @property
    def detail(self) -> str:
        what = "batch" if self.kind == "batch" else "burst"
        if self.held:
            return f"held in {what} {self.burst_id} (a redelivery: nothing changed)"
        if self.full:
            return f"filled batch {self.burst_id} ({self.event_count} events): it started now"
        how = "opened" if self.opened else f"joined ({self.event_count} events so far)"
        unless = (
            "unless it is full first"
            if self.kind == "batch"
            else "unless another event of the burst comes first"
        )
        return (
            f"{how} {what} {self.burst_id}: it starts run {self.run_id} at "
            f"{self.fire_at.isoformat()} {unless}"
        )


def burst_key(
    gathering: Gathering,
    key_expression: CompiledExpression | None,
    record_key: str | None,
    scope: PreparedScope | Mapping[str, Any],
) -> tuple[str | None, str | None]:
    """(the gathering's key, why there is none): by default the trigger's record (debounce)
    or the whole workflow (batch); else the `key` expression over the rule scope (the record
    the rule saw)."""
    if gathering.key is None or key_expression is None:
        if gathering.kind == "batch":
            return WHOLE_WORKFLOW, None
        if record_key is None:
            return None, "a debounced trigger groups events by record, and this event names none"
        return record_key, None
    try:
        value = evaluate(key_expression, scope)
    except ExpressionError as exc:
        return None, f"the {gathering.kind} key `{gathering.key}` could not be evaluated: {exc}"
    if value is None or value == "" or isinstance(value, Mapping | list):
        return None, f"the {gathering.kind} key `{gathering.key}` gave {value!r:.80}, not a key"
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
            period_seconds=float(j.gathering.period_seconds),
            max_wait_seconds=float(j.gathering.max_wait_seconds),
            max_size=j.gathering.max_size,
            priority=j.priority,
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
                full=bool(row["full"]) and not bool(row["held"]),
                kind=j.gathering.kind,
            )
        )
    return out


def record_json(record: Mapping[str, Any]) -> str:
    return json.dumps(record, default=str)


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


def fire_in(
    tx: Tx, due: Mapping[str, Any], decide: Decide, *, commit: bool = False
) -> Fired | None:
    """The fire (shared/admission/debounce_fire.py, steps 1 to 4) in the caller's
    transaction: the sweep's own (`commit`: the settle commits in its round trip), or the
    admission whose event filled a batch (shared/admission/admit.py), which fires it before
    its own decision statement and commits both at once —
    so a batch is never left full and unfired, and a crash before that commit leaves the
    event undecided and the batch as it was (the event's redelivery fills it again)."""
    if due["dedup_mode"] != "every_time" and due["record_key"] is not None:
        tx.one(LOCK_RECORDS, lock_keys=[f"{due['workflow_id']}|{due['record_key']}"])
    burst = tx.one(FIRE, burst_id=due["id"], record_key=due["record_key"])
    if burst is None:
        return None
    last = int(burst["last_event_id"])
    row = decide(tx, burst)
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
