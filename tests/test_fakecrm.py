"""The fake CRM behaves like the vendor where onceflow depends on it, over real HTTP."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from devstack.fakecrm import FakeCrm, FakeCrmConfig
from devstack.tools import free_port
from shared.providers.hubspot import versions

OBJECTS = f"/crm/objects/{versions.CRM_VERSION}"


@pytest.fixture
def fake() -> Iterator[FakeCrm]:
    crm = FakeCrm(FakeCrmConfig(token="tok")).start()
    try:
        yield crm
    finally:
        crm.stop()


def client(fake: FakeCrm) -> httpx.Client:
    return httpx.Client(base_url=fake.url, headers={"Authorization": "Bearer tok"}, timeout=5)


def test_vendor_replay_dropped_create_then_identical_replay_makes_two_records(
    fake: FakeCrm,
) -> None:
    """Why creates must be at-most-once: the vendor has no idempotency on create."""
    fake.add_fault(action="drop_after_commit", method="POST", path=f"{OBJECTS}/contacts$")
    body = {"properties": {"firstname": "Ada", "lastname": "Lovelace"}}
    with client(fake) as c:
        with pytest.raises(httpx.RemoteProtocolError):
            c.post(f"{OBJECTS}/contacts", json=body)
        replay = c.post(f"{OBJECTS}/contacts", json=body)
    assert replay.status_code == 201
    contacts = fake.records("contacts")
    assert len(contacts) == 2
    assert {r["properties"]["firstname"] for r in contacts} == {"Ada"}


def test_create_shape_get_update_and_search(fake: FakeCrm) -> None:
    with client(fake) as c:
        created = c.post(f"{OBJECTS}/deals", json={"properties": {"dealname": "Big", "amount": 5}})
        assert created.status_code == 201
        rec = created.json()
        assert set(rec) == {"id", "properties", "createdAt", "updatedAt", "archived"}
        assert rec["properties"]["amount"] == "5"  # HubSpot values are strings
        assert rec["properties"]["hs_object_id"] == rec["id"]
        assert int(created.headers["X-HubSpot-RateLimit-Remaining"]) == 189
        assert created.headers["X-HubSpot-RateLimit-Interval-Milliseconds"] == "10000"

        got = c.get(f"{OBJECTS}/deals/{rec['id']}", params={"properties": "dealname"})
        assert got.json()["properties"]["dealname"] == "Big"
        assert "amount" not in got.json()["properties"]

        upd = c.patch(f"{OBJECTS}/deals/{rec['id']}", json={"properties": {"amount": "7"}})
        assert upd.status_code == 200 and upd.json()["properties"]["amount"] == "7"

        found = c.post(
            f"{OBJECTS}/deals/search",
            json={
                "filterGroups": [
                    {"filters": [{"propertyName": "amount", "operator": "GT", "value": "6"}]}
                ]
            },
        ).json()
        assert found["total"] == 1 and found["results"][0]["id"] == rec["id"]

        assert c.get(f"{OBJECTS}/deals/999999").status_code == 404
        assert c.post(f"{OBJECTS}/widgets", json={"properties": {}}).status_code == 400
        assert c.post(f"{OBJECTS}/deals", json={"nope": 1}).status_code == 400
    assert httpx.post(f"{fake.url}{OBJECTS}/deals", json={"properties": {}}).status_code == 401


def test_unique_email_conflict_names_the_existing_id(fake: FakeCrm) -> None:
    with client(fake) as c:
        first = c.post(f"{OBJECTS}/contacts", json={"properties": {"email": "a@x.io"}}).json()
        clash = c.post(f"{OBJECTS}/contacts", json={"properties": {"email": "A@x.io"}})
    assert clash.status_code == 409
    assert f"Existing ID: {first['id']}" in clash.json()["message"]
    assert clash.json()["category"] == "CONFLICT"


def test_faults_rate_limit_500_reset_and_delay(fake: FakeCrm) -> None:
    fake.add_fault(action="rate_limit", retry_after=7)
    fake.add_fault(action="error_500")
    fake.add_fault(action="reset")
    body = {"properties": {"name": "Acme"}}
    with client(fake) as c:
        limited = c.post(f"{OBJECTS}/companies", json=body)
        assert limited.status_code == 429 and limited.headers["Retry-After"] == "7"
        assert limited.json()["policyName"] == "SECONDLY"
        assert c.post(f"{OBJECTS}/companies", json=body).status_code == 500
        with pytest.raises(httpx.ReadError):
            c.post(f"{OBJECTS}/companies", json=body)
        assert fake.records("companies") == []  # none of the faults wrote
        slow = c.post(
            f"{OBJECTS}/companies",
            json=body,
            headers={"X-Fakecrm-Fault": "delay", "X-Fakecrm-Delay": "0.3"},
        )
        assert slow.status_code == 201 and slow.elapsed.total_seconds() >= 0.3


def test_subscriptions_api_list_create_delete(fake: FakeCrm) -> None:
    with client(fake) as c:
        base = versions.webhook_subscriptions("424242")
        made = c.post(
            base,
            json={"eventType": "deal.propertyChange", "propertyName": "dealstage", "active": True},
        )
        assert made.status_code == 201
        sub = made.json()
        assert (
            c.post(
                base, json={"eventType": "deal.propertyChange", "propertyName": "dealstage"}
            ).status_code
            == 409
        )
        assert c.post(base, json={"eventType": "deal.propertyChange"}).status_code == 400
        assert [s["id"] for s in c.get(base).json()["results"]] == [sub["id"]]
        assert c.delete(f"{base}/{sub['id']}").status_code == 204
        assert c.get(base).json()["results"] == []
        assert c.get(versions.webhook_subscriptions("1")).status_code == 404


class _Inbox:
    def __init__(self) -> None:
        self.received: list[tuple[dict[str, str], bytes, str]] = []
        self.got = threading.Event()
        inbox = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a: Any) -> None:
                return

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                inbox.received.append((dict(self.headers), body, self.path))
                self.send_response(204)
                self.end_headers()
                inbox.got.set()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/webhooks/hubspot/c1"


def test_sends_signed_v3_webhooks_with_change_source() -> None:
    inbox = _Inbox()
    fake = FakeCrm(FakeCrmConfig(webhook_url=inbox.url, app_secret="s3cret")).start()
    try:
        with httpx.Client(base_url=fake.url) as c:
            rid = c.post(f"{OBJECTS}/contacts", json={"properties": {"email": "e@x.io"}}).json()[
                "id"
            ]
            c.patch(f"{OBJECTS}/contacts/{rid}", json={"properties": {"lifecyclestage": "lead"}})
            # A change "by a person in the CRM" carries a different author.
            c.patch(f"/_admin/records/contacts/{rid}", json={"properties": {"firstname": "Bo"}})
        assert fake.webhooks.wait_idle()
    finally:
        fake.stop()
        inbox.server.shutdown()
        inbox.server.server_close()
    events = []
    for headers, body, _path in inbox.received:
        ts = headers["X-HubSpot-Request-Timestamp"]
        expected = base64.b64encode(
            hmac.new(
                b"s3cret", b"POST" + inbox.url.encode() + body + ts.encode(), hashlib.sha256
            ).digest()
        ).decode()
        assert hmac.compare_digest(headers["X-HubSpot-Signature-v3"], expected)
        events.extend(json.loads(body))
    kinds = [(e["subscriptionType"], e.get("propertyName"), e["changeSource"]) for e in events]
    assert ("contact.creation", None, "INTEGRATION") in kinds
    assert ("contact.propertyChange", "lifecyclestage", "INTEGRATION") in kinds
    assert ("contact.propertyChange", "firstname", "CRM_UI") in kinds
    lifecycle = next(e for e in events if e.get("propertyName") == "lifecyclestage")
    assert lifecycle["propertyValue"] == "lead" and lifecycle["objectId"] == int(rid)
    assert lifecycle["sourceId"] == "424242" and lifecycle["portalId"] == 62515


def test_require_subscriptions_filters_events() -> None:
    inbox = _Inbox()
    fake = FakeCrm(FakeCrmConfig(webhook_url=inbox.url, require_subscriptions=True)).start()
    try:
        with httpx.Client(base_url=fake.url) as c:
            c.post(versions.webhook_subscriptions("424242"), json={"eventType": "contact.creation"})
            c.post(f"{OBJECTS}/contacts", json={"properties": {"email": "f@x.io"}})
        assert fake.webhooks.wait_idle()
    finally:
        fake.stop()
        inbox.server.shutdown()
        inbox.server.server_close()
    events = [e for _h, body, _p in inbox.received for e in json.loads(body)]
    assert [e["subscriptionType"] for e in events] == ["contact.creation"]
    assert events[0]["subscriptionId"] == 501


def test_cli_starts_reads_secret_from_env_and_serves_admin_state() -> None:
    port = free_port()
    env = dict(os.environ, FAKE_SECRET="from-env")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "devstack.fakecrm",
            "--port",
            str(port),
            "--webhook-url",
            "http://127.0.0.1:9/hook",
            "--app-secret-env",
            "FAKE_SECRET",
        ],
        stdout=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = json.loads(proc.stdout.readline())
        assert line["fakecrm"] == f"http://127.0.0.1:{port}"
        httpx.post(
            f"{line['fakecrm']}/_admin/faults", json={"action": "error_500", "times": 2}
        ).raise_for_status()
        state = httpx.get(f"{line['fakecrm']}/_admin/state").json()
        assert state["faults"][0]["times"] == 2
        assert state["config"]["webhook_url"] == "http://127.0.0.1:9/hook"
        assert (
            httpx.post(f"{line['fakecrm']}/_admin/faults", json={"action": "explode"}).status_code
            == 400
        )
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0
        assert proc.stdout is not None
        proc.stdout.close()
    missing = subprocess.run(
        [sys.executable, "-m", "devstack.fakecrm", "--app-secret-env", "NOT_SET_ANYWHERE"],
        capture_output=True,
        text=True,
        check=False,
        env={k: v for k, v in os.environ.items() if k != "NOT_SET_ANYWHERE"},
    )
    assert missing.returncode == 2 and "NOT_SET_ANYWHERE" in missing.stderr


def test_search_lags_writes_when_asked() -> None:
    fake = FakeCrm(FakeCrmConfig(search_lag_seconds=30)).start()
    try:
        with httpx.Client(base_url=fake.url) as c:
            c.post(f"{OBJECTS}/contacts", json={"properties": {"email": "new@x.io"}})
            found = c.post(f"{OBJECTS}/contacts/search", json={"filterGroups": []}).json()
            assert found["total"] == 0  # written, not yet searchable (like the vendor)
            c.post("/_admin/config", json={"search_lag_seconds": 0})
            found = c.post(f"{OBJECTS}/contacts/search", json={"filterGroups": []}).json()
            assert found["total"] == 1
    finally:
        fake.stop()


class _GatedInbox(_Inbox):
    """An inbox that holds every request at a gate until the test opens it, counting how many
    are in flight at once."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.changed = threading.Condition()
        self.in_flight = 0
        inbox = self
        handler = self.server.RequestHandlerClass

        class H(handler):  # type: ignore[valid-type,misc]
            def do_POST(self) -> None:
                with inbox.changed:
                    inbox.in_flight += 1
                    inbox.changed.notify_all()
                inbox.gate.wait(30)
                super().do_POST()

        self.server.RequestHandlerClass = H

    def wait_in_flight(self, count: int, timeout: float) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: self.in_flight >= count, timeout)


