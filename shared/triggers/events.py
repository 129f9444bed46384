"""Event triggers: the workflow starts on the event types it lists (CRM webhooks, `emit()`).

`<provider>.<kind>.<action>` is one provider's event; `crm.<kind>.<action>` the same event of
whichever CRM sends it (`hubspot.contact.created` or `pipedrive.contact.created`), so one
definition runs unchanged on either CRM. Kinds are onceflow's neutral ones (contact,
company, deal, task, note): every provider's events are normalized to them."""

from __future__ import annotations

import difflib
import re

from shared.providers import registry
from shared.providers.registry import known_event_types
from shared.triggers import AddProblem, TriggerKind
from shared.workflows.definition import ANY_CRM, EVENT_TYPE_PATTERN, Trigger

PROPERTY_CHANGED = ".property_changed"
_EVENT_TYPE = re.compile(EVENT_TYPE_PATTERN)


def unknown_event_type(event: str) -> str | None:
    """Why `event` is an event type no webhook can become (with the nearest one that exists,
    by difflib), or None. Only providers whose events form a closed set are judged, plus a
    provider name that is a near miss of one of them (`hubspt.…`)."""
    known = known_event_types()
    provider = event.split(".", 1)[0]
    if provider == ANY_CRM:
        return _unknown_crm_event(event, known)
    if provider not in known:
        near = difflib.get_close_matches(provider, list(known), n=1, cutoff=0.75)
        if not near:
            return None
        candidates = sorted(known[near[0]])
        what = f"there is no provider {provider!r}"
    elif event in known[provider]:
        return None
    else:
        candidates = sorted(known[provider])
        what = f"{provider} sends no event {event!r}"
    guess = difflib.get_close_matches(event, candidates, n=1, cutoff=0.6)
    hint = f"; did you mean {guess[0]!r}?" if guess else ""
    parts = event.split(".")
    kind = registry.object_kind(parts[1], provider) if len(parts) == 3 else None
    if kind is not None and kind != parts[1]:
        # The provider's own name for a kind: events carry onceflow's neutral one.
        neutral = ".".join((parts[0], kind, parts[2]))
        hint = f"; event types name onceflow's object kinds: did you mean {neutral!r}?"
    return f"unknown event type {event!r}: {what}{hint}"


def _unknown_crm_event(event: str, known: dict[str, frozenset[str]]) -> str | None:
    """Why `crm.<kind>.<action>` binds to no CRM provider's event, or None."""
    if registry.event_types_for(event):
        return None
    crm = sorted(
        {
            f"{ANY_CRM}.{t.partition('.')[2]}"
            for p in registry.crm_providers()
            for t in known[p.name]
        }
    )
    parts = event.split(".")
    kind = registry.object_kind(parts[1]) if len(parts) == 3 else None
    if kind is not None and kind != parts[1] and f"{ANY_CRM}.{kind}.{parts[2]}" in crm:
        hint = f"; did you mean {f'{ANY_CRM}.{kind}.{parts[2]}'!r}?"
    else:
        guess = difflib.get_close_matches(event, crm, n=1, cutoff=0.6)
        hint = f"; did you mean {guess[0]!r}?" if guess else ""
    return f"unknown event type {event!r}: no CRM provider sends it{hint}"


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
        else:
            unknown = unknown_event_type(event)
            if unknown is not None:
                add("error", ("trigger", "events", i), unknown)
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
    # `crm.<kind>.<action>` binds to that event of every CRM provider (registry.event_types_for).
    event_types=lambda t, _workflow_id: tuple(
        bound for event in t.events for bound in registry.event_types_for(event)
    ),
)
