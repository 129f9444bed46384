"""Credits: one charge per lineage key, never below zero under concurrency."""

from __future__ import annotations

import threading
import uuid

from devstack import seed
from shared.core.db import Database
from shared.gates import credits


def _tenant(db: Database, balance: int) -> None:
    with db.transaction() as tx:
        seed.tenant(tx, "acme", name="Acme", credits=balance)


def _charge(db: Database, key: str, amount: int = 1) -> credits.Charge:
    with db.transaction() as tx:
        return credits.charge(
            tx,
            tenant_id="acme",
            lineage_key=key,
            amount=amount,
            block_type="crm.create",
            run_id=None,
            step_id=None,
        )


def test_same_lineage_key_charges_once_across_retries_and_replays(db: Database) -> None:
    _tenant(db, 10)
    key = f"step:{uuid.uuid4()}"
    assert _charge(db, key, 3).status == "charged"
    assert _charge(db, key, 3).status == "already_charged"  # retry of the attempt
    assert _charge(db, key, 3).status == "already_charged"  # replay reuses the oldest key
    with db.transaction() as tx:
        assert credits.balance(tx, "acme") == 7
        assert tx.scalar("SELECT count(*) FROM credit_ledger") == 1


def test_insufficient_credits_leaves_no_ledger_row_and_keeps_the_transaction(db: Database) -> None:
    _tenant(db, 2)
    with db.transaction() as tx:
        first = credits.charge(
            tx,
            tenant_id="acme",
            lineage_key="k1",
            amount=5,
            block_type="x",
            run_id=None,
            step_id=None,
        )
        assert first.status == "insufficient" and first.balance == 2
        # The caller's transaction is still usable after the refusal.
        assert tx.scalar("SELECT count(*) FROM credit_ledger") == 0
        assert credits.has_credits(tx, "acme", 2) and not credits.has_credits(tx, "acme", 3)
        credits.grant(tx, "acme", 3)
    assert _charge(db, "k1", 5).status == "charged"  # after a top-up the same key can pay
    with db.transaction() as tx:
        assert credits.balance(tx, "acme") == 0


def test_concurrent_charges_never_go_negative(db: Database) -> None:
    _tenant(db, 5)
    n = 12
    barrier = threading.Barrier(n)
    results: list[str] = []
    lock = threading.Lock()

    def worker(i: int) -> None:
        barrier.wait()
        outcome = _charge(db, f"key-{i}")
        with lock:
            results.append(outcome.status)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(results) == ["charged"] * 5 + ["insufficient"] * 7
    with db.transaction() as tx:
        assert credits.balance(tx, "acme") == 0
        assert tx.scalar("SELECT count(*) FROM credit_ledger") == 5


def test_concurrent_charges_of_one_lineage_key_charge_once(db: Database) -> None:
    _tenant(db, 100)
    n = 8
    barrier = threading.Barrier(n)
    results: list[str] = []
    lock = threading.Lock()

    def worker() -> None:
        barrier.wait()
        outcome = _charge(db, "same-key", 4)
        with lock:
            results.append(outcome.status)

    threads = [threading.Thread(target=worker) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(results) == ["already_charged"] * 7 + ["charged"]
    with db.transaction() as tx:
        assert credits.balance(tx, "acme") == 96


def _refund(db: Database, key: str, step_id: str | None = None) -> int:
    return db.run(lambda tx: credits.refund(tx, lineage_key=key, reason="test", step_id=step_id))


def test_a_refunded_charge_frees_the_lineage_for_one_new_charge(db: Database) -> None:
    """Issue 23 item 4 at the ledger: after a refund the lineage's next application is charged
    (once), and each charge is refunded at most once."""
    _tenant(db, 10)
    assert _charge(db, "lineage", 3).status == "charged"
    assert _refund(db, "lineage") == 3 and _refund(db, "lineage") == 0
    assert _charge(db, "lineage", 3).status == "charged"  # the replay that applies
    assert _charge(db, "lineage", 3).status == "already_charged"  # its retry
    assert _refund(db, "lineage") == 3 and _refund(db, "lineage") == 0
    with db.transaction() as tx:
        assert credits.balance(tx, "acme") == 10
        assert tx.scalar("SELECT count(*) FROM credit_ledger") == 2
        assert tx.scalar("SELECT count(*) FROM credit_refunds") == 2


def test_a_token_price_settles_down_once_and_never_up_when_two_settles_overlap(
    db: Database,
) -> None:
    """A charge taken at the token cap (5) comes down to what the call used (2). Two settles
    of it overlap (the settle and a redelivery's): the second waits on the first's row lock
    and, re-checking after it commits, pays nothing back; a settle above the charge changes
    nothing."""
    _tenant(db, 10)
    key = f"step:{uuid.uuid4()}"
    assert _charge(db, key, 5).status == "charged"
    second_done = threading.Event()
    errors: list[BaseException] = []

    def second() -> None:
        try:
            with db.transaction() as tx:
                credits.settle_used(tx, lineage_key=key, step_id=None, amount=2)
        except BaseException as exc:
            errors.append(exc)
        finally:
            second_done.set()

    with db.transaction() as tx:
        # The settle's statement sent now (not with the COMMIT): the row stays locked until
        # this transaction commits.
        assert tx.one(credits.SETTLE_USED, lineage_key=key, step_id=None, amount=2) == {
            "returned": 3
        }
        thread = threading.Thread(target=second)
        thread.start()
        assert not second_done.wait(1.0)  # waiting on the first's lock
    thread.join(timeout=30)
    assert errors == []
    with db.transaction() as tx:
        credits.settle_used(tx, lineage_key=key, step_id=None, amount=4)  # never up
    with db.transaction() as tx:
        assert credits.balance(tx, "acme") == 10 - 2
        assert tx.scalar("SELECT amount FROM credit_ledger") == 2
