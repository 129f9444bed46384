"""Admission: exactly one run per trigger event and workflow, or a refusal that says why.

`admit_delivery` is what the `admit_event` function calls for each `trigger-events` message;
`admit_event` admits one event id against every workflow bound to its type.

One event, K bound workflows, one transaction of a fixed number of statements:

1. `admission_context` reads the event, its tenant, connection and echo markers and every
   binding (one index range scan on trigger_bindings), and takes the dedup locks:
   `pg_advisory_xact_lock` on a 64-bit hash of (workflow, record), in workflow order, for the
   bindings whose dedup mode needs one (`every_time` doesn't: its only rule, one run per
   event, is the start key's unique index). On the event's first decision it also reads the
   open waits (`wait_for`) on its (tenant, type, record), by index; each one whose condition
   holds is resumed by one guarded statement (shared/steps/parks.py), and only then (never
   by an echo of onceflow's own write: see `echo_suppressed` below).
2. In Python, per binding, the refusals that don't depend on other runs, in this order of
   precedence (exactly one reason is recorded):
   `provider_suppressed` (connection paused or disconnected; the event's author is in the
   tenant's or the connection's excluded authors), `echo_suppressed` (every changed field
   matches a live echo marker for the record: shared/ingest/echo.py), `missing_record_identity`,
   `rule_not_matched` (the trigger's CEL rule was false, or could not be evaluated on this
   event: the detail says which), `insufficient_credits` (the tenant's balance can't pay the
   entry step's block price; an unregistered block type has no price and is not refused here:
   the step engine fails that step with its own error), then `workflow_paused` (the
   workflow's circuit breaker is open: shared/gates/breaker.py; a paused workflow still says
   `rule_not_matched` for events its rule would not have taken). A binding whose stored
   definition no longer parses is refused `definition_unreadable` before all of these (none
   can be judged without its trigger), alone: the event's other bindings are decided as usual.
3. `admission_admit`, one statement for all bindings, under the locks: the delivery claim
   (unique on event and workflow) for every pairing; `duplicate` when once_per_record finds
   an enrollment, `already_running` when not_while_running finds a live running run for the
   record; otherwise the run row (start key `workflow_event:<eventId>` under the unique
   (workflow, start_key) index, pinned version, payload and truncation flag copied from the
   event row, lineage root = its own id), its enrollment and its first step row.
4. The refusals decided in 2 and 3 are written by the same statement (its detail for `duplicate`
   and `already_running` worded there), and the event is stamped `decided_at`: a refusal commits
   with its delivery claim or not at all. (The first release wrote refusals on a second pooled
   connection so they would survive a rollback; that was hold-and-wait — concurrent admissions
   in one process each held one connection and waited for another — and it could leave a stale
   reason behind a decision that changed on redelivery. Nothing is lost by writing them
   together: an attempt that rolls back has decided nothing, and the event is decided again by
   the redelivery or, whatever the transport does, by the sweep, which re-publishes every
   published event still undecided after its threshold and gives it up as `undelivered`,
   visibly, after its cap.)
5. Commit, then publish `step-ready` for the first steps. A publish that fails raises (nack,
   so Pub/Sub redelivers the event, and the redelivery re-publishes the run's pending steps);
   a publish lost in a crash after commit is repaired by the sweep, which re-dispatches
   pending steps whose `dispatched_at` is older than its threshold.

One pooled connection per admission, never two. Round trips per event: two — BEGIN travels
with the context statement (shared/core/db.py), and COMMIT with the admit statement
(`Tx.commit_with`) — plus one lock statement when a trigger takes its record from an
expression, one read of pending steps on a redelivery, and, when open waits are offered the
event, their statements and a COMMIT of its own. None of these grows with K. Context and
decision can't be one statement: the rule is CEL evaluated in Python on the record the
context statement returns, and the decision must be taken under the locks that statement
took, in a later statement whose READ COMMITTED snapshot sees the previous holder's commit.

What a rule reads (`event`, `trigger`, `record`) is built by shared/workflows/scope.py, the
one home of the expression scope; the record the rule saw is written with the run
(`trigger_record`), so the run's steps read the same one. The record key is
`<connection id>:<type>:<id>` (`app:<type>:<id>` for events without a connection).

Concurrency: every rule is a lock or a unique index. Two deliveries of one event serialize on
the advisory lock (or, under every_time, on the start key's unique index); the loser sees the
claim and does nothing. A unique violation (a race the locks didn't cover, such as the test
seam that skips them) rolls back the attempt and admission decides again from the committed
state; after `ATTEMPTS` it is a transient error and Pub/Sub redelivers. The lock statement
and the decision are separate statements on purpose: READ COMMITTED takes a snapshot per
statement, so the decision sees what the previous lock holder committed.

Rehearsal runs are created by the ops side; admission only ever creates `live` runs.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from functools import cached_property
from typing import Any, Literal

from pydantic import ValidationError

from shared.admission import concurrency, debounce, run_throttle, stops
from shared.admission.debounce import BurstJoin
from shared.admission.priority import priority_of
from shared.core import queries, tracing
from shared.core.crashpoints import crash_point
from shared.core.db import Database, Tx
from shared.core.errors import ConflictError, PermanentError, TransientError
from shared.core.logs import LogEvent, get_logger, labelled, log_event
from shared.core.pubsub import decode_push_message, publish_step_ready
from shared.ingest.echo import (
    ECHO_CLOCK_SKEW_SECONDS,
    authored_elsewhere,
    is_echo,
    markers_from_json,
)
from shared.providers import registry
from shared.steps import awaits
from shared.steps.parks import MAX_WAITS_PER_EVENT, offer_event
from shared.workflows.definition import Concurrency, RunThrottle, WorkflowDefinition
from shared.workflows.expressions import (
    CompiledExpression,
    ExpressionError,
    PreparedScope,
    compile_expression,
    evaluate_condition,
)
from shared.workflows.scope import Occurrence, record_from_expression, rule_scope, trigger_record

SQL = queries.load("admission")
CONTEXT = SQL["admission_context"]
LOCK_RECORDS = SQL["admission_lock_records"]
ADMIT = SQL["admission_admit"]
PENDING_FIRST_STEPS = SQL["admission_pending_first_steps"]
MARK_DECIDED = SQL["admission_mark_decided"]
INSERT_POISONED = SQL["admission_poisoned_insert"]
REFUSALS_FOR_RECORD = SQL["admission_refusals_for_record"]

Reason = Literal[
    "duplicate",
    "already_running",
    "rule_not_matched",
    "insufficient_credits",
    "echo_suppressed",
    "provider_suppressed",
    "missing_record_identity",
    "workflow_paused",
    "definition_unreadable",
    "superseded",
    "batched",
]
REASONS: frozenset[str] = frozenset(Reason.__args__)  # type: ignore[attr-defined]
# `debounced`: the event joined a burst or a batch (shared/admission/debounce.py); its fire
# decides the pairing later (its run, or `superseded`/`batched`). An event that fills a batch
# is `admitted` (the batch's run is its run) or refused as any last event of a burst is.
# `queued`: the trigger's throttle on starting runs is full (shared/admission/run_throttle.py);
# the pairing waits in order and the sweep starts its run when a window has room. Or the
# workflow's keyed concurrency is full (shared/admission/concurrency.py): the pairing waits
# in order and starts when a run of its key ends.
Outcome = Literal["admitted", "refused", "handled", "debounced", "queued"]

# Attempts of the whole admission when a unique index, a deadlock or a dropped connection
# interrupts it. Every attempt decides from scratch, so repeating is safe.
ATTEMPTS = 3
POISON_SOURCE = "trigger-events"
log = get_logger(__name__)


def start_key(event_id: int) -> str:
    return f"workflow_event:{event_id}"


@dataclass(frozen=True)
class BindingOutcome:
    """What admission did for one (event, workflow) pairing.

    `handled`: the pairing was already decided by an earlier delivery; `run_id` is its run
    when it was admitted (its pending steps were published again), None when it was refused."""

    workflow_id: str
    outcome: Outcome
    run_id: str | None = None
    reason: Reason | None = None
    detail: str | None = None


@dataclass(frozen=True)
class AdmissionResult:
    event_id: int
    outcomes: tuple[BindingOutcome, ...]
    # Step ids published to step-ready after commit (first steps, or resumed pending ones).
    dispatched: tuple[str, ...] = ()

    @property
    def admitted(self) -> list[BindingOutcome]:
        return [o for o in self.outcomes if o.outcome == "admitted"]

    @property
    def refused(self) -> list[BindingOutcome]:
        return [o for o in self.outcomes if o.outcome == "refused"]

    def outcome_for(self, workflow_id: str) -> BindingOutcome:
        for o in self.outcomes:
            if o.workflow_id == workflow_id:
                return o
        raise KeyError(workflow_id)


@dataclass(frozen=True)
class AdmissionSeams:
    """Test-only hooks, never set by production code: the default is the real behaviour.

    `take_locks=False` skips the advisory locks so a test can show the unique indexes catch
    the race; `before_commit` runs after the refusals were written, in the admission's
    transaction, just before it commits (raise in it to inject a failure)."""

    take_locks: bool = True
    before_commit: Callable[[], None] | None = None
    attempts: int = ATTEMPTS


DEFAULT_SEAMS = AdmissionSeams()


class EventNotFound(PermanentError, LookupError):
    """The message names an event id that doesn't exist: a poisoned message."""


