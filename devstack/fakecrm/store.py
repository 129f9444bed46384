"""The fake CRM's state: records, subscriptions, fault rules and a journal of what happened.

Everything is in memory behind one lock; a restart forgets it all (like the Pub/Sub emulator).
"""

from __future__ import annotations

import itertools
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any

OBJECT_TYPES = ("contacts", "companies", "deals", "tasks")
# The singular names HubSpot uses in webhook subscription types (`contact.propertyChange`).
SINGULAR = {"contacts": "contact", "companies": "company", "deals": "deal", "tasks": "task"}
# A property HubSpot enforces as unique per object type: a clash is a 409 "Existing ID: N".
UNIQUE_PROPERTY = {"contacts": "email", "companies": "domain"}
# error_400: refused as HubSpot refuses an invalid object (permanent: not retried), so a run
# fails at once; the README's first workflow uses it to have a run to replay.
FAULT_ACTIONS = ("drop_after_commit", "delay", "rate_limit", "error_500", "error_400", "reset")


def now_ms() -> int:
    return int(time.time() * 1000)


def iso(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"


@dataclass
class StoredRecord:
    object_type: str
    id: str
    properties: dict[str, Any]
    created_ms: int
    updated_ms: int
    portal_id: int = 0
    # (to object type, to id, association type id), as HubSpot's v4 associations list them.
    associations: list[tuple[str, str, int]] = field(default_factory=list)

    def to_json(self, only: list[str] | None = None) -> dict[str, Any]:
        props = dict(self.properties)
        if only:
            keep = set(only) | {"hs_object_id", "createdate", "hs_lastmodifieddate"}
            props = {k: v for k, v in props.items() if k in keep}
            for name in only:
                props.setdefault(name, None)
        body: dict[str, Any] = {
            "id": self.id,
            "properties": props,
            "createdAt": iso(self.created_ms),
            "updatedAt": iso(self.updated_ms),
            "archived": False,
        }
        if self.associations:
            grouped: dict[str, list[dict[str, Any]]] = {}
            for to_type, to_id, type_id in self.associations:
                grouped.setdefault(to_type, []).append({"id": to_id, "type_id": type_id})
            body["associations"] = {t: {"results": r} for t, r in grouped.items()}
        return body


@dataclass
class FaultRule:
    """Inject `action` into requests matching method/path; `times` None means forever."""

    id: int
    action: str
    method: str | None = None
    path: str | None = None  # a regular expression searched in the request path
    times: int | None = 1
    delay_seconds: float = 0.0
    retry_after: int = 1
    hits: int = 0

    def matches(self, method: str, path: str) -> bool:
        if self.times is not None and self.times <= 0:
            return False
        if self.method and self.method.upper() != method.upper():
            return False
        return not (self.path and not re.search(self.path, path))

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "action": self.action,
            "method": self.method,
            "path": self.path,
            "times": self.times,
            "delay_seconds": self.delay_seconds,
            "retry_after": self.retry_after,
            "hits": self.hits,
        }


@dataclass
class Store:
    lock: threading.Lock = field(default_factory=threading.Lock)
    records: dict[str, dict[str, StoredRecord]] = field(
        default_factory=lambda: {t: {} for t in OBJECT_TYPES}
    )
    subscriptions: dict[str, dict[str, Any]] = field(default_factory=dict)
    faults: list[FaultRule] = field(default_factory=list)
    # Journals for tests: every API request, every committed write, every webhook attempt,
    # every request received by the /_sink receiver.
    requests: list[dict[str, Any]] = field(default_factory=list)
    writes: list[dict[str, Any]] = field(default_factory=list)
    webhooks: list[dict[str, Any]] = field(default_factory=list)
    sink: list[dict[str, Any]] = field(default_factory=list)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1001))
    _event_ids: itertools.count[int] = field(default_factory=lambda: itertools.count(9000001))
    _sub_ids: itertools.count[int] = field(default_factory=lambda: itertools.count(501))
    _fault_ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def next_id(self) -> str:
        return str(next(self._ids))

    def next_event_id(self, *, unique: bool = True) -> int:
        number = next(self._event_ids)
        # Not unique: a cycle of 5 ids, so unrelated events share one soon and often.
        return number if unique else 100 + number % 5

    def next_subscription_id(self) -> str:
        return str(next(self._sub_ids))

    def add_fault(self, spec: dict[str, Any]) -> FaultRule:
        action = spec.get("action")
        if action not in FAULT_ACTIONS:
            raise ValueError(f"action must be one of {', '.join(FAULT_ACTIONS)}")
        times = spec.get("times", 1)
        rule = FaultRule(
            id=next(self._fault_ids),
            action=str(action),
            method=spec.get("method"),
            path=spec.get("path"),
            times=None if times is None else int(times),
            delay_seconds=float(spec.get("delay_seconds", 0.0)),
            retry_after=int(spec.get("retry_after", 1)),
        )
        if rule.path:
            re.compile(rule.path)
        with self.lock:
            self.faults.append(rule)
        return rule

    def take_fault(self, method: str, path: str) -> FaultRule | None:
        """The first matching rule, consuming one of its uses."""
        with self.lock:
            for rule in self.faults:
                if rule.matches(method, path):
                    rule.hits += 1
                    if rule.times is not None:
                        rule.times -= 1
                    return rule
        return None

    def find_unique(
        self,
        object_type: str,
        properties: dict[str, Any],
        portal_id: int = 0,
        extra_unique: tuple[str, ...] = (),
    ) -> StoredRecord | None:
        """A record of the portal holding a value of `properties` that must be unique: HubSpot's
        own (email, domain) or a property created with `hasUniqueValue` (`extra_unique`)."""
        names = [n for n in (UNIQUE_PROPERTY.get(object_type), *extra_unique) if n]
        for name in names:
            if not properties.get(name):
                continue
            wanted = str(properties[name]).lower()
            for rec in self.records[object_type].values():
                if rec.portal_id == portal_id and (
                    str(rec.properties.get(name, "")).lower() == wanted
                ):
                    return rec
        return None

    def reset(self) -> None:
        with self.lock:
            for t in OBJECT_TYPES:
                self.records[t].clear()
            self.subscriptions.clear()
            self.faults.clear()
            self.requests.clear()
            self.writes.clear()
            self.webhooks.clear()
            self.sink.clear()
