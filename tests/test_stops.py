"""`cancel_on` and `goal` (issue 31, item 3; shared/admission/stops.py) against real Postgres:
an admitted event cancels a running run about its record through the ops cancel's statement
(`cancelled_by: event E`), a goal met ends it `goal_met`; other records, other events and
onceflow's own echo stop nothing; a `cancel_on` event racing a step's settle and a goal met
while a step runs, at a barrier: the step finishes and nothing starts after it. Validation of
both fields, with their positions."""

from __future__ import annotations

import json
import textwrap
import threading
from typing import Any

import pytest

from devstack import seed
from shared.admission.admit import admit_event
from shared.blocks.base import BlockContext, BlockResult
from shared.core.db import Database
from shared.core.duty import SweepConfig, SweepReport
from shared.ingest.echo import record_echo_marker
from shared.publishing.validate import validate_text
from shared.steps.advance import advance_step
from shared.steps.cancel import cancel_run
from shared.steps.repairs import wake_due_steps
from tests.admission_support import emit_event, make_connection, make_tenant
from tests.ops_support import bearer, mint
from tests.steps_blocks import Recorder, block_lookup, spec
from tests.test_steps_engine import LEASE, Queue, make_past

STARTS = "hubspot.contact.created"
CHANGED = "hubspot.contact.property_changed"
UNQUALIFIED = (
    "has(event.changed_fields.hs_lead_status)"
    ' && event.changed_fields.hs_lead_status == "UNQUALIFIED"'
)
CUSTOMER = 'has(record.lifecyclestage) && record.lifecyclestage == "customer"'
HOOK = {"url": "https://hooks.example.com/touch", "method": "POST"}


def _steps_with_delay() -> list[dict[str, Any]]:
    return [
        {"id": "touch", "type": "http.request", "config": HOOK, "next": "pause"},
        {"id": "pause", "type": "delay", "config": {"days": 2}, "next": "again"},
        {"id": "again", "type": "http.request", "config": HOOK},
    ]


class Stoppable:
    """A workflow with `cancel_on` and a `goal`, its http.request steps run by `touch` (a
    test block) instead of the network."""

    def __init__(
        self,
        db: Database,
        touch: Any = None,
        steps: list[dict[str, Any]] | None = None,
        final: list[dict[str, Any]] | None = None,
    ) -> None:
        self.db = db
        self.q = Queue()
        make_tenant(db)
        self.conn = make_connection(db)

        def default_touch(ctx: BlockContext, config: Any) -> BlockResult:
            return BlockResult(output={"touched": ctx.step_key})

        self.lookup = block_lookup(
            Recorder(), **{"http.request": spec("http.request", touch or default_touch)}
        )
        with db.transaction() as tx:
            source = {
                "name": "nurture",
                "tenant": "acme",
                "trigger": {"events": [STARTS], "dedup": "every_time"},
                "cancel_on": [{"event": CHANGED, "when": UNQUALIFIED}],
                "goal": CUSTOMER,
                "steps": steps or _steps_with_delay(),
                **({"finally": final} if final else {}),
            }
            self.workflow_id = seed.activate_source(tx, json.dumps(source), tenant_id="acme")

    def start(self, object_id: str = "101") -> tuple[str, str]:
        """A run, admitted; (run id, its first step id), not yet advanced."""
        event = emit_event(
            self.db, connection_id=self.conn, event_type=STARTS, object_id=object_id, changed={}
        )
        (outcome,) = admit_event(self.db, event, publish=self.q).outcomes
        assert outcome.run_id is not None
        return outcome.run_id, self.q.ids.pop()

    def run(self, object_id: str = "101") -> str:
        """A run, admitted and advanced until it waits on its delay."""
        run_id, step_id = self.start(object_id)
        self.q([step_id])
        self.drain()
        return run_id

    def change(self, changed: dict[str, Any], object_id: str = "101") -> int:
        return emit_event(
            self.db,
            connection_id=self.conn,
            event_type=CHANGED,
            object_id=object_id,
            changed=changed,
        )

    def admit(self, event_id: int) -> Any:
        return admit_event(self.db, event_id, publish=self.q)

    def drain(self) -> None:
        self.q.drain(self.db, self.lookup)


def _run(db: Database, run_id: str) -> dict[str, Any]:
    with db.transaction() as tx:
        row = tx.one("SELECT * FROM workflow_runs WHERE id = :r", r=run_id)
    assert row is not None
    return row


