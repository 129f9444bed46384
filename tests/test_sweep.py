"""The sweep puts right what crashes leave behind: rows built as a crash would leave them
(real Postgres), then one sweep pass, then the state asserted."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest

from shared.core.db import Database
from shared.core.duty import Duty, SweepConfig, run_duty
from shared.gates import credits
from shared.ops.replay import retry_run
from shared.steps.advance import advance_step
from shared.steps.cancel import cancel_run
from shared.steps.claim import LeaseConfig, claim_step, mark_side_effect_started
from shared.steps.settle import FAIL_RUN
from shared.sweep.loop import run_sweep
from tests.ops_support import seed_connection, seed_tenant
from tests.steps_blocks import Recorder, block_lookup
from tests.steps_support import (
    TENANT,
    chain,
    definition,
    publish_version,
    run_row,
    start_run,
    steps_of,
)

LEASE = LeaseConfig(lease_seconds=60, heartbeat_seconds=30)
CFG = SweepConfig(batch=50, redispatch_after_seconds=120, poll_seconds=0.05)


class Sent:
    def __init__(self) -> None:
        self.ids: list[str] = []

    def __call__(self, ids: Sequence[str]) -> None:
        self.ids.extend(ids)


def sweep(db: Database, sent: Sent, **kw: Any) -> Any:
    return run_sweep(db, 0, config=kw.pop("config", CFG), dispatch=sent, duties=[], **kw)


def set_step(db: Database, step_id: str, sql_set: str, **params: Any) -> None:
    with db.transaction() as tx:
        tx.execute(f"UPDATE workflow_steps SET {sql_set} WHERE id = :i", i=step_id, **params)


def crashed_running(db: Database, step_id: str, *, attempt: int = 1, marker: bool = False) -> None:
    """A step claimed by a process that died: running, lease expired, nothing settled."""
    set_step(
        db,
        step_id,
        "status = 'running', attempt = :a, lease_id = gen_random_uuid(), "
        "lease_expires_at = now() - interval '5 seconds', started_at = now() - interval '11 min'"
        + (", side_effect_started_at = now() - interval '10 min'" if marker else ""),
        a=attempt,
    )


def test_expired_lease_goes_back_to_pending_and_is_dispatched(db: Database) -> None:
    rec = Recorder()
    version = publish_version(db, definition(chain(2, "test.noop")))
    run_id, (step_id,) = start_run(db, version)
    crashed_running(db, step_id)
    sent = Sent()
    report = sweep(db, sent)
    assert report.reclaimed == 1 and sent.ids == [step_id]
    row = steps_of(db, run_id)["s0"]
    assert row["status"] == "pending" and row["lease_id"] is None and row["attempt"] == 1
    # The redispatched message now completes the step; the attempt count shows the crash.
    advance_step(db, step_id, lookup=block_lookup(rec), dispatch=sent, config=LEASE)
    assert steps_of(db, run_id)["s0"]["status"] == "succeeded"
    assert steps_of(db, run_id)["s0"]["attempt"] == 2


def test_live_lease_is_left_alone(db: Database) -> None:
    version = publish_version(db, definition(chain(1, "test.noop")))
    run_id, (step_id,) = start_run(db, version)
    set_step(
        db,
        step_id,
        "status = 'running', attempt = 1, lease_id = gen_random_uuid(), "
        "lease_expires_at = now() + interval '5 minutes'",
    )
    sent = Sent()
    assert sweep(db, sent).reclaimed == 0 and sent.ids == []
    assert steps_of(db, run_id)["s0"]["status"] == "running"


def test_expired_at_most_once_step_with_marker_fails_outcome_unknown(db: Database) -> None:
    version = publish_version(db, definition(chain(2, "test.amo_lost")))
    run_id, (step_id,) = start_run(db, version)
    crashed_running(db, step_id, marker=True)
    sent = Sent()
    report = sweep(db, sent)
    assert report.reclaimed_failed == 1 and sent.ids == []
    row = steps_of(db, run_id)["s0"]
    assert row["status"] == "failed" and row["outcome_code"] == "OUTCOME_UNKNOWN"
    assert row["finished_at"] is not None and "check the provider" in row["error"]
    run = run_row(db, run_id)
    assert run["status"] == "failed" and "OUTCOME_UNKNOWN" in run["error"]


def test_step_that_keeps_dying_fails_lease_expired(db: Database) -> None:
    version = publish_version(db, definition(chain(1, "test.noop")))
    run_id, (step_id,) = start_run(db, version)
    crashed_running(db, step_id, attempt=5)
    sweep(db, Sent())
    row = steps_of(db, run_id)["s0"]
    assert row["status"] == "failed" and row["outcome_code"] == "LEASE_EXPIRED"
    assert run_row(db, run_id)["status"] == "failed"


def test_settle_that_never_committed_is_redone_once(db: Database) -> None:
    """A process died in the settle transaction (before_settle_commit): the rollback leaves
    the step running under its dead lease and no next row. The sweep reclaims it; the next
    attempt settles and creates the successor exactly once."""
    rec = Recorder()
    version = publish_version(db, definition(chain(2, "test.noop")))
    run_id, (step_id,) = start_run(db, version)
    crashed_running(db, step_id)
    sent = Sent()
    sweep(db, sent)
    for sid in list(sent.ids):
        sent.ids.remove(sid)
        advance_step(db, sid, lookup=block_lookup(rec), dispatch=sent, config=LEASE)
    while sent.ids:
        advance_step(db, sent.ids.pop(0), lookup=block_lookup(rec), dispatch=sent, config=LEASE)
    steps = steps_of(db, run_id)
    assert set(steps) == {"s0", "s1"}
    assert all(s["status"] == "succeeded" for s in steps.values())
    assert run_row(db, run_id)["status"] == "succeeded"


def test_lost_dispatch_is_redispatched_once_per_threshold(db: Database) -> None:
    """Committed pending rows whose step-ready was never published (a crash after commit,
    before publish): re-sent after the threshold, and not again until another threshold."""
    version = publish_version(db, definition(chain(1, "test.noop")))
    run_id, (fresh,) = start_run(db, version)
    _, (lost,) = start_run(db, version)
    _, (never,) = start_run(db, version)
    set_step(db, lost, "dispatched_at = now() - interval '10 minutes'")
    set_step(db, never, "created_at = now() - interval '10 minutes'")  # never stamped
    sent = Sent()
    report = sweep(db, sent)
    assert sorted(sent.ids) == sorted([lost, never]) and report.redispatched == 2
    assert fresh not in sent.ids
    again = Sent()
    assert sweep(db, again).redispatched == 0  # restamped: no storm
    assert steps_of(db, run_id)["s0"]["status"] == "pending"


def test_redispatch_is_bounded_per_pass(db: Database) -> None:
    version = publish_version(db, definition(chain(1, "test.noop")))
    for _ in range(7):
        _, (sid,) = start_run(db, version)
        set_step(db, sid, "dispatched_at = now() - interval '10 minutes'")
    sent = Sent()
    small = SweepConfig(batch=3, redispatch_after_seconds=120, poll_seconds=0.01)
    from shared.core.duty import SweepReport
    from shared.steps.repairs import redispatch_lost_steps

    report = SweepReport()
    assert redispatch_lost_steps(db, small, sent, report) == 3
    # A full batch means a backlog: run_sweep keeps going within its budget until done.
    run_sweep(db, 0.3, config=small, dispatch=sent, duties=[])
    assert len(sent.ids) == 7 and len(set(sent.ids)) == 7


def test_due_parked_steps_wake_not_the_others(db: Database) -> None:
    version = publish_version(db, definition(chain(1, "test.noop")))
    _, (due_retry,) = start_run(db, version)
    _, (due_delay,) = start_run(db, version)
    _, (later,) = start_run(db, version)
    set_step(
        db, due_retry, "status = 'waiting_for_retry', attempt = 1, wake_at = now() - interval '1 s'"
    )
    set_step(
        db, due_delay, "status = 'waiting_for_delay', attempt = 1, wake_at = now() - interval '1 s'"
    )
    set_step(
        db, later, "status = 'waiting_for_retry', attempt = 1, wake_at = now() + interval '1 hour'"
    )
    sent = Sent()
    assert sweep(db, sent).woken == 2
    assert sorted(sent.ids) == sorted([due_retry, due_delay])


def test_sweep_twice_changes_nothing(db: Database) -> None:
    version = publish_version(db, definition(chain(1, "test.noop")))
    run_a, (a,) = start_run(db, version)
    run_b, (b,) = start_run(db, version)
    crashed_running(db, a)
    set_step(db, b, "status = 'waiting_for_retry', attempt = 1, wake_at = now() - interval '1 s'")
    sweep(db, Sent())
    snapshot = (steps_of(db, run_a), steps_of(db, run_b))
    second = sweep(db, Sent())
    assert (second.reclaimed, second.woken, second.redispatched) == (0, 0, 0)
    assert (steps_of(db, run_a), steps_of(db, run_b)) == snapshot


def test_sweep_ignores_rehearsal_and_ended_runs(db: Database) -> None:
    version = publish_version(db, definition(chain(1, "test.noop")))
    _, (rehearsal,) = start_run(db, version, namespace="rehearsal")
    ended_run, (ended,) = start_run(db, version)
    with db.transaction() as tx:
        tx.execute(
            "UPDATE workflow_runs SET status = 'cancelled', finished_at = now(),"
            " cancelled_by = 'test' WHERE id = :r",
            r=ended_run,
        )
    for sid in (rehearsal, ended):
        set_step(db, sid, "created_at = now() - interval '1 hour'")
    sent = Sent()
    sweep(db, sent)
    assert sent.ids == []


def test_duties_run_once_per_period_and_failures_are_recorded(db: Database) -> None:
    calls: list[str] = []

    def ok(_: Database) -> dict[str, int]:
        calls.append("ok")
        return {"done": 1}

    def broken(_: Database) -> None:
        calls.append("broken")
        raise RuntimeError("provider down")

    duties = [Duty("test_ok", 3600, ok), Duty("test_broken", 3600, broken)]
    report = run_sweep(db, 0, config=CFG, dispatch=Sent(), duties=duties)
    assert report.duties["test_ok"] == {"done": 1}
    assert "provider down" in report.duties["test_broken"]["error"]
    assert run_duty(db, duties[0]) is None  # within its period: another sweep skips it
    assert calls == ["ok", "broken"]
    with db.transaction() as tx:
        rows = {r["name"]: r for r in tx.all("SELECT * FROM sweep_duties")}
    assert rows["test_ok"]["last_ok"] is True and rows["test_ok"]["last_result"] == {"done": 1}
    assert rows["test_broken"]["last_ok"] is False
    assert "provider down" in rows["test_broken"]["last_error"]


def test_an_idle_sweep_is_one_pass_and_ends_at_once(db: Database) -> None:
    # Nothing will come due: the sweep doesn't poll out its 50 s budget (issue 27: scale to zero).
    slept: list[float] = []
    started = time.monotonic()
    report = run_sweep(
        db, 50, config=SweepConfig(poll_seconds=1), dispatch=Sent(), duties=[], sleep=slept.append
    )
    assert report.passes == 1 and slept == []
    assert time.monotonic() - started < 5


class FakeTime:
    """A clock that a sleep moves forward (the database's clock doesn't move with it)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_the_sweep_sleeps_until_a_wake_up_due_within_its_budget_and_no_longer(
    db: Database,
) -> None:
    version = publish_version(db, definition(chain(1, "test.noop")))
    _, (later,) = start_run(db, version)
    set_step(
        db, later, "status = 'waiting_for_delay', attempt = 1, wake_at = now() + interval '20 s'"
    )
    short = FakeTime()
    report = run_sweep(
        db, 10, config=CFG, dispatch=Sent(), duties=[], clock=short.clock, sleep=short.sleep
    )
    assert report.passes == 1 and short.slept == []  # due after the budget: the next tick's
    long = FakeTime()
    run_sweep(db, 50, config=CFG, dispatch=Sent(), duties=[], clock=long.clock, sleep=long.sleep)
    assert long.slept and 18 < long.slept[0] <= 20


