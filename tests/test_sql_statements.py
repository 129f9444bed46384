"""Checks over every named SQL statement, so a broken one fails here and not at 3 a.m.

1. Every block in every `shared/sql/*.sql` file prepares on the migrated schema (a renamed
   column, a dropped table, a parameter whose type Postgres cannot infer all fail to prepare).
2. Every statement, in any file, that writes `workflow_steps` or `workflow_runs` is declared in
   `shared/steps/states.py` with the status moves it makes, each move is in the transition
   table, and the statuses the table knows are exactly those the schema's CHECK allows (read
   from the migrated database, not from a migration file).
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path
from typing import Any

import pg8000.exceptions
import pytest

from shared.core import queries
from shared.core.db import Database, _converted

SQL_FILES = sorted(
    p.name.removesuffix(".sql")
    for p in resources.files("shared").joinpath("sql").iterdir()
    if p.name.endswith(".sql")
)
ALL_QUERIES = [(f, name) for f in SQL_FILES for name in queries.load(f).names()]


def test_the_sql_folder_is_read_whole() -> None:
    assert len(SQL_FILES) >= 10 and "steps" in SQL_FILES and "ops" in SQL_FILES
    assert len(ALL_QUERIES) > 100


def test_every_named_statement_prepares_on_the_migrated_schema(db: Database) -> None:
    """Prepared exactly as the pool prepares them (protocol-level Parse + Describe on a pooled
    connection, no parameter types), so utility statements such as SAVEPOINT count too."""
    failures: list[str] = []
    # One transaction, each Parse in a savepoint: a failure aborts only its own check.
    with db.transaction() as tx:
        tx.scalar("SELECT 1")  # opens the transaction (BEGIN travels with the first statement)
        conn = tx._session.conn  # the pool's own connection and prepare path
        for file, name in ALL_QUERIES:
            statement, _ = _converted(queries.load(file)[name].text)
            conn.execute_simple("SAVEPOINT prepare_check")
            try:
                prepared, _, _ = conn.prepare_statement(statement, ())
                conn.close_prepared_statement(prepared)
                conn.execute_simple("RELEASE SAVEPOINT prepare_check")
            except pg8000.exceptions.DatabaseError as exc:
                failures.append(f"{file}.sql {name}: {exc.args[0].get('M', exc)}")
                conn.execute_simple("ROLLBACK TO SAVEPOINT prepare_check")
    assert not failures, "\n".join(failures)


def test_a_statement_that_does_not_match_the_schema_fails_to_prepare(db: Database) -> None:
    """The check above can fail: a statement naming a column the schema lacks is refused."""
    statement, _ = _converted("UPDATE workflow_steps SET no_such_column = 1 WHERE id = :id")
    with db.transaction() as tx:
        tx.scalar("SELECT 1")  # opens the transaction (BEGIN travels with the first statement)
        conn = tx._session.conn
        with pytest.raises(pg8000.exceptions.DatabaseError, match="no_such_column"):
            conn.prepare_statement(statement, ())
        conn.execute_simple("ROLLBACK")
        conn.execute_simple("BEGIN")


def _writes(text: str, table: str) -> bool:
    return re.search(rf"\b(UPDATE|INSERT INTO|DELETE FROM)\s+{table}\b", text) is not None


WRITERS = {
    table: sorted(
        (f, name) for f, name in ALL_QUERIES if _writes(queries.load(f)[name].text, table)
    )
    for table in ("workflow_steps", "workflow_runs")
}


def test_statements_writing_steps_and_runs_are_found_in_every_file() -> None:
    files = {f for rows in WRITERS.values() for f, _ in rows}
    assert {"steps", "ops", "admission"} <= files, files


# --- what a statement's text says it does to a status column ----------------------------------


def _strip(text: str) -> str:
    """The statement without comments, string literals kept."""
    return re.sub(r"--[^\n]*", "", text)


def _depth_map(text: str) -> list[int]:
    """Parenthesis depth at each character, ignoring parentheses inside string literals."""
    depth, quoted, out = 0, False, []
    for ch in text:
        if ch == "'":
            quoted = not quoted
        elif not quoted and ch == "(":
            depth += 1
        elif not quoted and ch == ")":
            depth -= 1
        out.append(depth)
    return out


def _clause_end(text: str, depths: list[int], start: int, words: tuple[str, ...]) -> int:
    """Where the clause starting at `start` ends: the first of `words` at the same depth, the
    parenthesis closing its depth, or the end of the statement."""
    level = depths[start]
    pattern = re.compile(r"\b(" + "|".join(words) + r")\b") if words else None
    for i in range(start, len(text)):
        if depths[i] < level:
            return i
        if pattern and depths[i] == level and pattern.match(text, i):
            return i
    return len(text)


def _literals(text: str, known: set[str]) -> set[str]:
    return {v for v in re.findall(r"'([a-z_]+)'", text) if v in known}


def status_writes(text: str, table: str, known: set[str], default: str) -> list[tuple[str, Any]]:
    """Every write to `table` in the statement: ("update", (guard statuses, new statuses or
    "param" when a parameter sets it, empty when status is not assigned)) or ("insert", new
    statuses or "copied" when taken from another row's status)."""
    text = _strip(text)
    depths = _depth_map(text)
    found: list[tuple[str, Any]] = []
    for m in re.finditer(rf"\bUPDATE\s+{table}\b(?:\s+(?!SET\b)([a-z]\w*))?\s+SET\b", text):
        alias = m.group(1)
        set_start = m.end()
        set_end = _clause_end(text, depths, set_start, ("FROM", "WHERE", "RETURNING"))
        assignment = re.search(r"(?:^|,)\s*status\s*=", text[set_start:set_end])
        targets: Any = set()
        if assignment is not None:
            a_start = set_start + assignment.end()
            a_end = a_start
            while a_end < set_end and not (text[a_end] == "," and depths[a_end] == depths[a_start]):
                a_end += 1
            expr = text[a_start:a_end]
            targets = "param" if re.search(r":\w", expr) else _literals(expr, known)
        where = re.compile(r"\bWHERE\b").search(text, set_end)
        guards: set[str] = set()
        if where is not None and depths[where.start()] == depths[m.start()]:
            w_end = _clause_end(text, depths, where.end(), ("RETURNING",))
            clause = text[where.end() : w_end]
            column = rf"{alias}\.status" if alias else r"(?<![.\w])status"
            for g in re.finditer(rf"{column}\s*(=|IN)\s*(\([^)]*\)|'[a-z_]+')", clause):
                guards |= _literals(g.group(2), known)
        found.append(("update", (guards, targets)))
    for m in re.finditer(rf"\bINSERT INTO\s+{table}\s*\(([^)]*)\)", text):
        columns = [c.strip() for c in m.group(1).split(",")]
        if "status" not in columns:
            found.append(("insert", {default}))
            continue
        body_end = _clause_end(text, depths, m.end(), ("RETURNING", "ON"))
        body = text[m.end() : body_end]
        literals = _literals(body, known)
        found.append(("insert", literals if literals else "copied"))
    return found


def _called_sql_functions(tx: Any, text: str) -> list[str]:
    """The bodies of the SQL-language functions `text` calls, from the migrated database."""
    names = sorted(set(re.findall(r"\b([a-z_]\w*)\s*\(", _strip(text))))
    rows = tx.all(
        "SELECT p.prosrc FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang"
        " WHERE l.lanname = 'sql' AND p.proname = ANY(CAST(:names AS text[]))",
        names="{" + ",".join(names) + "}",
    )
    return [row["prosrc"] for row in rows]


def _schema_statuses(tx: Any, table: str) -> tuple[set[str], str]:
    """The statuses the CHECK on `table.status` allows, and the column's default, from the
    migrated database's catalog."""
    definition = tx.scalar(
        "SELECT pg_get_constraintdef(c.oid) FROM pg_constraint c"
        " JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attname = 'status'"
        " WHERE c.conrelid = CAST(:t AS regclass) AND c.contype = 'c'"
        " AND c.conkey = ARRAY[a.attnum]",
        t=table,
    )
    default = tx.scalar(
        "SELECT pg_get_expr(d.adbin, d.adrelid) FROM pg_attrdef d"
        " JOIN pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum"
        " WHERE d.adrelid = CAST(:t AS regclass) AND a.attname = 'status'",
        t=table,
    )
    assert definition is not None and default is not None, table
    return set(re.findall(r"'([a-z_]+)'", definition)), re.findall(r"'([a-z_]+)'", default)[0]


@pytest.mark.parametrize("table", ["workflow_steps", "workflow_runs"])
def test_every_statement_that_writes_steps_or_runs_makes_only_allowed_moves(
    db: Database, table: str
) -> None:
    from shared.steps import states

    machine = states.MACHINES[table]
    with db.transaction() as tx:
        allowed_by_schema, default = _schema_statuses(tx, table)
    # The enum and the schema's CHECK list the same statuses.
    assert allowed_by_schema == {s.value for s in machine.statuses}, table
    known = allowed_by_schema

    writers = {name for _, name in WRITERS[table]}
    assert len(writers) == len(WRITERS[table]), "a statement name is used in two files"
    declared_writers = set(machine.statements) | machine.deletes
    assert writers == declared_writers, (
        f"declare these in shared/steps/states.py: {sorted(writers - declared_writers)}; "
        f"no longer write {table}: {sorted(declared_writers - writers)}"
    )
    by_name = {name: queries.load(f)[name].text for f, name in WRITERS[table]}
    for name in machine.deletes:
        # A deleter deletes rows of the table and moves none, guarded on the run having ended
        # (in its text, or in a SQL function it calls: the rule's one home).
        text = by_name[name]
        assert re.search(rf"\bDELETE FROM {table}\b", text), name
        assert status_writes(text, table, known, default) == [], name
        with db.transaction() as tx:
            called = _called_sql_functions(tx, text)
        assert "finished_at IS NULL" in _strip(text + "".join(called)), name
    for name, declared in machine.statements.items():
        sources = {s.value for s in declared.sources}
        targets = {s.value for s in declared.targets}
        # Declared moves are in the transition table (rewriting a row in the status it is in
        # is not a move); new rows start in a status the table allows.
        for old in declared.sources:
            for new in declared.targets:
                assert new == old or (old, new) in machine.transitions, (name, old, new)
        if not declared.sources:
            assert declared.targets <= machine.initial, (name, declared.targets)
        # And the text does what the declaration says.
        found = status_writes(by_name[name], table, known, default)
        assert found, name
        found_guards: set[str] = set()
        found_targets: set[str] = set()
        found_inserts: set[str] = set()
        for kind, value in found:
            # A statement that moves rows may also insert some, when it says which.
            assert kind == "update" or not declared.sources or declared.inserts, (name, kind)
            assert kind == "insert" or declared.sources, (name, kind)
            if kind == "insert" and declared.sources:
                assert value not in ("param", "copied"), (name, value)
                found_inserts |= value
                continue
            if kind == "insert":
                new = value
            else:
                guard, new = value
                assert guard, f"{name}: an UPDATE of {table} not guarded on its status"
                found_guards |= guard
            if new in ("param", "copied"):
                # The status comes from a parameter or another row: only the declaration says.
                assert name in machine.dynamic, (name, f"its new status is {new}")
                new = targets
            found_targets |= new
        assert found_guards == sources, (name, found_guards)
        assert found_targets == targets, (name, found_targets)
        assert found_inserts == {s.value for s in declared.inserts}, (name, found_inserts)
        assert declared.inserts <= machine.initial, (name, declared.inserts)


def test_every_statement_that_ends_a_lease_records_it_in_the_lease_history(db: Database) -> None:
    """The claim opens a history row; every statement that moves a step out of running closes
    it, and the schema's CHECK (as the migrated database has it) allows exactly the statuses
    that statement moves the step to."""
    from shared.steps.states import LEASE_ENDED_BY, STEP_STATEMENTS, LeaseEnd, StepStatus

    sql = queries.load("steps")
    assert "INSERT INTO workflow_step_leases" in sql["steps_claim"].text
    leaving_running = {
        name
        for name, (sources, targets, _) in STEP_STATEMENTS.items()
        if StepStatus.RUNNING in sources and targets - {StepStatus.RUNNING}
    }
    assert leaving_running == set(LEASE_ENDED_BY.values())
    with db.transaction() as tx:
        checks = [
            r["d"]
            for r in tx.all(
                "SELECT pg_get_constraintdef(oid) AS d FROM pg_constraint"
                " WHERE conrelid = CAST('workflow_step_leases' AS regclass) AND contype = 'c'"
            )
        ]
    kinds = next(d for d in checks if d.startswith("CHECK ((end_kind = ANY"))
    assert set(re.findall(r"'([a-z_]+)'", kinds)) == {k.value for k in LeaseEnd}
    fits = next(d for d in checks if "end_status" in d)
    for kind, name in LEASE_ENDED_BY.items():
        text = sql[name].text
        assert "UPDATE workflow_step_leases" in text and f"end_kind = '{kind}'" in text, name
        allowed = re.search(
            rf"end_kind = '{kind}'::text\) AND \(end_status = ANY \(ARRAY\[(.*?)\]", fits
        )
        assert allowed is not None, kind
        assert set(re.findall(r"'([a-z_]+)'", allowed.group(1))) == set(
            STEP_STATEMENTS[name].targets
        ), kind


def test_the_ops_models_name_the_statuses_of_the_one_list() -> None:
    """The ops API's models spell the statuses out as Literals (so the OpenAPI document lists
    them inline); they are the enums above, which the test above holds to the schema's CHECK."""
    from typing import get_args

    from shared.ops import models
    from shared.steps import states

    assert set(get_args(models.RunStatus)) == {s.value for s in states.RunStatus}
    assert set(get_args(models.StepStatus)) == {s.value for s in states.StepStatus}


def test_the_event_type_pattern_is_the_outbox_check(db: Database) -> None:
    """One pattern for an event type (shared/workflows/definition.py EVENT_TYPE_PATTERN: a
    definition's trigger, the outbox's emit, the ops API's supplied event), and it is the
    CHECK the migrated database has on workflow_trigger_events.event_type."""
    from shared.workflows.definition import EVENT_TYPE_PATTERN

    with db.transaction() as tx:
        definition = tx.scalar(
            "SELECT pg_get_constraintdef(c.oid) FROM pg_constraint c"
            " JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attname = 'event_type'"
            " WHERE c.conrelid = CAST('workflow_trigger_events' AS regclass)"
            " AND c.contype = 'c' AND c.conkey = ARRAY[a.attnum]"
        )
    found = re.search(r"event_type ~ '(.*)'::text", str(definition))
    assert found is not None, definition
    assert found.group(1) == EVENT_TYPE_PATTERN
    # And nothing else in shared/ re-types it.
    for path in sorted(Path("shared").rglob("*.py")):
        if path.as_posix() != "shared/workflows/definition.py":
            assert EVENT_TYPE_PATTERN not in path.read_text(), path


def test_every_sql_list_of_the_finished_step_statuses_is_the_terminal_set() -> None:
    """Statements spell "finished" as a list of statuses (`status NOT IN ('succeeded', …)`):
    each such list is states.TERMINAL, so a new terminal status can't be missed in one."""
    from shared.steps.states import TERMINAL, StepStatus

    statuses = {s.value for s in StepStatus}
    found = 0
    for path in sorted(Path("shared/sql").glob("*.sql")):
        text = _strip(path.read_text())
        for group in re.findall(r"\(\s*('[a-z_]+'(?:\s*,\s*'[a-z_]+')*)\s*\)", text):
            members = set(re.findall(r"'([a-z_]+)'", group))
            if members <= statuses and {"succeeded", "skipped"} <= members:
                assert members == {s.value for s in TERMINAL}, (path, group)
                found += 1
    assert found >= 5
