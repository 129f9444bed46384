"""A workflow's `priority` on every path that creates a run (issue 29, item 4;
shared/admission/priority.py): evaluated over the rule scope when the event is admitted,
clamped to -10..10, stored on the run and its steps — also when admission holds the pairing
back and its start comes later (a debounce burst's fire, a throttled start, a keyed-concurrency
start: the value it was admitted with is stored with it), and on a replay (its original's).
The limit's line that orders by it: tests/test_limit_queue.py."""

from __future__ import annotations

from typing import Any

import pytest

from shared.admission.admit import admit_event
from shared.admission.concurrency_start import start_granted_runs
from shared.admission.debounce_fire import fire_due_bursts
from shared.admission.run_throttle_start import start_due_runs
from shared.core.db import Database
from shared.core.duty import SweepConfig, SweepReport
from shared.ops import replay
from shared.publishing.validate import validate_text
from shared.steps.advance import advance_step
from tests.admission_support import activate_text, emit_event, make_tenant

BASE = """
name: prioritized
tenant: acme
trigger:
  events: [hubspot.contact.property_changed]
  dedup: every_time
HELD_IN_TRIGGER
HELD_IN_WORKFLOW
priority: 'record.amount == "huge" ? 99 : (double(record.amount) >= 100000.0 ? 10 : 0)'
steps:
  - id: start
    type: end
"""


def _workflow(in_trigger: str, in_workflow: str) -> str:
    return BASE.replace("HELD_IN_TRIGGER", in_trigger).replace("HELD_IN_WORKFLOW", in_workflow)


def _priorities(db: Database) -> list[tuple[int, int]]:
    """(run, its first step) priorities, runs in start order."""
    with db.transaction() as tx:
        rows = tx.all(
            "SELECT r.priority AS run, s.priority AS step FROM workflow_runs r"
            " JOIN workflow_steps s ON s.run_id = r.id ORDER BY r.created_at"
        )
    return [(int(r["run"]), int(r["step"])) for r in rows]


def _admit(db: Database, i: int, amount: str) -> Any:
    event_id = emit_event(db, object_id=f"deal-{i}", changed={"amount": amount, "k": "same"})
    return admit_event(db, event_id, publish=lambda ids: None)


def test_admission_evaluates_the_priority_and_clamps_it(db: Database) -> None:
    make_tenant(db)
    activate_text(db, _workflow("", ""))
    for i, amount in enumerate(["500", "250000", "huge", "not a number"]):
        _admit(db, i, amount)
    assert _priorities(db) == [(0, 0), (10, 10), (10, 10), (0, 0)]  # 99 clamped to 10


def _sweep(repair: Any, db: Database) -> None:
    repair(db, SweepConfig(), lambda ids: None, SweepReport())


def _throttled_start(db: Database) -> None:
    with db.transaction() as tx:
        tx.execute("UPDATE run_start_queue SET due_at = now() WHERE status = 'queued'")
        tx.execute("UPDATE throttle_windows SET window_start = window_start - interval '2 hours'")
    _sweep(start_due_runs, db)


def _debounce_fire(db: Database) -> None:
    with db.transaction() as tx:
        tx.execute("UPDATE debounce_bursts SET fire_at = now() - interval '1 ms'")
    _sweep(fire_due_bursts, db)


def _concurrency_start(db: Database) -> None:
    with db.transaction() as tx:
        step_id = tx.scalar("SELECT CAST(id AS text) FROM workflow_steps ORDER BY created_at")
    advance_step(db, step_id, dispatch=lambda ids: None)  # the first run ends: slot handed on
    _sweep(start_granted_runs, db)


@pytest.mark.parametrize(
    ("hold", "start", "expected"),
    [
        ("  throttle: {limit: 1, period: 1h}", _throttled_start, [(0, 0), (10, 10)]),
        ("concurrency: {key: record.k, limit: 1}", _concurrency_start, [(0, 0), (10, 10)]),
        ("  debounce: {period: 1h, key: record.k}", _debounce_fire, [(10, 10)]),
    ],
    ids=["throttle", "concurrency", "debounce"],
)
def test_a_held_start_carries_the_priority_its_event_was_admitted_with(
    db: Database, hold: str, start: Any, expected: list[tuple[int, int]]
) -> None:
    make_tenant(db)
    in_trigger, in_workflow = (hold, "") if hold.startswith("  ") else ("", hold)
    activate_text(db, _workflow(in_trigger, in_workflow))
    _admit(db, 0, "500")  # starts now (throttle, concurrency) or opens the burst (debounce)
    _admit(db, 1, "250000")  # held back
    start(db)
    assert _priorities(db) == expected


def test_priority_is_validated_with_file_line_and_column() -> None:
    text = _workflow("", "").replace(
        "double(record.amount) >= 100000.0 ? 10", "steps.start.output.n > 1 ? 10"
    )
    report = validate_text(text, "prioritized.yaml")
    found = {(p.line, p.column): p.message for p in report.errors}
    assert "cannot read `steps`" in found[(9, 11)], found


def test_a_replay_carries_its_originals_priority(db: Database) -> None:
    make_tenant(db)
    activate_text(db, _workflow("", ""))
    _admit(db, 0, "250000")
    with db.transaction() as tx:
        run_id = str(tx.scalar("SELECT id FROM workflow_runs"))
        tx.execute("UPDATE workflow_runs SET status = 'failed', finished_at = now(), error = 'x'")
        tx.execute(
            "UPDATE workflow_steps SET status = 'failed', finished_at = now(), error = 'x',"
            " error_class = 'permanent'"
        )
    outcome = replay.replay_run(db, run_id=run_id, tenant_scope="acme", dispatch=lambda ids: None)
    with db.transaction() as tx:
        rows = tx.all(
            "SELECT r.priority AS run, s.priority AS step FROM workflow_runs r"
            " JOIN workflow_steps s ON s.run_id = r.id WHERE r.id = :r",
            r=outcome.run_id,
        )
    assert [(r["run"], r["step"]) for r in rows] == [(10, 10)]
