"""Debounce per record (issue 29, item 1): a burst of events for one record starts one run,
with the last event as `event` and the burst in `event.burst`; the others are refused
`superseded`, naming the run. Real Postgres, real admission, the sweep's own repair."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from shared.admission.admit import AdmissionSeams, admit_event
from shared.admission.debounce_fire import DUE, Fired, fire_burst, fire_due_bursts
from shared.core.crashpoints import EXIT_CODE
from shared.core.db import Database
from shared.core.duty import SweepConfig, SweepReport
from shared.publishing.validate import validate_text
from shared.steps.claim import LeaseConfig, claim_step
from shared.sweep.loop import next_due_seconds
from tests.admission_support import (
    activate_text,
    at_barrier,
    count,
    emit_event,
    make_connection,
    make_tenant,
    refusals,
)

ROOT = Path(__file__).resolve().parent.parent

WORKFLOW = """
name: follow-up-on-edits
tenant: acme
trigger:
  events: [hubspot.contact.property_changed]
  dedup: every_time
  debounce: {period: %s, max_wait: %s}
steps:
  - id: start
    type: end
"""


def debounced(db: Database, period: str = "5s", max_wait: str = "1m") -> str:
    make_tenant(db)
    return activate_text(db, WORKFLOW % (period, max_wait))


def admit(db: Database, event_id: int) -> Any:
    return admit_event(db, event_id, publish=lambda ids: None)


def make_due(db: Database) -> None:
    """Let every open burst's quiet time be over (instead of sleeping `period`)."""
    with db.transaction() as tx:
        tx.execute(
            "UPDATE debounce_bursts SET fire_at = now() - interval '1 ms' WHERE status <> 'fired'"
        )


def sweep(db: Database) -> int:
    report = SweepReport()
    fire_due_bursts(db, SweepConfig(), lambda ids: None, report)
    return report.bursts_fired


def runs(db: Database) -> list[dict[str, Any]]:
    with db.transaction() as tx:
        return tx.all(
            "SELECT CAST(id AS text) AS id, event_id FROM workflow_runs ORDER BY created_at"
        )


def decisions(db: Database, event_ids: list[int]) -> dict[int, list[str]]:
    """Per event, every decision recorded for it: its run, its refusal."""
    out: dict[int, list[str]] = {e: [] for e in event_ids}
    for r in runs(db):
        out.setdefault(int(r["event_id"]), []).append("run")
    for f in refusals(db):
        out.setdefault(int(f["event_id"]), []).append(f["reason"])
    return out


def test_a_burst_starts_one_run_with_the_last_event_and_the_others_are_superseded_naming_it(
    db: Database,
) -> None:
    workflow_id = debounced(db)
    events = [emit_event(db, changed={"phone": str(i)}) for i in range(4)]
    outcomes = [admit(db, e).outcome_for(workflow_id) for e in events]
    assert [o.outcome for o in outcomes] == ["debounced"] * 4
    assert runs(db) == [] and refusals(db) == []  # nothing decided before the burst fires
    assert sweep(db) == 0  # not due: its quiet time is not over

    make_due(db)
    assert sweep(db) == 1
    (run,) = runs(db)
    assert run["event_id"] == events[-1]
    superseded = refusals(db)
    assert [f["event_id"] for f in superseded] == events[:-1]
    assert {f["reason"] for f in superseded} == {"superseded"}
    assert all(f"absorbed by run {run['id']}" in f["detail"] for f in superseded)
    assert count(db, "SELECT count(*) FROM delivery_claims") == 4
    # The run's scope: the last event as `event`, the burst's events in `event.burst`.
    with db.transaction() as tx:
        step_id = tx.scalar(
            "SELECT CAST(id AS text) FROM workflow_steps WHERE run_id = :r", r=run["id"]
        )
    claimed = claim_step(db, step_id, LeaseConfig())
    assert claimed is not None
    event = claimed.occurrence.event()
    assert event["id"] == events[-1]
    assert [e["id"] for e in event["burst"]] == events
    assert [e["changed_fields"] for e in event["burst"]] == [{"phone": str(i)} for i in range(4)]
    # Sweeping again, and redelivering every event, changes nothing.
    assert sweep(db) == 0
    for e in events:
        assert admit(db, e).outcome_for(workflow_id).outcome == "handled"
    assert len(runs(db)) == 1 and len(refusals(db)) == 3


def test_records_have_bursts_of_their_own_and_a_held_redelivery_changes_nothing(
    db: Database,
) -> None:
    workflow_id = debounced(db)
    a = [emit_event(db, object_id="1"), emit_event(db, object_id="1")]
    b = [emit_event(db, object_id="2")]
    for e in a + b:
        admit(db, e)
    again = admit(db, a[0]).outcome_for(workflow_id)
    assert again.outcome == "handled" and "held in burst" in (again.detail or "")
    assert count(db, "SELECT count(*) FROM debounce_bursts") == 2
    make_due(db)
    assert sweep(db) == 2
    assert sorted(int(r["event_id"]) for r in runs(db)) == [a[1], b[0]]
    assert [f["event_id"] for f in refusals(db)] == [a[0]]


