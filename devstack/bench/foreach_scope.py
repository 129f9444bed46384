"""Bytes moved between the step engine and Postgres for one 1,000-item foreach (issue 23,
item 16: a claim carried every earlier output, so such a loop moved O(n²) JSON). Run:
`python -m devstack.bench.foreach_scope`.

One run of `find` (a search-like step whose output is the 1,000 items) → `each` (foreach over
`steps.find.output.results`, 10 at a time) → `visit` (a body step whose config reads
`iteration.item`; it returns a ~100-byte output) → `after` (reads `steps.each.output.count`),
driven to the end by `advance_step` from an in-process queue, one executor. The engine's
connection goes through a TCP proxy in this process that counts the bytes each way, so the
figure is what crossed the wire (statements, rows, protocol), whatever the code does with it.

Prints JSON lines (devstack.bench.baseline.emit): `foreach_bytes_from_db` and
`foreach_bytes_to_db` in bytes for the whole run, with `steps`, `per_step` and `seconds`.
`BENCH_FOREACH_ITEMS_FROM=trigger` takes the items from the event payload instead (no `find`):
every claim carries the run's payload (at most 64 KiB, the admission limit), so that variant
stays linear in the items, not quadratic. A byte count needs no durable cluster: a fast
throwaway one serves.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from pydantic import BaseModel, ConfigDict

from devstack import postgres
from devstack.bench.baseline import emit
from shared.blocks.base import BlockContext, BlockResult, BlockSpec, RetryPolicy
from shared.core.db import Database, connector_from_env
from shared.steps.advance import advance_step, registry_lookup
from shared.steps.claim import LeaseConfig

ITEMS = 1000
CONCURRENCY = 10
# Where the items come from: `step` (an earlier step's output, as a search's results) or
# `trigger` (a list in the event payload, which every claim carries: at most 64 KiB).
ITEMS_FROM = os.environ.get("BENCH_FOREACH_ITEMS_FROM", "step")
TENANT = "bench"


class VisitConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    contact: dict[str, object]


def _visit(ctx: BlockContext, config: BaseModel) -> BlockResult:
    assert isinstance(config, VisitConfig)
    # About the size of a small CRM read: an id and a few properties.
    contact = config.contact["id"]
    return BlockResult(
        output={
            "id": contact,
            "email": f"c{contact}@example.com",
            "lifecyclestage": "lead",
            "hs_lead_status": "OPEN",
            "owner": "4711",
        }
    )


class NoConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _find(ctx: BlockContext, config: BaseModel) -> BlockResult:
    # A search's result page: the list the foreach iterates.
    return BlockResult(output={"results": _contacts()})


def _contacts() -> list[dict[str, object]]:
    return [{"id": str(100000 + i), "n": i} for i in range(ITEMS)]


def _spec(name: str, config: type[BaseModel], execute: object) -> BlockSpec:
    return BlockSpec(
        type_name=name,
        config_model=config,
        kind="action",
        side_effect="none",
        price=0,
        retry=RetryPolicy(),
        execute=execute,  # type: ignore[arg-type]
    )


BENCH_BLOCKS = {
    b.type_name: b
    for b in (_spec("bench.visit", VisitConfig, _visit), _spec("bench.find", NoConfig, _find))
}


def lookup(type_name: str) -> BlockSpec:
    return BENCH_BLOCKS.get(type_name) or registry_lookup(type_name)


class Counter:
    def __init__(self) -> None:
        self.up = 0  # engine → Postgres
        self.down = 0  # Postgres → engine
        self._lock = threading.Lock()

    def add(self, up: bool, n: int) -> None:
        with self._lock:
            if up:
                self.up += n
            else:
                self.down += n


@contextmanager
def counting_proxy(port: int, counter: Counter) -> Iterator[int]:
    """A TCP proxy to 127.0.0.1:`port` counting bytes each way; yields its own port. Every
    socket and thread it made is closed and joined on exit."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    stop = threading.Event()
    sockets: list[socket.socket] = []
    pumps: list[threading.Thread] = []

    def pump(src: socket.socket, dst: socket.socket, up: bool) -> None:
        try:
            while data := src.recv(65536):
                counter.add(up, len(data))
                dst.sendall(data)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)

    def accept() -> None:
        while not stop.is_set():
            try:
                client, _ = server.accept()
            except TimeoutError:
                continue
            upstream = socket.create_connection(("127.0.0.1", port))
            # Without TCP_NODELAY the proxy's writes wait on delayed ACKs (Nagle): every
            # round-trip through it would cost tens of milliseconds that the engine never pays.
            for s in (client, upstream):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sockets.extend((client, upstream))
            for a, b, up in ((client, upstream, True), (upstream, client, False)):
                thread = threading.Thread(target=pump, args=(a, b, up), daemon=True)
                pumps.append(thread)
                thread.start()

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        acceptor.join()
        server.close()
        for s in sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
        for thread in pumps:
            thread.join()
        for s in sockets:
            s.close()