def test_the_sweep_wakes_a_step_it_slept_for(db: Database) -> None:
    version = publish_version(db, definition(chain(1, "test.noop")))
    _, (soon,) = start_run(db, version)
    set_step(
        db, soon, "status = 'waiting_for_delay', attempt = 1, wake_at = now() + interval '1 s'"
    )
    sent = Sent()
    report = run_sweep(db, 10, config=CFG, dispatch=sent, duties=[])
    assert report.woken == 1 and sent.ids == [soon]


def test_the_sweeps_echo_duty_keeps_markers_for_their_grace(db: Database) -> None:
    """The duty the sweep runs is shared.ingest.echo's expiry, grace included: a marker
    expired half
    an hour ago, or a day ago, can still explain a late-admitted echo (HubSpot redelivers for
    more than a day) and must survive the sweep (the first release's sweep ran a second query
    without the grace and deleted it); one past its provider's grace goes."""
    from shared.ingest.echo import expire_markers_past_grace as expire_echo_markers
    from shared.ingest.echo import expiry_grace_seconds, record_echo_marker

    seed_tenant(db, "acme")
    conn = seed_connection(db, "acme")
    grace = expiry_grace_seconds("hubspot")
    with db.transaction() as tx:
        for object_id, expired_ago in (("1", grace + 60), ("2", 1800), ("3", 86400), ("4", -3600)):
            record_echo_marker(
                tx,
                connection_id=conn,
                object_type="contact",
                object_id=object_id,
                fields={"f": "v"},
                step_id=None,
                ttl_seconds=60,
            )
            tx.execute(
                "UPDATE echo_markers SET"
                " expires_at = now() - make_interval(secs => CAST(:ago AS double precision)),"
                " keep_until = now() - make_interval(secs => CAST(:ago AS double precision))"
                "   + (keep_until - expires_at)"
                " WHERE object_id = :o",
                ago=expired_ago,
                o=object_id,
            )
    assert expire_echo_markers(db) == {"expired": 1}
    with db.transaction() as tx:
        assert tx.scalar("SELECT count(*) FROM echo_markers") == 3


