"""onceflow's neutral object kinds in Pipedrive's names: its webhook `meta.entity` and API
paths (/api/v2/persons, /organizations, /deals, /activities; notes are v1 only: /v1/notes),
docs/vendors/pipedrive.md "Mapping to onceflow's port". The `Provider` declares it
(`object_kinds`) and the port reads its entities from it: one table."""

from __future__ import annotations

from shared.port.interface import plural_of

OBJECT_KINDS: dict[str, str] = {
    "contact": "person",
    "company": "organization",
    "deal": "deal",
    "task": "activity",
    "note": "note",
}

# Pipedrive's entity, by every name a caller may use: its own and the neutral kind, singular
# and plural.
ENTITIES: dict[str, str] = {
    name: own
    for neutral, own in OBJECT_KINDS.items()
    for name in (own, plural_of(own), neutral, plural_of(neutral))
}

# An entity as the events name their object (the registry renames them to the neutral kind),
# so listed webhooks compare with the reconcile's desired subscriptions.
EVENT_OBJECTS: dict[str, str] = {own: neutral for neutral, own in OBJECT_KINDS.items()}
