"""Provider payloads -> typed trigger events (see `event.py` for the naming scheme)."""

from __future__ import annotations

from collections.abc import Mapping

from shared.normalize.event import NormalizedEvent, UnparseableBody, snake
from shared.providers.hubspot import normalize as hubspot
from shared.providers.pipedrive import normalize as pipedrive
from shared.providers.standard import normalize as standard

__all__ = ["NormalizedEvent", "UnparseableBody", "known_event_types", "normalize", "snake"]


def known_event_types() -> dict[str, frozenset[str]]:
    """Per provider whose events form a closed set, every event type its webhooks can become.
    `standard.*` types are the sender's own names, and events onceflow makes for cron,
    webhook and poll triggers are per workflow: neither is listed."""
    return {"hubspot": hubspot.event_types(), "pipedrive": pipedrive.event_types()}


def normalize(provider: str, body: bytes, headers: Mapping[str, str]) -> list[NormalizedEvent]:
    """Every event in a verified body, in occurred-at order. Raises UnparseableBody."""
    try:
        if provider == "hubspot":
            events = hubspot.normalize(body)
        elif provider == "standard":
            events = standard.normalize(body, headers)
        elif provider == "pipedrive":
            events = pipedrive.normalize(body)
        else:
            raise UnparseableBody(f"no normalizer for provider {provider!r}")
    except RecursionError:
        # A signed body can nest deeper than the JSON parser recurses: the same bytes can
        # never parse, so the row is rejected with its reason, not retried until it is dead.
        raise UnparseableBody("the body nests too deeply to parse") from None
    # Stable sort: within one delivery an older change is applied before a newer one, so the
    # shadow record doesn't call the older one out of order just because of array position.
    return sorted(events, key=lambda e: e.occurred_at)
