"""Provider payloads -> typed trigger events: naming scheme, identity, author, time."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime

import pytest

from shared.normalize import UnparseableBody
from shared.providers.registry import normalize
from tests.ingest_support import hubspot_body, hubspot_event


def sha256_16(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def test_hubspot_events_map_to_the_naming_scheme() -> None:
    body = hubspot_body(
        hubspot_event(1, 11, subscription_type="contact.creation", occurred_at_ms=1000),
        hubspot_event(2, 11, property_name="email", property_value="a@x.io", occurred_at_ms=2000),
        hubspot_event(3, 22, subscription_type="deal.propertyChange", occurred_at_ms=3000),
        hubspot_event(4, 33, subscription_type="company.deletion", occurred_at_ms=4000),
        hubspot_event(5, 44, subscription_type="contact.merge", occurred_at_ms=5000),
    )
    events = normalize("hubspot", body, {})
    assert [e.event_type for e in events] == [
        "hubspot.contact.created",
        "hubspot.contact.property_changed",
        "hubspot.deal.property_changed",
        "hubspot.company.deleted",
        "hubspot.contact.merged",
    ]
    assert [e.kind for e in events] == [
        "created",
        "property_changed",
        "property_changed",
        "deleted",
        "other",
    ]
    changed = events[1]
    assert (changed.object_type, changed.object_id) == ("contact", "11")
    assert changed.changed_fields == {"email": "a@x.io"}
    assert changed.source_event_id == "555:contact.property_changed:0-1/11:email:2000:" + sha256_16(
        "a@x.io"
    )
    assert (changed.author_id, changed.author_source) == ("userId:42", "CRM_UI")
    assert changed.occurred_at == datetime.fromtimestamp(2, UTC)
    assert changed.payload["propertyName"] == "email"
    assert changed.payload["portalId"] == 555  # unknown fields are kept in the payload


def test_hubspot_events_come_out_in_occurred_order() -> None:
    body = hubspot_body(
        hubspot_event(2, property_value="b", occurred_at_ms=2000),
        hubspot_event(1, property_value="a", occurred_at_ms=1000),
    )
    assert [e.payload["eventId"] for e in normalize("hubspot", body, {})] == [1, 2]


def test_hubspot_generic_object_subscription_uses_singular_type() -> None:
    event = hubspot_event(9, 5, subscription_type="object.creation")
    event["objectTypeId"] = "0-3"
    (normalized,) = normalize("hubspot", hubspot_body(event), {})
    assert normalized.event_type == "hubspot.deal.created"
    assert normalized.object_type == "deal"


def test_event_without_object_id_has_no_record_identity() -> None:
    event = hubspot_event(9, subscription_type="contact.associationChange")
    del event["objectId"]
    (normalized,) = normalize("hubspot", hubspot_body(event), {})
    assert normalized.event_type == "hubspot.contact.association_changed"
    assert (normalized.object_type, normalized.object_id) == (None, None)


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"not json",
        b"{}",
        b"[]",
        b'[{"eventId": 1}]',
        b'[{"eventId": 1, "subscriptionType": "contact", "occurredAt": 1}]',
        b'[{"eventId": 1, "subscriptionType": "contact.creation", "occurredAt": "soon"}]',
        b'[{"eventId": 1, "subscriptionType": "contact.propertyChange", "occurredAt": 1}]',
        b'[{"eventId": true, "subscriptionType": "contact.creation", "occurredAt": 1}]',
    ],
)
def test_unparseable_hubspot_bodies_are_refused_with_a_reason(body: bytes) -> None:
    with pytest.raises(UnparseableBody) as excinfo:
        normalize("hubspot", body, {})
    assert str(excinfo.value)


def test_pipedrive_person_is_a_contact_and_previous_names_the_changes() -> None:
    body = json.dumps(
        {
            "meta": {
                "action": "change",
                "entity": "person",
                "entity_id": "77",
                "id": "6a1b-evt",
                "timestamp": "2026-01-02T03:04:05Z",
                "change_source": "app",
                "user_id": 12,
            },
            "data": {"id": 77, "name": "Ada", "email": "ada@x.io"},
            "previous": {"email": "old@x.io"},
        }
    ).encode()
    (event,) = normalize("pipedrive", body, {})
    assert event.event_type == "pipedrive.contact.property_changed"
    assert (event.object_type, event.object_id) == ("contact", "77")
    assert event.changed_fields == {"email": "ada@x.io"}
    assert (event.author_id, event.author_source, event.source_event_id) == (
        "12",
        "app",
        "6a1b-evt",
    )
    org = json.loads(body)
    org["meta"].update(entity="organization", action="create")
    assert normalize("pipedrive", json.dumps(org).encode(), {})[0].event_type == (
        "pipedrive.company.created"
    )


def test_standard_webhook_uses_type_and_webhook_id() -> None:
    body = json.dumps(
        {
            "type": "contact.property_changed",
            "timestamp": "2026-01-02T03:04:05Z",
            "data": {"object_type": "contact", "id": 5, "changes": {"stage": "won"}},
        }
    ).encode()
    (event,) = normalize("standard", body, {"webhook-id": "msg_9"})
    assert event.event_type == "standard.contact.property_changed"
    assert (event.object_type, event.object_id, event.source_event_id) == ("contact", "5", "msg_9")
    assert event.changed_fields == {"stage": "won"}
    with pytest.raises(UnparseableBody):
        normalize("standard", b'{"type": "nodots", "timestamp": "2026-01-01T00:00:00Z"}', {})


def test_a_signed_body_nested_too_deeply_is_unparseable_not_a_crash() -> None:
    from shared.providers.registry import normalize

    deep = b"[" * 100_000 + b"]" * 100_000
    for provider in ("hubspot", "standard", "pipedrive"):
        with pytest.raises(UnparseableBody):
            normalize(provider, deep, {})


def test_hubspot_dedup_key_is_not_the_event_id_alone() -> None:
    """HubSpot: eventId "is not guaranteed to be unique"
    (https://developers.hubspot.com/docs/api/webhooks). Two different events sharing one
    eventId get different keys; a retry (only attemptNumber differs) gets the same key."""
    first = hubspot_event(7, 11, property_name="email", property_value="a@x.io")
    other_object = hubspot_event(7, 12, property_name="email", property_value="a@x.io")
    other_portal = {**first, "portalId": 556}
    other_type = hubspot_event(7, 11, subscription_type="contact.creation")
    retry = {**first, "attemptNumber": 3}
    keys = [
        normalize("hubspot", hubspot_body(e), {})[0].source_event_id
        for e in (first, other_object, other_portal, other_type, retry)
    ]
    assert len(set(keys[:4])) == 4
    assert keys[4] == keys[0]
    generic = {**other_type, "subscriptionType": "object.creation", "objectTypeId": "0-3"}
    (deal,) = normalize("hubspot", hubspot_body(generic), {})
    assert deal.source_event_id == "555:deal.created:0-3/11:-:1700000000000"
