"""The HubSpot adapter against the fake CRM over real HTTP: shapes, classification, rate limits,
subscriptions, and building a port from a connection row."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from devstack import seed
from devstack.fakecrm import FakeCrm, FakeCrmConfig
from devstack.tools import free_port
from shared.core.db import Database
from shared.port.interface import NOT_APPLIED_CODES, PortError, SearchFilter, Subscription
from shared.providers import connect
from shared.providers.hubspot import versions
from shared.providers.hubspot.port import HubSpotPort, classify_response


@pytest.fixture
def fake() -> Iterator[FakeCrm]:
    crm = FakeCrm(FakeCrmConfig(token="tok")).start()
    try:
        yield crm
    finally:
        crm.stop()


@pytest.fixture
def port(fake: FakeCrm) -> Iterator[HubSpotPort]:
    p = HubSpotPort("tok", base_url=fake.url, app_id="424242", timeout=2)
    try:
        yield p
    finally:
        p.close()


def test_records_round_trip(port: HubSpotPort) -> None:
    made = port.create("contact", {"email": "a@x.io", "firstname": "Ada"})
    assert made.object_type == "contacts" and made.id.isdigit()
    assert port.get("contacts", made.id, ["firstname"]).properties["firstname"] == "Ada"
    assert port.update("contacts", made.id, {"firstname": "Ann"}).properties["firstname"] == "Ann"
    found = port.search("contacts", [SearchFilter("email", "EQ", "a@x.io")])
    assert [r.id for r in found] == [made.id]
    assert port.rate_limit.max == 190 and port.rate_limit.remaining == 186
    assert port.capabilities.subscription_management and not port.capabilities.write_idempotency


def test_conflict_on_create_is_permanent_with_existing_id(port: HubSpotPort) -> None:
    first = port.create("contacts", {"email": "dup@x.io"})
    with pytest.raises(PortError) as err:
        port.create("contacts", {"email": "dup@x.io"})
    assert err.value.code == "conflict" and not err.value.transient
    assert err.value.existing_id == first.id


@pytest.mark.parametrize(
    ("action", "code"),
    [
        ("rate_limit", "rate_limited"),
        ("error_500", "unavailable"),
        ("reset", "connection_reset"),
        ("drop_after_commit", "connection_reset"),
    ],
)
def test_faults_are_transient(fake: FakeCrm, port: HubSpotPort, action: str, code: str) -> None:
    fake.add_fault(action=action, retry_after=9)
    with pytest.raises(PortError) as err:
        port.create("deals", {"dealname": "x"})
    assert err.value.transient and err.value.code == code
    if action == "rate_limit":
        assert err.value.retry_after == 9


def test_timeout_and_connect_failure_are_transient(fake: FakeCrm, port: HubSpotPort) -> None:
    fake.add_fault(action="delay", delay_seconds=3)
    with pytest.raises(PortError) as err:
        port.get("deals", "1001")
    assert err.value.code == "timeout" and err.value.transient
    dead = HubSpotPort("tok", base_url=f"http://127.0.0.1:{free_port()}", timeout=1)
    with pytest.raises(PortError) as err:
        dead.create("deals", {"dealname": "x"})
    assert err.value.code == "connect_failed" and err.value.transient
    dead.close()


def test_permanent_errors(fake: FakeCrm, port: HubSpotPort) -> None:
    with pytest.raises(PortError) as err:
        port.get("contacts", "424242424")
    assert err.value.code == "not_found" and not err.value.transient
    with pytest.raises(PortError) as err:
        port.get("contacts", "../../webhooks")
    assert err.value.code == "invalid_request"
    with pytest.raises(PortError) as err:
        port.create("widgets", {})
    assert err.value.code == "invalid_request"
    bad = HubSpotPort("wrong", base_url=fake.url)
    with pytest.raises(PortError) as err:
        bad.create("contacts", {"email": "z@x.io"})
    assert err.value.code == "unauthorized" and not err.value.transient
    bad.close()


def test_classification_table() -> None:
    def cls(status: int, headers: dict[str, str] | None = None, body: str = "{}") -> PortError:
        return classify_response(httpx.Response(status, headers=headers, text=body), 10_000)

    assert cls(408).transient and cls(408).code == "timeout"
    assert cls(425).transient
    assert cls(503, {"Retry-After": "4"}).retry_after == 4
    assert cls(429).retry_after == 10  # no header: the rate-limit interval
    assert not cls(418).transient and cls(418).code == "unknown"
    assert cls(422).code == "invalid_request"
    assert cls(409, body='{"message":"Existing ID: 77"}').existing_id == "77"


def test_locked_and_migrating_are_transient_and_not_applied() -> None:
    """https://developers.hubspot.com/docs/api-reference/error-handling: 423 Locked (a record
    is being synced by another process) and 477 Migration in Progress (with Retry-After) are
    retryable, and HubSpot refused the request: a create may be retried."""

    def cls(status: int, headers: dict[str, str] | None = None) -> PortError:
        return classify_response(httpx.Response(status, headers=headers, text="{}"), 10_000)

    locked, migrating = cls(423), cls(477, {"Retry-After": "30"})
    assert (locked.transient, locked.code) == (True, "busy")
    assert (migrating.transient, migrating.code, migrating.retry_after) == (True, "busy", 30)
    assert "busy" in NOT_APPLIED_CODES  # crm.create may withdraw its mark and retry


def test_429_without_retry_after_waits_the_interval_its_headers_give() -> None:
    """HubSpot's CRM 429s don't promise Retry-After; X-HubSpot-RateLimit-Interval-Milliseconds
    on the same answer says how long the window is
    (https://developers.hubspot.com/docs/api/usage-details)."""
    answer = httpx.Response(
        429,
        headers={"X-HubSpot-RateLimit-Interval-Milliseconds": "2500"},
        text='{"policyName":"TEN_SECONDLY_ROLLING"}',
    )
    assert classify_response(answer, None).retry_after == 2.5
    # Headers win over a stale interval remembered from an earlier answer.
    assert classify_response(answer, 10_000).retry_after == 2.5


def test_rate_limit_headers_are_honoured_without_spending_a_request() -> None:
    fake = FakeCrm(FakeCrmConfig(rate_limit_max=2)).start()
    p = HubSpotPort("tok", base_url=fake.url)
    try:
        p.create("deals", {"dealname": "1"})
        p.create("deals", {"dealname": "2"})
        assert p.rate_limit.remaining == 0
        sent_before = len(fake.state()["requests"])
        with pytest.raises(PortError) as err:
            p.create("deals", {"dealname": "3"})
        assert err.value.code == "rate_limited" and err.value.transient
        assert err.value.retry_after is not None and 9 < err.value.retry_after <= 10
        assert len(fake.state()["requests"]) == sent_before  # refused locally
    finally:
        p.close()
        fake.stop()


def test_subscriptions(port: HubSpotPort) -> None:
    made = port.create_subscription(Subscription("deal", "propertyChange", "dealstage"))
    port.create_subscription(Subscription("contact", "creation"))
    listed = port.list_subscriptions()
    assert {s.key() for s in listed} == {
        ("deal", "propertyChange", "dealstage"),
        ("contact", "creation", None),
    }
    assert made.id is not None
    port.delete_subscription(made.id)
    assert [s.key() for s in port.list_subscriptions()] == [("contact", "creation", None)]
    no_app = HubSpotPort("tok", base_url=port.base_url)
    with pytest.raises(PortError) as err:
        no_app.list_subscriptions()
    assert err.value.code == "invalid_request"
    no_app.close()


def test_port_for_connection_reads_token_from_named_env(
    db: Database, fake: FakeCrm, monkeypatch: pytest.MonkeyPatch
) -> None:
    with db.transaction() as tx:
        seed.tenant(tx, "acme", name="Acme")
        cid = tx.scalar(
            "INSERT INTO connections (tenant_id, provider, webhook_secret_env, "
            "api_credentials_env, api_base_url, provider_app_id) VALUES "
            "('acme', 'hubspot', 'HS_SECRET', 'HS_TOKEN_ACME', :url, '424242') RETURNING id::text",
            url=fake.url,
        )
    connect.forget_ports()
    monkeypatch.delenv("HS_TOKEN_ACME", raising=False)
    with pytest.raises(PortError) as err:
        connect.port_for(db, cid)
    assert "HS_TOKEN_ACME" in str(err.value) and not err.value.transient
    monkeypatch.setenv("HS_TOKEN_ACME", "tok")
    p = connect.port_for(db, cid)
    assert connect.port_for(db, cid) is p  # cached per process
    assert p.create("companies", {"name": "Acme"}).id
    assert p.list_subscriptions() == []
    with pytest.raises(PortError):
        connect.port_for(db, "not-a-uuid")
    connect.forget_ports()


def test_every_call_goes_to_a_date_based_path(fake: FakeCrm, port: HubSpotPort) -> None:
    """Records, search and a legacy app's subscriptions all go to the versions versions.py
    pins, never to a numbered path (which the fake, like a new app, answers 404)."""
    made = port.create("contacts", {"email": "d@x.io"})
    port.get("contacts", made.id, ["email"])
    port.update("contacts", made.id, {"firstname": "D"})
    port.search("contacts", [SearchFilter("email", "EQ", "d@x.io")])
    sub = port.create_subscription(Subscription("contact", "creation"))
    port.list_subscriptions()
    assert sub.id is not None
    port.delete_subscription(sub.id)
    paths = [r["path"] for r in fake.state()["requests"]]
    crm = f"/crm/objects/{versions.CRM_VERSION}/contacts"
    subs = f"/webhooks/{versions.WEBHOOKS_VERSION}/424242/subscriptions"
    assert paths == [
        crm,
        f"{crm}/{made.id}",
        f"{crm}/{made.id}",
        f"{crm}/search",
        subs,
        subs,
        f"{subs}/{sub.id}",
    ]
    assert fake.numbered_requests() == []
    assert versions.CRM_VERSION == "2026-09"  # the version that enforces validation rules


def test_a_validation_rule_refusal_is_permanent_and_names_the_rule(
    fake: FakeCrm, port: HubSpotPort
) -> None:
    """From 2026-09 HubSpot enforces the portal's own validation rules on every CRM write: a
    400 VALIDATION_ERROR. Sending it again changes nothing, so it is permanent (and was not
    applied), and the rule's message is what the error says."""
    rule = {
        "property": "leadsource",
        "message": "Lead source is required for customers",
        "when": {"lifecyclestage": "customer"},
    }
    httpx.post(
        f"{fake.url}/_admin/validation-rules",
        json={"portal_id": 62515, "object_type": "contacts", "rules": [rule]},
    ).raise_for_status()
    with pytest.raises(PortError) as err:
        port.create("contacts", {"email": "v@x.io", "lifecyclestage": "customer"})
    assert err.value.code == "invalid_request" and not err.value.transient
    assert err.value.status == 400 and err.value.code in NOT_APPLIED_CODES
    assert "leadsource: Lead source is required for customers" in str(err.value)
    assert fake.records("contacts") == []
    made = port.create("contacts", {"email": "v@x.io", "lifecyclestage": "lead"})
    with pytest.raises(PortError) as err:  # an update is judged on the record it would leave
        port.update("contacts", made.id, {"lifecyclestage": "customer"})
    assert "Lead source is required for customers" in str(err.value)
    port.update("contacts", made.id, {"lifecyclestage": "customer", "leadsource": "web"})
    # The version before 2026-09 did not enforce them (the fake serves it to show the change).
    older = httpx.post(
        f"{fake.url}/crm/objects/2026-03/contacts",
        json={"properties": {"email": "o@x.io", "lifecyclestage": "customer"}},
        headers={"Authorization": "Bearer tok"},
    )
    assert older.status_code == 201


def test_validation_errors_are_read_defensively() -> None:
    """Every field of HubSpot's error body is optional; items without a message add nothing."""

    def message(body: object) -> str:
        return str(classify_response(httpx.Response(400, json=body)))

    full = {
        "category": "VALIDATION_ERROR",
        "message": "Property values were not valid",
        "errors": [
            {"message": "Pick a region", "context": {"propertyName": ["region"]}},
            {"code": "X"},
            "junk",
            {"message": "Property values were not valid"},
        ],
    }
    assert message(full).endswith("Property values were not valid [region: Pick a region]")
    assert message({"category": "VALIDATION_ERROR", "message": "m", "errors": "no"}).endswith(": m")
    assert message({"category": "OTHER", "message": "m", "errors": [{"message": "x"}]}).endswith(
        ": m"
    )
