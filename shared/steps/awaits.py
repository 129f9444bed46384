"""Waits of several events (`mode: any | all`) and waits correlated beyond the run's record
(`correlate`): issue 31, items 1 and 2. The same park row, the same guarded resume
(`steps_resume_parked`), the same deadline (the sweep's `steps_wake_due`) and cancel as a
wait for one event (shared/steps/parks.py); what differs is how an event finds the wait and
when the wait is complete.

Finding: each awaited event is a key on the park row, `await_key(tenant, type, correlation
expression, value)` (shared/blocks/waits.py), the value computed on the run's side when the
wait parked ("" — the event's own record — unless `correlate` says otherwise). The keys are
served by a GIN index (step_parks_open_awaits). An admitted event computes its own keys, one
per correlation expression its type is awaited with in its tenant (`wait_correlations`, read
with admission's first statement by primary key), and finds the waits that hold one of them:
an index lookup, never a scan of the parked waits.

Completing: a matching event is noted on the park (`parks_note_match`, guarded on the park
row, after its step row is locked as every writer of both does), whether or not the step is
waiting yet; `any` keeps the first, `all` one per name. The transaction that completes it
(`any`: the first match; `all`: the last name) resumes the step with one guarded statement;
if the step is not waiting yet, the settle that parks it reads `matched` under the park row's
lock (`parks_mark_parked`) and resumes it then. Two events at once serialize on the step
row's lock, so each sees what the other noted. The deadline is judged by every statement
(`deadline > statement_timestamp()`), so after it only the sweep resumes the wait, and its
output keeps what matched (`events`).

The step's output: `any` — the matched event as one event's wait gives it (`event`,
`trigger`, `record`) and `matched`, its name; `all` — `events`, each name's event.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from shared.blocks.base import AwaitedEvent, ParkRequest
from shared.blocks.waits import await_key, correlation_text
from shared.core import queries
from shared.core.db import Tx
from shared.core.logs import get_logger
from shared.ingest.echo import ECHO_CLOCK_SKEW_SECONDS, is_echo, markers_from_json
from shared.steps.parks import (
    LOOKBACK_EVENTS,
    MARK_PARKED,
    MAX_LOOKBACK_EVENTS,
    MAX_WAITS_PER_EVENT,
    OpenedPark,
    event_output,
    resume_park,
    wait_matches,
)
from shared.workflows.expressions import ExpressionError, evaluate
from shared.workflows.scope import Occurrence, rule_scope

SQL = queries.load("steps")
OPEN_AWAITS = SQL["parks_open_awaits"]
LOCK_STEP = SQL["parks_lock_waiting_step"]
NOTE_MATCH = SQL["parks_note_match"]
LOOKBACK_BY_TYPE = SQL["parks_lookback_by_type"]

log = get_logger(__name__)


def event_value(on: str, incoming: Occurrence) -> str | None:
    """The incoming event's side of a correlation: its record key ("" ), or the value of the
    expression over it as a trigger rule reads it; None when it gives nothing."""
    if on == "":
        return incoming.record_key
    try:
        value = evaluate(on, rule_scope(incoming, incoming.record()))
    except ExpressionError as exc:
        log.info("correlation %r can't be evaluated on event %s: %s", on, incoming.id, exc)
        return None
    return None if value is None or value == "" else correlation_text(value)


def event_keys(incoming: Occurrence, expressions: Sequence[str]) -> dict[str, str]:
    """The event's key for each correlation expression its type is awaited with."""
    keys: dict[str, str] = {}
    if incoming.type is None:
        return keys
    for on in expressions:
        value = event_value(on, incoming)
        if value is not None:
            keys[on] = await_key(incoming.tenant_id, incoming.type, on, value)
    return keys


def open_awaits(
    tx: Tx, incoming: Occurrence, expressions: Sequence[str]
) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """The open waits of the new form this event may answer, by index; (its keys, the waits)."""
    keys = event_keys(incoming, expressions)
    if not keys:
        return keys, []
    rows = tx.all(OPEN_AWAITS, keys=sorted(set(keys.values())), limit=MAX_WAITS_PER_EVENT)
    return keys, rows


def _awaited(park: Mapping[str, Any]) -> list[AwaitedEvent]:
    return [AwaitedEvent(**a) for a in park["awaits"] or ()]


def answered(
    incoming: Occurrence,
    keys: Mapping[str, str],
    awaited: Sequence[AwaitedEvent],
    scope: Any,
    park_id: int,
) -> list[str]:
    """The names of the awaited events this event answers: its type, its correlation value,
    and the awaited event's `when` over it."""
    names: list[str] = []
    for a in awaited:
        if a.event_type != incoming.type:
            continue
        if keys.get(a.on) != await_key(incoming.tenant_id, a.event_type, a.on, a.value):
            continue
        if wait_matches(a.condition, incoming, scope, park_id):
            names.append(a.name)
    return names


def _complete(mode: str, matched: Mapping[str, Any], awaited: Sequence[AwaitedEvent]) -> bool:
    if mode == "any":
        return len(matched) >= 1
    return all(a.name in matched for a in awaited)


def _resume_output(mode: str, matched: Mapping[str, Any], event_id: int | None) -> dict[str, Any]:
    if mode == "any":
        ((name, event),) = list(matched.items())[:1]
        return {
            **event,
            "matched": name,
            "resumed": {"kind": "event", "event_id": event_id, "matched": [name]},
        }
    return {
        "events": dict(matched),
        "resumed": {"kind": "event", "event_id": event_id, "matched": sorted(matched)},
    }


