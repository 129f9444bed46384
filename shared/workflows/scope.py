"""The expression scope: what every expression of a workflow reads, built here and nowhere else.

Trigger rules and the trigger's `record` expression (at admission), branch conditions and
`${{ … }}` step templates (in the step engine), replays and rehearsals all get their scope from
this module, so one expression gives one value wherever it is written. `ROOTS` below is the one
description of what each root holds: the JSON Schema (`make schema`) and the README's
Expressions section are rendered from it, and tests keep them equal. Pure: no database driver,
no HTTP client.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from shared.workflows.definition import CONDITION_KEYS, Step
from shared.workflows.expressions import (
    CompiledExpression,
    ExpressionError,
    PreparedScope,
    compile_expression,
    evaluate,
    template_expressions,
)

ROOTS: dict[str, str] = {
    "event": (
        "The trigger occurrence as onceflow recorded it: `id`, `type` (e.g. "
        "hubspot.contact.property_changed), `tenant_id`, `connection_id`, `source_event_id` "
        "(the provider event's identity; for HubSpot the change itself, portal:object.action:"
        "typeId/objectId:property:occurredAt and a digest of the new value, so a webhook and "
        "the journal's copy of one change are one event; the raw id is in `payload`), "
        "`occurred_at` (a timestamp), `author_id` (who made the "
        "change, when the provider says), `changed_fields` ({property: new value} for a "
        "property change, {} otherwise) and, for a run of a debounced trigger only, `burst` "
        "(the burst's events, oldest first, each with `id`, `occurred_at` and "
        "`changed_fields`; the event itself is the burst's last); for a run of a batched "
        "trigger only, `batch` (the batch's events, oldest first, each with `id`, "
        "`occurred_at`, `changed_fields`, `record_object_type` and `record_object_id`; the "
        "event itself is the batch's last)."
    ),
    "trigger": (
        "The event's payload exactly as the provider sent it: one element of a HubSpot webhook "
        "(objectId, propertyName, propertyValue, occurredAt, subscriptionType, changeSource, "
        "sourceId, …), or what an application passed to emit."
    ),
    "record": (
        "The record the run is about, as the event describes it, never a fresh read from the "
        "CRM: `id`, `object_type` (singular: contact, deal, …), `key` (connection:type:id), "
        "`connection_id`, the properties the payload carries under `properties` (HubSpot "
        "webhooks carry none) and, on top, the event's changed fields. A HubSpot property "
        "change gives the one property that changed: read any other with a crm.get step. A "
        "trigger whose record is an expression gets only `id`, `object_type` and `key`. The "
        "record the rule saw is kept with the run: steps, replays and rehearsals read the same."
    ),
    "steps": (
        "Steps and wait conditions only: `steps.<id>.output` and `steps.<id>.branch_choice` "
        'of the run\'s succeeded steps (`steps["a-b"]` for an id that is not an identifier).'
    ),
    "run": (
        "Steps and wait conditions only: `id`, `workflow_id`, `version_id`, `tenant_id`, "
        "`lineage_root` (the first run of a replay lineage), `namespace` (live or "
        "rehearsal), and for a `finally:` step how the run ended: `final_status` "
        "(succeeded, failed, cancelled or goal_met; null before the finally phase) and "
        "`error` (why it failed or who cancelled it; null when it succeeded)."
    ),
    "iteration": (
        "The steps of a foreach body only: `item` (this iteration's element of the foreach's "
        "`items`), `index` (from 0) and `foreach` (the foreach step's id)."
    ),
}
RULE_ROOTS = frozenset({"event", "trigger", "record"})
STEP_ROOTS = frozenset(ROOTS)


def markdown_table() -> str:
    """`ROOTS` as the README shows it."""
    rows = ["| root | what it holds |", "|---|---|"]
    rows += [f"| `{name}` | {text} |" for name, text in ROOTS.items()]
    return "\n".join(rows) + "\n"


def record_key(connection_id: str | None, object_type: str, object_id: str) -> str:
    """The record identity every part of onceflow uses."""
    return f"{connection_id or 'app'}:{object_type}:{object_id}"


@dataclass(frozen=True)
class Occurrence:
    """One trigger occurrence: the facts of a `workflow_trigger_events` row that expressions
    may read."""

    id: int | None
    type: str | None
    tenant_id: str
    connection_id: str | None = None
    source_event_id: str | None = None
    occurred_at: datetime | None = None
    author_id: str | None = None
    changed_fields: Mapping[str, Any] = field(default_factory=dict)
    payload: Mapping[str, Any] = field(default_factory=dict)
    record_object_type: str | None = None
    record_object_id: str | None = None
    # A debounced run's burst (shared/admission/debounce.py): its events, oldest first, each
    # {id, occurred_at, changed_fields}; None for every other run and at admission.
    burst: tuple[Mapping[str, Any], ...] | None = None
    # A batch's run's events (a batch is a gathering like a burst: shared/admission/debounce.py),
    # oldest first, each also with `record_object_type` and `record_object_id`.
    batch: tuple[Mapping[str, Any], ...] | None = None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Occurrence:
        """From an event row's columns (`id`, `event_type`, `tenant_id`, `connection_id`,
        `source_event_id`, `occurred_at`, `author_id`, `changed_fields`, `payload`,
        `record_object_type`, `record_object_id`)."""
        connection = row.get("connection_id")
        return cls(
            id=None if row.get("id") is None else int(row["id"]),
            type=row.get("event_type"),
            tenant_id=str(row["tenant_id"]),
            connection_id=None if connection is None else str(connection),
            source_event_id=row.get("source_event_id"),
            occurred_at=row.get("occurred_at"),
            author_id=row.get("author_id"),
            changed_fields=row.get("changed_fields") or {},
            payload=row.get("payload") or {},
            record_object_type=row.get("record_object_type"),
            record_object_id=row.get("record_object_id"),
            burst=None if row.get("burst") is None else tuple(row["burst"]),
            batch=None if row.get("batch") is None else tuple(row["batch"]),
        )

    @property
    def record_key(self) -> str | None:
        if self.record_object_id is None or self.record_object_type is None:
            return None
        return record_key(self.connection_id, self.record_object_type, self.record_object_id)

    def event(self) -> dict[str, Any]:
        """The `event` root (with `burst` for a debounced run only)."""
        event: dict[str, Any] = {
            "id": self.id,
            "type": self.type,
            "tenant_id": self.tenant_id,
            "connection_id": self.connection_id,
            "source_event_id": self.source_event_id,
            "occurred_at": self.occurred_at,
            "author_id": self.author_id,
            "changed_fields": dict(self.changed_fields),
        }
        if self.burst is not None:
            event["burst"] = [dict(e) for e in self.burst]
        if self.batch is not None:
            event["batch"] = [dict(e) for e in self.batch]
        return event

    def record(self) -> dict[str, Any]:
        """The event's own record as the `record` root ({} when the event names none)."""
        if self.record_object_id is None:
            return {}
        props = self.payload.get("properties")
        record: dict[str, Any] = dict(props) if isinstance(props, Mapping) else {}
        record.update(self.changed_fields)
        record.update(
            id=self.record_object_id,
            object_type=self.record_object_type,
            key=self.record_key,
            connection_id=self.connection_id,
        )
        return record


