"""The Pipedrive adapter: API v2 records (v1 where v2 has none: notes, webhooks, users) over
httpx. Facts and their sources: docs/vendors/pipedrive.md (cited below by section).

Everything Pipedrive-specific stops here. Responses become `Record`/`Subscription`; failures
become `PortError` with a vendor-neutral code, classified once (`classify_response`):

- 429 → `rate_limited`, transient. Retry-after: `Retry-After` if sent (only a 2015 doc
  mentions it), else `x-ratelimit-reset` ("the remaining window before the rate limit resets",
  seconds), else the 2-second burst window; when `x-daily-ratelimit-token-remaining` says the
  company's daily budget is spent (UNCONFIRMED header), until the next UTC midnight (the reset
  is at midnight in the server's time zone, which Pipedrive does not name). Rate limiting:
  https://pipedrive.readme.io/docs/core-api-concepts-rate-limiting (§4).
- 403 with an HTML page → `rate_limited` with a long back-off (Cloudflare's block of API-token
  traffic that ignored 429s, §3.1); 403 with `code: feature_capping_*` → `invalid_request`
  (a plan limit, permanent); other 403s and 401 → `unauthorized`; 402 (account not open) →
  `unauthorized`, permanent. HTTP status codes:
  https://pipedrive.readme.io/docs/core-api-concepts-http-status-codes
- 404/410 → `not_found`; 400/415/422 → `invalid_request` with Pipedrive's `error` message;
  5xx → `unavailable` (503 = scheduled maintenance), transient.
- connect errors → `connect_failed`; timeouts → `timeout`; a dropped connection →
  `connection_reset` (the write may have been applied).
- Never `conflict`: Pipedrive has no unique values, no upsert and no idempotency key (§3.2
  "Idempotent creates: none"), so `write_idempotency` is False and a create whose answer is
  lost stays OUTCOME_UNKNOWN in shared/blocks/crm.py — never sent again.

Object names: the port takes Pipedrive's own (`person`, `organization`, `deal`, `activity`,
`note`) or onceflow's neutral kinds (the crm blocks pass `contacts`, `companies`, `deals`,
`tasks`), singular or plural, and answers with the neutral kind, as record keys and events
name records: one table, kinds.py, which the `Provider` declares as its `object_kinds`.

Auth (§2): an API token goes in the `x-api-token` header (never `?api_token=`, which leaks into
logs); an OAuth connection sends `Authorization: Bearer` from its token source and, on a 401,
refreshes once and retries once (a 401 was not applied, so resending a create is safe).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from shared.port.http import PortHttp, TokenSource
from shared.port.interface import (
    Association,
    Capabilities,
    PortError,
    RateLimitState,
    Record,
    SearchFilter,
    SearchPage,
    Subscription,
)
from shared.providers.pipedrive.kinds import ENTITIES, EVENT_OBJECTS

# The generic API host; a connection should name its company domain (`api_domain` of an
# OAuth grant, `https://{companydomain}.pipedrive.com` for an API token) as its base URL.
DEFAULT_BASE_URL = "https://api.pipedrive.com"
DEFAULT_TIMEOUT_SECONDS = 10.0
BURST_WINDOW_MS = 2000  # the burst limit's rolling window (§4)
HTML_403_BACKOFF_SECONDS = 300.0  # Cloudflare's block: no documented length; back off long

# API v2 collection per entity; notes have no v2 API (V2M's list; SDK v1 AddNoteRequest).
V2_PATHS = {
    "person": "/api/v2/persons",
    "organization": "/api/v2/organizations",
    "deal": "/api/v2/deals",
    "activity": "/api/v2/activities",
}
NOTES_PATH = "/v1/notes"
WEBHOOKS_PATH = "/v1/webhooks"  # v1 only: there is no v2 webhooks endpoint (§1.4)
# An association to a record of this entity is this id field on the new record (§3.2
# "Associations are id fields on the record").
ASSOCIATION_FIELDS = {"person": "person_id", "organization": "org_id", "deal": "deal_id"}
# Fields API v2 takes only as numbers (strict validation, no string -> number coercion: V2M
# "General API Changes"); a workflow's expression may well produce "42".
NUMBER_FIELDS = frozenset(
    {"org_id", "owner_id", "person_id", "deal_id", "pipeline_id", "stage_id", "visible_to"}
    | {"lead_id", "project_id", "user_id"}
)
CUSTOM_FIELD_KEY = re.compile(r"^[0-9a-f]{40}$")  # custom fields are keyed by a 40-char hash
# What a search may look in, per entity (SDK v2 search*: `fields`); a property named here is
# searched through /search, others are refused (no generic property filter exists, §3.2).
SEARCH_FIELDS = {
    "person": {"name": "name", "email": "email", "phone": "phone", "notes": "notes"},
    "organization": {"name": "name", "address": "address", "notes": "notes"},
    "deal": {"title": "title", "notes": "notes"},
}


def _number(value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(float(value))
    except ValueError:
        return None


def _seconds_to_utc_midnight() -> float:
    now = datetime.now(UTC)
    midnight = (now + timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
    return max((midnight - now).total_seconds(), 1.0)


def _body(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None


def _message(response: httpx.Response) -> str:
    body = _body(response)
    if isinstance(body, dict):
        for key in ("error", "message"):
            if isinstance(body.get(key), str):
                return str(body[key])
    return response.text[:300]


def rate_limit_wait(headers: httpx.Headers) -> float:
    """How long a 429 asks us to wait, from its headers (module docstring)."""
    if headers.get("x-daily-ratelimit-token-remaining") == "0":
        return _seconds_to_utc_midnight()
    retry_after = headers.get("Retry-After")
    if retry_after is not None:
        try:
            return max(float(retry_after), 0.0)
        except ValueError:
            pass
    reset = _number(headers.get("x-ratelimit-reset"))
    return float(reset) if reset is not None and reset > 0 else BURST_WINDOW_MS / 1000


def classify_response(response: httpx.Response) -> PortError:  # noqa: PLR0911 - per status
    """A non-2xx Pipedrive answer as a classified `PortError` (the one place this is decided)."""
    status = response.status_code
    message = f"Pipedrive answered {status}: {_message(response)}"

    def error(code: str, transient: bool, retry_after: float | None = None) -> PortError:
        return PortError(
            message, code=code, transient=transient, retry_after=retry_after, status=status
        )

    if status == 429:
        return error("rate_limited", True, rate_limit_wait(response.headers))
    if status == 403:
        body = _body(response)
        if body is None:  # an HTML page: Cloudflare blocks traffic that ignored 429s
            return error("rate_limited", True, HTML_403_BACKOFF_SECONDS)
        code = body.get("code") if isinstance(body, dict) else None
        if isinstance(code, str) and code.startswith("feature_capping"):
            return error("invalid_request", False)
        return error("unauthorized", False)
    if status == 408:
        return error("timeout", True)
    if status >= 500:
        return error("unavailable", True)
    if status in (404, 410):
        return error("not_found", False)
    if status in (401, 402):
        return error("unauthorized", False)
    if status in (400, 415, 422):
        return error("invalid_request", False)
    return error("unknown", False)


def read_rate_limit(headers: httpx.Headers) -> tuple[RateLimitState, float | None]:
    """What an answer's x-ratelimit headers say, and how long its window is spent: when none is
    left the next call would be a certain 429, so until the reset the same answer names
    (seconds), else a whole burst window (§4)."""
    remaining = _number(headers.get("x-ratelimit-remaining"))
    reset = _number(headers.get("x-ratelimit-reset"))
    seconds = float(reset) if reset is not None and reset > 0 else BURST_WINDOW_MS / 1000
    tokens_left = _number(headers.get("x-daily-ratelimit-token-remaining"))  # UNCONFIRMED
    # API tokens only, and POST/PUT only (changelog "daily-api-limit-for-postput-endpoints"):
    # taken as the daily figure too, the tighter of the two, which at 0 also parks reads.
    requests_left = _number(headers.get("x-daily-requests-left"))
    daily = [n for n in (tokens_left, requests_left) if n is not None]
    state = RateLimitState(
        remaining=remaining,
        max=_number(headers.get("x-ratelimit-limit")),
        interval_ms=BURST_WINDOW_MS,
        extra={"daily_remaining": tokens_left, "daily_requests_left": requests_left},
        reset_seconds=seconds,
        daily_remaining=min(daily) if daily else None,
    )
    if remaining != 0:
        return state, None
    return state, float(math.ceil(seconds))


def entity_of(object_type: str) -> str:
    found = ENTITIES.get(object_type.strip().lower())
    if found is None:
        raise PortError(
            f"unsupported Pipedrive object type {object_type!r}",
            code="invalid_request",
            transient=False,
        )
    return found


def _path_id(value: str) -> str:
    """Ids are numeric at Pipedrive; anything else could rewrite the path."""
    text = str(value).strip()
    if not text.isdigit():
        raise PortError(f"invalid id {value!r}", code="invalid_request", transient=False)
    return text


def request_body(
    entity: str, properties: Mapping[str, Any], associations: Sequence[Association] = ()
) -> dict[str, Any]:
    """A workflow's flat properties as a v2 body: custom fields (by hash) nested in
    `custom_fields`, a person's `email`/`phone` as the arrays v2 takes, numeric ids as numbers,
    associations as id fields (an activity's person through `participants`: its `person_id` is
    read-only, V2M "Activities API")."""
    body: dict[str, Any] = {}
    custom: dict[str, Any] = {}
    for name, value in properties.items():
        if CUSTOM_FIELD_KEY.match(name) and entity != "note":
            custom[name] = value
        elif entity == "person" and name in ("email", "phone") and not isinstance(value, list):
            body[f"{name}s"] = [{"value": value, "primary": True, "label": "work"}]
        elif name in NUMBER_FIELDS and isinstance(value, str) and value.strip().isdigit():
            body[name] = int(value)
        else:
            body[name] = value
    for association in associations:
        target = entity_of(association.to_object_type)
        to_id = int(_path_id(association.to_id))
        if entity == "activity" and target == "person":
            body.setdefault("participants", []).append({"person_id": to_id, "primary": True})
            continue
        field = ASSOCIATION_FIELDS.get(target)
        if field is None or target == entity:
            raise PortError(
                f"a {entity} cannot be linked to a {target} at create",
                code="invalid_request",
                transient=False,
            )
        body[field] = to_id
    if custom:
        body["custom_fields"] = custom
    return body


def record_of(entity: str, data: Any) -> Record:
    """A v2 (or v1 note) object as a `Record`: custom fields flattened by hash beside the
    standard fields, and a person's primary email and phone as `email` and `phone`."""
    if not isinstance(data, dict) or "id" not in data:
        raise PortError("Pipedrive answered without a record id", code="unknown", transient=False)
    props = {k: v for k, v in data.items() if k not in ("id", "custom_fields")}
    custom = data.get("custom_fields")
    if isinstance(custom, dict):
        props.update(custom)
    for name in ("email", "phone"):
        items = data.get(f"{name}s")
        if isinstance(items, list) and items and name not in props:
            primary = next((i for i in items if isinstance(i, dict) and i.get("primary")), None)
            first = primary or items[0]
            # Objects in a record; a search item's may be plain strings (not confirmed).
            props[name] = first.get("value") if isinstance(first, dict) else first
    # Named as onceflow names it (contact, not person): record keys and labels are neutral.
    return Record(
        object_type=EVENT_OBJECTS.get(entity, entity), id=str(data["id"]), properties=props
    )