def test_realistic_delivery_is_concurrent_unordered_duplicated_and_redelivered() -> None:
    """HubSpot delivers up to 10 requests at once, in no particular order, and sometimes twice
    (https://developers.hubspot.com/docs/api/webhooks). The realistic mode does all of it."""
    inbox = _GatedInbox()
    fake = FakeCrm(FakeCrmConfig(webhook_url=inbox.url, delivery="realistic")).start()
    try:
        with httpx.Client(base_url=fake.url) as c:
            for n in range(24):
                c.post(f"{OBJECTS}/deals", json={"properties": {"dealname": f"d{n}"}})
        # Serial delivery would never have more than one request in flight.
        assert inbox.wait_in_flight(10, timeout=20)
        inbox.gate.set()  # the rest were waiting: taken in a shuffled order from here on
        assert fake.webhooks.wait_idle(30)
    finally:
        inbox.gate.set()
        fake.stop()
        inbox.server.shutdown()
        inbox.server.server_close()
    batches = [json.loads(body) for _h, body, _p in inbox.received]
    first_tries = [json.dumps(e) for batch in batches for e in batch if e["attemptNumber"] == 0]
    assert len(first_tries) > len(set(first_tries))  # the same event sent twice as-is
    assert any(len(batch) > 2 for batch in batches)  # waiting batches merged into one request
    # Redelivered although acknowledged (204): the same events again, attemptNumber 1.
    assert any(e["attemptNumber"] == 1 for batch in batches for e in batch)
    firsts = [batch[0]["eventId"] for batch in batches if batch[0]["attemptNumber"] == 0]
    assert firsts != sorted(firsts)  # not in the order the changes happened
    created = {e["objectId"] for batch in batches for e in batch}
    assert len(created) == 24  # nothing lost


