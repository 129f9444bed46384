"""Outbound events (issue 30 item 4): written with their fact, sent signed (Standard Webhooks)
to a real receiver on 127.0.0.1, at least once with one id across attempts, retried with
backoff, given up at the cap, re-sendable, sent once per attempt by racing sweeps, and never
sent to an address the SSRF guard refuses."""

from __future__ import annotations

import base64
import hashlib
import hmac
import io
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, get_args

import pytest

from devstack import seed
from shared.core.db import Database
from shared.core.duty import SweepConfig
from shared.core.errors import PermanentError
from shared.core.netguard import NetPolicy
from shared.ingest import outbound as events
from shared.ingest import outbox
from shared.ops import cli
from shared.ops.models import OutboundEventType
from shared.publishing import outbound
from shared.steps import settle
from shared.steps.claim import LeaseConfig, claim_step
from shared.steps.outcomes import Settlement
from shared.steps.states import StepStatus
from shared.sweep.loop import run_sweep
from tests import test_approvals, test_breaker
from tests.admission_support import at_barrier, emit_event, make_connection, make_tenant
from tests.ops_support import bearer, mint
from tests.steps_support import TENANT, chain, definition, publish_version, start_run

SECRET_ENV = "OUTBOUND_TEST_SECRET"
SECRET = "whsec_" + base64.b64encode(b"0123456789abcdef0123456789abcdef").decode()
LEASE = LeaseConfig(lease_seconds=60, heartbeat_seconds=30)
FAILED = Settlement(
    status=StepStatus.FAILED,
    attempt=1,
    outcome_code="HTTP_400",
    error="bad request",
    error_class="permanent",
)


