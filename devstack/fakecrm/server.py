"""The fake CRM's HTTP surface: HubSpot's CRM objects and a legacy app's webhook subscriptions
on the date-based paths (shared/providers/hubspot/versions.py), `/_admin` for tests and the
demo, and `/_sink/*`, a receiver that records whatever is sent to it (the target of
`http.request` notify calls in tests and the demo).

Like a new HubSpot app (`FakeCrmConfig.new_app`, the default), it answers 404 on the numbered
paths (`/crm/v3/…`, `/oauth/v1/…`, `/webhooks/v3/…`); as a legacy app it serves them too, as
the same routes. Every request's path is recorded (`FakeCrm.numbered_requests()` is what
tests/fakecrm_support.py checks after each test)."""

from __future__ import annotations

import json
import re
import secrets
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import httpx

from devstack.fakecrm.journal import FakeJournal, JournalRefusal
from devstack.fakecrm.oauth import OAuthRefused, OAuthServer
from devstack.fakecrm.store import (
    OBJECT_TYPES,
    SINGULAR,
    FaultRule,
    Store,
    StoredRecord,
    now_ms,
)
from devstack.fakecrm.webhooks import DELIVERY_MODES, DeliveryMode, WebhookSender
from devstack.serving import serve_in_thread
from shared.accounts.oauth_tokens import Grant
from shared.providers.hubspot import versions

MAX_BODY = 1 << 20
# CRM objects, dated (`/crm/objects/2026-09/contacts/1`) or, for a legacy app, numbered
# (`/crm/v3/objects/contacts/1`); the routes below match what follows the version.
CRM_OBJECTS = re.compile(r"^/crm/(?:objects/(?P<version>\d{4}-\d{2})|v3/objects)/(?P<rest>.+)$")
OBJECT_PATH = re.compile(r"^(?P<type>[a-z_]+)(?:/(?P<id>[^/]+))?$")
SEARCH_PATH = re.compile(r"^(?P<type>[a-z_]+)/search$")
SUBS_PATH = re.compile(
    r"^/webhooks/(?P<version>\d{4}-\d{2}|v3)/(?P<app>[^/]+)/subscriptions(?:/(?P<id>[^/]+))?$"
)
# The dated versions served: the ones onceflow pins and, for the CRM, the one before it (whose
# writes ignore the portal's validation rules). Any other date is a 404, as at HubSpot.
CRM_VERSIONS = frozenset({"2026-03", versions.CRM_VERSION})
WEBHOOKS_VERSIONS = frozenset({versions.WEBHOOKS_VERSION})
# HubSpot-defined association type ids the fake knows, task -> record (tasks guide:
# https://developers.hubspot.com/docs/api-reference/latest/crm/activities/tasks/guide).
ASSOCIATION_TYPES = {
    204: ("tasks", "contacts"),
    192: ("tasks", "companies"),
    216: ("tasks", "deals"),
    # Records with each other (associations v4 "HUBSPOT_DEFINED" ids): contact to deal,
    # company to deal, contact to company.
    4: ("contacts", "deals"),
    342: ("companies", "deals"),
    279: ("contacts", "companies"),
}
ACCESS_TOKENS_PREFIX = "/oauth/v1/access-tokens/"  # a legacy app's token metadata
SINK_PREFIX = "/_sink"  # not HubSpot: a receiver for http.request calls (module docstring)
LEGACY_TOKEN_PATH = "/oauth/v1/token"  # noqa: S105 - a path, not a secret
ADMIN_RECORDS = re.compile(r"^/_admin/records/(?P<type>[a-z_]+)(?:/(?P<id>[^/]+))?$")


@dataclass
class FakeCrmConfig:
    host: str = "127.0.0.1"
    port: int = 0
    webhook_url: str | None = None
    app_secret: str = "fakecrm-app-secret"  # noqa: S105 - a local fake's default
    app_id: str = "424242"
    portal_id: int = 62515
    # When set, CRM and webhook-management calls must carry `Authorization: Bearer <token>`.
    token: str | None = None
    # The ten-secondly window. Private-app tokens and service keys of one portal share one
    # window and one daily budget (a second integration on the portal spends them too); the
    # app's OAuth tokens have a window of their own per portal and no daily limit, and their
    # answers carry no daily headers ("OAuth authenticated calls will not include
    # X-HubSpot-RateLimit-Daily or X-HubSpot-RateLimit-Daily-Remaining because there is no
    # daily limit for these calls": HubSpot changelog, rate limit headers for OAuth calls).
    rate_limit_max: int = 190
    rate_limit_interval_ms: int = 10_000
    daily_limit: int = 1_000_000  # per portal, private apps (Enterprise's figure)
    # Real HubSpot only sends events somebody subscribed to; locally, sending every change is
    # friendlier until reconcile has run. Tests of subscriptions turn this on.
    require_subscriptions: bool = False
    # HubSpot's search index lags writes by a few seconds; tests of search-then-create logic
    # can turn the lag on (records younger than this are invisible to search).
    search_lag_seconds: float = 0.0
    # The author id HubSpot puts in `sourceId` for changes made through this app's token.
    integration_source_id: str = field(default="")
    # How webhooks are delivered: "serial" or "realistic" (see devstack/fakecrm/webhooks.py).
    delivery: str = "serial"
    # HubSpot: eventId "is not guaranteed to be unique". Off: ids repeat (a small cycle).
    unique_event_ids: bool = True
    # More portals that installed the same app: bearer token -> portal id. Each portal sees
    # only its own records, and its changes' webhooks name it in `portalId` (one URL per app).
    portals: dict[str, int] = field(default_factory=dict)
    # Properties created with `hasUniqueValue`, per object type (e.g. {"tasks":
    # ["onceflow_key"]}): a second create with the same value answers 409 "Existing ID: N".
    unique_properties: dict[str, list[str]] = field(default_factory=dict)
    # HubSpot refuses a task without `hs_timestamp` ("Required", the tasks guide:
    # https://developers.hubspot.com/docs/api/crm/tasks). On by default, as HubSpot is: an
    # example or test that creates such a task is wrong against the real vendor.
    strict_tasks: bool = True
    # When set, /webhooks/v3 takes only this developer API key (`?hapikey=`), like HubSpot,
    # and refuses a portal's CRM token; unset, it takes what the CRM API takes (older tests).
    developer_api_key: str | None = None
    # The app's OAuth client (devstack/fakecrm/oauth.py); access tokens live this long.
    oauth_client_id: str = "fake-client-id"
    oauth_client_secret: str = "fake-client-secret"  # noqa: S105 - a local fake's default
    access_token_seconds: float = 1800.0
    # HubSpot's CRM 429s don't promise Retry-After; off, only the rate-limit headers say when.
    rate_limit_retry_after: bool = True
    # A new app (created since HubSpot closed legacy app creation): the numbered API paths
    # answer 404. False: a legacy app, which may still call them (until September 2027).
    new_app: bool = True
    # Per portal, per object type: the admin's validation rules enforced on CRM writes from
    # the `2026-09` version (`_check_validation_rules`). A rule: {"property": "leadsource",
    # "message": "...", "when": {"lifecyclestage": "customer"}} ("when" optional: always).
    validation_rules: dict[int, dict[str, list[dict[str, Any]]]] = field(default_factory=dict)
    # Service keys (a portal admin's static key, HubSpot's replacement for private-app
    # tokens): key -> portal. A revoked or rotated-away key is a 401.
    service_keys: dict[str, int] = field(default_factory=dict)
    # How the token endpoint words a refusal: "status" (v1: {"status": "BAD_REFRESH_TOKEN"})
    # or "category" (the standard error body, the reason in `subCategory`); see OAuthRefused.
    oauth_error_style: str = "status"