def _journal(db: Database, run_id: str) -> dict[str, dict[str, Any]]:
    with db.transaction() as tx:
        rows = tx.all("SELECT * FROM workflow_steps WHERE run_id = :r", r=run_id)
    return {r["step_key"]: r for r in rows}


def test_a_cancel_on_event_cancels_the_run_through_the_cancel_and_names_the_event(
    db: Database,
) -> None:
    flow = Stoppable(db)
    run_id = flow.run()
    assert _journal(db, run_id)["pause"]["status"] == "waiting_for_delay"
    flow.admit(flow.change({"hs_lead_status": "OPEN"}))  # its `when` does not hold
    flow.admit(flow.change({"hs_lead_status": "UNQUALIFIED"}, object_id="102"))  # other record
    assert _run(db, run_id)["status"] == "running"
    stop = flow.change({"hs_lead_status": "UNQUALIFIED"})
    flow.admit(stop)
    run = _run(db, run_id)
    assert run["status"] == "cancelled" and run["cancelled_by"] == f"event {stop}"
    assert run["cancel_reason"] == f"cancel_on {CHANGED} when {UNQUALIFIED}"
    journal = _journal(db, run_id)
    assert (
        journal["pause"]["status"] == "skipped" and journal["pause"]["outcome_code"] == "CANCELLED"
    )
    # The delay's deadline comes and wakes nothing; a later ops cancel says who won.
    make_past(db, run_id)
    woken: list[str] = []
    wake_due_steps(db, SweepConfig(), woken.extend, SweepReport())
    assert woken == []
    late = cancel_run(db, run_id, by="alice", reason="too late")
    assert late is not None and not late.moved
    assert late.why_not is not None and late.why_not.startswith(
        f"already cancelled by event {stop}"
    )
    # Redelivered, the event changes nothing more.
    flow.admit(stop)
    assert _run(db, run_id)["cancelled_by"] == f"event {stop}"


def test_a_cancel_on_event_runs_the_finally_steps_once_then_the_run_ends_cancelled(
    db: Database,
) -> None:
    """The event's admission cancels the run into its finally phase and publishes the first
    finally step after its commit; redelivered, the event starts no second finally."""
    flow = Stoppable(db, final=[{"id": "tell_rep", "type": "http.request", "config": HOOK}])
    run_id = flow.run()
    stop = flow.change({"hs_lead_status": "UNQUALIFIED"})
    flow.admit(stop)
    run = _run(db, run_id)
    assert (run["status"], run["phase"], run["final_status"]) == ("running", "finally", "cancelled")
    assert run["cancelled_by"] == f"event {stop}"
    flow.drain()
    journal = _journal(db, run_id)
    assert journal["finally:tell_rep"]["status"] == "succeeded"
    assert journal["pause"]["status"] == "skipped" and "again" not in journal
    assert _run(db, run_id)["status"] == "cancelled"
    flow.admit(stop)
    flow.drain()
    assert _journal(db, run_id)["finally:tell_rep"]["attempt"] == 1
    assert _run(db, run_id)["status"] == "cancelled"


def test_a_goal_met_runs_the_finally_steps_once_then_the_run_ends_goal_met(db: Database) -> None:
    flow = Stoppable(db, final=[{"id": "tell_rep", "type": "http.request", "config": HOOK}])
    run_id = flow.run()
    customer = flow.change({"lifecyclestage": "customer"})
    flow.admit(customer)
    run = _run(db, run_id)
    assert (run["status"], run["phase"], run["final_status"]) == ("running", "finally", "goal_met")
    flow.drain()
    journal = _journal(db, run_id)
    assert journal["finally:tell_rep"]["status"] == "succeeded"
    assert journal["pause"]["outcome_code"] == "GOAL_MET" and "again" not in journal
    assert _run(db, run_id)["status"] == "goal_met"
    flow.admit(customer)
    flow.drain()
    assert _journal(db, run_id)["finally:tell_rep"]["attempt"] == 1


