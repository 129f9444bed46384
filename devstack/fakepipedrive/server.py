"""The fake Pipedrive's HTTP surface and state: API v2 persons, organizations, deals and
activities, v1 notes, webhooks and users/me, OAuth, and `/_admin` for tests.

Each behaviour imitates a fact in docs/vendors/pipedrive.md ("How the fake Pipedrive must
behave to be honest"); where the facts file says UNCONFIRMED, `FakePipedriveConfig` has a switch
for both ways.

- **Non-idempotent creates**: the same POST twice makes two records; no unique value, no 409
  (§3.2 "Idempotent creates: none"). Faults can apply a create and lose its answer.
- **Burst limit per token**, rolling 2-second window: API token 20, OAuth 80 (Lite), search
  10 (Rate limiting, https://pipedrive.readme.io/docs/core-api-concepts-rate-limiting). Every
  answer carries `x-ratelimit-limit`, `x-ratelimit-remaining`, `x-ratelimit-reset` (seconds);
  API-token answers also `x-daily-requests-left` (POST/PUT/PATCH left today, the older
  fair-use limit: changelog "daily-api-limit-for-postput-endpoints").
- **Daily token budget per company**, shared by every token: each call costs tokens (v2 ≈
  half of v1's get 2, list 20, update 10, delete 6, search 40; a create's cost is not
  documented: `create_cost`). Spent: every request is a 429 until "midnight"
  (`/_admin/midnight`). The budget headers `x-daily-ratelimit-token-*` are not confirmed:
  `token_budget_headers`. `Retry-After` on a 429 is not confirmed: `retry_after_header`.
- **Auth**: `x-api-token` (a user's API token; never expires) or `Authorization: Bearer` (an
  OAuth access token that expires, devstack/fakepipedrive/oauth.py). 401 otherwise.
- **Strict v2 validation** (V2M "General API Changes"): a string for a number is a 400; emails
  and phones are arrays of `{value, label?, primary?}`; an activity's `person_id` is read-only
  (set through `participants`). Custom fields nest in `custom_fields` by 40-character hash.
- **Webhooks** (devstack/fakepipedrive/webhooks.py): v2 bodies for every change, with
  `change_source: api` and the token's user for API writes and `app` for `/_admin/ui` edits
  (a person in the web app); `previous` holds only the changed fields' old values plus
  `update_time`, custom fields nested under `custom_fields`; a merge (`/_admin/merge`) is a
  `delete` with `merged_to_id` and a `change` with `merged_from_id`. `/v1/webhooks` makes at most 40
  per user (the 41st: 422); an OAuth app lists and deletes only its own (`type: application`).
"""

from __future__ import annotations

import itertools
import json
import math
import re
import socket
import struct
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx

from devstack.fakepipedrive.oauth import Installed, OAuthRefused, OAuthServer
from devstack.fakepipedrive.webhooks import DeliveryPolicy, WebhookSender
from devstack.serving import serve_in_thread
from shared.accounts.oauth_tokens import Grant

MAX_BODY = 1 << 20
# API v2 collections and the entity (webhook `entity`) each holds; notes are v1 only (V2M).
V2_COLLECTIONS = {
    "persons": "person",
    "organizations": "organization",
    "deals": "deal",
    "activities": "activity",
}
ENTITIES = (*V2_COLLECTIONS.values(), "note")
V2_PATH = re.compile(r"^/api/v2/(?P<coll>[a-z]+)(?:/(?P<id>[^/]+))?$")
NOTES_PATH = re.compile(r"^/(?:api/)?v1/notes(?:/(?P<id>[^/]+))?$")
WEBHOOKS_PATH = re.compile(r"^/(?:api/)?v1/webhooks(?:/(?P<id>[^/]+))?$")
USERS_ME = re.compile(r"^/(?:api/)?v1/users/me$")
# Fields v2 insists are numbers (strict validation: no string -> number coercion).
NUMBER_FIELDS = frozenset(
    {"org_id", "owner_id", "person_id", "deal_id", "value", "visible_to", "pipeline_id"}
    | {"stage_id", "lead_id", "project_id", "probability"}
)
# What a create needs, per entity (V2M: person `name`, organization `name`, deal `title`;
# notes `content` and a parent, AddNoteRequest). An activity's required fields are not
# confirmed: none here.
REQUIRED = {
    "person": ("name",),
    "organization": ("name",),
    "deal": ("title",),
    "note": ("content",),
}
NOTE_PARENTS = ("deal_id", "person_id", "org_id", "lead_id", "project_id", "task_id")
# Fields Pipedrive sets itself; a write naming them is refused.
SYSTEM_FIELDS = frozenset({"id", "add_time", "update_time", "is_deleted", "company_id"})
FAULT_ACTIONS = (
    "drop_after_commit",  # apply the write, then close the connection without an answer
    "reset",  # close with RST before doing anything
    "delay",  # sleep `delay_seconds` first (past the client's timeout: answer lost)
    "error_500",
    "error_503",  # scheduled maintenance
    "error_402",  # company account not open
    "feature_capping",  # 403 with code feature_capping_deals_limit
    "cloudflare_403",  # 403 with an HTML page (429s ignored too long)
    "rate_limit",  # 429 as if the burst window were spent
)


