""" "Would this record enroll?": admission's decision for a record as it is now, written nowhere.

HubSpot lets an admin test a workflow against a chosen record; this is onceflow's answer, with
the reasons admission records. It asks: if the CRM announced the record as it is now (a
property change of the fields the trigger watches, carrying their current values), what would
admission decide for this workflow? The pieces are admission's own (shared/admission/admit.py),
called in its order of precedence, so the two can't drift apart:

- the trigger, parsed and cached per version by `trigger_for` (`definition_unreadable`);
- `event_refusal` (connection paused or disconnected, excluded authors: `provider_suppressed`;
  every carried field matching a live echo marker: `echo_suppressed`), the record by
  `resolve_record` (`missing_record_identity`), the watch list and the rule by `rule_refusal`
  (`rule_not_matched`), the credits (`insufficient_credits`): `static_refusal`;
- the circuit breaker: `paused_now` (open) and `trials_used_up` (half-open, no trial slot);
- the dedup mode against the record's enrollment and live runs (`duplicate`,
  `already_running`, with their words): the SQL function `admission_dedup`
  (migrations/0460_admission_dedup.sql), which `admission_admit` reads too.

The record comes from the CRM through the connection's port (the properties the rule and the
watch list read), so the rule sees its current values; its history (enrollments, runs, echo
markers) from onceflow's tables. Everything is read in one READ ONLY transaction: Postgres
refuses any write in it, so the answer cannot have changed anything. (Reading a record through
an OAuth connection may refresh its access token, as any read does; that is the port's own
business, on its own connection.)

What it can't know: a half-open breaker's trial slot could be taken by a concurrent event
between the answer and the event; a tenant's balance may change. A workflow's
`host_rate_limit`, `rate_limit` and `budget` refuse no run at admission (those gates act on a
step), so they are no reason here; what is left of the budget comes beside the answer
(`notes`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from functools import partial
from typing import Any

from shared.admission import concurrency, debounce, run_throttle
from shared.admission.admit import (
    DefinitionUnreadable,
    EventFacts,
    Reason,
    Trigger,
    paused_now,
    provider_suppression,
    static_refusal,
    trials_used_up,
    trigger_for,
)
from shared.core import queries
from shared.core.db import Database, Tx
from shared.gates import budgets
from shared.gates.breaker import HALF_OPEN_PROBES
from shared.ingest.echo import ECHO_CLOCK_SKEW_SECONDS, markers_from_json
from shared.port.interface import CrmPort, PortError, Record
from shared.providers import registry
from shared.providers.connect import build_port, load_port_settings
from shared.workflows.expressions import record_fields
from shared.workflows.scope import record_key as make_record_key

SQL = queries.load("admission")
CONTEXT = SQL["admission_would_run_context"]
HISTORY = SQL["admission_would_run_history"]
PROPERTY_CHANGED = ".property_changed"


class WouldRunError(Exception):
    """The question can't be asked: `code` is `not_found` (workflow or connection unknown, or
    another tenant's), `not_bound` (the workflow has no active event trigger),
    `invalid_record_key`, `record_not_found` (the CRM has no such record) or
    `crm_unavailable` (the CRM could not be read)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class WouldRun:
    """The answer: `would_run` True is "yes, a new run"; otherwise `reason` is the reason
    admission would record and `detail` its words."""

    workflow_id: str
    record_key: str
    event_type: str
    version_id: str
    dedup_mode: str
    would_run: bool
    reason: Reason | None = None
    detail: str | None = None
    # The fields a change would carry (the watched ones' current values) and the record the
    # rule saw.
    changed_fields: Mapping[str, Any] = field(default_factory=dict)
    record: Mapping[str, Any] = field(default_factory=dict)
    # The run that blocks it (duplicate, already_running).
    blocking_run_id: str | None = None
    # The circuit breaker's state (closed when it has none).
    breaker_state: str = "closed"
    # What holds a run's steps rather than its start, said beside the answer (the budget).
    notes: tuple[str, ...] = ()


