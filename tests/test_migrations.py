"""Migrations: all apply to an empty database, re-running is a no-op, edits are refused,
and a failing file leaves the database as it was."""

from __future__ import annotations

from pathlib import Path

import pg8000.dbapi
import pytest

from shared.core.db import parse_database_url
from shared.core.migrate import MigrationError, apply_all, discover


def _connect(url: str) -> pg8000.dbapi.Connection:
    return pg8000.dbapi.connect(**parse_database_url(url))


def _tables(conn: pg8000.dbapi.Connection) -> set[str]:
    cur = conn.cursor()
    cur.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
    return {r[0] for r in cur.fetchall()}


def test_every_migration_applies_to_an_empty_database_and_twice_is_a_noop(
    empty_database_url: str,
) -> None:
    migrations = discover()
    conn = _connect(empty_database_url)
    try:
        applied = apply_all(conn, migrations, log=False)
        assert [m.version for m in applied] == [m.version for m in migrations]
        tables = _tables(conn)
        # The tables the engine's queries name exist.
        for table in (
            "webhook_inbox",
            "workflow_trigger_events",
            "workflow_runs",
            "workflow_steps",
            "admission_refusals",
            "delivery_claims",
            "trigger_bindings",
            "credit_ledger",
            "schema_migrations",
        ):
            assert table in tables
        assert apply_all(conn, migrations, log=False) == []
    finally:
        conn.close()


def test_an_edited_migration_is_refused_naming_the_file(
    empty_database_url: str, tmp_path: Path
) -> None:
    for m in discover():
        (tmp_path / m.path.name).write_text(m.sql)
    conn = _connect(empty_database_url)
    try:
        apply_all(conn, discover(tmp_path), log=False)
        first = sorted(tmp_path.glob("*.sql"))[0]
        first.write_text(first.read_text() + "\n-- edited\n")
        with pytest.raises(MigrationError, match=first.name):
            apply_all(conn, discover(tmp_path), log=False)
    finally:
        conn.close()


def test_a_failing_migration_leaves_the_database_as_it_was(
    empty_database_url: str, tmp_path: Path
) -> None:
    (tmp_path / "0001_good.sql").write_text("CREATE TABLE good (id int);")
    (tmp_path / "0002_bad.sql").write_text(
        "CREATE TABLE half_done (id int);\nSELECT no_such_function();"
    )
    conn = _connect(empty_database_url)
    try:
        with pytest.raises(MigrationError, match=r"0002_bad\.sql.*no_such_function"):
            apply_all(conn, discover(tmp_path), log=False)
        tables = _tables(conn)
        assert "good" in tables
        assert "half_done" not in tables
        cur = conn.cursor()
        cur.execute("SELECT version FROM schema_migrations")
        assert [r[0] for r in cur.fetchall()] == [1]
    finally:
        conn.close()


def test_0251_skips_the_steps_left_pending_under_cancelled_runs(empty_database_url: str) -> None:
    """Rows as issue 23 item 12's bug left them: a cancelled run with a pending step (and a
    running run's pending step, which stays). After 0251 the first is skipped, saying why."""
    migrations = discover()
    before = [m for m in migrations if m.version < 251]
    conn = _connect(empty_database_url)
    try:
        apply_all(conn, before, log=False)
        cur = conn.cursor()
        cur.execute("INSERT INTO tenants (id, name) VALUES ('acme', 'acme')")
        cur.execute("INSERT INTO workflows (tenant_id, name) VALUES ('acme', 'wf') RETURNING id")
        (workflow_id,) = cur.fetchone()
        cur.execute(
            "INSERT INTO workflow_versions (workflow_id, number, content_hash, definition,"
            " source_text) VALUES (%s, 1, repeat('a', 64), '{}', '{}') RETURNING id",
            (workflow_id,),
        )
        (version_id,) = cur.fetchone()
        runs = {}
        for status in ("cancelled", "running"):
            cur.execute(
                "INSERT INTO workflow_runs (id, tenant_id, workflow_id, version_id, start_key,"
                " dedup_mode, namespace, lineage_root, trigger_payload)"
                " VALUES (gen_random_uuid(), 'acme', %s, %s, %s, 'every_time', 'live',"
                " gen_random_uuid(), '{}') RETURNING id",
                (workflow_id, version_id, f"test:{status}"),
            )
            (runs[status],) = cur.fetchone()
            cur.execute(
                "INSERT INTO workflow_steps (run_id, step_key, node_id, block_type,"
                " idempotency_key) VALUES (%s, 's1', 's1', 'end', %s)",
                (runs[status], f"k:{status}"),
            )
        cur.execute(
            "UPDATE workflow_runs SET status = 'cancelled', finished_at = now(),"
            " cancelled_by = 'alice' WHERE id = %s",
            (runs["cancelled"],),
        )
        conn.commit()
        assert 251 in [m.version for m in apply_all(conn, migrations, log=False)]
        cur = conn.cursor()
        cur.execute(
            "SELECT r.status, s.status, s.outcome_code, s.error, s.finished_at IS NOT NULL"
            " FROM workflow_steps s JOIN workflow_runs r ON r.id = s.run_id ORDER BY r.status"
        )
        rows = cur.fetchall()
        assert [tuple(r[:3]) for r in rows] == [
            ("cancelled", "skipped", "CANCELLED"),
            ("running", "pending", None),
        ]
        assert "migration 0251" in rows[0][3] and rows[0][4]
    finally:
        conn.close()
