"""The provider-neutral shape every webhook event is normalized into.

Naming scheme of event types: `<provider>.<object>.<action>`, all lower snake case.
`<object>` is the SINGULAR record type onceflow uses everywhere (`contact`, `company`,
`deal`, `ticket`, …) whatever the provider calls it (Pipedrive's `person` is a `contact`,
its `organization` a `company`, its `activity` a `task`: each provider declares its names,
`Provider.object_kinds`, and the registry renames its normalizer's events with them). A
trigger may write `crm.<object>.<action>` for that event of whichever CRM sends it
(shared/triggers/events.py). `<action>` is one of `created`, `property_changed`,
`deleted`, `merged`, `restored`, `association_changed`, or the provider's own verb in snake
case for anything else. Examples: `hubspot.contact.created`,
`hubspot.contact.property_changed`, `hubspot.deal.property_changed`,
`pipedrive.deal.created`, `standard.invoice.paid`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

Kind = Literal["created", "property_changed", "deleted", "other"]
_SNAKE_BOUNDARY = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_NOT_NAME = re.compile(r"[^a-z0-9_]+")


class UnparseableBody(ValueError):
    """A verified body that can never become events: the inbox row is rejected, not retried."""


def snake(text: str) -> str:
    """`propertyChange` -> `property_change`; anything outside [a-z0-9_] becomes `_`."""
    lowered = _SNAKE_BOUNDARY.sub("_", text.strip()).lower()
    return _NOT_NAME.sub("_", lowered).strip("_")


@dataclass(frozen=True)
class NormalizedEvent:
    event_type: str
    kind: Kind
    occurred_at: datetime
    payload: Mapping[str, Any]
    source_event_id: str | None = None
    object_type: str | None = None
    object_id: str | None = None
    # For property changes: {field: new value} as the provider reported it.
    changed_fields: Mapping[str, Any] = field(default_factory=dict)
    author_id: str | None = None
    author_source: str | None = None
