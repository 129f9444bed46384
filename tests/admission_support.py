"""Seeding for admission tests: tenants, connections, workflows published and activated through
`shared.publishing.versions` (so bindings are the real ones), and events through
`shared.ingest.outbox.emit` (so event rows are the real ones)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar, cast

from devstack import seed
from shared.admission.admit import admit_event
from shared.core.db import Database, connector_from_env
from shared.ingest.outbox import TriggerEvent, emit

EVENT_TYPE = "hubspot.contact.property_changed"


def make_tenant(
    db: Database, tenant_id: str = "acme", *, balance: int = 1000, excluded: Sequence[str] = ()
) -> str:
    with db.transaction() as tx:
        return seed.tenant(tx, tenant_id, credits=balance, excluded_authors=excluded)


def make_connection(
    db: Database, tenant_id: str = "acme", *, status: str = "active", excluded: Sequence[str] = ()
) -> str:
    with db.transaction() as tx:
        return seed.connection(tx, tenant_id, status=status, excluded_authors=excluded)


def bind_workflow(
    db: Database,
    name: str,
    *,
    tenant_id: str = "acme",
    events: Sequence[str] = (EVENT_TYPE,),
    dedup: str = "once_per_record",
    rule: str | None = None,
    record: str = "event",
    steps: Sequence[Mapping[str, Any]] | None = None,
    watch: Sequence[str] = (),
) -> str:
    """Publish and activate a workflow; its id."""
    trigger: dict[str, Any] = {"events": list(events), "dedup": dedup, "record": record}
    if rule is not None:
        trigger["rule"] = rule
    if watch:
        trigger["watch"] = list(watch)
    with db.transaction() as tx:
        return seed.workflow(
            tx, tenant_id, name, trigger, steps or [{"id": "start", "type": "end"}]
        )


def activate_text(db: Database, source_text: str, *, tenant_id: str = "acme") -> str:
    """Publish the definition `source_text` (YAML or JSON) and activate it; the workflow id."""
    with db.transaction() as tx:
        return seed.activate_source(tx, source_text, tenant_id=tenant_id)


def emit_event(
    db: Database,
    *,
    tenant_id: str = "acme",
    connection_id: str | None = None,
    event_type: str = EVENT_TYPE,
    object_type: str | None = "contact",
    object_id: str | None = "101",
    changed: Mapping[str, Any] | None = None,
    author_id: str | None = None,
    payload: Mapping[str, Any] | None = None,
    source_event_id: str | None = None,
    author_source: str | None = None,
) -> int:
    with db.transaction() as tx:
        event_id = emit(
            tx,
            TriggerEvent(
                tenant_id=tenant_id,
                event_type=event_type,
                payload=payload if payload is not None else {"note": "test"},
                connection_id=connection_id,
                source_event_id=source_event_id,
                record_object_type=object_type if object_id is not None else None,
                record_object_id=object_id,
                author_id=author_id,
                author_source=author_source,
                changed_fields=changed if changed is not None else {"lifecyclestage": "lead"},
            ),
        )
    assert event_id is not None
    return event_id


def finish_run(db: Database, run_id: str | None, status: str = "succeeded") -> None:
    """End the run as the engine would."""
    with db.transaction() as tx:
        tx.execute(
            "UPDATE workflow_runs SET status = :s, finished_at = now() WHERE id = :r",
            s=status,
            r=run_id,
        )


def admit(db: Database, event_id: int) -> str | None:
    """Admit the event as the engine would; the run it started, None when it was refused."""
    (outcome,) = admit_event(db, event_id, publish=lambda ids: None).outcomes
    return outcome.run_id if outcome.outcome == "admitted" else None


def settle(db: Database, event_id: int, status: str) -> None:
    """Admit the event and end its run as the engine would."""
    (outcome,) = admit_event(db, event_id, publish=lambda ids: None).admitted
    finish_run(db, outcome.run_id, status)


def count(db: Database, query: str, **params: Any) -> int:
    with db.transaction() as tx:
        return int(tx.scalar(query, **params))


def refusals(db: Database, workflow_id: str | None = None) -> list[dict[str, Any]]:
    with db.transaction() as tx:
        return tx.all(
            "SELECT event_id, CAST(workflow_id AS text) AS workflow_id, reason, detail, "
            "record_key, CAST(version_id AS text) AS version_id FROM admission_refusals "
            "WHERE CAST(:w AS uuid) IS NULL OR workflow_id = CAST(:w AS uuid) ORDER BY id",
            w=workflow_id,
        )


class Published:
    """A `publish` stand-in that records what was dispatched (for tests without Pub/Sub)."""

    def __init__(self) -> None:
        self.ids: list[str] = []

    def __call__(self, step_ids: Any) -> None:
        self.ids.extend(step_ids)


T = TypeVar("T")


def at_barrier(database_url: str, jobs: Sequence[Callable[[Database], T]]) -> list[T]:
    """Run each job on its own connection (a pool of one, opened before the barrier so no job
    starts late), all released at once by one `threading.Barrier`; their results in job
    order. Fails on any job's error or a job still running after two minutes."""
    barrier = threading.Barrier(len(jobs))
    results: list[T | None] = [None] * len(jobs)
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        own = Database(connector_from_env({"DATABASE_URL": database_url}), pool_size=1)
        try:
            with own.transaction() as warm:
                warm.scalar("SELECT 1")
            barrier.wait(timeout=60)
            results[i] = jobs[i](own)
        except BaseException as exc:
            errors.append(exc)
        finally:
            own.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors[:3]
    assert not any(t.is_alive() for t in threads)
    return cast(list[T], results)
