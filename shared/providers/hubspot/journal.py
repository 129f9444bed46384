"""HubSpot's webhooks journal (developer platform 2026.03): an app's events read by offset.

What HubSpot says (docs/vendors/hubspot-2026.md section 2, with its sources):
- Paths (version 2026-03): the global journal (every install of the app)
  `GET /webhooks-journal/journal/2026-03/earliest` and `…/offset/{offset}/next`; the local
  journal of one portal `GET /webhooks-journal/journal-local/2026-03/…?installPortalId=`
  (https://developers.hubspot.com/docs/api-reference/latest/webhooks-journal/journal-entries/guide;
  HubSpot/hubspot-sdk-python `src/hubspot_sdk/resources/webhooks/api.md`).
- An answer is `{"url", "expiresAt", "currentOffset"}`: `currentOffset` a UUID, `url` "a
  temporary, pre-signed URL for downloading this entry's JSON file. Request it without an
  Authorization header" (2027-03-beta local-next reference).
- A 404 on `…/offset/{offset}/next`: "the offset has expired or doesn't exist" (2027-03-beta
  wording; not confirmed for 2026-03) — read as `OffsetGone`, a gap, never skipped silently.
- The end of the journal is not documented: HubSpot's advocate's sample CLI
  (sejal27/sej-webhooks-journal `src/utils/journal-api.ts`) takes HTTP 204 or an answer without
  `url` as "already on the latest offset"; so do we (`JournalEnd`).
- Entries are kept 3 days ("query for changes that occurred for your subscriptions over the past
  3 days", journal-entries guide).
- Authorised by a client-credentials token (`POST /oauth/2026-03/token`,
  `grant_type=client_credentials`, scope `developer.webhooks_journal.read`; the response's
  `access_token` and `expires_in`, no refresh token: HubSpot/hubspot-sdk-python
  `types/auth/oauth_create_token_params.py`, `client_credentials_token_response.py`), cached
  and fetched again before expiry (shared/accounts/client_credentials.py).

What an entry's file contains is NOT documented. The advocate's sample types it as
`{offset, journalEvents: [{type, portalId, occurredAt, action, objectTypeId, objectId,
propertyChanges?, associatedObjectId?, …}], publishedAt}` (sejal27/sej-webhooks-journal
`src/types/api.ts`, "allow for unknown structure"). So the reader keeps the file as downloaded
(the inbox row's body) and `webhook_body` reads it defensively into the webhook events
shared/providers/hubspot/normalize.py already understands: one per change (a created record,
each changed property, …), in the same fields a webhook names the same change by — which is
what makes a change that came both ways ONE event (normalize.py `dedup_key`). A file that
yields no event is rejected by the drain, visibly, with the file kept.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import httpx

from shared.accounts.client_credentials import ClientToken, ClientTokenCache
from shared.accounts.provider_apps import ProviderApp
from shared.normalize.event import UnparseableBody, snake
from shared.port.http import classify_transport_error
from shared.port.interface import Capabilities, PortError, Subscription
from shared.providers.descriptor import (
    JOURNAL_NAME_HEADER,
    JOURNAL_OFFSET_HEADER,
    Journal,
    JournalEnd,
    JournalEntry,
    JournalRead,
    OffsetGone,
)
from shared.providers.hubspot import versions
from shared.providers.hubspot.normalize import object_type_for, type_id_for
from shared.providers.hubspot.port import (
    DEFAULT_BASE_URL,
    DEFAULT_TIMEOUT_SECONDS,
    classify_response,
)

READ_SCOPES = ("developer.webhooks_journal.read",)
RETENTION_SECONDS = 3 * 24 * 3600
# A pre-signed link that expired between the `next` answer and the download is asked for again
# (the same `next` gives a fresh link), this many times.
LINK_ATTEMPTS = 2

TOKENS = ClientTokenCache()
_client_lock = threading.Lock()
_shared_client: httpx.Client | None = None


def _client() -> httpx.Client:
    """One pooled client per process (httpx clients are thread-safe): building one costs tens
    of milliseconds (its TLS context), more than a journal call, and a pass makes two calls per
    entry (measured: 5 entries/s with a client per call on a loaded 2-core machine)."""
    global _shared_client  # noqa: PLW0603 - one pool per process, like the CRM ports' cache
    with _client_lock:
        if _shared_client is None:
            _shared_client = httpx.Client(timeout=DEFAULT_TIMEOUT_SECONDS, trust_env=False)
        return _shared_client


# Journal actions (docs/vendors/hubspot-2026.md 2.3 `actions`) -> the webhook verb of the same
# change (normalize.py `_ACTIONS`).
_VERBS = {
    "CREATE": "creation",
    "UPDATE": "propertyChange",
    "DELETE": "deletion",
    "MERGE": "merge",
    "RESTORE": "restore",
    "ASSOCIATION_ADDED": "associationChange",
    "ASSOCIATION_REMOVED": "associationChange",
    "GDPR_DELETE": "privacyDeletion",
}


def journal_path(journal: str, tail: str) -> tuple[str, dict[str, str]]:
    """The path and query of a journal call: the global journal, or one portal's local one."""
    if journal == "global":
        return versions.journal(tail, local=False), {}
    return versions.journal(tail, local=True), {"installPortalId": journal}