def seed(db: Database) -> str:
    """The workflow version, a running run and its first step; the step id."""
    from_trigger = ITEMS_FROM == "trigger"
    definition = {
        "name": "bench-foreach",
        "tenant": TENANT,
        "trigger": {"events": ["bench.x.y"]},
        "steps": [
            *([] if from_trigger else [{"id": "find", "type": "bench.find", "next": "each"}]),
            {
                "id": "each",
                "type": "foreach",
                "config": {
                    "items": "${{ trigger.contacts }}"
                    if from_trigger
                    else "${{ steps.find.output.results }}",
                    "do": "visit",
                    "max_items": ITEMS,
                    "concurrency": CONCURRENCY,
                },
                "next": "after",
            },
            {"id": "visit", "type": "bench.visit", "config": {"contact": "${{ iteration.item }}"}},
            {
                "id": "after",
                "type": "branch",
                "branches": [{"when": "steps.each.output.count > 0", "next": "done"}],
            },
            {"id": "done", "type": "end"},
        ],
    }
    payload = {"contacts": _contacts()} if from_trigger else {"objectId": 1}
    entry = definition["steps"][0]  # type: ignore[index]
    with db.transaction() as tx:
        tx.execute("INSERT INTO tenants (id, name) VALUES (:t, :t)", t=TENANT)
        wf = tx.scalar(
            "INSERT INTO workflows (tenant_id, name) VALUES (:t, 'bench') RETURNING id", t=TENANT
        )
        version = tx.scalar(
            "INSERT INTO workflow_versions (workflow_id, number, content_hash, definition,"
            " source_text) VALUES (:w, 1, repeat('0', 64), CAST(:d AS jsonb), :d) RETURNING id",
            w=wf,
            d=json.dumps(definition),
        )
        run = tx.scalar(
            "INSERT INTO workflow_runs (id, tenant_id, workflow_id, version_id, start_key,"
            " dedup_mode, trigger_payload, lineage_root) SELECT g.id, :t, :w, :v,"
            " 'bench:' || g.id, 'every_time', CAST(:p AS jsonb), g.id"
            " FROM (SELECT gen_random_uuid() AS id) AS g RETURNING id",
            t=TENANT,
            w=wf,
            v=version,
            p=json.dumps(payload),
        )
        return str(
            tx.scalar(
                "INSERT INTO workflow_steps (run_id, step_key, node_id, block_type,"
                " idempotency_key) VALUES (CAST(:r AS uuid), :k, :k, :b,"
                " 'onceflow:' || CAST(:r AS text) || ':' || :k) RETURNING CAST(id AS text)",
                r=str(run),
                k=entry["id"],
                b=entry["type"],
            )
        )


def main() -> None:
    counter = Counter()
    with postgres.throwaway("onceflow-bench-pg-", fast=True) as cluster:
        postgres.create_migrated_database(cluster, "onceflow")
        setup = Database(connector_from_env({"DATABASE_URL": cluster.url()}), pool_size=1)
        try:
            first = seed(setup)
        finally:
            setup.close()
        with counting_proxy(cluster.port, counter) as port:
            url = f"postgresql://postgres@127.0.0.1:{port}/onceflow"
            db = Database(connector_from_env({"DATABASE_URL": url}), pool_size=1)
            work = [first]
            steps = 0
            started = time.monotonic()
            try:
                while work:
                    result = advance_step(
                        db, work.pop(0), lookup=lookup, dispatch=work.extend, config=LeaseConfig()
                    )
                    if result.status != "succeeded":
                        raise RuntimeError(f"step did not succeed: {result}")
                    steps += 1
            finally:
                db.close()
            seconds = time.monotonic() - started
    expected = ITEMS + (3 if ITEMS_FROM == "trigger" else 4)
    if steps != expected:
        raise RuntimeError(f"{steps} steps ran, expected {expected}")
    for name, value in (
        ("foreach_bytes_from_db", counter.down),
        ("foreach_bytes_to_db", counter.up),
    ):
        emit(
            name,
            value,
            "bytes",
            None,
            steps=steps,
            per_step=round(value / steps),
            items=ITEMS,
            items_from=ITEMS_FROM,
            concurrency=CONCURRENCY,
            seconds=round(seconds, 2),
        )


if __name__ == "__main__":
    main()