# Reads the record's current properties: (object type, object id, properties wanted) -> record.
ReadRecord = Callable[[str, str, Sequence[str]], Record]


def would_run(
    db: Database,
    *,
    workflow_id: str,
    record_key: str,
    event_type: str | None = None,
    tenant_scope: str | None = None,
    read_record: Callable[[Tx, str], ReadRecord] | None = None,
) -> WouldRun:
    """Admission's answer for `record_key` (`<connection id>:<object type>:<object id>`) and
    the workflow, now, in one READ ONLY transaction. `event_type` picks one of the workflow's
    bound event types (default: the bound type of the record's kind, a property change when
    the trigger watches fields). `read_record` builds the CRM read from the connection id
    (default: the connection's port)."""
    connection_id, object_type, object_id = _split(record_key)
    with db.transaction() as tx:
        tx.execute("SET TRANSACTION READ ONLY")
        answer = _answer(
            tx,
            workflow_id,
            connection_id,
            object_type,
            object_id,
            event_type,
            tenant_scope,
            read_record or partial(_port_reader, db),
        )
    # Raised here: an exception inside the transaction is translated by the pool.
    if isinstance(answer, WouldRunError):
        raise answer
    return answer


def _answer(  # noqa: PLR0917 - one call site
    tx: Tx,
    workflow_id: str,
    connection_id: str,
    object_type: str,
    object_id: str,
    event_type: str | None,
    tenant_scope: str | None,
    read_record: Callable[[Tx, str], ReadRecord],
) -> WouldRun | WouldRunError:
    ctx = tx.one(
        CONTEXT, workflow_id=workflow_id, connection_id=connection_id, tenant_scope=tenant_scope
    )
    if ctx is None:
        return WouldRunError("not_found", "no such workflow and connection of one tenant")
    kind = registry.object_kind(object_type, ctx["connection_provider"]) or object_type
    binding = _binding(ctx["bindings"], kind, event_type)
    if binding is None:
        return WouldRunError(
            "not_bound",
            f"workflow {workflow_id} is not active on any event type"
            + (f" named {event_type}" if event_type else ""),
        )
    current = Record(kind, object_id, {})
    unread = _facts(ctx, binding["event_type"], kind, object_id, current, {})
    try:
        # Admission's own parse of the version, cached per version.
        trigger = trigger_for(str(binding["version_id"]), binding["definition"])
    except DefinitionUnreadable as exc:
        return _refused(unread, binding, workflow_id, ("definition_unreadable", str(exc)))
    if provider_suppression(unread) is None:
        # A paused or disconnected connection is refused whatever the record says (and its
        # port refuses to read).
        try:
            reader = read_record(tx, connection_id)
            current = reader(kind, object_id, sorted(trigger.watch | _rule_fields(trigger)))
        except PortError as exc:
            code = "record_not_found" if exc.code == "not_found" else "crm_unavailable"
            return WouldRunError(code, f"the CRM could not read {kind} {object_id}: {exc}")
    changed = _carried(binding["event_type"], trigger, current.properties)
    facts = _facts(ctx, binding["event_type"], kind, object_id, current, changed)
    return _decide(tx, facts, trigger, binding, workflow_id)


def _refused(
    facts: EventFacts, binding: Mapping[str, Any], workflow_id: str, refused: tuple[Reason, str]
) -> WouldRun:
    return WouldRun(
        workflow_id=workflow_id,
        record_key=facts.record_key or "",
        event_type=facts.event_type,
        version_id=str(binding["version_id"]),
        dedup_mode=str(binding["dedup_mode"]),
        would_run=False,
        reason=refused[0],
        detail=refused[1],
    )


