"""Standard Webhooks bodies: one event per delivery, `{"type", "timestamp", "data"}`.

`type` is the sender's dotted event name (`contact.created`, `invoice.paid`); the trigger
event type is `standard.<type>`. The record identity is `data.object_type` (singular, as
onceflow names records) with `data.id`; a `*.property_changed` type carries its changes in
`data.changes` (`{field: new value}`). The event id is the `webhook-id` header, which the
scheme keeps the same across retries of one message. The author, when the sender knows it,
is `data.author = {"id", "source"}`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictStr, ValidationError

from shared.normalize.event import Kind, NormalizedEvent, UnparseableBody, snake

_TYPE = re.compile(r"^[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)+$")


class StandardEvent(BaseModel):
    model_config = ConfigDict(extra="allow")

    type: StrictStr = Field(pattern=_TYPE)
    timestamp: datetime
    data: dict[str, Any] = Field(default_factory=dict)


def _kind(action: str) -> Kind:
    if action in ("created", "property_changed", "deleted"):
        return action  # type: ignore[return-value]
    return "other"


def normalize(body: bytes, headers: Mapping[str, str]) -> list[NormalizedEvent]:
    try:
        event = StandardEvent.model_validate_json(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        raise UnparseableBody(f"not a Standard Webhooks event: {where}: {first['msg']}") from None
    parts = [snake(p) for p in event.type.split(".")]
    if not all(parts):
        raise UnparseableBody(f"unusable event type {event.type!r}")
    data = event.data
    object_type = data.get("object_type")
    object_id = data.get("id")
    has_record = isinstance(object_type, str) and isinstance(object_id, str | int)
    changes = data.get("changes")
    kind = _kind(parts[-1])
    changed = dict(changes) if kind == "property_changed" and isinstance(changes, dict) else {}
    author = data.get("author")
    author = author if isinstance(author, dict) else {}
    occurred = event.timestamp if event.timestamp.tzinfo else event.timestamp.replace(tzinfo=UTC)
    msg_id = next((v for k, v in headers.items() if k.lower() == "webhook-id"), None)
    return [
        NormalizedEvent(
            event_type="standard." + ".".join(parts),
            kind=kind,
            occurred_at=occurred,
            payload=event.model_dump(mode="json"),
            source_event_id=msg_id,
            object_type=snake(str(object_type)) if has_record else None,
            object_id=str(object_id) if has_record else None,
            changed_fields=changed,
            author_id=str(author["id"]) if author.get("id") is not None else None,
            author_source=str(author["source"]) if author.get("source") is not None else None,
        )
    ]
