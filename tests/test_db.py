"""shared.core.db: named blocks run as statements prepared once per pooled connection, and that
cache
survives None/value parameter changes, dropped connections, failed prepares and schema changes
without changing how errors are translated."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from uuid import UUID

import pg8000.native
import pytest

from shared.core.db import Database, Tx, connector_from_env, parse_database_url
from shared.core.errors import ConflictError, PermanentError, TransientError, classify_sqlstate
from shared.core.queries import Query

TWICE = Query("db_test_twice", "SELECT CAST(:n AS int) + 1 AS m -- db_test_twice")
BY_NAME = Query(
    "db_test_by_name",
    "SELECT count(*) AS n FROM tenants WHERE name = coalesce(:name, name) -- db_test_by_name",
)


@pytest.fixture
def pool(database_url: str) -> Iterator[Database]:
    database = Database(connector_from_env({"DATABASE_URL": database_url}), pool_size=1)
    try:
        yield database
    finally:
        database.close()


def _prepared(tx: Tx, marker: str) -> list[int]:
    """How often each statement prepared on this connection whose text holds `marker` ran."""
    rows = tx.all(
        "SELECT generic_plans + custom_plans AS runs FROM pg_prepared_statements "
        "WHERE statement LIKE '%' || :marker",
        marker=marker,
    )
    return [r["runs"] for r in rows]


def test_a_named_block_run_twice_on_one_connection_is_prepared_once(pool: Database) -> None:
    assert pool.run(lambda tx: tx.scalar(TWICE, n=1)) == 2
    assert pool.run(lambda tx: tx.scalar(TWICE, n=41)) == 42
    with pool.transaction() as tx:
        assert _prepared(tx, "db_test_twice") == [2]
        # Ad hoc strings are not prepared (they could grow the cache without bound).
        tx.scalar("SELECT 1 -- db_test_adhoc")
        assert _prepared(tx, "db_test_adhoc") == []


def test_none_then_a_value_then_another_type_use_the_same_prepared_statement(
    pool: Database,
) -> None:
    with pool.transaction() as tx:
        tx.execute("INSERT INTO tenants (id, name) VALUES ('t-a', 'acme'), ('t-b', 'beta')")
    assert pool.run(lambda tx: tx.scalar(BY_NAME, name=None)) == 2
    assert pool.run(lambda tx: tx.scalar(BY_NAME, name="acme")) == 1
    assert pool.run(lambda tx: tx.scalar(BY_NAME, name=None)) == 2
    # The parameter's type comes from the statement, not from the first value sent.
    assert pool.run(lambda tx: tx.scalar(TWICE, n=None)) is None
    assert pool.run(lambda tx: tx.scalar(TWICE, n="6")) == 7
    with pool.transaction() as tx:
        assert _prepared(tx, "db_test_by_name") == [3]
        assert _prepared(tx, "db_test_twice") == [2]


def test_a_dropped_connection_is_replaced_and_prepares_again(
    pool: Database, database_url: str
) -> None:
    with pool.transaction() as tx:
        assert tx.scalar(TWICE, n=1) == 2
        first = tx.scalar("SELECT pg_backend_pid()")
    admin = pg8000.native.Connection(**parse_database_url(database_url))
    try:
        admin.run("SELECT pg_terminate_backend(:pid)", pid=first)
    finally:
        admin.close()
    with pytest.raises(TransientError), pool.transaction() as tx:
        tx.scalar(TWICE, n=1)
    with pool.transaction() as tx:
        assert tx.scalar(TWICE, n=2) == 3
        assert tx.scalar("SELECT pg_backend_pid()") != first
        assert _prepared(tx, "db_test_twice") == [1]


INSERT_A = Query(
    "db_test_insert_a", "INSERT INTO db_test_pipe (a) VALUES (:a) RETURNING a -- db_test_insert_a"
)


def _pipe_table(pool: Database) -> None:
    with pool.transaction() as tx:
        tx.execute("CREATE TABLE db_test_pipe (a int UNIQUE)")


def _pipe_rows(pool: Database) -> list[int]:
    with pool.transaction() as tx:
        return [r["a"] for r in tx.all("SELECT a FROM db_test_pipe ORDER BY a")]


def test_begin_travels_with_the_first_statement_and_still_opens_a_transaction(
    pool: Database,
) -> None:
    """BEGIN is written together with the first prepared statement (no round trip of its
    own), yet the statements are one transaction: an error in the third undoes the first
    two, and the first one of the next transaction (pipelined this time: prepared already)
    is inside a transaction too."""
    _pipe_table(pool)
    with pytest.raises(ConflictError), pool.transaction() as tx:
        tx.execute(INSERT_A, a=1)  # prepared on this connection: BEGIN sent on its own
        tx.execute(INSERT_A, a=2)
        tx.execute(INSERT_A, a=2)
    assert _pipe_rows(pool) == []
    with pytest.raises(ConflictError), pool.transaction() as tx:
        tx.execute(INSERT_A, a=3)  # BEGIN pipelined with it
        assert tx.scalar("SELECT now() = statement_timestamp()") is False  # in a transaction
        tx.execute(INSERT_A, a=3)
    assert _pipe_rows(pool) == []
    pool.round_trips.reset()
    with pool.transaction() as tx:
        tx.execute(INSERT_A, a=4)
        tx.execute(INSERT_A, a=5)
    assert pool.round_trips.count == 3  # two statements and the COMMIT: no BEGIN of its own
    assert _pipe_rows(pool) == [4, 5]
    pool.round_trips.reset()
    with pool.transaction():
        pass  # nothing sent, nothing to commit
    assert pool.round_trips.count == 0


def test_commit_with_commits_in_the_statements_round_trip_or_rolls_back_on_its_error(
    pool: Database,
) -> None:
    _pipe_table(pool)
    pool.round_trips.reset()
    with pool.transaction() as tx:
        tx.execute(INSERT_A, a=1)
        assert tx.commit_with(INSERT_A, a=2) == [{"a": 2}]
        with pytest.raises(PermanentError, match="already committed"):
            tx.execute(INSERT_A, a=3)  # nothing may run after the commit
    assert pool.round_trips.count == 2  # two statements, no COMMIT (the third never left)
    assert _pipe_rows(pool) == [1, 2]
    # The last statement fails: the COMMIT behind it is a ROLLBACK, the first is undone too,
    # the error is the statement's own, and the connection is clean for the next transaction.
    with pytest.raises(ConflictError) as caught, pool.transaction() as tx:
        tx.execute(INSERT_A, a=7)
        tx.commit_with(INSERT_A, a=1)
    assert caught.value.constraint == "db_test_pipe_a_key"
    assert _pipe_rows(pool) == [1, 2]  # (pool_size 1: the same connection, usable again)
    # A single-statement transaction: BEGIN, the statement and COMMIT in one round trip.
    pool.round_trips.reset()
    with pool.transaction() as tx:
        tx.commit_with(INSERT_A, a=8)
    assert pool.round_trips.count == 1
    assert _pipe_rows(pool) == [1, 2, 8]


def test_a_savepoint_undoes_only_its_own_writes(pool: Database) -> None:
    _pipe_table(pool)
    with pool.transaction() as tx:
        with tx.savepoint():  # the transaction's first statement: BEGIN goes with it
            tx.execute(INSERT_A, a=1)
        with pytest.raises(ConflictError), tx.savepoint():
            tx.execute(INSERT_A, a=2)
            tx.execute(INSERT_A, a=1)
        tx.execute(INSERT_A, a=3)
    assert _pipe_rows(pool) == [1, 3]


def test_a_statement_that_fails_to_prepare_is_translated_as_before_and_not_cached(
    pool: Database,
) -> None:
    missing = Query("db_test_missing", "SELECT count(*) FROM db_test_later")
    with pytest.raises(PermanentError, match="42P01"), pool.transaction() as tx:
        tx.scalar(missing)
    with pool.transaction() as tx:
        tx.execute("CREATE TABLE db_test_later (a int UNIQUE)")
    assert pool.run(lambda tx: tx.scalar(missing)) == 0
    insert = Query("db_test_insert", "INSERT INTO db_test_later (a) VALUES (:a)")
    assert pool.run(lambda tx: tx.execute(insert, a=1)) == 1
    with pytest.raises(ConflictError) as caught, pool.transaction() as tx:
        tx.execute(insert, a=1)
    assert caught.value.constraint == "db_test_later_a_key"


def test_a_schema_change_under_prepared_statements_retries_on_fresh_connections(
    database_url: str,
) -> None:
    db = Database(connector_from_env({"DATABASE_URL": database_url}), pool_size=2)
    everything = Query("db_test_everything", "SELECT * FROM db_test_wide")
    try:
        with db.transaction() as tx:
            tx.execute("CREATE TABLE db_test_wide (a int)")
            tx.execute("INSERT INTO db_test_wide VALUES (1)")
        # Both pooled connections prepare the statement (from two threads: one thread never
        # holds two connections of a pool).
        ready, release = threading.Event(), threading.Event()

        def hold_one() -> None:
            with db.transaction() as one:
                assert one.all(everything) == [{"a": 1}]
                ready.set()
                release.wait(10)

        holder = threading.Thread(target=hold_one)
        holder.start()
        assert ready.wait(10)
        with db.transaction() as two:
            assert two.all(everything) == [{"a": 1}]
        release.set()
        holder.join(10)
        with db.transaction() as tx:
            tx.execute("ALTER TABLE db_test_wide ADD COLUMN b int DEFAULT 7")
        # The first attempt meets a stale statement; the second must not meet the other one.
        assert db.run(lambda tx: tx.all(everything), attempts=2) == [{"a": 1, "b": 7}]
    finally:
        db.close()


def test_feature_not_supported_at_execution_stays_permanent(pool: Database) -> None:
    """0A000 is a whole class of errors: only the plan cache's "must not change result type"
    is retried; any other stays permanent and keeps the connection."""
    part = Query("db_test_part", "SELECT date_part(:unit, interval '1 day') AS v")
    assert pool.run(lambda tx: tx.scalar(part, unit="day")) == 1.0
    pid = pool.run(lambda tx: tx.scalar("SELECT pg_backend_pid()"))
    with pytest.raises(PermanentError, match="0A000"):
        pool.run(lambda tx: tx.scalar(part, unit="week"))
    assert pool.run(lambda tx: tx.scalar("SELECT pg_backend_pid()")) == pid


def test_tcp_connections_turn_nagle_off(database_url: str) -> None:
    """A statement larger than pg8000's 8 KiB write buffer leaves in two sends; with Nagle on,
    the second waited ~40 ms for the server's delayed ACK (the 50-binding admit statement)."""
    conn = connector_from_env({"DATABASE_URL": database_url})()
    try:
        sock = conn._usock
        assert sock.family in (socket.AF_INET, socket.AF_INET6)  # the test cluster is on TCP
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    finally:
        conn.close()