class DefinitionUnreadable(PermanentError):
    """A bound version's stored definition no longer parses: that binding is refused
    `definition_unreadable`, the event's other bindings are decided as usual."""


@dataclass(frozen=True)
class Trigger:
    """What admission needs from a version, parsed once (versions are immutable)."""

    version_id: str
    rule: CompiledExpression | None
    record_expression: CompiledExpression | None
    entry_node: str
    entry_type: str
    entry_price: int
    # The trigger's `watch` list (empty: every field).
    watch: frozenset[str] = frozenset()
    # `debounce` or `batch` (shared/admission/debounce.py) and its compiled `key`, when
    # declared.
    gathering: debounce.Gathering | None = None
    gathering_key: CompiledExpression | None = None
    # `throttle` (shared/admission/run_throttle.py) and its compiled `key`, when declared.
    throttle: RunThrottle | None = None
    throttle_key: CompiledExpression | None = None
    # The workflow's `concurrency` (shared/admission/concurrency.py) and its compiled `key`.
    concurrency: Concurrency | None = None
    concurrency_key: CompiledExpression | None = None
    # The workflow's `priority` (shared/admission/priority.py), compiled.
    priority: CompiledExpression | None = None


@dataclass(frozen=True)
class _Refusal:
    workflow_id: str
    version_id: str
    record_key: str | None
    reason: Reason
    detail: str


@dataclass
class _Plan:
    """One binding's row in the admit statement."""

    workflow_id: str
    version_id: str
    dedup_mode: str
    run_id: str
    record_key: str | None
    refusal: _Refusal | None
    entry_node: str
    entry_type: str
    # The record the trigger named by expression, as JSON; None for the event's own record
    # (sent once per statement, not once per binding).
    record: str | None
    # The binding's parsed trigger (None for an unreadable definition).
    trigger: Trigger | None = None
    # The run's priority, evaluated over the rule scope (shared/admission/priority.py).
    priority: int = 0


_triggers: dict[str, Trigger] = {}
_triggers_lock = threading.Lock()
_TRIGGER_CACHE_SIZE = 2048


def trigger_for(version_id: str, definition: Any) -> Trigger:
    """The version's trigger, parsed once per process and cached (versions are immutable);
    admission, would-run and re-decide all read it here. DefinitionUnreadable when the stored
    definition no longer parses."""
    with _triggers_lock:
        cached = _triggers.get(version_id)
    if cached is not None:
        return cached
    if definition is None:
        raise TransientError(f"version {version_id} was expected in the cache")  # cache race
    try:
        parsed = WorkflowDefinition.model_validate(definition)
        rule = compile_expression(parsed.trigger.rule) if parsed.trigger.rule else None
        record_expr = (
            None if parsed.trigger.record == "event" else compile_expression(parsed.trigger.record)
        )
        gathering = debounce.Gathering.of(parsed.trigger.debounce, parsed.trigger.batch)
        limited = parsed.concurrency
        limited_key = None if limited is None else compile_expression(limited.key)
        priority = None if parsed.priority is None else compile_expression(parsed.priority)
        gathering_key = (
            compile_expression(gathering.key)
            if gathering is not None and gathering.key is not None
            else None
        )
    except (ValidationError, ExpressionError) as exc:
        # Publishing validates definitions, so this is a row another release wrote or a
        # damaged one, not a customer error; it concerns this binding only.
        raise DefinitionUnreadable(
            f"version {version_id} has an unreadable definition: {exc}"[:2000]
        ) from exc
    entry = parsed.entry
    trigger = Trigger(
        version_id=version_id,
        rule=rule,
        record_expression=record_expr,
        entry_node=entry.id,
        entry_type=entry.type,
        entry_price=_block_price(entry.type),
        throttle=parsed.trigger.throttle,
        throttle_key=_compiled_key(parsed.trigger.throttle),
        watch=frozenset(parsed.trigger.watch),
        gathering=gathering,
        gathering_key=gathering_key,
        concurrency=limited,
        concurrency_key=limited_key,
        priority=priority,
    )
    with _triggers_lock:
        if len(_triggers) >= _TRIGGER_CACHE_SIZE:
            _triggers.clear()
        _triggers[version_id] = trigger
    return trigger