def test_an_event_after_the_quiet_time_opens_the_next_burst_even_before_the_fire(
    db: Database,
) -> None:
    """The burst's fire time passed but the sweep has not fired it: the late event does not
    stretch it (it is more than `period` after the burst's last event); it opens the next."""
    debounced(db)
    first = emit_event(db)
    admit(db, first)
    make_due(db)
    late = emit_event(db)
    admit(db, late)
    with db.transaction() as tx:
        states = [
            r["status"] for r in tx.all("SELECT status FROM debounce_bursts ORDER BY created_at")
        ]
    assert states == ["closed", "open"]
    make_due(db)
    assert sweep(db) == 2
    assert sorted(int(r["event_id"]) for r in runs(db)) == [first, late]
    assert refusals(db) == []


def test_max_wait_bounds_a_burst_that_keeps_getting_events(db: Database) -> None:
    debounced(db, period="1m", max_wait="2m")
    first = emit_event(db)
    admit(db, first)
    with db.transaction() as tx:
        tx.execute(
            "UPDATE debounce_bursts SET max_fire_at = now() + interval '1 s', "
            "fire_at = now() + interval '1 s'"
        )
    admit(db, emit_event(db))
    with db.transaction() as tx:
        row = tx.one(
            "SELECT fire_at <= max_fire_at AS bounded, "
            "fire_at < now() + interval '2 s' AS soon FROM debounce_bursts"
        )
    assert row is not None and row["bounded"] and row["soon"]


def due_in(db: Database, seconds: float) -> None:
    with db.transaction() as tx:
        tx.execute(
            "UPDATE debounce_bursts SET fire_at = now() + make_interval(secs => :s) "
            "WHERE status <> 'fired'",
            s=seconds,
        )


ROUNDS = 8  # half with the join holding the burst's row, half with the fire let go first


def test_the_last_event_racing_the_fire_joins_before_it_or_opens_a_new_burst(
    db: Database, database_url: str
) -> None:
    """At a barrier, the record's next event races the sweep firing its burst, both ways
    round: the event joined first (the fire, blocked on the burst's row, re-checks and finds
    it no longer due), or the fire won (the event, blocked in turn, re-checks, finds the burst
    fired and opens the next one). Every event ends with exactly one decision, and every burst
    with exactly one run."""
    workflow_id = debounced(db)
    joined_first = fire_first = 0
    all_events: list[int] = []
    for round_ in range(ROUNDS):
        first = emit_event(db, object_id=f"r{round_}")
        admit(db, first)
        last = emit_event(db, object_id=f"r{round_}")
        all_events += [first, last]
        with db.transaction() as tx:
            (due,) = tx.all(
                "SELECT CAST(id AS text) AS id, CAST(workflow_id AS text) AS workflow_id, "
                "record_key, dedup_mode FROM debounce_bursts WHERE status = 'open'"
            )
        if round_ % 2:
            # The join holds the burst's row from its statement to its commit; the fire is let
            # go once the join has reached its commit (so it holds the row whatever the load)
            # and after the old fire time, blocks on the row and then re-checks.
            due_in(db, 0.2)
            holding = threading.Event()
            jobs = [
                lambda own, last=last, holding=holding: admit_event(
                    own,
                    last,
                    publish=lambda ids: None,
                    seams=AdmissionSeams(before_commit=lambda: (holding.set(), time.sleep(0.8))[1]),
                ),
                lambda own, due=due, holding=holding: (
                    holding.wait(30),
                    time.sleep(0.3),
                    fire_burst(own, due),
                )[2],
            ]
        else:
            # The fire first: the burst is already due and the event is let go 0.5 s after
            # the barrier, so it meets a fired burst (or blocks on the record's lock while the
            # fire commits) and opens the next one.
            due_in(db, -0.1)
            jobs = [
                lambda own, last=last: (time.sleep(0.5), admit(own, last))[1],
                lambda own, due=due: fire_burst(own, due),
            ]
        admitted, fired = at_barrier(database_url, jobs)
        assert admitted.outcome_for(workflow_id).outcome == "debounced"
        if fired is None:
            joined_first += 1  # the event joined: the burst fires later with it as its last
        else:
            fire_first += 1
            assert isinstance(fired, Fired) and fired.last_event_id == first
        if round_ % 2:
            assert fired is None
        make_due(db)
        sweep(db)
    assert count(db, "SELECT count(*) FROM debounce_bursts WHERE status <> 'fired'") == 0
    found = decisions(db, all_events)
    assert all(len(d) == 1 for d in found.values()), found
    with db.transaction() as tx:
        per_burst = tx.all(
            "SELECT b.id, count(r.id) AS runs FROM debounce_bursts b "
            "LEFT JOIN workflow_runs r ON r.id = b.run_id GROUP BY b.id"
        )
    assert all(int(r["runs"]) == 1 for r in per_burst)
    assert joined_first >= ROUNDS // 2 and fire_first >= 1
    assert joined_first + fire_first == ROUNDS
    print("race:", joined_first, "joined first,", fire_first, "fired first")