def test_text_lists_reach_postgres_exactly_as_given(pool: Database) -> None:
    """Flat lists of str/None are encoded by shared.core.db, not pg8000 (its per-character escaping
    was admission's largest CPU cost). Every element must read back as sent, including
    "null", which pg8000's own encoding turned into SQL NULL (it left it unquoted)."""
    tricky = [
        "plain",
        "",
        "NULL",
        "null",
        "Null",
        None,
        'a"quote',
        "back\\slash",
        "\\",
        '"',
        "x,y",
        "{braces}",
        " spaced ",
        "tab\there",
        "new\nline",
        "ünï",
        "a'b",
        '\\"{},',
    ]
    with pool.transaction() as tx:
        row = tx.one(
            "SELECT CAST(:texts AS text[]) AS texts, CAST(:ids AS int[]) AS ids, "
            "CAST(:empty AS text[]) AS empty, CAST(:uuids AS uuid[]) AS uuids",
            texts=tricky,
            ids=[1, 2, None],  # not text: pg8000 encodes it, as before
            empty=[],
            uuids=["00000000-0000-0000-0000-000000000001", None],
        )
    assert row == {
        "texts": tricky,
        "ids": [1, 2, None],
        "empty": [],
        "uuids": [UUID(int=1), None],
    }


def test_a_thread_never_holds_two_connections_of_one_pool(database_url: str) -> None:
    """Hold-and-wait deadlocks a pool under concurrency (N threads each holding one of N
    connections and waiting for another); the pool refuses the second checkout at once."""
    from shared.core.db import NestedCheckout

    db = Database(connector_from_env({"DATABASE_URL": database_url}), pool_size=4)
    try:
        with db.transaction(), pytest.raises(NestedCheckout), db.transaction():
            pass
        # The refusal released nothing it didn't take: the pool still serves every slot.
        assert db.run(lambda tx: tx.scalar("SELECT 1")) == 1
    finally:
        db.close()


