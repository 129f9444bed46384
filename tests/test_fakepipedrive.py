"""The fake Pipedrive behaves like Pipedrive where it is inconvenient, over real HTTP
(docs/vendors/pipedrive.md, "How the fake Pipedrive must behave to be honest")."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from devstack.fakepipedrive import DeliveryPolicy, FakePipedrive, FakePipedriveConfig
from devstack.tools import free_port

TOKEN = {"x-api-token": "pd-api-token"}
HASH = "3d0fa3b1c2d4e5f60718293a4b5c6d7e8f901234"  # a 40-character custom field key


@pytest.fixture
def fake() -> Iterator[FakePipedrive]:
    config = FakePipedriveConfig(
        custom_fields={"person": {HASH: "varchar"}},
        delivery=DeliveryPolicy(time_factor=0.01),
    )
    pd = FakePipedrive(config).start()
    try:
        yield pd
    finally:
        pd.stop()


class Receiver:
    """A webhook endpoint that records what it is sent and fails the first `fail` requests."""

    def __init__(self, fail: int = 0) -> None:
        self.got: list[dict[str, Any]] = []
        self.fail = fail
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with receiver.lock:
                    receiver.got.append(
                        {"auth": self.headers.get("Authorization"), "body": json.loads(raw)}
                    )
                    failing = receiver.fail > 0
                    receiver.fail -= 1
                self.send_response(500 if failing else 200)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def wait(self, n: int, timeout: float = 5.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if len(self.got) >= n:
                    return list(self.got)
            time.sleep(0.02)
        return list(self.got)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    try:
        yield r
    finally:
        r.close()


def hook(fake: FakePipedrive, url: str, **extra: Any) -> httpx.Response:
    body = {
        "subscription_url": url,
        "event_action": "*",
        "event_object": "person",
        "http_auth_user": "onceflow",
        "http_auth_password": "s3cret",
        **extra,
    }
    return httpx.post(f"{fake.url}/v1/webhooks", json=body, headers=TOKEN)


def test_a_create_whose_answer_was_lost_and_is_sent_again_makes_two_records(
    fake: FakePipedrive,
) -> None:
    fake.add_fault("drop_after_commit", method="POST", path="/api/v2/persons$")
    body = {"name": "Ada", "emails": [{"value": "ada@x.io", "primary": True}]}
    with pytest.raises(httpx.HTTPError):
        httpx.post(f"{fake.url}/api/v2/persons", json=body, headers=TOKEN)
    again = httpx.post(f"{fake.url}/api/v2/persons", json=body, headers=TOKEN)
    assert again.status_code == 200
    assert [p["name"] for p in fake.stored("person")] == ["Ada", "Ada"]  # no 409, no dedupe


def test_the_burst_limit_is_per_token_in_a_rolling_two_second_window(fake: FakePipedrive) -> None:
    fake.config.burst_api_token = 5  # Lite's 20, made small so the calls surely fit one window
    with httpx.Client(base_url=fake.url, headers=TOKEN) as client:
        answers = [client.get("/v1/users/me") for _ in range(6)]
        assert [a.status_code for a in answers[:5]] == [200] * 5
        limited = answers[5]
        assert limited.status_code == 429 and limited.json()["success"] is False
        assert limited.headers["x-ratelimit-limit"] == "5"
        assert limited.headers["x-ratelimit-remaining"] == "0"
        assert 1 <= int(limited.headers["x-ratelimit-reset"]) <= 2
        assert "retry-after" not in limited.headers  # not confirmed today: off by default
        assert answers[0].headers["x-daily-requests-left"] == "10000"
        fake.config.api_tokens["second-token"] = 7  # another user's token: its own window
        other = client.get("/v1/users/me", headers={"x-api-token": "second-token"})
        assert other.status_code == 200
        time.sleep(int(limited.headers["x-ratelimit-reset"]))
        assert client.get("/v1/users/me").status_code == 200


def test_searches_have_their_own_limit_of_ten(fake: FakePipedrive) -> None:
    with httpx.Client(base_url=fake.url, headers=TOKEN) as client:
        url = "/api/v2/persons/search?term=ada&exact_match=true"
        statuses = [client.get(url).status_code for _ in range(11)]
    assert statuses == [200] * 10 + [429]


def test_a_spent_daily_budget_refuses_every_request_until_midnight(fake: FakePipedrive) -> None:
    fake.config.daily_budget = 12
    fake.config.token_budget_headers = True
    ok = httpx.get(f"{fake.url}/api/v2/persons", headers=TOKEN)  # a list costs 10
    assert ok.headers["x-daily-ratelimit-token-remaining"] == "2"
    httpx.get(f"{fake.url}/api/v2/persons", headers=TOKEN)  # 20 > 12: spent
    spent = httpx.get(f"{fake.url}/v1/users/me", headers=TOKEN)
    assert spent.status_code == 429
    assert spent.headers["x-daily-ratelimit-token-remaining"] == "0"
    httpx.post(f"{fake.url}/_admin/midnight")
    assert httpx.get(f"{fake.url}/v1/users/me", headers=TOKEN).status_code == 200


def test_v2_validation_is_strict(fake: FakePipedrive) -> None:
    def create(path: str, body: dict[str, Any]) -> int:
        return httpx.post(f"{fake.url}{path}", json=body, headers=TOKEN).status_code

    assert create("/api/v2/persons", {"name": "A", "org_id": "7"}) == 400  # no coercion
    assert create("/api/v2/persons", {"name": "A", "emails": "a@x.io"}) == 400
    assert create("/api/v2/activities", {"subject": "s", "person_id": 1}) == 400  # read-only
    assert create("/api/v2/deals", {"value": 3}) == 400  # title required
    assert create("/v1/notes", {"content": "hi"}) == 400  # a note needs a parent
    assert httpx.get(f"{fake.url}/api/v2/persons/1").status_code == 401  # no token


def test_oauth_tokens_expire_and_refresh_keeps_the_refresh_token(fake: FakePipedrive) -> None:
    grant = fake.issue_grant("https://hooks.example.com/cb")
    bearer = {"Authorization": f"Bearer {grant.access_token}"}
    me = httpx.get(f"{fake.url}/v1/users/me", headers=bearer)
    assert me.json()["data"]["id"] == fake.config.oauth_user_id
    assert me.headers["x-ratelimit-limit"] == "80" and "x-daily-requests-left" not in me.headers
    httpx.post(f"{fake.url}/_admin/oauth/expire")
    assert httpx.get(f"{fake.url}/v1/users/me", headers=bearer).status_code == 401
    refreshed = httpx.post(
        f"{fake.url}/oauth/token",
        data={"grant_type": "refresh_token", "refresh_token": grant.refresh_token},
        auth=(fake.config.oauth_client_id, fake.config.oauth_client_secret),
    ).json()
    assert refreshed["refresh_token"] == grant.refresh_token  # OA step 7: the same one
    assert refreshed["api_domain"] == fake.url
    bearer = {"Authorization": f"Bearer {refreshed['access_token']}"}
    assert httpx.get(f"{fake.url}/v1/users/me", headers=bearer).status_code == 200
    wrong_client = httpx.post(
        f"{fake.url}/oauth/token",
        data={"grant_type": "refresh_token", "refresh_token": grant.refresh_token},
        auth=("someone", "else"),
    )
    assert wrong_client.status_code == 401


def test_webhooks_v2_carry_meta_data_previous_and_basic_auth(
    fake: FakePipedrive, receiver: Receiver
) -> None:
    assert hook(fake, receiver.url).status_code == 201
    made = httpx.post(
        f"{fake.url}/api/v2/persons",
        json={"name": "Ada", "custom_fields": {HASH: "blue"}},
        headers=TOKEN,
    ).json()["data"]
    httpx.patch(
        f"{fake.url}/api/v2/persons/{made['id']}",
        json={"name": "Ada L", "custom_fields": {HASH: "green"}},
        headers=TOKEN,
    )
    httpx.patch(f"{fake.url}/_admin/ui/person/{made['id']}", json={"name": "Ada Lovelace"})
    got = receiver.wait(3)
    assert len(got) == 3
    assert {g["auth"] for g in got} == {"Basic " + base64.b64encode(b"onceflow:s3cret").decode()}
    by_action = {}
    for g in got:
        meta = g["body"]["meta"]
        by_action.setdefault(meta["action"], []).append(g["body"])
    created = by_action["create"][0]
    assert created["meta"]["entity_id"] == str(made["id"])  # ids are strings
    assert created["meta"]["user_id"] == "12415231" and created["meta"]["change_source"] == "api"
    assert created["meta"]["attempt"] == 1 and created["previous"] is None
    assert created["data"]["custom_fields"][HASH] == {"type": "varchar", "value": "blue"}
    api_change, ui_change = sorted(
        by_action["change"], key=lambda b: b["meta"]["change_source"] == "app"
    )
    assert api_change["meta"]["change_source"] == "api"
    assert set(api_change["previous"]) == {"name", "custom_fields", "update_time"}
    assert api_change["previous"]["custom_fields"] == {HASH: {"type": "varchar", "value": "blue"}}
    assert ui_change["meta"]["change_source"] == "app"


def test_a_failed_delivery_is_retried_with_the_next_attempt_number(fake: FakePipedrive) -> None:
    failing = Receiver(fail=2)
    try:
        hook(fake, failing.url)
        httpx.post(f"{fake.url}/api/v2/persons", json={"name": "Ada"}, headers=TOKEN)
        got = failing.wait(3)
    finally:
        failing.close()
    assert [g["body"]["meta"]["attempt"] for g in got] == [1, 2, 3]
    assert len({g["body"]["meta"]["id"] for g in got}) == 1  # the same event


def test_lost_acks_and_overlapping_webhooks_deliver_one_change_more_than_once(
    fake: FakePipedrive, receiver: Receiver
) -> None:
    fake.config.delivery.duplicate_every = 1
    hook(fake, receiver.url)
    hook(fake, receiver.url, event_action="create")
    httpx.post(f"{fake.url}/api/v2/persons", json={"name": "Ada"}, headers=TOKEN)
    got = receiver.wait(4)
    assert len(got) == 4
    assert len({g["body"]["meta"]["id"] for g in got}) == 1
    assert len({g["body"]["meta"]["webhook_id"] for g in got}) == 2


def test_at_most_forty_webhooks_per_user_and_an_app_sees_only_its_own(
    fake: FakePipedrive, receiver: Receiver
) -> None:
    fake.config.burst_api_token = 100  # a Premium plan: 41 calls fit one window
    assert [hook(fake, receiver.url).status_code for _ in range(40)] == [201] * 40
    assert hook(fake, receiver.url).status_code == 422
    grant = fake.issue_grant("https://hooks.example.com/cb")
    bearer = {"Authorization": f"Bearer {grant.access_token}"}
    listed = httpx.get(f"{fake.url}/v1/webhooks", headers=bearer).json()["data"]
    assert listed == []
    mine = httpx.post(
        f"{fake.url}/v1/webhooks",
        json={"subscription_url": receiver.url, "event_action": "*", "event_object": "deal"},
        headers=bearer,
    ).json()["data"]
    assert mine["type"] == "application" and mine["version"] == "2.0"
    listed = httpx.get(f"{fake.url}/v1/webhooks", headers=bearer).json()["data"]
    assert [w["id"] for w in listed] == [mine["id"]]


def test_cli_starts_with_the_api_token_from_the_environment() -> None:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "devstack.fakepipedrive",
            "--port",
            str(port),
            "--api-token-env",
            "FAKE_PD_TOKEN",
        ],
        stdout=subprocess.PIPE,
        env=dict(os.environ, FAKE_PD_TOKEN="from-env"),
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = json.loads(proc.stdout.readline())["fakepipedrive"]
        assert url == f"http://127.0.0.1:{port}"
        me = httpx.get(f"{url}/v1/users/me", headers={"x-api-token": "from-env"})
        assert me.json()["data"]["id"] == 12415231
        assert httpx.get(f"{url}/v1/users/me", headers=TOKEN).status_code == 401
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0
        assert proc.stdout is not None
        proc.stdout.close()
    missing = subprocess.run(
        [sys.executable, "-m", "devstack.fakepipedrive", "--api-token-env", "NOT_SET_ANYWHERE"],
        capture_output=True,
        text=True,
        check=False,
        env={k: v for k, v in os.environ.items() if k != "NOT_SET_ANYWHERE"},
    )
    assert missing.returncode == 2 and "NOT_SET_ANYWHERE" in missing.stderr


def test_a_webhook_failing_for_three_days_is_deleted(fake: FakePipedrive) -> None:
    fake.config.delivery.time_factor = 0.00001  # 3 days: 2.6 s; retries: milliseconds
    failing = Receiver(fail=1000)
    try:
        hook(fake, failing.url)
        httpx.post(f"{fake.url}/api/v2/persons", json={"name": "Ada"}, headers=TOKEN)
        failing.wait(4)
        listed = httpx.get(f"{fake.url}/v1/webhooks", headers=TOKEN).json()["data"]
        assert listed[0]["last_http_status"] == 500
        time.sleep(3)
        assert httpx.get(f"{fake.url}/v1/webhooks", headers=TOKEN).json()["data"] == []
    finally:
        failing.close()


def test_a_merge_is_a_delete_and_a_change_naming_each_other(
    fake: FakePipedrive, receiver: Receiver
) -> None:
    hook(fake, receiver.url)
    ids = [
        httpx.post(f"{fake.url}/api/v2/persons", json={"name": n}, headers=TOKEN).json()["data"][
            "id"
        ]
        for n in ("Ada", "Ada L")
    ]
    httpx.post(
        f"{fake.url}/_admin/merge", json={"entity": "person", "from_id": ids[0], "to_id": ids[1]}
    )
    got = [g["body"] for g in receiver.wait(4)]
    merged = {b["meta"]["action"]: b for b in got if b["meta"]["action"] != "create"}
    assert merged["delete"]["meta"]["merged_to_id"] == str(ids[1])
    assert merged["delete"]["data"] is None and merged["delete"]["previous"]["name"] == "Ada"
    assert merged["change"]["meta"]["merged_from_id"] == str(ids[0])
    assert merged["change"]["meta"]["change_source"] == "app"
    assert [p["id"] for p in fake.stored("person")] == [ids[1]]


def test_a_record_created_in_the_web_app_is_announced_as_made_there(
    fake: FakePipedrive, receiver: Receiver
) -> None:
    """`POST /_admin/ui/<entity>`: a person adds a record in Pipedrive's web app (what the demo
    does): a create webhook with `change_source: app` and the web app user's id."""
    assert hook(fake, receiver.url, event_object="organization").status_code == 201
    made = httpx.post(f"{fake.url}/_admin/ui/organization", json={"name": "Acme"})
    assert made.status_code == 201, made.text
    got = receiver.wait(1)
    assert len(got) == 1
    meta = got[0]["body"]["meta"]
    assert (meta["action"], meta["entity"], meta["entity_id"]) == (
        "create",
        "organization",
        str(made.json()["id"]),
    )
    assert meta["change_source"] == "app" and got[0]["body"]["data"]["name"] == "Acme"