def test_two_sweep_instances_firing_one_burst_one_wins(db: Database, database_url: str) -> None:
    debounced(db)
    events = [emit_event(db) for _ in range(3)]
    for e in events:
        admit(db, e)
    make_due(db)
    with db.transaction() as tx:
        (due,) = tx.all(DUE, batch=10)
    results = at_barrier(database_url, [lambda own: fire_burst(own, due)] * 2)
    won = [r for r in results if r is not None]
    assert len(won) == 1 and won[0].superseded == 2
    assert len(runs(db)) == 1 and len(refusals(db)) == 2


def test_a_kill_between_the_bursts_last_event_and_its_fire_loses_nothing(
    db: Database, database_url: str
) -> None:
    """A real process admits three events of one record and is killed right after the third
    joined its burst (committed, nothing fired). The sweep then fires the burst exactly once."""
    workflow_id = debounced(db)
    make_connection(db)
    events = [emit_event(db, changed={"phone": str(i)}) for i in range(3)]
    env = dict(
        os.environ,
        DATABASE_URL=database_url,
        NO_GCE_CHECK="true",
        ONCEFLOW_ENABLE_CRASH_POINTS="1",
        ONCEFLOW_CRASH_POINTS="admission_after_debounce_join:3",
    )
    script = (
        "from shared.core.db import get_database\n"
        "from shared.admission.admit import admit_event\n"
        "db = get_database()\n"
        f"for e in {events!r}:\n"
        "    admit_event(db, e, publish=lambda ids: None)\n"
        "print('survived')\n"
    )
    child = subprocess.run(
        [sys.executable, "-c", script],
        check=False,
        env=env,
        cwd=ROOT,
        capture_output=True,
        timeout=120,
    )
    assert child.returncode == EXIT_CODE, child.stderr.decode()[-2000:]
    with db.transaction() as tx:
        burst = tx.one("SELECT status, event_count, last_event_id FROM debounce_bursts")
    assert burst is not None and (burst["status"], burst["event_count"]) == ("open", 3)
    assert burst["last_event_id"] == events[-1]
    assert runs(db) == []
    # The scale-to-zero sweep wakes for it: its fire time is the next thing due.
    due_in = next_due_seconds(db, SweepConfig())
    assert due_in is not None and due_in <= 5
    make_due(db)
    assert next_due_seconds(db, SweepConfig()) <= 0  # type: ignore[operator]
    assert sweep(db) == 1 and sweep(db) == 0
    (run,) = runs(db)
    assert run["event_id"] == events[-1]
    assert {f["event_id"]: f["reason"] for f in refusals(db, workflow_id)} == {
        events[0]: "superseded",
        events[1]: "superseded",
    }


def test_the_last_events_own_refusal_is_named_by_the_superseded_ones(db: Database) -> None:
    """With `dedup: once_per_record`, a record's second burst is refused `duplicate` (its last
    event), and the others of that burst say no run started and why."""
    make_tenant(db)
    activate_text(db, (WORKFLOW % ("5s", "1m")).replace("every_time", "once_per_record"))
    admit(db, emit_event(db))
    make_due(db)
    sweep(db)
    second = [emit_event(db), emit_event(db)]
    for e in second:
        admit(db, e)
    make_due(db)
    sweep(db)
    found = {f["event_id"]: f for f in refusals(db)}
    assert found[second[1]]["reason"] == "duplicate"
    assert found[second[0]]["reason"] == "superseded"
    assert "no run started, the last event was refused duplicate" in found[second[0]]["detail"]


def test_debounce_is_validated_with_file_line_and_column() -> None:
    text = """name: edits
tenant: acme
trigger:
  events: [hubspot.contact.property_changed]
  debounce:
    period: 10s
    max_wait: 5s
    key: steps.x.output
steps:
  - {id: start, type: end}
"""
    report = validate_text(text, "edits.yaml")
    found = {(p.line, p.column): p.message for p in report.errors}
    assert "max_wait (5s) is shorter than period (10s)" in found[(7, 15)]
    assert "cannot read `steps`" in found[(8, 10)]
    bad = validate_text(text.replace("period: 10s", "period: 10x"), "edits.yaml")
    assert [(p.line, p.column) for p in bad.errors][:1] == [(6, 13)]
    cron = validate_text(
        text.replace("events: [hubspot.contact.property_changed]", 'cron: "0 9 * * *"')
        .replace("    max_wait: 5s\n", "")
        .replace("    key: steps.x.output\n", ""),
        "edits.yaml",
    )
    assert any("cron or poll" in p.message and p.line == 5 for p in cron.errors), cron.errors