def test_every_pooled_connection_has_the_session_limits(database_url: str) -> None:
    from shared.core.db import SessionLimits

    limits = SessionLimits(
        statement_timeout_ms=1500, lock_timeout_ms=700, idle_in_transaction_timeout_ms=9000
    )
    db = Database(connector_from_env({"DATABASE_URL": database_url}), limits=limits)
    try:
        with db.transaction() as tx:
            got = {
                name: tx.scalar(f"SHOW {name}")
                for name in (
                    "statement_timeout",
                    "lock_timeout",
                    "idle_in_transaction_session_timeout",
                )
            }
        assert got == {
            "statement_timeout": "1500ms",
            "lock_timeout": "700ms",
            "idle_in_transaction_session_timeout": "9s",
        }
        # A statement over its limit is a transient error (retry, or nack for redelivery).
        with pytest.raises(TransientError, match="57014"), db.transaction() as tx:
            tx.execute("SELECT pg_sleep(3)")
    finally:
        db.close()


def test_session_limits_come_from_the_environment_and_refuse_nonsense() -> None:
    from shared.core.db import SessionLimits

    env = {"DB_STATEMENT_TIMEOUT_MS": "0", "DB_LOCK_TIMEOUT_MS": "250"}
    assert SessionLimits.from_env(env) == SessionLimits(
        statement_timeout_ms=0, lock_timeout_ms=250, idle_in_transaction_timeout_ms=60_000
    )
    with pytest.raises(PermanentError, match="DB_LOCK_TIMEOUT_MS"):
        SessionLimits.from_env({"DB_LOCK_TIMEOUT_MS": "soon"})


