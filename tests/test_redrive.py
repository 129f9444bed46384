"""Redriving Pub/Sub dead letters from the page, on the real emulator: a preview that leaves
them on the holds, a CSRF-checked redrive that publishes each back to its topic and empties
the holds (audited; repeating finds nothing), admins only; and the hold names match
infra/pubsub.tf."""

from __future__ import annotations

import re
from typing import Any

import pytest

from devstack.emulator import declared_layout
from shared.core.db import Database
from shared.ops.html import csrf_value
from shared.ops.redrive import DEAD_LETTER_HOLDS
from tests.ops_support import (
    mint,
    seed_tenant,
)
from tests.pubsub_emulator import (
    PubsubProject,
)

pytestmark = pytest.mark.e2e
TOKEN = re.compile(r'name="token" value="([^"]+)"')
COUNT = re.compile(r'<tr data-hold="([^"]+)">.*?<td class="count">(\d+)</td>', re.S)


def test_the_hold_subscriptions_are_the_dead_letter_topics_of_infra() -> None:
    layout = declared_layout()
    by_name = {s.name: s for s in layout.subscriptions}
    for hold, topic in DEAD_LETTER_HOLDS.items():
        dead_topic = by_name[hold].topic
        # Some push subscription of `topic` dead-letters into the topic this hold reads.
        assert any(
            s.topic == topic and s.dead_letter_topic == dead_topic for s in layout.subscriptions
        ), (hold, topic)


def _counts(html: str) -> dict[str, int]:
    return {hold: int(n) for hold, n in COUNT.findall(html)}


def test_redrive_previews_then_publishes_back_and_empties_the_holds(
    db: Database, client: Any, pubsub: PubsubProject
) -> None:
    for hold, topic in DEAD_LETTER_HOLDS.items():
        dead = f"{topic}-dead-letter"
        pubsub.create_topic(dead)
        pubsub.create_subscription(hold, dead)
    publisher = pubsub._publisher()
    publisher.publish(pubsub.topic_path("trigger-events-dead-letter"), b'{"event_id": 41}').result()
    publisher.publish(pubsub.topic_path("step-ready-dead-letter"), b'{"step_id": "s-1"}').result()

    seed_tenant(db, "acme")
    client.post("/ui/login", data={"token": mint(db, "acme")})
    assert client.get("/ui/redrive").status_code == 404  # machinery: admins only
    assert client.post("/ui/redrive", data={}).status_code == 404

    admin = mint(db, None)
    client.post("/ui/login", data={"token": admin})
    preview = client.get("/ui/redrive").get_data(as_text=True)
    assert _counts(preview) == {
        "trigger-events-dead-letter-hold": 1,
        "step-ready-dead-letter-hold": 1,
    }
    # The preview left them there: a second look sees the same.
    assert (
        _counts(client.get("/ui/redrive").get_data(as_text=True))["trigger-events-dead-letter-hold"]
        == 1
    )
    (token,) = TOKEN.findall(preview)
    # A message dead-lettered after the preview is not in its set: it stays on the hold.
    publisher.publish(pubsub.topic_path("trigger-events-dead-letter"), b'{"event_id": 42}').result()
    assert client.post("/ui/redrive", data={"csrf": "forged", "token": token}).status_code == 403
    confirm = {"csrf": csrf_value(admin), "token": token}
    done = client.post("/ui/redrive", data=confirm).get_data(as_text=True)
    assert "2 message(s) published again" in done
    assert pubsub.pull_ids("trigger-events", count=1, timeout=10) == [41]
    assert pubsub.pull_ids("step-ready", count=1, timeout=10) == ["s-1"]
    # Confirming the same preview again shows its outcomes and publishes nothing more.
    again = client.post("/ui/redrive", data=confirm).get_data(as_text=True)
    assert "2 message(s) published again" in again
    left = _counts(client.get("/ui/redrive").get_data(as_text=True))
    assert left == {"trigger-events-dead-letter-hold": 1, "step-ready-dead-letter-hold": 0}
    with db.transaction() as tx:
        audited = tx.all(
            "SELECT target, detail FROM ops_audit WHERE action = 'deadletters.redrive'"
            " ORDER BY target"
        )
    assert [(a["target"], a["detail"]["ids"]) for a in audited] == [
        ("step-ready-dead-letter-hold", ["s-1"]),
        ("trigger-events-dead-letter-hold", ["41"]),
    ]
