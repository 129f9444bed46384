"""Approvals asked by email (issue 31, item 4): the sweep mails each named user their signed
link (the ops API's link mechanism) through the tenant's SMTP server — a local fake — to the
address their user is mapped to; the link decides as that user, one vote each; the reminder
goes only to those who have not voted."""

from __future__ import annotations

import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import functions_framework
import pytest
from werkzeug.serving import make_server

from devstack import seed
from devstack.fakesmtp import FakeSmtp
from shared.core.db import Database
from shared.core.duty import SweepConfig, SweepReport
from shared.steps import approval_messages
from shared.steps.parks import park_row
from tests.approvals_support import park_approval
from tests.ops_support import ROOT_MAIN, Dispatched, install_ops_api, mint, serving
from tests.steps_support import TENANT

ADDRESSES = {"ann": "ann@example.com", "bob": "bob@example.com"}


@pytest.fixture(name="smtp")
def smtp_fixture(
    db: Database, dispatched: Dispatched, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[FakeSmtp, str]]:
    """The fake SMTP server as the tenant's, its users' addresses, and the `webhook` function
    (which serves the links) over HTTP as the links' public URL."""
    fake = FakeSmtp().start()
    with db.transaction() as tx:
        seed.tenant(tx, TENANT, existing="keep")
        seed.smtp(
            tx,
            TENANT,
            host="127.0.0.1",
            port=fake.bound_port,
            sender="approvals@onceflow.test",
            starttls=False,
        )
        for user, address in ADDRESSES.items():
            seed.approver_identity(tx, TENANT, channel="email", external_id=address, user=user)
    install_ops_api(db, dispatched, monkeypatch)
    app = functions_framework.create_app("webhook", ROOT_MAIN, "http")
    monkeypatch.setenv("ONCEFLOW_APPROVAL_LINK_SECRET", "s" * 32)
    with serving(make_server("127.0.0.1", 0, app, threaded=True)) as base:
        monkeypatch.setenv("ONCEFLOW_PUBLIC_URL", base)
        yield fake, base
    fake.stop()


def _sweep(db: Database) -> None:
    config, report = SweepConfig(), SweepReport()
    approval_messages.remind_and_escalate_approvals(db, config, lambda ids: None, report)
    approval_messages.deliver_approval_messages(db, config, lambda ids: None, report)


def _links(fake: FakeSmtp) -> dict[str, str]:
    """The link in each mail received, by recipient."""
    out: dict[str, str] = {}
    for received in fake.messages:
        body = received.message.get_content()
        (url,) = re.findall(r"http://\S+/ui/decide/\S+", body)
        (to,) = received.recipients
        out[to] = url
    return out