def test_default_duties_delete_ended_throttle_windows(db: Database) -> None:
    from shared.sweep.catalog import default_duties

    seed_tenant(db, "acme")
    conn = seed_connection(db, "acme")
    with db.transaction() as tx:
        for ago in ("2 hours", "1 minute"):
            tx.execute(
                "INSERT INTO throttle_windows (scope, subject, window_seconds, window_start, used)"
                " VALUES ('connection', :c, 10, now() - CAST(:ago AS interval), 3)",
                c=conn,
                ago=ago,
            )
    duty = next(d for d in default_duties() if d.name == "delete_expired_throttle_windows")
    assert duty.run(db) == {"deleted": 1}
    with db.transaction() as tx:
        left = tx.all("SELECT used FROM throttle_windows WHERE subject = :c", c=conn)
    assert [row["used"] for row in left] == [3]


def _claimed_then_run_ended(
    db: Database, run_end: str, *, marked: bool = False, block_type: str = "test.noop"
) -> tuple[str, str]:
    """A step claimed by a process that then died (`marked`: after setting the at-most-once
    mark), its run ended meanwhile (`cancelled` by ops, or `failed` by another branch), and
    its lease now expired. (run id, step id)"""
    version = publish_version(db, definition(chain(2, block_type)))
    run_id, (step_id,) = start_run(db, version)
    step = claim_step(db, step_id, LEASE)
    assert step is not None
    if marked:
        assert mark_side_effect_started(db, step)
    if run_end == "cancelled":
        outcome = cancel_run(db, run_id, by="alice", reason="stop")
        assert outcome is not None and outcome.running_steps == ("s0",)
    else:
        with db.transaction() as tx:
            tx.execute(FAIL_RUN, run_id=run_id, error="step other failed (HTTP_400)")
    set_step(db, step_id, "lease_expires_at = now() - interval '1 second'")
    return run_id, step_id