def _compiled_key(limited: RunThrottle | None) -> CompiledExpression | None:
    return None if limited is None or limited.key is None else compile_expression(limited.key)


def _block_price(block_type: str) -> int:
    """The entry block's price; 0 for a type the registry doesn't know (not charged, so not
    refused for credits: the step engine fails such a step visibly)."""
    from shared.blocks import registry

    if not registry.is_registered(block_type):
        log.warning("entry block type %r is not registered; admitted without a price", block_type)
        return 0
    return registry.get(block_type).price


# --- the pure decisions ----------------------------------------------------------------------


@dataclass(frozen=True)
class EventFacts:
    """The event row and what admission read alongside it."""

    id: int
    tenant_id: str
    connection_id: str | None
    event_type: str
    source_event_id: str | None
    record_object_type: str | None
    record_object_id: str | None
    record_key: str | None
    author_id: str | None
    changed_fields: Mapping[str, Any]
    occurred_at: datetime
    payload: Mapping[str, Any]
    credit_balance: int
    excluded_authors: tuple[str, ...]
    connection_status: str | None
    echo_markers: tuple[tuple[str, bytes], ...] = field(default_factory=tuple)
    author_source: str | None = None
    connection_provider: str | None = None
    connection_user_id: str | None = None  # the provider user the connection's writes act as

    @cached_property
    def occurrence(self) -> Occurrence:
        return Occurrence(
            id=self.id,
            type=self.event_type,
            tenant_id=self.tenant_id,
            connection_id=self.connection_id,
            source_event_id=self.source_event_id,
            occurred_at=self.occurred_at,
            author_id=self.author_id,
            changed_fields=self.changed_fields,
            payload=self.payload,
            record_object_type=self.record_object_type,
            record_object_id=self.record_object_id,
        )

    # Once per event, however many workflows are bound to it: the refusal that depends on the
    # event alone, and the scope every trigger whose record is the event's own sees (built,
    # measured and converted for CEL once).
    @cached_property
    def scope(self) -> PreparedScope:
        return PreparedScope(rule_scope(self.occurrence, self.occurrence.record()))

    def object_kind(self, name: str) -> str | None:
        """The neutral kind a record expression's `object_type` means on the event's
        connection (Pipedrive's `person` is a `contact`): shared/providers/registry.py."""
        return registry.object_kind(name, self.connection_provider)

    @cached_property
    def refusal(self) -> tuple[Reason, str] | None:
        return event_refusal(self)

    @cached_property
    def echo(self) -> bool:
        """Every changed field is explained by a write of onceflow's own, and the event's
        author doesn't rule that out (shared/ingest/echo.py)."""
        elsewhere = authored_elsewhere(
            self.connection_provider,
            author_source=self.author_source,
            author_id=self.author_id,
            connection_user_id=self.connection_user_id,
        )
        return is_echo(self.changed_fields, self.echo_markers, elsewhere=elsewhere)


def provider_suppression(event: EventFacts) -> str | None:
    """Why the provider side says not to run, or None."""
    if event.connection_status == "needs_reauthorization":
        return (
            f"connection {event.connection_id} needs reauthorization: its OAuth refresh token "
            "was revoked (install the app on the portal again)"
        )
    if event.connection_status in ("paused", "disconnected"):
        return f"connection {event.connection_id} is {event.connection_status}"
    if event.author_id is not None and event.author_id in event.excluded_authors:
        return f"the change was made by author {event.author_id}, whom the tenant excluded"
    return None


def event_refusal(event: EventFacts) -> tuple[Reason, str] | None:
    """The refusal every workflow bound to the event gets, whatever its trigger (or None)."""
    suppressed = provider_suppression(event)
    if suppressed:
        return "provider_suppressed", suppressed
    if event.echo:
        fields = ", ".join(sorted(event.changed_fields))
        return (
            "echo_suppressed",
            f"every changed field ({fields}) matches a write onceflow made to "
            f"{event.record_key} (echo marker)",
        )
    return None


def resolve_record(
    event: EventFacts, trigger: Trigger
) -> tuple[str | None, dict[str, Any], str | None]:
    """(record key, record scope, why there is none) for one trigger (shared/workflows/scope.py;
    the event's own record is the very dict of the event's prepared scope)."""
    if trigger.record_expression is None:
        key, _, missing = trigger_record(event.occurrence, None)
        return key, event.scope.values["record"], missing
    return record_from_expression(
        trigger.record_expression, event.scope, event.occurrence, event.object_kind
    )


def unwatched_change(event: EventFacts, trigger: Trigger) -> str | None:
    """Why a property change is not this trigger's, or None. Watched fields are the union of
    what every active workflow of the tenant listens to (shared/workflows/listening.py: other
    triggers, and waits), so a change can be delivered for another listener: a trigger starts
    only on a change of a field it watches itself."""
    if not trigger.watch or not event.changed_fields:
        return None
    if not event.event_type.endswith(".property_changed"):
        return None
    if trigger.watch & set(event.changed_fields):
        return None
    return (
        f"none of the fields the trigger watches ({', '.join(sorted(trigger.watch))}) changed; "
        f"the change ({', '.join(sorted(event.changed_fields))}) was for another listener"
    )