def test_v1_signature_beside_v3_and_non_unique_event_ids() -> None:
    inbox = _Inbox()
    config = FakeCrmConfig(webhook_url=inbox.url, app_secret="s3cret", unique_event_ids=False)
    fake = FakeCrm(config).start()
    try:
        with httpx.Client(base_url=fake.url) as c:
            for n in range(4):
                c.post(f"{OBJECTS}/contacts", json={"properties": {"email": f"{n}@x.io"}})
        assert fake.webhooks.wait_idle()
    finally:
        fake.stop()
        inbox.server.shutdown()
        inbox.server.server_close()
    ids: list[int] = []
    for headers, body, _path in inbox.received:
        assert headers["X-HubSpot-Signature-Version"] == "v1"
        assert headers["X-HubSpot-Signature"] == hashlib.sha256(b"s3cret" + body).hexdigest()
        assert "X-HubSpot-Signature-v3" in headers
        ids.extend(e["eventId"] for e in json.loads(body))
    assert len(ids) == 8 and len(set(ids)) < len(ids)  # eventIds repeat across events


def test_429_without_retry_after_when_asked() -> None:
    """HubSpot's CRM 429s don't promise Retry-After; the rate-limit headers say the window."""
    config = FakeCrmConfig(rate_limit_max=1, rate_limit_retry_after=False)
    fake = FakeCrm(config).start()
    try:
        with httpx.Client(base_url=fake.url) as c:
            c.get(f"{OBJECTS}/contacts/1")
            refused = c.get(f"{OBJECTS}/contacts/1")
    finally:
        fake.stop()
    assert refused.status_code == 429
    assert "Retry-After" not in refused.headers
    assert refused.headers["X-HubSpot-RateLimit-Interval-Milliseconds"] == "10000"


