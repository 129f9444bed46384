"""Running one block the way the engine would: a real run and step row, a BlockContext whose
journal operations are real conditional UPDATEs on that row, and the config validated by the
block's own model, and `fake_crm`, the CRM those blocks reach through a connection. Used by
the block, SSRF, vendor-replay and reconcile tests."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import pytest

from devstack import seed
from devstack.fakecrm import FakeCrm, FakeCrmConfig
from shared.blocks import http as http_block
from shared.blocks.base import BlockContext, BlockResult, BlockSpec
from shared.core.db import Database
from shared.core.netguard import NetPolicy
from shared.gates.kind import WorkflowGates
from shared.port import observed
from shared.providers import connect
from shared.steps.gated import run_gated, settle_gates
from shared.steps.states import StepStatus
from tests.steps_support import TENANT, definition, publish_version, start_run, steps_of

MARK = (
    "UPDATE workflow_steps SET side_effect_started_at = now() "
    "WHERE id = CAST(:id AS uuid) AND side_effect_started_at IS NULL"
)
WITHDRAW = (
    "UPDATE workflow_steps SET side_effect_started_at = NULL "
    "WHERE id = CAST(:id AS uuid) AND side_effect_started_at IS NOT NULL"
)


def seed_tenant(
    db: Database, *, credits: int = 1000, signing_secret_env: str | None = None
) -> None:
    with db.transaction() as tx:
        seed.tenant(
            tx, TENANT, credits=credits, signing_secret_env=signing_secret_env, existing="update"
        )


def seed_connection(
    db: Database,
    base_url: str,
    *,
    token_env: str = "FAKECRM_TOKEN",
    connection_id: str | None = None,
) -> str:
    """A HubSpot connection of TENANT to the fake at `base_url`; `connection_id` fixes its id
    (a definition that names its connection, e.g. a CRM poll example), else a random one."""
    with db.transaction() as tx:
        return seed.connection(
            tx,
            TENANT,
            webhook_secret_env="FAKECRM_APP_SECRET",
            api_credentials_env=token_env,
            api_base_url=base_url,
            provider_app_id="424242",
            connection_id=connection_id,
        )


@contextmanager
def http_target(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCrm]:
    """A fake CRM that `http.request` blocks may call: the block's network policy allows
    loopback for the test, so a URL on 127.0.0.1 is let through."""
    monkeypatch.setattr(http_block, "net_policy", lambda: NetPolicy(allow_loopback=True))
    crm = FakeCrm().start()
    try:
        yield crm
    finally:
        crm.stop()


@contextmanager
def fake_crm(
    monkeypatch: pytest.MonkeyPatch, config: FakeCrmConfig | None = None
) -> Iterator[FakeCrm]:
    """The fake CRM as the blocks reach it: through a connection from `seed_connection`, whose
    token variable FAKECRM_TOKEN this sets. Ports are cached per connection, so the cache is
    emptied before and after: no test reaches another test's server."""
    monkeypatch.setenv("FAKECRM_TOKEN", "tok")
    connect.forget_ports()
    server = FakeCrm(config or FakeCrmConfig()).start()
    try:
        yield server
    finally:
        server.stop()
        connect.forget_ports()


class StepRunner:
    """One step row of block type `block_type`; `run()` executes one attempt of it."""

    def __init__(self, db: Database, block_type: str, *, connection_id: str | None = None):
        self.db = db
        version = publish_version(db, definition([{"id": "s0", "type": block_type}]))
        self.run_id, _ = start_run(db, version)
        with db.transaction() as tx:
            self.workflow_id = str(
                tx.scalar(
                    "SELECT workflow_id::text FROM workflow_runs WHERE id = CAST(:r AS uuid)",
                    r=self.run_id,
                )
            )
        step = steps_of(db, self.run_id)["s0"]
        self.step_id = str(step["id"])
        self.idempotency_key = str(step["idempotency_key"])
        self.connection_id = connection_id
        self.attempt = 0

    def _execute(self, query: str) -> bool:
        with self.db.transaction() as tx:
            return tx.execute(query, id=self.step_id) == 1

    def context(self, *, dry_run: bool = False) -> BlockContext:
        return BlockContext(
            tenant_id=TENANT,
            run_id=self.run_id,
            step_id=self.step_id,
            step_key="s0",
            attempt=self.attempt,
            idempotency_key=self.idempotency_key,
            scope={},
            dry_run=dry_run,
            connection_id=self.connection_id,
            mark_side_effect_started=lambda: self._execute(MARK),
            withdraw_side_effect_mark=lambda: self._execute(WITHDRAW),
            db=self.db,
        )

    def run(
        self,
        spec: BlockSpec,
        config: Mapping[str, Any],
        *,
        dry_run: bool = False,
        workflow: WorkflowGates | None = None,
    ) -> BlockResult:
        """One attempt the way the executor runs it: the spec's gates, then the block, then
        the gates settled (a permanent failure counts as the step's last attempt)."""
        self.attempt += 1
        ctx = self.context(dry_run=dry_run)
        # One connection for the attempt, as the executor holds it (Database.pinned).
        with self.db.pinned():
            outcome, passed = run_gated(
                spec,
                ctx,
                spec.config_model.model_validate(dict(config)),
                workflow or WorkflowGates(self.workflow_id),
                db=self.db,
            )
            permanent = getattr(outcome, "error_class", "permanent") == "permanent"
            final = StepStatus.FAILED if permanent else StepStatus.WAITING_FOR_RETRY
            status = StepStatus.SUCCEEDED if not _failed(outcome) else final
            settle_gates(ctx, passed, outcome, status, db=self.db)
            observed.flush(self.db)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def side_effect_started(self) -> bool:
        with self.db.transaction() as tx:
            return bool(
                tx.scalar(
                    "SELECT side_effect_started_at IS NOT NULL FROM workflow_steps "
                    "WHERE id = CAST(:id AS uuid)",
                    id=self.step_id,
                )
            )


def _failed(outcome: BlockResult | BaseException) -> bool:
    return isinstance(outcome, BaseException)