def rule_refusal(event: EventFacts, trigger: Trigger, record: dict[str, Any]) -> str | None:
    """Why the trigger doesn't take this event (`rule_not_matched`'s detail), or None: a
    change of no field it watches, or a rule that is false or can't be evaluated."""
    unwatched = unwatched_change(event, trigger)
    if unwatched is not None:
        return unwatched
    if trigger.rule is None:
        return None
    scope: PreparedScope | dict[str, Any] = event.scope
    if record is not event.scope.values["record"]:  # from the trigger's record expression
        scope = {**event.scope.values, "record": record}
    try:
        matched = evaluate_condition(trigger.rule, scope)
    except ExpressionError as exc:
        return f"the rule could not be evaluated: {exc}"
    return None if matched else f"rule `{trigger.rule.source}` was false"


def static_refusal(
    event: EventFacts, trigger: Trigger, dedup_mode: str
) -> tuple[str | None, dict[str, Any], tuple[Reason, str] | None]:
    """The record key, the record the rule sees, and the refusal decided without looking at
    other runs (or None)."""
    if event.refusal is not None:
        return event.record_key, event.scope.values["record"], event.refusal
    key, record, missing = resolve_record(event, trigger)
    if key is None and (trigger.record_expression is not None or dedup_mode != "every_time"):
        return None, record, ("missing_record_identity", missing or "no record identity")
    not_matched = rule_refusal(event, trigger, record)
    if not_matched is not None:
        return key, record, ("rule_not_matched", not_matched)
    if trigger.entry_price > event.credit_balance:
        return (
            key,
            record,
            (
                "insufficient_credits",
                f"tenant {event.tenant_id} has {event.credit_balance} credits; the first step "
                f"{trigger.entry_node} ({trigger.entry_type}) costs {trigger.entry_price}",
            ),
        )
    return key, record, None


def trials_used_up(workflow_id: str, state: str, admitted: int) -> str:
    """`workflow_paused`'s detail for a run a half-open breaker has no trial slot for (`state`
    is the breaker's state as the trial claim found it)."""
    return f"workflow {workflow_id} is paused by its circuit breaker: " + (
        f"it is half-open and its {admitted} trial runs are in flight; the first "
        "to end decides (success closes the breaker, failure pauses it again)"
        if state == "half_open"
        else f"it was paused again. Resume it with POST /v1/workflows/{workflow_id}/resume"
    )


# --- the transaction ---------------------------------------------------------------------------


def event_facts(row: Mapping[str, Any]) -> EventFacts:
    """A stored trigger event's row as admission reads it (re-decide reads old events so)."""
    return EventFacts(
        id=int(row["id"]),
        tenant_id=row["tenant_id"],
        connection_id=row["connection_id"],
        event_type=row["event_type"],
        source_event_id=row["source_event_id"],
        record_object_type=row["record_object_type"],
        record_object_id=row["record_object_id"],
        record_key=row["record_key"],
        author_id=row["author_id"],
        changed_fields=row["changed_fields"],
        occurred_at=row["occurred_at"],
        payload=row["payload"],
        credit_balance=int(row["credit_balance"]),
        excluded_authors=tuple(row["excluded_authors"] or ()),
        connection_status=row["connection_status"],
        echo_markers=markers_from_json(row["echo_markers"]),
        author_source=row["author_source"],
        connection_provider=row["connection_provider"],
        connection_user_id=row["connection_user_id"],
    )


@dataclass
class _Attempt:
    outcomes: list[BindingOutcome]
    refusals: list[_Refusal]
    dispatch: list[str]
    tenant_id: str
    # Runs found already started by a concurrent delivery: their pending steps are read
    # after commit (a read needs no place in the decision's transaction).
    late_resume: list[str] = field(default_factory=list)


def _plan_bindings(
    event: EventFacts, bindings: Sequence[Mapping[str, Any]], seams: AdmissionSeams
) -> tuple[list[BindingOutcome], list[str], list[_Plan], list[str]]:
    """Per binding, from the context row: (already-handled outcomes, runs to resume, the
    plans for the admit statement, extra record locks to take first)."""
    outcomes: list[BindingOutcome] = []
    resume: list[str] = []
    plans: list[_Plan] = []
    extra_locks: list[str] = []
    for b in bindings:
        workflow_id = str(b["workflow_id"])
        if b["claimed"]:
            # Decided by an earlier delivery (seen even before the lock: claims are final).
            if b["start_run_id"]:
                resume.append(b["start_run_id"])
            outcomes.append(BindingOutcome(workflow_id, "handled", run_id=b["start_run_id"]))
            continue
        version_id = str(b["version_id"])
        try:
            trigger = trigger_for(version_id, b["definition"])
        except DefinitionUnreadable as exc:
            # Refused alone, decided and recorded like any refusal (a redelivery finds the
            # claim); the event's other workflows don't wait for this one to be repaired.
            plans.append(_unreadable_plan(event, workflow_id, version_id, b["dedup_mode"], exc))
            continue
        key, record, refused = static_refusal(event, trigger, b["dedup_mode"])
        if refused is None and b.get("breaker_state") == "open":
            refused = paused(workflow_id, b.get("breaker_opened_at"), b.get("breaker_reason"))
        if (
            refused is None
            and key is not None
            and not b["record_from_event"]
            and b["dedup_mode"] != "every_time"
            and seams.take_locks
        ):
            extra_locks.append(f"{workflow_id}|{key}")
        plans.append(
            _Plan(
                workflow_id=workflow_id,
                version_id=version_id,
                dedup_mode=b["dedup_mode"],
                run_id=str(uuid.uuid4()),
                record_key=key,
                refusal=None
                if refused is None
                else _Refusal(workflow_id, version_id, key, refused[0], refused[1]),
                entry_node=trigger.entry_node,
                entry_type=trigger.entry_type,
                record=None
                if record is event.scope.values["record"]
                else json.dumps(record, default=str),
                trigger=trigger,
                priority=0 if refused is not None else _priority(event, trigger, record),
            )
        )
    return outcomes, resume, plans, extra_locks


def _priority(event: EventFacts, trigger: Trigger, record: Any) -> int:
    """The run's priority over the rule scope (the record the trigger named)."""
    if trigger.priority is None:
        return 0
    scope: PreparedScope | dict[str, Any] = (
        event.scope
        if record is event.scope.values["record"]
        else {**event.scope.values, "record": record}
    )
    return priority_of(trigger.priority, scope)


