"""Priorities and fair shares behind a step limit (issue 29, item 4; shared/gates/limit_queue.py).

Steps join a limit's line through the real gate statement (`open_in_turn`, the one every limit
gate runs); the backlogs are parked the way the settle parks a THROTTLED step (a bulk UPDATE
here, so a line of 1,000 takes a second, not the 1,000 executor passes). The end-to-end test
drives `advance_step` and the sweep's repair on a workflow limit."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from shared.blocks import registry
from shared.blocks.base import BlockContext
from shared.core.db import Database
from shared.core.duty import SweepConfig, SweepReport
from shared.gates import limit_queue
from shared.gates.kind import Attempt, WorkflowGates
from shared.steps.advance import advance_step
from tests.admission_support import activate_text, admit, emit_event, make_tenant
from tests.blocks_support import http_target
from tests.steps_support import TENANT, definition, publish_version, start_run

SUBJECT = "shared-hook"  # one limit several tenants' steps count against
KEY = f"workflow|{SUBJECT}"


def _version(db: Database, tenant: str) -> tuple[str, str]:
    wf = definition([{"id": "start", "type": "end"}], name=f"wf-{tenant}")
    wf = type(wf).model_validate({**wf.model_dump(), "tenant": tenant})
    with db.transaction() as tx:
        workflow_id = str(
            tx.scalar(
                "INSERT INTO workflows (tenant_id, name) VALUES (:t, :n) RETURNING id",
                t=tenant,
                n=wf.name,
            )
        )
    version = publish_version(db, wf, workflow_id)
    with db.transaction() as tx:
        workflow_id = tx.scalar(
            "SELECT CAST(workflow_id AS text) FROM workflow_versions WHERE id = :v", v=version
        )
    return version, str(workflow_id)


def _running_steps(db: Database, tenant: str, version: str, n: int, priority: int = 0) -> list[str]:
    """`n` runs of `version`, each with its one step claimed (running under a lease)."""
    with db.transaction() as tx:
        rows = tx.all(
            """
            WITH runs AS (
                INSERT INTO workflow_runs (id, tenant_id, workflow_id, version_id, start_key,
                                           dedup_mode, namespace, trigger_payload, lineage_root,
                                           priority)
                SELECT g.id, :t, v.workflow_id, v.id, 'test:' || g.id, 'every_time', 'live',
                       '{}'::jsonb, g.id, :p
                  FROM (SELECT gen_random_uuid() AS id FROM generate_series(1, :n)) g,
                       workflow_versions v WHERE v.id = CAST(:v AS uuid)
                RETURNING id
            )
            INSERT INTO workflow_steps (run_id, step_key, node_id, block_type, idempotency_key,
                                        status, attempt, lease_id, lease_expires_at,
                                        started_at, priority)
            SELECT r.id, 'start', 'start', 'end', 'k:' || r.id, 'running', 1,
                   gen_random_uuid(), now() + interval '1 hour', now(), :p
              FROM runs r
            RETURNING CAST(id AS text) AS id
            """,
            t=tenant,
            v=version,
            n=n,
            p=priority,
        )
    return [r["id"] for r in rows]


def _attempt(step_id: str, tenant: str, workflow_id: str) -> Attempt:
    spec = registry.get("end")
    ctx = BlockContext(
        tenant_id=tenant,
        run_id="",
        step_id=step_id,
        step_key="start",
        attempt=1,
        idempotency_key=f"k:{step_id}",
        scope={},
    )
    return Attempt(spec, ctx, spec.config_model.model_construct(), WorkflowGates(workflow_id))


def _gate(db: Database, step_id: str, tenant: str, workflow_id: str, max_: int) -> bool:
    """The limit gate on one attempt: True when it passed."""
    attempt = _attempt(step_id, tenant, workflow_id)
    refusal = db.run(
        lambda tx: limit_queue.open_in_turn(
            tx, attempt, scope="workflow", subject=SUBJECT, declared=(max_, 3600)
        )
    )
    return refusal is None


def _park(db: Database, step_ids: list[str]) -> None:
    """What the settle writes for a THROTTLED refusal: waiting_for_retry until its deadline."""
    with db.transaction() as tx:
        tx.execute(
            "UPDATE workflow_steps SET status = 'waiting_for_retry', lease_id = NULL,"
            " lease_expires_at = NULL, wake_at = now() + interval '1 hour',"
            " outcome_code = 'THROTTLED' WHERE id = ANY(CAST(:ids AS uuid[]))",
            ids=step_ids,
        )


def _next_window(db: Database) -> None:
    """The window ends: the line's next one opens (the windows are an hour long here)."""
    with db.transaction() as tx:
        tx.execute("UPDATE throttle_windows SET window_start = window_start - interval '2 hours'")
        tx.execute("UPDATE limit_queues SET due_at = now() - interval '1 second'")


