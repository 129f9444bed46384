"""Signature checks against vectors computed in the test (tests/ingest_support.py) with
hmac/hashlib, independently of the code under test."""

from __future__ import annotations

import base64

from shared.providers.hubspot.signature import verify_hubspot
from shared.providers.pipedrive.signature import verify_pipedrive
from shared.providers.standard.signature import verify_standard
from tests.ingest_support import (
    HUBSPOT_SECRET,
    PIPEDRIVE_CREDENTIALS,
    STANDARD_SECRET,
    basic_auth,
    hubspot_v1_headers,
    hubspot_v2_headers,
    hubspot_v3_headers,
    standard_headers,
)

URI = "https://hooks.example.com/hubspot/6f9619ff-8b86-d011-b42d-00cf4fc964ff"
BODY = b'[{"eventId":1,"subscriptionType":"contact.creation","occurredAt":1,"objectId":5}]'
NOW = 1_700_000_000.0
NOW_MS = int(NOW * 1000)


def hubspot(headers: dict[str, str], *, versions: tuple[str, ...] = ("v3",), **kw: object):
    args: dict[str, object] = {
        "secret": HUBSPOT_SECRET,
        "method": "POST",
        "uri": URI,
        "body": BODY,
        "headers": headers,
        "now": NOW,
        "versions": versions,
    }
    args.update(kw)
    return verify_hubspot(**args)  # type: ignore[arg-type]


def test_hubspot_v3_valid_signature_is_accepted() -> None:
    verdict = hubspot(hubspot_v3_headers(BODY, URI, timestamp_ms=NOW_MS))
    assert verdict.ok and verdict.check == "hubspot_v3"


def test_hubspot_v3_timestamp_window_edges() -> None:
    exactly_five_minutes = hubspot_v3_headers(BODY, URI, timestamp_ms=NOW_MS - 300_000)
    assert hubspot(exactly_five_minutes).ok
    just_over = hubspot_v3_headers(BODY, URI, timestamp_ms=NOW_MS - 300_001)
    assert hubspot(just_over).check == "timestamp_stale"
    future_edge = hubspot_v3_headers(BODY, URI, timestamp_ms=NOW_MS + 300_000)
    assert hubspot(future_edge).ok
    too_far_ahead = hubspot_v3_headers(BODY, URI, timestamp_ms=NOW_MS + 300_001)
    assert hubspot(too_far_ahead).check == "timestamp_stale"


def test_hubspot_v3_refusals_name_the_check() -> None:
    good = hubspot_v3_headers(BODY, URI, timestamp_ms=NOW_MS)
    wrong_secret = hubspot_v3_headers(BODY, URI, secret="not-the-secret", timestamp_ms=NOW_MS)
    assert hubspot(wrong_secret).check == "hubspot_v3_mismatch"
    assert hubspot(good, body=BODY + b" ").check == "hubspot_v3_mismatch"
    assert hubspot(good, uri=URI.replace("https", "http")).check == "hubspot_v3_mismatch"
    assert hubspot(good, method="PUT").check == "hubspot_v3_mismatch"
    no_stamp = {k: v for k, v in good.items() if k != "X-HubSpot-Request-Timestamp"}
    assert hubspot(no_stamp).check == "timestamp_missing"
    assert hubspot({**good, "X-HubSpot-Request-Timestamp": "soon"}).check == ("timestamp_malformed")
    assert hubspot({}).check == "signature_missing"
    # The header name is matched case-insensitively, as HTTP says.
    lowered = {k.lower(): v for k, v in good.items()}
    assert hubspot(lowered).ok


def test_hubspot_v1_and_v2_only_where_opted_in() -> None:
    v2 = hubspot_v2_headers(BODY, URI)
    v1 = hubspot_v1_headers(BODY)
    assert hubspot(v2).check == "hubspot_v2_not_enabled"
    assert hubspot(v1).check == "hubspot_v1_not_enabled"
    assert hubspot(v2, versions=("v3", "v2")).ok
    assert hubspot(v1, versions=("v3", "v1")).ok
    assert hubspot(hubspot_v2_headers(BODY, URI, secret="x"), versions=("v2",)).check == (
        "hubspot_v2_mismatch"
    )
    # A v3 header on a connection that accepts only v1 doesn't sneak through as v3.
    v3 = hubspot_v3_headers(BODY, URI, timestamp_ms=NOW_MS)
    assert not hubspot(v3, versions=("v1",)).ok


def test_standard_webhooks_valid_and_window_edges() -> None:
    def check(headers: dict[str, str], body: bytes = BODY):
        return verify_standard(secret=STANDARD_SECRET, body=body, headers=headers, now=NOW)

    assert check(standard_headers(BODY, timestamp=int(NOW))).ok
    assert check(standard_headers(BODY, timestamp=int(NOW) - 300)).ok
    assert check(standard_headers(BODY, timestamp=int(NOW) - 301)).check == "timestamp_stale"
    assert check(standard_headers(BODY, timestamp=int(NOW) + 301)).check == "timestamp_stale"
    wrong_key = standard_headers(BODY, timestamp=int(NOW), key=b"another key entirely")
    assert check(wrong_key).check == "standard_v1_mismatch"
    tampered = standard_headers(BODY, timestamp=int(NOW))
    assert check(tampered, body=BODY[:-1]).check == "standard_v1_mismatch"
    # Several signatures (key rotation): any v1 match is enough.
    good = standard_headers(BODY, timestamp=int(NOW))
    rotated = {**good, "webhook-signature": "v1,AAAA " + good["webhook-signature"]}
    assert check(rotated).ok
    assert check({}).check == "signature_missing"


def test_pipedrive_basic_credentials() -> None:
    def check(headers: dict[str, str]):
        return verify_pipedrive(secret=PIPEDRIVE_CREDENTIALS, headers=headers)

    assert check(basic_auth()).ok
    assert check(basic_auth("onceflow:wrong")).check == "credentials_mismatch"
    assert check({}).check == "credentials_missing"
    assert check({"Authorization": "Bearer abc"}).check == "credentials_not_basic"
    assert check({"Authorization": "Basic !!!"}).check == "credentials_malformed"
    token = base64.b64encode(PIPEDRIVE_CREDENTIALS.encode()).decode()
    assert check({"authorization": f"basic {token}"}).ok
