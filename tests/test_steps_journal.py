"""The step journal: rows, keys and idempotency keys (real Postgres)."""

from __future__ import annotations

from shared.core.db import Database
from shared.steps.journal import idempotency_key, insert_steps, pending_step_ids, step_key
from tests.steps_support import chain, definition, publish_version, start_run, steps_of


def test_step_key_for_iterations() -> None:
    assert step_key("notify") == "notify"
    assert step_key("notify", [3]) == "notify[3]"
    assert step_key("notify", [1, 0]) == "notify[1][0]"


def test_insert_steps_is_idempotent_and_returns_pending(db: Database) -> None:
    wf = definition(chain(3))
    version = publish_version(db, wf)
    run_id, first = start_run(db, version)
    assert len(first) == 1
    with db.transaction() as tx:
        again = insert_steps(tx, run_id=run_id, lineage_root=run_id, nodes=[wf.entry])
        assert again == first  # still pending: a resumed admission re-dispatches it
        both = insert_steps(tx, run_id=run_id, lineage_root=run_id, nodes=wf.steps[:2])
        assert len(both) == 2 and first[0] in both
        assert sorted(pending_step_ids(tx, run_id)) == sorted(both)
        tx.execute(
            "UPDATE workflow_steps SET status = 'skipped', finished_at = now() WHERE id = :i",
            i=first[0],
        )
        assert insert_steps(tx, run_id=run_id, lineage_root=run_id, nodes=[wf.entry]) == []
    rows = steps_of(db, run_id)
    assert set(rows) == {"s0", "s1"}
    assert rows["s0"]["idempotency_key"] == f"onceflow:{run_id}:s0"
    assert rows["s1"]["block_type"] == "end" and rows["s1"]["node_id"] == "s1"
    assert rows["s1"]["dispatched_at"] is None


def test_idempotency_key_follows_the_lineage_root(db: Database) -> None:
    wf = definition(chain(1))
    version = publish_version(db, wf)
    run_id, _ = start_run(db, version)
    root = "11111111-1111-1111-1111-111111111111"
    with db.transaction() as tx:
        tx.execute("DELETE FROM workflow_steps WHERE run_id = :r", r=run_id)
        insert_steps(tx, run_id=run_id, lineage_root=root, nodes=[wf.entry], stamp_dispatched=True)
    row = steps_of(db, run_id)["s0"]
    assert row["idempotency_key"] == f"onceflow:{root}:s0"
    assert row["dispatched_at"] is not None


def test_iterations_journal_under_their_own_keys(db: Database) -> None:
    wf = definition(chain(2))
    version = publish_version(db, wf)
    run_id, _ = start_run(db, version)
    node = wf.step("s1")
    keys = [step_key("s1", [i]) for i in range(3)]
    with db.transaction() as tx:
        ids = insert_steps(tx, run_id=run_id, lineage_root=run_id, nodes=[node] * 3, keys=keys)
        assert len(ids) == 3
        again = insert_steps(tx, run_id=run_id, lineage_root=run_id, nodes=[node] * 3, keys=keys)
        assert sorted(again) == sorted(ids)
    rows = steps_of(db, run_id)
    assert rows["s1[2]"]["node_id"] == "s1"
    assert rows["s1[2]"]["idempotency_key"] == f"onceflow:{run_id}:s1[2]"


def test_the_python_key_is_the_sql_functions_key(db: Database) -> None:
    """The key's format has two homes that cannot call each other: the SQL function every
    statement inserting step rows calls (migration 0340) and `idempotency_key`, which the
    claim's fallback and replay use. They give the same key."""
    samples = [("00000000-0000-0000-0000-000000000001", "s0"), ("r", "loop[2][0]"), ("", "")]
    with db.transaction() as tx:
        for root, key in samples:
            assert tx.scalar(
                "SELECT onceflow_idempotency_key(:r, :k)", r=root, k=key
            ) == idempotency_key(root, key)


def test_no_statement_retypes_the_key_format() -> None:
    """Every statement that writes a step's key calls the function (or takes it as a
    parameter, from `idempotency_key`): the literal prefix appears nowhere else."""
    from pathlib import Path

    for path in sorted(Path("shared/sql").glob("*.sql")):
        assert "'onceflow:'" not in path.read_text(), path
    for path in sorted(Path("shared").rglob("*.py")):
        if path.as_posix() != "shared/steps/journal.py":
            assert 'f"onceflow:{' not in path.read_text(), path
