"""foreach against real Postgres: iterations journaled `<body>[i]`, at most `concurrency` in
flight, outputs collected in item order before the loop's `next`; an item that fails fails
the run and its replay re-runs that item and what was never started, under the same keys."""

from __future__ import annotations

import textwrap
from typing import Any

from shared.blocks.base import BlockContext, BlockFailure, BlockResult
from shared.db import Database
from shared.ops.replay import replay_run
from shared.workflows.validate import validate_text
from tests.steps_blocks import Recorder, block_lookup, spec
from tests.steps_support import TENANT, definition, publish_version, run_row, start_run
from tests.steps_support import steps_of as steps
from tests.test_steps_engine import Queue

ITEMS = [{"n": i} for i in range(50)]


def _loop(concurrency: int = 5, max_items: int = 50) -> list[dict[str, Any]]:
    return [
        {
            "id": "each",
            "type": "foreach",
            "config": {
                "items": "${{ trigger.items }}",
                "do": "visit",
                "max_items": max_items,
                "concurrency": concurrency,
            },
            "next": "after",
        },
        {"id": "visit", "type": "test.visit"},
        {"id": "after", "type": "test.noop"},
    ]


class Visits:
    """The body block: records each item it sees and how many iterations were in flight."""

    def __init__(self, db: Database, fail_at: int | None = None) -> None:
        self.db = db
        self.fail_at = fail_at
        self.seen: list[int] = []
        self.in_flight: list[int] = []

    def __call__(self, ctx: BlockContext, config: Any) -> BlockResult:
        loop = ctx.scope["iteration"]
        assert loop["foreach"] == "each" and ctx.step_key == f"visit[{loop['index']}]"
        self.seen.append(loop["item"]["n"])
        with self.db.transaction() as tx:
            self.in_flight.append(
                int(
                    tx.scalar(
                        "SELECT count(*) FROM workflow_steps WHERE run_id = :r"
                        " AND node_id = 'visit' AND status IN ('pending', 'running')",
                        r=ctx.run_id,
                    )
                )
            )
        if loop["index"] == self.fail_at:
            raise BlockFailure("item refused", error_class="permanent", outcome_code="HTTP_400")
        return BlockResult(output={"visited": loop["item"]["n"], "key": ctx.idempotency_key})


def _lookup(visits: Visits) -> Any:
    return block_lookup(Recorder(), **{"test.visit": spec("test.visit", visits)})


def test_fifty_items_five_at_a_time_collect_their_outputs_then_go_on(db: Database) -> None:
    visits = Visits(db)
    run_id, ids = start_run(db, publish_version(db, definition(_loop())), payload={"items": ITEMS})
    q = Queue()
    q(ids)
    q.drain(db, _lookup(visits), limit=1000)
    assert sorted(visits.seen) == list(range(50)) and len(visits.seen) == 50
    assert max(visits.in_flight) <= 5
    journal = steps(db, run_id)
    assert {k for k in journal if k.startswith("visit[")} == {f"visit[{i}]" for i in range(50)}
    each = journal["each"]["output"]
    assert each["count"] == 50 and [o["visited"] for o in each["outputs"]] == list(range(50))
    assert journal["after"]["status"] == "succeeded"
    assert run_row(db, run_id)["status"] == "succeeded"


def test_item_17_fails_and_the_replay_reruns_it_and_what_never_started(db: Database) -> None:
    visits = Visits(db, fail_at=17)
    run_id, ids = start_run(db, publish_version(db, definition(_loop())), payload={"items": ITEMS})
    q = Queue()
    q(ids)
    q.drain(db, _lookup(visits), limit=1000)
    assert run_row(db, run_id)["status"] == "failed"
    journal = steps(db, run_id)
    assert journal["visit[17]"]["status"] == "failed" and "after" not in journal
    started = {int(k[6:-1]) for k in journal if k.startswith("visit[")}
    # Iterations are started in order, never more than five past the failure.
    assert started == set(range(max(started) + 1)) and max(started) < 17 + 5
    ran_before = set(visits.seen)
    keys = {k: s["idempotency_key"] for k, s in journal.items()}

    visits.fail_at = None
    visits.seen.clear()
    replayed = replay_run(db, run_id=run_id, tenant_scope=TENANT, dispatch=q)
    assert [s.step_key for s in replayed.plan.restart] == ["visit[17]"]
    q.drain(db, _lookup(visits), limit=1000)
    assert run_row(db, replayed.run_id)["status"] == "succeeded"
    # Item 17 again, then only the items the first run never started.
    assert visits.seen[0] == 17
    assert sorted(visits.seen) == sorted({17} | (set(range(50)) - ran_before))
    again = steps(db, replayed.run_id)
    # The same journal keys, so the same idempotency keys (and ledger keys) in the lineage.
    assert all(again[k]["idempotency_key"] == key for k, key in keys.items())
    assert [o["visited"] for o in again["each"]["output"]["outputs"]] == list(range(50))
    assert again["after"]["status"] == "succeeded"


def test_more_items_than_max_items_fail_before_any_iteration(db: Database) -> None:
    visits = Visits(db)
    run_id, ids = start_run(
        db, publish_version(db, definition(_loop(max_items=10))), payload={"items": ITEMS}
    )
    q = Queue()
    q(ids)
    q.drain(db, _lookup(visits))
    each = steps(db, run_id)["each"]
    assert each["status"] == "failed" and each["outcome_code"] == "TOO_MANY_ITEMS"
    assert visits.seen == [] and set(steps(db, run_id)) == {"each"}


HEAD = """\
name: wf
tenant: acme
trigger:
  events: [hubspot.contact.created]
steps:
"""


def _errors(steps_yaml: str) -> list[str]:
    report = validate_text(HEAD + textwrap.dedent(steps_yaml), "wf.yaml")
    return [f"{p.where}: {p.message}" for p in report.errors]


def test_validate_needs_max_items_and_a_one_step_body_only_its_foreach_runs() -> None:
    assert (
        _errors(
            """\
        - id: each
          type: foreach
          config: {items: "${{ trigger.ids }}", do: visit, max_items: 20, concurrency: 4}
          next: done
        - id: visit
          type: crm.get
          config: {object_type: contacts, object_id: "${{ iteration.item }}"}
        - id: done
          type: end
        """
        )
        == []
    )
    unbounded = _errors(
        """\
        - id: each
          type: foreach
          config: {items: "${{ trigger.ids }}", do: visit}
        - id: visit
          type: end
        """
    )
    assert unbounded == ["steps[0].config.max_items: missing required field 'max_items'"], unbounded
    body_goes_on = _errors(
        """\
        - id: each
          type: foreach
          config: {items: [1, 2], do: visit, max_items: 2}
        - id: visit
          type: crm.get
          config: {object_type: contacts, object_id: "1"}
          next: done
        - id: done
          type: end
        """
    )
    assert any("is a foreach body: it is one step" in e for e in body_goes_on), body_goes_on
