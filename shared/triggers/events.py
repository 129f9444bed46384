"""Event triggers: the workflow starts on the event types it lists (CRM webhooks, `emit()`)."""

from __future__ import annotations

import re

from shared.triggers import AddProblem, TriggerKind
from shared.workflows.definition import EVENT_TYPE_PATTERN, Trigger

PROPERTY_CHANGED = ".property_changed"
_EVENT_TYPE = re.compile(EVENT_TYPE_PATTERN)


def check(t: Trigger, add: AddProblem) -> None:
    seen: set[str] = set()
    for i, event in enumerate(t.events):
        if not _EVENT_TYPE.match(event):
            add(
                "error",
                ("trigger", "events", i),
                "an event type is dotted lower snake case like hubspot.contact.created; "
                f"found {event!r}",
            )
        if event in seen:
            add("warning", ("trigger", "events", i), f"event {event!r} is listed twice")
        seen.add(event)
    changes = [e for e in t.events if e.endswith(PROPERTY_CHANGED)]
    if changes and not t.watch:
        add(
            "warning",
            ("trigger", "watch"),
            f"{changes[0]} with no `watch` list fires on a change to any property, and "
            "provider subscriptions are per property, so none is created for it; "
            "list the fields you mean",
        )
    if t.watch and not changes:
        add(
            "warning",
            ("trigger", "watch"),
            "`watch` only matters for *.property_changed events; none is listed",
        )


KIND = TriggerKind(
    name="events",
    fields=("events", "watch"),
    applies=lambda t: bool(t.events),
    check=check,
    event_types=lambda t, _workflow_id: tuple(t.events),
)