def _decide(
    tx: Tx, facts: EventFacts, trigger: Trigger, binding: Mapping[str, Any], workflow_id: str
) -> WouldRun:
    """Admission's precedence (shared/admission/admit.py `_plan_bindings`, then
    `_claim_trial_runs`, then `admission_admit`), on facts that name no event."""
    dedup = str(binding["dedup_mode"])
    key, _, _ = static_refusal(facts, trigger, dedup)  # the record key, before echo is known
    history = tx.one(
        HISTORY,
        connection_id=facts.connection_id,
        object_type=facts.record_object_type,
        object_id=facts.record_object_id,
        fields=list(facts.changed_fields),
        echo_skew_seconds=float(ECHO_CLOCK_SKEW_SECONDS),
        workflow_id=workflow_id,
        dedup_mode=dedup,
        record_key=key,
    )
    assert history is not None  # one row, always
    facts = replace(facts, echo_markers=markers_from_json(history["echo_markers"]))
    key, record, refused = static_refusal(facts, trigger, dedup)
    breaker_state = str(binding.get("breaker_state") or "closed")
    answer = WouldRun(
        workflow_id=workflow_id,
        record_key=key or facts.record_key or "",
        event_type=facts.event_type,
        version_id=str(binding["version_id"]),
        dedup_mode=dedup,
        would_run=False,
        changed_fields=dict(facts.changed_fields),
        record=record,
        breaker_state=breaker_state,
    )
    if refused is None:
        refused = paused_now({**binding, "workflow_id": workflow_id})
    trials = int(binding.get("breaker_trials") or 0)
    if refused is None and breaker_state == "half_open" and trials >= HALF_OPEN_PROBES:
        refused = ("workflow_paused", trials_used_up(workflow_id, breaker_state, trials))
    held: tuple[str, ...] = ()
    if refused is None:
        # Debounce and throttle hold a start rather than refuse it (admission's `_debounced`
        # and `_throttled`, after the breaker): a key they can't have is refused there as here.
        refused, held = _held(facts, trigger, key, record)
    if refused is None and history["dedup_reason"] is not None:
        refused = (history["dedup_reason"], history["dedup_detail"])
        answer = replace(answer, blocking_run_id=history["blocking_run_id"])
    answer = replace(answer, notes=held + _budget_notes(tx, workflow_id))
    if refused is None:
        return replace(answer, would_run=True)
    return replace(answer, reason=refused[0], detail=refused[1])


def _held(
    facts: EventFacts, trigger: Trigger, key: str | None, record: dict[str, Any]
) -> tuple[tuple[Reason, str] | None, tuple[str, ...]]:
    """(a refusal for a debounce or throttle key that can't be had, the notes saying how the
    start would be held), with admission's own key functions."""
    scope: Any = facts.scope
    if record is not facts.scope.values["record"]:
        scope = {**facts.scope.values, "record": record}
    notes: list[str] = []
    gathering = trigger.gathering
    if gathering is not None:
        burst, missing = debounce.burst_key(gathering, trigger.gathering_key, key, scope)
        if burst is None:
            return ("missing_record_identity", missing or "no burst key"), ()
        notes.append(
            f"debounce: the change would join burst {burst}; the run starts "
            f"{gathering.said} after the burst's last change (a later change of the "
            "burst supersedes this one), decided then against the record's runs as above"
            if gathering.kind == "debounce"
            else f"batch: the event would join batch {burst}; its run starts when the batch "
            f"holds {gathering.max_size} events or {gathering.max_wait_seconds}s after its "
            "first, with the batch's last event (the others are batched into it)"
        )
    if trigger.throttle is not None:
        slot, missing = run_throttle.throttle_key(trigger.throttle, trigger.throttle_key, scope)
        if slot is None:
            return ("missing_record_identity", missing or "no throttle key"), ()
        notes.append(
            f"throttle: at most {trigger.throttle.limit} runs start per {trigger.throttle.period} "
            f"for key {slot}; when that window is full the run waits in order (queued)"
        )
    if trigger.concurrency is not None and trigger.concurrency_key is not None:
        slot, missing = concurrency.concurrency_key(
            trigger.concurrency, trigger.concurrency_key, scope
        )
        if slot is None:
            return ("missing_record_identity", missing or "no concurrency key"), ()
        notes.append(
            f"concurrency: at most {trigger.concurrency.limit} runs run at once for key {slot}; "
            "when that many are running the run waits in order (queued) until one ends"
        )
    return None, tuple(notes)