def _grant(db: Database) -> list[str]:
    with db.transaction() as tx:
        return limit_queue.grant(tx, KEY).step_ids


def _fill_the_window(db: Database, version: str, workflow_id: str, max_: int) -> None:
    for step in _running_steps(db, TENANT, version, max_):
        assert _gate(db, step, TENANT, workflow_id, max_)


def test_one_step_of_another_tenant_is_granted_in_the_next_round_not_after_a_backlog(
    db: Database,
) -> None:
    make_tenant(db, TENANT)
    make_tenant(db, "globex")
    version_a, wf_a = _version(db, TENANT)
    version_b, wf_b = _version(db, "globex")
    window = 5
    _fill_the_window(db, version_a, wf_a, window)
    backlog = _running_steps(db, TENANT, version_a, 1000)  # tenant A's import
    for step in backlog:
        assert not _gate(db, step, TENANT, wf_a, window)
    _park(db, backlog)
    (single,) = _running_steps(db, "globex", version_b, 1)  # then B's one event
    assert not _gate(db, single, "globex", wf_b, window)
    _park(db, [single])

    _next_window(db)
    granted = _grant(db)
    assert len(granted) == window and single in granted  # the next round, not the 201st
    with db.transaction() as tx:
        used = tx.scalar(
            "SELECT used FROM throttle_windows WHERE subject = :s"
            " ORDER BY window_start DESC LIMIT 1",
            s=SUBJECT,
        )
        row = tx.one("SELECT status, limit_granted FROM workflow_steps WHERE id = :i", i=single)
    assert used == window  # the grants are counted in the window they were granted in
    assert row is not None and row["status"] == "pending" and row["limit_granted"]


def test_a_high_priority_step_parked_after_100_low_priority_ones_is_granted_first(
    db: Database,
) -> None:
    make_tenant(db, TENANT)
    version, wf = _version(db, TENANT)
    _fill_the_window(db, version, wf, 1)
    low = _running_steps(db, TENANT, version, 100, priority=0)
    for step in low:
        assert not _gate(db, step, TENANT, wf, 1)
    _park(db, low)
    (high,) = _running_steps(db, TENANT, version, 1, priority=5)
    assert not _gate(db, high, TENANT, wf, 1)
    _park(db, [high])

    _next_window(db)
    assert _grant(db) == [high]
    _next_window(db)
    assert _grant(db) == [low[0]]  # then the line in its order


