"""Pipedrive webhooks (v2): `{"meta": {...}, "data": {...}, "previous": {...}}`.

`meta.action` is `create`, `change` or `delete`; `meta.entity` the object, in Pipedrive's own
name (the registry names it by onceflow's neutral kind: `person` becomes `contact`, from the
provider's declared `object_kinds`, shared/providers/registry.py); `meta.entity_id` the
record; `meta.id` the event id; `meta.timestamp` when it happened; `meta.change_source`
(`app`, `api`) and `meta.user_id` who did it (webhooks v2 guide, "Webhook's meta block",
https://pipedrive.readme.io/docs/guide-for-webhooks-v2).

For a change, `previous` holds the old values of the fields that changed, and `data` the new
ones ("Data and previous"). Three things in it are not changes a workflow can watch
(docs/vendors/pipedrive.md §1.1, §5; every "Update …" example of the migration guide,
https://pipedrive.readme.io/docs/webhooks-v2-migration-guide):
- `update_time` is in `previous` on every change, though no one edited it: left out, or every
  change would fire a trigger watching every field, and onceflow's own write (which never
  sets it) would never be explained by its echo markers;
- custom fields nest under `custom_fields`, keyed by the field's 40-character hash, with a
  typed value (`{"type": "varchar", "value": "VIP"}`, `{"type": "enum", "id": 17}`,
  `{"type": "set", "values": [{"id": 13}]}`): each is its own changed field under its hash,
  holding the plain value (what an API write of that field sends);
- a field whose old and new values are equal did not change.
A change left with no changed field still becomes an event: the shadow records drop it as
`unchanged` (shared/ingest/shadow.py), visibly, in the inbox row's outcome.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, StrictInt, StrictStr, ValidationError

from shared.normalize.event import Kind, NormalizedEvent, UnparseableBody, snake

# The entities Pipedrive sends webhooks for (its webhooks guide: activity, deal, lead, note,
# organization, person, pipeline, product, stage, user).
OBJECTS: tuple[str, ...] = (
    *("activity", "deal", "lead", "note", "organization", "person"),
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


# Maintained by Pipedrive itself, never written by anyone: not a change of the record.
_SYSTEM_FIELDS = frozenset({"update_time"})
_CUSTOM_FIELDS = "custom_fields"


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


def plain_value(typed: Any) -> Any:
    """A webhook's typed custom-field value as its plain value: `value` for text, numbers,
    money and addresses, `id` for a single option, the ids for a set of options."""
    if not isinstance(typed, dict):
        return typed
    if "value" in typed:
        return typed["value"]
    if "id" in typed:
        return typed["id"]
    if isinstance(typed.get("values"), list):
        return [v.get("id") if isinstance(v, dict) else v for v in typed["values"]]
    return {k: v for k, v in typed.items() if k != "type"}


def changed_fields(current: dict[str, Any], previous: dict[str, Any]) -> dict[str, Any]:
    """{field: new value} for each field `previous` names whose value really changed (module
    docstring), custom fields by their hash."""
    changed: dict[str, Any] = {}
    for name, old in previous.items():
        if name in _SYSTEM_FIELDS:
            continue
        if name == _CUSTOM_FIELDS and isinstance(old, dict):
            now = current.get(_CUSTOM_FIELDS)
            now = now if isinstance(now, dict) else {}
            for key, old_typed in old.items():
                new = plain_value(now.get(key))
                if new != plain_value(old_typed):
                    changed[key] = new
            continue
        if current.get(name) != old:
            changed[name] = current.get(name)
    return changed


def normalize(body: bytes) -> list[NormalizedEvent]:
    try:
        event = PipedriveEvent.model_validate_json(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise UnparseableBody(f"not a Pipedrive webhook: {where}: {first['msg']}") from None
    meta = event.meta
    object_type = snake(meta.entity)
    action, kind = _ACTIONS.get(meta.action, (snake(meta.action), "other"))
    if not object_type or not action:
        raise UnparseableBody("unusable meta.entity or meta.action")
    changed: dict[str, Any] = {}
    if kind == "property_changed" and event.previous:
        changed = changed_fields(event.data or {}, event.previous)
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