def test_a_goal_met_ends_the_run_goal_met_and_skips_what_is_left(db: Database) -> None:
    flow = Stoppable(db)
    run_id = flow.run()
    flow.admit(flow.change({"lifecyclestage": "opportunity"}))
    assert _run(db, run_id)["status"] == "running"
    flow.admit(flow.change({"lifecyclestage": "customer"}))
    run = _run(db, run_id)
    assert run["status"] == "goal_met" and run["finished_at"] is not None
    assert run["cancelled_by"] is None
    journal = _journal(db, run_id)
    assert journal["touch"]["status"] == "succeeded"
    assert (
        journal["pause"]["status"] == "skipped" and journal["pause"]["outcome_code"] == "GOAL_MET"
    )
    assert "again" not in journal


def test_the_run_card_says_the_goal_ended_the_run_and_closed_its_wait(
    db: Database, client: Any
) -> None:
    wait = {
        "id": "wait",
        "type": "wait_for",
        "config": {
            "mode": "all",
            "events": [
                {"name": "reply", "event": CHANGED, "when": UNQUALIFIED.replace("UN", "")},
                {"name": "meeting", "event": "hubspot.contact.association_changed"},
            ],
            "timeout": {"days": 3},
        },
    }
    flow = Stoppable(db, steps=[wait])
    run_id = flow.run()
    flow.admit(flow.change({"hs_lead_status": "QUALIFIED"}))
    token = mint(db, "acme", label="carol")
    card = client.get(f"/v1/runs/{run_id}", headers=bearer(token)).get_json()
    (step,) = card["steps"]
    assert step["waits_for"]["mode"] == "all" and step["waits_for"]["matched"] == ["reply"]
    assert [a["name"] for a in step["waits_for"]["awaits"]] == ["reply", "meeting"]
    flow.admit(flow.change({"lifecyclestage": "customer"}))
    card = client.get(f"/v1/runs/{run_id}", headers=bearer(token)).get_json()
    assert card["run"]["status"] == "goal_met"
    (step,) = card["steps"]
    assert step["status"] == "skipped" and step["outcome_code"] == "GOAL_MET"
    assert step["waits_for"]["resumed_by"] == "goal"


def test_onceflows_own_echo_cancels_nothing(db: Database) -> None:
    flow = Stoppable(db)
    run_id = flow.run()
    with db.transaction() as tx:
        record_echo_marker(
            tx,
            connection_id=flow.conn,
            object_type="contact",
            object_id="101",
            fields={"hs_lead_status": "UNQUALIFIED"},
            step_id=None,
        )
    flow.admit(flow.change({"hs_lead_status": "UNQUALIFIED"}))
    assert _run(db, run_id)["status"] == "running"


def _at_a_barrier(db: Database, make_event: Any) -> tuple[Stoppable, str, int, list[Any]]:
    """Start a run whose first step reaches a barrier as it runs; at the barrier, the event
    `make_event(flow)` is admitted while the step settles. (flow, run id, event id, results)."""
    barrier = threading.Barrier(2)

    def racing(ctx: BlockContext, config: Any) -> BlockResult:
        if ctx.step_key == "touch":
            barrier.wait()
        return BlockResult(output={"raced": ctx.step_key})

    flow = Stoppable(db, racing)
    run_id, step_id = flow.start()
    event_id = make_event(flow)
    results: list[Any] = []

    def advancing() -> None:
        results.append(advance_step(db, step_id, lookup=flow.lookup, dispatch=flow.q, config=LEASE))

    thread = threading.Thread(target=advancing)
    thread.start()
    barrier.wait()
    flow.admit(event_id)
    thread.join(30)
    flow.drain()
    return flow, run_id, event_id, results


@pytest.mark.parametrize("repeat", range(3))
def test_a_cancel_on_event_racing_a_steps_settle_lets_it_finish_and_starts_nothing(
    db: Database, repeat: int
) -> None:
    _, run_id, stop, results = _at_a_barrier(
        db, lambda f: f.change({"hs_lead_status": "UNQUALIFIED"})
    )
    assert [r.status for r in results] == ["succeeded"]
    run = _run(db, run_id)
    assert run["status"] == "cancelled" and run["cancelled_by"] == f"event {stop}"
    journal = _journal(db, run_id)
    assert journal["touch"]["status"] == "succeeded"
    assert journal["touch"]["output"] == {"raced": "touch"}
    # Whichever committed first: `pause` was never created, or created and then skipped.
    assert set(journal) <= {"touch", "pause"}
    assert journal.get("pause", {"status": "skipped"})["status"] == "skipped"


