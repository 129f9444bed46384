"""Waits of several events (`events`, `mode: any | all`) and correlated waits (`correlate`),
issue 31 items 1 and 2 (shared/steps/awaits.py), against real Postgres: which event resumed
an `any` wait, an `all` wait collecting each, a correlation beyond the run's record (and its
number/string equality), the races at a barrier — two events of an `any` wait and the
deadline, the last event of an `all` wait and the deadline — each resuming the wait exactly
once, an event admitted before the step parked, the single-event form untouched, and the
correlation lookup served by its index with 10,000 parked waits (EXPLAIN)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from shared.admission.admit import admit_event
from shared.blocks.waits import await_key
from shared.core import queries
from shared.core.db import Database
from shared.core.duty import SweepConfig, SweepReport
from shared.steps import parks, settle
from shared.steps.repairs import wake_due_steps
from tests.admission_support import emit_event
from tests.test_steps_engine import make_past
from tests.test_waits import REPLIED, REPLY, STARTS, Flow, _park, _steps

ASSOCIATED = "hubspot.contact.association_changed"
DEAL_CHANGED = "hubspot.deal.property_changed"
CUSTOMER = 'has(record.lifecyclestage) && record.lifecyclestage == "customer"'


def _wait(**config: Any) -> list[dict[str, Any]]:
    wait = {"timeout": {"days": 3}, "on_timeout": {"goto": "nudge"}, **config}
    return [
        {"id": "wait", "type": "wait_for", "config": wait, "next": "thank"},
        {"id": "thank", "type": "end"},
        {"id": "nudge", "type": "end"},
    ]


ANY = _wait(
    mode="any",
    events=[
        {"event": REPLIED, "name": "reply", "when": REPLY},
        {"event": REPLIED, "name": "customer", "when": CUSTOMER},
    ],
)
ALL = _wait(
    mode="all",
    events=[
        {"event": REPLIED, "name": "reply", "when": REPLY},
        {"event": ASSOCIATED, "name": "meeting"},
    ],
)
DEAL = _wait(
    event=DEAL_CHANGED,
    when='has(record.dealstage) && record.dealstage == "closedwon"',
    correlate={"event": "record.id", "run": "trigger.dealId"},
)


def _associated(flow: Flow, object_id: str = "101") -> int:
    return emit_event(
        flow.db, connection_id=flow.conn, event_type=ASSOCIATED, object_id=object_id, changed={}
    )


def _deal_won(flow: Flow, deal_id: str) -> int:
    return emit_event(
        flow.db,
        connection_id=flow.conn,
        event_type=DEAL_CHANGED,
        object_type="deal",
        object_id=deal_id,
        changed={"dealstage": "closedwon"},
    )


def _start_with(flow: Flow, payload: dict[str, Any], object_id: str = "101") -> str:
    event = emit_event(
        flow.db,
        connection_id=flow.conn,
        event_type=STARTS,
        object_id=object_id,
        changed={},
        payload=payload,
    )
    (outcome,) = admit_event(flow.db, event, publish=flow.q).outcomes
    assert outcome.run_id is not None
    flow.drain()
    return outcome.run_id


def test_an_any_wait_resumes_on_the_first_match_and_says_which(db: Database) -> None:
    flow = Flow(db, ANY)
    run_id = flow.start()
    wait = _steps(db, run_id)["wait"]
    assert wait["status"] == "waiting_for_event"
    assert flow.admit(flow.event({"hs_lead_status": "NEW"})) == []  # neither `when` holds
    customer = flow.event({"lifecyclestage": "customer"})
    assert flow.admit(customer) == [str(wait["id"])]
    assert flow.admit(flow.event({"hs_lead_status": "CONNECTED"})) == []  # resumed already
    flow.drain()
    journal = _steps(db, run_id)
    assert set(journal) == {"wait", "thank"}
    output = journal["wait"]["output"]
    assert output["matched"] == "customer"
    assert output["event"]["id"] == customer and output["record"]["lifecyclestage"] == "customer"
    assert journal["wait"]["outcome_code"] == "EVENT_RECEIVED"
    park = _park(db, run_id)
    assert park["resumed_by"] == "event" and park["resumed_event_id"] == customer


def test_an_all_wait_resumes_once_each_has_matched_collecting_them(db: Database) -> None:
    flow = Flow(db, ALL)
    run_id = flow.start()
    wait_id = str(_steps(db, run_id)["wait"]["id"])
    reply = flow.event({"hs_lead_status": "CONNECTED"})
    assert flow.admit(reply) == []
    assert flow.admit(flow.event({"hs_lead_status": "CONNECTED"})) == []  # reply matched already
    assert _steps(db, run_id)["wait"]["status"] == "waiting_for_event"
    meeting = _associated(flow)
    assert flow.admit(meeting) == [wait_id]
    flow.drain()
    journal = _steps(db, run_id)
    assert set(journal) == {"wait", "thank"}
    events = journal["wait"]["output"]["events"]
    assert events["reply"]["event"]["id"] == reply and events["meeting"]["event"]["id"] == meeting
    assert _park(db, run_id)["resumed_event_id"] == meeting


def test_an_all_wait_at_its_deadline_keeps_what_matched(db: Database) -> None:
    flow = Flow(db, ALL)
    run_id = flow.start()
    reply = flow.event({"hs_lead_status": "CONNECTED"})
    flow.admit(reply)
    make_past(db, run_id)
    woken: list[str] = []
    wake_due_steps(db, SweepConfig(), woken.extend, SweepReport())
    flow.q(woken)
    flow.drain()
    journal = _steps(db, run_id)
    assert set(journal) == {"wait", "nudge"}
    assert journal["wait"]["outcome_code"] == "WAIT_TIMED_OUT"
    assert set(journal["wait"]["output"]["events"]) == {"reply"}


def test_another_records_event_does_not_answer_a_wait_on_this_one(db: Database) -> None:
    flow = Flow(db, ANY)
    run_id = flow.start("101")
    assert flow.admit(flow.event({"hs_lead_status": "CONNECTED"}, object_id="102")) == []
    assert _steps(db, run_id)["wait"]["status"] == "waiting_for_event"


def test_a_correlated_wait_is_answered_by_the_event_about_what_the_run_names(
    db: Database,
) -> None:
    """The run is about contact 101 and names deal 9 (a number, in its trigger payload); the
    deal's own event (`record.id`, the string "9") answers it, another deal's does not."""
    flow = Flow(db, DEAL)
    run_id = _start_with(flow, {"objectId": "101", "dealId": 9})
    wait = _steps(db, run_id)["wait"]
    assert wait["output"]["correlation"] == {DEAL_CHANGED: "9"}
    assert flow.admit(_deal_won(flow, "10")) == []
    won = _deal_won(flow, "9")
    assert flow.admit(won) == [str(wait["id"])]
    flow.drain()
    journal = _steps(db, run_id)
    assert set(journal) == {"wait", "thank"}
    assert journal["wait"]["output"]["event"]["id"] == won


def test_a_correlated_wait_finds_the_event_recorded_while_it_parked(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An event recorded after the park row was written, and not offered to it by admission
    (never admitted here), is found by the parking's look back, its correlation evaluated
    there."""
    flow = Flow(db, DEAL)
    won: list[int] = []

    def open_then_event(*args: Any, **kwargs: Any) -> Any:
        opened = parks.open_park(*args, **kwargs)
        won.append(_deal_won(flow, "9"))  # recorded after the park row; not admitted
        return opened

    monkeypatch.setattr(settle, "open_park", open_then_event)
    run_id = _start_with(flow, {"objectId": "101", "dealId": "9"})
    flow.drain()
    journal = _steps(db, run_id)
    assert set(journal) == {"wait", "thank"}, journal
    assert journal["wait"]["output"]["event"]["id"] == won[0]