class PipedrivePort:
    """One connection's view of Pipedrive. Thread-safe; keeps the last rate-limit state."""

    capabilities = Capabilities(
        # No idempotency key, no upsert, no unique value (§3.2): a retried create makes a
        # second record (tests/test_fakepipedrive.py), so creates stay at-most-once.
        write_idempotency=False,
        # meta.change_source + meta.user_id (§5): a hint, the echo-marker rule stays fallback.
        event_author_identity=True,
        subscription_management=True,  # /v1/webhooks: create, list, delete (§1.4)
    )
    idempotency_property: str | None = None

    def __init__(
        self,
        token: str | None,
        *,
        base_url: str | None = None,
        app_id: str | None = None,
        developer_api_key: str | None = None,
        idempotency_property: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        transport: httpx.BaseTransport | None = None,
        token_source: TokenSource | None = None,
        webhook_url: str | None = None,
        webhook_auth: tuple[str, str] | None = None,
    ) -> None:
        """`token`: the user's API token (`x-api-token`). `token_source`: without a `token`, an
        OAuth connection's live access token; with one, what a refused API token is reported
        as (shared/providers/connect.py `_static_credential`: it raises, naming the variable).
        `idempotency_property` is ignored: Pipedrive has no unique-value property to key
        creates on.
        `webhook_url`/`webhook_auth`: where the webhooks this port creates deliver, and the
        HTTP Basic user and password they carry (the only credential, §1.2)."""
        del app_id, developer_api_key, idempotency_property  # no app-level API, no unique value
        self.base_url = (base_url or DEFAULT_BASE_URL).rstrip("/")
        self.webhook_url = webhook_url
        self.webhook_auth = webhook_auth
        self._http = PortHttp(
            vendor="Pipedrive",
            base_url=self.base_url,
            headers={"Accept": "application/json", **({"x-api-token": token} if token else {})},
            timeout=timeout,
            transport=transport,
            read_limits=read_rate_limit,
            token_source=token_source,
            # An API token goes in x-api-token, never a Bearer: the source is asked only after
            # a 401, to report the refused token.
            live_token=token is None,
            static_token=token,
            initial=RateLimitState(interval_ms=BURST_WINDOW_MS),
        )

    @property
    def rate_limit(self) -> RateLimitState:
        return self._http.rate_limit

    def close(self) -> None:
        self._http.close()

    # --- plumbing ----------------------------------------------------------------------------
    def _request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, str] | None = None,
    ) -> Any:
        # A search counts against the token's window and search's own (10 per 2 s); its
        # answer's headers are the tighter of the two, so a spent one holds back searches only.
        windows = ("all", "search") if path.endswith("/search") else ("all",)
        response = self._http.request(method, path, json=json, params=params, windows=windows)
        if response.status_code >= 300:
            raise classify_response(response)
        body = _body(response)
        if not isinstance(body, dict):
            raise PortError(
                "Pipedrive answered with a body that is not its JSON envelope",
                code="unknown",
                transient=False,
            )
        return body

    # --- records -----------------------------------------------------------------------------
    def create(
        self,
        object_type: str,
        properties: Mapping[str, Any],
        associations: Sequence[Association] = (),
    ) -> Record:
        entity = entity_of(object_type)
        body = request_body(entity, properties, associations)
        path = NOTES_PATH if entity == "note" else V2_PATHS[entity]
        return record_of(entity, self._request("POST", path, json=body).get("data"))

    def update(self, object_type: str, object_id: str, properties: Mapping[str, Any]) -> Record:
        entity = entity_of(object_type)
        body = request_body(entity, properties)
        if entity == "note":  # v1: PUT, not PATCH
            answer = self._request("PUT", f"{NOTES_PATH}/{_path_id(object_id)}", json=body)
        else:
            answer = self._request("PATCH", f"{V2_PATHS[entity]}/{_path_id(object_id)}", json=body)
        return record_of(entity, answer.get("data"))

    def get(self, object_type: str, object_id: str, properties: Sequence[str] = ()) -> Record:
        entity = entity_of(object_type)
        if entity == "note":
            answer = self._request("GET", f"{NOTES_PATH}/{_path_id(object_id)}")
            return record_of(entity, answer.get("data"))
        # `custom_fields=` selects at most 15 custom field keys (SDK getPerson).
        custom = [p for p in properties if CUSTOM_FIELD_KEY.match(p)][:15]
        params = {"custom_fields": ",".join(custom)} if custom else None
        answer = self._request("GET", f"{V2_PATHS[entity]}/{_path_id(object_id)}", params=params)
        return record_of(entity, answer.get("data"))

    def search(
        self, object_type: str, filters: Sequence[SearchFilter], limit: int = 10
    ) -> list[Record]:
        return self.search_page(object_type, filters, limit=limit).records

    def search_page(
        self,
        object_type: str,
        filters: Sequence[SearchFilter],
        *,
        limit: int = 100,
        after: str | None = None,
        properties: Sequence[str] = (),
    ) -> SearchPage:
        """One page of `/api/v2/{entity}/search`. Pipedrive has no generic property filter
        (§3.2): the first filter is the search (`EQ` → `exact_match=true`, `CONTAINS_TOKEN` →
        a substring match; a named field, or a custom field by hash), and any further `EQ`
        filters are checked on the page it returns. Other operators are refused."""
        entity = entity_of(object_type)
        if entity not in SEARCH_FIELDS or not filters:
            raise PortError(
                f"Pipedrive cannot search {entity} records by property (or without a filter)",
                code="invalid_request",
                transient=False,
            )
        first, *rest = filters
        if first.operator not in ("EQ", "CONTAINS_TOKEN") or any(f.operator != "EQ" for f in rest):
            raise PortError(
                "Pipedrive's search takes EQ (and CONTAINS_TOKEN on the first filter) only",
                code="invalid_request",
                transient=False,
            )
        if CUSTOM_FIELD_KEY.match(first.property):
            field = "custom_fields"
        else:
            found = SEARCH_FIELDS.get(entity, {}).get(first.property)
            if found is None:
                raise PortError(
                    f"Pipedrive cannot search {entity} by {first.property!r}",
                    code="invalid_request",
                    transient=False,
                )
            field = found
        params = {
            "term": str(first.value),
            "fields": field,
            "exact_match": "true" if first.operator == "EQ" else "false",
            "limit": str(max(1, min(limit, 500))),
        }
        if after is not None:
            params["cursor"] = after
        answer = self._request("GET", f"{V2_PATHS[entity]}/search", params=params)
        data = answer.get("data") if isinstance(answer.get("data"), dict) else {}
        items = data.get("items", []) if isinstance(data, dict) else []
        records = [record_of(entity, i.get("item")) for i in items if isinstance(i, dict)]
        records = [
            r
            for r in records
            if all(str(r.properties.get(f.property)) == str(f.value) for f in rest)
        ]
        extra = answer.get("additional_data")
        nxt = extra.get("next_cursor") if isinstance(extra, dict) else None
        return SearchPage(records, None if nxt is None else str(nxt))

    # --- webhook subscriptions (used by reconcile) -------------------------------------------
    def target_webhooks(self, url: str, credential: str | None) -> None:
        """Where this port's webhooks deliver (the connection's URL) and the `user:password`
        they present there with HTTP Basic (shared/providers/pipedrive/signature.py checks
        it): shared/providers/connect.py calls this (`WebhookTargeted`)."""
        self.webhook_url = url
        if credential and ":" in credential:
            user, _, password = credential.partition(":")
            self.webhook_auth = (user, password)
        else:
            # signature.py compares the Basic credential with the whole secret, which Basic
            # can only carry as `user:password`: without one, no webhook could be verified.
            self.webhook_auth = None

    def list_subscriptions(self) -> list[Subscription]:
        """The active webhooks of this port's URL (an app sees only its own, §1.4), one
        `Subscription` each, its object named as the events name it (`EVENT_OBJECTS`). A
        webhook Pipedrive deleted (3 days without a successful delivery, §1.3) is simply gone
        from the list, so the reconcile creates it again."""
        answer = self._request("GET", WEBHOOKS_PATH)
        out: list[Subscription] = []
        for hook in answer.get("data") or []:
            if not isinstance(hook, dict) or not hook.get("is_active", True):
                continue
            if self.webhook_url and hook.get("subscription_url") != self.webhook_url:
                continue  # another integration's webhook: not ours to delete
            entity = str(hook.get("event_object"))
            out.append(
                Subscription(
                    object_type=EVENT_OBJECTS.get(entity, entity),
                    event_kind=str(hook.get("event_action")),
                    id=str(hook["id"]) if hook.get("id") is not None else None,
                )
            )
        return out

    def create_subscription(self, subscription: Subscription) -> Subscription:
        """A webhook v2 for (object, action). There are no per-field subscriptions: the
        property is dropped (the normaliser filters on the keys of `previous`). At most 40 per
        user: the 41st is a 422 (`invalid_request`)."""
        if not self.webhook_url:
            raise PortError(
                "this Pipedrive port has no webhook URL to subscribe",
                code="invalid_request",
                transient=False,
            )
        if self.webhook_auth is None:
            raise PortError(
                "the connection's webhook secret must be `user:password`: Pipedrive's webhooks "
                "carry it as HTTP Basic, their only credential",
                code="invalid_request",
                transient=False,
            )
        entity = ENTITIES.get(subscription.object_type, subscription.object_type)
        request: dict[str, Any] = {
            "subscription_url": self.webhook_url,
            "event_action": subscription.event_kind,
            "event_object": entity,
            "version": "2.0",  # the default since 17 March 2025; sent anyway (§1.4)
            "name": "onceflow",
        }
        if self.webhook_auth is not None:
            request["http_auth_user"], request["http_auth_password"] = self.webhook_auth
        hook = self._request("POST", WEBHOOKS_PATH, json=request).get("data") or {}
        return Subscription(
            object_type=EVENT_OBJECTS.get(entity, entity),
            event_kind=subscription.event_kind,
            id=str(hook["id"]) if isinstance(hook, dict) and hook.get("id") is not None else None,
        )

    def delete_subscription(self, subscription_id: str) -> None:
        self._request("DELETE", f"{WEBHOOKS_PATH}/{_path_id(subscription_id)}")
