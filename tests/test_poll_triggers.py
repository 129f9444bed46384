"""Polling triggers, the processed-at pattern (shared/triggers/poll.py, sql_source.py), on real
Postgres: the index check refusing an unindexed source, each of 10,000 rows enrolled once while
stamps land late, the stamp policies, two pollers racing, a poll process killed mid-page, and
bad sources refused by validate, activation or (at run time) recorded without stopping."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from devstack import seed
from shared.admission.admit import admit_event
from shared.core.crashpoints import EXIT_CODE
from shared.core.db import Database, Tx
from shared.ingest.outbox import requeue_undecided
from shared.publishing import versions
from shared.publishing.validate import DefinitionInvalid, validate_text
from shared.steps.cancel import cancel_run
from shared.triggers import poll
from tests.admission_support import activate_text, admit, count, finish_run, make_tenant, settle
from tests.ops_support import bearer, client_fixture, dispatched_fixture, mint

__all__ = ["client_fixture", "dispatched_fixture"]

# A pass's time budget is the subject of one test; elsewhere a slow machine must not end a
# pass early.
UNBOUNDED = 3600.0
ROOT = Path(__file__).resolve().parent.parent
WHERE = "enrolled_at is null and plan = 'pro'"
INDEX = (
    "CREATE INDEX signups_pending ON acme.signups (id) WHERE enrolled_at IS NULL AND plan = 'pro'"
)


def source(
    policy: str = "on_success",
    *,
    dedup: str = "not_while_running",
    every: int = 60,
    table: str = "acme.signups",
    where: str = WHERE,
    key: str = "id",
    batch: int = 1000,
) -> str:
    return (
        "name: enroll\ntenant: acme\ntrigger:\n"
        f"  dedup: {dedup}\n"
        "  poll:\n"
        f"    every_seconds: {every}\n"
        f"    batch: {batch}\n"
        f'    table: {{table: {table}, key: {key}, stamp: enrolled_at, where: "{where}"}}\n'
        f"    stamp_policy: {policy}\n"
        "steps:\n  - {id: done, type: end}\n"
    )


@pytest.fixture
def signups(db: Database) -> Database:
    make_tenant(db)
    with db.transaction() as tx:
        tx.execute("CREATE SCHEMA acme")
        tx.execute(
            "CREATE TABLE acme.signups (id bigint PRIMARY KEY, email text NOT NULL,"
            " plan text NOT NULL, enrolled_at timestamptz)"
        )
    return db


def add_rows(db: Database, n: int, *, start: int = 1, plan: str = "pro") -> None:
    with db.transaction() as tx:
        tx.execute(
            "INSERT INTO acme.signups (id, email, plan) SELECT i, 'u' || i || '@x.test', :p"
            " FROM generate_series(CAST(:a AS bigint), CAST(:b AS bigint)) AS i",
            a=start,
            b=start + n - 1,
            p=plan,
        )


def source_of(db: Database, workflow_id: str) -> poll.PollSource:
    with db.transaction() as tx:
        (row,) = [r for r in poll.active_sources(tx) if r[0] == workflow_id]
    return poll.load_source(*row)


def poll_events(db: Database, workflow_id: str) -> list[dict[str, Any]]:
    with db.transaction() as tx:
        return tx.all(
            "SELECT id, record_object_id AS key, payload FROM workflow_trigger_events"
            " WHERE event_type = :e ORDER BY id",
            e=poll.event_type_for(workflow_id),
        )


def stamped(db: Database) -> int:
    return count(db, "SELECT count(*) FROM acme.signups WHERE enrolled_at IS NOT NULL")


# ------------------------------------------------------------------ the index check


def test_activation_refuses_an_unindexed_source_and_shows_the_index_to_add(
    signups: Database,
) -> None:
    with pytest.raises(DefinitionInvalid) as refused:
        activate_text(signups, source())
    (problem,) = refused.value.report.errors
    assert problem.where == "trigger.poll.table"
    assert "no index answers the poll query on acme.signups" in problem.message
    suggested = problem.message.split("add: ", 1)[1]
    assert suggested == (
        'CREATE INDEX CONCURRENTLY signups_enrolled_at_pending ON "acme"."signups" ("id") '
        'WHERE "enrolled_at" IS NULL AND "plan" = \'pro\';'
    )
    # An index on the key alone is not enough: the pending rows are what must be answered.
    with signups.transaction() as tx:
        tx.execute("CREATE INDEX signups_plan ON acme.signups (plan)")
    with pytest.raises(DefinitionInvalid):
        activate_text(signups, source())
    # The suggestion, as given (outside a transaction block, as CONCURRENTLY requires).
    with signups.transaction() as tx:
        tx.execute("COMMIT")
        tx.execute(suggested)
        tx.execute("BEGIN")
    assert activate_text(signups, source())


def test_activation_accepts_a_small_source_whose_partial_index_exists(signups: Database) -> None:
    """A small table, every row pending, its partial index larger than its primary key (rows
    deleted since it was built): the planner walks the primary key and filters, which EXPLAIN
    shows as "no index answers". The partial index is judged by its definition instead."""
    add_rows(signups, 5_000)
    with signups.transaction() as tx:
        tx.execute(INDEX)
        tx.execute("DELETE FROM acme.signups WHERE id > 3")
        tx.execute("COMMIT")
        tx.execute("VACUUM acme.signups")
        tx.execute("BEGIN")
        tx.execute("REINDEX INDEX acme.signups_pkey")
        tx.execute("ANALYZE acme.signups")
    with signups.transaction() as tx:  # what the planner prefers here
        tx.execute("SET LOCAL enable_seqscan = off")
        plan = tx.all(
            "EXPLAIN SELECT id FROM acme.signups WHERE enrolled_at IS NULL AND plan = 'pro'"
            " ORDER BY id LIMIT 1000"
        )
    assert "signups_pkey" in str(plan)
    workflow_id = activate_text(signups, source())
    assert poll.poll_pass(signups, source_of(signups, workflow_id)).emitted == 3
    # An index that does not answer the query is still refused: a partial index on another
    # condition, or one whose first column is not the key.
    with signups.transaction() as tx:
        tx.execute("DROP INDEX acme.signups_pending")
        tx.execute("CREATE INDEX signups_free ON acme.signups (id) WHERE plan = 'free'")
        tx.execute(
            "CREATE INDEX signups_by_email ON acme.signups (email)"
            " WHERE enrolled_at IS NULL AND plan = 'pro'"
        )
        tx.execute("ANALYZE acme.signups")
    with pytest.raises(DefinitionInvalid) as refused:
        activate_text(signups, source().replace("name: enroll", "name: enroll-2"))
    assert "no index answers the poll query" in refused.value.report.errors[0].message


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"table": "acme.nope"}, "table acme.nope does not exist"),
        ({"key": "uid"}, "has no column uid"),
        ({"where": "enrolled_at is null and tier = 'pro'"}, "has no column tier"),
    ],
)
def test_activation_refuses_a_missing_table_or_column(
    signups: Database, kwargs: dict[str, str], words: str
) -> None:
    with pytest.raises(DefinitionInvalid) as refused:
        activate_text(signups, source(**kwargs))  # type: ignore[arg-type]
    assert words in refused.value.report.errors[0].message


def point_at(tx: Tx, workflow_id: str, table: str) -> None:
    """Rewrite the stored definitions of the workflow to poll `table`, as a version stored by
    a release before the tenant-schema rule could (versions are immutable: the trigger that
    says so is held off for this transaction only)."""
    tx.execute("SET LOCAL session_replication_role = replica")
    tx.execute(
        "UPDATE workflow_versions SET definition = jsonb_set(definition,"
        " '{trigger,poll,table,table}', to_jsonb(CAST(:t AS text))) WHERE workflow_id = :w",
        t=table,
        w=workflow_id,
    )


def test_one_tenants_workflow_cannot_read_another_tenants_table(signups: Database) -> None:
    """Each tenant's tables live in the schema named after it; a poll naming any other schema
    is refused by validate, by activation, and (activated before the rule) by every pass."""
    with signups.transaction() as tx:
        tx.execute(INDEX)
        seed.tenant(tx, "globex")
        tx.execute("CREATE SCHEMA globex")
        tx.execute(
            "CREATE TABLE globex.signups (id bigint PRIMARY KEY, email text NOT NULL,"
            " plan text NOT NULL, enrolled_at timestamptz)"
        )
        tx.execute(
            "CREATE INDEX globex_pending ON globex.signups (id)"
            " WHERE enrolled_at IS NULL AND plan = 'pro'"
        )
        tx.execute("INSERT INTO globex.signups VALUES (1, 'ceo@globex.test', 'pro', NULL)")
    theirs = source(table="globex.signups")
    report = validate_text(theirs, "wf.yaml")
    (problem,) = [p for p in report.errors if p.where == "trigger.poll.table.table"]
    assert "tenant 'acme' polls only its own tables" in problem.message
    assert "`acme.signups`, not `globex.signups`" in problem.message
    # Versions stored before the rule: activation refuses them.
    for other in ("app.signups", "globex.signups"):  # no tenant's schema, another tenant's
        with signups.transaction() as tx:
            renamed = source().replace("name: enroll", f"name: enroll-{other.split('.')[0]}")
            published = versions.publish(tx, renamed)
            point_at(tx, published.workflow_id, other)
        with pytest.raises(DefinitionInvalid) as refused, signups.transaction() as tx:
            versions.activate(
                tx,
                tenant_id="acme",
                workflow_id=published.workflow_id,
                version_id=published.version_id,
            )
        (problem,) = refused.value.report.errors
        assert problem.where == "trigger.poll.table.table"
        assert "polls only its own tables" in problem.message
    # A definition activated before the rule: the pass refuses it, reads and stamps nothing.
    workflow_id = activate_text(signups, source())
    with signups.transaction() as tx:
        point_at(tx, workflow_id, "globex.signups")
    result = poll.poll_due_sources(signups)
    assert "polls only its own tables" in result["errors"][workflow_id]
    assert poll_events(signups, workflow_id) == []
    with signups.transaction() as tx:
        assert tx.scalar("SELECT enrolled_at FROM globex.signups WHERE id = 1") is None


# ------------------------------------------------------------------ validate


@pytest.mark.parametrize(
    ("text", "path", "words"),
    [
        (source(every=30), "trigger.poll.every_seconds", "at least 60"),
        (source(table="signups"), "trigger.poll.table.table", "schema.table"),
        (source(table="public.tenants"), "trigger.poll.table.table", "onceflow's own"),
        (source(where="plan = 'pro'"), "trigger.poll.table.where", "starts with `enrolled_at is"),
        (
            source(where="enrolled_at is null or 1 = 1"),
            "trigger.poll.table.where",
            "joined with `and`",
        ),
        (
            source(where="enrolled_at is null and plan = (select 'x')"),
            "trigger.poll.table.where",
            "expected a literal",
        ),
        (source(dedup="once_per_record"), "trigger.dedup", "refused as a duplicate"),
    ],
)
def test_bad_sources_are_located_validate_errors(text: str, path: str, words: str) -> None:
    report = validate_text(text, "wf.yaml")
    problems = [p for p in report.errors if p.where == path]
    assert problems, report.problems
    assert words in problems[0].message
    assert problems[0].line is not None


@pytest.mark.parametrize(
    ("policy", "words"),
    [
        ("on_success", "starts a run every pass forever"),
        ("on_attempt", "not retried by the poll"),
        ("{after_attempts: 3}", "get 3 tries"),
    ],
)
def test_each_stamp_policy_is_explained_in_a_warning(policy: str, words: str) -> None:
    report = validate_text(source(policy))
    assert report.ok, report.problems
    (warning,) = [p for p in report.warnings if p.where == "trigger.poll.stamp_policy"]
    assert words in warning.message


def test_a_stamp_policy_must_be_declared() -> None:
    text = source().replace("    stamp_policy: on_success\n", "")
    report = validate_text(text)
    assert any(
        p.where == "trigger.poll.stamp_policy" and "missing" in p.message for p in report.errors
    )


# ------------------------------------------------------------------ polling


def test_ten_thousand_rows_each_enrolled_once_while_stamps_land_late(signups: Database) -> None:
    with signups.transaction() as tx:
        tx.execute(INDEX)
    add_rows(signups, 10_000)
    add_rows(signups, 50, start=20_001, plan="free")  # not in the source's `where`
    workflow_id = activate_text(signups, source())
    src = source_of(signups, workflow_id)
    # The whole table in one pass, however slow the machine: the pass's time budget is
    # another test's subject.
    first = poll.poll_pass(signups, src, budget_seconds=UNBOUNDED)
    assert (first.rows, first.emitted, first.pages) == (10_000, 10_000, 11)
    # Re-polled before any stamp lands (nothing admitted yet, then runs still going): nothing.
    again = poll.poll_pass(signups, src, budget_seconds=UNBOUNDED)
    assert (again.emitted, again.waiting) == (0, 10_000)
    events = poll_events(signups, workflow_id)
    assert len(events) == 10_000 and len({e["key"] for e in events}) == 10_000
    assert events[0]["payload"]["row"]["email"] == "u1@x.test"
    for event in events[:3]:
        settle(signups, event["id"], "succeeded")
    settle(signups, events[3]["id"], "failed")
    third = poll.poll_pass(signups, src, budget_seconds=UNBOUNDED)
    # The three succeeded rows are stamped at last; the failed one is tried again (attempt 2).
    assert (third.stamped, third.emitted) == (3, 1)
    assert stamped(signups) == 3
    (retry,) = poll_events(signups, workflow_id)[10_000:]
    assert retry["key"] == events[3]["key"] and retry["payload"]["attempt"] == 2
    assert poll.poll_pass(signups, src, budget_seconds=UNBOUNDED).emitted == 0


def test_a_pass_stops_at_its_time_budget_and_the_next_pass_carries_on(signups: Database) -> None:
    with signups.transaction() as tx:
        tx.execute(INDEX)
    add_rows(signups, 30)
    workflow_id = activate_text(signups, source(batch=10))
    src = source_of(signups, workflow_id)
    ticks = iter(range(1000))  # a clock that moves a second per reading

    def clock() -> float:
        return float(next(ticks))

    first = poll.poll_pass(signups, src, budget_seconds=0.5, clock=clock)
    assert (first.pages, first.emitted) == (1, 10)
    # The next pass starts from the beginning: the first page now waits, the rest is emitted.
    rest = poll.poll_pass(signups, src, budget_seconds=UNBOUNDED)
    assert (rest.waiting, rest.emitted) == (10, 20)
    assert len(poll_events(signups, workflow_id)) == 30


def test_on_attempt_stamps_with_the_event_and_a_cleared_stamp_starts_a_new_run(
    signups: Database,
) -> None:
    with signups.transaction() as tx:
        tx.execute(INDEX)
    add_rows(signups, 20)
    workflow_id = activate_text(signups, source("on_attempt", dedup="once_per_record"))
    src = source_of(signups, workflow_id)
    assert poll.poll_pass(signups, src, budget_seconds=UNBOUNDED).emitted == 20
    assert stamped(signups) == 20
    first_runs = [admit(signups, e["id"]) for e in poll_events(signups, workflow_id)]
    assert all(first_runs)
    assert poll.poll_pass(signups, src, budget_seconds=UNBOUNDED).rows == 0
    with signups.transaction() as tx:  # the application asks for row 7 to be handled again
        tx.execute("UPDATE acme.signups SET enrolled_at = NULL WHERE id = 7")
    # While generation 1's run is still going, the row is left alone.
    assert poll.poll_pass(signups, src, budget_seconds=UNBOUNDED).waiting == 1
    finish_run(signups, first_runs[6], "succeeded")
    assert poll.poll_pass(signups, src, budget_seconds=UNBOUNDED).emitted == 1
    last = poll_events(signups, workflow_id)[-1]
    assert (last["key"], last["payload"]["generation"]) == ("7", 2)
    # Generation 2 is a new run of the row, admitted under once_per_record (not `duplicate`).
    second_run = admit(signups, last["id"])
    assert second_run is not None and second_run not in first_runs
    assert stamped(signups) == 20
    # Still once per generation: the same event admitted again starts nothing new.
    assert admit_event(signups, last["id"], publish=lambda ids: None).outcomes[0].outcome == (
        "handled"
    )


def test_after_attempts_gives_up_and_stamps_after_n_failures(signups: Database) -> None:
    with signups.transaction() as tx:
        tx.execute(INDEX)
    add_rows(signups, 1)
    workflow_id = activate_text(signups, source("{after_attempts: 2}"))
    src = source_of(signups, workflow_id)
    for attempt in (1, 2):
        assert poll.poll_pass(signups, src, budget_seconds=UNBOUNDED).emitted == 1
        settle(signups, poll_events(signups, workflow_id)[-1]["id"], "failed")
        assert poll_events(signups, workflow_id)[-1]["payload"]["attempt"] == attempt
    report = poll.poll_pass(signups, src, budget_seconds=UNBOUNDED)
    assert (report.emitted, report.gave_up) == (0, 1)
    assert stamped(signups) == 1
    with signups.transaction() as tx:
        assert tx.scalar("SELECT status FROM poll_records") == "gave_up"


def test_on_success_never_restarts_a_run_a_person_cancelled(signups: Database) -> None:
    with signups.transaction() as tx:
        tx.execute(INDEX)
    add_rows(signups, 2)
    workflow_id = activate_text(signups, source("on_success"))
    src = source_of(signups, workflow_id)
    assert poll.poll_pass(signups, src, budget_seconds=UNBOUNDED).emitted == 2
    first, second = poll_events(signups, workflow_id)
    cancelled = cancel_run(signups, str(admit(signups, first["id"])), by="ops:ann", reason="no")
    assert cancelled is not None and cancelled.moved  # a person cancelled row 1's run
    settle(signups, second["id"], "failed")  # row 2's run failed: tried again
    report = poll.poll_pass(signups, src, budget_seconds=UNBOUNDED)
    assert report.emitted == 1  # row 2 only: row 1 is not started again
    assert report.cancelled == 1
    (retry,) = poll_events(signups, workflow_id)[2:]
    assert retry["key"] == second["key"]
    # Row 1 is stamped and its generation closed as cancelled (ops sees why it stopped).
    with signups.transaction() as tx:
        assert tx.scalar("SELECT enrolled_at IS NOT NULL FROM acme.signups WHERE id = 1")
        assert tx.scalar("SELECT status FROM poll_records WHERE record_key = '1'") == "cancelled"
    assert poll.poll_pass(signups, src, budget_seconds=UNBOUNDED).emitted == 0


def test_an_event_given_up_as_undelivered_is_tried_again_not_left_pending(
    signups: Database,
) -> None:
    with signups.transaction() as tx:
        tx.execute(INDEX)
    add_rows(signups, 1)
    workflow_id = activate_text(signups, source("on_success"))
    src = source_of(signups, workflow_id)
    assert poll.poll_pass(signups, src, budget_seconds=UNBOUNDED).emitted == 1
    (lost,) = poll_events(signups, workflow_id)
    # Published, never decided, and given up by the sweep's redelivery cap.
    with signups.transaction() as tx:
        tx.execute(
            "UPDATE workflow_trigger_events SET published_at = now() - interval '1 hour'"
            " WHERE id = :e",
            e=lost["id"],
        )
    given_up = requeue_undecided(signups, after_seconds=0, max_redeliveries=0, batch=10)
    assert given_up.given_up == (lost["id"],)
    report = poll.poll_pass(signups, src, budget_seconds=UNBOUNDED)
    assert (report.emitted, report.waiting) == (1, 0)
    (retry,) = poll_events(signups, workflow_id)[1:]
    assert (retry["key"], retry["payload"]["attempt"]) == (lost["key"], 2)
    assert admit(signups, retry["id"]) is not None


def test_two_pollers_racing_emit_each_row_once(signups: Database) -> None:
    with signups.transaction() as tx:
        tx.execute(INDEX)
    add_rows(signups, 2_000)
    workflow_id = activate_text(signups, source(batch=500))
    src = source_of(signups, workflow_id)
    barrier = threading.Barrier(2)
    reports: list[poll.PassReport] = []

    def poller() -> None:
        barrier.wait(timeout=10)
        reports.append(poll.poll_pass(signups, src, budget_seconds=UNBOUNDED))

    threads = [threading.Thread(target=poller) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sum(r.emitted for r in reports) == 2_000
    events = poll_events(signups, workflow_id)
    assert len(events) == 2_000 and len({e["key"] for e in events}) == 2_000


def test_two_passes_overlapping_while_they_stamp_start_no_second_generation(
    signups: Database,
) -> None:
    """Two passes over rows whose runs all succeeded, at a barrier: each stamps what the other
    may just have stamped. A row one pass stamped and committed must not look "cleared by the
    application" to the other (it read the row, then its poll state, in two snapshots)."""
    with signups.transaction() as tx:
        tx.execute(INDEX)
    rows = 500
    add_rows(signups, rows)
    workflow_id = activate_text(signups, source("on_success", batch=10))
    src = source_of(signups, workflow_id)
    assert poll.poll_pass(signups, src, budget_seconds=UNBOUNDED).emitted == rows
    for event in poll_events(signups, workflow_id):  # every run succeeded
        settle(signups, event["id"], "succeeded")
    barrier = threading.Barrier(2)
    reports: list[poll.PassReport] = []

    def poller() -> None:
        barrier.wait(timeout=10)
        reports.append(poll.poll_pass(signups, src, budget_seconds=UNBOUNDED))

    threads = [threading.Thread(target=poller) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert len(reports) == 2
    # Every row stamped, by exactly one of the two passes, and nothing started again.
    assert sum(r.stamped for r in reports) == rows and stamped(signups) == rows
    assert sum(r.emitted for r in reports) == 0
    assert len(poll_events(signups, workflow_id)) == rows
    with signups.transaction() as tx:
        assert tx.scalar("SELECT max(generation) FROM poll_records") == 1


def test_a_poll_killed_mid_page_loses_and_duplicates_nothing(
    signups: Database, database_url: str
) -> None:
    with signups.transaction() as tx:
        tx.execute(INDEX)
    add_rows(signups, 3_000)
    workflow_id = activate_text(signups, source("on_attempt", dedup="once_per_record", batch=1000))
    env = dict(
        os.environ,
        DATABASE_URL=database_url,
        NO_GCE_CHECK="true",
        ONCEFLOW_ENABLE_CRASH_POINTS="1",
        ONCEFLOW_CRASH_POINTS="poll_mid_page:1500",  # half way through the second page
    )
    script = (
        "from shared.core.db import get_database\n"
        "from shared.triggers import poll\n"
        "db = get_database()\n"
        "with db.transaction() as tx:\n"
        "    (row,) = poll.active_sources(tx)\n"
        "poll.poll_pass(db, poll.load_source(*row), budget_seconds=3600)\n"
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
    # The first page committed (events and stamps together); the second left nothing.
    assert len(poll_events(signups, workflow_id)) == 1000 and stamped(signups) == 1000
    poll.poll_pass(signups, source_of(signups, workflow_id), budget_seconds=UNBOUNDED)
    events = poll_events(signups, workflow_id)
    assert len(events) == 3_000 and len({e["key"] for e in events}) == 3_000
    assert stamped(signups) == 3_000


def test_a_source_broken_after_activation_is_recorded_and_the_others_still_poll(
    signups: Database, client: Any
) -> None:
    with signups.transaction() as tx:
        tx.execute(INDEX)
        tx.execute("CREATE TABLE acme.orders (id bigint PRIMARY KEY, enrolled_at timestamptz)")
        tx.execute("CREATE INDEX orders_pending ON acme.orders (id) WHERE enrolled_at IS NULL")
        tx.execute("INSERT INTO acme.orders (id) VALUES (1), (2)")
    add_rows(signups, 2)
    broken = activate_text(signups, source())
    orders = (
        source()
        .replace("name: enroll", "name: orders")
        .replace("acme.signups", "acme.orders")
        .replace(WHERE, "enrolled_at is null")
    )
    healthy = activate_text(signups, orders)
    with signups.transaction() as tx:
        tx.execute("DROP INDEX acme.signups_pending")
    result = poll.poll_due_sources(signups)
    assert result["polled"] == 1 and result["emitted"] == 2
    assert "no index answers the poll query" in result["errors"][broken]
    assert len(poll_events(signups, healthy)) == 2 and poll_events(signups, broken) == []
    with signups.transaction() as tx:
        error = tx.scalar("SELECT last_error FROM poll_sources WHERE workflow_id = :w", w=broken)
    assert "CREATE INDEX" in error
    # Within its period it is not tried again (no tight loop on a broken source).
    assert poll.poll_due_sources(signups)["polled"] == 0
    # Ops sees why: the trigger's status carries the poll's last error.
    shown = client.get(f"/v1/workflows/{broken}/trigger", headers=bearer(mint(signups, "acme")))
    assert shown.get_json()["kind"] == "poll"
    assert "CREATE INDEX" in shown.get_json()["detail"]["last_error"]


def test_a_minute_source_is_polled_on_every_tick_of_a_minute_schedule_despite_jitter(
    signups: Database,
) -> None:
    """The sweep ends when nothing is due, so a source polled every 60 s is polled once per
    scheduler tick; a tick a little under 60 s after the previous one (scheduler jitter) must
    not skip it to the tick after — the rule the sweep's duties follow (shared/core/duty.py)."""
    with signups.transaction() as tx:
        tx.execute(INDEX)
    add_rows(signups, 1)
    workflow_id = activate_text(signups, source())
    assert poll.poll_due_sources(signups)["polled"] == 1
    with signups.transaction() as tx:
        tx.execute(
            "UPDATE poll_sources SET last_polled_at = now() - interval '58 seconds'"
            " WHERE workflow_id = :w",
            w=workflow_id,
        )
    assert poll.poll_due_sources(signups)["polled"] == 1
    assert poll.poll_due_sources(signups)["polled"] == 0  # but not twice within one tick