def test_two_grantors_racing_at_a_barrier_never_over_grant_the_window(db: Database) -> None:
    make_tenant(db, TENANT)
    version, wf = _version(db, TENANT)
    window = 10
    _fill_the_window(db, version, wf, window)
    waiting = _running_steps(db, TENANT, version, 50)
    for step in waiting:
        assert not _gate(db, step, TENANT, wf, window)
    _park(db, waiting)
    for _ in range(3):
        _next_window(db)
        barrier = threading.Barrier(2)
        results: list[list[str]] = []

        def grantor(barrier: threading.Barrier, results: list[list[str]]) -> None:
            with db.transaction() as tx:
                barrier.wait()
                results.append(limit_queue.grant(tx, KEY).step_ids)

        threads = [threading.Thread(target=grantor, args=(barrier, results)) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(len(r) for r in results) == [0, window]  # one served the whole window
        with db.transaction() as tx:
            used = tx.scalar(
                "SELECT used FROM throttle_windows WHERE subject = :s"
                " ORDER BY window_start DESC LIMIT 1",
                s=SUBJECT,
            )
        assert used == window


def test_a_new_step_joins_the_line_instead_of_overtaking_it(db: Database) -> None:
    make_tenant(db, TENANT)
    version, wf = _version(db, TENANT)
    _fill_the_window(db, version, wf, 2)
    (first,) = _running_steps(db, TENANT, version, 1)
    assert not _gate(db, first, TENANT, wf, 2)
    _park(db, [first])
    with db.transaction() as tx:  # the next window opens; the grantor has not run yet
        tx.execute("UPDATE throttle_windows SET window_start = window_start - interval '2 hours'")
    (late,) = _running_steps(db, TENANT, version, 1)
    assert not _gate(db, late, TENANT, wf, 2)  # room, but someone waits: it queues
    _park(db, [late])
    assert _grant(db) == [first, late]
    # A granted step passes its gate on the slot its grant counted, not a second one.
    with db.transaction() as tx:
        tx.execute(
            "UPDATE workflow_steps SET status = 'running', lease_id = gen_random_uuid(),"
            " lease_expires_at = now() + interval '1 hour' WHERE id = :i",
            i=first,
        )
    assert _gate(db, first, TENANT, wf, 2)
    with db.transaction() as tx:
        used = tx.scalar(
            "SELECT used FROM throttle_windows WHERE subject = :s ORDER BY window_start DESC"
            " LIMIT 1",
            s=SUBJECT,
        )
    assert used == 2


def test_the_grant_and_the_gate_read_the_line_by_its_index(db: Database) -> None:
    make_tenant(db, TENANT)
    version, wf = _version(db, TENANT)
    _fill_the_window(db, version, wf, 1)
    line = _running_steps(db, TENANT, version, 300)
    for step in line:
        _gate(db, step, TENANT, wf, 1)
    _park(db, line[:-1])
    _running_steps(db, TENANT, version, 2000)  # other steps, not in any line
    with db.transaction() as tx:
        tx.execute("ANALYZE workflow_steps")
        plans: dict[str, str] = {}
        for name, statement, params in (
            (
                "grant",
                limit_queue.GRANT,
                {
                    "limit_key": KEY,
                    "room": 5,
                    "window_index": 0,
                    "scope": "workflow",
                    "subject": SUBJECT,
                    "window_seconds": 3600,
                    "window_start": "2026-01-01T00:00:00Z",
                },
            ),
            (
                "claim",
                limit_queue.CLAIM,
                {
                    "limit_key": KEY,
                    "scope": "workflow",
                    "subject": SUBJECT,
                    "step_id": line[-1],
                    "connection_id": None,
                    "limit_max": 1,
                    "window_seconds": 3600,
                },
            ),
        ):
            plans[name] = "\n".join(
                r["QUERY PLAN"] for r in tx.all("EXPLAIN " + statement.text, **params)
            )
    assert "workflow_steps_limit_line" in plans["grant"], plans["grant"]
    assert "Seq Scan on workflow_steps" not in plans["grant"], plans["grant"]
    assert "Sort" not in plans["grant"], plans["grant"]  # the index's order is the line's
    assert "Seq Scan on workflow_steps" not in plans["claim"], plans["claim"]


def test_a_throttled_step_waits_in_line_and_the_sweep_grants_it(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """End to end: `advance_step` parks the step over a workflow limit in the line; the sweep's
    repair grants it when the next window opens; its next attempt runs on that grant."""
    make_tenant(db, TENANT)
    with http_target(monkeypatch) as fake:
        call = {"id": "call", "type": "http.request", "config": {"url": f"{fake.url}/_sink/h"}}
        wf = definition([call], name="limited")
        wf = type(wf).model_validate({**wf.model_dump(), "rate_limit": {"max": 1, "per": "1h"}})
        version = publish_version(db, wf)
        steps = [start_run(db, version)[1][0] for _ in range(3)]
        for step in steps:
            advance_step(db, step, dispatch=lambda ids: None)
        _granted_and_run(db, steps)


def _granted_and_run(db: Database, steps: list[str]) -> None:
    with db.transaction() as tx:
        rows = {
            r["id"]: r
            for r in tx.all(
                "SELECT CAST(id AS text) AS id, status, limit_wait FROM workflow_steps"
                " WHERE id = ANY(CAST(:ids AS uuid[]))",
                ids=steps,
            )
        }
    assert [rows[s]["status"] for s in steps] == [
        "succeeded",
        "waiting_for_retry",
        "waiting_for_retry",
    ]
    assert rows[steps[1]]["limit_wait"] is not None
    with db.transaction() as tx:
        tx.execute("UPDATE throttle_windows SET window_start = window_start - interval '2 hours'")
        tx.execute("UPDATE limit_queues SET due_at = now() - interval '1 second'")
    published: list[Any] = []
    report = SweepReport()
    assert limit_queue.grant_due_limits(db, SweepConfig(), published.extend, report) == 1
    assert published == [steps[1]] and report.limit_grants == 1
    advance_step(db, steps[1], dispatch=lambda ids: None)
    with db.transaction() as tx:
        status = tx.scalar("SELECT status FROM workflow_steps WHERE id = :i", i=steps[1])
        used = tx.scalar("SELECT used FROM throttle_windows ORDER BY window_start DESC LIMIT 1")
    assert status == "succeeded" and used == 1


BIG_DEALS_FIRST = """
name: big-deals-first
tenant: acme
trigger:
  events: [hubspot.contact.property_changed]
  dedup: every_time
rate_limit: {max: 1, per: 1h}
priority: 'double(record.amount) >= 100000.0 ? 10 : 0'
steps:
  - id: call
    type: http.request
    config: {url: "URL/_sink/h", method: POST, body: {amount: "${{ record.amount }}"}}
"""


def test_a_big_deal_admitted_after_small_ones_is_granted_first_from_admission(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """End to end from admission: the workflow's `priority` is evaluated on each event when
    its run is admitted and stored on the run and its step; three small deals' steps wait in
    the limit's line, a big deal's step joins after them, and the next window's grant goes to
    the big deal first."""
    make_tenant(db, TENANT)
    with http_target(monkeypatch) as fake:
        activate_text(db, BIG_DEALS_FIRST.replace("URL", fake.url))
        steps: list[str] = []
        for i, amount in enumerate(["10", "20", "30", "40", "250000"]):
            run_id = admit(db, emit_event(db, object_id=f"d{i}", changed={"amount": amount}))
            with db.transaction() as tx:
                steps.append(
                    str(tx.scalar("SELECT id FROM workflow_steps WHERE run_id = :r", r=run_id))
                )
            advance_step(db, steps[-1], dispatch=lambda ids: None)
        with db.transaction() as tx:
            rows = {
                str(r["id"]): r
                for r in tx.all(
                    "SELECT s.id, s.status, s.priority, r.priority AS run_priority"
                    " FROM workflow_steps s JOIN workflow_runs r ON r.id = s.run_id"
                )
            }
        assert [rows[s]["status"] for s in steps] == ["succeeded"] + ["waiting_for_retry"] * 4
        assert [(rows[s]["priority"], rows[s]["run_priority"]) for s in steps] == [
            (0, 0),
            (0, 0),
            (0, 0),
            (0, 0),
            (10, 10),
        ]
        with db.transaction() as tx:
            tx.execute(
                "UPDATE throttle_windows SET window_start = window_start - interval '2 hours'"
            )
            tx.execute("UPDATE limit_queues SET due_at = now() - interval '1 second'")
        published: list[Any] = []
        limit_queue.grant_due_limits(db, SweepConfig(), published.extend, SweepReport())
        assert published == [steps[-1]]  # the big deal, though it joined the line last
        advance_step(db, steps[-1], dispatch=lambda ids: None)
        sent = [json.loads(r["body"]) for r in fake.sink_requests()]
        assert sent == [{"amount": "10"}, {"amount": "250000"}]
