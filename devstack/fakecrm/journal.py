"""The fake's webhooks journal (HubSpot developer platform 2026.03), as
docs/vendors/hubspot-2026.md section 2 describes it:

- Client-credentials tokens: `POST /oauth/2026-03/token` (and `/oauth/v1/token`, which older
  journal guides show) with `grant_type=client_credentials`, the app's `client_id` and
  `client_secret`, `scope` space-separated; answers `access_token`, `expires_in`, `token_type`,
  `token_use: "client_credentials"`, `scopes`. No refresh token. A journal call needs a live
  token with `developer.webhooks_journal.read` (401 without a live token, 403 without the scope).
- Entries: a record change in a portal whose app reads the journal (`portals`, or every portal
  with `all_portals`) appends an entry: one file per write, `{"offset", "publishedAt",
  "journalEvents": [{"type": "OBJECT", "portalId", "occurredAt" (ISO), "action",
  "objectTypeId", "objectId", "propertyChanges", "changeSource", "sourceId"}]}` — the shape
  of HubSpot's advocate's sample (sejal27/sej-webhooks-journal `src/types/api.ts`); the real
  file's contents are not documented, which is why the reader keeps files raw. Offsets are UUIDs.
- `GET /webhooks-journal/journal/2026-03/earliest`, `…/latest`, `…/offset/{offset}/next`, and
  the same under `journal-local` with `?installPortalId=` (entries of that portal only):
  `{"url", "expiresAt", "currentOffset"}`, the url a pre-signed link (`/_journal-files/…`,
  fetched without Authorization) that expires after `link_seconds`; 204 at the end; 404 when
  the offset has expired (older than 3 days on the journal's clock) or never existed.
- Duplicates where HubSpot may duplicate: with `duplicate_every` N, every Nth entry is written
  twice (the same events at a second offset) — at-least-once, as a journal may be.
- The journal's clock is the fake's clock plus `clock_offset_ms`, which tests move
  (`POST /_admin/journal/advance {"seconds": N}`), so 3 days pass in a call.

Admin: `GET /_admin/journal` (state), `POST /_admin/journal` (`portals`, `all_portals`,
`duplicate_every`, `link_seconds`, `token_seconds`), `POST /_admin/journal/advance`.
"""

from __future__ import annotations

import json
import secrets
import threading
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs

from devstack.fakecrm.store import now_ms

TOKEN_PATHS = ("/oauth/2026-03/token", "/oauth/v1/token")
JOURNAL_PREFIXES = {
    "/webhooks-journal/journal/2026-03/": "global",
    "/webhooks-journal/journal-local/2026-03/": "local",
}
FILES_PREFIX = "/_journal-files/"
READ_SCOPE = "developer.webhooks_journal.read"
SUBS_READ_SCOPE = "developer.webhooks_journal.subscriptions.read"
SUBS_WRITE_SCOPE = "developer.webhooks_journal.subscriptions.write"
SUBSCRIPTIONS_PATH = "/webhooks-journal/subscriptions/2026-03"
KNOWN_SCOPES = frozenset(
    {
        READ_SCOPE,
        "developer.webhooks_journal.subscriptions.read",
        "developer.webhooks_journal.subscriptions.write",
        "developer.webhooks_journal.snapshots.read",
        "developer.webhooks_journal.snapshots.write",
    }
)
RETENTION_MS = 3 * 24 * 3600 * 1000
# Webhook verbs (the fake's own events) -> journal actions.
ACTIONS = {"creation": "CREATE", "propertyChange": "UPDATE", "deletion": "DELETE"}
TYPE_IDS = {"contact": "0-1", "company": "0-2", "deal": "0-3", "ticket": "0-5"}

Reply = tuple[int, Any, dict[str, str]]


def iso(ms: int) -> str:
    return (
        datetime.fromtimestamp(ms / 1000, UTC)
        .isoformat(timespec="milliseconds")
        .replace("+00:00", "Z")
    )


@dataclass
class Entry:
    offset: str
    written_ms: int
    portal: int
    file: bytes


