"""An approval that is still open when its run fails beside it (another foreach item's
approval was rejected), then the run is retried (issue 31 item 4, self-review): a vote cast
while the run was failed changes nothing (the run is not running), and must not cost the
voter their vote once the retry has the approval waiting again."""

from __future__ import annotations

from shared.core.db import Database
from shared.ops.replay import retry_run
from shared.steps import parks
from tests.steps_blocks import Recorder, block_lookup
from tests.steps_support import TENANT, definition, publish_version, run_row, start_run
from tests.steps_support import steps_of as steps
from tests.test_steps_engine import Queue


def _vote(db: Database, park_id: int, user: str, decision: str) -> parks.Resumed | None:
    return parks.decide_approval(
        db, park_id, decision=decision, user=user, roles=(), comment=None, tenant_scope=TENANT
    )


def test_a_vote_while_the_run_is_failed_is_not_held_against_the_voter_after_a_retry(
    db: Database,
) -> None:
    approval = {
        "summary": "discount for item ${{ iteration.item }}",
        "approvers": {"users": ["ann", "bob"]},
        "expires_in": {"days": 2},
        "on_reject": "fail",
    }
    nodes = [
        {
            "id": "each",
            "type": "foreach",
            "config": {"items": [1, 2], "do": "gate", "max_items": 5, "concurrency": 2},
            "next": "done",
        },
        {"id": "gate", "type": "approval", "config": approval},
        {"id": "done", "type": "test.noop"},
    ]
    lookup = block_lookup(Recorder())
    run_id, ids = start_run(db, publish_version(db, definition(nodes)))
    q = Queue()
    q(ids)
    q.drain(db, lookup)
    journal = steps(db, run_id)
    first, second = int(journal["gate[0]"]["park_id"]), int(journal["gate[1]"]["park_id"])
    rejected = _vote(db, first, "bob", "rejected")
    assert rejected is not None and rejected.moved and rejected.step_id
    q([rejected.step_id])
    q.drain(db, lookup)
    assert run_row(db, run_id)["status"] == "failed"
    # ann approves item 2 while the run is failed: it decides nothing.
    early = _vote(db, second, "ann", "approved")
    assert early is not None and not early.moved
    assert run_row(db, run_id)["status"] == "failed"

    retry_run(db, run_id=run_id, tenant_scope=TENANT, dispatch=q)
    q.drain(db, lookup)
    assert run_row(db, run_id)["status"] == "running"
    journal = steps(db, run_id)
    waiting = {k: s for k, s in journal.items() if s["status"] == "waiting_for_approval"}
    assert set(waiting) == {"gate[0]", "gate[1]"}, {k: s["status"] for k, s in journal.items()}
    # The rejected item waits on a new park; a link to its closed one decides nothing.
    assert int(waiting["gate[0]"]["park_id"]) != first
    stale = _vote(db, first, "ann", "approved")
    assert stale is not None and stale.vote == "late" and not stale.moved
    # ann approves both now (the links she was sent, or the ops list): each counts.
    for key in ("gate[0]", "gate[1]"):
        outcome = _vote(db, int(waiting[key]["park_id"]), "ann", "approved")
        assert outcome is not None and outcome.vote == "counted" and outcome.moved, (key, outcome)
        assert outcome.step_id
        q([outcome.step_id])
    q.drain(db, lookup)
    assert run_row(db, run_id)["status"] == "succeeded"
