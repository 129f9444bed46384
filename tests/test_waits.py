"""`wait_for` and the park-and-resume mechanism (shared/steps/parks.py) against real Postgres:
a matching event admitted later resumes the wait once and is its output; the deadline's
fail / continue / goto; the lookback; an event against the deadline and 32 deliveries against
10 waits at a barrier; a cancel of a waiting run; and the indexes that keep parked runs free
for admission and the sweep (EXPLAIN)."""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import pytest

from shared.admission.admit import admit_event
from shared.core import queries
from shared.core.db import Database
from shared.core.duty import SweepConfig, SweepReport
from shared.steps import parks
from shared.steps.cancel import cancel_run
from shared.steps.repairs import wake_due_steps
from shared.sweep.loop import run_sweep
from tests.admission_support import bind_workflow, emit_event, make_connection, make_tenant
from tests.ops_support import (
    Dispatched,
    bearer,
    mint,
)
from tests.steps_blocks import Recorder, block_lookup
from tests.test_steps_engine import LEASE, Queue, make_past

STARTS = "hubspot.contact.created"
REPLIED = "hubspot.contact.property_changed"
REPLY = (
    'has(event.changed_fields.hs_lead_status) && event.changed_fields.hs_lead_status == "CONNECTED"'
)


def _workflow(
    on_timeout: Any = "fail", lookback: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    wait: dict[str, Any] = {
        "event": REPLIED,
        "when": REPLY,
        "timeout": {"days": 3},
        "on_timeout": on_timeout,
    }
    if lookback is not None:
        wait["lookback"] = lookback
    steps = [
        {"id": "wait_reply", "type": "wait_for", "config": wait, "next": "thank"},
        {"id": "thank", "type": "end"},
    ]
    if isinstance(on_timeout, dict):
        steps.append({"id": "nudge", "type": "end"})
    return steps


class Flow:
    """A tenant, a connection and a bound workflow; admits events and drives steps."""

    def __init__(self, db: Database, steps: list[dict[str, Any]], name: str = "reengage") -> None:
        self.db = db
        self.rec = Recorder()
        self.lookup = block_lookup(self.rec)
        self.q = Queue()
        if not _exists(db, "SELECT 1 FROM tenants WHERE id = 'acme'"):
            make_tenant(db)
        self.conn = make_connection(db)
        self.workflow_id = bind_workflow(
            db, name, events=(STARTS,), dedup="every_time", steps=steps
        )

    def start(self, object_id: str = "101") -> str:
        event = emit_event(
            self.db, connection_id=self.conn, event_type=STARTS, object_id=object_id, changed={}
        )
        result = admit_event(self.db, event, publish=self.q)
        (outcome,) = result.outcomes
        assert outcome.run_id is not None
        self.drain()
        return outcome.run_id

    def event(self, changed: dict[str, Any], object_id: str = "101") -> int:
        return emit_event(
            self.db,
            connection_id=self.conn,
            event_type=REPLIED,
            object_id=object_id,
            changed=changed,
            payload={"objectId": object_id, **changed},
        )

    def admit(self, event_id: int) -> list[str]:
        return list(admit_event(self.db, event_id, publish=self.q).dispatched)

    def drain(self) -> None:
        self.q.drain(self.db, self.lookup)


def _request(record: Any) -> Any:
    """The park a wait_for of `_workflow()` asks for on the run's record."""
    from datetime import UTC, datetime, timedelta

    from shared.blocks.base import ParkRequest

    return ParkRequest(
        kind="event",
        deadline=datetime.now(UTC) + timedelta(days=3),
        on_timeout="fail",
        event_type=REPLIED,
        record_key=record["key"],
        condition=REPLY,
        scope={},
    )


def _exists(db: Database, query: str) -> bool:
    with db.transaction() as tx:
        return tx.one(query) is not None


def _steps(db: Database, run_id: str) -> dict[str, dict[str, Any]]:
    with db.transaction() as tx:
        rows = tx.all("SELECT * FROM workflow_steps WHERE run_id = :r", r=run_id)
    return {r["step_key"]: r for r in rows}


def _park(db: Database, run_id: str) -> dict[str, Any]:
    with db.transaction() as tx:
        row = tx.one("SELECT * FROM step_parks WHERE run_id = :r", r=run_id)
    assert row is not None
    return row


def _run_status(db: Database, run_id: str) -> str:
    with db.transaction() as tx:
        return str(tx.scalar("SELECT status FROM workflow_runs WHERE id = :r", r=run_id))


def test_a_matching_event_resumes_the_wait_once_and_is_its_output(db: Database) -> None:
    flow = Flow(db, _workflow())
    run_id = flow.start()
    wait = _steps(db, run_id)["wait_reply"]
    park = _park(db, run_id)
    # The park row holds the conditions and the deadline the step row carries.
    assert wait["status"] == "waiting_for_event" and wait["park_id"] == park["id"]
    assert wait["wake_at"] == park["deadline"] and park["event_type"] == REPLIED
    assert park["record_key"] == f"{flow.conn}:contact:101" and park["condition"] == REPLY

    # Not the reply it waits for, and the reply on another record: nothing moves.
    assert flow.admit(flow.event({"hs_lead_status": "OPEN"})) == []
    assert flow.admit(flow.event({"hs_lead_status": "CONNECTED"}, object_id="202")) == []
    assert _steps(db, run_id)["wait_reply"]["status"] == "waiting_for_event"

    reply = flow.event({"hs_lead_status": "CONNECTED"})
    assert flow.admit(reply) == [str(wait["id"])]
    assert flow.admit(reply) == []  # a redelivery resumes nothing
    flow.drain()
    journal = _steps(db, run_id)
    done = journal["wait_reply"]
    assert done["status"] == "succeeded" and done["outcome_code"] == "EVENT_RECEIVED"
    assert done["output"]["event"]["id"] == reply
    assert done["output"]["trigger"] == {"objectId": "101", "hs_lead_status": "CONNECTED"}
    assert done["output"]["resumed"]["by"] == "event"
    assert set(journal) == {"wait_reply", "thank"}
    assert journal["thank"]["status"] == "succeeded" and _run_status(db, run_id) == "succeeded"
    park = _park(db, run_id)
    assert (park["resumed_by"], park["resumed_event_id"]) == ("event", reply)


@pytest.mark.parametrize(
    ("on_timeout", "step_status", "ran", "run_status"),
    [
        ({"goto": "nudge"}, "succeeded", "nudge", "succeeded"),
        ("continue", "succeeded", "thank", "succeeded"),
        ("fail", "failed", None, "failed"),
    ],
)
def test_at_the_deadline_the_wait_fails_continues_or_jumps(
    db: Database, on_timeout: Any, step_status: str, ran: str | None, run_status: str
) -> None:
    flow = Flow(db, _workflow(on_timeout))
    run_id = flow.start()
    make_past(db, run_id)
    run_sweep(db, 0, duties=[], dispatch=flow.q)
    flow.drain()
    journal = _steps(db, run_id)
    wait = journal["wait_reply"]
    assert wait["status"] == step_status and wait["outcome_code"] == "WAIT_TIMED_OUT"
    assert set(journal) - {"wait_reply"} == ({ran} if ran else set())
    if isinstance(on_timeout, dict):
        # The jump is journaled with the settle, so a replay follows the same edge.
        assert wait["branch_choice"] == "nudge"
    assert _run_status(db, run_id) == run_status
    assert _park(db, run_id)["resumed_by"] == "deadline"
    # A reply after the deadline resumes nothing.
    assert flow.admit(flow.event({"hs_lead_status": "CONNECTED"})) == []


def test_lookback_counts_an_event_recorded_just_before_the_wait(db: Database) -> None:
    flow = Flow(db, _workflow(lookback={"hours": 1}), name="with-lookback")
    early = flow.event({"hs_lead_status": "CONNECTED"})
    flow.admit(early)  # admitted before any wait existed
    run_id = flow.start()
    flow.drain()
    wait = _steps(db, run_id)["wait_reply"]
    assert wait["status"] == "succeeded" and wait["output"]["event"]["id"] == early


def test_without_lookback_an_earlier_event_does_not_count(db: Database) -> None:
    flow = Flow(db, _workflow())
    flow.admit(flow.event({"hs_lead_status": "CONNECTED"}))
    run_id = flow.start()
    assert _steps(db, run_id)["wait_reply"]["status"] == "waiting_for_event"


def test_an_event_after_the_deadline_does_not_resume_the_wait_before_the_sweep_runs(
    db: Database,
) -> None:
    """The deadline binds the resume, not only the sweep: a reply admitted after it (the
    sweep has not run yet) resumes nothing, and the sweep then takes `on_timeout`'s path."""
    flow = Flow(db, _workflow({"goto": "nudge"}))
    run_id = flow.start()
    make_past(db, run_id)
    assert flow.admit(flow.event({"hs_lead_status": "CONNECTED"})) == []
    assert _steps(db, run_id)["wait_reply"]["status"] == "waiting_for_event"
    run_sweep(db, 0, duties=[], dispatch=flow.q)
    flow.drain()
    journal = _steps(db, run_id)
    assert set(journal) == {"wait_reply", "nudge"}
    assert journal["wait_reply"]["outcome_code"] == "WAIT_TIMED_OUT"
    assert _park(db, run_id)["resumed_by"] == "deadline"


def _event_against_the_sweep(
    db: Database, reply: int, head_start: float
) -> tuple[list[str], list[str]]:
    """Admit `reply` and run the sweep's wake-up at once from a barrier, the sweep held back
    `head_start` seconds; (steps the event resumed, steps the deadline resumed)."""
    import time

    barrier = threading.Barrier(2)
    by_event: list[str] = []
    by_deadline: list[str] = []

    def event() -> None:
        barrier.wait()
        by_event.extend(admit_event(db, reply, publish=lambda _: None).dispatched)

    def deadline() -> None:
        barrier.wait()
        time.sleep(head_start)
        wake_due_steps(db, SweepConfig(), by_deadline.extend, SweepReport())

    threads = [threading.Thread(target=event), threading.Thread(target=deadline)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return by_event, by_deadline


def test_after_the_deadline_an_event_and_the_sweep_at_a_barrier_the_deadline_wins(
    db: Database,
) -> None:
    """A reply admitted and the sweep run at once, after the wait's deadline: the wait is
    resumed exactly once, always by its deadline, and the run takes the timeout's path; the
    event's resume, losing, says who won. The sweep is one statement and the admission
    several, so the sweep is held back a little longer each time (0 to 80 ms after the
    barrier), letting the event come first too."""
    flow = Flow(db, _workflow({"goto": "nudge"}))
    for head_start in (0.0, 0.01, 0.02, 0.04, 0.08):
        run_id = flow.start()
        step_id = _steps(db, run_id)["wait_reply"]["id"]
        reply = flow.event({"hs_lead_status": "CONNECTED"})
        make_past(db, run_id)
        by_event, by_deadline = _event_against_the_sweep(db, reply, head_start)
        assert (by_event, by_deadline) == ([], [str(step_id)])
        park = _park(db, run_id)
        assert park["resumed_by"] == "deadline" and park["resumed_event_id"] is None
        with db.transaction() as tx:
            again = parks.resume_park(tx, park["id"], by="event", output={}, event_id=reply)
        assert not again.moved
        assert again.why_not is not None and again.why_not.startswith(
            "already resumed by its deadline at "
        )
        flow.q(by_deadline)
        flow.drain()
        journal = _steps(db, run_id)
        assert set(journal) == {"wait_reply", "nudge"}
        assert journal["wait_reply"]["outcome_code"] == "WAIT_TIMED_OUT"


def test_32_deliveries_of_one_event_to_10_waiting_runs_resume_each_once(db: Database) -> None:
    flow = Flow(db, _workflow())
    runs = [flow.start() for _ in range(10)]
    waits = {str(_steps(db, r)["wait_reply"]["id"]) for r in runs}
    reply = flow.event({"hs_lead_status": "CONNECTED"})
    barrier = threading.Barrier(32)
    resumed: list[str] = []
    lock = threading.Lock()

    def deliver() -> None:
        barrier.wait()
        ids = admit_event(db, reply, publish=lambda _: None).dispatched
        with lock:
            resumed.extend(ids)

    threads = [threading.Thread(target=deliver) for _ in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(resumed) == sorted(waits)
    with db.transaction() as tx:
        assert (
            tx.scalar("SELECT count(*) FROM step_parks WHERE resumed_event_id = :e", e=reply) == 10
        )


def test_cancelling_a_waiting_run_closes_its_wait(db: Database) -> None:
    flow = Flow(db, _workflow())
    run_id = flow.start()
    park = _park(db, run_id)
    outcome = cancel_run(db, run_id, by="alice", reason="lost deal")
    assert outcome is not None and outcome.skipped_steps == ("wait_reply",)
    assert _steps(db, run_id)["wait_reply"]["status"] == "skipped"
    assert _park(db, run_id)["resumed_by"] == "cancel"
    assert flow.admit(flow.event({"hs_lead_status": "CONNECTED"})) == []
    with db.transaction() as tx:
        late = parks.resume_park(tx, park["id"], by="event", output={}, event_id=None)
    assert not late.moved and late.why_not is not None
    assert late.why_not.startswith("its run was cancelled at ")


def _plan(db: Database, statement: str, **params: Any) -> str:
    with db.transaction() as tx:
        rows = tx.all("EXPLAIN " + statement, **params)
    return "\n".join(str(next(iter(r.values()))) for r in rows)


def test_deadlines_and_offers_are_found_through_indexes_whatever_is_parked(db: Database) -> None:
    """Thousands of parked waits: the sweep's due query and admission's offer read indexes
    (the plan names them), so parked runs cost nothing per sweep or per event."""
    flow = Flow(db, _workflow())
    run_id = flow.start()
    with db.transaction() as tx:
        tx.execute(
            "INSERT INTO workflow_steps (run_id, step_key, node_id, block_type)"
            " SELECT :r, 'w[' || i || ']', 'wait_reply', 'wait_for'"
            " FROM generate_series(1, 3000) AS i",
            r=run_id,
        )
        tx.execute(
            "INSERT INTO step_parks (step_id, run_id, tenant_id, kind, deadline, on_timeout,"
            " event_type, record_key, condition)"
            " SELECT s.id, s.run_id, 'acme', 'event', now() + interval '3 days', 'fail', :e,"
            " 'c:contact:' || s.step_key, 'true'"
            " FROM workflow_steps s WHERE s.run_id = :r AND s.step_key LIKE 'w[%'",
            r=run_id,
            e=REPLIED,
        )
        tx.execute(
            "UPDATE workflow_steps s SET status = 'waiting_for_event', park_id = p.id,"
            " park_kind = 'event', wake_at = p.deadline"
            " FROM step_parks p WHERE p.step_id = s.id AND s.step_key LIKE 'w[%'"
        )
        tx.execute("ANALYZE workflow_steps")
        tx.execute("ANALYZE step_parks")
    due = _plan(db, queries.load("steps")["steps_wake_due"].text, batch=500)
    assert "workflow_steps_due" in due, due
    offer = _plan(
        db,
        queries.load("admission")["admission_context"].text,
        event_id=flow.event({"hs_lead_status": "CONNECTED"}),
        start_key="x",
        cached_versions=[],
        take_locks=False,
        echo_skew_seconds=5.0,
        max_waits=1000,
    )
    assert "step_parks_open_event_waits" in offer, offer


def _expire_leases(db: Database, run_id: str) -> None:
    with db.transaction() as tx:
        tx.execute(
            "UPDATE workflow_steps SET lease_expires_at = now() - interval '1 second'"
            " WHERE run_id = :r AND status = 'running'",
            r=run_id,
        )


def test_a_crash_after_the_park_row_and_before_parking_parks_on_the_same_row(
    db: Database,
) -> None:
    """The rows such a crash leaves: the park row committed, the step still running under a
    lease that expires. The sweep reclaims the step; its next attempt gets the same park row
    back (the first deadline holds) and parks on it, once."""
    from shared.steps.claim import claim_step

    flow = Flow(db, _workflow())
    event = emit_event(db, connection_id=flow.conn, event_type=STARTS, object_id="101", changed={})
    (step_id,) = admit_event(db, event, publish=lambda _: None).dispatched
    step = claim_step(db, step_id, LEASE)
    assert step is not None
    first = parks.open_park(
        db,
        step_id=step.id,
        run_id=step.run_id,
        tenant_id=step.tenant_id,
        park=_request(step.trigger_record),
    )
    run_id = step.run_id
    _expire_leases(db, run_id)
    run_sweep(db, 0, duties=[], dispatch=flow.q)
    flow.drain()
    wait = _steps(db, run_id)["wait_reply"]
    assert wait["status"] == "waiting_for_event" and wait["attempt"] == 2
    assert wait["park_id"] == first.id and wait["wake_at"] == first.deadline
    with db.transaction() as tx:
        assert tx.scalar("SELECT count(*) FROM step_parks WHERE run_id = :r", r=run_id) == 1


def test_a_crash_after_the_deadline_chose_goto_lands_on_the_same_step(db: Database) -> None:
    """The deadline's resume journals the goto in the step row; an executor that claimed the
    step and died before settling leaves it running. The reclaimed step settles from the
    journal and takes the same edge, once."""
    from shared.steps.claim import claim_step

    flow = Flow(db, _workflow({"goto": "nudge"}))
    run_id = flow.start()
    make_past(db, run_id)
    woken: list[str] = []
    run_sweep(db, 0, duties=[], dispatch=woken.extend)
    (step_id,) = woken
    assert _steps(db, run_id)["wait_reply"]["output"]["resumed"]["goto"] == "nudge"
    assert claim_step(db, step_id, LEASE) is not None  # …and the process dies here
    _expire_leases(db, run_id)
    run_sweep(db, 0, duties=[], dispatch=flow.q)
    flow.drain()
    journal = _steps(db, run_id)
    assert set(journal) == {"wait_reply", "nudge"}
    assert journal["wait_reply"]["branch_choice"] == "nudge"
    # Parked on attempt 1, claimed on 2 by the executor that died, settled on 3.
    assert journal["wait_reply"]["attempt"] == 3


def test_a_wait_inside_a_foreach_body_waits_per_item(db: Database) -> None:
    """Each iteration of a foreach whose body is a wait_for parks on its own row; one event
    resumes every item whose condition it satisfies, and the loop goes on once all did."""
    body = {
        "event": REPLIED,
        "when": "event.changed_fields.hs_lead_status == iteration.item",
        "timeout": {"days": 1},
    }
    flow = Flow(
        db,
        [
            {
                "id": "each",
                "type": "foreach",
                "config": {
                    "items": ["CONNECTED", "OPEN"],
                    "do": "wait_item",
                    "max_items": 5,
                    "concurrency": 2,
                },
                "next": "done",
            },
            {"id": "wait_item", "type": "wait_for", "config": body},
            {"id": "done", "type": "end"},
        ],
        name="wait-per-item",
    )
    run_id = flow.start()
    journal = _steps(db, run_id)
    assert {journal[k]["status"] for k in ("wait_item[0]", "wait_item[1]")} == {"waiting_for_event"}
    first = flow.admit(flow.event({"hs_lead_status": "CONNECTED"}))
    assert first == [str(journal["wait_item[0]"]["id"])]
    flow.drain()
    assert "done" not in _steps(db, run_id)
    assert flow.admit(flow.event({"hs_lead_status": "OPEN"})) == [
        str(journal["wait_item[1]"]["id"])
    ]
    flow.drain()
    journal = _steps(db, run_id)
    assert journal["done"]["status"] == "succeeded" and _run_status(db, run_id) == "succeeded"
    outputs = journal["each"]["output"]["outputs"]
    assert [o["trigger"]["hs_lead_status"] for o in outputs] == ["CONNECTED", "OPEN"]


def _parks(db: Database, run_id: str) -> list[dict[str, Any]]:
    with db.transaction() as tx:
        return tx.all("SELECT * FROM step_parks WHERE run_id = :r ORDER BY id", r=run_id)


def test_a_retried_wait_waits_again_on_a_new_park_and_an_event_resumes_it(
    db: Database, client: Any, dispatched: Dispatched
) -> None:
    """A wait that timed out fails its run; the ops retry starts the step again, and the
    retried wait parks on a new park row (a fresh deadline, open to events) rather than on
    the closed one: a reply admitted after the retry resumes it and the run goes on."""
    flow = Flow(db, _workflow())
    run_id = flow.start()
    make_past(db, run_id)
    run_sweep(db, 0, duties=[], dispatch=flow.q)
    flow.drain()
    assert _run_status(db, run_id) == "failed"
    assert _steps(db, run_id)["wait_reply"]["outcome_code"] == "WAIT_TIMED_OUT"
    (first,) = _parks(db, run_id)

    retried = client.post(
        f"/v1/runs/{run_id}/retry",
        json={"reason": "the lead may still answer"},
        headers=bearer(mint(db, "acme", label="carol")),
    )
    assert retried.status_code == 200, retried.get_json()
    assert _steps(db, run_id)["wait_reply"]["park_id"] is None  # it waits on nothing yet
    flow.q(dispatched.ids)
    flow.drain()
    wait = _steps(db, run_id)["wait_reply"]
    old, new = _parks(db, run_id)
    assert old["id"] == first["id"] and old["resumed_by"] == "deadline"
    assert wait["status"] == "waiting_for_event" and wait["park_id"] == new["id"]
    assert new["resumed_at"] is None and wait["wake_at"] == new["deadline"]
    assert new["deadline"] > old["created_at"] + timedelta(days=2)  # a fresh deadline

    reply = flow.event({"hs_lead_status": "CONNECTED"})
    assert flow.admit(reply) == [str(wait["id"])]
    flow.drain()
    journal = _steps(db, run_id)
    assert journal["wait_reply"]["status"] == "succeeded"
    assert journal["wait_reply"]["output"]["event"]["id"] == reply
    assert journal["thank"]["status"] == "succeeded" and _run_status(db, run_id) == "succeeded"
    assert _parks(db, run_id)[1]["resumed_event_id"] == reply


class _ParkWindow:
    """Holds an executor between its park row's commit and its step's parking (wrapping the
    real `open_park` the settle calls), while another thread records an event whose
    transaction began before the park's (so its `created_at` is earlier than the park's) and
    commits it after the park row was committed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, then: threading.Barrier | None) -> None:
        from shared.steps import settle

        self.event_begun = threading.Event()
        self.park_committed = threading.Event()
        self.admitted = threading.Event()
        real = settle.open_park

        def open_park(*args: Any, **kwargs: Any) -> Any:
            assert self.event_begun.wait(30)
            opened = real(*args, **kwargs)
            self.park_committed.set()
            if then is None:
                assert self.admitted.wait(30)  # the event is admitted before the step parks
            else:
                then.wait(30)  # the admission and the parking race
            return opened

        monkeypatch.setattr(settle, "open_park", open_park)

    def record_event(self, flow: Flow) -> int:
        from shared.ingest.outbox import TriggerEvent, emit

        changed = {"hs_lead_status": "CONNECTED"}
        with flow.db.transaction() as tx:
            event_id = emit(
                tx,
                TriggerEvent(
                    tenant_id="acme",
                    event_type=REPLIED,
                    payload={"objectId": "101", **changed},
                    connection_id=flow.conn,
                    record_object_type="contact",
                    record_object_id="101",
                    changed_fields=changed,
                ),
            )
            self.event_begun.set()
            assert self.park_committed.wait(30)
        assert event_id is not None
        return event_id


def _race_event_with_parking(
    db: Database, flow: Flow, monkeypatch: pytest.MonkeyPatch, then: threading.Barrier | None
) -> tuple[str, int, list[str]]:
    """Start a run, then park its wait while an event that matches it is admitted in the
    window between the park row's commit and the parking. (run id, event id, step ids the
    admission resumed)."""
    from shared.steps.advance import advance_step

    start = emit_event(db, connection_id=flow.conn, event_type=STARTS, object_id="101", changed={})
    admitted = admit_event(db, start, publish=lambda _: None)
    (step_id,) = admitted.dispatched
    run_id = admitted.outcomes[0].run_id
    assert run_id is not None
    resumed: list[str] = []
    event: list[int] = []
    with monkeypatch.context() as patch:
        window = _ParkWindow(patch, then)

        def executor() -> None:
            advance_step(db, step_id, lookup=flow.lookup, dispatch=flow.q, config=LEASE)

        def admission() -> None:
            event.append(window.record_event(flow))
            if then is not None:
                then.wait(30)
            resumed.extend(admit_event(db, event[0], publish=lambda _: None).dispatched)
            window.admitted.set()

        threads = [threading.Thread(target=executor), threading.Thread(target=admission)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    return run_id, event[0], resumed


def test_an_event_admitted_between_the_park_and_the_parking_resumes_the_wait_once(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The event's admission finds the park row but the step still running; the step parks
    a moment later and is resumed by that event, exactly once."""
    flow = Flow(db, _workflow())
    run_id, reply, resumed = _race_event_with_parking(db, flow, monkeypatch, None)
    assert resumed == []  # the step was not waiting yet: the parking resumes it
    flow.q.ids.extend(resumed)
    flow.drain()
    journal = _steps(db, run_id)
    assert journal["wait_reply"]["status"] == "succeeded"
    assert journal["wait_reply"]["output"]["event"]["id"] == reply
    assert journal["thank"]["status"] == "succeeded" and _run_status(db, run_id) == "succeeded"
    (park,) = _parks(db, run_id)
    assert (park["resumed_by"], park["resumed_event_id"]) == ("event", reply)


def test_an_event_admitted_as_the_step_parks_resumes_the_wait_once_at_a_barrier(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The admission of a matching event and the parking of the step, released together at
    a barrier (either may commit first), several times: each wait is resumed by the event
    exactly once, and its run goes on once."""
    flow = Flow(db, _workflow())
    for _ in range(6):
        run_id, reply, resumed = _race_event_with_parking(
            db, flow, monkeypatch, threading.Barrier(2)
        )
        flow.q.ids.extend(resumed)
        flow.drain()
        journal = _steps(db, run_id)
        assert journal["wait_reply"]["status"] == "succeeded", journal["wait_reply"]
        assert journal["wait_reply"]["output"]["event"]["id"] == reply
        assert set(journal) == {"wait_reply", "thank"} and _run_status(db, run_id) == "succeeded"
        (park,) = _parks(db, run_id)
        assert (park["resumed_by"], park["resumed_event_id"]) == ("event", reply)


def _mark_echo(flow: Flow, fields: dict[str, Any]) -> None:
    """What a `crm.update` of the record commits before its request leaves."""
    from shared.ingest.echo import record_echo_marker

    with flow.db.transaction() as tx:
        record_echo_marker(
            tx,
            connection_id=flow.conn,
            object_type="contact",
            object_id="101",
            fields=fields,
            step_id=None,
        )


def test_onceflows_own_echo_does_not_resume_a_wait(db: Database) -> None:
    """The webhook onceflow's own write causes is refused as an echo by admission, and is no
    answer to a wait either; a change that is not all ours still is."""
    flow = Flow(db, _workflow())
    run_id = flow.start()
    _mark_echo(flow, {"hs_lead_status": "CONNECTED"})
    assert flow.admit(flow.event({"hs_lead_status": "CONNECTED"})) == []
    assert _steps(db, run_id)["wait_reply"]["status"] == "waiting_for_event"
    theirs = flow.event({"hs_lead_status": "CONNECTED", "notes": "called back"})
    assert flow.admit(theirs) == [str(_steps(db, run_id)["wait_reply"]["id"])]
    flow.drain()
    assert _steps(db, run_id)["wait_reply"]["output"]["event"]["id"] == theirs


def test_onceflows_own_echo_is_not_found_by_a_waits_lookback(db: Database) -> None:
    flow = Flow(db, _workflow(lookback={"hours": 1}), name="with-lookback")
    _mark_echo(flow, {"hs_lead_status": "CONNECTED"})
    flow.admit(flow.event({"hs_lead_status": "CONNECTED"}))  # before the wait parks
    run_id = flow.start()
    assert _steps(db, run_id)["wait_reply"]["status"] == "waiting_for_event"


def test_a_lookback_asks_the_author_before_the_markers(db: Database) -> None:
    """On a provider whose events name their author (Pipedrive: `change_source`, `user_id`),
    a change made in the CRM's UI by the connection's own user, with the value onceflow just
    wrote, is a person's answer, not an echo: the lookback finds it, as admission would have
    offered it (shared/ingest/echo.py `authored_elsewhere`). It was skipped as an echo
    before the lookback read the author."""
    flow = Flow(db, _workflow(lookback={"hours": 1}), name="with-lookback")
    with db.transaction() as tx:
        tx.execute(
            "UPDATE connections SET provider = 'pipedrive', provider_user_id = '42'"
            " WHERE id = CAST(:c AS uuid)",
            c=flow.conn,
        )
    _mark_echo(flow, {"hs_lead_status": "CONNECTED"})
    person = emit_event(
        db,
        connection_id=flow.conn,
        event_type=REPLIED,
        changed={"hs_lead_status": "CONNECTED"},
        author_id="42",
        author_source="app",
    )
    flow.admit(person)  # before the wait parks
    run_id = flow.start()
    wait = _steps(db, run_id)["wait_reply"]
    assert wait["status"] == "succeeded", wait
    assert wait["output"]["event"]["id"] == person
