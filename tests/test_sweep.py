"""The sweep puts right what crashes leave behind: rows built as a crash would leave them
(real Postgres), then one sweep pass, then the state asserted."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shared.db import Database
from shared.steps.advance import advance_step
from shared.steps.claim import LeaseConfig
from shared.steps.sweep import Duty, SweepConfig, run_duty, run_sweep
from tests.ops_support import seed_connection, seed_tenant
from tests.steps_blocks import Recorder, block_lookup
from tests.steps_support import chain, definition, publish_version, run_row, start_run, steps_of

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
    from shared.steps.sweep import SweepReport, redispatch_lost_steps

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


def test_sweep_loops_within_its_budget(db: Database) -> None:
    ticks = iter(range(100))
    slept: list[float] = []
    report = run_sweep(
        db,
        3,
        config=SweepConfig(poll_seconds=1),
        dispatch=Sent(),
        duties=[],
        clock=lambda: float(next(ticks)),
        sleep=slept.append,
    )
    assert report.passes >= 2 and slept and all(s == 1 for s in slept)


def test_the_sweeps_echo_duty_keeps_markers_for_their_grace(db: Database) -> None:
    """The duty the sweep runs is shared.echo's expiry, grace included: a marker expired half
    an hour ago, or a day ago, can still explain a late-admitted echo (HubSpot redelivers for
    more than a day) and must survive the sweep (the first release's sweep ran a second query
    without the grace and deleted it); one past its provider's grace goes."""
    from shared.echo import expiry_grace_seconds, record_echo_marker
    from shared.steps.sweep import expire_echo_markers

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
    from shared.steps.sweep import default_duties

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
