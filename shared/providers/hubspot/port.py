"""The HubSpot adapter: CRM objects and a legacy app's webhook subscriptions over httpx, on the
date-based paths versions.py pins (never a numbered `/crm/v3` one).

Everything HubSpot-specific stops here. Responses become `Record`/`Subscription`; failures
become `PortError` with a vendor-neutral code, classified once:

- 429 → `rate_limited`, transient, retry-after from `Retry-After`, else the interval the same
  answer's `X-HubSpot-RateLimit-Interval-Milliseconds` gives (CRM 429s don't promise
  Retry-After), else the last interval seen; 408/425 → `timeout`; 5xx → `unavailable`;
  423 Locked and 477 Migration in Progress → `busy` (HubSpot refused to act now; 477 carries
  Retry-After); all transient. Source:
  https://developers.hubspot.com/docs/api-reference/error-handling
- connect errors → `connect_failed` (transient, and the request never left); read/write
  timeouts → `timeout`; a connection dropped or reset mid-request → `connection_reset`
  (transient, but the write may have been applied: at-most-once callers must not retry).
- 409 → `conflict`, permanent, with HubSpot's "Existing ID: N" in `existing_id`: the record
  holding whichever unique value clashed (`errors[].in` names the property, e.g. a contact's
  `email`), so not necessarily the record of onceflow's key property (crm.create reads it back
  before adopting it).
- 404 → `not_found`, 401/403 → `unauthorized`, 400/422 → `invalid_request`; anything else
  → `unknown`; all permanent.
- A write refused by the portal's own validation rules (enforced on every CRM write from the
  `2026-09` version: "the API will return a 400 validation error if that property is missing on
  write", https://developers.hubspot.com/changelog/crm-api-write-validation-enforcement) is a 400
  with `category: VALIDATION_ERROR`: `invalid_request`, permanent (sending it again is refused
  again until an admin changes the rule or the workflow sends the property), and its message
  carries what the rule says (`_validation_detail`), which is what the step's error shows.

The `X-HubSpot-RateLimit-*` headers are read on every answer: when the last one said the window
is spent, the next call is refused locally as `rate_limited` until the interval has passed,
instead of spending a request on a certain 429.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
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
    plural_object_type,
)
from shared.providers.hubspot import versions

DEFAULT_BASE_URL = "https://api.hubapi.com"
DEFAULT_TIMEOUT_SECONDS = 10.0
_EXISTING_ID = re.compile(r"Existing ID:\s*(\d+)")
# 423: the record is locked by another sync; 477: the portal is being migrated between data
# centres (Retry-After says when to come back). Both retryable per HubSpot's error handling.
BUSY_STATUSES = frozenset({423, 477})


# HubSpot-defined association type ids, (from, to) plural types: the tasks guide
# (https://developers.hubspot.com/docs/api-reference/latest/crm/activities/tasks/guide) lists
# task -> contact 204, company 192, deal 216. A task must be associated to show on a record.
DEFAULT_ASSOCIATION_TYPES = {
    ("tasks", "contacts"): 204,
    ("tasks", "companies"): 192,
    ("tasks", "deals"): 216,
}


def association_input(object_type: str, association: Association) -> dict[str, Any]:
    """One entry of a create's `associations`."""
    to_type = plural_object_type(association.to_object_type)
    type_id = association.type_id or DEFAULT_ASSOCIATION_TYPES.get((object_type, to_type))
    if type_id is None:
        raise PortError(
            f"no default association type from {object_type} to {to_type}; set type_id",
            code="invalid_request",
            transient=False,
        )
    return {
        "to": {"id": _path_id(association.to_id)},
        "types": [{"associationCategory": "HUBSPOT_DEFINED", "associationTypeId": type_id}],
    }


def _retry_after(headers: httpx.Headers) -> float | None:
    value = headers.get("Retry-After")
    if value is None:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        return None