def _note_and_maybe_resume(
    tx: Tx,
    park_id: int,
    *,
    mode: str,
    awaited: Sequence[AwaitedEvent],
    names: Sequence[str],
    incoming: Occurrence,
) -> tuple[str | None, Mapping[str, Any] | None]:
    """Note the event on the park for each name it answers; resume the step when that made
    the wait complete. (The step id when it was resumed here, what matched as of the last
    note that took: None when none did.)"""
    if not names:
        return None, None
    tx.one(LOCK_STEP, park_id=park_id)
    output = event_output(incoming)
    output.pop("resumed", None)
    matched: Mapping[str, Any] | None = None
    for name in names:
        row = tx.one(NOTE_MATCH, park_id=park_id, name=name, event=json.dumps(output, default=str))
        if row is not None:
            matched = row["matched"]
    if matched is None or not _complete(mode, matched, awaited):
        return None, matched
    done = resume_park(
        tx,
        park_id,
        by="event",
        output=_resume_output(mode, matched, incoming.id),
        event_id=incoming.id,
    )
    # Not moved: the step is not waiting yet (the parking settle resumes it from `matched`),
    # or the deadline or a cancel came first.
    return (done.step_id if done.moved else None), matched


def offer_event(
    tx: Tx, incoming: Occurrence, keys: Mapping[str, str], waits: Sequence[Mapping[str, Any]]
) -> list[str]:
    """Offer one admitted event to the waits of the new form `open_awaits` found, in the
    admission's transaction; the ids of the steps it resumed."""
    resumed: list[str] = []
    if incoming.id is None:
        return resumed
    for wait in waits:
        park_id = int(wait["id"])
        awaited = _awaited(wait)
        names = answered(incoming, keys, awaited, wait.get("scope"), park_id)
        if wait["mode"] == "any":
            names = names[:1]
        step_id, _ = _note_and_maybe_resume(
            tx, park_id, mode=str(wait["mode"]), awaited=awaited, names=names, incoming=incoming
        )
        if step_id is not None:
            resumed.append(step_id)
    return resumed


def parked(tx: Tx, park: OpenedPark, request: ParkRequest, *, tenant_id: str) -> str | None:
    """The step has just been parked on a park of the new form, in the settle's transaction:
    the park is marked parked; what matched before (noted by admission while the step was
    not waiting yet) may complete it at once; else the events recorded since the park row was
    written (or its lookback before) are offered to it, oldest first. The step id when one
    resumed it."""
    assert request.mode is not None
    marked = tx.one(MARK_PARKED, park_id=park.id)
    if marked is None:
        return None
    awaited = list(request.awaits)
    matched = marked["matched"] or {}
    if _complete(request.mode, matched, awaited):
        event_id = _last_event_id(matched)
        done = resume_park(
            tx,
            park.id,
            by="event",
            output=_resume_output(request.mode, matched, event_id),
            event_id=event_id,
        )
        return done.step_id if done.moved else None
    since = park.created_at - timedelta(seconds=request.lookback_seconds)
    for row in _recorded_since(tx, tenant_id, awaited, since):
        incoming = Occurrence.from_row(row)
        if is_echo(incoming.changed_fields, markers_from_json(row["echo_markers"])):
            continue  # onceflow's own write coming back: no answer (admission skips it too)
        keys = event_keys(incoming, sorted({a.on for a in awaited}))
        names = [
            n for n in answered(incoming, keys, awaited, request.scope, park.id) if n not in matched
        ]
        if request.mode == "any":
            names = names[:1]
        step_id, now = _note_and_maybe_resume(
            tx, park.id, mode=request.mode, awaited=awaited, names=names, incoming=incoming
        )
        if step_id is not None:
            return step_id
        matched = now or matched
    return None


def _last_event_id(matched: Mapping[str, Any]) -> int | None:
    """The newest event among those that matched: the one that completed the wait."""
    ids = [
        int(e["event"]["id"])
        for e in matched.values()
        if isinstance(e, Mapping)
        and isinstance(e.get("event"), Mapping)
        and isinstance(e["event"].get("id"), int)
    ]
    return max(ids) if ids else None


def _recorded_since(
    tx: Tx, tenant_id: str, awaited: Sequence[AwaitedEvent], since: Any
) -> list[Mapping[str, Any]]:
    """The events an awaited event may have missed while the wait parked: on the run's record
    through the events' record index; correlated ones by type and time (BRIN). Bounded."""
    found: dict[int, Mapping[str, Any]] = {}
    for a in awaited:
        if a.on != "":
            continue
        _, object_type, object_id = a.value.split(":", 2)
        for row in tx.all(
            LOOKBACK_EVENTS,
            tenant_id=tenant_id,
            object_type=object_type,
            object_id=object_id,
            event_type=a.event_type,
            since=since,
            early_event_id=None,
            echo_skew_seconds=float(ECHO_CLOCK_SKEW_SECONDS),
            limit=MAX_LOOKBACK_EVENTS,
        ):
            found[int(row["id"])] = row
    correlated = sorted({a.event_type for a in awaited if a.on != ""})
    if correlated:
        for row in tx.all(
            LOOKBACK_BY_TYPE,
            tenant_id=tenant_id,
            event_types=correlated,
            since=since,
            echo_skew_seconds=float(ECHO_CLOCK_SKEW_SECONDS),
            limit=MAX_LOOKBACK_EVENTS,
        ):
            found[int(row["id"])] = row
    return [found[i] for i in sorted(found)]
