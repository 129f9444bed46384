"""The circuit breaker per workflow: trips exactly once when runs fail at once, refuses the
next event `workflow_paused` (recorded and explained), pages through the alert's log line and
an SSRF-guarded notify URL, and resumes only when asked (closed, or half-open on trial)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devstack.fakecrm import FakeCrm
from shared.admission.admit import admit_event
from shared.core.db import Database
from shared.core.duty import SweepConfig
from shared.core.logs import CloudLoggingFormatter, LogEvent
from shared.core.netguard import NetPolicy
from shared.gates import breaker
from shared.ops.explain import explain_reason
from shared.publishing import versions
from shared.steps.advance import advance_step
from shared.sweep.loop import run_sweep
from tests.admission_support import Published, emit_event, make_connection, make_tenant, refusals
from tests.ops_support import (
    bearer,
    mint,
)
from tests.steps_support import start_run, steps_of

# Loopback is refused by the default address policy: a permanent SSRF_BLOCKED failure that
# costs nothing and fails the run at once.
FAILING_STEP = {"id": "call", "type": "http.request", "config": {"url": "http://127.0.0.1:9/x"}}


def _bind(
    db: Database,
    after_failures: int,
    step: dict[str, Any] = FAILING_STEP,
    dedup: str = "every_time",
    **breaker_settings: Any,
) -> str:
    source = {
        "name": "flaky",
        "tenant": "acme",
        "trigger": {"events": ["hubspot.contact.property_changed"], "dedup": dedup},
        "steps": [step],
        "breaker": {"after_failures": after_failures, **breaker_settings},
    }
    with db.transaction() as tx:
        published = versions.publish(tx, json.dumps(source), tenant_id="acme")
        versions.activate(
            tx,
            tenant_id="acme",
            workflow_id=published.workflow_id,
            version_id=published.version_id,
        )
    return str(published.workflow_id)


@pytest.fixture
def conn(db: Database) -> str:
    make_tenant(db)
    return make_connection(db)


def _admit(db: Database, conn: str, n: int, start: int = 0) -> list[str]:
    """n events for n records; the first step ids of the runs admitted."""
    steps: list[str] = []
    for i in range(start, start + n):
        published = Published()
        admit_event(
            db, emit_event(db, connection_id=conn, object_id=str(1000 + i)), publish=published
        )
        steps += published.ids
    return steps


def _advance_together(db: Database, step_ids: list[str]) -> None:
    barrier = threading.Barrier(len(step_ids))
    errors: list[BaseException] = []

    def one(step_id: str) -> None:
        try:
            barrier.wait()
            advance_step(db, step_id, dispatch=lambda ids: None)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(s,)) for s in step_ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def _breaker_row(db: Database, workflow_id: str) -> dict[str, Any]:
    with db.transaction() as tx:
        return breaker.status(tx, workflow_id)


def _trip_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    fmt = CloudLoggingFormatter()
    lines = [json.loads(fmt.format(r)) for r in caplog.records]
    return [x for x in lines if x.get("event") == str(LogEvent.BREAKER_TRIPPED)]


def test_ten_runs_failing_at_once_trip_it_exactly_once_and_the_next_event_is_refused(
    db: Database, conn: str, client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    workflow_id = _bind(db, after_failures=3)
    steps = _admit(db, conn, 10)
    assert len(steps) == 10
    _advance_together(db, steps)

    with db.transaction() as tx:
        failed = tx.scalar("SELECT count(*) FROM workflow_runs WHERE status = 'failed'")
        audits = tx.all("SELECT action, target FROM ops_audit WHERE action = 'breaker.tripped'")
    assert failed == 10
    row = _breaker_row(db, workflow_id)
    assert row["state"] == "open" and row["trips"] == 1
    assert row["consecutive_failures"] == 10  # counted while open too
    assert audits == [{"action": "breaker.tripped", "target": workflow_id}]
    lines = _trip_lines(caplog)
    assert len(lines) == 1
    assert (
        lines[0]["workflow_id"] == workflow_id and "consecutive failed runs" in lines[0]["reason"]
    )

    # Paused: the next event is refused, recorded and explained.
    assert _admit(db, conn, 1, start=10) == []
    [refusal] = [r for r in refusals(db, workflow_id) if r["reason"] == "workflow_paused"]
    assert "paused by its circuit breaker" in refusal["detail"]
    assert "circuit breaker" in explain_reason("workflow_paused")

    # Resumed on request (audited), the next event runs again.
    token = mint(db, None)
    got = client.get(f"/v1/workflows/{workflow_id}/breaker", headers=bearer(token))
    assert got.status_code == 200 and got.get_json()["state"] == "open"
    resumed = client.post(
        f"/v1/workflows/{workflow_id}/resume", json={"reason": "fixed"}, headers=bearer(token)
    )
    assert resumed.status_code == 200, resumed.get_json()
    assert resumed.get_json()["state"] == "closed"
    again = client.post(f"/v1/workflows/{workflow_id}/resume", json={}, headers=bearer(token))
    assert again.status_code == 409 and again.get_json()["code"] == "not_paused"
    with db.transaction() as tx:
        assert tx.scalar("SELECT count(*) FROM ops_audit WHERE action = 'workflows.resume'") == 2
    assert len(_admit(db, conn, 1, start=11)) == 1


def test_half_open_admits_and_the_next_run_decides(db: Database, conn: str) -> None:
    workflow_id = _bind(db, after_failures=2)
    _advance_together(db, _admit(db, conn, 2))
    assert _breaker_row(db, workflow_id)["state"] == "open"

    with db.transaction() as tx:
        assert breaker.resume(tx, workflow_id, half_open=True) == "half_open"
    [step] = _admit(db, conn, 1, start=2)
    advance_step(db, step, dispatch=lambda ids: None)  # it fails: open again, at once
    row = _breaker_row(db, workflow_id)
    assert row["state"] == "open" and row["trips"] == 2

    with db.transaction() as tx:
        assert breaker.resume(tx, workflow_id, half_open=True) == "half_open"
    breaker.record_run_outcome(db, workflow_id, failed=False, settings=None)
    assert _breaker_row(db, workflow_id)["state"] == "closed"


def test_a_rehearsal_failing_does_not_count(db: Database, conn: str) -> None:
    # An ftp URL fails even a rehearsal (the URL check runs before the dry-run answer).
    ftp = {"id": "call", "type": "http.request", "config": {"url": "ftp://example.com/x"}}
    workflow_id = _bind(db, after_failures=1, step=ftp)

    with db.transaction() as tx:
        version_id = str(
            tx.scalar(
                "SELECT version_id FROM workflow_activations WHERE workflow_id = :w", w=workflow_id
            )
        )
    run_id, [step] = start_run(db, version_id, namespace="rehearsal")
    advance_step(db, step, dispatch=lambda ids: None, namespace="rehearsal")
    assert steps_of(db, run_id)["call"]["status"] == "failed"
    assert _breaker_row(db, workflow_id)["state"] == "closed"
    assert _breaker_row(db, workflow_id)["consecutive_failures"] == 0


@pytest.fixture
def sink(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCrm]:
    crm = FakeCrm().start()
    try:
        yield crm
    finally:
        crm.stop()


def test_the_notify_url_gets_one_post_through_the_ssrf_guard(
    db: Database, conn: str, sink: FakeCrm, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The default policy refuses loopback: nothing is sent, the trip still stands.
    workflow_id = _bind(db, after_failures=1, notify_url=f"{sink.url}/_sink/paged")
    _advance_together(db, _admit(db, conn, 1))
    assert _breaker_row(db, workflow_id)["state"] == "open"
    assert sink.sink_requests() == []

    monkeypatch.setattr(breaker, "net_policy", lambda: NetPolicy(allow_loopback=True))
    with db.transaction() as tx:
        breaker.resume(tx, workflow_id)
    _advance_together(db, _admit(db, conn, 1, start=1))
    [paged] = sink.sink_requests()
    assert paged["method"] == "POST" and paged["path"] == "/_sink/paged"
    body = json.loads(paged["body"])
    assert body["event"] == "breaker_tripped" and body["workflow_id"] == workflow_id


def _cli(ops_url: str, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The command in its own process, with no DATABASE_URL: it goes through the ops API
    like every other command (issue 24: it reached the database and crashed without one)."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "PGHOST")}
    env.update(NO_GCE_CHECK="true", ONCEFLOW_OPS_URL=ops_url, ONCEFLOW_OPS_TOKEN=token)
    return subprocess.run(
        [sys.executable, "-m", "shared.ops.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=Path(__file__).resolve().parent.parent,
        check=False,
        timeout=60,
    )


def test_the_cli_shows_and_resumes_the_breaker_audited(
    db: Database, conn: str, ops_server: str
) -> None:
    workflow_id = _bind(db, after_failures=1)
    _advance_together(db, _admit(db, conn, 1))
    token = mint(db, None, label="oncall")
    shown = _cli(ops_server, token, "breaker", workflow_id, "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["state"] == "open"
    readable = _cli(ops_server, token, "breaker", workflow_id)
    assert "open" in readable.stdout and "Traceback" not in readable.stderr
    resumed = _cli(ops_server, token, "breaker", workflow_id, "--resume", "--half-open", "--json")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout)["state"] == "half_open"
    again = _cli(ops_server, token, "breaker", workflow_id, "--resume")
    assert again.returncode == 5 and "not open" in again.stderr  # EXIT_REFUSED, the API's 409
    with db.transaction() as tx:
        rows = tx.all("SELECT action, token_id, detail FROM ops_audit ORDER BY id")
    assert [r["action"] for r in rows] == [
        "breaker.tripped",
        "workflows.resume",
        "workflows.resume",
    ]
    assert rows[1]["token_id"] is not None and rows[1]["detail"]["outcome"] == "done"
    assert rows[2]["detail"]["outcome"] == "refused"
    budget = _cli(ops_server, token, "budget", workflow_id, "--json")
    assert budget.returncode == 0, budget.stderr
    assert json.loads(budget.stdout)["credits"] is None  # no budget declared


def test_runs_the_sweep_fails_count_toward_the_breaker(db: Database, conn: str) -> None:
    """Issue 23 item 16: a run failed by the sweep (LEASE_EXPIRED: its process kept dying; or
    OUTCOME_UNKNOWN) is a failed run like any other, and used not to be counted."""
    workflow_id = _bind(db, after_failures=2)
    steps = _admit(db, conn, 2)
    with db.transaction() as tx:
        # Both processes died on the last attempt the block allows, leases expired.
        tx.execute(
            "UPDATE workflow_steps SET status = 'running', attempt = 3,"
            " lease_id = gen_random_uuid(), lease_expires_at = now() - interval '5 seconds',"
            " started_at = now() - interval '11 min' WHERE id = ANY(CAST(:ids AS uuid[]))",
            ids=steps,
        )
    report = run_sweep(db, 0, config=SweepConfig(), dispatch=lambda ids: None, duties=[])
    assert report.reclaimed_failed == 2
    with db.transaction() as tx:
        codes = tx.all(
            "SELECT outcome_code FROM workflow_steps WHERE id = ANY(CAST(:i AS uuid[]))", i=steps
        )
    assert [c["outcome_code"] for c in codes] == ["LEASE_EXPIRED"] * 2
    row = _breaker_row(db, workflow_id)
    assert (row["state"], row["consecutive_failures"], row["trips"]) == ("open", 2, 1)
    assert "LEASE_EXPIRED" in row["reason"]
    # A second sweep counts nothing more.
    run_sweep(db, 0, config=SweepConfig(), dispatch=lambda ids: None, duties=[])
    assert _breaker_row(db, workflow_id)["consecutive_failures"] == 2


def test_half_open_admits_a_bounded_number_of_trial_runs_under_a_race(
    db: Database, conn: str
) -> None:
    """Issue 23 item 16: half-open used to admit every event. Eight events of different records
    admitted at once at a barrier: exactly `HALF_OPEN_PROBES` runs start, the rest are refused
    `workflow_paused`, explained; the next decision (a trial run failing) re-opens it and a
    second resume grants fresh trials."""
    workflow_id = _bind(db, after_failures=1)
    _advance_together(db, _admit(db, conn, 1))
    assert _breaker_row(db, workflow_id)["state"] == "open"
    with db.transaction() as tx:
        assert breaker.resume(tx, workflow_id, half_open=True) == "half_open"

    events = [emit_event(db, connection_id=conn, object_id=str(2000 + i)) for i in range(8)]
    barrier = threading.Barrier(len(events))
    started: list[str] = []
    errors: list[BaseException] = []

    def one(event_id: int) -> None:
        published = Published()
        try:
            barrier.wait()
            admit_event(db, event_id, publish=published)
        except BaseException as exc:
            errors.append(exc)
        started.extend(published.ids)

    threads = [threading.Thread(target=one, args=(e,)) for e in events]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(started) == breaker.HALF_OPEN_PROBES
    paused = [r for r in refusals(db, workflow_id) if r["reason"] == "workflow_paused"]
    assert len(paused) == 8 - breaker.HALF_OPEN_PROBES
    assert all("half-open" in r["detail"] for r in paused)

    advance_step(db, started[0], dispatch=lambda ids: None)  # a trial fails: open again
    assert _breaker_row(db, workflow_id)["state"] == "open"
    with db.transaction() as tx:
        assert breaker.resume(tx, workflow_id, half_open=True) == "half_open"
    assert len(_admit(db, conn, 5, start=3000)) == breaker.HALF_OPEN_PROBES


def test_an_event_half_open_does_not_admit_uses_no_trial(db: Database, conn: str) -> None:
    """A trial slot claimed for an event the admit statement then refuses (`duplicate`) is
    given back: the trials go to runs that start."""
    workflow_id = _bind(db, after_failures=1, dedup="once_per_record")
    _advance_together(db, _admit(db, conn, 1))  # record 1000 enrolled; the run fails
    with db.transaction() as tx:
        assert breaker.resume(tx, workflow_id, half_open=True) == "half_open"
    assert _admit(db, conn, 1) == []  # record 1000 again: duplicate
    assert [r["reason"] for r in refusals(db, workflow_id)] == ["duplicate"]
    assert _breaker_row(db, workflow_id)["state"] == "half_open"
    assert len(_admit(db, conn, 5, start=1)) == breaker.HALF_OPEN_PROBES