def fetch_client_token(
    base_url: str, client_id: str, client_secret: str, scopes: tuple[str, ...]
) -> ClientToken:
    form = {
        "grant_type": "client_credentials",
        "client_id": client_id,
        "client_secret": client_secret,
        "scope": " ".join(scopes),
    }
    try:
        response = _client().post(base_url.rstrip("/") + versions.oauth_token(), data=form)
    except httpx.HTTPError as exc:
        raise classify_transport_error(exc) from exc
    if response.status_code != 200:
        raise classify_response(response)
    body = response.json()
    try:
        return ClientToken(str(body["access_token"]), float(body["expires_in"]))
    except (KeyError, TypeError, ValueError):
        raise PortError(
            "HubSpot's token answer has no access_token/expires_in", code="unknown", transient=True
        ) from None


def app_token(app: ProviderApp, scopes: tuple[str, ...] = READ_SCOPES) -> tuple[str, Any]:
    """A client-credentials token of the app (cached), and its cache key (to `forget` it)."""
    base = app.api_base_url or DEFAULT_BASE_URL
    client_id, secret = app.oauth_client()
    key = (base, app.app_id, client_id, scopes)
    token = TOKENS.token(key, lambda: fetch_client_token(base, client_id, secret, scopes))
    return token, key


def _get(client: httpx.Client, url: str, **kwargs: Any) -> httpx.Response:
    try:
        return client.get(url, **kwargs)
    except httpx.HTTPError as exc:
        raise classify_transport_error(exc) from exc


def next_entry(app: ProviderApp, journal: str, after: str | None) -> JournalRead:
    """The entry after offset `after` (None: the earliest kept) of the app's journal."""
    base = (app.api_base_url or DEFAULT_BASE_URL).rstrip("/")
    path, params = journal_path(journal, "earliest" if after is None else f"offset/{after}/next")
    client = _client()
    for _ in range(LINK_ATTEMPTS):
        response = _authorized_get(client, app, base + path, params)
        if response.status_code == 204 or not response.content:
            return JournalEnd()
        if response.status_code == 404:
            if after is None:  # an empty journal may answer 404 to "earliest"
                return JournalEnd()
            return OffsetGone(f"HubSpot answered 404 to the entry after offset {after}")
        if response.status_code != 200:
            raise classify_response(response)
        try:
            answer = response.json()
        except ValueError:
            raise PortError(
                "HubSpot's journal answer is not JSON", code="unknown", transient=True
            ) from None
        url, offset = answer.get("url"), answer.get("currentOffset")
        if not url:
            return JournalEnd()
        if not isinstance(offset, str) or not offset:
            raise PortError(
                "HubSpot's journal answer has no currentOffset", code="unknown", transient=True
            )
        # Pre-signed: no Authorization header (it would be sent to a storage host).
        file = _get(client, str(url))
        if file.status_code == 200:
            return JournalEntry(offset=offset, body=file.content)
        if file.status_code not in (403, 404, 410):
            raise classify_response(file)
        # The link expired before we used it: the same call gives a fresh one.
    raise PortError(
        "the journal entry's download link kept expiring", code="timeout", transient=True
    )


def _authorized_get(
    client: httpx.Client, app: ProviderApp, url: str, params: Mapping[str, str]
) -> httpx.Response:
    """A journal call with the app's token; a 401 drops the token and tries once more."""
    token, key = app_token(app)
    response = _get(client, url, params=params, headers={"Authorization": f"Bearer {token}"})
    if response.status_code == 401:
        TOKENS.forget(key, token)
        token, key = app_token(app)
        response = _get(client, url, params=params, headers={"Authorization": f"Bearer {token}"})
    return response


# --- an entry's file -> webhook events ------------------------------------------------------


