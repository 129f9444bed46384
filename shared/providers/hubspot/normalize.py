"""HubSpot webhook bodies: a JSON array of events.

Each element has `eventId`, `subscriptionType` (`contact.creation`,
`contact.propertyChange`, `deal.propertyChange`, `company.deletion`, … or the generic
`object.*` with `objectTypeId`), `objectId`, `propertyName`/`propertyValue` for property
changes, `occurredAt` (ms), `changeSource` and `sourceId` (who made the change),
`attemptNumber`, `portalId` and `appId`. The author is `author_source = changeSource`,
`author_id = sourceId` (e.g. `userId:123`, or an app id for integration writes).

The event's identity (`source_event_id`, the outbox's dedup key) is the CHANGE it reports, not
the delivery that carried it: `portalId:<object>.<action>:<objectTypeId>/<objectId>:
<propertyName>:<occurredAt ms>[:<digest of the new value>]`, in onceflow's names for object and
action (the value's digest for property changes only). Every part is one a
retry repeats unchanged (a retry only bumps `attemptNumber`), and it is what the webhooks
journal says about the same change too (shared/providers/hubspot/journal.py turns a journal
event into these same fields), so a change that arrives both by webhook and from the journal is
ONE event (issue 26 item 2). `eventId` is not part of it: HubSpot documents it as "not
guaranteed to be unique" (https://developers.hubspot.com/docs/api/webhooks, "Webhook
payloads") and the journal has none; two different events that share an `eventId` still differ
in one of the other parts. `contact.propertyChange` and the generic `object.propertyChange`
with `objectTypeId` `0-1` are the same change, so the key names the type id either way.
HubSpot's own `eventId` stays in the payload.
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import UTC, datetime
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    TypeAdapter,
    ValidationError,
)

from shared.normalize.event import Kind, NormalizedEvent, UnparseableBody, snake

_ACTIONS: dict[str, tuple[str, Kind]] = {
    "creation": ("created", "created"),
    "propertyChange": ("property_changed", "property_changed"),
    "deletion": ("deleted", "deleted"),
    "privacyDeletion": ("privacy_deleted", "deleted"),
    "merge": ("merged", "other"),
    "restore": ("restored", "other"),
    "associationChange": ("association_changed", "other"),
}
# The CRM objects whose webhook events HubSpot sends (https://developers.hubspot.com/docs/
# api/webhooks: contacts, companies, deals, tickets, products and line items), as onceflow
# names them; with `_ACTIONS`, the event types this normalizer produces.
OBJECTS = ("contact", "company", "deal", "ticket", "product", "line_item")
# HubSpot's ids for its standard objects, used by the generic `object.*` subscriptions.
_OBJECT_TYPE_IDS = {"0-1": "contact", "0-2": "company", "0-3": "deal", "0-5": "ticket"}
_SUBSCRIPTION_TYPE = re.compile(r"^[A-Za-z_]+\.[A-Za-z_]+$")


class HubSpotEvent(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    event_id: StrictInt | StrictStr = Field(alias="eventId")
    subscription_type: StrictStr = Field(alias="subscriptionType", pattern=_SUBSCRIPTION_TYPE)
    occurred_at: StrictInt = Field(alias="occurredAt", ge=0, lt=10**14)
    object_id: StrictInt | StrictStr | None = Field(default=None, alias="objectId")
    object_type_id: StrictStr | None = Field(default=None, alias="objectTypeId")
    property_name: StrictStr | None = Field(default=None, alias="propertyName")
    property_value: Any = Field(default=None, alias="propertyValue")
    change_source: StrictStr | None = Field(default=None, alias="changeSource")
    source_id: StrictStr | StrictInt | None = Field(default=None, alias="sourceId")
    portal_id: StrictInt | StrictStr | None = Field(default=None, alias="portalId")
    app_id: StrictInt | StrictStr | None = Field(default=None, alias="appId")


HubSpotEventList = TypeAdapter(list[HubSpotEvent])


def _part(value: object) -> str:
    # ":" separates the parts; a property name can't contain one, but keep the key unambiguous.
    return "-" if value is None else str(value).replace(":", "%3A")


def dedup_key(event: HubSpotEvent, object_type: str, action: str) -> str:
    """The event's identity across deliveries and sources (see the module docstring)."""
    type_id = event.object_type_id or type_id_for(object_type) or object_type
    parts: list[object] = [
        event.portal_id,
        f"{object_type}.{action}",
        f"{type_id}/{_part(event.object_id)}",
        event.property_name,
        event.occurred_at,
    ]
    if event.property_name is not None:
        # Two changes of one property in the same millisecond are two changes (a fast client,
        # the fake): the new value tells them apart; a short digest keeps the key small.
        value = event.property_value
        text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
        parts.append(hashlib.sha256(text.encode()).hexdigest()[:16])
    return ":".join(_part(v) for v in parts)


def object_type_for(type_id: str) -> str:
    """The object type onceflow names a HubSpot objectTypeId (`0-1` → `contact`); record
    URLs carry the same ids (shared/ops/search.py)."""
    return _OBJECT_TYPE_IDS.get(type_id, f"object_{snake(type_id)}")


def event_types() -> frozenset[str]:
    """Every `hubspot.<object>.<action>` a HubSpot webhook can become."""
    return frozenset(f"hubspot.{o}.{a}" for o in OBJECTS for a, _ in _ACTIONS.values())


def type_id_for(object_type: str) -> str | None:
    """The inverse of `object_type_for` for HubSpot's standard objects."""
    return next((k for k, v in _OBJECT_TYPE_IDS.items() if v == object_type), None)


def _object_type(event: HubSpotEvent) -> str:
    name = event.subscription_type.split(".", 1)[0]
    if name == "object" and event.object_type_id:
        return object_type_for(event.object_type_id)
    return snake(name)


def normalize(body: bytes) -> list[NormalizedEvent]:
    try:
        raw = HubSpotEventList.validate_json(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise UnparseableBody(f"not a HubSpot event array: {where}: {first['msg']}") from None
    if not raw:
        raise UnparseableBody("empty HubSpot event array")
    return [_to_event(e, index) for index, e in enumerate(raw)]


def _to_event(event: HubSpotEvent, index: int) -> NormalizedEvent:
    object_type = _object_type(event)
    verb = event.subscription_type.split(".", 1)[1]
    action, kind = _ACTIONS.get(verb, (snake(verb), "other"))
    if not object_type or not action:
        raise UnparseableBody(f"event {index}: unusable subscriptionType")
    changed: dict[str, Any] = {}
    if kind == "property_changed":
        if not event.property_name:
            raise UnparseableBody(f"event {index}: propertyChange without propertyName")
        changed[event.property_name] = event.property_value
    object_id = None if event.object_id is None else str(event.object_id)
    return NormalizedEvent(
        event_type=f"hubspot.{object_type}.{action}",
        kind=kind,
        occurred_at=datetime.fromtimestamp(event.occurred_at / 1000, UTC),
        payload=event.model_dump(mode="json", by_alias=True, exclude_none=True),
        source_event_id=dedup_key(event, object_type, action),
        object_type=object_type if object_id is not None else None,
        object_id=object_id,
        changed_fields=changed,
        author_id=None if event.source_id is None else str(event.source_id),
        author_source=event.change_source,
    )
