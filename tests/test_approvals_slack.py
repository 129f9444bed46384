"""Approvals asked in Slack, end to end over real HTTP (issue 31, item 4): the sweep posts the
approval to the fake Slack Web API (devstack/fakeslack), the fake posts clicks back to the
`webhook` function signed with Slack's v0 scheme, and the click is trusted only as far as its
verified Slack user id maps to an onceflow user who may decide. A forged signature or a stale
timestamp records nothing; a duplicated delivery is one vote; an unmapped user is refused
with the reason; a late click resumes nothing; the message is updated with the decision and
who made it (by the sweep, not inside the click's answer)."""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any

import functions_framework
import pytest
from werkzeug.serving import make_server

from devstack import seed
from devstack.fakeslack.server import FakeSlack
from shared.core.db import Database
from shared.core.duty import SweepConfig, SweepReport
from shared.ops.slack_interactions import PATH_PREFIX
from shared.steps import approval_messages
from shared.steps.parks import park_row
from shared.sweep.loop import next_due_seconds, run_sweep
from tests.approvals_support import park_approval
from tests.ops_support import ROOT_MAIN, Dispatched, install_ops_api, mint, serving
from tests.steps_support import TENANT
from tests.test_steps_engine import make_past

BOT_TOKEN = "xoxb-test-token"
SIGNING_SECRET = "test-signing-secret-0123456789"
SLACK_IDS = {"ann": "U0ANN", "bob": "U0BOB", "cat": "U0CAT"}


@pytest.fixture(name="slack")
def slack_fixture(
    db: Database, dispatched: Dispatched, monkeypatch: pytest.MonkeyPatch
) -> Iterator[FakeSlack]:
    """The fake Slack, the tenant's Slack settings and identities, and the `webhook` function
    served over HTTP as the fake's interaction URL."""
    monkeypatch.setenv("TEST_SLACK_BOT", BOT_TOKEN)
    monkeypatch.setenv("TEST_SLACK_SIGNING", SIGNING_SECRET)
    with db.transaction() as tx:
        seed.tenant(tx, TENANT, existing="keep")
        seed.slack(
            tx, TENANT, bot_token_env="TEST_SLACK_BOT", signing_secret_env="TEST_SLACK_SIGNING"
        )
        for user, slack_id in SLACK_IDS.items():
            seed.approver_identity(tx, TENANT, channel="slack", external_id=slack_id, user=user)
    install_ops_api(db, dispatched, monkeypatch)  # the webhook's default_api: db, dispatch
    app = functions_framework.create_app("webhook", ROOT_MAIN, "http")
    fake = FakeSlack(bot_token=BOT_TOKEN, signing_secret=SIGNING_SECRET).start()
    monkeypatch.setenv("ONCEFLOW_SLACK_API_URL", fake.api_url)
    with serving(make_server("127.0.0.1", 0, app, threaded=True)) as base:
        fake.interaction_url = f"{base}{PATH_PREFIX}{TENANT}"
        yield fake
    fake.stop()


def _asked(db: Database, slack: FakeSlack, **config: Any) -> tuple[str, int, str]:
    """A run parked on an approval asked in #deals: (run id, approval id, the message's ts)."""
    run_id, park_id = _park(db, **config)
    assert slack.messages == {}  # nothing is posted inline: the sweep sends it
    _sweep(db)
    (ts,) = list(slack.messages)
    return run_id, park_id, ts


def _park(db: Database, **config: Any) -> tuple[str, int]:
    approval = {
        "summary": "15% discount on deal 7",
        "approvers": {"users": list(SLACK_IDS)},
        "expires_in": {"days": 2},
        "required": 2,
        "channels": {"slack": {"channel": "C0DEALS"}},
        **config,
    }
    return park_approval(db, approval)


def _sweep(db: Database) -> None:
    approval_messages.deliver_approval_messages(db, SweepConfig(), lambda ids: None, SweepReport())


def _votes(db: Database, park_id: int) -> dict[str, tuple[str, bool, str]]:
    with db.transaction() as tx:
        rows = tx.all("SELECT * FROM approval_votes WHERE park_id = :p", p=park_id)
    return {r["voter"]: (r["decision"], r["counted"], r["via"]) for r in rows}


def _buttons(message: dict[str, Any]) -> list[str]:
    return [
        e["action_id"] for b in message["blocks"] if b["type"] == "actions" for e in b["elements"]
    ]