def _lease_end(db: Database, step_id: str) -> dict[str, Any]:
    with db.transaction() as tx:
        row = tx.one(
            "SELECT end_kind, end_status, outcome_code, error FROM workflow_step_leases"
            " WHERE step_id = :s",
            s=step_id,
        )
    assert row is not None
    return row


@pytest.mark.parametrize("run_end", ["cancelled", "failed"])
def test_an_expired_lease_in_an_ended_run_ends_the_step_skipped(db: Database, run_end: str) -> None:
    """Issue 23 item 12: the reclaim put such a step back to `pending` (it never looked at the
    run), where nothing could claim it again: a pending step under an ended run for good."""
    run_id, step_id = _claimed_then_run_ended(db, run_end)
    sent = Sent()
    report = sweep(db, sent)
    assert sent.ids == [] and (report.reclaimed, report.reclaimed_skipped) == (0, 1)
    s0 = steps_of(db, run_id)["s0"]
    code = "CANCELLED" if run_end == "cancelled" else "RUN_ENDED"
    assert (s0["status"], s0["outcome_code"], s0["lease_id"]) == ("skipped", code, None)
    assert s0["finished_at"] is not None and f"run had ended ({run_end})" in s0["error"]
    assert _lease_end(db, step_id)["end_kind"] == "reclaimed"
    assert _lease_end(db, step_id)["end_status"] == "skipped"
    assert run_row(db, run_id)["status"] == run_end  # the run's end stands
    assert sweep(db, Sent()).reclaimed_skipped == 0  # and twice changes nothing


