"""Cancelling a live run (shared/steps/cancel.py, `POST /v1/runs/{id}/cancel`) against real
Postgres: while a step is parked on a delay, while a retry waits, while a step is running (its
settle creates no next steps), two cancels and a cancel against a settle at a barrier, the
replay of a cancelled run, and the ops API's answers and audit."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from shared.blocks.base import BlockResult
from shared.core.db import Database
from shared.core.errors import TransientError
from shared.ops.replay import replay_run
from shared.steps import settle as settle_module
from shared.steps.advance import advance_step
from shared.steps.cancel import Cancellation, cancel_run
from shared.sweep.loop import run_sweep
from tests.ops_support import (
    Dispatched,
    bearer,
    mint,
    seed_tenant,
)
from tests.steps_blocks import Recorder, block_lookup, spec
from tests.steps_support import TENANT, chain, definition, publish_version, run_row, start_run
from tests.steps_support import steps_of as steps
from tests.test_steps_engine import LEASE, Queue, make_past

DELAYED = [
    {"id": "s0", "type": "test.noop", "next": "wait"},
    {"id": "wait", "type": "delay", "config": {"hours": 1}, "next": "s2"},
    {"id": "s2", "type": "test.noop"},
]


def _advance(db: Database, step_id: str, lookup: Any, dispatch: Any = None) -> Any:
    return advance_step(
        db, step_id, lookup=lookup, dispatch=dispatch or (lambda _: None), config=LEASE
    )


def _cancel(db: Database, run_id: str, by: str = "alice", reason: str = "wrong list") -> Any:
    outcome = cancel_run(db, run_id, by=by, reason=reason)
    assert outcome is not None
    return outcome


def test_cancel_while_parked_on_a_delay_skips_the_wait_and_the_sweep_never_wakes_it(
    db: Database,
) -> None:
    rec = Recorder()
    lookup = block_lookup(rec)
    run_id, ids = start_run(db, publish_version(db, definition(DELAYED)))
    q = Queue()
    q(ids)
    q.drain(db, lookup)
    assert steps(db, run_id)["wait"]["status"] == "waiting_for_delay"

    outcome = _cancel(db, run_id)
    assert outcome.moved and outcome.skipped_steps == ("wait",)
    run = run_row(db, run_id)
    assert run["status"] == "cancelled" and run["finished_at"] is not None
    assert (run["cancelled_by"], run["cancel_reason"]) == ("alice", "wrong list")
    wait = steps(db, run_id)["wait"]
    assert wait["status"] == "skipped" and wait["wake_at"] is None
    assert wait["outcome_code"] == "CANCELLED" and wait["finished_at"] is not None

    make_past(db, run_id)
    run_sweep(db, 0, duties=[], dispatch=q)
    q.drain(db, lookup)
    assert steps(db, run_id)["wait"]["status"] == "skipped"
    assert "s2" not in steps(db, run_id) and rec.count("s2") == 0


def test_cancel_while_a_retry_waits_skips_it(db: Database) -> None:
    rec = Recorder()
    lookup = block_lookup(rec)
    run_id, (step_id,) = start_run(
        db, publish_version(db, definition(chain(2, "test.fail_transient")))
    )
    _advance(db, step_id, lookup)
    assert steps(db, run_id)["s0"]["status"] == "waiting_for_retry"

    outcome = _cancel(db, run_id)
    assert outcome.moved and outcome.skipped_steps == ("s0",)
    make_past(db, run_id)
    q = Queue()
    run_sweep(db, 0, duties=[], dispatch=q)
    q.drain(db, lookup)
    assert steps(db, run_id)["s0"]["status"] == "skipped"
    assert rec.count("s0") == 1 and run_row(db, run_id)["status"] == "cancelled"


def test_cancel_while_a_step_runs_lets_it_finish_and_creates_nothing_after_it(
    db: Database,
) -> None:
    def cancelled_meanwhile(ctx: Any, config: Any) -> BlockResult:
        outcome = _cancel(db, ctx.run_id)
        assert outcome.moved and outcome.running_steps == ("s0",)
        return BlockResult(output={"finished": True})

    rec = Recorder()
    lookup = block_lookup(rec, **{"test.slow": spec("test.slow", cancelled_meanwhile)})
    run_id, (step_id,) = start_run(db, publish_version(db, definition(chain(3, "test.slow"))))
    dispatched: list[str] = []
    result = _advance(db, step_id, lookup, dispatched.extend)
    assert result.status == "succeeded" and result.run_status == "cancelled"
    assert dispatched == []
    journal = steps(db, run_id)
    assert set(journal) == {"s0"}
    assert journal["s0"]["status"] == "succeeded" and journal["s0"]["output"] == {"finished": True}
    assert run_row(db, run_id)["status"] == "cancelled"


def test_a_running_step_that_parks_after_its_run_was_cancelled_is_skipped(db: Database) -> None:
    def cancelled_then_transient(ctx: Any, config: Any) -> BlockResult:
        _cancel(db, ctx.run_id)
        raise TransientError("upstream said 503")

    lookup = block_lookup(Recorder(), **{"test.slow": spec("test.slow", cancelled_then_transient)})
    run_id, (step_id,) = start_run(db, publish_version(db, definition(chain(2, "test.slow"))))
    _advance(db, step_id, lookup)
    s0 = steps(db, run_id)["s0"]
    assert s0["status"] == "skipped" and s0["wake_at"] is None
    with db.transaction() as tx:
        lease = tx.one(
            "SELECT end_kind, end_status FROM workflow_step_leases WHERE step_id = :s", s=step_id
        )
    assert lease == {"end_kind": "settled", "end_status": "waiting_for_retry"}


def test_two_cancels_at_a_barrier_one_wins_the_other_says_who(db: Database) -> None:
    run_id, _ = start_run(db, publish_version(db, definition(chain(2, "test.noop"))))
    barrier = threading.Barrier(2)
    out: dict[str, Cancellation] = {}

    def cancel(by: str) -> None:
        barrier.wait()
        out[by] = _cancel(db, run_id, by=by, reason=f"{by} says stop")

    threads = [threading.Thread(target=cancel, args=(who,)) for who in ("alice", "bob")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    winners = [o for o in out.values() if o.moved]
    losers = [o for o in out.values() if not o.moved]
    assert len(winners) == 1 and len(losers) == 1
    won = winners[0]
    assert won.skipped_steps == ("s0",)
    assert losers[0].skipped_steps == () and losers[0].status == "cancelled"
    assert losers[0].cancelled_by == won.cancelled_by
    assert losers[0].why_not == (
        f"already cancelled by {won.cancelled_by} at {won.finished_at.isoformat()}"  # type: ignore[union-attr]
        f": {won.cancelled_by} says stop"
    )
    assert run_row(db, run_id)["cancelled_by"] == won.cancelled_by


def test_a_settle_and_a_cancel_at_a_barrier_leave_nothing_to_run(db: Database) -> None:
    barrier = threading.Barrier(2)

    def racing(ctx: Any, config: Any) -> BlockResult:
        barrier.wait()
        return BlockResult(output={"raced": True})

    lookup = block_lookup(Recorder(), **{"test.race": spec("test.race", racing)})
    run_id, (step_id,) = start_run(db, publish_version(db, definition(chain(3, "test.race"))))
    out: list[Any] = []
    advancing = threading.Thread(target=lambda: out.append(_advance(db, step_id, lookup)))
    advancing.start()
    barrier.wait()
    cancelled = _cancel(db, run_id)
    advancing.join(30)
    assert cancelled.moved and run_row(db, run_id)["status"] == "cancelled"
    journal = steps(db, run_id)
    assert journal["s0"]["status"] == "succeeded"
    # Whichever committed first: s1 was never created, or was created and then skipped.
    assert set(journal) <= {"s0", "s1"}
    assert all(s["status"] in ("succeeded", "skipped") for s in journal.values())


def test_a_cancelled_run_keeps_its_journal_and_its_replay_runs_the_skipped_steps(
    db: Database,
) -> None:
    rec = Recorder()
    lookup = block_lookup(rec)
    run_id, ids = start_run(db, publish_version(db, definition(DELAYED)))
    q = Queue()
    q(ids)
    q.drain(db, lookup)
    _cancel(db, run_id)

    replayed = replay_run(db, run_id=run_id, tenant_scope=TENANT, dispatch=q)
    assert [s.step_key for s in replayed.plan.copy] == ["s0"]
    assert [s.step_key for s in replayed.plan.restart] == ["wait"]
    q.drain(db, lookup)
    make_past(db, replayed.run_id)
    run_sweep(db, 0, duties=[], dispatch=q)
    q.drain(db, lookup)
    assert run_row(db, replayed.run_id)["status"] == "succeeded"
    assert rec.count("s0") == 1 and rec.count("s2") == 1
    # The cancelled run is as it was left.
    assert run_row(db, run_id)["status"] == "cancelled"
    assert steps(db, run_id)["wait"]["status"] == "skipped"


def test_ops_cancel_answers_who_and_why_and_audits_both_calls(
    db: Database, client: Any, dispatched: Dispatched
) -> None:
    run_id, _ = start_run(db, publish_version(db, definition(DELAYED)))
    seed_tenant(db, "someone-else")
    other = mint(db, "someone-else")
    token = mint(db, TENANT, label="carol")
    url = f"/v1/runs/{run_id}/cancel"

    assert client.post(url, json={}, headers=bearer(token)).status_code == 422
    assert client.post(url, json={"reason": "x"}, headers=bearer(other)).status_code == 404
    done = client.post(url, json={"reason": "customer asked"}, headers=bearer(token))
    assert done.status_code == 200, done.get_json()
    body = done.get_json()
    assert body["skipped_steps"] == ["s0"] and body["running_steps"] == []
    assert body["run"]["status"] == "cancelled"
    assert (body["run"]["cancelled_by"], body["run"]["cancel_reason"]) == (
        "carol",
        "customer asked",
    )

    again = client.post(url, json={"reason": "me too"}, headers=bearer(token))
    assert again.status_code == 409
    assert again.get_json()["code"] == "run_not_running"
    assert again.get_json()["message"].startswith("already cancelled by carol at ")
    with db.transaction() as tx:
        audits = tx.all(
            "SELECT detail FROM ops_audit WHERE action = 'runs.cancel' AND target = :r ORDER BY id",
            r=run_id,
        )
    assert [a["detail"]["outcome"] for a in audits] == ["refused", "done", "refused"]
    assert audits[1]["detail"]["body"] == {"reason": "customer asked"}


def test_the_cli_cancels_through_the_ops_api(
    db: Database, ops_server: str, monkeypatch: Any, capsys: Any
) -> None:
    from shared.ops import cli

    run_id, _ = start_run(db, publish_version(db, definition(chain(2, "test.noop"))))
    monkeypatch.setenv("ONCEFLOW_OPS_URL", ops_server)
    monkeypatch.setenv("ONCEFLOW_OPS_TOKEN", mint(db, TENANT, label="dave"))
    assert cli.main(["cancel", run_id, "--reason", "duplicate import"]) == 0
    assert run_row(db, run_id)["cancelled_by"] == "dave"
    assert cli.main(["cancel", run_id, "--reason", "again"]) == cli.EXIT_REFUSED
    assert "already cancelled by dave at " in capsys.readouterr().err


def _lock_waiters(db: Database) -> int:
    """Backends of this test's database waiting for a lock (a fresh read: its own transaction,
    as pg_stat_activity is read once per transaction)."""
    with db.transaction() as tx:
        return int(
            tx.scalar(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
        )


def _until(check: Any, what: str, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


@pytest.mark.parametrize("beside_an_open_step", [False, True], ids=["one-statement", "transaction"])
@pytest.mark.parametrize("repeat", range(5))
def test_a_cancel_queued_behind_a_settle_that_creates_the_next_step_skips_it(
    db: Database, monkeypatch: pytest.MonkeyPatch, beside_an_open_step: bool, repeat: int
) -> None:
    """Issue 23 item 12: the settle of s0 holds the run row and creates s1; a cancel that
    started meanwhile waits for the run row. Held at that point every time, the cancel must
    still skip s1 and answer with what is true after the settle (s0 no longer running).
    Before the fix the cancel's one statement read the steps as of its start, so s1 stayed
    `pending` in the cancelled run for good (seen in 3-7% of free races).

    The one-statement settle can't be paused inside: a third transaction holds the run row
    until the settle and then the cancel queue for it (pg_stat_activity says when), so the
    settle gets it first. The settle beside an open step (a parallel branch still running)
    runs as a transaction: it is held open at its `before_settle_commit` point, s1 written,
    while the cancel queues behind it."""
    lookup = block_lookup(Recorder())
    run_id, (step_id,) = start_run(db, publish_version(db, definition(chain(3, "test.noop"))))
    held, release = threading.Event(), threading.Event()
    if beside_an_open_step:
        with db.transaction() as tx:
            tx.execute(
                "INSERT INTO workflow_steps (run_id, step_key, node_id, block_type,"
                " idempotency_key, status, attempt, lease_id, lease_expires_at, started_at)"
                " SELECT id, 'x', 'x', 'test.noop', 'onceflow:' || lineage_root || ':x',"
                " 'running', 1, gen_random_uuid(), now() + interval '1 hour', now()"
                " FROM workflow_runs WHERE id = :r",
                r=run_id,
            )

        hits: list[str] = []

        def hold_at(point: str) -> None:
            # The first hit precedes the one-statement attempt (which writes nothing beside
            # an open step); the second is inside the settle's transaction.
            if point == "before_settle_commit" and threading.current_thread() is settling:
                hits.append(point)
                if len(hits) == 2:
                    held.set()
                    assert release.wait(30)

        monkeypatch.setattr(settle_module, "crash_point", hold_at)
        holder = None
    else:

        def hold_the_run_row() -> None:
            with db.transaction() as tx:
                tx.execute("SELECT 1 FROM workflow_runs WHERE id = :r FOR UPDATE", r=run_id)
                held.set()
                assert release.wait(30)

        holder = threading.Thread(target=hold_the_run_row)
        holder.start()
        assert held.wait(10)

    settled: list[Any] = []
    cancelled: list[Cancellation] = []
    settling = threading.Thread(target=lambda: settled.append(_advance(db, step_id, lookup)))
    settling.start()
    if holder is not None:
        _until(lambda: _lock_waiters(db) == 1, "the settle to wait for the run row")
    else:
        assert held.wait(10)
    cancelling = threading.Thread(target=lambda: cancelled.append(_cancel(db, run_id)))
    cancelling.start()
    waiting = 1 if holder is None else 2
    _until(lambda: _lock_waiters(db) == waiting, "the cancel to queue behind the settle")
    release.set()
    for t in (settling, cancelling, *([holder] if holder else [])):
        t.join(30)
    (result,) = settled
    (outcome,) = cancelled
    assert result.status == "succeeded" and result.dispatched  # s1 was created first
    journal = steps(db, run_id)
    assert journal["s1"]["status"] == "skipped", journal["s1"]["status"]
    assert not [k for k, s in journal.items() if s["status"] == "pending"]
    assert outcome.moved and outcome.skipped_steps == ("s1",)
    assert outcome.running_steps == (("x",) if beside_an_open_step else ())
    assert run_row(db, run_id)["status"] == "cancelled"
