"""Pipedrive webhooks (v2): `{"meta": {...}, "data": {...}, "previous": {...}}`.

`meta.action` is `create`, `change` or `delete`; `meta.entity` the object (`person` and
`organization` become onceflow's singular `contact` and `company`); `meta.entity_id` the
record; `meta.id` the event id; `meta.timestamp` when it happened; `meta.change_source`
(`app`, `api`) and `meta.user_id` who did it. For a change, `previous` holds the old values of
exactly the fields that changed; their new values from `data` are the changed fields.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, StrictInt, StrictStr, ValidationError

from shared.normalize.event import Kind, NormalizedEvent, UnparseableBody, snake

_ENTITIES = {"person": "contact", "organization": "company"}
# The entities Pipedrive sends webhooks for (its webhooks guide: activity, deal, lead, note,
# organization, person, pipeline, product, stage, user), as onceflow names them.
OBJECTS: tuple[str, ...] = (
    *("activity", "deal", "lead", "note", "company", "contact"),
    *("pipeline", "product", "stage", "user"),
)
_ACTIONS: dict[str, tuple[str, Kind]] = {
    "create": ("created", "created"),
    "added": ("created", "created"),
    "change": ("property_changed", "property_changed"),
    "updated": ("property_changed", "property_changed"),
    "delete": ("deleted", "deleted"),
    "deleted": ("deleted", "deleted"),
}


class PipedriveMeta(BaseModel):
    model_config = ConfigDict(extra="allow")

    action: StrictStr
    entity: StrictStr
    entity_id: StrictStr | StrictInt | None = None
    id: StrictStr | StrictInt | None = None
    timestamp: datetime
    change_source: StrictStr | None = None
    user_id: StrictStr | StrictInt | None = None


class PipedriveEvent(BaseModel):
    model_config = ConfigDict(extra="allow")

    meta: PipedriveMeta
    data: dict[str, Any] | None = None
    previous: dict[str, Any] | None = None


def event_types() -> frozenset[str]:
    """Every `pipedrive.<object>.<action>` a Pipedrive webhook can become."""
    return frozenset(f"pipedrive.{o}.{a}" for o in OBJECTS for a, _ in _ACTIONS.values())


def normalize(body: bytes) -> list[NormalizedEvent]:
    try:
        event = PipedriveEvent.model_validate_json(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise UnparseableBody(f"not a Pipedrive webhook: {where}: {first['msg']}") from None
    meta = event.meta
    object_type = _ENTITIES.get(meta.entity, snake(meta.entity))
    action, kind = _ACTIONS.get(meta.action, (snake(meta.action), "other"))
    if not object_type or not action:
        raise UnparseableBody("unusable meta.entity or meta.action")
    changed: dict[str, Any] = {}
    if kind == "property_changed" and event.previous:
        current = event.data or {}
        changed = {k: current.get(k) for k in event.previous}
    occurred = meta.timestamp if meta.timestamp.tzinfo else meta.timestamp.replace(tzinfo=UTC)
    object_id = None if meta.entity_id is None else str(meta.entity_id)
    return [
        NormalizedEvent(
            event_type=f"pipedrive.{object_type}.{action}",
            kind=kind,
            occurred_at=occurred,
            payload=event.model_dump(mode="json"),
            source_event_id=None if meta.id is None else str(meta.id),
            object_type=object_type if object_id is not None else None,
            object_id=object_id,
            changed_fields=changed,
            author_id=None if meta.user_id is None else str(meta.user_id),
            author_source=meta.change_source,
        )
    ]