def _interval_ms(headers: httpx.Headers) -> int | None:
    value = headers.get("X-HubSpot-RateLimit-Interval-Milliseconds")
    return int(value) if value is not None and value.isdigit() and int(value) > 0 else None


def _message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:300]
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        detail = _validation_detail(body) if body.get("category") == "VALIDATION_ERROR" else ""
        return str(body["message"])[:500] + detail
    return response.text[:300]


def _validation_detail(body: Mapping[str, Any]) -> str:
    """What a `VALIDATION_ERROR`'s `errors[]` add to its `message`: each error's own message and
    the properties it names (`context.propertyName`), e.g. " [leadsource: Lead source is
    required for customers]". HubSpot's CRM errors "include detailed message, code, and context
    fields", all of which "should be treated as optional in any error parsing"
    (https://developers.hubspot.com/docs/api-reference/latest/error-handling); the shape of a
    validation rule's `errors[]` items is not documented further, so anything missing is
    skipped, and an item that repeats the top `message` adds nothing."""
    errors = body.get("errors")
    if not isinstance(errors, list):
        return ""
    top = str(body.get("message", ""))
    parts: list[str] = []
    for item in errors[:10]:
        if not isinstance(item, dict) or not isinstance(item.get("message"), str):
            continue
        text = item["message"].strip()
        context = item.get("context")
        names = context.get("propertyName") if isinstance(context, dict) else None
        if isinstance(names, list) and names:
            text = f"{', '.join(str(n) for n in names)}: {text}"
        if text and text != top and text not in parts:
            parts.append(text[:300])
    return f" [{'; '.join(parts)}]" if parts else ""


def classify_response(response: httpx.Response, interval_ms: int | None = None) -> PortError:
    """A non-2xx HubSpot answer as a classified `PortError` (the one place this is decided)."""
    status = response.status_code
    message = f"HubSpot answered {status}: {_message(response)}"
    if status == 429:
        retry_after = _retry_after(response.headers)
        if retry_after is None:
            interval = _interval_ms(response.headers) or interval_ms or 10_000
            retry_after = interval / 1000
        return PortError(
            message, code="rate_limited", transient=True, retry_after=retry_after, status=status
        )
    if status in BUSY_STATUSES:
        return PortError(
            message,
            code="busy",
            transient=True,
            status=status,
            retry_after=_retry_after(response.headers),
        )
    if status in (408, 425):
        return PortError(message, code="timeout", transient=True, status=status)
    if status >= 500:
        return PortError(
            message,
            code="unavailable",
            transient=True,
            status=status,
            retry_after=_retry_after(response.headers),
        )
    if status == 409:
        found = _EXISTING_ID.search(message)
        return PortError(
            message,
            code="conflict",
            transient=False,
            status=status,
            existing_id=found.group(1) if found else None,
        )
    code = {404: "not_found", 401: "unauthorized", 403: "unauthorized", 400: "invalid_request"}
    return PortError(
        message,
        code=code.get(status, "invalid_request" if status == 422 else "unknown"),
        transient=False,
        status=status,
    )


def read_rate_limit(headers: httpx.Headers) -> tuple[RateLimitState, float | None]:
    """What an answer's `X-HubSpot-RateLimit-*` headers say, and how long the window is spent:
    when none is left, a full interval (we don't know where in the window we are)."""

    def number(name: str) -> int | None:
        value = headers.get(name)
        return int(value) if value is not None and value.isdigit() else None

    remaining = number("X-HubSpot-RateLimit-Remaining")
    interval_ms = number("X-HubSpot-RateLimit-Interval-Milliseconds")
    # Daily headers come only with private-app (and service-key) calls: "OAuth authenticated
    # calls will not include X-HubSpot-RateLimit-Daily or X-HubSpot-RateLimit-Daily-Remaining
    # because there is no daily limit for these calls"
    # (https://developers.hubspot.com/changelog/rate-limit-headers-will-now-appear-for-oauth-authenticated-calls).
    daily_remaining = number("X-HubSpot-RateLimit-Daily-Remaining")
    state = RateLimitState(
        remaining=remaining,
        max=number("X-HubSpot-RateLimit-Max"),
        interval_ms=interval_ms,
        extra={"daily": number("X-HubSpot-RateLimit-Daily"), "daily_remaining": daily_remaining},
        # The ten-secondly window is rolling and its headers don't say where in it we are:
        # assume a whole interval is left to run.
        reset_seconds=interval_ms / 1000 if interval_ms else None,
        daily_remaining=daily_remaining,
    )
    spent = state.interval_ms / 1000 if remaining == 0 and state.interval_ms else None
    return state, spent