def _ms(value: Any) -> int | None:
    """occurredAt as epoch ms: a number (ms) or an ISO-8601 string, whichever the file has."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return int(value)
    if isinstance(value, str):
        if value.isdigit():
            return int(value)
        try:
            return round(datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() * 1000)
        except ValueError:
            return None
    return None


def _value(value: Any) -> Any:
    """A property's new value as a webhook gives it (a string), from whatever the file holds."""
    if isinstance(value, Mapping):
        for name in ("value", "newValue", "propertyValue"):
            if name in value:
                return _value(value[name])
        return json.dumps(value, sort_keys=True)
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _changes(raw: Mapping[str, Any]) -> list[tuple[str, Any]]:
    changes = raw.get("propertyChanges")
    if isinstance(changes, Mapping):
        return [(str(k), _value(v)) for k, v in changes.items()]
    out: list[tuple[str, Any]] = []
    if isinstance(changes, list):
        for item in changes:
            if isinstance(item, Mapping):
                name = item.get("propertyName") or item.get("name")
                if name:
                    out.append((str(name), _value(item)))
    if not out and raw.get("propertyName"):
        out.append((str(raw["propertyName"]), _value(raw.get("propertyValue"))))
    return out


def _from_journal_event(
    raw: Mapping[str, Any], ref: str, default_portal: str | None
) -> list[dict[str, Any]]:
    action = str(raw.get("action") or "").upper()
    type_id = raw.get("objectTypeId")
    verb = _VERBS.get(action) or _camel(action) or "change"
    kind = "object" if type_id else snake(str(raw.get("type") or raw.get("subscriptionType") or ""))
    base: dict[str, Any] = {
        "eventId": ref,
        "portalId": raw.get("portalId", default_portal),
        "occurredAt": _ms(raw.get("occurredAt", raw.get("timestamp"))),
        "objectId": raw.get("objectId"),
        "changeSource": raw.get("changeSource"),
        "sourceId": raw.get("sourceId"),
        "appId": raw.get("appId"),
        "journal": {"ref": ref, "action": action, "type": raw.get("type")},
    }
    if type_id:
        base["objectTypeId"] = str(type_id)
    for name in ("associatedObjectId", "associatedObjectTypeId", "associationType", "listId"):
        if name in raw:
            base[name] = raw[name]
    base = {k: v for k, v in base.items() if v is not None}
    changes = _changes(raw)
    events: list[dict[str, Any]] = []
    if verb != "propertyChange" or not changes:
        events.append({**base, "subscriptionType": f"{kind or 'journal'}.{verb}"})
    if verb in ("creation", "propertyChange"):
        events.extend(
            {
                **base,
                "subscriptionType": f"{kind or 'journal'}.propertyChange",
                "propertyName": name,
                "propertyValue": value,
            }
            for name, value in changes
        )
    if verb == "propertyChange" and not changes:
        events[-1]["subscriptionType"] = f"{kind or 'journal'}.update"
    return events


def _camel(action: str) -> str:
    head, *rest = action.lower().split("_")
    return head + "".join(part.title() for part in rest)


def _events_of(data: Any) -> tuple[list[Any], str | None]:
    if isinstance(data, list):
        return data, None
    if isinstance(data, Mapping):
        offset = data.get("offset") or data.get("currentOffset")
        for name in ("journalEvents", "events", "results"):
            if isinstance(data.get(name), list):
                return list(data[name]), None if offset is None else str(offset)
        return [data], None if offset is None else str(offset)
    raise UnparseableBody("a journal entry that is neither an object nor a list")


def webhook_events(body: bytes, headers: Mapping[str, str]) -> list[dict[str, Any]]:
    """A journal entry's file (an inbox row's body) as webhook events, one per change."""
    try:
        data = json.loads(body)
    except ValueError:
        raise UnparseableBody("a journal entry that is not JSON") from None
    items, file_offset = _events_of(data)
    offset = headers.get(JOURNAL_OFFSET_HEADER) or file_offset or "-"
    journal = headers.get(JOURNAL_NAME_HEADER)
    portal = journal if journal and journal != "global" else None
    out: list[dict[str, Any]] = []
    for index, raw in enumerate(items):
        if not isinstance(raw, Mapping):
            raise UnparseableBody(f"journal event {index} is not an object")
        if "subscriptionType" in raw and "action" not in raw:  # already a webhook event
            out.append({"eventId": f"{offset}#{index}", **raw})
        else:
            out.extend(_from_journal_event(raw, f"{offset}#{index}", portal))
    return out


def webhook_body(body: bytes, headers: Mapping[str, str]) -> bytes:
    return json.dumps(webhook_events(body, headers)).encode()


def is_journal_row(headers: Mapping[str, str]) -> bool:
    return JOURNAL_OFFSET_HEADER in headers


# --- subscriptions of a journal app (the management API) ------------------------------------

SUBSCRIPTION_SCOPES = (
    "developer.webhooks_journal.subscriptions.read",
    "developer.webhooks_journal.subscriptions.write",
)
SUBSCRIPTIONS_PATH = versions.journal_subscriptions()
# Webhook verbs (the reconcile's event kinds, PROVIDER.subscription_event_kinds) -> the
# journal's `actions` (docs/vendors/hubspot-2026.md 2.3).
_ACTIONS = {verb: action for action, verb in _VERBS.items() if action != "ASSOCIATION_REMOVED"}