class Receiver:
    """A real HTTP server on 127.0.0.1: answers the queued statuses in turn (then 200) and
    records every request with its arrival time."""

    def __init__(self) -> None:
        self.statuses: list[int] = []
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                with receiver.lock:
                    receiver.requests.append(
                        {"at": time.monotonic(), "headers": dict(self.headers), "body": body}
                    )
                    status = receiver.statuses.pop(0) if receiver.statuses else 200
                self.send_response(status)
                self.send_header("content-length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True).start()

    def ids(self) -> list[str]:
        return [r["headers"]["webhook-id"] for r in self.requests]


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[Receiver]:
    # The same allowance the http.request block's tests use (tests/blocks_support.py).
    monkeypatch.setattr(outbound, "net_policy", lambda: NetPolicy(allow_loopback=True))
    monkeypatch.setenv(SECRET_ENV, SECRET)
    r = Receiver()
    yield r
    r.server.shutdown()
    r.server.server_close()


def _subscribe(db: Database, url: str, types: list[str]) -> str:
    with db.transaction() as tx:
        tx.execute(
            "INSERT INTO tenants (id, name) VALUES (:t, :t) ON CONFLICT DO NOTHING", t=TENANT
        )
        return str(
            events.subscribe(
                tx, tenant_id=TENANT, url=url, event_types=types, secret_env=SECRET_ENV
            )["id"]
        )


def _deliveries(db: Database) -> list[dict[str, Any]]:
    with db.transaction() as tx:
        return [
            dict(r)
            for r in tx.all(
                "SELECT * FROM outbound_deliveries ORDER BY subscription_id, event_type"
            )
        ]


def _emit(db: Database, key: str = "approval.requested:s1") -> None:
    with db.transaction() as tx:
        events.emit(
            tx, tenant_id=TENANT, event_type="approval.requested", key=key, data={"step": key}
        )


def verify(secret: str, headers: dict[str, str], body: bytes) -> bool:
    """An independent Standard Webhooks verifier (written from the spec, not from ours)."""
    key = base64.b64decode(secret.split("_", 1)[1])
    content = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
    expected = base64.b64encode(hmac.new(key, content, hashlib.sha256).digest()).decode()
    signatures = [s.split(",", 1) for s in headers["webhook-signature"].split(" ")]
    fresh = abs(time.time() - int(headers["webhook-timestamp"])) < 300
    return fresh and any(v == "v1" and hmac.compare_digest(sig, expected) for v, sig in signatures)


def test_a_receiver_that_fails_then_succeeds_gets_one_id_over_several_attempts_with_backoff(
    db: Database, receiver: Receiver
) -> None:
    _subscribe(db, receiver.url, ["approval.requested"])
    _emit(db)
    receiver.statuses = [500, 500]
    base = 0.3
    passes = 0
    while not _deliveries(db)[0]["delivered_at"] and passes < 200:
        outbound.deliver_due(db, backoff_base=base)
        passes += 1
        time.sleep(0.02)
    [row] = _deliveries(db)
    assert row["status"] == "delivered" and row["attempts"] == 3
    assert len(receiver.requests) == 3 and len(set(receiver.ids())) == 1
    assert receiver.ids()[0] == row["id"] and row["id"].startswith("msg_")
    at = [r["at"] for r in receiver.requests]
    # Backoff: base after the first failure, twice base after the second.
    assert at[1] - at[0] >= base and at[2] - at[1] >= 2 * base
    for request in receiver.requests:
        assert verify(SECRET, request["headers"], request["body"])
        assert not verify(SECRET, request["headers"], request["body"] + b" ")
    body = json.loads(receiver.requests[0]["body"])
    assert body["type"] == "approval.requested" and body["data"] == {
        "step": "approval.requested:s1"
    }
    assert {r["body"] for r in receiver.requests} == {receiver.requests[0]["body"]}


def test_a_delivery_is_given_up_after_its_attempts_recorded_and_resent_with_the_same_id(
    db: Database, receiver: Receiver
) -> None:
    _subscribe(db, receiver.url, ["approval.requested"])
    _emit(db)
    receiver.statuses = [503, 503]
    for _ in range(3):
        outbound.deliver_due(db, backoff_base=0.0, max_attempts=2)
    [row] = _deliveries(db)
    assert row["status"] == "given_up" and row["attempts"] == 2
    assert row["last_status"] == 503 and "HTTP 503" in row["last_error"]
    assert len(receiver.requests) == 2

    assert outbound.resend(db, row["id"], tenant_id="someone-else") is False
    assert outbound.resend(db, row["id"], tenant_id=TENANT) is True
    done = outbound.deliver_due(db, backoff_base=0.0, max_attempts=2)
    assert done.delivered == [row["id"]]
    [after] = _deliveries(db)
    assert after["status"] == "delivered" and after["attempts"] == 3
    assert receiver.ids() == [row["id"]] * 3


def test_two_sweeps_at_a_barrier_send_each_attempt_once(
    db: Database, database_url: str, receiver: Receiver
) -> None:
    _subscribe(db, receiver.url, ["approval.requested"])
    for i in range(6):
        _emit(db, key=f"approval.requested:s{i}")
    passes = at_barrier(database_url, [outbound.deliver_due, outbound.deliver_due])
    delivered = [i for p in passes for i in p.delivered]
    assert sorted(delivered) == sorted({d["id"] for d in _deliveries(db)})
    assert sorted(receiver.ids()) == sorted(delivered)  # each sent exactly once
    assert all(d["attempts"] == 1 for d in _deliveries(db))


def _failing_run(db: Database, name: str) -> tuple[Any, str]:
    version = publish_version(db, definition(chain(2, "test.noop"), name=name))
    run_id, (step_id,) = start_run(db, version)
    step = claim_step(db, step_id, LEASE)
    assert step is not None
    return step, run_id


def test_a_failing_run_announces_run_failed_once_per_subscription_even_when_re_executed(
    db: Database, receiver: Receiver
) -> None:
    first = _subscribe(db, receiver.url, ["run.failed", "run.succeeded"])
    second = _subscribe(db, receiver.url + "/2", ["run.failed"])
    _subscribe(db, receiver.url + "/3", ["run.succeeded"])

    # A settle transaction that rolls back leaves no event: the event is the fact's.
    step, run_id = _failing_run(db, "rolled-back")
    with pytest.raises(PermanentError, match="before its commit"), db.transaction() as tx:
        tx.execute(settle.FAIL_RUN, run_id=run_id, error="x")
        assert tx.scalar("SELECT count(*) FROM outbound_deliveries") == 2
        raise RuntimeError("the settle's transaction fails before its commit")
    assert _deliveries(db) == []

    # Executed again: once by the one-statement settle, again (a redelivered step message)
    # fenced out, and the emit of the same fact re-executed writes nothing new.
    settled = settle.settle_step(db, step, FAILED, [])
    assert settled.run_failed
    assert settle.settle_step(db, step, FAILED, []).fenced_out
    with db.transaction() as tx:
        again = tx.scalar(
            "SELECT outbound_emit('acme', 'run.failed', 'run.failed:' || :r, '{}')", r=run_id
        )
    assert again == 0
    # The transactional settle path (another run) ends its run the same way.
    other, other_run = _failing_run(db, "in-transaction")
    assert settle._settle_in_transaction(db, other, FAILED, [], loop=None, body=None).run_failed

    rows = _deliveries(db)
    assert sorted((str(r["subscription_id"]), r["data"]["run_id"]) for r in rows) == sorted(
        [(first, run_id), (second, run_id), (first, other_run), (second, other_run)]
    )
    assert {r["event_type"] for r in rows} == {"run.failed"}
    while outbound.deliver_due(db).touched:
        pass
    assert sorted(receiver.ids()) == sorted(r["id"] for r in rows)


def test_a_subscription_to_a_private_address_is_refused_with_a_reason(
    db: Database, receiver: Receiver
) -> None:
    # The test allowance is loopback only; the rest of the policy stands.
    assert outbound.destination_refusal(receiver.url) is None
    reason = outbound.destination_refusal("http://10.1.2.3/hook")
    assert reason is not None and "private address 10.1.2.3" in reason
    meta = outbound.destination_refusal("http://169.254.169.254/computeMetadata/v1/")
    assert meta is not None and "metadata" in meta
    # A row that got past the check (DNS changed since) is refused again at the attempt.
    _subscribe(db, "http://10.1.2.3/hook", ["approval.requested"])
    _emit(db)
    outbound.deliver_due(db, backoff_base=0.0)
    [row] = _deliveries(db)
    assert row["status"] == "pending" and "private address 10.1.2.3" in row["last_error"]
    assert receiver.requests == []


def test_ops_subscribes_refuses_private_urls_lists_deliveries_and_resends(
    db: Database, client: Any, receiver: Receiver
) -> None:
    for tenant in (TENANT, "other"):
        with db.transaction() as tx:
            seed.tenant(tx, tenant, existing="keep")
    h = bearer(mint(db, TENANT))
    body = {"url": "http://10.0.0.7/hook", "event_types": ["run.failed"], "secret_env": SECRET_ENV}
    refused = client.post("/v1/outbound/subscriptions", json=body, headers=h)
    assert refused.status_code == 422
    assert "private address 10.0.0.7" in refused.get_json()["message"]

    body = {**body, "url": receiver.url, "event_types": ["approval.requested"]}
    made = client.post("/v1/outbound/subscriptions", json=body, headers=h)
    assert made.status_code == 201, made.get_json()
    listed = client.get("/v1/outbound/subscriptions", headers=h).get_json()["items"]
    assert [s["id"] for s in listed] == [made.get_json()["id"]]
    other = bearer(mint(db, "other"))
    assert client.get("/v1/outbound/subscriptions", headers=other).get_json()["items"] == []

    _emit(db)
    receiver.statuses = [500]
    outbound.deliver_due(db, backoff_base=3600.0)
    [row] = client.get("/v1/outbound/deliveries", headers=h).get_json()["items"]
    assert row["status"] == "pending" and row["attempts"] == 1
    assert row["last_status"] == 500 and "HTTP 500" in row["last_error"]

    resend = f"/v1/outbound/deliveries/{row['id']}/resend"
    assert client.post(resend, headers=other).status_code == 404
    assert client.post(resend, headers=h).status_code == 200
    assert outbound.deliver_due(db).delivered == [row["id"]]
    [after] = client.get("/v1/outbound/deliveries", headers=h).get_json()["items"]
    assert after["status"] == "delivered" and after["attempts"] == 2
    assert receiver.ids() == [row["id"]] * 2

    disabled = client.post(
        f"/v1/outbound/subscriptions/{made.get_json()['id']}/enabled",
        json={"enabled": False},
        headers=h,
    )
    assert disabled.status_code == 200 and disabled.get_json()["enabled"] is False
    _emit(db, key="approval.requested:later")
    assert len(_deliveries(db)) == 1


def test_the_api_lists_the_event_types_the_emit_knows() -> None:
    assert get_args(OutboundEventType) == events.EVENT_TYPES


def test_onceflow_outbound_subscribes_lists_and_resends_through_the_ops_api(
    db: Database, ops_server: str, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    with db.transaction() as tx:
        seed.tenant(tx, TENANT, existing="keep")
    monkeypatch.setenv("ONCEFLOW_OPS_URL", ops_server)
    monkeypatch.setenv("ONCEFLOW_OPS_TOKEN", mint(db, TENANT))

    def onceflow(*argv: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        return cli.main(list(argv), out=out, err=err), out.getvalue(), err.getvalue()

    secret = ("--secret-env", SECRET_ENV)
    code, _, err = onceflow(
        "outbound", "subscribe", "http://192.168.1.9/x", "--event", "run.failed", *secret
    )
    assert code == cli.EXIT_REFUSED and "private address 192.168.1.9" in err, err
    code, out, _ = onceflow(
        "outbound", "subscribe", receiver.url, "--event", "approval.requested", *secret
    )
    assert code == cli.EXIT_OK and receiver.url in out
    code, out, _ = onceflow("outbound", "subscriptions")
    assert code == cli.EXIT_OK and "http://127.0.0.1:" in out and "approval.requested" in out

    _emit(db)
    receiver.statuses = [500]
    outbound.deliver_due(db, backoff_base=3600.0)
    code, out, _ = onceflow("outbound", "deliveries", "--json")
    [row] = json.loads(out)["items"]
    assert code == cli.EXIT_OK and row["attempts"] == 1 and row["status"] == "pending"
    code, out, _ = onceflow("outbound", "resend", row["id"])
    assert code == cli.EXIT_OK and row["id"] in out
    assert outbound.deliver_due(db).delivered == [row["id"]]
    code, out, _ = onceflow("outbound", "deliveries", "--status", "delivered")
    assert code == cli.EXIT_OK and row["id"][:12] in out and "delivered" in out


def test_each_fact_is_announced_once_with_its_fact(db: Database, receiver: Receiver) -> None:
    """The other four facts through their real paths: a breaker trip among runs failing at
    once (and their run.failed), the refusal of the next event, an event the outbox sweep gives
    up, an approval asked for."""
    make_tenant(db)
    conn = make_connection(db)
    _subscribe(db, receiver.url, list(events.EVENT_TYPES))
    workflow_id = test_breaker._bind(db, after_failures=2)
    test_breaker._advance_together(db, test_breaker._admit(db, conn, 3))
    assert test_breaker._admit(db, conn, 1, start=3) == []  # refused: workflow_paused

    undelivered = emit_event(db, connection_id=conn, event_type="test.nobody.listens")
    with db.transaction() as tx:
        tx.execute(
            "UPDATE workflow_trigger_events SET published_at = now() - interval '1 hour'"
            " WHERE id = :e",
            e=undelivered,
        )
    assert outbox.requeue_undecided(db, after_seconds=0, max_redeliveries=0, batch=10).given_up
    _, park_id, _, _ = test_approvals._parked(db)

    by_type: dict[str, list[dict[str, Any]]] = {}
    for row in _deliveries(db):
        by_type.setdefault(row["event_type"], []).append(row["data"])
    assert len(by_type.pop("run.failed")) == 3
    [tripped] = by_type.pop("breaker.tripped")
    assert tripped["workflow_id"] == workflow_id
    refused = by_type.pop("event.refused")
    assert [r["reason"] for r in refused] == ["workflow_paused"]
    [given_up] = by_type.pop("event.undelivered")
    assert given_up["event_id"] == undelivered
    [asked] = by_type.pop("approval.requested")
    assert asked["park_id"] == park_id and asked["summary"] == "20% discount on deal 7"
    assert by_type == {}


def test_the_scheduled_sweep_sends_what_is_due(db: Database, receiver: Receiver) -> None:
    """The repair is in the sweep's catalog: one pass of the real loop delivers."""
    _subscribe(db, receiver.url, ["approval.requested"])
    _emit(db)
    run_sweep(db, 0, config=SweepConfig(), dispatch=lambda ids: None, duties=[])
    [row] = _deliveries(db)
    assert row["status"] == "delivered" and receiver.ids() == [row["id"]]


def test_finished_deliveries_are_deleted_after_the_retention_and_pending_ones_never(
    db: Database, receiver: Receiver
) -> None:
    _subscribe(db, receiver.url, ["approval.requested"])
    for key in ("old-delivered", "old-pending", "new-delivered"):
        _emit(db, key=f"approval.requested:{key}")
    outbound.deliver_due(db)
    with db.transaction() as tx:
        tx.execute(
            "UPDATE outbound_deliveries SET delivered_at = now() - interval '91 days',"
            " created_at = now() - interval '91 days' WHERE event_key LIKE '%old-delivered'"
        )
        tx.execute(
            "UPDATE outbound_deliveries SET status = 'pending', delivered_at = NULL,"
            " created_at = now() - interval '91 days' WHERE event_key LIKE '%old-pending'"
        )
    [duty] = outbound.sweep_duties(SweepConfig(decision_retention_days=90, retention_batch=1))
    assert duty.run(db) == {"deleted": 1}
    left = sorted(r["event_key"].split(":")[1] for r in _deliveries(db))
    assert left == ["new-delivered", "old-pending"]


def test_a_rotated_secret_signs_with_both_keys_until_the_old_one_is_removed(
    db: Database, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    new = "whsec_" + base64.b64encode(b"another key of thirty-two bytes!").decode()
    monkeypatch.setenv(SECRET_ENV, f"{new} {SECRET}")
    _subscribe(db, receiver.url, ["approval.requested"])
    _emit(db)
    outbound.deliver_due(db)
    [request] = receiver.requests
    assert len(request["headers"]["webhook-signature"].split(" ")) == 2
    assert verify(SECRET, request["headers"], request["body"])
    assert verify(new, request["headers"], request["body"])


def test_the_ops_page_lists_deliveries_and_resends_one_for_its_tenant_only(
    db: Database, client: Any, receiver: Receiver
) -> None:
    from shared.ops.html import csrf_value

    for tenant in (TENANT, "other"):
        with db.transaction() as tx:
            seed.tenant(tx, tenant, existing="keep")
    subscription = _subscribe(db, receiver.url, ["approval.requested"])
    _emit(db)
    receiver.statuses = [503]
    outbound.deliver_due(db, backoff_base=0.0, max_attempts=1)
    [row] = _deliveries(db)
    assert row["status"] == "given_up"

    token = mint(db, TENANT, label="carol")
    client.post("/ui/login", data={"token": token})
    html = client.get("/ui/outbound?status=given_up").get_data(as_text=True)
    assert f'data-subscription-id="{subscription}"' in html
    assert f'data-delivery-id="{row["id"]}"' in html and "HTTP 503" in html
    assert 'data-delivery-id="' not in client.get("/ui/outbound?status=delivered").get_data(
        as_text=True
    )
    odd = client.get("/ui/outbound?status=lost").get_data(as_text=True)
    assert "Unknown status" in odd and f'data-delivery-id="{row["id"]}"' in odd

    url = f"/ui/outbound/{row['id']}/resend"
    assert client.post(url, data={"csrf": "forged"}).status_code == 403
    other = client.application.test_client()
    theirs = mint(db, "other", label="mallory")
    other.post("/ui/login", data={"token": theirs})
    assert row["id"] not in other.get("/ui/outbound").get_data(as_text=True)
    foreign = other.post(url, data={"csrf": csrf_value(theirs)})
    assert foreign.status_code == 404 and "Resend refused" in foreign.get_data(as_text=True)
    assert _deliveries(db)[0]["status"] == "given_up"  # the refusal changed nothing

    done = client.post(url, data={"csrf": csrf_value(token)})
    assert done.status_code == 200 and "queued again" in done.get_data(as_text=True)
    assert outbound.deliver_due(db, backoff_base=0.0).delivered == [row["id"]]
    assert receiver.ids() == [row["id"]] * 2
    html = client.get("/ui/outbound?status=delivered").get_data(as_text=True)
    assert f'data-delivery-id="{row["id"]}"' in html