def test_ops_explain_shows_a_held_event_then_the_superseded_one_naming_the_run(
    db: Database, client: Any
) -> None:
    from tests.ops_support import bearer, mint

    workflow_id = debounced(db)
    conn = make_connection(db)
    events = [emit_event(db, connection_id=conn) for _ in range(2)]
    for e in events:
        admit(db, e)
    token = mint(db, tenant="acme")
    url = f"/v1/records/explain?record_key={conn}:contact:101"

    def decision_of(event_id: int) -> dict[str, Any]:
        got = client.get(url, headers=bearer(token))
        assert got.status_code == 200, got.get_json()
        (event,) = [e for e in got.get_json()["events"] if e["event_id"] == event_id]
        (decision,) = [d for d in event["decisions"] if d["workflow_id"] == workflow_id]
        return dict(decision)

    held = decision_of(events[0])
    assert held["outcome"] == "undecided" and "held in a burst of 2" in held["explanation"]
    make_due(db)
    sweep(db)
    (run,) = runs(db)
    superseded = decision_of(events[0])
    assert (superseded["outcome"], superseded["reason"]) == ("refused", "superseded")
    assert f"absorbed by run {run['id']}" in superseded["detail"]
    assert "debounce" in superseded["explanation"]
    assert decision_of(events[1])["run_id"] == run["id"]


def test_events_of_one_record_admitted_at_once_open_one_burst(
    db: Database, database_url: str
) -> None:
    """Eight events of one record at a barrier, no burst open, every_time (no dedup lock):
    they race to open the burst on its unique index of open bursts; the losers decide again
    and join it. One burst, eight members, one run."""
    workflow_id = debounced(db)
    events = [emit_event(db) for _ in range(8)]
    results = at_barrier(
        database_url, [lambda own, e=e: admit(own, e).outcome_for(workflow_id) for e in events]
    )
    assert {r.outcome for r in results} == {"debounced"}
    with db.transaction() as tx:
        burst = tx.one("SELECT count(*) AS n, max(event_count) AS events FROM debounce_bursts")
        members = tx.scalar("SELECT count(*) FROM debounce_burst_events")
    assert burst is not None and (burst["n"], burst["events"], members) == (1, 8, 8)
    make_due(db)
    assert sweep(db) == 1
    assert len(runs(db)) == 1 and len(refusals(db)) == 7


def test_a_burst_due_while_the_workflow_is_paused_starts_no_run(db: Database) -> None:
    """The breaker opened after the burst's events joined: the fire refuses the last event
    `workflow_paused` and the others say no run started, and why."""
    workflow_id = debounced(db)
    events = [emit_event(db) for _ in range(2)]
    for e in events:
        admit(db, e)
    with db.transaction() as tx:
        tx.execute(
            "INSERT INTO workflow_breakers (workflow_id, state, opened_at, reason)"
            " VALUES (CAST(:w AS uuid), 'open', now(), '10 runs failed in a row')",
            w=workflow_id,
        )
    make_due(db)
    assert sweep(db) == 1
    assert runs(db) == []
    found = {f["event_id"]: f for f in refusals(db)}
    assert found[events[1]]["reason"] == "workflow_paused"
    assert found[events[0]]["reason"] == "superseded"
    assert "refused workflow_paused" in found[events[0]]["detail"]


def test_a_replay_of_a_debounced_run_reads_the_same_burst(db: Database) -> None:
    from shared.ops.replay import replay_run
    from tests.admission_support import finish_run

    debounced(db)
    events = [emit_event(db, changed={"phone": str(i)}) for i in range(3)]
    for e in events:
        admit(db, e)
    make_due(db)
    sweep(db)
    (run,) = runs(db)
    with db.transaction() as tx:
        tx.execute(
            "UPDATE workflow_steps SET status = 'failed', finished_at = now(), attempt = 1,"
            " error = 'boom' WHERE run_id = CAST(:r AS uuid)",
            r=run["id"],
        )
    finish_run(db, run["id"], "failed")
    replay = replay_run(db, run_id=run["id"], tenant_scope=None, dispatch=lambda ids: None)
    (step_id,) = replay.restarted_step_ids
    claimed = claim_step(db, step_id, LeaseConfig())
    assert claimed is not None and claimed.run_id == replay.run_id != run["id"]
    assert [e["id"] for e in claimed.occurrence.event()["burst"]] == events