def iso(ts: float) -> str:
    """RFC 3339 as API v2 writes it."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def iso_ms(ts: float) -> str:
    """ISO 8601 with milliseconds, as webhook `meta.timestamp` is in every example."""
    return (
        datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.")
        + f"{int(ts * 1000) % 1000:03d}Z"
    )


def v1_time(ts: float) -> str:
    """`YYYY-MM-DD HH:MM:SS` UTC, as v1 (notes) writes times."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S")


@dataclass
class FakePipedriveConfig:
    host: str = "127.0.0.1"
    port: int = 0
    company_id: int = 8087566
    company_domain: str = "onceflow-fake"
    # API tokens (one per user) -> the user they act as.
    api_tokens: dict[str, int] = field(default_factory=lambda: {"pd-api-token": 12415231})
    ui_user_id: int = 12415231  # the person editing in the web app (`/_admin/ui`)
    # OAuth: the installing user; the app's client.
    oauth_user_id: int = 12415232
    oauth_client_id: str = "fake-pd-client-id"
    oauth_client_secret: str = "fake-pd-client-secret"  # noqa: S105 - a local fake's default
    access_token_seconds: float = 3600.0
    rotate_refresh_tokens: bool = False  # the docs contradict each other (oauth.py)
    # Burst limits per token in a rolling 2 s window (Lite plan), and search's own.
    burst_window_seconds: float = 2.0
    burst_api_token: int = 20
    burst_oauth: int = 80
    burst_search: int = 10
    # The company's daily token budget (30,000 x plan multiplier x seats) and call costs.
    daily_budget: int = 30_000
    create_cost: int = 5  # not documented (a third party says 5 for a v2 create)
    daily_post_put_requests: int = 10_000  # x-daily-requests-left, API tokens only
    token_budget_headers: bool = False  # x-daily-ratelimit-token-* (UNCONFIRMED)
    retry_after_header: bool = False  # Retry-After on a 429 (UNCONFIRMED today)
    webhooks_per_user: int = 40
    # Custom fields per entity: 40-character hash -> field type (`varchar`, `double`, ...).
    custom_fields: dict[str, dict[str, str]] = field(default_factory=dict)
    delivery: DeliveryPolicy = field(default_factory=DeliveryPolicy)


COSTS = {"get": 1, "list": 10, "update": 5, "delete": 3, "search": 20, "webhooks": 10, "me": 1}


@dataclass
class Caller:
    token: str
    user_id: int
    oauth: bool


@dataclass
class StoredRecord:
    entity: str
    id: int
    fields: dict[str, Any]
    custom_fields: dict[str, Any]
    add_time: float
    update_time: float
    is_deleted: bool = False

    def api(self, config: FakePipedriveConfig) -> dict[str, Any]:
        """As API v2 answers it (notes: as v1 does)."""
        if self.entity == "note":
            return {
                "id": self.id,
                **self.fields,
                "add_time": v1_time(self.add_time),
                "update_time": v1_time(self.update_time),
                "active_flag": not self.is_deleted,
            }
        return {
            "id": self.id,
            **self.fields,
            "add_time": iso(self.add_time),
            "update_time": iso(self.update_time),
            "is_deleted": self.is_deleted,
            "custom_fields": dict(self.custom_fields),
        }

    def webhook_data(self, config: FakePipedriveConfig) -> dict[str, Any]:
        """As webhooks v2 carry it: typed custom fields, `visible_to` a string (WM examples)."""
        data = {"id": self.id, **self.fields, "add_time": iso(self.add_time)}
        data["update_time"] = iso(self.update_time)
        if "visible_to" in data and data["visible_to"] is not None:
            data["visible_to"] = str(data["visible_to"])
        if self.entity != "note":
            types = config.custom_fields.get(self.entity, {})
            data["custom_fields"] = {
                k: typed(types.get(k, "varchar"), v) for k, v in self.custom_fields.items()
            }
        return data


def typed(field_type: str, value: Any) -> Any:
    """A custom field's value as webhooks v2 type it (WM "Custom fields format")."""
    if value is None:
        return None
    if field_type == "monetary" and isinstance(value, dict):
        return {"type": "monetary", **value}
    if field_type == "enum":
        return {"type": "enum", "id": value}
    if field_type == "set":
        return {"type": "set", "values": [{"id": v} for v in value]}
    return {"type": field_type, "value": value}