@pytest.mark.parametrize("block_type", ["test.amo_lost", "crm.create"])
def test_a_marked_expired_lease_in_a_cancelled_run_fails_outcome_unknown(
    db: Database, block_type: str
) -> None:
    """Its at-most-once call may have happened (and been charged): the journal says so, even
    for a block that decides ambiguous retries itself (no attempt can run in an ended run)."""
    run_id, step_id = _claimed_then_run_ended(db, "cancelled", marked=True, block_type=block_type)
    sent = Sent()
    sweep(db, sent)
    assert sent.ids == []
    s0 = steps_of(db, run_id)["s0"]
    assert (s0["status"], s0["outcome_code"]) == ("failed", "OUTCOME_UNKNOWN")
    assert "run had ended (cancelled)" in s0["error"] and "check the provider" in s0["error"]
    lease = _lease_end(db, step_id)
    assert (lease["end_status"], lease["outcome_code"]) == ("failed", "OUTCOME_UNKNOWN")
    assert run_row(db, run_id)["status"] == "cancelled"


def test_the_reclaim_skips_a_step_whose_run_row_is_locked_by_a_cancel(db: Database) -> None:
    """The reclaim locks the run row (skipping it while a cancel holds it), so a cancel that
    commits meanwhile can't leave the reclaimed step pending: the next pass ends it."""
    version = publish_version(db, definition(chain(2, "test.noop")))
    run_id, (step_id,) = start_run(db, version)
    assert claim_step(db, step_id, LEASE) is not None
    set_step(db, step_id, "lease_expires_at = now() - interval '1 second'")
    locked, release = threading.Event(), threading.Event()

    def cancel_holding_the_run_row() -> None:
        with db.transaction() as tx:
            tx.execute("SELECT 1 FROM workflow_runs WHERE id = :r FOR UPDATE", r=run_id)
            tx.execute(
                "UPDATE workflow_runs SET status = 'cancelled', finished_at = now(),"
                " cancelled_by = 'alice' WHERE id = :r",
                r=run_id,
            )
            locked.set()
            assert release.wait(30)

    holder = threading.Thread(target=cancel_holding_the_run_row)
    holder.start()
    assert locked.wait(10)
    try:
        report = sweep(db, Sent())
        assert (report.reclaimed, report.reclaimed_failed) == (0, 0)
        assert steps_of(db, run_id)["s0"]["status"] == "running"
    finally:
        release.set()
        holder.join(30)
    sweep(db, Sent())
    assert steps_of(db, run_id)["s0"]["status"] == "skipped"