class JournalSubscriptions:
    """The reconcile's subscription API (shared/port/interface.py `SubscriptionApi`) over
    HubSpot's journal subscription management API, for one app and the portals that installed
    it. Journal subscriptions are per install (`portalId` in each, "install-specific", journal
    guide), while the reconcile thinks in one desired set per app: a key (object, event kind,
    property) is listed as present only when EVERY portal has it, a create adds it to the
    portals that lack it, a delete removes it from all. Each key is one subscription
    (`subscriptionType` OBJECT, one action, at most one property): HubSpot's semantics of an
    empty `properties` / `objectIds` are not documented, so onceflow never relies on them for a
    property change and sends `objectIds: []` ("all records", as the advocate's sample treats
    it — not confirmed). A subscription of another shape is listed by each key it covers;
    deleting one of its keys deletes it whole (the next reconcile re-creates what is still
    needed)."""

    capabilities = Capabilities(subscription_management=True)

    def __init__(self, app: ProviderApp, portals: tuple[str, ...]) -> None:
        self.app = app
        self.portals = portals
        self.base = (app.api_base_url or DEFAULT_BASE_URL).rstrip("/")

    def _call(self, method: str, path: str, body: Any = None) -> httpx.Response:
        token, key = app_token(self.app, SUBSCRIPTION_SCOPES)
        client = _client()
        try:
            response = client.request(
                method,
                self.base + path,
                json=body,
                headers={"Authorization": f"Bearer {token}"},
            )
            if response.status_code == 401:
                TOKENS.forget(key, token)
                token, key = app_token(self.app, SUBSCRIPTION_SCOPES)
                response = client.request(
                    method,
                    self.base + path,
                    json=body,
                    headers={"Authorization": f"Bearer {token}"},
                )
        except httpx.HTTPError as exc:
            raise classify_transport_error(exc) from exc
        if response.status_code >= 300:
            raise classify_response(response)
        return response

    def _by_key(self) -> dict[tuple[str, str, str | None], dict[str, set[str]]]:
        """{key: {portal: {subscription ids}}} of the app's portals' live subscriptions."""
        results = self._call("GET", SUBSCRIPTIONS_PATH).json().get("results") or []
        found: dict[tuple[str, str, str | None], dict[str, set[str]]] = {}
        for sub in results:
            if not isinstance(sub, Mapping) or sub.get("deletedAt"):
                continue
            portal = str(sub.get("portalId"))
            if portal not in self.portals or not sub.get("objectTypeId"):
                continue
            object_type = object_type_for(str(sub["objectTypeId"]))
            for action in sub.get("actions") or ():
                verb = _VERBS.get(str(action))
                if verb is None:
                    continue
                names: list[str | None] = (
                    list(sub.get("properties") or []) if verb == "propertyChange" else [None]
                )
                for name in names or [None]:
                    key = (object_type, verb, name)
                    found.setdefault(key, {}).setdefault(portal, set()).add(str(sub["id"]))
        return found

    def list_subscriptions(self) -> list[Subscription]:
        return [
            Subscription(o, k, p, id=json.dumps([o, k, p]))
            for (o, k, p), portals in self._by_key().items()
            if all(portal in portals for portal in self.portals)
        ]

    def create_subscription(self, subscription: Subscription) -> Subscription:
        type_id = type_id_for(subscription.object_type)
        action = _ACTIONS.get(subscription.event_kind)
        if type_id is None or action is None:
            raise PortError(
                f"the journal has no subscription for {subscription.object_type}"
                f".{subscription.event_kind}",
                code="invalid_request",
                transient=False,
            )
        have = self._by_key().get(subscription.key(), {})
        for portal in self.portals:
            if portal in have:
                continue
            self._call(
                "POST",
                SUBSCRIPTIONS_PATH,
                {
                    "subscriptionType": "OBJECT",
                    "portalId": int(portal),
                    "actions": [action],
                    "objectTypeId": type_id,
                    "objectIds": [],
                    "properties": [subscription.property_name]
                    if subscription.property_name
                    else [],
                },
            )
        return subscription

    def delete_subscription(self, subscription_id: str) -> None:
        o, k, p = json.loads(subscription_id)
        ids = {i for portal in self._by_key().get((o, k, p), {}).values() for i in portal}
        for sub_id in sorted(ids):
            try:
                self._call("DELETE", f"{SUBSCRIPTIONS_PATH}/{sub_id}")
            except PortError as exc:
                if exc.code != "not_found":
                    raise


JOURNAL = Journal(
    next_entry=next_entry, retention_seconds=RETENTION_SECONDS, subscriptions=JournalSubscriptions
)