def test_two_managers_approve_in_slack_duplicates_and_a_late_click_change_nothing(
    db: Database, slack: FakeSlack, dispatched: Dispatched
) -> None:
    _, park_id, ts = _asked(db, slack)
    posted = slack.messages[ts]
    assert posted["channel"] == "C0DEALS" and "15% discount on deal 7" in posted["text"]
    assert _buttons(posted) == ["approve", "reject"]

    # One click delivered twice (Slack's retry of the same bytes): one vote.
    first, again = slack.click(ts, SLACK_IDS["ann"], "approve", duplicate=True)
    assert (first.status, first.answer["vote"], first.answer["resumed"]) == (200, "counted", False)
    assert first.answer["text"] == "recorded: 1 of 2 approvals"
    assert (again.status, again.answer["vote"]) == (200, "duplicate")
    assert _votes(db, park_id) == {"ann": ("approved", True, "slack")}
    assert dispatched.ids == []

    (second,) = slack.click(ts, SLACK_IDS["bob"], "approve")
    assert second.answer == {
        "ok": True,
        "vote": "counted",
        "resumed": True,
        "text": "approved by bob",
        "user": "bob",
    }
    assert len(dispatched.ids) == 1  # the resumed step, handed on once

    (late,) = slack.click(ts, SLACK_IDS["cat"], "approve")
    assert late.status == 200 and late.answer["vote"] == "late"
    assert late.answer["text"].startswith("already decided by bob at ")
    assert len(dispatched.ids) == 1 and _votes(db, park_id)["cat"] == ("approved", False, "slack")
    # Ann clicks again after the decision, and that click is delivered once more later.
    repeat, later = slack.click(ts, SLACK_IDS["ann"], "reject", late_duplicate_after=0.05)
    assert [repeat.answer["vote"], later.answer["vote"]] == ["duplicate", "duplicate"]
    assert later.answer["text"].startswith("already decided by bob at ")
    assert len(dispatched.ids) == 1 and _votes(db, park_id)["ann"] == ("approved", True, "slack")

    # Each click was answered well within Slack's 3 s (no outbound call in the answer).
    assert max(d.seconds for d in slack.deliveries) < 1.0, [d.seconds for d in slack.deliveries]
    assert slack.updates == []  # not yet: the update is the sweep's
    # The message is updated by the sweep: the decision and who made it, no more buttons.
    _sweep(db)
    shown = slack.messages[ts]
    assert "*Approved* by bob (approvals: ann, bob)" in shown["text"]
    assert _buttons(shown) == []
    with db.transaction() as tx:
        park = park_row(tx, park_id)
        audit = tx.all(
            "SELECT detail FROM ops_audit WHERE action = 'approvals.slack_decide' ORDER BY id"
        )
    assert park is not None and park["decided_by"] == "bob" and park["decision"] == "approved"
    assert [a["detail"]["outcome"] for a in audit] == [
        "counted",
        "duplicate",
        "resumed",
        "late",
        "duplicate",
        "duplicate",
    ]


def test_a_forged_or_stale_click_or_an_unmapped_user_records_nothing(
    db: Database, slack: FakeSlack
) -> None:
    _, park_id, ts = _asked(db, slack)
    body = urllib.parse.urlencode(
        {"payload": json.dumps(slack.payload(ts, SLACK_IDS["ann"], "approve"))}
    ).encode()

    forged = FakeSlack(bot_token=BOT_TOKEN, signing_secret="not-the-secret-at-all")
    refused = slack.deliver(body, forged.signed(body))
    assert (refused.status, refused.answer["error"]) == (401, "bad_signature")

    stale = slack.deliver(body, slack.signed(body, timestamp=int(time.time()) - 301))
    assert (stale.status, stale.answer["error"]) == (401, "stale_timestamp")

    # The signature covers the body: the same headers over a changed click are refused.
    headers = slack.signed(body)
    tampered = body.replace(SLACK_IDS["ann"].encode(), SLACK_IDS["bob"].encode())
    assert slack.deliver(tampered, headers).status == 401

    # A signed click whose button names no possible approval (beyond the id's bigint) is a
    # 400 with its reason, never a 500 from the database.
    huge = slack.payload(ts, SLACK_IDS["ann"], "approve")
    huge["actions"][0]["value"] = "9" * 30
    body_huge = urllib.parse.urlencode({"payload": json.dumps(huge)}).encode()
    out_of_range = slack.deliver(body_huge, slack.signed(body_huge))
    assert (out_of_range.status, out_of_range.answer["error"]) == (400, "bad_payload")

    (stranger,) = slack.click(ts, "U0MALLORY", "approve")
    assert stranger.status == 403 and stranger.answer == {
        "ok": False,
        "error": "unmapped_user",
        "reason": "Slack user U0MALLORY is not mapped to an onceflow user in this tenant",
    }
    assert _votes(db, park_id) == {}

    # A mapped user the approval does not name: refused with who may decide.
    with db.transaction() as tx:
        seed.approver_identity(tx, TENANT, channel="slack", external_id="U0DAVE", user="dave")
    (dave,) = slack.click(ts, "U0DAVE", "reject")
    assert dave.status == 403 and dave.answer["reason"] == (
        "only user ann or user bob or user cat may decide this approval"
    )
    assert _votes(db, park_id) == {}
    with db.transaction() as tx:
        park = park_row(tx, park_id)
    assert park is not None and park["resumed_at"] is None