def paused(workflow_id: str, opened_at: Any, reason: Any) -> tuple[Reason, str]:
    """The `workflow_paused` refusal of a workflow whose circuit breaker is open."""
    return (
        "workflow_paused",
        f"workflow {workflow_id} is paused by its circuit breaker since {opened_at}: {reason}. "
        f"Resume it with POST /v1/workflows/{workflow_id}/resume",
    )


def paused_now(row: Mapping[str, Any]) -> tuple[Reason, str] | None:
    """`workflow_paused` when a held pairing (a debounce burst's last event, a throttled start)
    is decided while its workflow's breaker is open (`breaker_state`, `breaker_opened_at`,
    `breaker_reason`, `workflow_id` of `row`); a half-open breaker lets it start without
    claiming a trial slot."""
    if row["breaker_state"] != "open":
        return None
    return paused(row["workflow_id"], row["breaker_opened_at"], row["breaker_reason"])


def _claim_trial_runs(
    tx: Tx, plans: list[_Plan], half_open: set[str]
) -> tuple[list[_Plan], list[str]]:
    """A half-open breaker admits a few trial runs (shared/gates/breaker.py): claim one for each
    plan that would start a run of a half-open workflow; a plan that gets none is refused
    `workflow_paused`. (the plans, the workflows whose slot was claimed — the admit statement
    gives a slot back when it then does not admit the run)."""
    from shared.gates import breaker

    wanted = [p.workflow_id for p in plans if p.refusal is None and p.workflow_id in half_open]
    if not wanted:
        return plans, []
    claims = breaker.claim_trials(tx, wanted)
    decided: list[_Plan] = []
    for p in plans:
        claim = claims.get(p.workflow_id)
        if p.workflow_id not in wanted or claim is None or claim.granted:
            decided.append(p)
            continue
        if claim.state == "closed":  # a trial succeeded since the context read: admit
            decided.append(p)
            continue
        detail = trials_used_up(p.workflow_id, claim.state, claim.admitted)
        refusal = _Refusal(p.workflow_id, p.version_id, p.record_key, "workflow_paused", detail)
        decided.append(replace(p, refusal=refusal))
    return decided, [w for w in wanted if claims.get(w) is not None and claims[w].granted]


def _unreadable_plan(
    event: EventFacts, workflow_id: str, version_id: str, dedup_mode: str, exc: Exception
) -> _Plan:
    """The admit statement's row for a binding whose definition does not parse: refused
    `definition_unreadable` (it names no entry step; only admitted rows use one)."""
    return _Plan(
        workflow_id=workflow_id,
        version_id=version_id,
        dedup_mode=dedup_mode,
        run_id=str(uuid.uuid4()),
        record_key=event.record_key,
        refusal=_Refusal(
            workflow_id, version_id, event.record_key, "definition_unreadable", str(exc)
        ),
        entry_node="",
        entry_type="",
        record=None,
    )


def _admit_in_transaction(tx: Tx, event_id: int, seams: AdmissionSeams) -> _Attempt:
    with _triggers_lock:
        cached = list(_triggers)
    row = tx.one(
        CONTEXT,
        event_id=event_id,
        start_key=start_key(event_id),
        cached_versions=cached,
        take_locks=seams.take_locks,
        echo_skew_seconds=float(ECHO_CLOCK_SKEW_SECONDS),
        max_waits=MAX_WAITS_PER_EVENT,
    )
    if row is None:
        raise EventNotFound(f"trigger event {event_id} does not exist")
    event = event_facts(row)
    bindings = row["bindings"]
    outcomes, resume, plans, extra_locks = _plan_bindings(event, bindings, seams)
    if extra_locks:
        tx.one(LOCK_RECORDS, lock_keys=extra_locks)
    plans, joins = _debounced(event, plans)
    plans, waiting = _throttled(tx, event, plans)
    plans, limited, slotted = _limited(tx, event, plans)
    waiting += limited
    half_open = {str(b["workflow_id"]) for b in bindings if b.get("breaker_state") == "half_open"}
    probe_ids: list[str] = []
    if half_open:
        plans, probe_ids = _claim_trial_runs(tx, plans, half_open)

    refusals: list[_Refusal] = []
    dispatch: list[str] = []
    if resume:
        # Claimed by an earlier delivery (claims are final): their pending steps go out again.
        dispatch += [r["id"] for r in tx.all(PENDING_FIRST_STEPS, run_ids=resume)]
    outcomes += waiting
    # Before the decision statement, which stays the transaction's last (it or MARK_DECIDED
    # stamps the event decided: from then on its burst row holds it).
    gathered, fired_steps = _gather(tx, event, joins)
    outcomes += gathered
    dispatch += fired_steps
    open_waits = row["open_waits"]
    await_keys, awaiting = _open_awaits(tx, event, row)
    # The decision is the transaction's last statement, and commits in its own round trip,
    # unless open waits are offered the event after it (or a test seam runs before commit).
    stoppable = row.get("stoppable_runs") or []
    offers = open_waits or awaiting or stoppable
    last = tx.commit_with if not offers and not slotted and seams.before_commit is None else tx.all
    late_resume: list[str] = []
    if plans:
        rows = last(
            ADMIT,
            event_id=event_id,
            start_key=start_key(event_id),
            workflow_ids=[p.workflow_id for p in plans],
            version_ids=[p.version_id for p in plans],
            dedup_modes=[p.dedup_mode for p in plans],
            run_ids=[p.run_id for p in plans],
            record_keys=[p.record_key for p in plans],
            refusals=[None if p.refusal is None else p.refusal.reason for p in plans],
            refusal_details=[None if p.refusal is None else p.refusal.detail for p in plans],
            entry_nodes=[p.entry_node for p in plans],
            entry_types=[p.entry_type for p in plans],
            records=[p.record for p in plans],
            priorities=[p.priority for p in plans],
            event_record=json.dumps(event.scope.values["record"], default=str),
            probe_ids=probe_ids,
        )
        by_workflow = {p.workflow_id: p for p in plans}
        for r in rows:
            plan = by_workflow[r["workflow_id"]]
            outcome, refusal = _outcome(plan, r)
            outcomes.append(outcome)
            if refusal is not None:
                refusals.append(refusal)
            if outcome.outcome == "admitted" and r["step_id"]:
                dispatch.append(r["step_id"])
            elif outcome.outcome == "handled" and outcome.run_id:
                # Decided by a concurrent delivery since statement 1: read after commit.
                late_resume.append(outcome.run_id)
    elif row["decided_at"] is None:
        # Nothing bound to decide (or only pairings decided before decided_at existed).
        last(MARK_DECIDED, event_id=event_id)
    # Slots taken for runs the decision refused go back, under the key locks still held.
    concurrency.release_unstarted(tx, slotted)
    dispatch += _after_the_decision(
        tx,
        event,
        stoppable=stoppable,
        open_waits=open_waits,
        await_keys=await_keys,
        awaiting=awaiting,
    )
    return _Attempt(outcomes, refusals, dispatch, event.tenant_id, late_resume)