def test_portals_of_one_app_are_apart_and_share_one_webhook_url() -> None:
    """Two portals installed the same app: each token sees only its portal's records, and both
    portals' changes go to the app's one URL, naming their portalId."""
    inbox = _Inbox()
    config = FakeCrmConfig(webhook_url=inbox.url, token="tok-a", portals={"tok-b": 2002})
    fake = FakeCrm(config).start()
    try:
        a = httpx.Client(base_url=fake.url, headers={"Authorization": "Bearer tok-a"})
        b = httpx.Client(base_url=fake.url, headers={"Authorization": "Bearer tok-b"})
        with a, b:
            made = a.post(f"{OBJECTS}/contacts", json={"properties": {"email": "x@x.io"}})
            rid = made.json()["id"]
            assert b.get(f"{OBJECTS}/contacts/{rid}").status_code == 404
            # Unique per portal: the same email is a new contact in the other portal.
            assert (
                b.post(f"{OBJECTS}/contacts", json={"properties": {"email": "x@x.io"}}).status_code
                == 201
            )
            found = b.post(f"{OBJECTS}/contacts/search", json={"filterGroups": []})
            assert [r["id"] for r in found.json()["results"]] != [rid]
        assert fake.webhooks.wait_idle()
    finally:
        fake.stop()
        inbox.server.shutdown()
        inbox.server.server_close()
    portals = {e["portalId"] for _h, body, path in inbox.received for e in json.loads(body)}
    assert portals == {62515, 2002}
    assert {path for _h, _b, path in inbox.received} == {"/webhooks/hubspot/c1"}