def test_a_reclaimed_lease_marks_the_steps_charge_outcome_unknown(db: Database) -> None:
    """The dead attempt may have applied what it was charged for, so no later attempt's
    "not applied" refunds the charge (issue 23 item 5: the ledger's outcome-unknown on
    reclaim)."""
    version = publish_version(db, definition(chain(1, "test.noop")))
    run_id, (step_id,) = start_run(db, version)
    step = claim_step(db, step_id, LEASE)
    assert step is not None
    with db.transaction() as tx:
        credits.grant(tx, step.tenant_id, 10)
    assert (
        credits.charge_step(
            db,
            tenant_id=step.tenant_id,
            lineage_key=step.idempotency_key,
            amount=2,
            block_type="test.noop",
            run_id=run_id,
            step_id=step_id,
        ).status
        == "charged"
    )
    set_step(db, step_id, "lease_expires_at = now() - interval '1 second'")
    assert sweep(db, Sent()).reclaimed == 1
    with db.transaction() as tx:
        assert tx.scalar(
            "SELECT outcome_unknown_at IS NOT NULL FROM credit_ledger WHERE lineage_key = :k",
            k=step.idempotency_key,
        )
        assert credits.refund(tx, lineage_key=step.idempotency_key, reason="x", step_id=None) == 0


def test_a_step_the_reclaim_skipped_in_a_failed_run_runs_again_when_the_run_is_retried(
    db: Database,
) -> None:
    """Another branch failed the run while s0's process was dying: the reclaim ends s0
    skipped (RUN_ENDED). An ops retry of the run must start it again with the failed branch:
    pending before this change, it was restarted as an unsettled step; skipped, it must be
    too, or the retried run would go on without it."""
    run_id, step_id = _claimed_then_run_ended(db, "failed")
    with db.transaction() as tx:
        tx.execute(
            "INSERT INTO workflow_steps (run_id, step_key, node_id, block_type,"
            " idempotency_key, status, attempt, outcome_code, error, error_class, finished_at)"
            " SELECT id, 'x', 'x', 'test.noop', 'onceflow:' || lineage_root || ':x', 'failed',"
            " 1, 'HTTP_400', 'bad request', 'permanent', now() - interval '1 minute'"
            " FROM workflow_runs WHERE id = :r",
            r=run_id,
        )
    sweep(db, Sent())
    assert steps_of(db, run_id)["s0"]["status"] == "skipped"
    sent = Sent()
    retried = retry_run(db, run_id=run_id, tenant_scope=TENANT, dispatch=sent)
    assert sorted(retried.restarted_step_ids) == sorted([step_id, steps_of(db, run_id)["x"]["id"]])
    journal = steps_of(db, run_id)
    assert journal["s0"]["status"] == "pending" and journal["x"]["status"] == "pending"
    assert run_row(db, run_id)["status"] == "running"


def test_a_minute_duty_runs_on_every_tick_of_a_minute_schedule_despite_jitter(
    db: Database,
) -> None:
    # The sweep ends when nothing is due, so a 60 s duty runs once per scheduler tick; a tick
    # a little under 60 s after the previous one (scheduler jitter) must not skip it.
    calls: list[int] = []
    duty = Duty("test_minute", 60, lambda _: calls.append(1))
    assert run_duty(db, duty) is None and calls == [1]
    with db.transaction() as tx:
        tx.execute(
            "UPDATE sweep_duties SET last_started_at = now() - interval '58 seconds'"
            " WHERE name = 'test_minute'"
        )
    run_duty(db, duty)
    assert calls == [1, 1]
    run_duty(db, duty)  # but not twice within one tick
    assert calls == [1, 1]