def _open_awaits(
    tx: Tx, event: EventFacts, row: Mapping[str, Any]
) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """The waits of several events, or correlated beyond their record, that this event may
    answer (shared/steps/awaits.py): only on its first decision, only when its type is awaited
    so in its tenant (`wait_correlations` of statement 1: then one more statement, by index),
    and never for onceflow's own echo, which is no answer to a wait."""
    expressions = row.get("wait_correlations") or []
    if not expressions or event.echo:
        return {}, []
    return awaits.open_awaits(tx, event.occurrence, expressions)


def _after_the_decision(
    tx: Tx,
    event: EventFacts,
    *,
    stoppable: Sequence[Mapping[str, Any]],
    open_waits: Sequence[Mapping[str, Any]],
    await_keys: Mapping[str, str],
    awaiting: Sequence[Mapping[str, Any]],
) -> list[str]:
    """What the event's first decision also does to runs already running, in its transaction:
    stop those it cancels or whose goal it meets, then offer it to the open waits; the ids of
    the steps it resumed (and of the first finally steps of the runs it cancelled)."""
    dispatch: list[str] = []
    if stoppable:
        # Runs about this record whose workflow stops on this event (`cancel_on`) or whose
        # goal it meets, before any of their waits is offered it (shared/admission/stops.py).
        # A run cancelled into its finally phase: its first finally step is published too.
        for stopped in stops.stop_runs(
            tx, event.occurrence, event.scope, stoppable, echo=event.echo
        ):
            dispatch += stopped.to_dispatch
    if open_waits and not event.echo:
        # The first decision of an event also offers it to the open waits it can match
        # (wait_for; statement 1 read them by index), in this transaction; each resume is
        # guarded, so a concurrent or redelivered admission resumes a wait at most once.
        # onceflow's own echo is no answer to a wait, as it is no trigger.
        dispatch += offer_event(tx, event.occurrence, open_waits)
    if awaiting:
        dispatch += awaits.offer_event(tx, event.occurrence, await_keys, awaiting)
    return dispatch


def _debounced(event: EventFacts, plans: list[_Plan]) -> tuple[list[_Plan], list[BurstJoin]]:
    """The plans that would start a run of a debounced trigger join a burst instead
    (shared/admission/debounce.py); one whose burst key can't be had is refused
    `missing_record_identity`. (The plans left for the decision statement, the joins.)"""
    kept: list[_Plan] = []
    joins: list[BurstJoin] = []
    for p in plans:
        trigger = p.trigger
        if p.refusal is not None or trigger is None or trigger.gathering is None:
            kept.append(p)
            continue
        record = event.scope.values["record"] if p.record is None else json.loads(p.record)
        scope: PreparedScope | dict[str, Any] = (
            event.scope if p.record is None else {**event.scope.values, "record": record}
        )
        key, missing = debounce.burst_key(
            trigger.gathering, trigger.gathering_key, p.record_key, scope
        )
        if key is None:
            refusal = _Refusal(
                p.workflow_id,
                p.version_id,
                p.record_key,
                "missing_record_identity",
                missing or "no burst key",
            )
            kept.append(replace(p, refusal=refusal))
            continue
        joins.append(
            BurstJoin(
                workflow_id=p.workflow_id,
                version_id=p.version_id,
                dedup_mode=p.dedup_mode,
                record_key=p.record_key,
                burst_key=key,
                trigger_record=p.record or debounce.record_json(record),
                entry_node=p.entry_node,
                entry_type=p.entry_type,
                gathering=trigger.gathering,
                priority=p.priority,
            )
        )
    return kept, joins


def _gather(
    tx: Tx, event: EventFacts, joins: list[BurstJoin]
) -> tuple[list[BindingOutcome], list[str]]:
    """Each join's event joins its burst or batch (shared/admission/debounce.py); an event
    that fills its batch starts the batch's run now, in this transaction (its last event is
    this one), and the batch's other events are refused `batched`. (outcomes, first steps)."""
    outcomes: list[BindingOutcome] = []
    dispatch: list[str] = []
    by_workflow = {j.workflow_id: j for j in joins}
    for j in debounce.join_bursts(tx, event_id=event.id, tenant_id=event.tenant_id, joins=joins):
        if j.full:
            outcome, step_id = _fire_full_batch(tx, j, by_workflow[j.workflow_id])
            outcomes.append(outcome)
            if step_id is not None:
                dispatch.append(step_id)
            continue
        outcomes.append(
            BindingOutcome(j.workflow_id, "handled" if j.held else "debounced", detail=j.detail)
        )
    return outcomes, dispatch


def _fire_full_batch(
    tx: Tx, joined: debounce.Joined, join: BurstJoin
) -> tuple[BindingOutcome, str | None]:
    """Fire the batch `joined` filled, in admission's transaction (shared/admission/
    debounce.py `fire_in`, the sweep's own fire): (this event's outcome, its first step).
    The record lock the fire takes is this admission's own (advisory locks nest)."""
    # Filled and not committed: a kill here must lose nothing (tests/test_batches.py).
    crash_point("admission_batch_filled")
    due = {
        "id": joined.burst_id,
        "workflow_id": joined.workflow_id,
        "record_key": join.record_key,
        "dedup_mode": join.dedup_mode,
    }
    fired = debounce.fire_in(tx, due, decide_gathered)
    if fired is None:  # the join set its fire time to now: only a broken invariant gets here
        raise TransientError(f"batch {joined.burst_id} filled but did not fire")
    detail = f"{joined.detail}; {fired.superseded} other event(s) batched into it"
    if fired.outcome == "admitted":
        return BindingOutcome(joined.workflow_id, "admitted", fired.run_id, detail=detail), (
            fired.step_id
        )
    if fired.outcome == "handled":
        return BindingOutcome(joined.workflow_id, "handled", fired.run_id), None
    reason: Reason = fired.outcome  # type: ignore[assignment]
    return BindingOutcome(joined.workflow_id, "refused", reason=reason, detail=detail), None