def test_an_event_noted_before_the_step_parks_completes_the_wait_when_it_parks(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An `all` wait's events admitted between the park row's commit and the parking settle:
    noted on the park, and the settle that parks the step resumes it."""
    flow = Flow(db, ALL)
    admitted: list[list[str]] = []

    def open_then_admit(*args: Any, **kwargs: Any) -> Any:
        opened = parks.open_park(*args, **kwargs)
        admitted.append(flow.admit(flow.event({"hs_lead_status": "CONNECTED"})))
        admitted.append(flow.admit(_associated(flow)))
        return opened

    monkeypatch.setattr(settle, "open_park", open_then_admit)
    run_id = flow.start()
    flow.drain()
    assert admitted == [[], []]  # the step was not waiting yet: noted, not resumed
    journal = _steps(db, run_id)
    assert set(journal) == {"wait", "thank"}
    assert set(journal["wait"]["output"]["events"]) == {"reply", "meeting"}


def _at_a_barrier(*actions: Callable[[], list[str]]) -> list[list[str]]:
    barrier = threading.Barrier(len(actions))
    results: list[list[str]] = [[] for _ in actions]

    def run(i: int) -> None:
        barrier.wait()
        results[i] = actions[i]()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(actions))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


def _sweep(db: Database, head_start: float) -> Callable[[], list[str]]:
    def run() -> list[str]:
        time.sleep(head_start)
        woken: list[str] = []
        wake_due_steps(db, SweepConfig(), woken.extend, SweepReport())
        return woken

    return run


def _admitting(db: Database, event_id: int) -> Callable[[], list[str]]:
    return lambda: list(admit_event(db, event_id, publish=lambda _: None).dispatched)


@pytest.mark.parametrize("past", [False, True])
def test_two_events_of_an_any_wait_and_the_deadline_at_a_barrier_resume_it_once(
    db: Database, past: bool
) -> None:
    """Both events of an `any` wait and the sweep at one barrier: exactly one of them resumes
    the wait — an event while the deadline has not come, the deadline once it has — and the
    run takes that one's path. Repeated with the sweep held back a little longer each time."""
    flow = Flow(db, ANY)
    for head_start in (0.0, 0.01, 0.03):
        run_id = flow.start()
        wait_id = str(_steps(db, run_id)["wait"]["id"])
        reply = flow.event({"hs_lead_status": "CONNECTED"})
        customer = flow.event({"lifecyclestage": "customer"})
        if past:
            make_past(db, run_id)
        results = _at_a_barrier(
            _admitting(db, reply), _admitting(db, customer), _sweep(db, head_start)
        )
        resumes = [r for r in results if wait_id in r]
        assert len(resumes) == 1, results
        park = _park(db, run_id)
        if past:
            assert results[2] == [wait_id] and park["resumed_by"] == "deadline"
        else:
            assert park["resumed_by"] == "event"
            assert park["resumed_event_id"] in (reply, customer)
            assert len(park["matched"]) == 1
        flow.q([wait_id])
        flow.drain()
        journal = _steps(db, run_id)
        assert set(journal) == {"wait", "nudge" if past else "thank"}


@pytest.mark.parametrize("past", [False, True])
def test_the_last_event_of_an_all_wait_and_the_deadline_at_a_barrier_resume_it_once(
    db: Database, past: bool
) -> None:
    flow = Flow(db, ALL)
    for head_start in (0.0, 0.01, 0.03):
        run_id = flow.start()
        wait_id = str(_steps(db, run_id)["wait"]["id"])
        assert flow.admit(flow.event({"hs_lead_status": "CONNECTED"})) == []
        meeting = _associated(flow)
        if past:
            make_past(db, run_id)
        results = _at_a_barrier(_admitting(db, meeting), _sweep(db, head_start))
        assert [wait_id in r for r in results].count(True) == 1, results
        park = _park(db, run_id)
        assert park["resumed_by"] == ("deadline" if past else "event")
        flow.q([wait_id])
        flow.drain()
        assert set(_steps(db, run_id)) == {"wait", "nudge" if past else "thank"}


def test_two_events_of_an_all_wait_at_a_barrier_complete_it_once(db: Database) -> None:
    """The two halves of an `all` wait admitted at once: each sees the other's match (they
    serialize on the step row's lock), so the wait is resumed, exactly once."""
    flow = Flow(db, ALL)
    for _ in range(4):
        run_id = flow.start()
        wait_id = str(_steps(db, run_id)["wait"]["id"])
        reply = flow.event({"hs_lead_status": "CONNECTED"})
        meeting = _associated(flow)
        results = _at_a_barrier(_admitting(db, reply), _admitting(db, meeting))
        assert sorted(results) == [[], [wait_id]], results
        assert set(_park(db, run_id)["matched"]) == {"reply", "meeting"}


def test_the_correlation_lookup_uses_its_index_with_10000_parked_waits(db: Database) -> None:
    """10,000 parked correlated waits: admission finds the ones an event answers through the
    GIN index on their keys (the plan names it), not by a scan."""
    flow = Flow(db, DEAL)
    run_id = _start_with(flow, {"dealId": "1"})
    with db.transaction() as tx:
        tx.execute(
            "INSERT INTO workflow_steps (run_id, step_key, node_id, block_type)"
            " SELECT :r, 'w[' || i || ']', 'wait', 'wait_for'"
            " FROM generate_series(1, 10000) AS i",
            r=run_id,
        )
        tx.execute(
            "INSERT INTO step_parks (step_id, run_id, tenant_id, kind, deadline, on_timeout,"
            " mode, awaits, await_keys)"
            " SELECT s.id, s.run_id, 'acme', 'event', now() + interval '3 days', 'fail', 'any',"
            " '[]'::jsonb, ARRAY[:prefix || s.step_key]"
            " FROM workflow_steps s WHERE s.run_id = :r AND s.step_key LIKE 'w[%'",
            r=run_id,
            prefix=await_key("acme", DEAL_CHANGED, "record.id", ""),
        )
        tx.execute(
            "UPDATE workflow_steps s SET status = 'waiting_for_event', park_id = p.id,"
            " park_kind = 'event', wake_at = p.deadline"
            " FROM step_parks p WHERE p.step_id = s.id AND s.step_key LIKE 'w[%'"
        )
        tx.execute("ANALYZE workflow_steps")
        tx.execute("ANALYZE step_parks")
        assert tx.scalar("SELECT count(*) FROM step_parks WHERE await_keys IS NOT NULL") > 10_000
        rows = tx.all(
            "EXPLAIN " + queries.load("steps")["parks_open_awaits"].text,
            keys=[await_key("acme", DEAL_CHANGED, "record.id", "w[777]")],
            limit=1000,
        )
        found = tx.all(
            queries.load("steps")["parks_open_awaits"].text,
            keys=[await_key("acme", DEAL_CHANGED, "record.id", "w[777]")],
            limit=1000,
        )
    plan = "\n".join(str(next(iter(r.values()))) for r in rows)
    print(plan)
    assert "step_parks_open_awaits" in plan, plan
    assert "Seq Scan on step_parks" not in plan, plan
    assert len(found) == 1


def test_a_run_with_nothing_to_correlate_on_fails_its_wait_saying_so(db: Database) -> None:
    flow = Flow(db, DEAL)
    run_id = _start_with(flow, {"objectId": "101"})  # no dealId
    wait = _steps(db, run_id)["wait"]
    assert wait["status"] == "failed" and wait["outcome_code"] == "NO_CORRELATION"
    assert "trigger.dealId" in wait["error"]


def test_the_single_event_form_keeps_its_park(db: Database) -> None:
    """A wait for one event on the run's record (no `events`, no `correlate`) writes the
    first release's park row, found by its own index, as before."""
    flow = Flow(db, _wait(event=REPLIED, when=REPLY))
    run_id = flow.start()
    park = _park(db, run_id)
    assert park["mode"] is None and park["await_keys"] is None
    assert park["event_type"] == REPLIED and park["record_key"].endswith(":contact:101")
    with db.transaction() as tx:
        assert tx.scalar("SELECT count(*) FROM wait_correlations") == 0


def test_a_crash_after_the_park_row_keeps_its_matches_and_the_next_attempt_completes_it(
    db: Database,
) -> None:
    """The rows a crash leaves between an `all` wait's park row and its parking: the park row
    committed, both events admitted and noted on it while the step ran, the step still running
    under a lease that expires. The sweep reclaims the step; its next attempt gets the same
    park row back, with its matches, and parking completes the wait at once."""
    from datetime import UTC, datetime, timedelta

    from shared.blocks.base import AwaitedEvent, ParkRequest
    from shared.steps.claim import claim_step
    from shared.sweep.loop import run_sweep
    from tests.test_steps_engine import LEASE

    flow = Flow(db, ALL)
    event = emit_event(db, connection_id=flow.conn, event_type=STARTS, object_id="101", changed={})
    (step_id,) = admit_event(db, event, publish=lambda _: None).dispatched
    step = claim_step(db, step_id, LEASE)
    assert step is not None
    key = step.trigger_record["key"]
    first = parks.open_park(
        db,
        step_id=step.id,
        run_id=step.run_id,
        tenant_id=step.tenant_id,
        park=ParkRequest(
            kind="event",
            deadline=datetime.now(UTC) + timedelta(days=3),
            on_timeout="goto",
            timeout_goto="nudge",
            scope={},
            mode="all",
            awaits=(
                AwaitedEvent("reply", REPLIED, REPLY, "", key),
                AwaitedEvent("meeting", ASSOCIATED, "true", "", key),
            ),
        ),
    )
    assert flow.admit(flow.event({"hs_lead_status": "CONNECTED"})) == []
    assert flow.admit(_associated(flow)) == []
    run_id = step.run_id
    with db.transaction() as tx:
        tx.execute(
            "UPDATE workflow_steps SET lease_expires_at = now() - interval '1 second'"
            " WHERE run_id = :r AND status = 'running'",
            r=run_id,
        )
    run_sweep(db, 0, duties=[], dispatch=flow.q)
    flow.drain()
    journal = _steps(db, run_id)
    assert set(journal) == {"wait", "thank"}, journal
    # Attempt 2 parked on the first park row and was resumed at once; attempt 3 settled it.
    assert journal["wait"]["attempt"] == 3
    park = _park(db, run_id)
    assert park["id"] == first.id and park["resumed_by"] == "event"
    assert set(journal["wait"]["output"]["events"]) == {"reply", "meeting"}
    with db.transaction() as tx:
        assert tx.scalar("SELECT count(*) FROM step_parks WHERE run_id = :r", r=run_id) == 1


def test_a_wait_correlates_on_an_id_a_step_returned(db: Database) -> None:
    """`correlate.run` reads an earlier step's output (loaded for the wait like any step's
    reference): the deal the run created is the one whose event answers it."""
    from shared.blocks.base import BlockContext, BlockResult
    from tests.steps_blocks import block_lookup, spec

    steps = [
        {
            "id": "create",
            "type": "http.request",
            "config": {"url": "https://hooks.example.com/deals", "method": "POST"},
            "next": "wait",
        },
        *_wait(
            event=DEAL_CHANGED,
            when='has(record.dealstage) && record.dealstage == "closedwon"',
            correlate={"event": "record.id", "run": "steps.create.output.deal.id"},
        ),
    ]

    def create(ctx: BlockContext, config: Any) -> BlockResult:
        return BlockResult(output={"deal": {"id": 4242}})

    flow = Flow(db, steps)
    flow.lookup = block_lookup(flow.rec, **{"http.request": spec("http.request", create)})
    run_id = flow.start()
    wait = _steps(db, run_id)["wait"]
    assert wait["status"] == "waiting_for_event", wait
    assert flow.admit(_deal_won(flow, "4243")) == []
    assert flow.admit(_deal_won(flow, "4242")) == [str(wait["id"])]
    flow.drain()
    assert set(_steps(db, run_id)) == {"create", "wait", "thank"}