def _budget_notes(tx: Tx, workflow_id: str) -> tuple[str, ...]:
    """A workflow's `budget` refuses no run (its gate holds a priced step: shared/gates/
    budgets.py), so it is no reason here; what is left of it is said beside the answer."""
    budget = budgets.workflow_summary(tx, workflow_id)
    if budget["credits"] is None:
        return ()
    used = int(budget["reserved"]) + int(budget["spent"])
    return (
        f"budget: {used} of {budget['credits']} credits used in the current {budget['per']} "
        "window; a priced step that would go over it fails BUDGET_EXCEEDED with nothing sent",
    )


def _split(record_key: str) -> tuple[str, str, str]:
    parts = record_key.split(":", 2)
    if len(parts) != 3 or not all(parts):
        raise WouldRunError(
            "invalid_record_key", "record_key must look like <connection id>:<type>:<id>"
        )
    return parts[0], parts[1], parts[2]


def _binding(
    bindings: Sequence[Mapping[str, Any]], kind: str, event_type: str | None
) -> Mapping[str, Any] | None:
    """The binding the question is about: the named event type, else one of the record's
    kind, a property change first when the trigger watches fields (else a creation first)."""
    if event_type is not None:
        return next((b for b in bindings if b["event_type"] == event_type), None)
    of_kind = [b for b in bindings if f".{kind}." in f"{b['event_type']}."] or list(bindings)
    if not of_kind:
        return None
    try:
        watches = bool(trigger_for(str(of_kind[0]["version_id"]), of_kind[0]["definition"]).watch)
    except DefinitionUnreadable:  # its refusal is the answer, whichever type is asked
        watches = False
    of_kind.sort(key=lambda b: str(b["event_type"]).endswith(PROPERTY_CHANGED) != watches)
    return of_kind[0]


def _rule_fields(trigger: Trigger) -> frozenset[str]:
    return record_fields(trigger.rule.source) if trigger.rule is not None else frozenset()


def _carried(event_type: str, trigger: Trigger, properties: Mapping[str, Any]) -> dict[str, Any]:
    """The fields a change announced now would carry: for a property change, the watched
    fields the record has (every field the rule reads when the trigger watches none); nothing
    for other kinds of events."""
    if not event_type.endswith(PROPERTY_CHANGED):
        return {}
    fields = trigger.watch or _rule_fields(trigger)
    return {f: properties[f] for f in sorted(fields) if properties.get(f) is not None}


def _facts(  # noqa: PLR0917 - three call sites, each reads in this order
    ctx: Mapping[str, Any],
    event_type: str,
    kind: str,
    object_id: str,
    current: Record,
    changed: Mapping[str, Any],
) -> EventFacts:
    """The facts admission would read for an event announcing the record as it is now: its
    properties in the payload (the rule's `record` reads them), no author (an announcement
    has none of its own; admission checks a real event's author)."""
    connection_id = str(ctx["connection_id"])
    return EventFacts(
        id=0,
        tenant_id=str(ctx["tenant_id"]),
        connection_id=connection_id,
        event_type=event_type,
        source_event_id=None,
        record_object_type=kind,
        record_object_id=object_id,
        record_key=make_record_key(connection_id, kind, object_id),
        author_id=None,
        changed_fields=dict(changed),
        occurred_at=datetime.now(UTC),
        payload={"properties": dict(current.properties)},
        credit_balance=int(ctx["credit_balance"]),
        excluded_authors=tuple(ctx["excluded_authors"] or ()),
        connection_status=ctx["connection_status"],
        connection_provider=ctx["connection_provider"],
        connection_user_id=ctx["connection_user_id"],
    )


def _port_reader(db: Database, tx: Tx, connection_id: str) -> ReadRecord:
    port: CrmPort = build_port(load_port_settings(tx, connection_id), db)
    return port.get
