"""Retention on real Postgres (shared/sweep/retention.py): what is old goes in batches, what is
young
stays, every promise listed in the module's docstring keeps its rows, a second pass changes
nothing, and every batch is found through an index."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest

from shared.admission.admit import admit_event
from shared.core import queries
from shared.core.db import Database
from shared.core.duty import SweepConfig
from shared.ops.errors import OpsError
from shared.ops.replay import replay_run
from shared.steps.advance import advance_step
from shared.sweep.catalog import default_duties
from shared.sweep.retention import (
    BURSTS_DELETE,
    EVENTS_DELETE,
    INBOX_DELETE,
    LINEAGES_DELETE,
    LINEAGES_LOCK,
    RUN_STARTS_DELETE,
    Retention,
    prune,
    prune_lineages,
)
from tests.admission_support import (
    EVENT_TYPE,
    Published,
    bind_workflow,
    count,
    emit_event,
    make_connection,
    make_tenant,
)

OPS_SQL = queries.load("ops")
TABLES = (
    "workflow_runs",
    "workflow_steps",
    "workflow_step_leases",
    "delivery_claims",
    "admission_refusals",
    "workflow_trigger_events",
    "webhook_inbox",
    "workflow_enrollments",
    "credit_ledger",
    "cron_ticks",
)


@pytest.fixture
def conn(db: Database) -> str:
    make_tenant(db)
    return make_connection(db)


def counts(db: Database) -> dict[str, int]:
    return {t: count(db, f"SELECT count(*) FROM {t}") for t in TABLES}


def finished_run(db: Database, conn: str, workflow_id: str, record: str) -> tuple[int, str]:
    """An event admitted and its run driven to the end through the real executor;
    (event id, run id)."""
    event_id = emit_event(db, connection_id=conn, object_id=record)
    published = Published()
    result = admit_event(db, event_id, publish=published)
    (run,) = [o for o in result.outcomes if o.workflow_id == workflow_id]
    assert run.outcome == "admitted" and run.run_id is not None
    pending = list(published.ids)
    while pending:
        advance_step(db, pending.pop(), dispatch=pending.extend)
    assert (
        count(
            db,
            "SELECT count(*) FROM workflow_runs WHERE id = :r AND status = 'succeeded'",
            r=run.run_id,
        )
        == 1
    )
    return event_id, run.run_id


def age(db: Database, *, run_id: str | None = None, event_id: int | None = None, days: int) -> None:
    """Time travel: the run finished, and its event was decided, `days` ago."""
    with db.transaction() as tx:
        if run_id is not None:
            tx.execute(
                "UPDATE workflow_runs SET finished_at = now() - make_interval(days => :d)"
                " WHERE id = :r",
                d=days,
                r=run_id,
            )
        if event_id is not None:
            tx.execute(
                "UPDATE workflow_trigger_events SET decided_at = now() - make_interval(days => :d)"
                " WHERE id = :e",
                d=days,
                e=event_id,
            )


def exists(db: Database, table: str, column: str, value: Any) -> bool:
    return count(db, f"SELECT count(*) FROM {table} WHERE {column} = :v", v=value) > 0


def test_finished_runs_and_decided_events_past_retention_go_in_batches_younger_stay(
    db: Database, conn: str
) -> None:
    wf = bind_workflow(db, "kept", dedup="every_time")
    old = [finished_run(db, conn, wf, str(n)) for n in range(3)]
    young_event, young_run = finished_run(db, conn, wf, "young")
    for event_id, run_id in old:
        age(db, run_id=run_id, event_id=event_id, days=91)
    age(db, run_id=young_run, event_id=young_event, days=89)
    assert count(db, "SELECT count(*) FROM workflow_step_leases") == 4

    # One batch of one run deletes one run, its step and its lease history, and unlinks its claim.
    assert prune_lineages(db, "live", 90, 1) == {
        "runs": 1,
        "steps": 1,
        "parks": 0,
        "claims_unlinked": 1,
    }
    assert count(db, "SELECT count(*) FROM workflow_runs") == 3

    done = prune(db, Retention(batch=1))
    assert done["runs"] == 2 and done["steps"] == 2 and done["events"] == 3
    for event_id, run_id in old:
        assert not exists(db, "workflow_runs", "id", run_id)
        assert not exists(db, "workflow_trigger_events", "id", event_id)
        assert not exists(db, "delivery_claims", "event_id", event_id)
    assert exists(db, "workflow_runs", "id", young_run)
    assert exists(db, "workflow_trigger_events", "id", young_event)
    assert count(db, "SELECT count(*) FROM workflow_step_leases") == 1

    # Running it again changes nothing more.
    before = counts(db)
    again = prune(db, Retention(batch=1))
    assert all(v == 0 for v in again.values()), again
    assert counts(db) == before


def test_an_enrollment_of_once_per_record_outlives_its_run_and_the_record_never_enrolls_again(
    db: Database, conn: str
) -> None:
    wf = bind_workflow(db, "once", dedup="once_per_record")
    event_id, run_id = finished_run(db, conn, wf, "ada")
    age(db, run_id=run_id, event_id=event_id, days=91)
    prune(db, Retention())
    assert not exists(db, "workflow_runs", "id", run_id)
    assert count(db, "SELECT count(*) FROM workflow_enrollments WHERE run_id = :r", r=run_id) == 1
    again = admit_event(
        db, emit_event(db, connection_id=conn, object_id="ada"), publish=Published()
    )
    (outcome,) = again.outcomes
    assert (outcome.outcome, outcome.reason) == ("refused", "duplicate")
    assert run_id in str(outcome.detail)


def test_a_lineage_with_a_replay_not_finished_keeps_every_run_until_the_replay_is_old_too(
    db: Database, conn: str
) -> None:
    wf = bind_workflow(db, "replayed", dedup="every_time")
    event_id, original = finished_run(db, conn, wf, "r1")
    with db.transaction() as tx:
        replay = str(
            tx.scalar(
                OPS_SQL["ops_replay_run_insert"],
                run_id=original,
                version_id=tx.scalar(
                    "SELECT version_id FROM workflow_runs WHERE id = CAST(:r AS uuid)", r=original
                ),
                start_key="replay:test",
                replay_from=None,
                replay_by=None,
            )
        )
    age(db, run_id=original, event_id=event_id, days=200)
    prune(db, Retention())
    assert exists(db, "workflow_runs", "id", original) and exists(db, "workflow_runs", "id", replay)
    assert exists(db, "workflow_trigger_events", "id", event_id)

    # Finished, but within the retention: still kept.
    with db.transaction() as tx:
        tx.execute(
            "UPDATE workflow_runs SET status = 'succeeded', finished_at = now() WHERE id = :r",
            r=replay,
        )
    prune(db, Retention())
    assert exists(db, "workflow_runs", "id", original)

    age(db, run_id=replay, days=91)
    done = prune(db, Retention())
    assert done["runs"] == 2 and done["events"] == 1
    assert not exists(db, "workflow_runs", "id", original)


def test_runs_not_finished_are_never_deleted_however_old(db: Database, conn: str) -> None:
    wf = bind_workflow(
        db,
        "slow",
        dedup="every_time",
        steps=[{"id": "wait", "type": "delay", "config": {"seconds": 3600}}],
    )
    event_id = emit_event(db, connection_id=conn, object_id="s1")
    (outcome,) = admit_event(db, event_id, publish=Published()).outcomes
    with db.transaction() as tx:
        tx.execute(
            "UPDATE workflow_runs SET created_at = now() - interval '400 days' WHERE id = :r",
            r=outcome.run_id,
        )
    age(db, event_id=event_id, days=400)
    done = prune(db, Retention())
    assert all(v == 0 for v in done.values()), done
    assert exists(db, "workflow_runs", "id", outcome.run_id)
    assert exists(db, "workflow_trigger_events", "id", event_id)
    del wf


def test_the_credit_ledger_is_kept_for_good_with_the_ids_of_pruned_runs(
    db: Database, conn: str
) -> None:
    wf = bind_workflow(db, "priced", dedup="every_time")
    event_id, run_id = finished_run(db, conn, wf, "p1")
    with db.transaction() as tx:
        step_id = tx.scalar("SELECT id FROM workflow_steps WHERE run_id = :r", r=run_id)
        tx.execute(
            "INSERT INTO credit_ledger (tenant_id, lineage_key, amount, block_type, run_id,"
            " step_id) VALUES ('acme', 'k1', -3, 'end', :r, :s)",
            r=run_id,
            s=step_id,
        )
        tx.execute(
            "INSERT INTO budget_reservations (budget_key, idempotency_key, tenant_id, run_id,"
            " step_id, amount, status, settled_at) VALUES ('b', 'k1', 'acme', :r, :s, 3,"
            " 'spent', now())",
            r=run_id,
            s=step_id,
        )
    age(db, run_id=run_id, event_id=event_id, days=91)
    prune(db, Retention())
    assert not exists(db, "workflow_runs", "id", run_id)
    assert (
        count(
            db,
            "SELECT count(*) FROM credit_ledger WHERE run_id = :r AND step_id = :s",
            r=run_id,
            s=step_id,
        )
        == 1
    )
    assert exists(db, "budget_reservations", "run_id", run_id)


def test_an_open_budget_reservation_or_a_live_echo_marker_keeps_the_run(
    db: Database, conn: str
) -> None:
    wf = bind_workflow(db, "gated", dedup="every_time")
    reserved_event, reserved_run = finished_run(db, conn, wf, "g1")
    marked_event, marked_run = finished_run(db, conn, wf, "g2")
    with db.transaction() as tx:
        tx.execute(
            "INSERT INTO budget_reservations (budget_key, idempotency_key, tenant_id, run_id,"
            " step_id, amount, status) SELECT 'b', 'k2', 'acme', run_id, id, 3, 'reserved'"
            " FROM workflow_steps WHERE run_id = :r",
            r=reserved_run,
        )
        tx.execute(
            "INSERT INTO echo_markers (connection_id, object_type, object_id, field, value_hash,"
            " step_id, expires_at, keep_until) SELECT :c, 'contact', 'g2', 'f', '\\x00', id,"
            " now() + interval '5 minutes', now() + interval '1 day'"
            " FROM workflow_steps WHERE run_id = :r",
            c=conn,
            r=marked_run,
        )
    for event_id, run_id in ((reserved_event, reserved_run), (marked_event, marked_run)):
        age(db, run_id=run_id, event_id=event_id, days=91)
    prune(db, Retention())
    assert exists(db, "workflow_runs", "id", reserved_run)
    assert exists(db, "workflow_runs", "id", marked_run)

    # Settled and expired: nothing needs them any more.
    with db.transaction() as tx:
        tx.execute("UPDATE budget_reservations SET status = 'spent', settled_at = now()")
        tx.execute("UPDATE echo_markers SET expires_at = now() - interval '1 hour'")
    # Expired, but a late delivery of its echo may still come (its provider's horizon): kept.
    prune(db, Retention())
    assert exists(db, "workflow_runs", "id", marked_run)
    with db.transaction() as tx:
        tx.execute("UPDATE echo_markers SET keep_until = now() - interval '1 second'")
    assert prune(db, Retention())["runs"] == 1


def test_a_webhook_trigger_key_inside_its_ttl_keeps_its_event(db: Database, conn: str) -> None:
    wf = bind_workflow(db, "keyed", dedup="every_time")
    event_id, run_id = finished_run(db, conn, wf, "k1")
    with db.transaction() as tx:
        tx.execute(
            "INSERT INTO webhook_trigger_keys (workflow_id, key, event_id, expires_at)"
            " VALUES (:w, 'order-1', :e, now() + interval '1 day')",
            w=wf,
            e=event_id,
        )
    age(db, run_id=run_id, event_id=event_id, days=91)
    done = prune(db, Retention())
    assert done["runs"] == 1 and done["events"] == 0
    assert exists(db, "workflow_trigger_events", "id", event_id)
    # The event outlived its run: a redelivery of it is answered as handled, never admitted
    # again (its delivery claim stays with the event).
    (again,) = admit_event(db, event_id, publish=Published()).outcomes
    assert again.outcome == "handled" and again.run_id is None
    assert count(db, "SELECT count(*) FROM workflow_runs") == 0


def test_only_the_newest_cron_tick_of_a_workflow_keeps_its_event(db: Database, conn: str) -> None:
    wf = bind_workflow(db, "ticking", dedup="every_time")
    ticks = [finished_run(db, conn, wf, f"t{n}") for n in range(2)]
    with db.transaction() as tx:
        for n, (event_id, _run) in enumerate(ticks):
            tx.execute(
                "INSERT INTO cron_ticks (workflow_id, scheduled_at, status, event_id, detail)"
                " VALUES (:w, now() - make_interval(days => :d), 'fired', :e, 'fired')",
                w=wf,
                d=100 - n,
                e=event_id,
            )
    for event_id, run_id in ticks:
        age(db, run_id=run_id, event_id=event_id, days=91)
    done = prune(db, Retention())
    assert done["events"] == 1 and done["cron_ticks"] == 1
    assert exists(db, "workflow_trigger_events", "id", ticks[1][0])
    assert count(db, "SELECT count(*) FROM cron_ticks WHERE workflow_id = :w", w=wf) == 1


def test_processed_inbox_rows_past_retention_go_and_their_events_stay(
    db: Database, conn: str
) -> None:
    with db.transaction() as tx:
        rows = [
            int(
                tx.scalar(
                    "INSERT INTO webhook_inbox (connection_id, body_sha256, body, status,"
                    " finished_at) VALUES (:c, :h, '\\x7b7d', :s,"
                    " now() - make_interval(days => :d))"
                    " RETURNING id",
                    c=conn,
                    h=bytes([n]),
                    s=status,
                    d=days,
                )
            )
            for n, (status, days) in enumerate(
                (("processed", 31), ("processed", 29), ("dead", 400))
            )
        ]
        event_id = tx.scalar(
            "INSERT INTO workflow_trigger_events (tenant_id, connection_id, event_type, inbox_id,"
            " payload) VALUES ('acme', :c, :t, :i, '{}') RETURNING id",
            c=conn,
            t=EVENT_TYPE,
            i=rows[0],
        )
    done = prune(db, Retention())
    assert done["inbox"] == 1 and done["unlinked"] == 1
    assert not exists(db, "webhook_inbox", "id", rows[0])
    assert exists(db, "webhook_inbox", "id", rows[1]) and exists(db, "webhook_inbox", "id", rows[2])
    assert exists(db, "workflow_trigger_events", "id", event_id)


def test_rehearsal_runs_go_after_their_own_shorter_retention(db: Database, conn: str) -> None:
    wf = bind_workflow(db, "rehearsed", dedup="every_time")
    live_event, live_run = finished_run(db, conn, wf, "live")
    with db.transaction() as tx:
        rehearsal = str(
            tx.scalar(
                "INSERT INTO workflow_runs (tenant_id, workflow_id, version_id, start_key,"
                " event_id, dedup_mode, namespace, status, trigger_payload, lineage_root,"
                " finished_at) SELECT tenant_id, workflow_id, version_id, 'rehearsal:x', event_id,"
                " dedup_mode, 'rehearsal', 'succeeded', trigger_payload, gen_random_uuid(),"
                " now() - interval '8 days' FROM workflow_runs WHERE id = :r RETURNING id",
                r=live_run,
            )
        )
        tx.execute("UPDATE workflow_runs SET lineage_root = id WHERE id = :r", r=rehearsal)
    age(db, run_id=live_run, event_id=live_event, days=8)
    done = prune(db, Retention())
    assert done["rehearsal_runs"] == 1 and done["runs"] == 0
    assert not exists(db, "workflow_runs", "id", rehearsal)
    assert exists(db, "workflow_runs", "id", live_run)


def test_the_duty_is_registered_and_reads_its_days_from_the_environment(
    db: Database, conn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    wf = bind_workflow(db, "configured", dedup="every_time")
    event_id, run_id = finished_run(db, conn, wf, "c1")
    age(db, run_id=run_id, event_id=event_id, days=11)
    monkeypatch.setenv("ONCEFLOW_RUN_RETENTION_DAYS", "10")
    monkeypatch.setenv("ONCEFLOW_DECISION_RETENTION_DAYS", "10")
    duty = next(d for d in default_duties() if d.name == "retention")
    assert duty.run(db)["runs"] == 1
    d = SweepConfig.from_env({})
    assert (d.run_retention_days, d.decision_retention_days, d.inbox_retention_days) == (90, 90, 30)
    assert d.rehearsal_retention_days == 7
    with pytest.raises(ValueError, match="ONCEFLOW_INBOX_RETENTION_DAYS must be a whole"):
        SweepConfig.from_env({"ONCEFLOW_INBOX_RETENTION_DAYS": "0"})


def _plan_nodes(plan: Any) -> list[dict[str, Any]]:
    nodes = [plan]
    for child in plan.get("Plans", []):
        nodes.extend(_plan_nodes(child))
    return nodes


@pytest.mark.parametrize(
    ("query", "params", "entry"),
    [
        (LINEAGES_LOCK, {"namespace": "live", "days": 90, "batch": 500}, "workflow_runs_finished"),
        (
            LINEAGES_DELETE,
            {"roots": ["00000000-0000-0000-0000-000000000000"], "namespace": "live", "days": 90},
            "workflow_runs_lineage",
        ),
        (EVENTS_DELETE, {"days": 90, "batch": 500}, "workflow_trigger_events_decided"),
        (INBOX_DELETE, {"days": 30, "batch": 500}, "webhook_inbox_processed"),
        (BURSTS_DELETE, {"days": 90, "batch": 500}, "debounce_bursts_fired"),
        (RUN_STARTS_DELETE, {"days": 90, "batch": 500}, "run_start_queue_started"),
    ],
    ids=[
        "lineages_lock",
        "lineages_delete",
        "events_delete",
        "inbox_delete",
        "bursts_delete",
        "run_starts_delete",
    ],
)
def test_every_batch_is_found_through_an_index_never_a_table_scan(
    db: Database, query: Any, params: dict[str, Any], entry: str
) -> None:
    # With sequential scans priced out, a plan still holding one has no index to use.
    with db.transaction() as tx:
        tx.execute("SET LOCAL enable_seqscan = off")
        (row,) = tx.all(f"EXPLAIN (FORMAT JSON) {query.text}", **params)
    plan = row["QUERY PLAN"]
    plan = json.loads(plan) if isinstance(plan, str) else plan
    nodes = _plan_nodes(plan[0]["Plan"])
    scans = [n for n in nodes if n["Node Type"] == "Seq Scan"]
    assert scans == [], [n.get("Relation Name") for n in scans]
    # The batch starts from the retention's own partial index.
    assert entry in {n.get("Index Name") for n in nodes}


def test_every_foreign_key_into_a_pruned_table_has_an_index_on_its_column(db: Database) -> None:
    """Deleting a parent row checks each child table by its foreign key: without an index
    that is a full scan of the child per deleted row."""
    pruned = (
        "workflow_runs",
        "workflow_steps",
        "step_parks",
        "workflow_trigger_events",
        "webhook_inbox",
    )
    with db.transaction() as tx:
        missing = tx.all(
            """
            SELECT c.conrelid::regclass::text AS child, a.attname AS col
            FROM pg_constraint c
            JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = c.conkey[1]
            WHERE c.contype = 'f' AND c.confrelid::regclass::text = ANY(CAST(:pruned AS text[]))
              AND NOT EXISTS (
                  SELECT 1 FROM pg_index i
                  WHERE i.indrelid = c.conrelid AND i.indkey[0] = c.conkey[1])
            """,
            pruned=list(pruned),
        )
    assert missing == []


def failed_run(db: Database, conn: str, workflow_id: str, record: str, days: int) -> str:
    """A run whose step failed `days` ago: replayable while its lineage is young enough."""
    event_id, run_id = finished_run(db, conn, workflow_id, record)
    with db.transaction() as tx:
        tx.execute(
            "UPDATE workflow_steps SET status = 'failed', error = 'boom',"
            " error_class = 'permanent' WHERE run_id = :r",
            r=run_id,
        )
        tx.execute(
            "UPDATE workflow_runs SET status = 'failed', error = 'boom' WHERE id = :r", r=run_id
        )
    age(db, run_id=run_id, event_id=event_id, days=days)
    return run_id


def _wait_until_blocked_on_a_lock(tx: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        tx.execute("SELECT pg_stat_clear_snapshot()")  # activity is read once per transaction
        waiting = tx.scalar(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        if waiting:
            return
        time.sleep(0.02)
    raise AssertionError("the replay never waited for the lineage lock")


def test_a_replay_waiting_on_a_lineage_retention_is_deleting_answers_not_found(
    db: Database, conn: str
) -> None:
    """Retention holds the root; the replay waits for it, then finds the lineage gone: a 404,
    not a crash, and no run left half-replayed."""
    wf = bind_workflow(db, "raced", dedup="every_time")
    run_id = failed_run(db, conn, wf, "x1", days=2)
    outcome: list[BaseException | str] = []

    def replay() -> None:
        try:
            outcome.append(
                replay_run(db, run_id=run_id, tenant_scope=None, dispatch=Published()).run_id
            )
        except BaseException as exc:  # the assertion must reach the main thread
            outcome.append(exc)

    with db.transaction() as tx:
        roots = [str(r["id"]) for r in tx.all(LINEAGES_LOCK, namespace="live", days=1, batch=10)]
        assert roots == [run_id]
        thread = threading.Thread(target=replay)
        thread.start()
        _wait_until_blocked_on_a_lock(tx)
        tx.one(LINEAGES_DELETE, roots=roots, namespace="live", days=1)
    thread.join(10)
    (result,) = outcome
    assert isinstance(result, OpsError) and result.status == 404, result
    assert count(db, "SELECT count(*) FROM workflow_runs") == 0


def test_retention_skips_a_lineage_a_replay_holds_and_takes_it_once_the_replay_is_old(
    db: Database, conn: str
) -> None:
    wf = bind_workflow(db, "held", dedup="every_time")
    run_id = failed_run(db, conn, wf, "h1", days=2)
    barrier = threading.Barrier(2)
    deleted: list[dict[str, int]] = []

    def retention() -> None:
        barrier.wait()
        deleted.append(prune_lineages(db, "live", 1, 10))

    with db.transaction() as tx:
        tx.one(OPS_SQL["ops_run_lock"], lineage_root=run_id)
        thread = threading.Thread(target=retention)
        thread.start()
        barrier.wait()
        thread.join(10)
    assert deleted == [{"runs": 0, "steps": 0, "parks": 0, "claims_unlinked": 0}]
    replay = replay_run(db, run_id=run_id, tenant_scope=None, dispatch=Published()).run_id
    assert prune_lineages(db, "live", 1, 10)["runs"] == 0  # the replay is running
    with db.transaction() as tx:
        tx.execute(
            "UPDATE workflow_runs SET status = 'succeeded',"
            " finished_at = now() - interval '2 days' WHERE id = :r",
            r=replay,
        )
    assert prune_lineages(db, "live", 1, 10)["runs"] == 2


def test_a_pass_pauses_after_each_batch_so_deleting_takes_its_share_of_the_time(
    db: Database, conn: str
) -> None:
    wf = bind_workflow(db, "paced", dedup="every_time")
    for n in range(2):
        event_id, run_id = finished_run(db, conn, wf, f"p{n}")
        age(db, run_id=run_id, event_id=event_id, days=91)
    ticks = iter(range(10_000))
    slept: list[float] = []
    # Each clock reading is one second later: every batch "takes" one second.
    done = prune(
        db,
        Retention(batch=1, deleting_share=0.25, pass_seconds=1000),
        clock=lambda: float(next(ticks)),
        sleep=slept.append,
    )
    assert done["runs"] == 2 and done["events"] == 2
    # Two run batches and two event batches, each followed by three times its duration.
    assert slept == [3.0, 3.0, 3.0, 3.0]


def test_a_poll_record_keeps_the_event_it_announced(db: Database, conn: str) -> None:
    wf = bind_workflow(db, "polled", dedup="every_time")
    event_id, run_id = finished_run(db, conn, wf, "row-1")
    with db.transaction() as tx:
        tx.execute(
            "INSERT INTO poll_records (workflow_id, record_key, generation, attempts, event_id,"
            " status, stamped_at) VALUES (:w, 'row-1', 1, 1, :e, 'stamped', now())",
            w=wf,
            e=event_id,
        )
    age(db, run_id=run_id, event_id=event_id, days=91)
    done = prune(db, Retention())
    assert done["runs"] == 1 and done["events"] == 0
    assert exists(db, "workflow_trigger_events", "id", event_id)


def test_a_fired_burst_goes_after_its_run_and_a_held_event_is_kept(db: Database, conn: str) -> None:
    """Debounce (shared/admission/debounce.py): a fired burst is kept while its run exists
    (the run's scope lists its events); an event held in a burst not fired yet is never
    deleted, however old its decided_at."""
    from shared.admission.debounce_fire import fire_due_bursts
    from shared.core.duty import SweepReport
    from tests.admission_support import activate_text

    activate_text(
        db,
        "name: edits\ntenant: acme\ntrigger:\n  events: [hubspot.contact.property_changed]\n"
        "  dedup: every_time\n  debounce: {period: 5s}\nsteps:\n  - {id: start, type: end}\n",
    )
    fired = [emit_event(db, connection_id=conn, object_id="1") for _ in range(2)]
    for e in fired:
        admit_event(db, e, publish=lambda ids: None)
    with db.transaction() as tx:
        tx.execute("UPDATE debounce_bursts SET fire_at = now()")
    fire_due_bursts(db, SweepConfig(), lambda ids: None, SweepReport())
    held = emit_event(db, connection_id=conn, object_id="2")
    admit_event(db, held, publish=lambda ids: None)
    with db.transaction() as tx:
        tx.execute(
            "UPDATE debounce_bursts SET fired_at = now() - interval '91 days' "
            "WHERE status = 'fired'"
        )
        tx.execute("UPDATE workflow_trigger_events SET decided_at = now() - interval '91 days'")
    assert prune(db, Retention())["bursts"] == 0  # its run is still there
    assert count(db, "SELECT count(*) FROM debounce_bursts") == 2
    with db.transaction() as tx:
        tx.execute(
            "UPDATE workflow_runs SET finished_at = now() - interval '91 days', "
            "status = 'succeeded'"
        )
    done = prune(db, Retention())
    assert done["runs"] == 1 and done["bursts"] == 1
    assert count(db, "SELECT count(*) FROM debounce_bursts") == 1  # the open one
    assert exists(db, "workflow_trigger_events", "id", held)
    assert not exists(db, "workflow_trigger_events", "id", fired[0])


def test_a_queued_start_keeps_its_event_and_a_started_entry_goes(db: Database, conn: str) -> None:
    """A throttle's run-start queue (shared/admission/run_throttle.py): an event waiting in it
    is never deleted, however old its decided_at; a started entry goes after the retention."""
    from tests.admission_support import activate_text

    activate_text(
        db,
        "name: limited\ntenant: acme\ntrigger:\n  events: [hubspot.contact.property_changed]\n"
        "  dedup: every_time\n  throttle: {limit: 1, period: 1h}\nsteps:\n"
        "  - {id: start, type: end}\n",
    )
    started, waiting = (emit_event(db, connection_id=conn, object_id=str(i)) for i in range(2))
    for e in (started, waiting):
        admit_event(db, e, publish=lambda ids: None)
    with db.transaction() as tx:
        tx.execute("UPDATE workflow_trigger_events SET decided_at = now() - interval '91 days'")
        tx.execute(
            "INSERT INTO run_start_queue (tenant_id, workflow_id, throttle_key, event_id, status,"
            " run_id, version_id, dedup_mode, trigger_record, entry_node, entry_type,"
            " limit_per_window, window_seconds, due_at, started_at)"
            " SELECT tenant_id, workflow_id, throttle_key, event_id + 1000, 'started',"
            " gen_random_uuid(), version_id, dedup_mode, trigger_record, entry_node, entry_type,"
            " limit_per_window, window_seconds, due_at, now() - interval '91 days'"
            " FROM run_start_queue"
        )
    done = prune(db, Retention())
    assert done["run_starts"] == 1
    assert exists(db, "workflow_trigger_events", "id", waiting)
    assert count(db, "SELECT count(*) FROM run_start_queue WHERE status = 'queued'") == 1
