"""Webhook triggers (shared/ingest/webhook_trigger.py, shared/triggers/webhook.py) through the
real `webhook` entry point on real Postgres: duplicates within and after the idempotency TTL,
at-least-once without a key, a key expression failing on a request, and requests no webhook
workflow answers to."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
from typing import Any

import pytest

from shared.admission.admit import admit_event
from shared.core.db import Database
from shared.ingest import webhook_trigger
from shared.ingest.receive import WebhookRequest, receive_webhook
from shared.publishing.validate import validate_text
from tests.admission_support import activate_text, count
from tests.ingest_support import STANDARD_SECRET, make_connection, standard_headers, webhook_client
from tests.ops_support import Dispatched, bearer, install_ops_api, mint
from tests.pubsub_emulator import PubsubProject

HEADER_KEY = "\"${{ headers['x-idempotency-key'] }}\""


@pytest.fixture(scope="module")
def client() -> Any:
    return webhook_client()


@pytest.fixture(autouse=True)
def webhook_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WEBHOOK_NUDGE", "off")
    monkeypatch.setenv("STANDARD_SECRET_ACME", STANDARD_SECRET)


@pytest.fixture
def connection(db: Database) -> str:
    return make_connection(db, provider="standard", secret_env="STANDARD_SECRET_ACME")


def source(webhook: str, name: str = "billing") -> str:
    return (
        f"name: {name}\ntenant: acme\ntrigger:\n  webhook: {webhook}\n"
        "steps:\n  - {id: done, type: end}\n"
    )


def post(
    client: Any,
    connection: str,
    body: dict[str, Any],
    *,
    name: str = "billing",
    key: str | None = None,
    msg_id: str = "msg_1",
) -> Any:
    raw = json.dumps(body).encode()
    headers = standard_headers(raw, msg_id=msg_id)
    if key is not None:
        headers["X-Idempotency-Key"] = key
    return client.post(f"/standard/{connection}/{name}", data=raw, headers=headers)


def events(db: Database, workflow_id: str) -> list[dict[str, Any]]:
    with db.transaction() as tx:
        return tx.all(
            "SELECT id, payload, record_object_id FROM workflow_trigger_events"
            " WHERE event_type = :e ORDER BY id",
            e=webhook_trigger.event_type_for(workflow_id),
        )


def test_a_duplicate_within_the_ttl_starts_nothing_and_gets_the_first_event_id(
    client: Any, db: Database, connection: str
) -> None:
    workflow_id = activate_text(db, source("{idempotency_key: " + HEADER_KEY + "}"))
    first = post(client, connection, {"invoice": 1}, key="inv-1")
    assert first.status_code == 200, first.get_json()
    event_id = first.get_json()["event_id"]
    assert first.get_json()["status"] == "accepted"
    # The sender retries (a new delivery id, even a different body): same key, same answer.
    again = post(client, connection, {"invoice": 1, "retry": True}, key="inv-1", msg_id="msg_2")
    assert again.status_code == 200
    assert again.get_json()["status"] == "duplicate"
    assert again.get_json()["event_id"] == event_id
    other = post(client, connection, {"invoice": 2}, key="inv-2", msg_id="msg_3")
    assert other.get_json()["status"] == "accepted"
    rows = events(db, workflow_id)
    assert rows[0]["id"] == event_id and len(rows) == 2
    assert rows[0]["payload"]["body"] == {"invoice": 1}
    assert rows[0]["payload"]["headers"]["x-idempotency-key"] == "inv-1"
    assert "webhook-signature" not in rows[0]["payload"]["headers"]
    # An ordinary event: admission starts the workflow once for it.
    result = admit_event(db, event_id, publish=lambda ids: None)
    assert [o.workflow_id for o in result.admitted] == [workflow_id]


def test_after_the_ttl_the_same_key_is_a_new_occurrence(
    client: Any, db: Database, connection: str
) -> None:
    workflow_id = activate_text(
        db, source("{idempotency_key: " + HEADER_KEY + ", idempotency_ttl_seconds: 60}")
    )
    first = post(client, connection, {"n": 1}, key="k").get_json()["event_id"]
    with db.transaction() as tx:  # the TTL ran out
        tx.execute(
            "UPDATE webhook_trigger_keys SET expires_at = now() - interval '1 second'"
            " WHERE workflow_id = :w",
            w=workflow_id,
        )
    later = post(client, connection, {"n": 1}, key="k", msg_id="msg_2").get_json()
    assert later["status"] == "accepted" and later["event_id"] != first
    assert len(events(db, workflow_id)) == 2
    # Both occurrences are admitted under the default once_per_record: each is its own record.
    for event_id in (first, later["event_id"]):
        assert admit_event(db, event_id, publish=lambda ids: None).admitted


def test_a_key_from_the_body(client: Any, db: Database, connection: str) -> None:
    workflow_id = activate_text(db, source('{idempotency_key: "${{ body.event_id }}"}'))
    a = post(client, connection, {"event_id": "evt_9", "amount": 3}).get_json()
    b = post(client, connection, {"event_id": "evt_9", "amount": 3}, msg_id="m2").get_json()
    assert (a["status"], b["status"]) == ("accepted", "duplicate")
    assert a["event_id"] == b["event_id"] and len(events(db, workflow_id)) == 1


def test_without_a_key_each_accepted_post_is_a_new_occurrence(
    client: Any, db: Database, connection: str
) -> None:
    text = source("{}")
    warnings = [p.message for p in validate_text(text).warnings]
    assert any("at-least-once" in w for w in warnings), warnings
    workflow_id = activate_text(db, text)
    ids = {post(client, connection, {"same": True}).get_json()["event_id"] for _ in range(2)}
    assert len(ids) == 2 and len(events(db, workflow_id)) == 2


def test_a_key_expression_failing_on_a_request_is_a_422_with_a_recorded_reason(
    client: Any, db: Database, connection: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    workflow_id = activate_text(db, source("{idempotency_key: " + HEADER_KEY + "}"))
    answer = post(client, connection, {"no": "key header"})
    assert answer.status_code == 422
    assert answer.get_json()["error"] == "idempotency_key_failed"
    assert "x-idempotency-key" in answer.get_json()["detail"]
    assert events(db, workflow_id) == []
    with db.transaction() as tx:
        (row,) = tx.all("SELECT reason, detail FROM webhook_trigger_refusals")
    assert row["reason"] == "idempotency_key_failed"
    assert row["detail"] == answer.get_json()["detail"]
    # A key that is there but unusable (empty) is refused the same way.
    assert post(client, connection, {}, key="").status_code == 422
    # Ops sees the refusals on the workflow's trigger.
    ops = install_ops_api(db, Dispatched(), monkeypatch).test_client()
    shown = ops.get(f"/v1/workflows/{workflow_id}/trigger", headers=bearer(mint(db, "acme")))
    refusals = shown.get_json()["detail"]["recent_refusals"]
    assert [r["reason"] for r in refusals] == ["idempotency_key_failed"] * 2
    assert refusals[-1]["detail"] == answer.get_json()["detail"]


def test_requests_no_webhook_workflow_answers_are_refused_and_start_nothing(
    client: Any, db: Database, connection: str
) -> None:
    activate_text(db, source("{}"))
    activate_text(
        db,
        "name: crm\ntenant: acme\ntrigger: {events: [standard.invoice.paid]}\n"
        "steps:\n  - {id: done, type: end}\n",
    )
    assert post(client, connection, {}, name="nope").status_code == 404
    assert post(client, connection, {}, name="crm").status_code == 404
    assert post(client, connection, {}, name="Bad Name").status_code == 404
    raw = b"{}"
    forged = {**standard_headers(raw), "webhook-signature": "v1,AAAA"}
    assert (
        client.post(f"/standard/{connection}/billing", data=raw, headers=forged).status_code == 401
    )
    assert count(db, "SELECT count(*) FROM workflow_trigger_events") == 0


def test_two_duplicates_racing_start_one_occurrence(db: Database, connection: str) -> None:
    workflow_id = activate_text(db, source("{idempotency_key: " + HEADER_KEY + "}"))
    raw = b'{"x": 1}'
    barrier = threading.Barrier(2)
    answers: list[dict[str, Any]] = []

    def deliver(msg_id: str) -> None:
        headers = {**standard_headers(raw, msg_id=msg_id), "X-Idempotency-Key": "same"}
        request = WebhookRequest(
            method="POST",
            path=f"/standard/{connection}/billing",
            query_string="",
            scheme="https",
            host="hooks.example.com",
            headers=headers,
            content_length=len(raw),
            read=_reader(raw),
        )
        barrier.wait(timeout=10)
        answers.append(receive_webhook(request, db).body)

    threads = [threading.Thread(target=deliver, args=(f"m{i}",)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(a["status"] for a in answers) == ["accepted", "duplicate"]
    assert answers[0]["event_id"] == answers[1]["event_id"]
    assert len(events(db, workflow_id)) == 1


def _reader(raw: bytes) -> Any:
    chunks = [raw]

    def read(n: int) -> bytes:
        return chunks.pop(0) if chunks else b""

    return read


@pytest.mark.parametrize(
    ("key", "words"),
    [
        ('"${{ event.id }}"', "unknown name 'event'; expressions can read body, headers"),
        ('"x-${{ body.id }}"', "one `${{ … }}` expression"),
        ('"${{ body. }}"', "does not compile"),
    ],
)
def test_bad_key_expressions_are_located_validate_errors(key: str, words: str) -> None:
    report = validate_text(source("{idempotency_key: " + key + "}"), "wf.yaml")
    (problem,) = report.errors
    assert problem.where == "trigger.webhook.idempotency_key"
    assert words in problem.message and problem.line == 4


def test_a_shared_hmac_secret_connection_addresses_webhook_triggers_only(
    client: Any, db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("BILLING_SECRET_ACME", "s3cret")
    hmac_connection = make_connection(db, provider="hmac", secret_env="BILLING_SECRET_ACME")
    workflow_id = activate_text(db, source('{idempotency_key: "${{ body.invoice }}"}'))
    raw = b'{"invoice": "inv_7"}'
    good = "sha256=" + hmac.new(b"s3cret", raw, hashlib.sha256).hexdigest()
    path = f"/hmac/{hmac_connection}/billing"
    answer = client.post(path, data=raw, headers={"X-Signature-256": good})
    assert answer.status_code == 200 and answer.get_json()["status"] == "accepted"
    again = client.post(path, data=raw, headers={"X-Signature-256": good})
    assert again.get_json() == {**again.get_json(), "status": "duplicate"}
    assert again.get_json()["event_id"] == answer.get_json()["event_id"]
    (event,) = events(db, workflow_id)
    assert "x-signature-256" not in event["payload"]["headers"]
    forged = "sha256=" + hmac.new(b"guess", raw, hashlib.sha256).hexdigest()
    assert client.post(path, data=raw, headers={"X-Signature-256": forged}).status_code == 401
    assert client.post(path, data=raw).status_code == 401
    # No CRM events come from such a sender: the inbox path does not exist for it.
    assert (
        client.post(
            f"/hmac/{hmac_connection}", data=raw, headers={"X-Signature-256": good}
        ).status_code
        == 404
    )


def test_an_accepted_post_is_published_by_the_nudge_right_after_its_commit(
    client: Any,
    db: Database,
    connection: str,
    pubsub: PubsubProject,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The trigger's event skips the inbox, so the nudge's drain finds nothing: it must still
    # publish (issue 27: whoever committed an event publishes it, not the next scheduled tick).
    from shared.core.pubsub import TRIGGER_EVENTS
    from shared.ingest import nudge

    monkeypatch.setenv("WEBHOOK_NUDGE", "on")
    workflow_id = activate_text(db, source("{idempotency_key: " + HEADER_KEY + "}"))
    answer = post(client, connection, {"invoice": 7}, key="inv-7").get_json()
    assert answer["status"] == "accepted"
    assert nudge.wait_idle(30)
    assert pubsub.pull_ids(TRIGGER_EVENTS, count=1, timeout=20) == [answer["event_id"]]
    with db.transaction() as tx:
        published = tx.scalar(
            "SELECT published_at FROM workflow_trigger_events WHERE id = :i", i=answer["event_id"]
        )
    assert published is not None and events(db, workflow_id)