@dataclass
class FakeJournal:
    client_id: str
    client_secret: str
    lock: threading.Lock = field(default_factory=threading.Lock)
    portals: set[int] = field(default_factory=set)
    all_portals: bool = False
    duplicate_every: int = 0
    link_seconds: float = 300.0
    token_seconds: float = 1800.0
    clock_offset_ms: int = 0
    entries: list[Entry] = field(default_factory=list)
    tokens: dict[str, tuple[int, frozenset[str]]] = field(default_factory=dict)
    links: dict[str, tuple[str, int]] = field(default_factory=dict)  # link -> (offset, expiry)
    subscriptions: dict[str, dict[str, Any]] = field(default_factory=dict)
    token_grants: int = 0
    downloads: int = 0
    _written: int = 0
    _deleted: int = 0

    def now(self) -> int:
        return now_ms() + self.clock_offset_ms

    # --- writes ----------------------------------------------------------------------------
    def record(self, events: list[dict[str, Any]]) -> None:
        """A write's webhook events (devstack/fakecrm/server.py) as one journal entry per
        portal that reads the journal; the creation and its properties are one CREATE."""
        by_portal: dict[int, list[dict[str, Any]]] = {}
        with self.lock:
            for event in events:
                portal = int(event["portalId"])
                if (self.all_portals or portal in self.portals) and self._wanted(event):
                    by_portal.setdefault(portal, []).append(event)
            for portal, group in by_portal.items():
                journal_events = _journal_events(group)
                copies = 1
                self._written += 1
                if self.duplicate_every and self._written % self.duplicate_every == 0:
                    copies = 2
                for _ in range(copies):
                    self._append(portal, journal_events)

    def _append(self, portal: int, journal_events: list[dict[str, Any]]) -> None:
        offset = str(uuid.uuid4())
        written = self.now()
        file = {"offset": offset, "publishedAt": iso(written), "journalEvents": journal_events}
        self.entries.append(Entry(offset, written, portal, json.dumps(file).encode()))

    # --- the API ---------------------------------------------------------------------------
    def serve(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, list[str]],
        raw: bytes,
        authorization: str | None,
        base_url: str,
    ) -> Reply | None:
        """The journal's answer to a request, or None when it is not the journal's."""
        if path == SUBSCRIPTIONS_PATH or path.startswith(SUBSCRIPTIONS_PATH + "/"):
            return self._subscriptions(method, path[len(SUBSCRIPTIONS_PATH) :], raw, authorization)
        form: dict[str, str] = {}
        if method == "POST":
            form = {k: v[-1] for k, v in parse_qs(raw.decode("utf-8", "replace")).items()}
        if path in TOKEN_PATHS and method == "POST":
            if form.get("grant_type") != "client_credentials":
                return None  # an install's code or refresh: the OAuth server's
            return self._token(form)
        if path.startswith(FILES_PREFIX) and method == "GET":
            return self._download(path[len(FILES_PREFIX) :])
        for prefix, kind in JOURNAL_PREFIXES.items():
            if path.startswith(prefix) and method == "GET":
                self._authorize(authorization)
                portal = None
                if kind == "local":
                    wanted = query.get("installPortalId")
                    portal = int(wanted[-1]) if wanted and wanted[-1].isdigit() else None
                return self._read(path[len(prefix) :], portal, base_url)
        return None

    def _token(self, form: dict[str, str]) -> Reply:
        if form.get("client_id") != self.client_id or form.get("client_secret") != (
            self.client_secret
        ):
            return 400, {"status": "BAD_CLIENT_ID", "message": "unknown client"}, {}
        scopes = frozenset(form.get("scope", "").split())
        unknown = scopes - KNOWN_SCOPES
        if not scopes or unknown:
            return 400, {"status": "invalid_scope", "message": f"bad scopes {sorted(unknown)}"}, {}
        token = "cc-" + secrets.token_urlsafe(16)
        with self.lock:
            self.tokens[token] = (self.now() + int(self.token_seconds * 1000), scopes)
            self.token_grants += 1
        return (
            200,
            {
                "access_token": token,
                "expires_in": int(self.token_seconds),
                "token_type": "bearer",
                "token_use": "client_credentials",
                "scopes": sorted(scopes),
            },
            {},
        )

    def _authorize(self, authorization: str | None, scope: str = READ_SCOPE) -> None:
        token = (authorization or "").removeprefix("Bearer ")
        with self.lock:
            found = self.tokens.get(token)
        if found is None or found[0] <= self.now():
            raise JournalRefusal(401, "INVALID_AUTHENTICATION", "missing or expired token")
        if scope not in found[1]:
            raise JournalRefusal(403, "MISSING_SCOPES", f"the token lacks {scope}")

    def _subscriptions(
        self, method: str, tail: str, raw: bytes, authorization: str | None
    ) -> Reply:
        """`/webhooks-journal/subscriptions/2026-03`: list (GET), create or update (POST),
        delete one (DELETE /{id}), delete a portal's (DELETE /portals/{portalId})."""
        write = method != "GET"
        self._authorize(authorization, SUBS_WRITE_SCOPE if write else SUBS_READ_SCOPE)
        with self.lock:
            if method == "GET" and tail == "":
                return 200, {"results": list(self.subscriptions.values())}, {}
            if method == "POST" and tail == "":
                try:
                    body = json.loads(raw or b"{}")
                    sub = {
                        "subscriptionType": str(body["subscriptionType"]),
                        "portalId": int(body["portalId"]),
                        "actions": [str(a) for a in body["actions"]],
                        "objectTypeId": str(body["objectTypeId"]),
                        "objectIds": list(body.get("objectIds") or []),
                        "properties": list(body.get("properties") or []),
                    }
                except (ValueError, KeyError, TypeError):
                    raise JournalRefusal(
                        400,
                        "VALIDATION_ERROR",
                        "subscriptionType, portalId, actions and objectTypeId are required",
                    ) from None
                sub_id = str(len(self.subscriptions) + self._deleted + 7001)
                stamp = iso(self.now())
                sub.update(id=sub_id, appId=0, createdAt=stamp, updatedAt=stamp)
                self.subscriptions[sub_id] = sub
                return 200, sub, {}
            if method == "DELETE" and tail.startswith("/portals/"):
                portal = int(tail[len("/portals/") :])
                for sub_id in [k for k, v in self.subscriptions.items() if v["portalId"] == portal]:
                    del self.subscriptions[sub_id]
                    self._deleted += 1
                return 204, None, {}
            if method == "DELETE" and tail.startswith("/"):
                if self.subscriptions.pop(tail[1:], None) is None:
                    raise JournalRefusal(404, "OBJECT_NOT_FOUND", "subscription not found")
                self._deleted += 1
                return 204, None, {}
        raise JournalRefusal(405, "VALIDATION_ERROR", "method not allowed")

    def _wanted(self, event: dict[str, Any]) -> bool:
        """Whether the portal subscribed to this change; a portal without any journal
        subscription gets every change (friendlier before a reconcile ran, like the webhooks'
        `require_subscriptions` off)."""
        portal = int(event["portalId"])
        subs = [s for s in self.subscriptions.values() if s["portalId"] == portal]
        if not subs:
            return True
        obj, _, verb = str(event["subscriptionType"]).partition(".")
        action = ACTIONS.get(verb, verb.upper())
        return any(
            s["objectTypeId"] == TYPE_IDS.get(obj, obj)
            and action in s["actions"]
            and (
                action != "UPDATE"
                or not s["properties"]
                or event.get("propertyName") in s["properties"]
            )
            for s in subs
        )

    def _kept(self, portal: int | None) -> list[Entry]:
        oldest = self.now() - RETENTION_MS
        return [
            e
            for e in self.entries
            if e.written_ms >= oldest and (portal is None or e.portal == portal)
        ]

    def _read(self, tail: str, portal: int | None, base_url: str) -> Reply:
        with self.lock:
            kept = self._kept(portal)
            if tail == "earliest":
                found = kept[0] if kept else None
            elif tail == "latest":
                found = kept[-1] if kept else None
            elif tail.startswith("offset/") and tail.endswith("/next"):
                offset = tail[len("offset/") : -len("/next")]
                index = next((i for i, e in enumerate(kept) if e.offset == offset), None)
                if index is None:
                    raise JournalRefusal(
                        404, "OBJECT_NOT_FOUND", f"offset {offset} has expired or doesn't exist"
                    )
                found = kept[index + 1] if index + 1 < len(kept) else None
            else:
                raise JournalRefusal(404, "OBJECT_NOT_FOUND", f"no journal route {tail}")
            if found is None:
                return 204, None, {}
            link = secrets.token_urlsafe(16)
            expires = self.now() + int(self.link_seconds * 1000)
            self.links[link] = (found.offset, expires)
        body = {
            "url": f"{base_url}{FILES_PREFIX}{link}",
            "expiresAt": iso(expires),
            "currentOffset": found.offset,
        }
        return 200, body, {}

    def _download(self, link: str) -> Reply:
        with self.lock:
            found = self.links.get(link)
            if found is None or found[1] <= self.now():
                # S3's answer to an expired pre-signed URL is a 403.
                return 403, {"message": "Request has expired"}, {}
            entry = next((e for e in self.entries if e.offset == found[0]), None)
            self.downloads += 1
        if entry is None:
            return 404, {"message": "NoSuchKey"}, {}
        return 200, RawBody(entry.file), {}

    # --- admin -----------------------------------------------------------------------------
    def admin(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        if path == "/_admin/journal" and method == "POST":
            with self.lock:
                if "portals" in body:
                    self.portals = {int(p) for p in body["portals"]}
                if "all_portals" in body:
                    self.all_portals = bool(body["all_portals"])
                for name in ("duplicate_every",):
                    if name in body:
                        setattr(self, name, int(body[name]))
                for name in ("link_seconds", "token_seconds"):
                    if name in body:
                        setattr(self, name, float(body[name]))
            return 200, self.state()
        if path == "/_admin/journal/advance" and method == "POST":
            with self.lock:
                self.clock_offset_ms += int(float(body.get("seconds", 0)) * 1000)
            return 200, self.state()
        if path == "/_admin/journal" and method == "GET":
            return 200, self.state()
        raise JournalRefusal(404, "OBJECT_NOT_FOUND", f"no journal admin route {method} {path}")

    def state(self) -> dict[str, Any]:
        return {
            "portals": sorted(self.portals),
            "all_portals": self.all_portals,
            "entries": [
                {"offset": e.offset, "portal": e.portal, "written_ms": e.written_ms}
                for e in self.entries
            ],
            "clock_offset_ms": self.clock_offset_ms,
            "subscriptions": list(self.subscriptions.values()),
            "token_grants": self.token_grants,
            "downloads": self.downloads,
        }


class RawBody(bytes):
    """A body sent as is (an entry's file), not JSON-encoded again."""


class JournalRefusal(Exception):
    def __init__(self, status: int, category: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.body = {
            "category": category,
            "message": message,
            "correlationId": str(uuid.uuid4()),
        }


def _journal_events(group: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The webhook events of one write as journal events: one per (object, time), a creation
    carrying its properties, changes grouped in `propertyChanges`."""
    merged: dict[tuple[str, int, int], dict[str, Any]] = {}
    for event in group:
        obj, _, verb = str(event["subscriptionType"]).partition(".")
        key = (obj, int(event["objectId"]), int(event["occurredAt"]))
        item = merged.get(key)
        if item is None:
            item = merged[key] = {
                "type": "OBJECT",
                "portalId": event["portalId"],
                "occurredAt": iso(int(event["occurredAt"])),
                "action": ACTIONS.get(verb, verb.upper()),
                "objectTypeId": TYPE_IDS.get(obj, obj),
                "objectId": event["objectId"],
                "changeSource": event.get("changeSource"),
                "sourceId": event.get("sourceId"),
            }
        if verb == "creation":
            item["action"] = "CREATE"
        if verb == "propertyChange":
            item.setdefault("propertyChanges", {})[event["propertyName"]] = event.get(
                "propertyValue"
            )
    return list(merged.values())
