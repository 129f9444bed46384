"""What a workflow listens to: the events its trigger starts on and the events its waits
(`wait_for`) wait for, with the record fields each needs to hear about.

This is the one home of that rule. The shadow records' watched fields
(`shared.accounts.connections.watched_fields`: a property change of a field nobody listens to is
dropped as `not_watched`) and the provider subscriptions (`shared.publishing.subscriptions`:
HubSpot sends a property change only when someone subscribed to that one property,
https://developers.hubspot.com/docs/api/webhooks) are both computed from `listeners`, so a
wait hears what it waits for even when no trigger watches it (issue 23 item 2: a wait on
`hs_lead_status` was never subscribed, and a delivered change was dropped).

The fields of a property-change listener:
- a trigger: its `watch` list (empty: every field of the object type);
- a wait: its own `watch` list when it has one, else the fields its `when` condition reads
  off the incoming event (`record.<f>`, `event.changed_fields.<f>`). A wait that names
  neither listens to every field, which a provider that subscribes per property cannot
  deliver: validation warns about it (`unheard_wait`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from shared.workflows.definition import ANY_CRM
from shared.workflows.expressions import ExpressionError, record_fields

# Fields of `record` that name the record rather than a property of it.
RECORD_IDENTITY = frozenset({"id", "object_type", "key", "connection_id"})
PROPERTY_CHANGED = "property_changed"
ALL_FIELDS = "*"


@dataclass(frozen=True)
class Listener:
    event: str  # <provider>.<object>.<action>
    fields: tuple[str, ...]  # for property changes: the fields it needs; () = every field
    where: str  # "trigger" or "steps.<id>", for messages

    def object_and_action(self, provider: str) -> tuple[str, str] | None:
        """(object type, action) when this listener's event is `provider`'s, or any CRM's
        (`crm.<kind>.<action>`, shared/triggers/events.py), else None."""
        prefix = next(
            (p for p in (f"{provider}.", f"{ANY_CRM}.") if self.event.startswith(p)), None
        )
        if prefix is None:
            return None
        parts = self.event[len(prefix) :].split(".")
        if len(parts) != 2 or not all(parts):
            return None
        return parts[0], parts[1]


def wait_fields(config: Mapping[str, Any]) -> tuple[str, ...]:
    """The fields a `wait_for` config listens to: its `watch`, else what `when` reads."""
    watch = [w for w in config.get("watch") or [] if isinstance(w, str)]
    if watch:
        return tuple(dict.fromkeys(watch))
    when = config.get("when")
    if not isinstance(when, str):
        return ()
    try:
        read = record_fields(when)
    except ExpressionError:  # pragma: no cover - the lexer does not refuse input
        return ()
    return tuple(sorted(read - RECORD_IDENTITY))


def listeners(definition: Mapping[str, Any]) -> list[Listener]:
    """Every listener of one stored definition (or of its `trigger` and `steps` alone)."""
    if not isinstance(definition, Mapping):
        return []
    out: list[Listener] = []
    trigger = definition.get("trigger")
    if isinstance(trigger, Mapping):
        watch = tuple(w for w in trigger.get("watch") or [] if isinstance(w, str))
        out.extend(
            Listener(e, watch, "trigger") for e in trigger.get("events") or [] if isinstance(e, str)
        )
    cancel_on = definition.get("cancel_on")
    for entry in cancel_on if isinstance(cancel_on, list) else []:
        # A `cancel_on` event listens like a wait: its `when`'s fields (shared/admission/stops.py).
        if isinstance(entry, Mapping) and isinstance(entry.get("event"), str):
            out.append(Listener(entry["event"], wait_fields(entry), "cancel_on"))
    out.extend(_goal_listeners(definition))
    steps = definition.get("steps")
    for step in steps if isinstance(steps, list) else []:
        if not isinstance(step, Mapping) or step.get("type") != "wait_for":
            continue
        config = step.get("config")
        if isinstance(config, Mapping) and isinstance(config.get("event"), str):
            out.append(Listener(config["event"], wait_fields(config), f"steps.{step.get('id')}"))
        events = config.get("events") if isinstance(config, Mapping) else None
        for awaited in events if isinstance(events, list) else []:
            # A wait of several events: each listens with its own `watch` / `when`.
            if isinstance(awaited, Mapping) and isinstance(awaited.get("event"), str):
                where = f"steps.{step.get('id')}"
                out.append(Listener(awaited["event"], wait_fields(awaited), where))
    return out


def _goal_listeners(definition: Mapping[str, Any]) -> list[Listener]:
    """A `goal` is judged on every admitted event about the run's record: it hears the
    property changes of the fields it reads on the object types the trigger starts on."""
    goal = definition.get("goal")
    trigger = definition.get("trigger")
    if not isinstance(goal, str) or not isinstance(trigger, Mapping):
        return []
    fields = wait_fields({"when": goal})
    kinds: dict[str, None] = {}
    for event in trigger.get("events") or []:
        parts = event.split(".") if isinstance(event, str) else []
        if len(parts) == 3 and all(parts):
            kinds[f"{parts[0]}.{parts[1]}.{PROPERTY_CHANGED}"] = None
    return [Listener(kind, fields, "goal") for kind in kinds]


def watched_by_object(
    provider: str, definitions: Iterable[Mapping[str, Any]], into: dict[str, set[str]]
) -> None:
    """Add to `into` (object type -> fields, `ALL_FIELDS` for every field) what the property-change
    listeners of these definitions need from `provider`."""
    for listener in (x for d in definitions for x in listeners(d)):
        parsed = listener.object_and_action(provider)
        if parsed is not None and parsed[1] == PROPERTY_CHANGED:
            into.setdefault(parsed[0], set()).update(listener.fields or [ALL_FIELDS])