def _throttled(
    tx: Tx, event: EventFacts, plans: list[_Plan]
) -> tuple[list[_Plan], list[BindingOutcome]]:
    """The plans that would start a run of a throttled trigger claim a slot of its window
    (shared/admission/run_throttle.py): granted, they are admitted as usual; otherwise they
    wait in order, not refused. (The plans left for the decision statement, the waiting.)"""
    kept: list[_Plan] = []
    waiting: list[BindingOutcome] = []
    for p in plans:
        trigger = p.trigger
        if p.refusal is not None or trigger is None or trigger.throttle is None:
            kept.append(p)
            continue
        record = event.scope.values["record"] if p.record is None else json.loads(p.record)
        scope: PreparedScope | dict[str, Any] = (
            event.scope if p.record is None else {**event.scope.values, "record": record}
        )
        key, missing = run_throttle.throttle_key(trigger.throttle, trigger.throttle_key, scope)
        if key is None:
            refusal = _Refusal(
                p.workflow_id,
                p.version_id,
                p.record_key,
                "missing_record_identity",
                missing or "no throttle key",
            )
            kept.append(replace(p, refusal=refusal))
            continue
        item = run_throttle.Throttled(
            workflow_id=p.workflow_id,
            version_id=p.version_id,
            dedup_mode=p.dedup_mode,
            record_key=p.record_key,
            throttle_key=key,
            trigger_record=p.record or json.dumps(record, default=str),
            entry_node=p.entry_node,
            entry_type=p.entry_type,
            throttle=trigger.throttle,
            run_id=p.run_id,
            priority=p.priority,
        )
        queued = run_throttle.admit_or_queue(
            tx, event_id=event.id, tenant_id=event.tenant_id, item=item
        )
        if queued is None:
            kept.append(p)  # a slot of this window: the run starts now
        else:
            outcome: Outcome = "queued" if queued.queued_now else "handled"
            waiting.append(BindingOutcome(p.workflow_id, outcome, detail=queued.detail))
    return kept, waiting


def _limited(
    tx: Tx, event: EventFacts, plans: list[_Plan]
) -> tuple[list[_Plan], list[BindingOutcome], list[str]]:
    """The plans that would start a run of a workflow with keyed concurrency take a slot of
    their key (shared/admission/concurrency.py): taken, they are admitted as usual; otherwise
    they wait in order, not refused. (The plans left for the decision statement, the waiting,
    the run ids that took a slot.)"""
    kept: list[_Plan] = []
    waiting: list[BindingOutcome] = []
    slotted: list[str] = []
    for p in plans:
        trigger = p.trigger
        if (
            p.refusal is not None
            or trigger is None
            or trigger.concurrency is None
            or trigger.concurrency_key is None
        ):
            kept.append(p)
            continue
        record = event.scope.values["record"] if p.record is None else json.loads(p.record)
        scope: PreparedScope | dict[str, Any] = (
            event.scope if p.record is None else {**event.scope.values, "record": record}
        )
        key, missing = concurrency.concurrency_key(
            trigger.concurrency, trigger.concurrency_key, scope
        )
        if key is None:
            refusal = _Refusal(
                p.workflow_id,
                p.version_id,
                p.record_key,
                "missing_record_identity",
                missing or "no concurrency key",
            )
            kept.append(replace(p, refusal=refusal))
            continue
        item = concurrency.Limited(
            workflow_id=p.workflow_id,
            version_id=p.version_id,
            dedup_mode=p.dedup_mode,
            record_key=p.record_key,
            concurrency_key=key,
            trigger_record=p.record or json.dumps(record, default=str),
            entry_node=p.entry_node,
            entry_type=p.entry_type,
            limit=trigger.concurrency.limit,
            run_id=p.run_id,
            priority=p.priority,
        )
        wait = concurrency.take_or_wait(tx, event_id=event.id, tenant_id=event.tenant_id, item=item)
        if wait is None:
            kept.append(p)  # a slot of its key: the run starts now
            slotted.append(p.run_id)
        else:
            outcome: Outcome = "queued" if wait.queued_now else "handled"
            waiting.append(BindingOutcome(p.workflow_id, outcome, detail=wait.detail))
    return kept, waiting, slotted


def _outcome(plan: _Plan, row: Mapping[str, Any]) -> tuple[BindingOutcome, _Refusal | None]:
    """One binding's row of the admit statement, which also wrote its refusal (the details
    that depend on other runs, duplicate and already_running, are worded there)."""
    decided = row["outcome"]
    if decided == "admitted":
        return BindingOutcome(plan.workflow_id, "admitted", run_id=row["run_id"]), None
    if decided == "handled":
        return BindingOutcome(plan.workflow_id, "handled", run_id=row["run_id"]), None
    assert decided in REASONS, decided
    assert decided in ("duplicate", "already_running") or (
        plan.refusal is not None and plan.refusal.reason == decided
    ), decided
    reason: Reason = decided
    refusal = _Refusal(plan.workflow_id, plan.version_id, plan.record_key, reason, row["detail"])
    outcome = BindingOutcome(
        plan.workflow_id, "refused", reason=refusal.reason, detail=refusal.detail
    )
    return outcome, refusal