@pytest.mark.parametrize(
    ("sqlstate", "expected"),
    [
        ("40001", TransientError),  # serialization_failure
        ("40P01", TransientError),  # deadlock_detected
        ("55P03", TransientError),  # lock_not_available (lock_timeout)
        ("57014", TransientError),  # query_canceled (statement_timeout)
        ("25P03", TransientError),  # idle_in_transaction_session_timeout
        ("08006", TransientError),  # connection_failure
        ("23505", ConflictError),
        ("22P02", PermanentError),
    ],
)
def test_sqlstates_are_classified_for_retry(sqlstate: str, expected: type) -> None:
    assert classify_sqlstate(sqlstate) is expected


def test_a_real_deadlock_is_a_transient_error(database_url: str) -> None:
    """Two transactions lock two rows in opposite orders: Postgres breaks the cycle with
    40P01, which must reach the caller as transient (retry), not permanent."""
    db = Database(connector_from_env({"DATABASE_URL": database_url}), pool_size=2)
    barrier = threading.Barrier(2)
    outcomes: list[BaseException | None] = []
    try:
        db.run(lambda tx: tx.execute("CREATE TABLE db_test_dl (id int PRIMARY KEY)"))
        db.run(lambda tx: tx.execute("INSERT INTO db_test_dl VALUES (1), (2)"))

        def lock(first: int, second: int) -> None:
            try:
                with db.transaction() as tx:
                    tx.execute("UPDATE db_test_dl SET id = id WHERE id = :i", i=first)
                    barrier.wait(10)
                    tx.execute("UPDATE db_test_dl SET id = id WHERE id = :i", i=second)
                outcomes.append(None)
            except BaseException as exc:
                outcomes.append(exc)

        threads = [threading.Thread(target=lock, args=a) for a in ((1, 2), (2, 1))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        errors = [o for o in outcomes if o is not None]
        assert len(outcomes) == 2 and len(errors) == 1
        assert isinstance(errors[0], TransientError) and "40P01" in str(errors[0])
    finally:
        db.close()


def _concurrent_transactions(db: Database, threads: int) -> None:
    """`threads` threads released together, each running three short transactions that
    overlap (pg_sleep), as a process serving `threads` requests at once does."""
    barrier = threading.Barrier(threads)
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            barrier.wait(timeout=30)
            for _ in range(3):
                with db.transaction() as tx:
                    tx.scalar("SELECT pg_sleep(0.05)")
        except BaseException as exc:
            errors.append(exc)

    workers = [threading.Thread(target=worker) for _ in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(60)
    assert not errors, errors[:3]


def test_a_pool_sized_for_the_concurrency_never_makes_a_request_wait(database_url: str) -> None:
    """pool_size_for(N): N request threads (a thread holds at most one connection) plus the
    background thread; N threads at once never find the pool empty. The pool's own counters
    say so, and they do see a pool that is too small."""
    from shared.core.db import pool_size_for

    threads = 8
    db = Database(connector_from_env({"DATABASE_URL": database_url}), pool_size_for(threads))
    small = Database(connector_from_env({"DATABASE_URL": database_url}), pool_size=2)
    try:
        _concurrent_transactions(db, threads)
        assert db.waited == 0
        assert 2 <= db.peak_in_use <= threads < db.pool_size
        _concurrent_transactions(small, 4)
        assert small.waited > 0 and small.peak_in_use == 2
    finally:
        db.close()
        small.close()


def test_json_and_jsonb_arrive_decoded_and_text_stays_text(pool: Database) -> None:
    """Decided once in shared/core/db.py: readers of json/jsonb columns never json.loads."""
    named = Query(
        "db_test_json",
        "SELECT CAST('{\"a\": [1, 2]}' AS jsonb) AS obj, CAST('[1, \"x\"]' AS json) AS arr,"
        " CAST('\"a string\"' AS jsonb) AS string, CAST('null' AS jsonb) AS null_json,"
        " CAST(NULL AS jsonb) AS sql_null, CAST(CAST('{\"a\": 1}' AS jsonb) AS text) AS text"
        " -- db_test_json",
    )
    for statement in (named, named.text):  # prepared, and ad hoc
        with pool.transaction() as tx:
            row = tx.one(statement)
        assert row == {
            "obj": {"a": [1, 2]},
            "arr": [1, "x"],
            "string": "a string",
            "null_json": None,
            "sql_null": None,
            "text": '{"a": 1}',
        }


def test_no_reader_decodes_a_json_column_again() -> None:
    """The guard the decision above replaced (`json.loads(x) if isinstance(x, str) else x`, or
    the same as an `if`) appears nowhere in shared/."""
    import re
    from pathlib import Path

    guard = re.compile(
        r"isinstance\((\w+(?:\[[^]]+\])?), str[^)]*\)[^\n]*\n?[^\n]*json\.loads\(\1\)"
    )
    inline = re.compile(r"json\.loads\((\w+(?:\[[^]]+\])?)\) if isinstance\(\1, str")
    for path in sorted(Path("shared").rglob("*.py")):
        text = path.read_text()
        assert not guard.search(text) and not inline.search(text), path


def test_a_pinned_thread_runs_every_transaction_on_one_connection(database_url: str) -> None:
    """Database.pinned (issue 27: one connection per step): the transactions a thread opens
    meanwhile run one after the other on the same backend; one inside another is refused as
    without a pin; other threads still get their own; a broken pinned connection is replaced
    for the next transaction."""
    from shared.core.db import NestedCheckout

    db = Database(connector_from_env({"DATABASE_URL": database_url}), pool_size=2)
    try:
        with db.pinned():
            pids = {db.run(lambda tx: tx.scalar("SELECT pg_backend_pid()")) for _ in range(3)}
            with db.transaction(), pytest.raises(NestedCheckout), db.transaction():
                pass
            other: list[int] = []
            worker = threading.Thread(
                target=lambda: other.append(db.run(lambda tx: tx.scalar("SELECT pg_backend_pid()")))
            )
            worker.start()
            worker.join()
            with pytest.raises(TransientError), db.transaction() as tx:
                tx.execute("SELECT pg_terminate_backend(pg_backend_pid())")
            after = db.run(lambda tx: tx.scalar("SELECT pg_backend_pid()"))
        assert len(pids) == 1 and other and other[0] not in pids
        assert after not in pids  # the broken one was dropped and replaced under the pin
        assert db.peak_in_use == 2  # this thread's pin and the other thread's one
    finally:
        db.close()


def test_statements_ahead_travel_with_the_next_and_fail_with_it(database_url: str) -> None:
    """Tx.ahead: once prepared, a queued statement runs right before the next one in its
    round trip, in order (the next one sees what it did); a failure ahead fails the next
    statement with the first error, and the transaction rolls back."""
    db = Database(connector_from_env({"DATABASE_URL": database_url}), pool_size=1)
    setup = Query("ahead_setup", "CREATE TEMP TABLE IF NOT EXISTS t_ahead (x int)")
    write = Query("ahead_write", "INSERT INTO t_ahead VALUES (:x)")
    count = Query("ahead_count", "SELECT count(*) FROM t_ahead WHERE x = :x")
    bad = Query("ahead_bad", "SELECT 1 / (CAST(:x AS int) - CAST(:x AS int))")
    try:
        seen = []
        for _ in range(2):  # the first prepares them one by one, the second pipelines
            with db.transaction() as tx:
                tx.execute(setup)
                db.round_trips.reset()
                tx.ahead(write, x=7)
                seen.append((tx.scalar(count, x=7), db.round_trips.count))
        assert seen[0][0] == 1 and seen[1][0] == 2
        assert seen[1][1] == 1  # the write and the count in one round trip
        with pytest.raises(PermanentError, match="division by zero"), db.transaction() as tx:
            tx.ahead(bad, x=1)
            tx.execute(write, x=8)
        with db.transaction() as tx:
            assert tx.scalar(count, x=8) == 0
    finally:
        db.close()