def test_a_post_slack_refuses_is_tried_again_later_and_given_up_after_its_last_attempt(
    db: Database, slack: FakeSlack, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TEST_SLACK_BOT", "xoxb-revoked")
    _park(db)
    due_in = next_due_seconds(db, SweepConfig())
    assert due_in is not None and due_in <= 0  # the sweep passes again for the post at once
    _sweep(db)
    due_in = next_due_seconds(db, SweepConfig())
    assert due_in is not None and 50 < due_in <= approval_messages.RETRY_SECONDS
    with db.transaction() as tx:
        (row,) = tx.all("SELECT * FROM approval_messages")
        assert row["sent_at"] is None and row["attempts"] == 1
        assert row["last_error"] == "chat.postMessage: invalid_auth"
        assert row["due_at"] > tx.scalar("SELECT now() + interval '50 seconds'")
        tx.execute(
            "UPDATE approval_messages SET due_at = now(), attempts = :n",
            n=approval_messages.MAX_ATTEMPTS - 1,
        )
    _sweep(db)
    with db.transaction() as tx:
        (row,) = tx.all("SELECT * FROM approval_messages")
    assert row["sent_at"] is None and row["due_at"] is None  # given up, and why
    assert row["attempts"] == approval_messages.MAX_ATTEMPTS
    assert slack.messages == {}
    due_in = next_due_seconds(db, SweepConfig())  # nothing left but the approval's deadline
    assert due_in is not None and due_in > 86400


def _due_now(db: Database, park_id: int, column: str) -> None:
    assert column in ("remind_at", "escalate_at")
    with db.transaction() as tx:
        tx.execute(
            f"UPDATE step_parks SET {column} = now() - interval '1 second' WHERE id = :p",
            p=park_id,
        )


def _repair_at_a_barrier(db: Database) -> list[int]:
    """The reminder/escalation repair run by two sweeps at once: what each moved."""
    barrier = threading.Barrier(2)
    moved: list[int] = []

    def sweep() -> None:
        barrier.wait()
        moved.append(
            approval_messages.remind_and_escalate_approvals(
                db, SweepConfig(), lambda ids: None, SweepReport()
            )
        )

    threads = [threading.Thread(target=sweep) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return sorted(moved)


def test_a_reminder_nudges_the_undecided_once_and_escalation_adds_deciders_once(
    db: Database, slack: FakeSlack, dispatched: Dispatched
) -> None:
    with db.transaction() as tx:
        seed.approver_identity(tx, TENANT, channel="slack", external_id="U0VIC", user="vic")
    _, park_id, ts = _asked(
        db,
        slack,
        remind_after={"hours": 4},
        escalate_after={"days": 1},
        escalate_to={"users": ["vic"]},
    )
    slack.click(ts, SLACK_IDS["ann"], "approve")
    (early,) = slack.click(ts, "U0VIC", "approve")
    assert early.status == 403  # not before the escalation
    assert _repair_at_a_barrier(db) == [0, 0]  # nothing due yet

    _due_now(db, park_id, "remind_at")
    assert _repair_at_a_barrier(db) == [0, 1]  # reminded once
    _sweep(db)
    (reminder,) = [m for t, m in slack.messages.items() if t != ts]
    assert reminder["thread_ts"] == ts
    assert reminder["text"] == (
        "Reminder: this approval is still waiting for <@U0BOB>, <@U0CAT>: 15% discount on deal 7"
    )

    _due_now(db, park_id, "escalate_at")
    assert _repair_at_a_barrier(db) == [0, 1]  # escalated once
    _due_now(db, park_id, "remind_at")
    assert _repair_at_a_barrier(db) == [0, 0]  # and reminded no more
    _sweep(db)
    (escalation,) = [m for t, m in slack.messages.items() if m is not reminder and t != ts]
    assert escalation["text"] == "Escalated: now also for <@U0VIC>: 15% discount on deal 7"
    assert "escalated to vic" in slack.messages[ts]["text"]

    (vic,) = slack.click(ts, "U0VIC", "approve")
    assert vic.answer["resumed"] is True and vic.answer["text"] == "approved by vic"
    assert len(dispatched.ids) == 1
    with db.transaction() as tx:
        purposes = tx.all(
            "SELECT purpose FROM approval_messages WHERE park_id = :p ORDER BY id", p=park_id
        )
    assert [r["purpose"] for r in purposes] == ["ask", "remind", "escalate"]


def test_an_approval_named_by_role_mentions_its_members_in_reminders_and_escalations(
    db: Database, slack: FakeSlack
) -> None:
    """Who holds a role: the labels of the tenant's live ops tokens carrying it. Members with
    a Slack id are mentioned; a revoked token's holder is not a member; the role's name covers
    the members without one."""
    for user, role in (("ann", "manager"), ("bob", "manager"), ("dan", "manager"), ("vic", "vp")):
        mint(db, TENANT, label=user, roles=(role,))
    mint(db, TENANT, label="cat", roles=("manager",))
    with db.transaction() as tx:
        seed.approver_identity(tx, TENANT, channel="slack", external_id="U0VIC", user="vic")
        tx.execute("UPDATE ops_tokens SET revoked_at = now() WHERE label = 'cat'")
    _, park_id, ts = _asked(
        db,
        slack,
        approvers={"role": "manager"},
        required=1,
        remind_after={"hours": 4},
        escalate_after={"days": 1},
        escalate_to={"role": "vp"},
    )
    _due_now(db, park_id, "remind_at")
    _repair_at_a_barrier(db)
    _sweep(db)
    (reminder,) = [m for t, m in slack.messages.items() if t != ts]
    assert reminder["text"] == (
        "Reminder: this approval is still waiting for <@U0ANN>, <@U0BOB>, role manager: "
        "15% discount on deal 7"
    )
    _due_now(db, park_id, "escalate_at")
    _repair_at_a_barrier(db)
    _sweep(db)
    (escalation,) = [m for t, m in slack.messages.items() if t != ts and m is not reminder]
    assert escalation["text"] == "Escalated: now also for <@U0VIC>, role vp: 15% discount on deal 7"


def test_a_burst_of_asks_in_one_channel_waits_out_slacks_429s_and_posts_each_once(
    db: Database, slack: FakeSlack
) -> None:
    """Slack posts about one message per second per channel (short bursts tolerated) and
    answers 429 with Retry-After past that. Six asks at once in #deals with a burst of two:
    each pass posts what the channel takes, stops calling Slack for that channel at its first
    429, and sends the rest after Retry-After — each ask posted once, no attempt spent on a
    429, nothing given up."""
    slack.post_burst, slack.posts_per_second = 2.0, 2.0
    parks = [_park(db, summary=f"discount {n}")[1] for n in range(6)]
    _sweep(db)
    assert len(slack.messages) == 2 and slack.rate_limited == 1  # one 429, then held
    with db.transaction() as tx:
        waiting = tx.all("SELECT attempts, last_error FROM approval_messages WHERE sent_at IS NULL")
    assert len(waiting) == 4 and {w["attempts"] for w in waiting} == {0}
    assert all("rate limited by Slack; retry after 1 s" in w["last_error"] for w in waiting)
    deadline = time.monotonic() + 30
    while len(slack.messages) < 6:
        assert time.monotonic() < deadline, f"still unsent: {6 - len(slack.messages)}"
        time.sleep(0.5)
        _sweep(db)
    summaries = sorted(m["text"].split("\n")[0] for m in slack.messages.values())
    assert summaries == [f"discount {n}" for n in range(6)]
    with db.transaction() as tx:
        sent = tx.all(
            "SELECT park_id, attempts FROM approval_messages WHERE park_id = ANY(:p)", p=parks
        )
    assert sorted(r["park_id"] for r in sent) == sorted(parks)
    assert {r["attempts"] for r in sent} == {1}  # the one that posted; 429s cost nothing


def test_an_approval_that_expires_unanswered_is_shown_expired_in_slack(
    db: Database, slack: FakeSlack
) -> None:
    run_id, _, ts = _asked(db, slack)
    slack.click(ts, SLACK_IDS["ann"], "approve")
    _sweep(db)
    assert "Waiting: 1 of 2 approvals (ann)" in slack.messages[ts]["text"]
    make_past(db, run_id)
    run_sweep(db, 0, duties=[], dispatch=lambda ids: None)  # the deadline resumes it
    shown = slack.messages[ts]
    assert "*Expired* without a decision" in shown["text"] and _buttons(shown) == []
    updates = len(slack.updates)
    _sweep(db)
    assert len(slack.updates) == updates  # shown once: nothing more to update
