"""Shadow records: the last-seen state of each watched field, so an update fires only when a
watched field really changed.

Per (connection, object type, object id, field) we keep a hash of the last value, when it
happened at the provider, and the provider event id that told us. An observation is judged
against that (see `judge`); the row is read `FOR UPDATE`, so two drainers applying changes to
the same field serialize and the later one judges against the earlier one's result.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from shared.core import queries
from shared.core.db import Tx

SQL = queries.load("shadow")
LOCK = SQL["shadow_lock"]
INSERT = SQL["shadow_insert"]
UPDATE = SQL["shadow_update"]

Verdict = Literal["changed", "unchanged", "out_of_order", "re_announced"]
# When several fields of one event are dropped, the reason reported is the strongest one.
_DROP_PRECEDENCE: tuple[Verdict, ...] = ("re_announced", "out_of_order", "unchanged")


def value_hash(value: Any) -> bytes:
    """A stable hash of a field value (canonical JSON, so 1 and "1" differ as they should)."""
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).digest()


@dataclass(frozen=True)
class Seen:
    """What the shadow record remembers of one field."""

    value_hash: bytes
    occurred_at: datetime
    event_id: str | None


def judge(prior: Seen | None, incoming: Seen) -> Verdict:
    """Is `incoming` a real change of the field, given what was seen before?

    - re_announced: the same provider event again (a retry with a different body, a replay);
    - out_of_order: it happened before what we already applied — applying it would move the
      field backwards in time;
    - unchanged: the same value as last seen (the provider announced a no-op, or an echo);
    - changed: anything else, including the first sighting of the field.
    """
    if prior is None:
        return "changed"
    if incoming.event_id is not None and incoming.event_id == prior.event_id:
        return "re_announced"
    if incoming.occurred_at < prior.occurred_at:
        return "out_of_order"
    if incoming.value_hash == prior.value_hash:
        return "unchanged"
    return "changed"


def strongest_drop(verdicts: list[Verdict]) -> Verdict:
    for reason in _DROP_PRECEDENCE:
        if reason in verdicts:
            return reason
    return "unchanged"


def observe_field(
    tx: Tx,
    *,
    connection_id: str,
    object_type: str,
    object_id: str,
    field: str,
    value: Any,
    occurred_at: datetime,
    event_id: str | None,
) -> Verdict:
    """Judge one field observation and record it; must run in the drain's transaction."""
    incoming = Seen(value_hash(value), occurred_at, event_id)
    key = {
        "connection_id": connection_id,
        "object_type": object_type,
        "object_id": object_id,
        "field": field,
    }
    row = tx.one(LOCK, **key)
    if row is None:
        inserted = tx.one(
            INSERT,
            **key,
            value_hash=incoming.value_hash,
            occurred_at=occurred_at,
            event_id=event_id,
        )
        if inserted is not None:
            return "changed"
        # A concurrent drainer inserted it between our read and insert; judge against theirs.
        row = tx.one(LOCK, **key)
        if row is None:  # pragma: no cover - the conflicting row can't vanish under our lock
            return "changed"
    prior = Seen(bytes(row["value_hash"]), row["occurred_at"], row["last_event_id"])
    verdict = judge(prior, incoming)
    if verdict in ("changed", "unchanged"):
        # Unchanged still advances the time and event id: an older, different value arriving
        # later must count as out of order, and this event's retry as re-announced.
        tx.execute(
            UPDATE,
            **key,
            value_hash=incoming.value_hash,
            occurred_at=occurred_at,
            event_id=event_id,
        )
    return verdict


def observe_changes(
    tx: Tx,
    *,
    connection_id: str,
    object_type: str,
    object_id: str,
    changes: Mapping[str, Any],
    occurred_at: datetime,
    event_id: str | None,
    is_watched: Callable[[str, str], bool],
) -> tuple[bool, str | None]:
    """Observe every watched field of one property-change event.

    Returns (emit, drop_reason): emit when at least one watched field really changed;
    otherwise the reason — `not_watched` when no changed field is watched, `unchanged` when
    the provider announced a change of no field at all (Pipedrive does, when only its own
    `update_time` moved: shared/providers/pipedrive/normalize.py)."""
    if not changes:
        return False, "unchanged"
    verdicts: list[Verdict] = []
    for field, value in changes.items():
        if not is_watched(object_type, field):
            continue
        verdicts.append(
            observe_field(
                tx,
                connection_id=connection_id,
                object_type=object_type,
                object_id=object_id,
                field=field,
                value=value,
                occurred_at=occurred_at,
                event_id=event_id,
            )
        )
    if not verdicts:
        return False, "not_watched"
    if "changed" in verdicts:
        return True, None
    return False, strongest_drop(verdicts)