def test_tasks_need_hs_timestamp_and_take_associations_and_unique_values_conflict() -> None:
    """HubSpot's tasks guide: `hs_timestamp` is required, and a task shows on a record only
    when associated with it (type 204: task to contact). A property created with
    hasUniqueValue answers a second create with 409 "Existing ID: N"."""
    config = FakeCrmConfig(strict_tasks=True, unique_properties={"tasks": ["onceflow_key"]})
    fake = FakeCrm(config).start()
    try:
        with httpx.Client(base_url=fake.url) as c:
            contact = c.post(f"{OBJECTS}/contacts", json={"properties": {"email": "t@x.io"}})
            cid = contact.json()["id"]
            assert (
                c.post(
                    f"{OBJECTS}/tasks", json={"properties": {"hs_task_subject": "Call"}}
                ).status_code
                == 400
            )
            task = {
                "properties": {
                    "hs_task_subject": "Call",
                    "hs_timestamp": "1",
                    "onceflow_key": "k1",
                },
                "associations": [
                    {
                        "to": {"id": cid},
                        "types": [
                            {"associationCategory": "HUBSPOT_DEFINED", "associationTypeId": 204}
                        ],
                    }
                ],
            }
            made = c.post(f"{OBJECTS}/tasks", json=task)
            assert made.status_code == 201
            assert made.json()["associations"] == {
                "contacts": {"results": [{"id": cid, "type_id": 204}]}
            }
            again = c.post(f"{OBJECTS}/tasks", json=task)
            assert again.status_code == 409
            assert f"Existing ID: {made.json()['id']}" in again.json()["message"]
            wrong = {**task, "properties": {**task["properties"], "onceflow_key": "k2"}}
            wrong["associations"] = [
                {"to": {"id": "999999"}, "types": [{"associationTypeId": 204}]}
            ]
            assert c.post(f"{OBJECTS}/tasks", json=wrong).status_code == 400
    finally:
        fake.stop()


