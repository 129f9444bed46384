"""advance_step against real Postgres: claim, execute, settle, dispatch (test blocks from
tests/steps_blocks.py exist in this process only)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from shared.core.db import Database
from shared.steps.advance import advance_step
from shared.steps.claim import LeaseConfig, claim_step
from shared.sweep.loop import run_sweep
from tests.steps_blocks import Recorder, block_lookup
from tests.steps_support import (
    chain,
    definition,
    publish_version,
    run_row,
    start_run,
    steps_of,
)

LEASE = LeaseConfig(lease_seconds=60, heartbeat_seconds=30)


class Queue:
    """Stands in for Pub/Sub in-process: what was dispatched, in order."""

    def __init__(self) -> None:
        self.ids: list[str] = []

    def __call__(self, ids: Sequence[str]) -> None:
        self.ids.extend(ids)

    def drain(self, db: Database, lookup: object, limit: int = 100) -> int:
        n = 0
        while self.ids and n < limit:
            advance_step(db, self.ids.pop(0), lookup=lookup, dispatch=self, config=LEASE)  # type: ignore[arg-type]
            n += 1
        return n


def make_past(db: Database, run_id: str) -> None:
    """Time travel: every parked step of the run is due now (a wait's park row too: its
    deadline is the step's wake time)."""
    with db.transaction() as tx:
        tx.execute(
            "UPDATE workflow_steps SET wake_at = now() - interval '1 second',"
            " output = CASE WHEN output ? 'delay_until' THEN jsonb_set(output, '{delay_until}',"
            " to_jsonb(CAST(now() - interval '1 second' AS text))) ELSE output END"
            " WHERE run_id = :r AND wake_at IS NOT NULL",
            r=run_id,
        )
        tx.execute(
            "UPDATE step_parks SET deadline = now() - interval '1 second'"
            " WHERE run_id = :r AND resumed_at IS NULL",
            r=run_id,
        )


def test_five_step_run_succeeds_and_journals_every_step(db: Database) -> None:
    rec = Recorder()
    lookup = block_lookup(rec)
    version = publish_version(db, definition(chain(5, "test.noop")))
    run_id, first = start_run(db, version)
    q = Queue()
    q(first)
    assert q.drain(db, lookup) == 5
    steps = steps_of(db, run_id)
    assert [steps[f"s{i}"]["status"] for i in range(5)] == ["succeeded"] * 5
    assert all(s["lease_id"] is None and s["finished_at"] for s in steps.values())
    assert steps["s2"]["output"] == {"step": "s2", "attempt": 1}
    assert steps["s3"]["dispatched_at"] is not None
    run = run_row(db, run_id)
    assert run["status"] == "succeeded" and run["finished_at"] is not None


def test_two_claims_at_a_barrier_one_wins(db: Database) -> None:
    version = publish_version(db, definition(chain(1, "test.noop")))
    _, (step_id,) = start_run(db, version)
    barrier = threading.Barrier(2)
    results: list[object] = []

    def claim() -> None:
        barrier.wait()
        results.append(claim_step(db, step_id, LEASE))

    threads = [threading.Thread(target=claim) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(r is not None for r in results) == 1


def test_two_advance_calls_at_a_barrier_execute_once(db: Database) -> None:
    rec = Recorder()
    lookup = block_lookup(rec)
    version = publish_version(db, definition(chain(1, "test.noop")))
    run_id, (step_id,) = start_run(db, version)
    barrier = threading.Barrier(2)
    out: list[object] = []

    def go() -> None:
        barrier.wait()
        out.append(advance_step(db, step_id, lookup=lookup, dispatch=lambda _: None, config=LEASE))

    threads = [threading.Thread(target=go) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(o.claimed for o in out) == [False, True]
    assert rec.count("s0") == 1
    assert steps_of(db, run_id)["s0"]["attempt"] == 1


def test_run_twice_changes_nothing(db: Database) -> None:
    rec = Recorder()
    lookup = block_lookup(rec)
    version = publish_version(db, definition(chain(2, "test.noop")))
    run_id, (step_id,) = start_run(db, version)
    first = advance_step(db, step_id, lookup=lookup, dispatch=lambda _: None, config=LEASE)
    before = steps_of(db, run_id)
    again = advance_step(db, step_id, lookup=lookup, dispatch=lambda _: None, config=LEASE)
    assert first.claimed and len(first.dispatched) == 1
    assert not again.claimed and again.dispatched == ()
    assert steps_of(db, run_id) == before
    assert rec.count("s0") == 1


def test_transient_failures_retry_with_backoff_then_fail_the_run(db: Database) -> None:
    rec = Recorder()
    lookup = block_lookup(rec)
    version = publish_version(db, definition(chain(2, "test.fail_transient")))
    run_id, (step_id,) = start_run(db, version)
    q = Queue()
    waits = []
    for attempt in (1, 2, 3):
        before = datetime.now(UTC)
        advance_step(db, step_id, lookup=lookup, dispatch=q, config=LEASE)
        row = steps_of(db, run_id)["s0"]
        assert row["attempt"] == attempt
        if attempt < 3:
            assert row["status"] == "waiting_for_retry"
            assert row["error_class"] == "transient" and row["outcome_code"] == "HTTP_503"
            waits.append(round((row["wake_at"] - before).total_seconds() / 60))
            # Not due yet: the sweep leaves it alone; then make it due and sweep.
            assert run_sweep(db, 0, duties=[], dispatch=q).woken == 0
            make_past(db, run_id)
            assert run_sweep(db, 0, duties=[], dispatch=q).woken == 1
            assert q.ids == [step_id]
            q.ids.clear()
    assert waits == [1, 15]
    row = steps_of(db, run_id)["s0"]
    assert row["status"] == "failed" and "gave up after 3 attempts" in row["error"]
    run = run_row(db, run_id)
    assert run["status"] == "failed" and "s0" in run["error"]
    assert "s1" not in steps_of(db, run_id)  # the journal ends where it failed
    assert rec.count("s0") == 3


def test_retry_after_is_honoured(db: Database) -> None:
    rec = Recorder()
    lookup = block_lookup(rec)
    version = publish_version(
        db, definition([{"id": "a", "type": "test.fail_transient", "config": {"retry_after": 600}}])
    )
    run_id, (step_id,) = start_run(db, version)
    before = datetime.now(UTC)
    advance_step(db, step_id, lookup=lookup, dispatch=lambda _: None, config=LEASE)
    row = steps_of(db, run_id)["a"]
    assert row["status"] == "waiting_for_retry"
    assert row["wake_at"] - before >= timedelta(seconds=600)


def test_throttled_step_parks_without_using_an_attempt(db: Database) -> None:
    rec = Recorder()
    lookup = block_lookup(rec)
    version = publish_version(db, definition(chain(1, "test.throttled")))
    run_id, (step_id,) = start_run(db, version)
    for _ in range(4):
        advance_step(db, step_id, lookup=lookup, dispatch=lambda _: None, config=LEASE)
        row = steps_of(db, run_id)["s0"]
        assert row["status"] == "waiting_for_retry" and row["attempt"] == 0
        make_past(db, run_id)
        run_sweep(db, 0, duties=[], dispatch=lambda _: None)
    assert rec.count("s0") == 4
    assert run_row(db, run_id)["status"] == "running"


def test_flow_control_is_never_retried(db: Database) -> None:
    rec = Recorder()
    lookup = block_lookup(rec)
    version = publish_version(db, definition(chain(2, "test.flow_transient")))
    run_id, (step_id,) = start_run(db, version)
    advance_step(db, step_id, lookup=lookup, dispatch=lambda _: None, config=LEASE)
    row = steps_of(db, run_id)["s0"]
    assert row["status"] == "failed" and row["error_class"] == "transient"
    assert run_row(db, run_id)["status"] == "failed"


def test_permanent_failure_fails_run_and_keeps_journal(db: Database) -> None:
    rec = Recorder()
    lookup = block_lookup(rec)
    version = publish_version(
        db,
        definition(
            [
                {"id": "a", "type": "test.noop", "next": "b"},
                {"id": "b", "type": "test.fail_permanent", "next": "c"},
                {"id": "c", "type": "test.noop"},
            ]
        ),
    )
    run_id, first = start_run(db, version)
    q = Queue()
    q(first)
    q.drain(db, lookup)
    steps = steps_of(db, run_id)
    assert steps["a"]["status"] == "succeeded"
    assert steps["b"]["status"] == "failed" and steps["b"]["outcome_code"] == "HTTP_400"
    assert steps["b"]["attempt"] == 1 and "c" not in steps
    run = run_row(db, run_id)
    assert run["status"] == "failed" and "HTTP_400" in run["error"]


def test_at_most_once_step_with_marker_fails_outcome_unknown_without_executing(
    db: Database,
) -> None:
    rec = Recorder()
    lookup = block_lookup(rec)
    version = publish_version(db, definition(chain(1, "test.amo_lost")))
    run_id, (step_id,) = start_run(db, version)
    # What a crash after the mark leaves once the sweep put the step back: pending + marker.
    with db.transaction() as tx:
        tx.execute(
            "UPDATE workflow_steps SET side_effect_started_at = now(), attempt = 1 WHERE id = :i",
            i=step_id,
        )
    advance_step(db, step_id, lookup=lookup, dispatch=lambda _: None, config=LEASE)
    row = steps_of(db, run_id)["s0"]
    assert row["status"] == "failed" and row["outcome_code"] == "OUTCOME_UNKNOWN"
    assert rec.count("s0") == 0
    assert run_row(db, run_id)["status"] == "failed"


def test_marker_is_a_no_op_for_blocks_that_are_not_at_most_once(db: Database) -> None:
    from shared.blocks.base import BlockResult
    from tests.steps_blocks import spec

    def marks(ctx, config):  # type: ignore[no-untyped-def]
        assert ctx.mark_side_effect_started()
        return BlockResult()

    lookup = block_lookup(Recorder(), **{"test.marks": spec("test.marks", marks)})
    version = publish_version(db, definition(chain(1, "test.marks")))
    run_id, (step_id,) = start_run(db, version)
    advance_step(db, step_id, lookup=lookup, dispatch=lambda _: None, config=LEASE)
    row = steps_of(db, run_id)["s0"]
    assert row["status"] == "succeeded" and row["side_effect_started_at"] is None


def test_lost_lease_stops_the_block_from_settling(db: Database) -> None:
    from shared.blocks.base import BlockResult
    from tests.steps_blocks import spec

    seen: list[bool] = []

    def reclaimed_meanwhile(ctx, config):  # type: ignore[no-untyped-def]
        # The sweep reclaimed this step and a successor claimed it under a new lease.
        with db.transaction() as tx:
            tx.execute(
                "UPDATE workflow_steps SET lease_id = gen_random_uuid() WHERE id = :i",
                i=ctx.step_id,
            )
        seen.append(ctx.heartbeat())
        return BlockResult(output={"late": True})

    lookup = block_lookup(Recorder(), **{"test.slow": spec("test.slow", reclaimed_meanwhile)})
    version = publish_version(db, definition(chain(2, "test.slow")))
    run_id, (step_id,) = start_run(db, version)
    result = advance_step(db, step_id, lookup=lookup, dispatch=lambda _: None, config=LEASE)
    assert seen == [False]
    assert result.note == "lease lost"
    row = steps_of(db, run_id)["s0"]
    assert row["status"] == "running" and row["output"] is None
    assert set(steps_of(db, run_id)) == {"s0"}


def test_settle_is_fenced_on_the_lease(db: Database) -> None:
    from shared.blocks.base import BlockResult
    from tests.steps_blocks import spec

    def swept_meanwhile(ctx, config):  # type: ignore[no-untyped-def]
        # The lease expired and the sweep put the step back to pending before this returned.
        with db.transaction() as tx:
            tx.execute(
                "UPDATE workflow_steps SET lease_expires_at = now() - interval '1 s' WHERE id = :i",
                i=ctx.step_id,
            )
        run_sweep(db, 0, duties=[], dispatch=lambda _: None)
        return BlockResult(output={"late": True})

    lookup = block_lookup(Recorder(), **{"test.slow": spec("test.slow", swept_meanwhile)})
    version = publish_version(db, definition(chain(2, "test.slow")))
    run_id, (step_id,) = start_run(db, version)
    result = advance_step(db, step_id, lookup=lookup, dispatch=lambda _: None, config=LEASE)
    assert result.note == "fenced out"
    row = steps_of(db, run_id)["s0"]
    assert row["status"] == "pending" and row["output"] is None


def test_version_pinning_runs_the_graph_it_started_with(db: Database) -> None:
    rec = Recorder()
    lookup = block_lookup(rec)
    v1 = publish_version(
        db,
        definition(
            [{"id": "a", "type": "test.noop", "next": "old"}, {"id": "old", "type": "test.noop"}]
        ),
    )
    run_id, first = start_run(db, v1)
    from tests.steps_support import workflow_of

    wf_id = workflow_of(db, v1)
    v2 = publish_version(
        db,
        definition(
            [{"id": "a", "type": "test.noop", "next": "new"}, {"id": "new", "type": "test.noop"}]
        ),
        wf_id,
    )
    with db.transaction() as tx:
        tx.execute(
            "INSERT INTO workflow_activations (workflow_id, version_id) VALUES (:w, :v)",
            w=wf_id,
            v=v2,
        )
    q = Queue()
    q(first)
    q.drain(db, lookup)
    assert set(steps_of(db, run_id)) == {"a", "old"}
    assert run_row(db, run_id)["status"] == "succeeded"
    run2, first2 = start_run(db, v2)
    q(first2)
    q.drain(db, lookup)
    assert set(steps_of(db, run2)) == {"a", "new"}


def _run_parked_on_a_30_minute_delay(db: Database) -> tuple[str, Queue, object]:
    """A run whose first step, a 30-minute delay, has parked (then `after`, a no-op)."""
    lookup = block_lookup(Recorder())
    version = publish_version(
        db,
        definition(
            [
                {"id": "wait", "type": "delay", "config": {"minutes": 30}, "next": "after"},
                {"id": "after", "type": "test.noop"},
            ]
        ),
    )
    run_id, first = start_run(db, version)
    q = Queue()
    q(first)
    q.drain(db, lookup)
    return run_id, q, lookup


def test_delay_parks_then_succeeds_once_served(db: Database) -> None:
    run_id, q, lookup = _run_parked_on_a_30_minute_delay(db)
    row = steps_of(db, run_id)["wait"]
    assert row["status"] == "waiting_for_delay"
    assert row["wake_at"] > datetime.now(UTC) + timedelta(minutes=29)
    assert run_sweep(db, 0, duties=[], dispatch=q).woken == 0
    make_past(db, run_id)
    assert run_sweep(db, 0, duties=[], dispatch=q).woken == 1
    q.drain(db, lookup)
    steps = steps_of(db, run_id)
    assert steps["wait"]["status"] == "succeeded" and steps["wait"]["attempt"] == 2
    assert steps["after"]["status"] == "succeeded"
    assert run_row(db, run_id)["status"] == "succeeded"


def test_a_woken_delay_is_served_even_when_the_executors_clock_runs_behind(
    db: Database,
) -> None:
    """The sweep woke the step by the database's clock; an executor whose wall clock is an
    hour behind must not read the wait as unserved and park it for another 30 minutes."""
    run_id, q, lookup = _run_parked_on_a_30_minute_delay(db)
    make_past(db, run_id)
    assert run_sweep(db, 0, duties=[], dispatch=q).woken == 1
    behind = datetime.now(UTC) - timedelta(hours=1)
    advanced = advance_step(
        db, q.ids.pop(0), lookup=lookup, dispatch=q, config=LEASE, now=lambda: behind
    )
    assert advanced.status == "succeeded"
    assert steps_of(db, run_id)["wait"]["status"] == "succeeded"


def test_a_graph_that_cannot_load_after_the_claim_fails_the_step_at_once(db: Database) -> None:
    """The first release let the load error escape after the claim: the step stayed
    `running` until its lease expired, then was retried into the same error."""
    from shared.steps import advance

    rec = Recorder()
    version = publish_version(db, definition(chain(1, "test.noop")))
    run_id, first = start_run(db, version)
    with db.transaction() as tx:
        tx.execute("ALTER TABLE workflow_versions DISABLE TRIGGER USER")
        tx.execute(
            "UPDATE workflow_versions SET definition = CAST('{\"steps\": 1}' AS jsonb)"
            " WHERE id = :v",
            v=version,
        )
    advance._graphs.pop(version, None)
    done = advance_step(db, first[0], lookup=block_lookup(rec), dispatch=Queue(), config=LEASE)
    assert (done.status, done.outcome_code) == ("failed", "GRAPH_UNREADABLE")
    row = steps_of(db, run_id)["s0"]
    assert row["status"] == "failed" and "cannot be loaded" in row["error"]
    assert run_row(db, run_id)["status"] == "failed"
    assert rec.calls == []


def test_branch_records_its_choice_and_takes_only_that_edge(db: Database) -> None:
    rec = Recorder()
    lookup = block_lookup(rec)
    version = publish_version(
        db,
        definition(
            [
                {
                    "id": "pick",
                    "type": "branch",
                    "branches": [{"when": 'trigger.tier == "gold"', "next": "gold"}],
                    "otherwise": "plain",
                },
                {"id": "gold", "type": "test.noop"},
                {"id": "plain", "type": "test.noop"},
            ]
        ),
    )
    run_id, first = start_run(db, version, payload={"tier": "gold"})
    q = Queue()
    q(first)
    q.drain(db, lookup)
    steps = steps_of(db, run_id)
    assert steps["pick"]["branch_choice"] == "gold"
    assert set(steps) == {"pick", "gold"}
    assert run_row(db, run_id)["status"] == "succeeded"


def test_rendered_config_sees_earlier_outputs(db: Database) -> None:
    from shared.blocks.base import BlockResult
    from tests.steps_blocks import spec

    got: list[dict[str, object]] = []

    def echo(ctx, config):  # type: ignore[no-untyped-def]
        got.append(config.model_dump())
        return BlockResult(output={"n": 7})

    lookup = block_lookup(Recorder(), **{"test.echo": spec("test.echo", echo)})
    version = publish_version(
        db,
        definition(
            [
                {"id": "a", "type": "test.echo", "next": "b"},
                {
                    "id": "b",
                    "type": "test.echo",
                    "config": {"prev": "${{ steps.a.output.n }}", "who": "${{ trigger.name }}"},
                },
            ]
        ),
    )
    run_id, first = start_run(db, version, payload={"name": "Ada"})
    q = Queue()
    q(first)
    q.drain(db, lookup)
    assert got[1] == {"prev": 7, "who": "Ada"}
    # What each step was asked to do is kept on its row, templates rendered, for people
    # reading the run (the page and GET /v1/runs/{id} showed null).
    steps = steps_of(db, run_id)
    assert steps["b"]["input"] == {"prev": 7, "who": "Ada"}
    assert steps["a"]["input"] == {}


def test_a_large_input_is_kept_as_its_size(db: Database) -> None:
    from shared.blocks.base import BlockResult
    from shared.steps.settle import MAX_STORED_INPUT_BYTES
    from tests.steps_blocks import spec

    lookup = block_lookup(
        Recorder(), **{"test.echo": spec("test.echo", lambda ctx, c: BlockResult(output={}))}
    )
    big = "x" * (MAX_STORED_INPUT_BYTES + 1)
    version = publish_version(
        db, definition([{"id": "a", "type": "test.echo", "config": {"body": big}}])
    )
    run_id, first = start_run(db, version)
    q = Queue()
    q(first)
    q.drain(db, lookup)
    stored = steps_of(db, run_id)["a"]["input"]
    assert stored["_truncated"] is True and stored["bytes"] > MAX_STORED_INPUT_BYTES


def test_unknown_block_type_fails_the_step_with_its_reason(db: Database) -> None:
    lookup = block_lookup(Recorder())
    version = publish_version(db, definition(chain(1, "test.no_such_block")))
    run_id, (step_id,) = start_run(db, version)
    advance_step(db, step_id, lookup=lookup, dispatch=lambda _: None, config=LEASE)
    row = steps_of(db, run_id)["s0"]
    assert row["status"] == "failed" and row["outcome_code"] == "UNKNOWN_BLOCK_TYPE"
    assert "test.no_such_block" in row["error"]


def test_rehearsal_and_ended_runs_are_not_claimed(db: Database) -> None:
    rec = Recorder()
    lookup = block_lookup(rec)
    version = publish_version(db, definition(chain(1, "test.noop")))
    _, (rehearsal_step,) = start_run(db, version, namespace="rehearsal")
    run_id, (cancelled_step,) = start_run(db, version)
    with db.transaction() as tx:
        tx.execute(
            "UPDATE workflow_runs SET status = 'cancelled', finished_at = now(),"
            " cancelled_by = 'test' WHERE id = :r",
            r=run_id,
        )
    for sid in (rehearsal_step, cancelled_step):
        assert not advance_step(
            db, sid, lookup=lookup, dispatch=lambda _: None, config=LEASE
        ).claimed
    assert rec.calls == []


def test_a_long_block_keeps_its_lease_without_calling_heartbeat(db: Database) -> None:
    """The process's lease keeper renews a running block's lease on its interval (issue 19
    moved renewals off the step's own thread): the block sees its lease's expiry move
    forward without ever calling `ctx.heartbeat()`, and the step still settles."""
    from shared.blocks.base import BlockResult
    from tests.steps_blocks import spec

    expiries: list[object] = []

    def waits_for_a_renewal(ctx, config):  # type: ignore[no-untyped-def]
        def expiry() -> object:
            with db.transaction() as tx:
                return tx.scalar(
                    "SELECT lease_expires_at FROM workflow_steps WHERE id = :i", i=ctx.step_id
                )

        expiries.append(expiry())
        renewed = threading.Event()
        while not renewed.wait(0.05):  # bounded by the test's timeout, not asserted on time
            if expiry() != expiries[0]:
                expiries.append(expiry())
                renewed.set()
        return BlockResult(output={"renewed": True})

    lookup = block_lookup(Recorder(), **{"test.long": spec("test.long", waits_for_a_renewal)})
    version = publish_version(db, definition(chain(1, "test.long")))
    _, (step_id,) = start_run(db, version)
    quick = LeaseConfig(lease_seconds=60, heartbeat_seconds=0.2)
    result = advance_step(db, step_id, lookup=lookup, dispatch=lambda _: None, config=quick)
    assert result.status == "succeeded" and result.run_status == "succeeded"
    assert len(expiries) == 2 and expiries[1] > expiries[0]  # type: ignore[operator]
