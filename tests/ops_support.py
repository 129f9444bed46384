"""Seeding for the ops tests: tenants, connections, workflows, events, runs with a journal,
and tokens. Rows are written with plain SQL (what admission and the step engine would have
committed), so these tests build exactly the states they need."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from http.server import HTTPServer
from typing import TYPE_CHECKING, Any, NamedTuple

import functions_framework
import pytest

from devstack import seed
from devstack.function_process import serve
from devstack.serving import serve_in_thread
from shared.core.db import Database
from shared.ops.api import app as ops_api
from shared.ops.auth import mint_token
from shared.workflows.definition import WorkflowDefinition

if TYPE_CHECKING:  # a type only: importing the plugin here would load it before pytest does
    from tests.pubsub_emulator import PubsubProject

ROOT_MAIN = str(__import__("pathlib").Path(__file__).resolve().parent.parent / "main.py")


def seed_tenant(db: Database, tenant: str, balance: int = 1000) -> None:
    with db.transaction() as tx:
        seed.tenant(tx, tenant, credits=balance)


def seed_connection(db: Database, tenant: str) -> str:
    with db.transaction() as tx:
        return seed.connection(tx, tenant)


class Scene(NamedTuple):
    """What `seed_scene` made: the connection, the bound workflow and its version, the event
    and the record key of its contact."""

    connection: str
    workflow: str
    version: str
    event: int
    record_key: str


def seed_scene(
    db: Database,
    tenant: str,
    steps: list[dict[str, Any]],
    object_id: str,
    *,
    balance: int = 1000,
) -> Scene:
    """The setup most ops tests start from: `tenant` with `balance` credits and one HubSpot
    connection, a bound workflow running `steps`, and one event about contact `object_id`."""
    seed_tenant(db, tenant, balance=balance)
    conn = seed_connection(db, tenant)
    wf, ver = seed_workflow(db, tenant, steps)
    event = seed_event(db, tenant, conn, object_id)
    return Scene(conn, wf, ver, event, f"{conn}:contacts:{object_id}")


def seed_workflow(
    db: Database,
    tenant: str,
    steps: list[dict[str, Any]],
    *,
    name: str = "wf",
    events: Sequence[str] = ("hubspot.contact.created",),
    bind: bool = True,
    dedup: str = "once_per_record",
) -> tuple[str, str]:
    wf = WorkflowDefinition.model_validate(
        {
            "name": name,
            "tenant": tenant,
            "trigger": {"events": list(events), "dedup": dedup},
            "steps": steps,
        }
    )
    with db.transaction() as tx:
        workflow_id = str(
            tx.scalar(
                "INSERT INTO workflows (tenant_id, name) VALUES (:t, :n) RETURNING id",
                t=tenant,
                n=name,
            )
        )
        version_id = str(
            tx.scalar(
                "INSERT INTO workflow_versions (workflow_id, number, content_hash, definition,"
                " source_text) VALUES (:w, 1, :h, CAST(:d AS jsonb), :d) RETURNING id",
                w=workflow_id,
                h=uuid.uuid4().hex * 2,
                d=json.dumps(wf.model_dump(mode="json")),
            )
        )
        if bind:
            tx.execute(
                "INSERT INTO workflow_activations (workflow_id, version_id) VALUES (:w, :v)",
                w=workflow_id,
                v=version_id,
            )
            for e in events:
                tx.execute(
                    "INSERT INTO trigger_bindings (tenant_id, event_type, workflow_id,"
                    " version_id, dedup_mode) VALUES (:t, :e, :w, :v, :d)",
                    t=tenant,
                    e=e,
                    w=workflow_id,
                    v=version_id,
                    d=dedup,
                )
    return workflow_id, version_id


def seed_event(
    db: Database,
    tenant: str,
    connection_id: str,
    object_id: str,
    *,
    event_type: str = "hubspot.contact.created",
    truncated: bool = False,
    published: bool = True,
    payload: dict[str, Any] | None = None,
) -> int:
    with db.transaction() as tx:
        return int(
            tx.scalar(
                "INSERT INTO workflow_trigger_events (tenant_id, connection_id, event_type,"
                " record_object_type, record_object_id, payload, payload_truncated, published_at)"
                " VALUES (:t, :c, :e, 'contacts', :o, CAST(:p AS jsonb), :tr,"
                " CASE WHEN :pub THEN now() END) RETURNING id",
                t=tenant,
                c=connection_id,
                e=event_type,
                o=object_id,
                p=json.dumps(payload or {"id": object_id}),
                tr=truncated,
                pub=published,
            )
        )


@dataclass
class JournalRow:
    step_key: str
    status: str
    block_type: str = "http.request"
    node_id: str | None = None
    branch_choice: str | None = None
    error: str | None = None
    error_class: str | None = None
    outcome_code: str | None = None
    attempt: int = 1
    output: dict[str, Any] | None = field(default=None)


def seed_run(
    db: Database,
    tenant: str,
    workflow_id: str,
    version_id: str,
    journal: Sequence[JournalRow],
    *,
    status: str = "failed",
    event_id: int | None = None,
    record_key: str | None = None,
    created_at: datetime | None = None,
    payload_truncated: bool = False,
    dedup: str = "once_per_record",
    namespace: str = "live",
) -> str:
    run_id = str(uuid.uuid4())
    with db.transaction() as tx:
        tx.execute(
            "INSERT INTO workflow_runs (id, tenant_id, workflow_id, version_id, start_key,"
            " event_id, record_key, dedup_mode, namespace, status, trigger_payload,"
            " payload_truncated, lineage_root, error, created_at, finished_at)"
            " VALUES (:id, :t, :w, :v, :k, :e, :rk, :d, :ns, :s, CAST(:p AS jsonb), :tr, :id,"
            " :err, coalesce(CAST(:c AS timestamptz), now()),"
            " CASE WHEN :s = 'running' THEN NULL ELSE coalesce(CAST(:c AS timestamptz), now())"
            " END)",
            id=run_id,
            t=tenant,
            w=workflow_id,
            v=version_id,
            k=f"test:{run_id}",
            e=event_id,
            rk=record_key,
            d=dedup,
            ns=namespace,
            s=status,
            p=json.dumps({"x": 1}),
            tr=payload_truncated,
            err="a step failed" if status == "failed" else None,
            c=created_at,
        )
        for i, j in enumerate(journal):
            settled = j.status in ("succeeded", "skipped", "failed")
            tx.execute(
                "INSERT INTO workflow_steps (run_id, step_key, node_id, block_type, status,"
                " attempt, idempotency_key, output, error, error_class, outcome_code,"
                " branch_choice, created_at, finished_at, wake_at)"
                " VALUES (:r, :k, :n, :b, :s, :a, :ik, CAST(:o AS jsonb), :err, :ec, :oc, :bc,"
                " now() + make_interval(secs => :i), CASE WHEN :settled THEN now() +"
                " make_interval(secs => :i) END,"
                " CASE WHEN :s IN ('waiting_for_delay', 'waiting_for_retry') THEN now() END)",
                r=run_id,
                k=j.step_key,
                n=j.node_id or j.step_key.split("[")[0],
                b=j.block_type,
                s=j.status,
                a=j.attempt,
                ik=f"onceflow:{run_id}:{j.step_key}",
                o=json.dumps(j.output) if j.output is not None else None,
                err=j.error,
                ec=j.error_class,
                oc=j.outcome_code,
                bc=j.branch_choice,
                i=float(i),
                settled=settled,
            )
    return run_id


def mint(db: Database, tenant: str | None, label: str = "test", roles: tuple[str, ...] = ()) -> str:
    with db.transaction() as tx:
        token, _ = mint_token(tx, tenant_id=tenant, label=label, roles=roles)
    return token


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@dataclass
class Dispatched:
    ids: list[str] = field(default_factory=list)

    def __call__(self, step_ids: Sequence[str]) -> None:
        self.ids.extend(step_ids)


@pytest.fixture(name="dispatched")
def dispatched_fixture() -> Dispatched:
    return Dispatched()


def install_ops_api(db: Database, dispatch: Dispatched, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The real `ops` entry point from main.py, as functions-framework builds it, answering
    from `db` and handing replayed steps to `dispatch` instead of Pub/Sub."""
    monkeypatch.setattr(ops_api, "_default_api", ops_api.OpsApi(db, dispatch=dispatch))
    return functions_framework.create_app("ops", ROOT_MAIN, "http")


