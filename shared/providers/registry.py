"""The providers onceflow speaks to: one line per provider, each a folder beside this module.

Everything above this wing asks here — by the name a connection or an app row stores — what a
provider verifies, normalizes, keeps, offers and how long it redelivers; nothing above it names
a vendor (tests/test_providers_registry.py holds that).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from shared.normalize.event import NormalizedEvent, UnparseableBody
from shared.port.interface import KINDS
from shared.providers import hmac, hubspot, pipedrive, standard
from shared.providers.descriptor import Provider
from shared.workflows.definition import ANY_CRM

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


# `crm.<kind>.<action>` in a trigger: that event of whichever CRM provider sends it, so one
# definition runs on every CRM (the name is the workflow format's: shared/workflows/definition.py).
if ANY_CRM in _BY_NAME:
    raise ValueError(f"no provider may be named {ANY_CRM!r}: it is the any-CRM event prefix")


def get(name: str) -> Provider | None:
    return _BY_NAME.get(name)


def crm_providers() -> tuple[Provider, ...]:
    """Providers whose records are onceflow's neutral object kinds (`object_kinds`)."""
    return tuple(p for p in ALL if p.object_kinds)


def object_kind(name: str, provider: str | None = None) -> str | None:
    """The neutral kind (singular) `name` means on `provider` (`Provider.object_kind`); with
    no provider, a neutral kind or any CRM provider's own name of one. None: no kind."""
    found = _BY_NAME.get(provider) if provider else None
    if found is not None:
        return found.object_kind(name)
    for candidate in crm_providers():
        kind = candidate.object_kind(name)
        if kind is not None:
            return kind
    return None


def object_kind_names() -> str:
    """The object kinds a workflow may name, for messages: the neutral ones, then each CRM
    provider's own names that differ from them."""
    own = sorted(
        {n for p in crm_providers() for k, n in p.object_kinds.items() if n != k},
    )
    neutral = ", ".join(KINDS)
    return f"{neutral} (or plural)" + (f", or a CRM's own name: {', '.join(own)}" if own else "")


def _neutral_event(provider: Provider, event: NormalizedEvent) -> NormalizedEvent:
    """`event` with its object named by onceflow's neutral kind (Pipedrive's `person` is a
    `contact`), in its type and its record identity; the provider's own name stays in the
    payload, which is the provider's event as it came. A provider that declares no kinds (a
    generic scheme: its senders name their own types) is left as it is."""
    if not provider.object_kinds:
        return event
    kind = provider.object_kind(event.object_type) if event.object_type else None
    parts = event.event_type.split(".")
    own = parts[1] if len(parts) == 3 else None
    type_kind = provider.object_kind(own) if own else None
    if kind is None and type_kind is None:
        return event
    event_type = event.event_type
    if type_kind is not None:
        event_type = ".".join((parts[0], type_kind, parts[2]))
    return dataclasses.replace(event, event_type=event_type, object_type=kind or event.object_type)


def _neutral_type(provider: Provider, event_type: str) -> str:
    if not provider.object_kinds:
        return event_type
    parts = event_type.split(".")
    kind = provider.object_kind(parts[1]) if len(parts) == 3 else None
    return ".".join((parts[0], kind, parts[2])) if kind else event_type


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
    return {
        p.name: frozenset(_neutral_type(p, t) for t in p.event_types())
        for p in ALL
        if p.event_types is not None
    }


def event_type_on(provider: str | None, event: str) -> str:
    """`event` as `provider` sends it: `crm.<kind>.<action>` is `<provider>.<kind>.<action>`
    on a CRM provider's connection; any other type (or no CRM) is itself."""
    found = _BY_NAME.get(provider) if provider else None
    head, _, rest = event.partition(".")
    if head != ANY_CRM or found is None or not found.object_kinds:
        return event
    return f"{found.name}.{rest}"


def event_types_for(event: str) -> tuple[str, ...]:
    """The event types a trigger's `event` binds to: `crm.<kind>.<action>` is that event of
    every CRM provider that sends it (`hubspot.contact.created`, `pipedrive.contact.created`);
    any other type is itself."""
    provider, _, rest = event.partition(".")
    if provider != ANY_CRM:
        return (event,)
    known = known_event_types()
    return tuple(
        f"{p.name}.{rest}" for p in crm_providers() if f"{p.name}.{rest}" in known.get(p.name, ())
    )


def normalize(provider: str, body: bytes, headers: Mapping[str, str]) -> list[NormalizedEvent]:
    """Every event in a verified body, in occurred-at order. Raises UnparseableBody."""
    found = _BY_NAME.get(provider)
    try:
        if found is None or found.normalize is None:
            raise UnparseableBody(f"no normalizer for provider {provider!r}")
        events = [_neutral_event(found, e) for e in found.normalize(body, headers)]
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