def test_oauth_codes_expiring_access_tokens_refresh_and_revocation() -> None:
    """HubSpot's OAuth as the fake plays it: a one-time code, access tokens that expire (a
    401 on the CRM API), a refresh, and a revoked refresh token answering BAD_REFRESH_TOKEN."""
    fake = FakeCrm(FakeCrmConfig(token="tok")).start()
    client = {"client_id": "fake-client-id", "client_secret": "fake-client-secret"}
    redirect = "https://ops.example.com/oauth/callback"
    try:
        with httpx.Client(base_url=fake.url) as c:
            code = c.post(
                "/_admin/oauth/authorize", json={"portal_id": 2002, "redirect_uri": redirect}
            ).json()["code"]
            exchange = {**client, "grant_type": "authorization_code", "code": code}
            granted = c.post(versions.oauth_token(), data={**exchange, "redirect_uri": redirect})
            assert granted.status_code == 200
            tokens = granted.json()
            assert (tokens["expires_in"], tokens["hub_id"]) == (1800, 2002)
            replayed = c.post(versions.oauth_token(), data={**exchange, "redirect_uri": redirect})
            assert (replayed.status_code, replayed.json()["status"]) == (400, "BAD_AUTH_CODE")

            def create(access: str) -> httpx.Response:
                return c.post(
                    f"{OBJECTS}/deals",
                    json={"properties": {"dealname": "x"}},
                    headers={"Authorization": f"Bearer {access}"},
                )

            assert create(tokens["access_token"]).status_code == 201
            assert fake.records("deals")[0]["portalId"] == 2002
            c.post("/_admin/oauth/expire", json={})
            expired = create(tokens["access_token"])
            assert (expired.status_code, expired.json()["category"]) == (
                401,
                "EXPIRED_AUTHENTICATION",
            )
            refresh = {**client, "grant_type": "refresh_token"}
            fresh = c.post(
                versions.oauth_token(), data={**refresh, "refresh_token": tokens["refresh_token"]}
            ).json()
            assert create(fresh["access_token"]).status_code == 201
            c.post("/_admin/oauth/revoke", json={"refresh_token": tokens["refresh_token"]})
            revoked = c.post(
                versions.oauth_token(), data={**refresh, "refresh_token": tokens["refresh_token"]}
            )
            assert (revoked.status_code, revoked.json()["status"]) == (400, "BAD_REFRESH_TOKEN")
            assert create(fresh["access_token"]).status_code == 401  # uninstalled: tokens gone
    finally:
        fake.stop()


def test_the_strict_task_check_is_on_by_default() -> None:
    """Issue 24 item 5: with the check off by default, examples creating tasks HubSpot refuses
    passed against the fake. HubSpot: hs_timestamp "Required"
    (https://developers.hubspot.com/docs/api/crm/tasks)."""
    fake = FakeCrm().start()
    try:
        with httpx.Client(base_url=fake.url) as c:
            bare = c.post(f"{OBJECTS}/tasks", json={"properties": {"hs_task_subject": "x"}})
            assert bare.status_code == 400
            assert "hs_timestamp is required" in bare.json()["message"]
            dated = {"hs_task_subject": "x", "hs_timestamp": "2026-12-03T10:00:00Z"}
            assert c.post(f"{OBJECTS}/tasks", json={"properties": dated}).status_code == 201
    finally:
        fake.stop()


def test_search_finds_records_by_association_from_either_side() -> None:
    """HubSpot's search pseudo-property `associations.<object>` (used by the deal examples):
    a contact associated with a deal is found by `associations.deal`, and a task associated
    with the contact by `associations.contact`."""
    fake = FakeCrm().start()
    try:
        with httpx.Client(base_url=fake.url) as c:
            deal = c.post(f"{OBJECTS}/deals", json={"properties": {"dealname": "d"}})
            did = deal.json()["id"]
            link = {"to": {"id": did}, "types": [{"associationTypeId": 4}]}
            contact = c.post(
                f"{OBJECTS}/contacts",
                json={"properties": {"email": "a@x.io"}, "associations": [link]},
            )
            c.post(f"{OBJECTS}/contacts", json={"properties": {"email": "b@x.io"}})

            def search(object_type: str, name: str, value: str) -> list[str]:
                flt = {"propertyName": name, "operator": "EQ", "value": value}
                body = {"filterGroups": [{"filters": [flt]}]}
                found = c.post(f"{OBJECTS}/{object_type}/search", json=body).json()
                return [r["id"] for r in found["results"]]

            assert search("contacts", "associations.deal", did) == [contact.json()["id"]]
            # From the other side: the deal is found by the contact associated with it.
            assert search("deals", "associations.contact", contact.json()["id"]) == [did]
    finally:
        fake.stop()