def _record(object_type: str, body: Any) -> Record:
    if not isinstance(body, dict) or "id" not in body:
        raise PortError("HubSpot answered without a record id", code="unknown", transient=False)
    props = body.get("properties")
    return Record(object_type=object_type, id=str(body["id"]), properties=props if props else {})


def _subscription(body: Mapping[str, Any]) -> Subscription:
    object_type, _, kind = str(body.get("eventType", "")).partition(".")
    return Subscription(
        object_type=object_type,
        event_kind=kind,
        property_name=body.get("propertyName") or None,
        id=str(body["id"]) if body.get("id") is not None else None,
    )


class HubSpotPort:
    """One connection's view of HubSpot. Thread-safe; keeps the last rate-limit state."""

    capabilities = Capabilities(
        write_idempotency=False,  # creates are not idempotent: the replay test proves it
        event_author_identity=True,  # changeSource/sourceId on every event
        subscription_management=True,  # a legacy public app's webhook subscriptions API
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
    ) -> None:
        """`token`: a portal's CRM token (private-app token or OAuth access token), for records.
        `token_source`: instead of a fixed token, where each call gets a live one (an OAuth
        connection: shared/providers/connect.py); called with the token HubSpot just answered 401
        to, it hands back a refreshed one.
        `developer_api_key`: the app's developer credential, which is what a legacy public app's
        webhook subscriptions API takes (as `hapikey`), not a portal token
        (https://developers.hubspot.com/docs/api/webhooks). A port for an app's subscriptions
        has the key and no token."""
        self.base_url = (base_url or DEFAULT_BASE_URL).rstrip("/")
        self.app_id = app_id
        self._developer_api_key = developer_api_key
        if idempotency_property:
            # The portal has a unique-value property for onceflow's key: a create sent twice
            # makes one record and a 409 naming it, so creates may be retried and adopted.
            self.idempotency_property = idempotency_property
            self.capabilities = Capabilities(
                write_idempotency=True, event_author_identity=True, subscription_management=True
            )
        self._http = PortHttp(
            vendor="HubSpot",
            base_url=self.base_url,
            headers={
                "Accept": "application/json",
                **({"Authorization": f"Bearer {token}"} if token else {}),
            },
            timeout=timeout,
            transport=transport,
            read_limits=read_rate_limit,
            token_source=token_source,
        )

    @property
    def rate_limit(self) -> RateLimitState:
        return self._http.rate_limit

    def close(self) -> None:
        self._http.close()

    # --- the one request path --------------------------------------------------------------
    def _request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, str] | None = None,
    ) -> Any:
        response = self._http.request(method, path, json=json, params=params)
        if response.status_code >= 300:
            raise classify_response(response, self.rate_limit.interval_ms)
        if response.status_code == 204 or not response.content:
            return None
        try:
            return response.json()
        except ValueError as exc:
            raise PortError(
                "HubSpot answered with a body that is not JSON", code="unknown", transient=False
            ) from exc

    # --- records ----------------------------------------------------------------------------
    def create(
        self,
        object_type: str,
        properties: Mapping[str, Any],
        associations: Sequence[Association] = (),
    ) -> Record:
        kind = plural_object_type(object_type)
        # `associations` is listed as required on the date-based create (an empty list when
        # there are none): https://developers.hubspot.com/docs/api-reference/2026-03/crm/objects/contacts/create-contact
        request: dict[str, Any] = {
            "properties": dict(properties),
            "associations": [association_input(kind, a) for a in associations],
        }
        body = self._request("POST", versions.crm_objects(kind), json=request)
        return _record(kind, body)

    def update(self, object_type: str, object_id: str, properties: Mapping[str, Any]) -> Record:
        kind = plural_object_type(object_type)
        body = self._request(
            "PATCH",
            versions.crm_objects(kind, _path_id(object_id)),
            json={"properties": dict(properties)},
        )
        return _record(kind, body)

    def get(self, object_type: str, object_id: str, properties: Sequence[str] = ()) -> Record:
        kind = plural_object_type(object_type)
        params = {"properties": ",".join(properties)} if properties else None
        body = self._request("GET", versions.crm_objects(kind, _path_id(object_id)), params=params)
        return _record(kind, body)

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
        """One page of a search; `next_after` pages on (HubSpot's `paging.next.after`)."""
        kind = plural_object_type(object_type)
        request: dict[str, Any] = {
            "filterGroups": [{"filters": [_search_filter(f) for f in filters]}] if filters else [],
            "limit": max(1, min(limit, 200)),
        }
        if after is not None:
            request["after"] = after
        if properties:
            request["properties"] = list(properties)
        body = self._request("POST", versions.crm_search(kind), json=request)
        results = body.get("results", []) if isinstance(body, dict) else []
        paging = body.get("paging") if isinstance(body, dict) else None
        nxt = paging.get("next", {}).get("after") if isinstance(paging, dict) else None
        return SearchPage([_record(kind, r) for r in results], None if nxt is None else str(nxt))

    # --- webhook subscriptions (used by reconcile) -----------------------------------------
    def _subscriptions_path(self, subscription_id: str | None = None) -> str:
        if not self.app_id:
            raise PortError(
                "this connection has no HubSpot app id (connections.provider_app_id)",
                code="invalid_request",
                transient=False,
            )
        return versions.webhook_subscriptions(self.app_id, subscription_id)

    def _developer_params(self) -> dict[str, str] | None:
        return {"hapikey": self._developer_api_key} if self._developer_api_key else None

    def list_subscriptions(self) -> list[Subscription]:
        body = self._request("GET", self._subscriptions_path(), params=self._developer_params())
        results = body.get("results", []) if isinstance(body, dict) else []
        return [_subscription(r) for r in results if r.get("active", True)]

    def create_subscription(self, subscription: Subscription) -> Subscription:
        request: dict[str, Any] = {
            "eventType": f"{subscription.object_type}.{subscription.event_kind}",
            "active": True,
        }
        if subscription.property_name:
            request["propertyName"] = subscription.property_name
        body = self._request(
            "POST", self._subscriptions_path(), json=request, params=self._developer_params()
        )
        return _subscription(body)

    def delete_subscription(self, subscription_id: str) -> None:
        self._request(
            "DELETE",
            self._subscriptions_path(_path_id(subscription_id)),
            params=self._developer_params(),
        )


def _path_id(value: str) -> str:
    """Record and subscription ids are numeric at HubSpot; anything else could rewrite the path."""
    text = str(value).strip()
    if not text.isdigit():
        raise PortError(f"invalid id {value!r}", code="invalid_request", transient=False)
    return text


def _search_filter(f: SearchFilter) -> dict[str, Any]:
    out: dict[str, Any] = {"propertyName": f.property, "operator": f.operator}
    if f.operator not in ("HAS_PROPERTY", "NOT_HAS_PROPERTY"):
        out["value"] = f.value  # HubSpot refuses a value on the presence operators
    return out