def _decide(url: str, decision: str) -> tuple[int, str]:
    data = urllib.parse.urlencode({"decision": decision}).encode()
    request = urllib.request.Request(url, data=data, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _reminded(db: Database, fake: FakeSmtp, park_id: int) -> list[Any]:
    """The approval's reminder made due now and swept: the mails sent then."""
    with db.transaction() as tx:
        tx.execute("UPDATE step_parks SET remind_at = now() WHERE id = :p", p=park_id)
    fake.messages.clear()
    _sweep(db)
    return list(fake.messages)


def test_each_named_user_is_mailed_a_link_that_votes_as_them_and_the_undecided_are_reminded(
    db: Database, smtp: tuple[FakeSmtp, str], dispatched: Dispatched
) -> None:
    fake, _ = smtp
    approval: dict[str, Any] = {
        "summary": "15% discount on deal 7",
        "approvers": {"users": ["ann", "bob", "cat"]},
        "expires_in": {"days": 2},
        "required": 2,
        "channels": {"email": True},
        "remind_after": {"hours": 4},
    }
    _, park_id = park_approval(db, approval)
    assert fake.messages == []  # mailed by the sweep, not by the step
    _sweep(db)

    links = _links(fake)
    assert set(links) == set(ADDRESSES.values())
    (first,) = [m for m in fake.messages if m.recipients == ("ann@example.com",)]
    assert first.message["Subject"] == "Approval needed: 15% discount on deal 7"
    assert first.message["From"] == "approvals@onceflow.test"
    assert f"/ui/decide/{park_id}/ann/" in links["ann@example.com"]
    with db.transaction() as tx:
        cat = tx.one("SELECT * FROM approval_messages WHERE recipient = 'cat'")
    assert cat is not None and cat["sent_at"] is None
    assert cat["last_error"] == "no email address is mapped for user cat"

    # Opening a link decides nothing (mail scanners fetch links); its form does.
    with urllib.request.urlopen(links["ann@example.com"], timeout=5) as page:
        assert page.status == 200
    status, said = _decide(links["ann@example.com"], "approve")
    assert status == 200 and "1 of 2 approvals so far" in said
    assert dispatched.ids == []

    # The reminder goes to those named who have not voted (and have an address): bob only.
    (reminder,) = _reminded(db, fake, park_id)
    assert reminder.recipients == ("bob@example.com",)
    assert reminder.message["Subject"].startswith("Reminder: approval still needed")

    status, said = _decide(_links(fake)["bob@example.com"], "approve")
    assert status == 200 and "Thank you: approved." in said
    assert len(dispatched.ids) == 1
    with db.transaction() as tx:
        park = park_row(tx, park_id)
        votes = tx.all("SELECT voter, via FROM approval_votes WHERE park_id = :p", p=park_id)
    assert park is not None and park["decided_by"] == "bob"
    assert sorted((v["voter"], v["via"]) for v in votes) == [("ann", "link"), ("bob", "link")]


def test_an_approval_named_by_role_mails_each_live_member_and_reminds_the_undecided(
    db: Database, smtp: tuple[FakeSmtp, str], dispatched: Dispatched
) -> None:
    fake, _ = smtp
    for user in ("ann", "bob", "dan", "eve"):  # eve has no address: she is not mailed
        mint(db, TENANT, label=user, roles=("manager",))
    mint(db, TENANT, label="cat", roles=("sales",))  # not a manager: not asked
    with db.transaction() as tx:
        for user in ("cat", "dan"):
            seed.approver_identity(
                tx, TENANT, channel="email", external_id=f"{user}@example.com", user=user
            )
    approval: dict[str, Any] = {
        "summary": "15% discount on deal 7",
        "approvers": {"role": "manager"},
        "expires_in": {"days": 2},
        "required": 2,
        "channels": {"email": True},
        "remind_after": {"hours": 4},
    }
    _, park_id = park_approval(db, approval)
    _sweep(db)
    links = _links(fake)
    assert set(links) == {"ann@example.com", "bob@example.com", "dan@example.com"}
    assert f"/ui/decide/{park_id}/bob/" in links["bob@example.com"]
    with db.transaction() as tx:
        queued = tx.all("SELECT recipient FROM approval_messages WHERE park_id = :p", p=park_id)
    assert sorted(r["recipient"] for r in queued) == ["ann", "bob", "dan"]
    # A member whose token is revoked after the mail left is a member no more: the link,
    # still signed and in time, decides nothing.
    with db.transaction() as tx:
        tx.execute("UPDATE ops_tokens SET revoked_at = now() WHERE label = 'dan'")
    status, said = _decide(links["dan@example.com"], "approve")
    assert status == 403 and "role manager" in said

    status, said = _decide(links["ann@example.com"], "approve")
    assert status == 200 and "1 of 2 approvals so far" in said
    (reminder,) = _reminded(db, fake, park_id)
    assert reminder.recipients == ("bob@example.com",)
    status, said = _decide(_links(fake)["bob@example.com"], "approve")
    assert status == 200 and "Thank you: approved." in said
    assert len(dispatched.ids) == 1