@pytest.mark.parametrize("repeat", range(3))
def test_a_goal_met_while_a_step_runs_lets_it_finish_and_starts_nothing(
    db: Database, repeat: int
) -> None:
    _, run_id, _, results = _at_a_barrier(db, lambda f: f.change({"lifecyclestage": "customer"}))
    assert [r.status for r in results] == ["succeeded"]
    run = _run(db, run_id)
    assert run["status"] == "goal_met"
    journal = _journal(db, run_id)
    assert journal["touch"]["status"] == "succeeded"
    assert set(journal) <= {"touch", "pause"}
    assert journal.get("pause", {"status": "skipped"})["status"] == "skipped"


STOPS = """\
name: wf
tenant: acme
trigger:
  events: [hubspot.contact.created]
{stops}
steps:
  - id: a
    type: end
"""


@pytest.mark.parametrize(
    ("stops", "where", "position", "says"),
    [
        (
            "cancel_on:\n  - {event: hubspot.contact.property_chaned}\n",
            "cancel_on[0].event",
            (6, 13),
            "did you mean 'hubspot.contact.property_changed'",
        ),
        (
            "cancel_on:\n  - {event: hubspot.contact.deleted, when: 'steps.a.output.x'}\n",
            "cancel_on[0].when",
            (6, 44),
            "cannot read `steps`",
        ),
        (
            "cancel_on:\n  - {event: hubspot.contact.deleted, when: 'event.x =='}\n",
            "cancel_on[0].when",
            (6, 44),
            "does not compile",
        ),
        ("goal: 'run.id == \"x\"'\n", "goal", (5, 7), "cannot read `run`"),
        ("cancel_on: []\n", "cancel_on", (5, 12), "at least 1"),
    ],
)
def test_cancel_on_and_goal_are_judged_where_they_are_written(
    stops: str, where: str, position: tuple[int, int], says: str
) -> None:
    report = validate_text(STOPS.format(stops=stops.rstrip("\n")), "wf.yaml")
    found = [p for p in report.problems if p.severity == "error"]
    assert [p.where for p in found] == [where], [str(p) for p in found]
    assert (found[0].line, found[0].column) == position, str(found[0])
    assert says in found[0].message, found[0].message


def test_cancel_on_and_goal_validate_and_cancel_on_is_listened_to() -> None:
    import yaml

    from shared.workflows import listening

    text = STOPS.format(
        stops=textwrap.dedent(f"""\
            cancel_on:
              - event: {CHANGED}
                when: '{UNQUALIFIED}'
            goal: '{CUSTOMER}'""")
    )
    report = validate_text(text, "wf.yaml")
    assert report.ok, [str(p) for p in report.problems]
    (listener,) = [x for x in listening.listeners(yaml.safe_load(text)) if x.where == "cancel_on"]
    assert listener.event == CHANGED and listener.fields == ("hs_lead_status",)


def test_the_runs_an_event_may_stop_are_found_through_the_running_runs_index(
    db: Database,
) -> None:
    """A record with thousands of finished runs: admission reads its running ones through the
    partial index (the plan names it), so a record's history costs nothing per event."""
    from shared.core import queries

    flow = Stoppable(db)
    run_id = flow.run()
    customer = flow.change({"lifecyclestage": "customer"})
    with db.transaction() as tx:
        tx.execute(
            "INSERT INTO workflow_runs (id, tenant_id, workflow_id, version_id, start_key,"
            " event_id, record_key, dedup_mode, namespace, trigger_payload, payload_truncated,"
            " lineage_root, trigger_record, status, finished_at)"
            " SELECT g.id, r.tenant_id, r.workflow_id, r.version_id, 'old:' || g.i, r.event_id,"
            " r.record_key, r.dedup_mode, r.namespace, r.trigger_payload, r.payload_truncated,"
            " g.id, r.trigger_record, 'succeeded', now()"
            " FROM workflow_runs r,"
            " LATERAL (SELECT gen_random_uuid() AS id, i FROM generate_series(1, 5000) AS i) g"
            " WHERE r.id = :r",
            r=run_id,
        )
        tx.execute("ANALYZE workflow_runs")
        rows = tx.all(
            "EXPLAIN " + queries.load("admission")["admission_context"].text,
            event_id=customer,
            start_key="x",
            cached_versions=[],
            take_locks=False,
            echo_skew_seconds=5.0,
            max_waits=1000,
        )
    plan = "\n".join(str(next(iter(r.values()))) for r in rows)
    assert "workflow_runs_running_record" in plan, plan
