"""The providers onceflow speaks to: one line per provider, each a folder beside this module.

Everything above this wing asks here — by the name a connection or an app row stores — what a
provider verifies, normalizes, keeps, offers and how long it redelivers; nothing above it names
a vendor (tests/test_providers_registry.py holds that).
"""

from __future__ import annotations

from collections.abc import Mapping

from shared.normalize.event import NormalizedEvent, UnparseableBody
from shared.providers import hmac, hubspot, pipedrive, standard
from shared.providers.descriptor import Provider

ALL: tuple[Provider, ...] = (
    hubspot.PROVIDER,
    standard.PROVIDER,
    pipedrive.PROVIDER,
    hmac.PROVIDER,
)

_BY_NAME: dict[str, Provider] = {p.name: p for p in ALL}
PROVIDERS: tuple[str, ...] = tuple(_BY_NAME)
# How late each provider can still deliver an event after it occurred (see
# `Provider.redelivery_horizon_seconds`).
REDELIVERY_HORIZON_SECONDS: dict[str, int] = {p.name: p.redelivery_horizon_seconds for p in ALL}
# Connections whose verification suits a sender of the customer's choosing; a vendor's own
# scheme only ever signs that vendor's calls.
WEBHOOK_TRIGGER_PROVIDERS: tuple[str, ...] = tuple(p.name for p in ALL if p.generic)
# Those whose requests address webhook triggers only: no events of their own.
TRIGGER_ONLY_PROVIDERS: tuple[str, ...] = tuple(p.name for p in ALL if p.normalize is None)
KEPT_HEADERS: tuple[str, ...] = tuple(h for p in ALL for h in p.kept_headers)
HIDDEN_HEADERS: frozenset[str] = frozenset(h for p in ALL for h in p.hidden_headers)


def get(name: str) -> Provider | None:
    return _BY_NAME.get(name)


def app_providers() -> tuple[str, ...]:
    """Providers with one webhook URL per app (`/<provider>/app/<app id>`)."""
    return tuple(p.name for p in ALL if p.app is not None)


def static_credential_kinds(name: str) -> tuple[str, ...]:
    """The kinds of static credential a connection to `name` may hold (a provider without a
    CRM adapter is only ever called with its token, if at all)."""
    found = _BY_NAME.get(name)
    return found.crm.credential_kinds if found is not None and found.crm is not None else ("token",)


def oauth_providers() -> tuple[str, ...]:
    """Providers an app is installed on with OAuth (`/oauth/<provider>/callback`)."""
    return tuple(p.name for p in ALL if p.oauth is not None)


def project_providers() -> tuple[str, ...]:
    """Providers whose apps can be projects of files the vendor's CLI deploys."""
    return tuple(p.name for p in ALL if p.project is not None)


def known_event_types() -> dict[str, frozenset[str]]:
    """Per provider whose events form a closed set, every event type its webhooks can become.
    A generic sender's types are its own names, and events onceflow makes for cron, webhook
    and poll triggers are per workflow: neither is listed."""
    return {p.name: p.event_types() for p in ALL if p.event_types is not None}


def normalize(provider: str, body: bytes, headers: Mapping[str, str]) -> list[NormalizedEvent]:
    """Every event in a verified body, in occurred-at order. Raises UnparseableBody."""
    found = _BY_NAME.get(provider)
    try:
        if found is None or found.normalize is None:
            raise UnparseableBody(f"no normalizer for provider {provider!r}")
        events = found.normalize(body, headers)
    except RecursionError:
        # A signed body can nest deeper than the JSON parser recurses: the same bytes can
        # never parse, so the row is rejected with its reason, not retried until it is dead.
        raise UnparseableBody("the body nests too deeply to parse") from None
    # Stable sort: within one delivery an older change is applied before a newer one, so the
    # shadow record doesn't call the older one out of order just because of array position.
    return sorted(events, key=lambda e: e.occurred_at)


def record_page_providers() -> tuple[Provider, ...]:
    """Providers whose UI shows a record at an address people can paste into search."""
    return tuple(p for p in ALL if p.crm is not None and p.crm.record_pages is not None)


def record_url_kind(provider: Provider) -> str:
    """How search reports a query it read as the provider's record page (`<name>_url`)."""
    return f"{provider.name}_url"