class _Drop(Exception):
    """Close the connection without an answer (after the write committed, or with a reset)."""

    def __init__(self, reset: bool) -> None:
        super().__init__("drop")
        self.reset = reset


class _Reply(Exception):
    def __init__(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        super().__init__(status)
        self.status = status
        self.body = body
        self.headers = headers or {}


def _error(status: int, message: str, category: str, **extra: Any) -> _Reply:
    body = {
        "status": "error",
        "message": message,
        "correlationId": f"fake-{now_ms()}",
        "category": category,
        **extra,
    }
    return _Reply(status, body)


class FakeCrm:
    """The server and its state. `start()` serves from a thread; `url` is its base URL."""

    def __init__(self, config: FakeCrmConfig | None = None) -> None:
        self.config = config or FakeCrmConfig()
        if not self.config.integration_source_id:
            self.config.integration_source_id = self.config.app_id
        self.store = Store()
        self.oauth = OAuthServer(
            client_id=self.config.oauth_client_id,
            client_secret=self.config.oauth_client_secret,
            access_seconds=self.config.access_token_seconds,
            app_id=self.config.app_id,
        )
        # The webhooks journal (devstack/fakecrm/journal.py), same OAuth client as the app.
        self.journal = FakeJournal(
            client_id=self.config.oauth_client_id, client_secret=self.config.oauth_client_secret
        )
        self.webhooks = WebhookSender(
            self.store,
            lambda: self.config.app_secret,
            lambda: self.config.webhook_url,
            DeliveryMode.named(self.config.delivery),
        )
        self.revoked_service_keys: set[str] = set()
        # Per (portal, "oauth" | "private"): [window start, used in it]; per portal: daily used.
        self._windows: dict[tuple[int, str], list[float]] = {}
        self._daily_used: dict[int, int] = {}
        self._rate_lock = threading.Lock()
        crm = self

        class Handler(_Handler):
            fake = crm

        self.server = ThreadingHTTPServer((self.config.host, self.config.port), Handler)
        self.server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> FakeCrm:
        self._thread = serve_in_thread(self.server, "fakecrm")
        return self

    def serve_forever(self) -> None:
        self.server.serve_forever()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.webhooks.stop()

    # --- conveniences for in-process tests -------------------------------------------------
    def add_fault(self, **spec: Any) -> FaultRule:
        return self.store.add_fault(spec)

    def records(self, object_type: str) -> list[dict[str, Any]]:
        with self.store.lock:
            return [
                {**r.to_json(), "portalId": r.portal_id}
                for r in self.store.records[object_type].values()
            ]

    def numbered_requests(self) -> list[str]:
        """`METHOD path` of every request this fake received on a numbered HubSpot path."""
        with self.store.lock:
            return [
                f"{r['method']} {r['path']}"
                for r in self.store.requests
                if versions.is_numbered(r["path"]) and not r["path"].startswith(SINK_PREFIX)
            ]

    def sink_requests(self) -> list[dict[str, Any]]:
        with self.store.lock:
            return list(self.store.sink)

    def issue_grant(self, portal_id: int, redirect_uri: str) -> Grant:
        """A portal installs the app, over HTTP as a client would: the consent's code, then
        the code exchanged at the token endpoint with this fake's OAuth client."""
        with httpx.Client(base_url=self.url) as c:
            code = c.post(
                "/_admin/oauth/authorize",
                json={"portal_id": portal_id, "redirect_uri": redirect_uri},
            ).json()["code"]
            body = c.post(
                versions.oauth_token(),
                data={
                    "grant_type": "authorization_code",
                    "client_id": self.config.oauth_client_id,
                    "client_secret": self.config.oauth_client_secret,
                    "redirect_uri": redirect_uri,
                    "code": code,
                },
            ).json()
        return Grant(body["access_token"], body["refresh_token"], body["expires_in"])

    # --- rate limiting, HubSpot style -------------------------------------------------------
    def take_rate(self, portal: int, oauth: bool) -> tuple[bool, dict[str, str], float, str]:
        """One call against the portal's limits: (allowed, the answer's rate-limit headers,
        seconds until the window lets one through, the spent policy's name)."""
        with self._rate_lock:
            now = time.monotonic()
            interval = self.config.rate_limit_interval_ms / 1000
            window = self._windows.setdefault((portal, "oauth" if oauth else "private"), [now, 0])
            if now - window[0] >= interval:
                window[0], window[1] = now, 0
            daily_used = self._daily_used.get(portal, 0)
            daily_spent = not oauth and daily_used >= self.config.daily_limit
            allowed = window[1] < self.config.rate_limit_max and not daily_spent
            if allowed:
                window[1] += 1
                if not oauth:
                    daily_used += 1
                    self._daily_used[portal] = daily_used
            headers = {
                "X-HubSpot-RateLimit-Max": str(self.config.rate_limit_max),
                "X-HubSpot-RateLimit-Remaining": str(
                    max(self.config.rate_limit_max - int(window[1]), 0)
                ),
                "X-HubSpot-RateLimit-Interval-Milliseconds": str(
                    self.config.rate_limit_interval_ms
                ),
            }
            if not oauth:
                headers["X-HubSpot-RateLimit-Daily"] = str(self.config.daily_limit)
                headers["X-HubSpot-RateLimit-Daily-Remaining"] = str(
                    max(self.config.daily_limit - daily_used, 0)
                )
            wait = max(interval - (now - window[0]), 0.0)
            return allowed, headers, wait, "DAILY" if daily_spent else "TEN_SECONDLY_ROLLING"

    def reset_daily(self) -> None:
        """Midnight in every portal's time zone: the daily budgets start again."""
        with self._rate_lock:
            self._daily_used.clear()

    # --- writes and the webhooks they cause -------------------------------------------------
    def _event(
        self, object_type: str, record_id: str, kind: str, portal_id: int, **extra: Any
    ) -> dict[str, Any]:
        return {
            "eventId": self.store.next_event_id(unique=self.config.unique_event_ids),
            "subscriptionId": 0,
            "portalId": portal_id,
            "appId": int(self.config.app_id) if self.config.app_id.isdigit() else 0,
            "occurredAt": now_ms(),
            "subscriptionType": f"{SINGULAR[object_type]}.{kind}",
            "attemptNumber": 0,
            "objectId": int(record_id),
            **extra,
        }

    def _subscribed(self, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        kept = []
        for event in events:
            sub = next(
                (
                    s
                    for s in self.store.subscriptions.values()
                    if s["active"]
                    and s["eventType"] == event["subscriptionType"]
                    and (
                        not event["subscriptionType"].endswith("propertyChange")
                        or s.get("propertyName") == event.get("propertyName")
                    )
                ),
                None,
            )
            if sub is not None:
                kept.append(dict(event, subscriptionId=int(sub["id"])))
            elif not self.config.require_subscriptions:
                kept.append(event)
        return kept

    def portal_record(self, object_type: str, record_id: str, portal_id: int) -> StoredRecord:
        """The portal's record (caller holds the lock); another portal's reads as missing."""
        rec = self.store.records[object_type].get(record_id)
        if rec is None or rec.portal_id != portal_id:
            raise _error(404, "resource not found", "OBJECT_NOT_FOUND")
        return rec

    def _associations(
        self, object_type: str, body: Any, portal_id: int
    ) -> list[tuple[str, str, int]]:
        """`associations` of a v3 create, checked like HubSpot: known type, existing target."""
        wanted = body.get("associations") if isinstance(body, dict) else None
        out: list[tuple[str, str, int]] = []
        for item in wanted or []:
            try:
                to_id = str(item["to"]["id"])
                type_id = int(item["types"][0]["associationTypeId"])
            except (KeyError, IndexError, TypeError, ValueError):
                raise _error(400, "Invalid association input", "VALIDATION_ERROR") from None
            pair = ASSOCIATION_TYPES.get(type_id)
            if pair is None or pair[0] != object_type:
                raise _error(
                    400,
                    f"association type {type_id} is invalid for {object_type}",
                    "VALIDATION_ERROR",
                )
            target = self.store.records[pair[1]].get(to_id)
            if target is None or target.portal_id != portal_id:
                raise _error(400, f"{pair[1]} {to_id} does not exist", "VALIDATION_ERROR")
            out.append((pair[1], to_id, type_id))
        return out

    def create_record(
        self,
        object_type: str,
        properties: dict[str, Any],
        source: tuple[str, str],
        portal_id: int | None = None,
        body: Any = None,
    ) -> StoredRecord:
        """Non-idempotent on purpose: the same body twice makes two records (like the vendor)."""
        portal = self.config.portal_id if portal_id is None else portal_id
        if (
            self.config.strict_tasks
            and object_type == "tasks"
            and not properties.get("hs_timestamp")
        ):
            raise _error(
                400, "Property values were not valid: hs_timestamp is required", "VALIDATION_ERROR"
            )
        with self.store.lock:
            associations = self._associations(object_type, body, portal)
            clash = self.store.find_unique(
                object_type,
                properties,
                portal,
                tuple(self.config.unique_properties.get(object_type, ())),
            )
            if clash is not None:
                raise _error(
                    409,
                    f"{SINGULAR[object_type].title()} already exists. Existing ID: {clash.id}",
                    "CONFLICT",
                )
            ms = now_ms()
            rid = self.store.next_id()
            props = {k: None if v is None else str(v) for k, v in properties.items()}
            props.update(
                {"hs_object_id": rid, "createdate": str(ms), "hs_lastmodifieddate": str(ms)}
            )
            rec = StoredRecord(object_type, rid, props, ms, ms, portal, associations)
            self.store.records[object_type][rid] = rec
            self.store.writes.append(
                {"op": "create", "type": object_type, "id": rid, "properties": dict(properties)}
            )
            events: list[dict[str, Any]] = []
            if object_type != "tasks":
                events.append(
                    self._event(
                        object_type,
                        rid,
                        "creation",
                        portal,
                        occurredAt=ms,
                        changeFlag="CREATED",
                        changeSource=source[0],
                        sourceId=source[1],
                    )
                )
                for name, value in properties.items():
                    events.append(
                        self._event(
                            object_type,
                            rid,
                            "propertyChange",
                            portal,
                            occurredAt=ms,
                            propertyName=name,
                            propertyValue=None if value is None else str(value),
                            changeSource=source[0],
                            sourceId=source[1],
                        )
                    )
            self.journal.record(events)
            events = self._subscribed(events)
        self.webhooks.enqueue(events)
        return rec

    def update_record(
        self,
        object_type: str,
        record_id: str,
        properties: dict[str, Any],
        source: tuple[str, str],
        portal_id: int | None = None,
    ) -> StoredRecord:
        portal = self.config.portal_id if portal_id is None else portal_id
        with self.store.lock:
            rec = self.portal_record(object_type, record_id, portal)
            ms = now_ms()
            events = []
            for name, value in properties.items():
                new = None if value is None else str(value)
                if rec.properties.get(name) == new:
                    continue
                rec.properties[name] = new
                if object_type != "tasks":
                    events.append(
                        self._event(
                            object_type,
                            record_id,
                            "propertyChange",
                            portal,
                            occurredAt=ms,
                            propertyName=name,
                            propertyValue=new,
                            changeSource=source[0],
                            sourceId=source[1],
                        )
                    )
            rec.updated_ms = ms
            rec.properties["hs_lastmodifieddate"] = str(ms)
            self.store.writes.append(
                {
                    "op": "update",
                    "type": object_type,
                    "id": record_id,
                    "properties": dict(properties),
                }
            )
            self.journal.record(events)
            events = self._subscribed(events)
        self.webhooks.enqueue(events)
        return rec

    # --- service keys ----------------------------------------------------------------------
    def mint_service_key(self, portal_id: int | None = None) -> str:
        """A new service key for the portal (default: the fake's own). The key's format is not
        documented; this one only needs to be unguessable."""
        key = "svc-" + secrets.token_urlsafe(24)
        with self.store.lock:
            self.config.service_keys[key] = portal_id or self.config.portal_id
        return key

    def revoke_service_key(self, key: str) -> bool:
        with self.store.lock:
            if self.config.service_keys.pop(key, None) is None:
                return False
            self.revoked_service_keys.add(key)
            return True

    # --- 2026-09: a portal's validation rules on CRM writes --------------------------------
    def check_validation_rules(
        self,
        object_type: str,
        properties: dict[str, Any],
        portal_id: int,
        record_id: str | None = None,
    ) -> None:
        """Refuse a write that leaves a required property empty, as HubSpot does from the
        `2026-09` version: "the API will return a 400 validation error if that property is
        missing on write" (https://developers.hubspot.com/changelog/crm-api-write-validation-enforcement).
        An update is judged on the record as it would be after it. The body is HubSpot's
        generic CRM error (`category`, `message`, `errors[]` with `message`, `code`, `context`:
        https://developers.hubspot.com/docs/api-reference/latest/error-handling); the items'
        `code` value is not documented, so the fake's is its own."""
        rules = self.config.validation_rules.get(portal_id, {}).get(object_type, [])
        if not rules:
            return
        with self.store.lock:
            after = (
                {}
                if record_id is None
                else dict(self.portal_record(object_type, record_id, portal_id).properties)
            )
        after.update({k: None if v is None else str(v) for k, v in properties.items()})
        broken = [
            rule
            for rule in rules
            if all(str(after.get(k) or "") == str(v) for k, v in (rule.get("when") or {}).items())
            and not after.get(str(rule["property"]))
        ]
        if broken:
            raise _error(
                400,
                "Property values were not valid",
                "VALIDATION_ERROR",
                errors=[
                    {
                        "message": str(rule.get("message") or f"{rule['property']} is required"),
                        "code": "VALIDATION_RULE_REQUIRED",
                        "in": "properties",
                        "context": {"propertyName": [str(rule["property"])]},
                    }
                    for rule in broken
                ],
            )

    def state(self) -> dict[str, Any]:
        with self.store.lock:
            return {
                "records": {
                    t: [r.to_json() for r in recs.values()]
                    for t, recs in self.store.records.items()
                },
                "counts": {
                    "created": {
                        t: sum(
                            1 for w in self.store.writes if w["op"] == "create" and w["type"] == t
                        )
                        for t in OBJECT_TYPES
                    },
                    "updated": sum(1 for w in self.store.writes if w["op"] == "update"),
                },
                "writes": list(self.store.writes),
                "subscriptions": list(self.store.subscriptions.values()),
                "faults": [f.to_json() for f in self.store.faults],
                "requests": self.store.requests[-1000:],
                "webhooks": list(self.store.webhooks),
                "sink": list(self.store.sink),
                "config": {
                    "webhook_url": self.config.webhook_url,
                    "app_id": self.config.app_id,
                    "portal_id": self.config.portal_id,
                    "require_subscriptions": self.config.require_subscriptions,
                    "delivery": self.config.delivery,
                    "unique_event_ids": self.config.unique_event_ids,
                    "rate_limit_retry_after": self.config.rate_limit_retry_after,
                    "unique_properties": self.config.unique_properties,
                    "new_app": self.config.new_app,
                    "validation_rules": {
                        str(k): v for k, v in self.config.validation_rules.items()
                    },
                },
                "oauth": {"refreshes": self.oauth.refreshes},
            }


def _properties(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict) or not isinstance(body.get("properties"), dict):
        raise _error(400, 'Invalid input JSON: expected {"properties": {...}}', "VALIDATION_ERROR")
    props: dict[str, Any] = body["properties"]
    for name, value in props.items():
        if not isinstance(name, str) or isinstance(value, dict | list):
            raise _error(400, f"Property values must be scalars: {name}", "VALIDATION_ERROR")
    return props


def _object_type(name: str) -> str:
    if name not in OBJECT_TYPES:
        raise _error(400, f"Unable to infer object type from: {name}", "VALIDATION_ERROR")
    return name


def _associated(store: Any, rec: StoredRecord, flt: dict[str, Any]) -> bool:
    """HubSpot's search pseudo-property `associations.<object>` EQ <id>: records associated
    with that record, whichever side the association was made from."""
    singular = str(flt.get("propertyName")).split(".", 1)[1]
    other = next((p for p, s in SINGULAR.items() if s == singular), singular)
    wanted = str(flt.get("value"))
    if any(t == other and i == wanted for t, i, _ in rec.associations):
        return True
    target = store.records[other].get(wanted) if other in store.records else None
    return target is not None and any(
        t == rec.object_type and i == rec.id for t, i, _ in target.associations
    )


def _matches(rec: StoredRecord, flt: dict[str, Any], store: Any = None) -> bool:  # noqa: PLR0911 - one per operator
    if str(flt.get("propertyName")).startswith("associations.") and store is not None:
        return _associated(store, rec, flt)
    value = rec.properties.get(str(flt.get("propertyName")))
    op = str(flt.get("operator", "EQ")).upper()
    wanted = flt.get("value")
    if op == "HAS_PROPERTY":
        return value not in (None, "")
    if op == "NOT_HAS_PROPERTY":
        return value in (None, "")
    if op == "IN":
        allowed = [str(v).lower() for v in flt.get("values", [])]
        return value is not None and value.lower() in allowed
    if value is None:
        return op == "NEQ"
    text = str(wanted)
    if op == "EQ":
        return value.lower() == text.lower()
    if op == "NEQ":
        return value.lower() != text.lower()
    if op == "CONTAINS_TOKEN":
        return text.lower().strip("*") in value.lower()
    try:
        left, right = float(value), float(text)
    except ValueError:
        left, right = value, text  # type: ignore[assignment]
    return {
        "GT": left > right,
        "GTE": left >= right,
        "LT": left < right,
        "LTE": left <= right,
    }.get(op, False)


class _Handler(BaseHTTPRequestHandler):
    fake: FakeCrm
    protocol_version = "HTTP/1.1"
    server_version = "fakecrm/1.0"
    # TCP_NODELAY: headers and body go out as two writes; with Nagle on, the body waits for
    # the client's delayed ACK (~40 ms a response), which HubSpot does not cost.
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PATCH(self) -> None:
        self._serve("PATCH")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    # --- plumbing ---------------------------------------------------------------------------
    def _read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            raise _error(413, "body too large", "VALIDATION_ERROR")
        return self.rfile.read(length) if length else b""

    def _json(self, raw: bytes) -> Any:
        if not raw:
            return {}
        try:
            return json.loads(raw)
        except ValueError:
            raise _error(400, "Invalid input JSON", "VALIDATION_ERROR") from None

    def _send(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        payload = (
            b"" if body is None else body if isinstance(body, bytes) else json.dumps(body).encode()
        )
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if payload:
            self.send_header("Content-Type", "application/json;charset=utf-8")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if payload:
            self.wfile.write(payload)

    def _drop(self, reset: bool) -> None:
        self.close_connection = True
        if reset:
            # SO_LINGER 0: close() sends RST, the client sees "connection reset by peer".
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        else:
            self.connection.shutdown(socket.SHUT_RDWR)
        self.connection.close()

    def _fault(self, method: str, path: str) -> FaultRule | None:
        header = self.headers.get("X-Fakecrm-Fault")
        if header:
            return FaultRule(
                id=0,
                action=header.strip(),
                times=1,
                delay_seconds=float(self.headers.get("X-Fakecrm-Delay", "0")),
                retry_after=int(self.headers.get("X-Fakecrm-Retry-After", "1")),
            )
        return self.fake.store.take_fault(method, path)

    def _sink(
        self, method: str, path: str, raw: bytes, fault: Any
    ) -> tuple[int, dict[str, Any]] | None:
        """`/_sink…`: a receiver for http.request steps, keeping what it was sent."""
        if not path.startswith(SINK_PREFIX):
            return None
        with self.fake.store.lock:
            self.fake.store.sink.append(
                {
                    "method": method,
                    "path": path,
                    "headers": {k.lower(): v for k, v in self.headers.items()},
                    "body": raw.decode("utf-8", "replace"),
                }
            )
        if fault and fault.action == "drop_after_commit":
            raise _Drop(reset=False)
        return 200, {"ok": True}

    def _serve(self, method: str) -> None:
        url = urlsplit(self.path)
        path = url.path
        entry: dict[str, Any] = {
            "method": method,
            "path": path,
            "status": None,
            "fault": None,
            "idempotency_key": self.headers.get("Idempotency-Key"),
            "at_ms": now_ms(),
        }
        try:
            raw = self._read_body()
            if path.startswith("/_admin"):
                status, body = self._admin(method, path, self._json(raw))
                self._send(status, body)
                return
            with self.fake.store.lock:
                self.fake.store.requests.append(entry)
            fault = self._fault(method, path)
            entry["fault"] = fault.action if fault else None
            if fault and fault.action == "delay":
                time.sleep(fault.delay_seconds)
            elif fault and fault.action == "reset":
                raise _Drop(reset=True)
            elif fault and fault.action == "error_500":
                raise _error(500, "internal error", "INTERNAL_ERROR")
            elif fault and fault.action == "error_400":
                raise _error(400, "refused by an injected fault", "VALIDATION_ERROR")
            elif fault and fault.action == "rate_limit":
                raise _Reply(
                    429,
                    {
                        "status": "error",
                        "message": "You have reached your secondly limit.",
                        "errorType": "RATE_LIMIT",
                        "correlationId": f"fake-{now_ms()}",
                        "policyName": "SECONDLY",
                        "category": "RATE_LIMITS",
                    },
                    {"Retry-After": str(fault.retry_after)},
                )
            if (
                versions.is_numbered(path)
                and self.fake.config.new_app
                and not path.startswith(SINK_PREFIX)  # any URL a test's http.request calls
            ):
                raise _error(
                    404,
                    f"{path}: numbered API versions are not available to this app; use the "
                    "date-based paths",
                    "OBJECT_NOT_FOUND",
                )
            reply = self._sink(method, path, raw, fault) or self._journal(
                method, url.path, url.query, raw
            )
            if reply is not None:
                entry["status"] = reply[0]
                self._send(*reply)
                return
            if path in (versions.oauth_token(), LEGACY_TOKEN_PATH) and method == "POST":
                if url.query:  # 2026-03: "all parameters in the form body, none in the query"
                    raise _error(400, "parameters belong in the form body", "VALIDATION_ERROR")
                form = {k: v[-1] for k, v in parse_qs(raw.decode("utf-8", "replace")).items()}
                try:
                    granted = self.fake.oauth.token(form)
                except OAuthRefused as refused:
                    raise _Reply(refused.status, self._oauth_error(refused)) from None
                entry["status"] = 200
                self._send(200, granted)
                return
            if path == versions.oauth_introspect() and method == "POST":
                form = {k: v[-1] for k, v in parse_qs(raw.decode("utf-8", "replace")).items()}
                try:
                    info = self.fake.oauth.introspect(form)
                except OAuthRefused as refused:
                    raise _Reply(refused.status, self._oauth_error(refused)) from None
                entry["status"] = 200
                self._send(200, info)
                return
            if path == "/oauth/authorize" and method == "GET":
                try:
                    location = self.fake.oauth.consent(
                        parse_qs(url.query), self.fake.config.portal_id
                    )
                except OAuthRefused as refused:
                    raise _Reply(refused.status, self._oauth_error(refused)) from None
                entry["status"] = 302
                self._send(302, None, {"Location": location})
                return
            if path.startswith(ACCESS_TOKENS_PREFIX) and method == "GET":
                info = self.fake.oauth.token_info(unquote(path[len(ACCESS_TOKENS_PREFIX) :]))
                if info is None:
                    raise _error(404, "access token not found or expired", "OBJECT_NOT_FOUND")
                entry["status"] = 200
                self._send(200, info)
                return
            portal = self._authorize(path, parse_qs(url.query))
            bearer = (self.headers.get("Authorization") or "").removeprefix("Bearer ")
            oauth = self.fake.oauth.portal_of(bearer)[0] == "live"
            allowed, rate_headers, wait, policy = self.fake.take_rate(portal, oauth)
            if not allowed:
                raise _Reply(
                    429,
                    {
                        "status": "error",
                        "message": f"You have reached your {policy.lower()} limit.",
                        "errorType": "RATE_LIMIT",
                        "policyName": policy,
                        "category": "RATE_LIMITS",
                    },
                    {
                        **rate_headers,
                        **(
                            {"Retry-After": str(max(int(wait + 0.999), 1))}
                            if self.fake.config.rate_limit_retry_after
                            else {}
                        ),
                    },
                )
            status, body = self._api(method, path, parse_qs(url.query), self._json(raw), portal)
            if fault and fault.action == "drop_after_commit":
                raise _Drop(reset=False)
            entry["status"] = status
            self._send(status, body, rate_headers)
        except _Reply as reply:
            entry["status"] = reply.status
            self._send(reply.status, reply.body, reply.headers)
        except _Drop as drop:
            entry["status"] = "dropped"
            self._drop(drop.reset)

    def _journal(
        self, method: str, path: str, query: str, raw: bytes
    ) -> tuple[int, Any, dict[str, str]] | None:
        """The webhooks journal's answer (devstack/fakecrm/journal.py), or None."""
        try:
            return self.fake.journal.serve(
                method,
                path,
                query=parse_qs(query),
                raw=raw,
                authorization=self.headers.get("Authorization"),
                base_url=self.fake.url,
            )
        except JournalRefusal as refused:
            return refused.status, refused.body, {}

    def _authorize(self, path: str, query: dict[str, list[str]]) -> int:
        """The portal the request acts for (its bearer token says which), or a 401."""
        config = self.fake.config
        developer_key = config.developer_api_key
        if developer_key and SUBS_PATH.match(path):
            if query.get("hapikey") != [developer_key]:
                raise _error(
                    401,
                    "The webhooks API requires the app's developer API key (hapikey).",
                    "INVALID_AUTHENTICATION",
                )
            return config.portal_id
        presented = self.headers.get("Authorization") or ""
        bearer = presented.removeprefix("Bearer ") if presented.startswith("Bearer ") else None
        service_key_portal = self._service_key(path, bearer)
        if service_key_portal is not None:
            return service_key_portal
        if bearer is not None and bearer in config.portals:
            return config.portals[bearer]
        state, oauth_portal = self.fake.oauth.portal_of(bearer or "")
        if state == "live":
            return oauth_portal
        if state == "expired":
            raise _error(
                401, "The OAuth token used to make this call expired.", "EXPIRED_AUTHENTICATION"
            )
        if config.token and bearer != config.token:
            raise _error(
                401,
                "Authentication credentials not found or invalid.",
                "INVALID_AUTHENTICATION",
            )
        return config.portal_id

    def _oauth_error(self, refused: OAuthRefused) -> dict[str, Any]:
        return refused.body_in(self.fake.config.oauth_error_style)

    def _service_key(self, path: str, bearer: str | None) -> int | None:
        """The portal of a live service key; a 401 for one revoked or rotated away. "You cannot
        use service keys to authenticate webhooks … other than making REST API requests"
        (https://developers.hubspot.com/docs/apps/developer-platform/build-apps/authentication/account-service-keys):
        the webhooks API refuses them (403)."""
        if bearer is None:
            return None
        if bearer in self.fake.revoked_service_keys:
            raise _error(
                401,
                "Authentication credentials not found or invalid: the service key was revoked.",
                "INVALID_AUTHENTICATION",
            )
        portal = self.fake.config.service_keys.get(bearer)
        if portal is not None and SUBS_PATH.match(path):
            raise _error(403, "Service keys cannot be used for webhooks.", "MISSING_SCOPES")
        return portal

    # --- the vendor API ---------------------------------------------------------------------
    def _api(
        self, method: str, path: str, query: dict[str, list[str]], body: Any, portal: int
    ) -> tuple[int, Any]:
        if crm := CRM_OBJECTS.match(path):
            return self._crm_objects(method, crm["version"], crm["rest"], query, body, portal)
        if m := SUBS_PATH.match(path):
            if m["version"] != "v3" and m["version"] not in WEBHOOKS_VERSIONS:
                raise _error(404, f"no webhooks API version {m['version']}", "OBJECT_NOT_FOUND")
            return self._subscriptions(method, m["app"], m["id"], body)
        raise _error(404, f"no route for {method} {path}", "OBJECT_NOT_FOUND")

    def _crm_objects(  # noqa: PLR0917 - the request's parts, as _api has them
        self,
        method: str,
        version: str | None,
        rest: str,
        query: dict[str, list[str]],
        body: Any,
        portal: int,
    ) -> tuple[int, Any]:
        """`rest`: the path after `/crm/objects/{version}/` (`version` None: after the numbered
        `/crm/v3/objects/`)."""
        if version is not None and version not in CRM_VERSIONS:
            raise _error(404, f"no CRM objects API version {version}", "OBJECT_NOT_FOUND")
        rules = version is not None and version >= versions.VALIDATION_RULES_FROM
        api_source = ("INTEGRATION", self.fake.config.integration_source_id)
        if m := SEARCH_PATH.match(rest):
            if method != "POST":
                raise _error(405, "method not allowed", "VALIDATION_ERROR")
            return 200, self._search(_object_type(m["type"]), body, portal)
        if m := OBJECT_PATH.match(rest):
            object_type = _object_type(m["type"])
            record_id = m["id"]
            if record_id is None and method == "POST":
                properties = _properties(body)
                if rules:
                    self.fake.check_validation_rules(object_type, properties, portal)
                rec = self.fake.create_record(object_type, properties, api_source, portal, body)
                return 201, rec.to_json()
            if record_id is not None and method == "PATCH":
                properties = _properties(body)
                if rules:
                    self.fake.check_validation_rules(object_type, properties, portal, record_id)
                rec = self.fake.update_record(
                    object_type, record_id, properties, api_source, portal
                )
                return 200, rec.to_json()
            if record_id is not None and method == "GET":
                with self.fake.store.lock:
                    found = self.fake.portal_record(object_type, record_id, portal)
                    only = [p for v in query.get("properties", []) for p in v.split(",") if p]
                    return 200, found.to_json(only or None)
            raise _error(405, "method not allowed", "VALIDATION_ERROR")
        raise _error(404, f"no route for {method} {rest}", "OBJECT_NOT_FOUND")

    def _search(self, object_type: str, body: Any, portal: int) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise _error(400, "Invalid search request", "VALIDATION_ERROR")
        groups = body.get("filterGroups") or []
        limit = min(int(body.get("limit", 10)), 200)
        after = int(body.get("after", 0) or 0)
        only = body.get("properties") or None
        with self.fake.store.lock:
            visible_before = now_ms() - int(self.fake.config.search_lag_seconds * 1000)
            found = [
                r
                for r in self.fake.store.records[object_type].values()
                if r.updated_ms <= visible_before
                and r.portal_id == portal
                and (
                    not groups
                    or any(
                        all(_matches(r, f, self.fake.store) for f in g.get("filters", []))
                        for g in groups
                    )
                )
            ]
            page = found[after : after + limit]
            result: dict[str, Any] = {
                "total": len(found),
                "results": [r.to_json(only) for r in page],
            }
        if after + limit < len(found):
            result["paging"] = {"next": {"after": str(after + limit)}}
        return result

    def _subscriptions(
        self, method: str, app: str, sub_id: str | None, body: Any
    ) -> tuple[int, Any]:
        if app != self.fake.config.app_id:
            raise _error(404, f"app {app} not found", "OBJECT_NOT_FOUND")
        store = self.fake.store
        if sub_id is None and method == "GET":
            with store.lock:
                return 200, {"results": list(store.subscriptions.values())}
        if sub_id is None and method == "POST":
            if not isinstance(body, dict) or not isinstance(body.get("eventType"), str):
                raise _error(400, "eventType is required", "VALIDATION_ERROR")
            event_type: str = body["eventType"]
            if event_type.endswith("propertyChange") and not body.get("propertyName"):
                raise _error(400, "propertyName is required for propertyChange", "VALIDATION_ERROR")
            with store.lock:
                for existing in store.subscriptions.values():
                    if existing["eventType"] == event_type and existing.get(
                        "propertyName"
                    ) == body.get("propertyName"):
                        raise _error(409, "subscription already exists", "CONFLICT")
                ms = now_ms()
                sub = {
                    "id": store.next_subscription_id(),
                    "eventType": event_type,
                    "propertyName": body.get("propertyName"),
                    "active": bool(body.get("active", True)),
                    "createdAt": ms,
                    "updatedAt": ms,
                }
                store.subscriptions[sub["id"]] = sub
            return 201, sub
        if sub_id is not None and method == "DELETE":
            with store.lock:
                if store.subscriptions.pop(sub_id, None) is None:
                    raise _error(404, "subscription not found", "OBJECT_NOT_FOUND")
            return 204, None
        raise _error(405, "method not allowed", "VALIDATION_ERROR")

    # --- admin ------------------------------------------------------------------------------
    def _admin(self, method: str, path: str, body: Any) -> tuple[int, Any]:  # noqa: PLR0911
        fake = self.fake
        if path.startswith(("/_admin/validation-rules", "/_admin/service-keys")):
            return self._admin_rules_and_keys(method, path, body)
        if path == "/_admin/state" and method == "GET":
            return 200, fake.state()
        if path == "/_admin/health":
            return 200, {"ok": True}
        if path.startswith("/_admin/journal"):
            try:
                return fake.journal.admin(method, path, body)
            except JournalRefusal as refused:
                raise _Reply(refused.status, refused.body) from None
        if path == "/_admin/reset" and method == "POST":
            fake.store.reset()
            return 200, {"ok": True}
        if path == "/_admin/faults" and method == "POST":
            try:
                return 201, fake.store.add_fault(body).to_json()
            except (ValueError, TypeError, re.error) as exc:
                raise _error(400, str(exc), "VALIDATION_ERROR") from None
        if path == "/_admin/faults" and method == "DELETE":
            with fake.store.lock:
                fake.store.faults.clear()
            return 200, {"ok": True}
        if path == "/_admin/config" and method == "POST":
            if "webhook_url" in body:
                fake.config.webhook_url = body["webhook_url"] or None
            if "search_lag_seconds" in body:
                fake.config.search_lag_seconds = float(body["search_lag_seconds"])
            if "require_subscriptions" in body:
                fake.config.require_subscriptions = bool(body["require_subscriptions"])
            if "delivery" in body:
                if body["delivery"] not in DELIVERY_MODES:
                    raise _error(
                        400, f"delivery must be one of {DELIVERY_MODES}", "VALIDATION_ERROR"
                    )
                fake.config.delivery = body["delivery"]
                fake.webhooks.set_mode(DeliveryMode.named(fake.config.delivery))
            for flag in ("unique_event_ids", "rate_limit_retry_after", "new_app"):
                if flag in body:
                    setattr(fake.config, flag, bool(body[flag]))
            if body.get("oauth_error_style") in ("status", "category"):
                fake.config.oauth_error_style = body["oauth_error_style"]
            if "developer_api_key" in body:  # the demo turns HubSpot's rule on for its app
                fake.config.developer_api_key = body["developer_api_key"] or None
            if "unique_properties" in body:
                unique = body["unique_properties"]
                if not isinstance(unique, dict) or not all(
                    isinstance(v, list) for v in unique.values()
                ):
                    raise _error(
                        400, "unique_properties maps object types to lists", "VALIDATION_ERROR"
                    )
                fake.config.unique_properties = {str(k): list(v) for k, v in unique.items()}
            return 200, fake.state()["config"]
        if path == "/_admin/oauth/authorize" and method == "POST":
            portal_id = int(body.get("portal_id", fake.config.portal_id))
            code = fake.oauth.authorize(portal_id, str(body.get("redirect_uri", "")))
            return 200, {"code": code}
        if path == "/_admin/oauth/revoke" and method == "POST":
            return 200, {"revoked": fake.oauth.revoke(str(body.get("refresh_token", "")))}
        if path == "/_admin/oauth/expire" and method == "POST":
            return 200, {"expired": fake.oauth.expire_all()}
        if path == "/_admin/webhooks/flush" and method == "POST":
            return 200, {"idle": fake.webhooks.wait_idle(float(body.get("timeout", 10)))}
        if m := ADMIN_RECORDS.match(path):
            object_type = _object_type(m["type"])
            # Changes made "by a person in the CRM UI": a different author than the app.
            user = ("CRM_UI", f"userId:{body.get('user_id', 7001)}" if body else "userId:7001")
            if method == "GET" and m["id"] is None:
                return 200, {"results": fake.records(object_type)}
            # `portal_id` in the body: a change in another portal of the app.
            portal = int(body.get("portal_id", fake.config.portal_id)) if body else None
            if method == "POST" and m["id"] is None:
                made = fake.create_record(object_type, _properties(body), user, portal, body)
                return 201, made.to_json()
            if method == "PATCH" and m["id"] is not None:
                rec = fake.update_record(object_type, m["id"], _properties(body), user, portal)
                return 200, rec.to_json()
        raise _error(404, f"no admin route for {method} {path}", "OBJECT_NOT_FOUND")

    def _admin_rules_and_keys(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        """`POST /_admin/validation-rules` {"portal_id", "object_type", "rules": [...]} sets a
        portal's rules for one object type (an empty list drops them); `POST
        /_admin/service-keys` {"portal_id"} mints a key, `…/revoke` {"key"} revokes one and
        `…/rotate` {"key"} revokes it and mints its successor for the same portal."""
        fake = self.fake
        body = body if isinstance(body, dict) else {}
        if path == "/_admin/validation-rules" and method == "POST":
            rules = body.get("rules")
            if not isinstance(rules, list) or not all(
                isinstance(r, dict) and isinstance(r.get("property"), str) for r in rules
            ):
                raise _error(
                    400, "rules is a list of {property, message, when}", "VALIDATION_ERROR"
                )
            portal = int(body.get("portal_id", fake.config.portal_id))
            object_type = _object_type(str(body.get("object_type", "")))
            fake.config.validation_rules.setdefault(portal, {})[object_type] = rules
            return 200, {"portal_id": portal, "object_type": object_type, "rules": rules}
        if path == "/_admin/service-keys" and method == "POST":
            return 201, {"key": fake.mint_service_key(int(body.get("portal_id", 0)) or None)}
        if path == "/_admin/service-keys/revoke" and method == "POST":
            return 200, {"revoked": fake.revoke_service_key(str(body.get("key", "")))}
        if path == "/_admin/service-keys/rotate" and method == "POST":
            portal = fake.config.service_keys.get(str(body.get("key", "")))
            if portal is None or not fake.revoke_service_key(str(body["key"])):
                raise _error(404, "no such live service key", "OBJECT_NOT_FOUND")
            return 201, {"key": fake.mint_service_key(portal)}
        raise _error(404, f"no admin route for {method} {path}", "OBJECT_NOT_FOUND")