@pytest.fixture(name="client")
def client_fixture(db: Database, dispatched: Dispatched, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The ops app served in-process (a test client)."""
    return install_ops_api(db, dispatched, monkeypatch).test_client()


@pytest.fixture(name="ops_server")
def ops_server_fixture(
    db: Database, dispatched: Dispatched, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """The ops app served over real HTTP on 127.0.0.1; yields its base URL."""
    from werkzeug.serving import make_server

    app = install_ops_api(db, dispatched, monkeypatch)
    with serving(make_server("127.0.0.1", 0, app, threaded=True)) as base:
        yield base


@contextmanager
def serving(server: HTTPServer) -> Iterator[str]:
    """Serve `server` (bound to a free port on 127.0.0.1) from a thread; its base URL. Shut
    down and closed on the way out."""
    thread = serve_in_thread(server, "ops-api")  # stops at once (devstack/serving.py)
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join(10)
        server.server_close()


@pytest.fixture(name="ops_process")
def ops_process_fixture(db: Database, database_url: str, pubsub: PubsubProject) -> Iterator[str]:
    """The `ops` function as a real functions-framework process on the test database, its
    replays dispatched to the Pub/Sub emulator; its base URL."""
    env = {"DATABASE_URL": database_url, "GOOGLE_CLOUD_PROJECT": pubsub.project}
    with serve("ops", env) as base:
        yield base