def test_a_new_app_gets_404_on_numbered_paths_and_a_legacy_app_is_served() -> None:
    """Numbered versions (v1 to v4) are what a new app can no longer use: the fake answers them
    404 unless told it is a legacy app, and records every path it was asked for."""
    new, legacy = FakeCrm().start(), FakeCrm(FakeCrmConfig(new_app=False)).start()
    body = {"properties": {"dealname": "x"}}
    try:
        for path in (
            "/crm/v3/objects/deals",
            "/crm/v4/objects/deals",
            "/webhooks/v3/424242/subscriptions",
        ):
            assert httpx.post(new.url + path, json=body).status_code == 404
        assert httpx.post(new.url + "/oauth/v1/token", data={}).status_code == 404
        assert httpx.post(new.url + "/crm/objects/2025-09/deals", json=body).status_code == 404
        assert httpx.post(new.url + versions.crm_objects("deals"), json=body).status_code == 201
        assert new.numbered_requests() == [
            "POST /crm/v3/objects/deals",
            "POST /crm/v4/objects/deals",
            "POST /webhooks/v3/424242/subscriptions",
            "POST /oauth/v1/token",
        ]
        assert httpx.post(new.url + "/_sink/v1/hooks", json={}).status_code == 200  # not HubSpot
        assert len(new.numbered_requests()) == 4
        new.store.requests.clear()  # called on purpose: not a port's mistake
        assert httpx.post(legacy.url + "/crm/v3/objects/deals", json=body).status_code == 201
        assert httpx.post(legacy.url + versions.crm_objects("deals"), json=body).status_code == 201
    finally:
        new.stop()
        legacy.stop()


def test_the_2026_03_token_endpoint_and_introspection() -> None:
    """Form body only; the answer names the portal and scopes; introspection authenticates
    with the app's client and says whether a token is active and for which portal."""
    fake = FakeCrm().start()
    client = {"client_id": "fake-client-id", "client_secret": "fake-client-secret"}
    try:
        with httpx.Client(base_url=fake.url) as c:
            code = c.post("/_admin/oauth/authorize", json={"portal_id": 2002, "redirect_uri": "r"})
            form = {**client, "grant_type": "authorization_code", "redirect_uri": "r"}
            in_query = c.post(versions.oauth_token(), params={"code": code.json()["code"], **form})
            assert in_query.status_code == 400
            tokens = c.post(versions.oauth_token(), data={**form, "code": code.json()["code"]})
            assert tokens.status_code == 200
            assert tokens.json()["hub_id"] == 2002 and tokens.json()["scopes"]
            access = tokens.json()["access_token"]
            seen = c.post(versions.oauth_introspect(), data={**client, "token": access}).json()
            assert (seen["active"], seen["hub_id"], seen["app_id"]) == (True, 2002, 424242)
            wrong = {**client, "client_secret": "nope", "token": access}
            assert c.post(versions.oauth_introspect(), data=wrong).status_code == 401
            c.post("/_admin/oauth/expire", json={})
            gone = c.post(versions.oauth_introspect(), data={**client, "token": access}).json()
            assert gone == {"active": False}
    finally:
        fake.stop()


def test_service_keys_act_for_their_portal_until_rotated_and_never_on_webhooks() -> None:
    fake = FakeCrm(FakeCrmConfig(token="tok")).start()
    body = {"properties": {"dealname": "x"}}
    try:
        with httpx.Client(base_url=fake.url) as c:
            key = c.post("/_admin/service-keys", json={"portal_id": 3003}).json()["key"]
            auth = {"Authorization": f"Bearer {key}"}
            assert c.post(versions.crm_objects("deals"), json=body, headers=auth).status_code == 201
            assert fake.records("deals")[0]["portalId"] == 3003
            subs = c.get(versions.webhook_subscriptions("424242"), headers=auth)
            assert subs.status_code == 403  # "Service keys do not support webhooks"
            new = c.post("/_admin/service-keys/rotate", json={"key": key}).json()["key"]
            refused = c.post(versions.crm_objects("deals"), json=body, headers=auth)
            assert (refused.status_code, refused.json()["category"]) == (
                401,
                "INVALID_AUTHENTICATION",
            )
            fresh = {"Authorization": f"Bearer {new}"}
            assert (
                c.post(versions.crm_objects("deals"), json=body, headers=fresh).status_code == 201
            )
    finally:
        fake.stop()