def admit_event(
    db: Database,
    event_id: int,
    *,
    publish: Callable[[Iterable[str]], None] = publish_step_ready,
    seams: AdmissionSeams = DEFAULT_SEAMS,
) -> AdmissionResult:
    """Admit or refuse one run per workflow bound to the event's type; publish first steps.

    Raises EventNotFound (permanent) for an unknown id, TransientError when it should be
    retried (the database, or the step-ready publish after commit)."""
    stored = tracing.stored_in(db, "event", event_id)
    with labelled(event_id=event_id), tracing.span("admit", stored=stored, event_id=event_id):
        for attempt in range(1, seams.attempts + 1):
            try:
                with db.transaction() as tx:
                    tracing.stamp(tx)  # the run and its first steps continue this trace
                    done = _admit_in_transaction(tx, event_id, seams)
                    if seams.before_commit is not None:
                        seams.before_commit()
                if any(o.outcome == "debounced" for o in done.outcomes):
                    # Joined and committed; the burst's fire is the sweep's (kill tests).
                    crash_point("admission_after_debounce_join")
                if any(o.outcome == "queued" for o in done.outcomes):
                    # Queued and committed; the start is the sweep's (kill tests).
                    crash_point("admission_after_run_queued")
                if done.late_resume:
                    with db.transaction() as tx:
                        done.dispatch += [
                            r["id"]
                            for r in tx.commit_with(PENDING_FIRST_STEPS, run_ids=done.late_resume)
                        ]
                break
            except (ConflictError, TransientError) as exc:
                # A concurrent admission won a race on a unique index, or the database
                # hiccuped: decide again from what is committed now.
                log.info("admission attempt %d of event %d: %s", attempt, event_id, exc)
                if attempt == seams.attempts:
                    raise TransientError(
                        f"admission of event {event_id} kept conflicting: {exc}"
                    ) from exc
        # After commit: a lost publish is repaired by redelivery (we raise) or by the sweep.
        publish(done.dispatch)
        tracing.count("onceflow.runs.started", sum(o.outcome == "admitted" for o in done.outcomes))
        # One line per event, however many workflows are bound (refusal details are in the
        # admission_refusals table).
        log.info(
            "event %d: %s",
            event_id,
            ", ".join(
                f"{o.workflow_id} {o.reason or o.outcome}"
                + (f" run {o.run_id}" if o.run_id else "")
                for o in done.outcomes
            )
            or "no workflow bound",
        )
        return AdmissionResult(event_id, tuple(done.outcomes), tuple(done.dispatch))


def decide_held_pairing(
    tx: Tx,
    *,
    event_id: int,
    workflow_id: str,
    version_id: str,
    dedup_mode: str,
    run_id: str,
    record_key: str | None,
    entry_node: str,
    entry_type: str,
    trigger_record: Any,
    priority: int,
    refusal: tuple[Reason, str] | None = None,
) -> Mapping[str, Any]:
    """The decision statement for one pairing admission held back (a debounce burst's last
    event, a throttled start): the same rules as any admission (start key, dedup, first step,
    claim, refusal), with the run id the holder chose. The caller holds the record's dedup
    lock when its mode needs one. `priority`: the one the pairing was admitted with, stored
    with it when it was held (shared/admission/priority.py). Its row: `outcome` (admitted,
    handled, duplicate, already_running, or `refusal`'s reason when given), `run_id`,
    `detail`, `step_id`."""
    (row,) = tx.all(
        ADMIT,
        event_id=event_id,
        start_key=start_key(event_id),
        workflow_ids=[workflow_id],
        version_ids=[version_id],
        dedup_modes=[dedup_mode],
        run_ids=[run_id],
        record_keys=[record_key],
        refusals=[None if refusal is None else refusal[0]],
        refusal_details=[None if refusal is None else refusal[1]],
        entry_nodes=[entry_node],
        entry_types=[entry_type],
        records=[None],
        priorities=[priority],
        event_record=json.dumps(trigger_record, default=str),
        probe_ids=[],
    )
    return row


def decide_gathered(tx: Tx, burst: Mapping[str, Any]) -> Mapping[str, Any]:
    """The decision for a fired burst's or batch's last event (the `debounce_fire` row): the
    same statement as any admission, with the run id the gathering chose when it opened;
    `workflow_paused` when the workflow's breaker is open now."""
    return decide_held_pairing(
        tx,
        event_id=int(burst["last_event_id"]),
        workflow_id=burst["workflow_id"],
        version_id=burst["version_id"],
        dedup_mode=burst["dedup_mode"],
        run_id=burst["run_id"],
        record_key=burst["record_key"],
        entry_node=burst["entry_node"],
        entry_type=burst["entry_type"],
        trigger_record=burst["trigger_record"],
        priority=int(burst["priority"]),
        refusal=paused_now(burst),
    )


def record_poisoned(
    db: Database, *, message_id: str | None, data: Any, reason: str, source: str = POISON_SOURCE
) -> None:
    text = data if isinstance(data, str) else json.dumps(data, default=str)
    db.run(
        lambda tx: tx.execute(
            INSERT_POISONED,
            source=source,
            message_id=message_id,
            data=text[:10_000],
            reason=reason[:2_000],
        )
    )


def admit_delivery(
    db: Database,
    cloud_event_data: Any,
    *,
    message_id: str | None = None,
    publish: Callable[[Iterable[str]], None] = publish_step_ready,
) -> AdmissionResult | None:
    """One `trigger-events` delivery. Returns normally (ack) when the event was admitted,
    refused or already handled, and when the message is poisoned (recorded in
    poisoned_messages, logged, None returned: it can never succeed, so it must not loop).
    Raises TransientError (nack, redelivery) only for what may succeed later."""
    try:
        message = decode_push_message(cloud_event_data)
        raw_id = message.get("event_id")
        if isinstance(raw_id, bool) or not isinstance(raw_id, int | str):
            raise PermanentError(f"message has no usable event_id: {raw_id!r}")
        try:
            event_id = int(raw_id)
        except ValueError:
            raise PermanentError(f"event_id is not an integer: {raw_id!r}") from None
        if not 0 < event_id < 2**63:
            raise PermanentError(f"event_id out of range: {event_id}")
        return admit_event(db, event_id, publish=publish)
    except TransientError:
        raise
    except PermanentError as exc:
        log_event(
            log,
            LogEvent.DEAD_LETTERED,
            f"poisoned trigger-events message {message_id}: {exc}",
            level=logging.ERROR,
            kind="poisoned_message",
            reason=str(exc)[:1000],
        )
        record_poisoned(db, message_id=message_id, data=cloud_event_data, reason=str(exc))
        return None


def refusals_for_record(
    tx: Tx, *, tenant_id: str, record_key: str, limit: int = 100
) -> list[dict[str, Any]]:
    """Support's "why didn't my workflow run for this lead?", newest first."""
    return tx.all(REFUSALS_FOR_RECORD, tenant_id=tenant_id, record_key=record_key, limit=limit)
