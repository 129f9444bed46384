"""http.request against a real receiver (the fake CRM's /_sink): stable Idempotency-Key,
HMAC signature, charging once, dry run, caps and classification."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pydantic
import pytest

from devstack.fakecrm import FakeCrm
from shared.blocks import http as http_block
from shared.blocks.base import BlockFailure
from shared.core.db import Database
from tests.blocks_support import StepRunner, http_target, seed_tenant


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCrm]:
    with http_target(monkeypatch) as crm:
        yield crm


def test_retries_send_the_same_idempotency_key_signed_and_charge_once(
    db: Database, fake: FakeCrm, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACME_SIGNING", "sign-me")
    seed_tenant(db, credits=10, signing_secret_env="ACME_SIGNING")
    step = StepRunner(db, "http.request")
    config = {"url": f"{fake.url}/_sink/notify", "body": {"task": "1001"}}
    first = step.run(http_block.REQUEST, config)
    again = step.run(http_block.REQUEST, config)  # a retry / a crash-and-rerun
    assert first.output is not None and first.output["status"] == 200
    assert again.output == first.output
    got = fake.sink_requests()
    assert len(got) == 2
    assert {r["headers"]["idempotency-key"] for r in got} == {step.idempotency_key}
    for r in got:
        ts = r["headers"]["x-onceflow-timestamp"]
        expected = hmac.new(b"sign-me", ts.encode() + b"." + r["body"].encode(), hashlib.sha256)
        assert r["headers"]["x-onceflow-signature"] == f"v1={expected.hexdigest()}"
        assert json.loads(r["body"]) == {"task": "1001"}
    with db.transaction() as tx:
        assert tx.scalar("SELECT credit_balance FROM tenants") == 9
        assert tx.scalar("SELECT lineage_key FROM credit_ledger") == step.idempotency_key


def test_dry_run_sends_nothing(db: Database, fake: FakeCrm) -> None:
    seed_tenant(db)
    step = StepRunner(db, "http.request")
    result = step.run(http_block.REQUEST, {"url": f"{fake.url}/_sink/x"}, dry_run=True)
    assert result.output is not None and result.output["dry_run"] is True
    assert result.output["would_send"]["idempotency_key"] == step.idempotency_key
    assert fake.sink_requests() == []


def test_missing_signing_secret_fails_instead_of_sending_unsigned(
    db: Database, fake: FakeCrm, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ACME_SIGNING_GONE", raising=False)
    seed_tenant(db, signing_secret_env="ACME_SIGNING_GONE")
    with pytest.raises(BlockFailure) as err:
        StepRunner(db, "http.request").run(http_block.REQUEST, {"url": f"{fake.url}/_sink/x"})
    assert err.value.outcome_code == "SIGNING_SECRET_MISSING"
    assert fake.sink_requests() == []


def test_insufficient_credits_sends_nothing(db: Database, fake: FakeCrm) -> None:
    seed_tenant(db, credits=0)
    with pytest.raises(BlockFailure) as err:
        StepRunner(db, "http.request").run(http_block.REQUEST, {"url": f"{fake.url}/_sink/x"})
    assert err.value.outcome_code == "INSUFFICIENT_CREDITS"
    assert err.value.error_class == "permanent"
    assert fake.sink_requests() == []


def test_status_classification(db: Database, fake: FakeCrm) -> None:
    seed_tenant(db)
    step = StepRunner(db, "http.request")
    fake.add_fault(action="error_500", path="^/_sink")
    with pytest.raises(BlockFailure) as err:
        step.run(http_block.REQUEST, {"url": f"{fake.url}/_sink/x"})
    assert err.value.error_class == "transient" and err.value.outcome_code == "HTTP_500"
    fake.add_fault(action="rate_limit", path="^/_sink", retry_after=30)
    with pytest.raises(BlockFailure) as err:
        step.run(http_block.REQUEST, {"url": f"{fake.url}/_sink/x"})
    assert err.value.error_class == "transient" and err.value.retry_after == 30
    with pytest.raises(BlockFailure) as err:
        step.run(http_block.REQUEST, {"url": f"{fake.url}/nowhere"})
    assert err.value.error_class == "permanent" and err.value.outcome_code == "HTTP_404"
    fake.add_fault(action="reset", path="^/_sink")
    with pytest.raises(BlockFailure) as err:
        step.run(http_block.REQUEST, {"url": f"{fake.url}/_sink/x"})
    assert err.value.error_class == "transient"


class _Big(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        return

    def do_POST(self) -> None:
        if self.path == "/slow":
            self.send_response(200)
            self.send_header("Content-Length", "10")
            self.end_headers()
            threading.Event().wait(3)
            return
        payload = b"x" * (2 * 1024 * 1024)
        self.send_response(200)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


def test_response_size_and_time_caps(db: Database, fake: FakeCrm) -> None:
    seed_tenant(db)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Big)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    step = StepRunner(db, "http.request")
    try:
        with pytest.raises(BlockFailure) as err:
            step.run(http_block.REQUEST, {"url": f"{base}/big", "max_response_bytes": 65536})
        assert err.value.outcome_code == "RESPONSE_TOO_LARGE"
        with pytest.raises(BlockFailure) as err:
            step.run(http_block.REQUEST, {"url": f"{base}/slow", "timeout_seconds": 0.5})
        assert err.value.outcome_code == "HTTP_TIMEOUT" and err.value.error_class == "transient"
    finally:
        server.shutdown()
        server.server_close()


def test_config_refuses_reserved_headers() -> None:
    with pytest.raises(pydantic.ValidationError, match="Idempotency-Key"):
        http_block.HttpConfig.model_validate(
            {"url": "https://example.com", "headers": {"Idempotency-Key": "mine"}}
        )