def rule_scope(occurrence: Occurrence, record: Mapping[str, Any]) -> dict[str, Any]:
    """What a trigger rule and a trigger's record expression read."""
    return {"event": occurrence.event(), "trigger": dict(occurrence.payload), "record": record}


@dataclass(frozen=True)
class RunFacts:
    """The `run` root of a step's scope."""

    id: str
    workflow_id: str
    version_id: str
    tenant_id: str
    lineage_root: str
    namespace: str
    # Set once the run's end is decided (its finally phase, shared/steps/finale.py).
    final_status: str | None = None
    error: str | None = None

    def as_scope(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "workflow_id": self.workflow_id,
            "version_id": self.version_id,
            "tenant_id": self.tenant_id,
            "lineage_root": self.lineage_root,
            "namespace": self.namespace,
            "final_status": self.final_status,
            "error": self.error,
        }


def step_scope(
    occurrence: Occurrence,
    record: Mapping[str, Any] | None,
    *,
    run: RunFacts,
    steps: Mapping[str, Any],
    loop: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """What a step's config and a branch condition read (`iteration` too, for a foreach
    body's step): the rule's scope, with the record
    kept with the run (None for a run admitted before it was kept: the event's own record,
    which is what such a run's rule saw unless its trigger took the record from an
    expression), plus `steps` and `run`."""
    kept = occurrence.record() if record is None else dict(record)
    scope = {**rule_scope(occurrence, kept), "steps": dict(steps), "run": run.as_scope()}
    if loop is not None:
        scope["iteration"] = dict(loop)
    return scope


def step_expressions(step: Step) -> list[tuple[tuple[str | int, ...], str]]:
    """Every expression a step evaluates, with where it is written (the path under the
    step): its config's `${{ … }}` templates, its branch conditions, and the conditions its
    block evaluates itself (a wait's `when`, kept with its park). What validation checks and
    what the engine loads for the step's `steps` root (`steps_read`) come from this one list."""
    found: list[tuple[tuple[str | int, ...], str]] = [
        (("config", *p), src) for p, src in template_expressions(step.config)
    ]
    found += [(("branches", j, "when"), b.when) for j, b in enumerate(step.branches)]
    found += [
        (("config", key), step.config[key])
        for key in CONDITION_KEYS.get(step.type, ())
        if isinstance(step.config.get(key), str)
    ]
    if step.type == "wait_for":
        found += wait_expressions(step.config)
    return found


def wait_expressions(config: Mapping[str, Any]) -> list[tuple[tuple[str | int, ...], str]]:
    """A wait's expressions beyond its top-level `when`: each of its `events`' `when`, and
    both sides of each `correlate` (the wait's and an event's own)."""
    found: list[tuple[tuple[str | int, ...], str]] = []

    def correlate(at: tuple[str | int, ...], value: Any) -> None:
        if isinstance(value, Mapping):
            found.extend(
                ((*at, side), value[side])
                for side in ("event", "run")
                if isinstance(value.get(side), str)
            )

    correlate(("config", "correlate"), config.get("correlate"))
    events = config.get("events")
    for j, awaited in enumerate(events if isinstance(events, list) else []):
        if not isinstance(awaited, Mapping):
            continue
        if isinstance(awaited.get("when"), str):
            found.append((("config", "events", j, "when"), awaited["when"]))
        correlate(("config", "events", j, "correlate"), awaited.get("correlate"))
    return found


def steps_read(step: Step) -> frozenset[str] | None:
    """The ids of the steps whose outputs this step's expressions read: all its `steps` root
    needs to hold (an expression can read nothing else of it, so the scope it sees is the
    same). None when one of them reads `steps` other than by a literal name (`size(steps)`,
    `steps[trigger.x]`) or does not compile: it gets every succeeded step, as it always did.
    Issue 23, item 16: the claim carried every earlier output, O(n²) JSON over a foreach."""
    names: set[str] = set()
    for _, source in step_expressions(step):
        try:
            compiled = compile_expression(source)
        except ExpressionError:
            return None
        if compiled.reads_any_step:
            return None
        names |= compiled.step_refs
    return frozenset(names)


def kept_for_wait(scope: Mapping[str, Any]) -> dict[str, Any]:
    """What a wait keeps with its park row of the step scope it parked with: `steps`, `run`
    and, inside a foreach body, `iteration`, which its condition reads beside the incoming
    event (`wait_scope`)."""
    kept = {"steps": dict(scope.get("steps") or {}), "run": dict(scope.get("run") or {})}
    if scope.get("iteration") is not None:
        kept["iteration"] = dict(scope["iteration"])
    return kept


def wait_scope(incoming: Occurrence, waiting: Mapping[str, Any]) -> dict[str, Any]:
    """What a `wait_for` condition reads: the incoming event exactly as a trigger rule reads
    it (`event`, `trigger`, `record`), plus the waiting run's `steps`, `run` and (in a foreach
    body) `iteration` as they were when the wait parked (kept with its park row)."""
    scope = {
        **rule_scope(incoming, incoming.record()),
        "steps": dict(waiting.get("steps") or {}),
        "run": dict(waiting.get("run") or {}),
    }
    if waiting.get("iteration") is not None:
        scope["iteration"] = dict(waiting["iteration"])
    return scope


# A record's object type as a workflow wrote it -> onceflow's neutral kind (None: not one of
# them, kept as written). The provider wing knows each provider's names
# (shared/providers/registry.py `object_kind`); this wing, below it, is handed the rule.
KindOf = Callable[[str], str | None]


def record_from_expression(
    expression: CompiledExpression,
    scope: Mapping[str, Any] | PreparedScope,
    occurrence: Occurrence,
    kind_of: KindOf | None = None,
) -> tuple[str | None, dict[str, Any], str | None]:
    """A trigger's `record` expression evaluated over the rule scope: (record key, the record
    the rule then sees, why there is none). The expression yields an object id (of the
    event's object type) or a map with `id` and `object_type`, which may name the kind
    neutrally or in the provider's own words (`person`): `kind_of` makes it the neutral kind
    the events and their record keys carry, so both name the same record."""
    try:
        value = evaluate(expression, scope)
    except ExpressionError as exc:
        return None, {}, f"the trigger's record expression failed: {exc}"
    object_type = occurrence.record_object_type
    object_id: Any = value
    if isinstance(value, Mapping):
        object_type = value.get("object_type") or object_type
        object_id = value.get("id")
    if isinstance(object_id, bool) or not isinstance(object_id, str | int) or object_id == "":
        return (
            None,
            {},
            f"the trigger's record expression `{expression.source}` gave {value!r:.80}, "
            "not a record id",
        )
    if not object_type:
        return None, {}, "the record expression gave an id but no object_type"
    if kind_of is not None:
        object_type = kind_of(str(object_type)) or object_type
    key = record_key(occurrence.connection_id, str(object_type), str(object_id))
    return key, {"id": str(object_id), "object_type": str(object_type), "key": key}, None


def trigger_record(
    occurrence: Occurrence,
    expression: CompiledExpression | None,
    scope: Mapping[str, Any] | PreparedScope | None = None,
    kind_of: KindOf | None = None,
) -> tuple[str | None, dict[str, Any], str | None]:
    """The record a trigger sees: the event's own (expression None) or the one its `record`
    expression names. (record key, record, why there is none). `scope` is the rule scope
    when the caller already built it; `kind_of` as for `record_from_expression`."""
    if expression is None:
        if occurrence.record_key is None:
            return None, {}, f"event {occurrence.id} ({occurrence.type}) names no record"
        return occurrence.record_key, occurrence.record(), None
    if scope is None:
        scope = rule_scope(occurrence, occurrence.record())
    return record_from_expression(expression, scope, occurrence, kind_of)
