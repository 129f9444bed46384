"""Batches (issue 29, item 2): up to `max_size` events start one run with `event.batch`
holding them, fired when full (by the admission that fills it, in its own transaction) or
after `max_wait` (the sweep, by the due index of debounce's gatherings); every other event of
the batch is refused `batched`, naming the run. Real Postgres, real admission, the sweep's
own repair, real subprocesses for the kill."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from shared.admission.admit import AdmissionSeams, admit_event
from shared.admission.debounce_fire import fire_burst, fire_due_bursts
from shared.core.crashpoints import EXIT_CODE
from shared.core.db import Database
from shared.core.duty import SweepConfig, SweepReport
from shared.core.errors import TransientError
from shared.publishing.validate import validate_text
from shared.steps.claim import LeaseConfig, claim_step
from tests.admission_support import (
    activate_text,
    at_barrier,
    count,
    emit_event,
    make_tenant,
    refusals,
)

ROOT = Path(__file__).resolve().parent.parent

WORKFLOW = """
name: import-contacts
tenant: acme
trigger:
  events: [hubspot.contact.created]
  dedup: every_time
  batch: {max_size: %d, max_wait: %s}
steps:
  - id: start
    type: end
"""


def batched(db: Database, max_size: int = 3, max_wait: str = "1m") -> str:
    make_tenant(db)
    return activate_text(db, WORKFLOW % (max_size, max_wait))


def created(db: Database, i: int) -> int:
    return emit_event(db, event_type="hubspot.contact.created", object_id=f"c{i}")


def admit(db: Database, event_id: int, seams: AdmissionSeams | None = None) -> Any:
    """One delivery, redelivered (as Pub/Sub would) while it keeps conflicting."""
    for _ in range(10):
        try:
            if seams is None:
                return admit_event(db, event_id, publish=lambda ids: None)
            return admit_event(db, event_id, publish=lambda ids: None, seams=seams)
        except TransientError:
            continue
    raise AssertionError(f"event {event_id} never decided")


def sweep(db: Database) -> int:
    report = SweepReport()
    fire_due_bursts(db, SweepConfig(), lambda ids: None, report)
    return report.bursts_fired


def make_due(db: Database) -> None:
    with db.transaction() as tx:
        tx.execute(
            "UPDATE debounce_bursts SET fire_at = now() - interval '1 ms', "
            "max_fire_at = now() - interval '1 ms' WHERE status <> 'fired'"
        )


def runs(db: Database) -> list[dict[str, Any]]:
    with db.transaction() as tx:
        return tx.all(
            "SELECT CAST(id AS text) AS id, event_id FROM workflow_runs ORDER BY created_at"
        )


def decisions(db: Database, event_ids: list[int]) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {e: [] for e in event_ids}
    for r in runs(db):
        out.setdefault(int(r["event_id"]), []).append("run")
    for f in refusals(db):
        out.setdefault(int(f["event_id"]), []).append(f["reason"])
    return out


def members(db: Database) -> dict[int, str]:
    with db.transaction() as tx:
        rows = tx.all("SELECT event_id, CAST(burst_id AS text) AS b FROM debounce_burst_events")
    return {int(r["event_id"]): r["b"] for r in rows}


def test_a_full_batch_starts_one_run_in_the_filling_admission_and_the_others_are_batched(
    db: Database,
) -> None:
    workflow_id = batched(db, max_size=3)
    events = [created(db, i) for i in range(3)]
    first, second = (admit(db, e).outcome_for(workflow_id) for e in events[:2])
    assert (first.outcome, second.outcome) == ("debounced", "debounced")
    assert runs(db) == [] and refusals(db) == []
    filled = admit(db, events[2]).outcome_for(workflow_id)
    assert filled.outcome == "admitted", filled
    (run,) = runs(db)
    assert run["id"] == filled.run_id and run["event_id"] == events[2]
    found = refusals(db)
    assert [(f["event_id"], f["reason"]) for f in found] == [
        (events[0], "batched"),
        (events[1], "batched"),
    ]
    assert all(f"batched into run {run['id']}" in f["detail"] for f in found)
    # The run's scope: `event.batch` holds the three, oldest first, with their records.
    with db.transaction() as tx:
        step_id = tx.scalar(
            "SELECT CAST(id AS text) FROM workflow_steps WHERE run_id = :r", r=run["id"]
        )
    claimed = claim_step(db, step_id, LeaseConfig())
    assert claimed is not None
    event = claimed.occurrence.event()
    assert [e["id"] for e in event["batch"]] == events
    assert [e["record_object_id"] for e in event["batch"]] == ["c0", "c1", "c2"]
    assert "burst" not in event
    # A fourth event opens the next batch; redeliveries change nothing; the sweep has nothing.
    assert admit(db, created(db, 3)).outcome_for(workflow_id).outcome == "debounced"
    assert sweep(db) == 0
    for e in events:
        assert admit(db, e).outcome_for(workflow_id).outcome == "handled"
    assert len(runs(db)) == 1 and len(refusals(db)) == 2


def test_max_wait_fires_a_batch_that_is_not_full(db: Database) -> None:
    workflow_id = batched(db, max_size=5)
    events = [created(db, i) for i in range(2)]
    for e in events:
        admit(db, e)
    assert sweep(db) == 0
    make_due(db)
    assert sweep(db) == 1 and sweep(db) == 0
    (run,) = runs(db)
    assert run["event_id"] == events[-1]
    assert {f["event_id"]: f["reason"] for f in refusals(db, workflow_id)} == {events[0]: "batched"}


def test_a_batch_filled_by_concurrent_admissions_at_a_barrier(
    db: Database, database_url: str
) -> None:
    """Two events already wait in a batch of 4; twelve more are admitted at once at a barrier.
    The events that fill batches start exactly one run each, every event is in exactly one
    batch, and none is lost when a batch fills and the next one opens."""
    workflow_id = batched(db, max_size=4)
    early = [created(db, i) for i in range(2)]
    for e in early:
        admit(db, e)
    racing = [created(db, 10 + i) for i in range(12)]
    started = time.monotonic()
    results = at_barrier(database_url, [lambda own, e=e: admit(own, e) for e in racing])
    elapsed = time.monotonic() - started
    outcomes = [r.outcome_for(workflow_id).outcome for r in results]
    assert outcomes.count("admitted") == 3, outcomes  # 14 events: 4 + 4 + 4 full, 2 open
    assert len(runs(db)) == 3
    everyone = early + racing
    held = members(db)
    assert sorted(held) == sorted(everyone)  # each in exactly one batch (primary key)
    with db.transaction() as tx:
        sizes = tx.all(
            "SELECT status, event_count FROM debounce_bursts ORDER BY created_at, event_count"
        )
    assert sorted((s["status"], s["event_count"]) for s in sizes) == [
        ("fired", 4),
        ("fired", 4),
        ("fired", 4),
        ("open", 2),
    ]
    make_due(db)
    assert sweep(db) == 1
    found = decisions(db, everyone)
    assert all(len(d) == 1 for d in found.values()), found
    assert sum(d == ["run"] for d in found.values()) == 4
    assert sum(d == ["batched"] for d in found.values()) == 10
    print(f"barrier: 12 admissions in {elapsed:.2f}s")


def test_max_wait_firing_racing_a_late_event(db: Database, database_url: str) -> None:
    """At a barrier, a late event is admitted while the sweep fires its batch at max_wait.
    Either the event joined first (and the fire, blocked on the row, then takes it as the
    batch's last) or the fire won (and the event opens the next batch): one decision per event,
    one run per batch, always."""
    workflow_id = batched(db, max_size=10)
    everyone: list[int] = []
    for round_ in range(8):
        first = created(db, 100 * round_)
        admit(db, first)
        late = created(db, 100 * round_ + 1)
        everyone += [first, late]
        with db.transaction() as tx:
            (due,) = tx.all(
                "SELECT CAST(id AS text) AS id, CAST(workflow_id AS text) AS workflow_id, "
                "record_key, dedup_mode FROM debounce_bursts WHERE status = 'open'"
            )
            tx.execute(
                "UPDATE debounce_bursts SET fire_at = now() + interval '150 ms', "
                "max_fire_at = now() + interval '150 ms' WHERE status = 'open'"
            )
        hold = AdmissionSeams(before_commit=lambda: time.sleep(0.3)) if round_ % 2 else None
        jobs = [
            lambda own, late=late, hold=hold: admit(own, late, hold),
            lambda own, due=due, r=round_: (
                time.sleep(0.15 + 0.01 * (r % 4)),
                fire_burst(own, due),
            )[1],
        ]
        admitted, _ = at_barrier(database_url, jobs)
        assert admitted.outcome_for(workflow_id).outcome == "debounced"
        make_due(db)
        sweep(db)
    assert count(db, "SELECT count(*) FROM debounce_bursts WHERE status <> 'fired'") == 0
    found = decisions(db, everyone)
    assert all(len(d) == 1 for d in found.values()), found
    with db.transaction() as tx:
        per_batch = tx.all(
            "SELECT b.id, count(r.id) AS runs FROM debounce_bursts b "
            "LEFT JOIN workflow_runs r ON r.id = b.run_id GROUP BY b.id"
        )
    assert all(int(r["runs"]) == 1 for r in per_batch)


def test_a_kill_between_the_filling_event_and_the_run_start_loses_nothing(
    db: Database, database_url: str
) -> None:
    """A real process admits the three events of a batch of 3 and is killed after the third
    filled it, before its run started (inside the admission's transaction). Nothing of that
    admission committed: the batch still holds two events, and the third's redelivery fills it
    and starts its run, exactly once."""
    workflow_id = batched(db, max_size=3)
    events = [created(db, i) for i in range(3)]
    env = dict(
        os.environ,
        DATABASE_URL=database_url,
        NO_GCE_CHECK="true",
        ONCEFLOW_ENABLE_CRASH_POINTS="1",
        ONCEFLOW_CRASH_POINTS="admission_batch_filled:1",
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
        batch = tx.one("SELECT status, event_count FROM debounce_bursts")
        undecided = tx.scalar(
            "SELECT count(*) FROM workflow_trigger_events WHERE decided_at IS NULL"
        )
    assert batch is not None and (batch["status"], batch["event_count"]) == ("open", 2)
    assert int(undecided) == 1  # the sweep re-publishes it; here, the redelivery itself
    assert runs(db) == []
    assert admit(db, events[2]).outcome_for(workflow_id).outcome == "admitted"
    assert sweep(db) == 0
    found = decisions(db, events)
    assert found == {events[0]: ["batched"], events[1]: ["batched"], events[2]: ["run"]}


def test_batch_is_validated_with_file_line_and_column() -> None:
    text = """name: import
tenant: acme
trigger:
  events: [hubspot.contact.created]
  batch:
    max_size: 1000
    max_wait: 2d
    key: steps.x.output
steps:
  - {id: start, type: end}
"""
    report = validate_text(text, "import.yaml")
    found = {(p.line, p.column): p.message for p in report.errors}
    assert "max_wait is at most 1d" in found[(7, 15)], found
    assert "cannot read `steps`" in found[(8, 10)], found
    assert any("dedup: every_time" in m for m in found.values()), found
    bad = validate_text(text.replace("max_size: 1000", "max_size: 1"), "import.yaml")
    assert (6, 15) in [(p.line, p.column) for p in bad.errors], bad.errors
    both = validate_text(
        text.replace("  batch:", "  dedup: every_time\n  debounce: {period: 5s}\n  batch:"),
        "import.yaml",
    )
    assert any("batch and debounce" in p.message and p.line == 7 for p in both.errors), both.errors


def test_the_limits_view_shows_what_an_open_batch_holds(db: Database, client: Any) -> None:
    from tests.ops_support import bearer, mint

    workflow_id = batched(db, max_size=100, max_wait="2m")
    events = [created(db, i) for i in range(3)]
    for e in events:
        admit(db, e)
    got = client.get("/v1/limits", headers=bearer(mint(db, tenant="acme")))
    assert got.status_code == 200, got.get_json()
    (view,) = [i for i in got.get_json()["items"] if i["kind"] == "batch"]
    assert view["subject"] == f"{workflow_id}|workflow"
    assert (view["limit"], view["period_seconds"], view["waiting"]) == (100, 120.0, 3)
    assert view["waiting_what"] == "events" and view["oldest_wait_seconds"] is not None


def test_the_ops_page_shows_an_open_batch(db: Database, client: Any) -> None:
    from tests.ops_support import mint

    workflow_id = batched(db, max_size=100, max_wait="2m")
    for i in range(3):
        admit(db, created(db, i))
    assert client.post("/ui/login", data={"token": mint(db, "acme")}).status_code == 303
    page = client.get("/ui").get_data(as_text=True)
    row = page.split('class="limit-batch"')[1].split("</tr>")[0]
    assert f"{workflow_id}|workflow" in row and "100 or 120s" in row and "3 events" in row


def test_an_import_of_1000_contacts_in_batches_of_100(db: Database) -> None:
    """The example's promise at its size: 1,000 created contacts, `max_size: 100` → exactly
    10 runs (each started by the admission of its hundredth event) and 990 `batched`. Prints
    the admissions' latency: `pytest tests/test_batches.py -k 1000 -s`."""
    workflow_id = batched(db, max_size=100, max_wait="2m")
    events = [created(db, i) for i in range(1000)]
    joining: list[float] = []
    filling: list[float] = []
    started = time.perf_counter()
    for e in events:
        t = time.perf_counter()
        outcome = admit(db, e).outcome_for(workflow_id).outcome
        (filling if outcome == "admitted" else joining).append(time.perf_counter() - t)
    total = time.perf_counter() - started
    assert len(filling) == 10 and len(runs(db)) == 10
    assert count(db, "SELECT count(*) FROM admission_refusals WHERE reason = 'batched'") == 990
    assert sweep(db) == 0

    def ms(xs: list[float], p: float) -> float:
        return sorted(xs)[int(p * (len(xs) - 1))] * 1000

    print(
        f"\n1,000 events in batches of 100: {total:.2f} s; an event joining p50 "
        f"{ms(joining, 0.5):.1f} ms / p99 {ms(joining, 0.99):.1f} ms; the filling event "
        f"(fires 100) p50 {ms(filling, 0.5):.1f} ms / max {max(filling) * 1000:.1f} ms"
    )
