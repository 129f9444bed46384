"""The run card shows how an approval reached people (issue 31 item 4): `GET /v1/runs/{id}`
and the run page give a parked approval step's quorum, the votes so far, and each message the
sweep was to send (channel, purpose, recipient, queued / sent / failed, attempts, last error),
so an operator sees "bob has no address" without SQL. The real sweep sends through the fake
SMTP server; the votes go through the guarded decide."""

from __future__ import annotations

import io
from typing import Any

import pytest

from devstack import seed
from devstack.fakesmtp import FakeSmtp
from shared.core.db import Database
from shared.core.duty import SweepConfig, SweepReport
from shared.ops import cli
from shared.steps import approval_messages
from tests.ops_support import bearer, mint
from tests.steps_support import TENANT
from tests.test_approvals_quorum import _parked, _vote


def test_the_run_card_shows_the_quorum_votes_and_each_messages_delivery(
    db: Database, client: Any, ops_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ONCEFLOW_APPROVAL_LINK_SECRET", "s" * 32)
    monkeypatch.setenv("ONCEFLOW_PUBLIC_URL", "http://onceflow.test")
    fake = FakeSmtp().start()
    try:
        run_id, park_id, _, _ = _parked(db, channels={"email": True})
        with db.transaction() as tx:
            seed.smtp(tx, TENANT, host="127.0.0.1", port=fake.bound_port,
                      sender="approvals@onceflow.test", starttls=False)  # fmt: skip
            # ann and cat have an address; bob has none: his mail cannot be sent.
            for user in ("ann", "cat"):
                seed.approver_identity(
                    tx, TENANT, channel="email", external_id=f"{user}@acme.test", user=user
                )
        approval_messages.deliver_approval_messages(
            db, SweepConfig(), lambda ids: None, SweepReport()
        )
    finally:
        fake.stop()
    _vote(db, park_id, "ann")
    _vote(db, park_id, "cat", "approved")
    token = mint(db, TENANT, label="support")

    detail = client.get(f"/v1/runs/{run_id}", headers=bearer(token)).get_json()
    gate = next(s for s in detail["steps"] if s["node_id"] == "gate")
    w = gate["waits_for"]
    assert (w["required"], w["reject_quorum"]) == (2, 1)
    assert [(v["voter"], v["decision"], v["counted"]) for v in w["votes"]] == [
        ("ann", "approved", True),
        ("cat", "approved", True),
    ]
    by_recipient = {m["recipient"]: m for m in w["messages"]}
    assert set(by_recipient) == {"ann", "bob", "cat"}
    assert by_recipient["ann"]["state"] == "sent" and by_recipient["ann"]["channel"] == "email"
    assert by_recipient["ann"]["sent_at"] is not None
    bob = by_recipient["bob"]
    assert bob["state"] == "queued" and bob["attempts"] == 1
    assert bob["last_error"] and "address" in bob["last_error"]

    page = client.post("/ui/login", data={"token": token})
    assert page.status_code == 303
    html = client.get(f"/ui/runs/{run_id}").get_data(as_text=True)
    assert "2 of 2 approvals" in html
    assert "email ask to bob: queued" in html and bob["last_error"] in html
    assert "email ask to ann: sent" in html

    out, err = io.StringIO(), io.StringIO()
    assert cli.main(["show", run_id, "--url", ops_server, "--token", token], out, err) == 0, err
    shown = out.getvalue()
    assert "gate: 2 of 2 approvals: ann approved via ops, cat approved via ops" in shown
    assert "email ask to bob: queued, 1 attempt, last error: no email address" in shown
    assert "email ask to ann: sent" in shown