class _Reply(Exception):
    def __init__(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        super().__init__(status)
        self.status = status
        self.body = body
        self.headers = headers or {}


class _Drop(Exception):
    def __init__(self, reset: bool) -> None:
        super().__init__("drop")
        self.reset = reset


def _error(status: int, message: str, **extra: Any) -> _Reply:
    """Pipedrive's error envelope (https://pipedrive.readme.io/docs/core-api-concepts-responses)."""
    body = {
        "success": False,
        "error": message,
        "error_info": "Please check developers.pipedrive.com for more information about "
        "Pipedrive API.",
        "data": None,
        "additional_data": None,
        **extra,
    }
    return _Reply(status, body)


@dataclass
class Fault:
    action: str
    method: str | None = None
    path: str | None = None
    times: int | None = 1
    delay_seconds: float = 0.0

    def matches(self, method: str, path: str) -> bool:
        if self.times is not None and self.times <= 0:
            return False
        if self.method and self.method.upper() != method.upper():
            return False
        return not (self.path and not re.search(self.path, path))


class FakePipedrive:
    """The server and its state. `start()` serves from a thread; `url` is its base URL."""

    def __init__(self, config: FakePipedriveConfig | None = None) -> None:
        self.config = config or FakePipedriveConfig()
        self.lock = threading.Lock()
        self.records: dict[str, dict[int, StoredRecord]] = {e: {} for e in ENTITIES}
        self.webhooks: dict[int, dict[str, Any]] = {}
        self.faults: list[Fault] = []
        self.requests: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []  # every change event made (before delivery)
        self._ids = itertools.count(1)
        self._webhook_ids = itertools.count(301)
        self._windows: dict[tuple[str, str], deque[float]] = {}
        self.budget_used = 0
        self._post_put_used: dict[str, int] = {}
        self.oauth = OAuthServer(
            client_id=self.config.oauth_client_id,
            client_secret=self.config.oauth_client_secret,
            access_seconds=self.config.access_token_seconds,
            rotate_refresh_tokens=self.config.rotate_refresh_tokens,
        )
        self.sender = WebhookSender(self.config.delivery)
        fake = self

        class Handler(_Handler):
            pd = fake

        self.server = ThreadingHTTPServer((self.config.host, self.config.port), Handler)
        self.server.daemon_threads = True
        self.oauth.api_domain = self.url

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> FakePipedrive:
        serve_in_thread(self.server, "fakepd")
        return self

    def stop(self) -> None:
        self.sender.stop()
        self.server.shutdown()
        self.server.server_close()

    # --- conveniences for in-process tests -------------------------------------------------
    def add_fault(self, action: str, **spec: Any) -> Fault:
        if action not in FAULT_ACTIONS:
            raise ValueError(f"action must be one of {', '.join(FAULT_ACTIONS)}")
        fault = Fault(action=action, **spec)
        with self.lock:
            self.faults.append(fault)
        return fault

    def take_fault(self, method: str, path: str) -> Fault | None:
        with self.lock:
            for fault in self.faults:
                if fault.matches(method, path):
                    if fault.times is not None:
                        fault.times -= 1
                    return fault
        return None

    def stored(self, entity: str) -> list[dict[str, Any]]:
        with self.lock:
            return [r.api(self.config) for r in self.records[entity].values() if not r.is_deleted]

    def issue_grant(self, redirect_uri: str, user_id: int | None = None) -> Grant:
        """A user installs the app, over HTTP as a client would: a code, then the exchange at
        the token endpoint with this fake's client (HTTP Basic client auth)."""
        who = Installed(user_id or self.config.oauth_user_id, self.config.company_id)
        code = self.oauth.authorize(who, redirect_uri)
        body = httpx.post(
            f"{self.url}/oauth/token",
            data={"grant_type": "authorization_code", "code": code, "redirect_uri": redirect_uri},
            auth=(self.config.oauth_client_id, self.config.oauth_client_secret),
        ).json()
        return Grant(body["access_token"], body["refresh_token"], body["expires_in"])

    # --- limits ----------------------------------------------------------------------------
    def take_burst(self, caller: Caller, search: bool) -> tuple[bool, dict[str, str]]:
        """One request against the token's rolling window (and search's own, for searches);
        the `x-ratelimit-*` headers of the window that is tighter."""
        config = self.config
        now = time.monotonic()
        window = config.burst_window_seconds
        limit = config.burst_oauth if caller.oauth else config.burst_api_token
        keys = [(caller.token, "all", limit)]
        if search:
            keys.append((caller.token, "search", config.burst_search))
        with self.lock:
            allowed = True
            shown: tuple[int, int, float] | None = None
            for token, kind, cap in keys:
                q = self._windows.setdefault((token, kind), deque())
                while q and now - q[0] >= window:
                    q.popleft()
                if len(q) >= cap:
                    allowed = False
            for token, kind, cap in keys:
                q = self._windows[(token, kind)]
                if allowed:
                    q.append(now)
                reset = (q[0] + window - now) if q else window
                remaining = max(cap - len(q), 0)
                if shown is None or remaining < shown[1]:
                    shown = (cap, remaining, reset)
        assert shown is not None
        cap, remaining, reset = shown
        headers = {
            "x-ratelimit-limit": str(cap),
            "x-ratelimit-remaining": str(remaining),
            "x-ratelimit-reset": str(max(math.ceil(reset), 1)),
        }
        return allowed, headers

    def charge(self, cost: int) -> bool:
        """Spend `cost` of the company's daily budget; False once it is spent (a 429)."""
        with self.lock:
            if self.budget_used >= self.config.daily_budget:
                return False
            self.budget_used += cost
            return True

    def budget_headers(self, caller: Caller, method: str) -> dict[str, str]:
        headers: dict[str, str] = {}
        config = self.config
        if not caller.oauth:
            with self.lock:
                used = self._post_put_used.get(caller.token, 0)
                if method in ("POST", "PUT", "PATCH"):
                    used += 1
                    self._post_put_used[caller.token] = used
            headers["x-daily-requests-left"] = str(max(config.daily_post_put_requests - used, 0))
        if config.token_budget_headers:
            headers["x-daily-ratelimit-token-limit"] = str(config.daily_budget)
            headers["x-daily-ratelimit-token-remaining"] = str(
                max(config.daily_budget - self.budget_used, 0)
            )
        return headers

    def midnight(self) -> None:
        with self.lock:
            self.budget_used = 0
            self._post_put_used.clear()

    # --- records and the events they cause -------------------------------------------------
    def _validate(self, entity: str, body: dict[str, Any], creating: bool) -> None:
        for name, value in body.items():
            if name in SYSTEM_FIELDS:
                raise _error(400, f"{name} is read-only")
            if (
                name in NUMBER_FIELDS
                and value is not None
                and (isinstance(value, bool) or not isinstance(value, int | float))
            ):
                raise _error(400, f"Validation failed: {name}: Parameter must be a number")
            if name in ("emails", "phones") and not (
                isinstance(value, list) and all(isinstance(v, dict) and "value" in v for v in value)
            ):
                raise _error(400, f"Validation failed: {name}: must be an array of objects")
        if entity == "activity" and "person_id" in body:
            raise _error(400, "person_id is read-only; use participants")
        if creating:
            if entity == "person" and not body.get("name") and body.get("first_name"):
                body["name"] = f"{body['first_name']} {body.get('last_name') or ''}".strip()
            for name in REQUIRED.get(entity, ()):
                if not body.get(name):
                    raise _error(400, f"Validation failed: {name}: Required")
            if entity == "note" and not any(body.get(p) for p in NOTE_PARENTS):
                raise _error(400, "Note must be attached to a deal, person, organization, lead")
        custom = body.get("custom_fields")
        if custom is not None:
            known = self.config.custom_fields.get(entity, {})
            if not isinstance(custom, dict):
                raise _error(400, "Validation failed: custom_fields: must be an object")
            for key in custom:
                if key not in known:
                    raise _error(400, f"Validation failed: custom_fields: unknown field {key}")

    def create(self, entity: str, body: dict[str, Any], who: tuple[str, int]) -> StoredRecord:
        """Non-idempotent on purpose: the same body twice makes two records (§3.2)."""
        body = dict(body)
        self._validate(entity, body, creating=True)
        custom = dict(body.pop("custom_fields", None) or {})
        now = time.time()
        with self.lock:
            record = StoredRecord(entity, next(self._ids), body, custom, now, now)
            self.records[entity][record.id] = record
        self._emit("create", record, None, who)
        return record

    def get(self, entity: str, record_id: str | None) -> StoredRecord:
        number = int(record_id) if record_id and record_id.isdigit() else -1
        with self.lock:
            record = self.records[entity].get(number)
        if record is None or record.is_deleted:
            raise _error(404, f"{entity.capitalize()} not found")
        return record

    def update(
        self, entity: str, record_id: str | None, body: dict[str, Any], who: tuple[str, int]
    ) -> StoredRecord:
        body = dict(body)
        self._validate(entity, body, creating=False)
        record = self.get(entity, record_id)
        custom = dict(body.pop("custom_fields", None) or {})
        types = self.config.custom_fields.get(entity, {})
        with self.lock:
            previous: dict[str, Any] = {}
            for name, value in body.items():
                if record.fields.get(name) != value:
                    previous[name] = record.fields.get(name)
                    record.fields[name] = value
            old_custom: dict[str, Any] = {}
            for key, value in custom.items():
                if record.custom_fields.get(key) != value:
                    old_custom[key] = typed(
                        types.get(key, "varchar"), record.custom_fields.get(key)
                    )
                    record.custom_fields[key] = value
            if old_custom:
                previous["custom_fields"] = old_custom
            if previous:
                # `previous` on a change always carries update_time too (WM "Update activity").
                previous["update_time"] = iso(record.update_time)
                record.update_time = max(time.time(), record.update_time + 0.001)
        if previous:
            self._emit("change", record, previous, who)
        return record

    def delete(self, entity: str, record_id: str | None, who: tuple[str, int]) -> StoredRecord:
        record = self.get(entity, record_id)
        with self.lock:
            record.is_deleted = True  # soft delete (V2M)
        self._emit("delete", record, None, who)
        return record

    def _emit(
        self,
        action: str,
        record: StoredRecord,
        previous: dict[str, Any] | None,
        who: tuple[str, int],
        extra_meta: dict[str, Any] | None = None,
    ) -> None:
        """The change as a v2 event, sent to every active webhook that covers it."""
        source, user_id = who
        config = self.config
        with self.lock:
            data = None if action == "delete" else record.webhook_data(config)
            if action == "delete":
                previous = record.webhook_data(config)
            self._drop_dead_webhooks()
            targets = [
                w
                for w in self.webhooks.values()
                if w["is_active"]
                and w["event_action"] in (action, "*")
                and w["event_object"] in (record.entity, "*")
            ]
            event_id = str(uuid.uuid4())
            self.events.append(
                {"id": event_id, "action": action, "entity": record.entity, "entity_id": record.id}
            )
        ident = str if config.delivery.string_ids else int
        for webhook in targets:
            meta = {
                "action": action,
                "entity": record.entity,
                "entity_id": ident(record.id),
                "company_id": ident(config.company_id),
                "correlation_id": str(uuid.uuid4()),
                "id": event_id,
                "is_bulk_edit": False,
                "timestamp": iso_ms(record.update_time),
                "type": webhook["type"],
                "user_id": ident(user_id),
                "version": "2.0",
                "webhook_id": str(webhook["id"]),
                "webhook_owner_id": str(webhook["owner_id"]),
                "change_source": source,
                "attempt": 1,
                "host": f"{config.company_domain}.pipedrive.com",
                **(extra_meta or {}),
            }
            self.sender.send(webhook, meta, {"data": data, "previous": previous})

    def merge(self, entity: str, from_id: str, to_id: str, who: tuple[str, int]) -> None:
        """Two records become one: v2 has no `merged` action, so the absorbed record's
        `delete` carries `merged_to_id` and the survivor's `change` `merged_from_id`
        (WM "Critical things" 6)."""
        absorbed = self.get(entity, from_id)
        survivor = self.get(entity, to_id)
        ident = str if self.config.delivery.string_ids else int
        with self.lock:
            absorbed.is_deleted = True
            old_update = iso(survivor.update_time)
            survivor.update_time = max(time.time(), survivor.update_time + 0.001)
        self._emit("delete", absorbed, None, who, {"merged_to_id": ident(survivor.id)})
        self._emit(
            "change",
            survivor,
            {"update_time": old_update},
            who,
            {"merged_from_id": ident(absorbed.id)},
        )

    # --- webhooks API (v1 only) ------------------------------------------------------------
    def add_webhook(self, body: dict[str, Any], caller: Caller) -> dict[str, Any]:
        for name in ("subscription_url", "event_action", "event_object"):
            if not body.get(name):
                raise _error(400, f"Validation failed: {name}: Required")
        if body["event_action"] not in ("create", "change", "delete", "*"):
            raise _error(400, "Validation failed: event_action")
        if body["event_object"] not in (
            *ENTITIES,
            "lead",
            "pipeline",
            "product",
            "stage",
            "user",
            "*",
        ):
            raise _error(400, "Validation failed: event_object")
        version = str(body.get("version") or "2.0")  # 2.0 is the default since 17 March 2025
        user_id = int(body.get("user_id") or caller.user_id)
        with self.lock:
            owned = [w for w in self.webhooks.values() if w["owner_id"] == caller.user_id]
            if len(owned) >= self.config.webhooks_per_user:
                raise _error(422, "Webhooks limit reached")
            webhook = {
                "id": next(self._webhook_ids),
                "company_id": self.config.company_id,
                "owner_id": caller.user_id,
                "user_id": user_id,
                "event_action": body["event_action"],
                "event_object": body["event_object"],
                "subscription_url": body["subscription_url"],
                "version": version,
                "is_active": 1,
                "add_time": v1_time(time.time()),
                "remove_time": None,
                "type": "application" if caller.oauth else "general",
                "http_auth_user": body.get("http_auth_user"),
                "http_auth_password": body.get("http_auth_password"),
                "remove_reason": None,
                "last_delivery_time": None,
                "last_http_status": None,
                "admin_id": caller.user_id,
                "name": body.get("name"),
            }
            self.webhooks[webhook["id"]] = webhook
            return public_webhook(webhook)

    def _drop_dead_webhooks(self) -> None:
        """Delete webhooks that failed for 3 (scaled) days (caller holds the lock): they are
        gone from the API, and a reconcile must create them again."""
        with self.sender.lock:
            dead = [i for i, w in self.webhooks.items() if self.sender.gone(w)]
        for hook_id in dead:
            del self.webhooks[hook_id]

    def visible_webhooks(self, caller: Caller) -> list[dict[str, Any]]:
        """An app sees only the webhooks it created (WA; changelog 5 May 2021)."""
        with self.lock:
            self._drop_dead_webhooks()
            return [
                w for w in self.webhooks.values() if not caller.oauth or w["type"] == "application"
            ]


def public_webhook(webhook: dict[str, Any]) -> dict[str, Any]:
    """As `/v1/webhooks` shows it. Copied first in one step (delivery threads update the dict)."""
    return {k: v for k, v in dict(webhook).items() if not k.startswith("_")}


class _Handler(BaseHTTPRequestHandler):
    pd: FakePipedrive
    protocol_version = "HTTP/1.1"
    server_version = "fakepipedrive/1.0"

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

    def _send(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        if isinstance(body, str):
            payload, kind = body.encode(), "text/html; charset=utf-8"
        else:
            payload, kind = (b"" if body is None else json.dumps(body).encode()), "application/json"
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if payload:
            self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if payload:
            self.wfile.write(payload)

    def _drop(self, reset: bool) -> None:
        self.close_connection = True
        if reset:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        else:
            self.connection.shutdown(socket.SHUT_RDWR)
        self.connection.close()

    def _body(self, raw: bytes) -> dict[str, Any]:
        if not raw:
            return {}
        if "x-www-form-urlencoded" in (self.headers.get("Content-Type") or ""):
            return {k: v[-1] for k, v in parse_qs(raw.decode("utf-8", "replace")).items()}
        try:
            body = json.loads(raw)
        except ValueError:
            raise _error(400, "Invalid JSON") from None
        if not isinstance(body, dict):
            raise _error(400, "Request body must be an object")
        return body

    def _caller(self) -> Caller:
        pd = self.pd
        token = self.headers.get("x-api-token")
        if token:
            user = pd.config.api_tokens.get(token)
            if user is None:
                raise _error(401, "unauthorized access", errorCode=401)
            return Caller(token, user, oauth=False)
        auth = self.headers.get("Authorization") or ""
        if auth.lower().startswith("bearer "):
            bearer = auth[7:].strip()
            who = pd.oauth.who(bearer)
            if who is None:
                raise _error(401, "Unauthorized. Access token expired or invalid", errorCode=401)
            return Caller(bearer, who.user_id, oauth=True)
        raise _error(401, "You need to be authorized to make this request.", errorCode=401)

    def _serve(self, method: str) -> None:
        url = urlsplit(self.path)
        path = url.path
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        entry: dict[str, Any] = {"method": method, "path": path, "status": None, "at": time.time()}
        pd = self.pd
        try:
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY:
                raise _error(413, "body too large")
            raw = self.rfile.read(length) if length else b""
            if path.startswith("/_admin"):
                self._send(*self._admin(method, path, self._body(raw)))
                return
            if path.startswith("/oauth/"):
                self._send(*self._oauth(method, path, url.query, raw))
                return
            with pd.lock:
                pd.requests.append(entry)
            fault = pd.take_fault(method, path)
            entry["fault"] = fault.action if fault else None
            if fault is not None:
                self._fault_before(fault)
            caller = self._caller()
            entry["user_id"] = caller.user_id
            search = path.endswith("/search")
            allowed, headers = pd.take_burst(caller, search)
            retry_after = {"Retry-After": headers["x-ratelimit-reset"]}
            if not allowed or (fault is not None and fault.action == "rate_limit"):
                reply = _error(429, "Request over limit")
                reply.headers = {
                    **headers,
                    **(retry_after if pd.config.retry_after_header else {}),
                }
                raise reply
            if not pd.charge(0):
                # The company's daily budget is spent: every request is a 429 until midnight.
                reply = _error(429, "Daily token budget exceeded")
                reply.headers = {**headers, **pd.budget_headers(caller, "GET")}
                raise reply
            status, body, cost = self._api(method, path, query, raw, caller)
            pd.charge(cost)
            headers.update(pd.budget_headers(caller, method))
            if fault is not None and fault.action == "drop_after_commit":
                raise _Drop(reset=False)
            entry["status"] = status
            self._send(status, body, headers)
        except _Reply as reply:
            entry["status"] = reply.status
            self._send(reply.status, reply.body, reply.headers)
        except _Drop as drop:
            entry["status"] = "dropped"
            self._drop(drop.reset)

    def _fault_before(self, fault: Fault) -> None:
        if fault.action == "delay":
            time.sleep(fault.delay_seconds)
        elif fault.action == "reset":
            raise _Drop(reset=True)
        elif fault.action == "error_500":
            raise _error(500, "Internal server error")
        elif fault.action == "error_503":
            raise _error(503, "Service unavailable: scheduled maintenance")
        elif fault.action == "error_402":
            raise _error(402, "Company account is not open")
        elif fault.action == "feature_capping":
            raise _error(403, "Open deals limit reached", code="feature_capping_deals_limit")
        elif fault.action == "cloudflare_403":
            raise _Reply(403, "<html><body><h1>Access denied</h1>Cloudflare</body></html>")

    # --- API ---------------------------------------------------------------------------------
    def _api(  # noqa: PLR0911 - one return per route
        self, method: str, path: str, query: dict[str, str], raw: bytes, caller: Caller
    ) -> tuple[int, Any, int]:
        pd = self.pd
        who = ("api", caller.user_id)
        if USERS_ME.match(path) and method == "GET":
            me = {
                "id": caller.user_id,
                "company_id": pd.config.company_id,
                "company_domain": pd.config.company_domain,
                "name": f"User {caller.user_id}",
            }
            return 200, {"success": True, "data": me}, COSTS["me"]
        matched = V2_PATH.match(path)
        if matched and matched["coll"] in V2_COLLECTIONS:
            entity = V2_COLLECTIONS[matched["coll"]]
            record_id = matched["id"]
            if record_id == "search" and method == "GET":
                return 200, self._search(entity, query), COSTS["search"]
            if record_id is None and method == "POST":
                made = pd.create(entity, self._body(raw), who)
                return 200, {"success": True, "data": made.api(pd.config)}, pd.config.create_cost
            if record_id is None and method == "GET":
                return 200, self._list(entity, query), COSTS["list"]
            if method == "GET":
                found = pd.get(entity, record_id)
                return 200, {"success": True, "data": found.api(pd.config)}, COSTS["get"]
            if method == "PATCH":
                changed = pd.update(entity, record_id, self._body(raw), who)
                return 200, {"success": True, "data": changed.api(pd.config)}, COSTS["update"]
            if method == "DELETE":
                gone = pd.delete(entity, record_id, who)
                return 200, {"success": True, "data": {"id": gone.id}}, COSTS["delete"]
            raise _error(405, "Method not allowed")
        matched = NOTES_PATH.match(path)
        if matched:
            record_id = matched["id"]
            if record_id is None and method == "POST":
                made = pd.create("note", self._body(raw), who)
                return (
                    200,
                    {"success": True, "data": made.api(pd.config)},
                    pd.config.create_cost * 2,
                )
            if record_id is not None and method == "GET":
                found = pd.get("note", record_id)
                return 200, {"success": True, "data": found.api(pd.config)}, COSTS["get"] * 2
            if record_id is not None and method == "PUT":  # v1: PUT, not PATCH
                changed = pd.update("note", record_id, self._body(raw), who)
                return 200, {"success": True, "data": changed.api(pd.config)}, COSTS["update"] * 2
            if record_id is not None and method == "DELETE":
                pd.delete("note", record_id, who)
                return 200, {"success": True, "data": int(record_id)}, COSTS["delete"] * 2
            raise _error(405, "Method not allowed")
        matched = WEBHOOKS_PATH.match(path)
        if matched:
            hook_id = matched["id"]
            if hook_id is None and method == "GET":
                hooks = [public_webhook(w) for w in pd.visible_webhooks(caller)]
                return 200, {"success": True, "data": hooks}, COSTS["webhooks"]
            if hook_id is None and method == "POST":
                made_hook = pd.add_webhook(self._body(raw), caller)
                return 201, {"success": True, "data": made_hook}, COSTS["webhooks"]
            if hook_id is not None and method == "DELETE":
                visible = {w["id"] for w in pd.visible_webhooks(caller)}
                number = int(hook_id) if hook_id.isdigit() else -1
                with pd.lock:
                    if number not in visible:
                        raise _error(404, "Webhook not found")
                    del pd.webhooks[number]
                return 200, {"success": True, "status": "ok"}, COSTS["delete"]
            raise _error(405, "Method not allowed")
        raise _error(404, "Unknown method .")

    def _list(self, entity: str, query: dict[str, str]) -> dict[str, Any]:
        """Cursor pagination, `limit` at most 500 (core-api-concepts-pagination)."""
        pd = self.pd
        limit = min(int(query.get("limit") or 100), 500)
        start = int(query.get("cursor") or 0)
        ids = {int(i) for i in query["ids"].split(",")} if query.get("ids") else None
        with pd.lock:
            rows = [
                r
                for r in pd.records[entity].values()
                if not r.is_deleted and (ids is None or r.id in ids)
            ]
        page = rows[start : start + limit]
        nxt = str(start + limit) if start + limit < len(rows) else None
        return {
            "success": True,
            "data": [r.api(pd.config) for r in page],
            "additional_data": {"next_cursor": nxt},
        }

    def _search(self, entity: str, query: dict[str, str]) -> dict[str, Any]:
        """`term` (2 characters at least, 1 with exact_match, which is case-insensitive) in
        `fields` (name, email, phone, custom_fields, ...) (SDK v2 searchPersons)."""
        pd = self.pd
        term = (query.get("term") or "").strip().lower()
        exact = query.get("exact_match") == "true"
        if len(term) < (1 if exact else 2):
            raise _error(400, "Validation failed: term: must be at least 2 characters")
        fields = [f for f in (query.get("fields") or "").split(",") if f]
        limit = min(int(query.get("limit") or 100), 500)
        start = int(query.get("cursor") or 0)

        def values(record: StoredRecord) -> list[str]:
            out: list[str] = []
            for name in fields or ["name", "title", "email", "phone", "custom_fields"]:
                if name == "email":
                    out += [str(e.get("value")) for e in record.fields.get("emails") or []]
                elif name == "phone":
                    out += [str(p.get("value")) for p in record.fields.get("phones") or []]
                elif name == "custom_fields":
                    out += [str(v) for v in record.custom_fields.values() if v is not None]
                elif record.fields.get(name) is not None:
                    out.append(str(record.fields[name]))
            return [v.lower() for v in out]

        with pd.lock:
            hits = [
                r
                for r in pd.records[entity].values()
                if not r.is_deleted
                and any((v == term) if exact else (term in v) for v in values(r))
            ]
        page = hits[start : start + limit]
        items = [{"result_score": 1.0, "item": r.api(pd.config)} for r in page]
        nxt = str(start + limit) if start + limit < len(hits) else None
        return {"success": True, "data": {"items": items}, "additional_data": {"next_cursor": nxt}}

    # --- OAuth -------------------------------------------------------------------------------
    def _oauth(
        self, method: str, path: str, query: str, raw: bytes
    ) -> tuple[int, Any, dict[str, str]]:
        pd = self.pd
        try:
            if path == "/oauth/token" and method == "POST":
                form = {k: v[-1] for k, v in parse_qs(raw.decode("utf-8", "replace")).items()}
                return 200, pd.oauth.token(form, self.headers.get("Authorization")), {}
            if path == "/oauth/authorize" and method == "GET":
                who = Installed(pd.config.oauth_user_id, pd.config.company_id)
                return 302, None, {"Location": pd.oauth.consent(parse_qs(query), who)}
        except OAuthRefused as refused:
            return refused.status, refused.body, {}
        return 404, {"success": False, "error": "not found"}, {}

    # --- admin -------------------------------------------------------------------------------
    def _admin(self, method: str, path: str, body: dict[str, Any]) -> tuple[int, Any]:  # noqa: PLR0911
        pd = self.pd
        if path == "/_admin/faults" and method == "POST":
            try:
                pd.add_fault(**body)
            except (TypeError, ValueError) as exc:
                return 400, {"error": str(exc)}
            return 201, {"ok": True}
        if path == "/_admin/merge" and method == "POST":  # a person merges two in the app
            pd.merge(
                str(body["entity"]),
                str(body["from_id"]),
                str(body["to_id"]),
                ("app", pd.config.ui_user_id),
            )
            return 200, {"ok": True}
        if path == "/_admin/midnight" and method == "POST":
            pd.midnight()
            return 200, {"ok": True}
        if path == "/_admin/oauth/expire" and method == "POST":
            pd.oauth.expire_access_tokens()
            return 200, {"ok": True}
        if path == "/_admin/oauth/api_domain" and method == "POST":
            pd.oauth.api_domain = str(body["api_domain"])
            return 200, {"ok": True}
        if path == "/_admin/oauth/uninstall" and method == "POST":
            pd.oauth.revoke()
            with pd.lock:  # the app's webhooks go with it (WA)
                for hook_id in [i for i, w in pd.webhooks.items() if w["type"] == "application"]:
                    del pd.webhooks[hook_id]
            return 200, {"ok": True}
        ui_new = re.match(r"^/_admin/ui/(?P<entity>[a-z]+)$", path)
        if ui_new and ui_new["entity"] in ENTITIES and method == "POST":
            # A person adds the record in the web app: `change_source: app` (the demo's
            # "company created in Pipedrive"). Validated as the API validates a create.
            try:
                made = pd.create(ui_new["entity"], body, ("app", pd.config.ui_user_id))
            except _Reply as refused:
                return refused.status, refused.body
            return 201, made.api(pd.config)
        ui = re.match(r"^/_admin/ui/(?P<entity>[a-z]+)/(?P<id>\d+)$", path)
        if ui and ui["entity"] in ENTITIES and method == "PATCH":
            # A person edits the record in the web app: `change_source: app`.
            changed = pd.update(ui["entity"], ui["id"], body, ("app", pd.config.ui_user_id))
            return 200, changed.api(pd.config)
        if path == "/_admin/state" and method == "GET":
            with pd.lock:
                return 200, {
                    "requests": list(pd.requests),
                    "events": list(pd.events),
                    "budget_used": pd.budget_used,
                    "webhooks": [public_webhook(w) for w in pd.webhooks.values()],
                }
        return 404, {"error": "unknown admin path"}
