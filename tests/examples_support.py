"""The shipped examples run the way production runs them: published and activated, the
provider subscriptions reconciled at the fake CRM, a change made in the fake CRM delivered as
a signed webhook to the real webhook function, the inbox drained, the trigger event admitted,
and the run's steps driven by the real step engine against the fake CRM. Only what leaves
onceflow for a third party is a test double: `http.request` records what it would send.
Delays and deadlines are brought forward (`due_now`), then the sweep wakes them.

Triggers that are not CRM webhooks start the same way production starts them, then `pump`
takes them through: a cron tick is fired by the sweep duty's own function at a chosen instant
(`fire_cron`), a poll source is read by the poll duty's pass (`run_poll`), and a generic webhook
is a signed POST to the real webhook function (`post_webhook`)."""

from __future__ import annotations

import json
import threading
import urllib.request
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import functions_framework
import pytest
import yaml
from pydantic import BaseModel
from werkzeug.serving import make_server

from devstack.fakecrm import FakeCrm
from shared.admission import admit as admission
from shared.blocks.base import BlockContext, BlockResult
from shared.core.db import Database
from shared.core.duty import SweepConfig, SweepReport
from shared.ingest.inbox import drain_inbox
from shared.providers import connect
from shared.publishing import subscriptions, versions
from shared.publishing.validate import ValidationReport
from shared.steps.repairs import wake_due_steps
from shared.triggers import cron, poll
from tests.blocks_support import seed_connection, seed_tenant
from tests.ingest_support import make_connection, standard_headers
from tests.steps_blocks import Recorder, block_lookup, spec
from tests.test_steps_engine import Queue

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples" / "workflows").glob("*.yaml"))


def _crm_events(path: Path) -> list[str]:
    events = yaml.safe_load(path.read_text())["trigger"].get("events", [])
    return [e for e in events if e.startswith("hubspot.")]


# The examples started by HubSpot webhooks (the others start on a schedule, a poll or a
# generic webhook, and subscribe to nothing at the provider).
CRM_EVENT_EXAMPLES = [p for p in EXAMPLES if _crm_events(p)]

# The one problem an example may carry: the warning validate gives every poll source by
# design, explaining the stamp policy it declares (each policy has a cost the author must
# see: tests/test_poll_triggers.py::test_each_stamp_policy_is_explained_in_a_warning).
EXPLAINED_WARNINGS = frozenset({"trigger.poll.stamp_policy"})


def unexplained_problems(report: ValidationReport) -> list[str]:
    """The example's errors and warnings, but the explanation every poll source gets."""
    return [
        str(p)
        for p in report.problems
        if not (p.severity == "warning" and p.where in EXPLAINED_WARNINGS)
    ]


# The id of acme's HubSpot connection in the stack: an example that names its connection (a
# CRM poll source) names this one.
EXAMPLE_CONNECTION_ID = "0c0ffee0-5a1e-4000-8000-00000000a11c"
# The variable holding the secret of the `standard` connection generic webhooks are sent on.
STANDARD_SECRET_ENV = "STANDARD_SECRET_ACME"


@pytest.fixture
def webhook_url(db: Database) -> Iterator[str]:
    """The real webhook function, served over HTTP."""
    app = functions_framework.create_app(target="webhook", source=str(ROOT / "main.py"))
    server = make_server("127.0.0.1", 0, app, threaded=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()


class ExampleStack:
    """Tenant acme, its connection to the fake CRM (webhooks to the real webhook function),
    and the examples it publishes; `person` changes a record as a person in the CRM would,
    `pump` takes what that caused all the way through to the steps."""

    def __init__(self, db: Database, fake: FakeCrm, webhook_url: str) -> None:
        self.db = db
        self.fake = fake
        seed_tenant(db, credits=100_000)
        self.connection_id = seed_connection(db, fake.url, connection_id=EXAMPLE_CONNECTION_ID)
        self.webhook_url = webhook_url
        self.standard_connection_id: str | None = None  # made by the first post_webhook
        fake.config.webhook_url = f"{webhook_url}/hubspot/{self.connection_id}"
        self.sent: list[dict[str, Any]] = []  # what http.request steps would have sent
        self.queue = Queue()
        self.lookup = block_lookup(Recorder(), **{"http.request": spec("http.request", self._http)})
        self.admitted: set[int] = set()
        self.outcomes: list[admission.BindingOutcome] = []

    def _http(self, ctx: BlockContext, config: BaseModel) -> BlockResult:
        sent = config.model_dump()
        self.sent.append({"step": ctx.step_key, **sent})
        return BlockResult(output={"status": 200, "body": None})

    def activate(self, path: Path) -> str:
        """Publish and activate one example, then reconcile the provider subscriptions (as
        activation does in the ops API); the workflow id."""
        with self.db.transaction() as tx:
            published = versions.publish(tx, path.read_text(), filename=str(path))
            versions.activate(
                tx,
                tenant_id="acme",
                workflow_id=published.workflow_id,
                version_id=published.version_id,
            )
        result = subscriptions.reconcile_connection(
            self.db, self.connection_id, connect.port_for(self.db, self.connection_id)
        )
        assert result.ok, result.errors
        return str(published.workflow_id)

    def person(self, object_type: str, object_id: str, properties: dict[str, Any]) -> None:
        self.fake.update_record(object_type, object_id, properties, ("CRM_UI", "userId:7"))
        self.pump()

    def pump(self) -> None:
        """Deliver the webhooks, drain the inbox, admit new events, run the steps."""
        assert self.fake.webhooks.wait_idle()
        drain_inbox(self.db, budget_seconds=10, until_empty=True)
        with self.db.transaction() as tx:
            ids = [int(r["id"]) for r in tx.all("SELECT id FROM workflow_trigger_events")]
        for event_id in sorted(set(ids) - self.admitted):
            self.admitted.add(event_id)
            result = admission.admit_event(self.db, event_id, publish=self.queue)
            self.outcomes.extend(result.outcomes)
        self.queue.drain(self.db, self.lookup, limit=1000)

    def fire_cron(self, workflow_id: str, ticks: int) -> dict[str, int]:
        """The cron sweep duty runs just after the `ticks`-th tick since activation, as after
        an outage that began at activation: the ticks before it were missed while nothing
        ran. Then `pump`. The duty's report."""
        with self.db.transaction() as tx:
            (row,) = [r for r in cron.active_schedules(tx) if r.workflow_id == workflow_id]
        schedule = cron.parse_schedule(row.trigger)
        since = row.decided_until
        due = cron.ticks_between(schedule, since, since + timedelta(days=31))[:ticks]
        now: datetime = due[-1] + timedelta(seconds=3)
        report = cron.fire_due_ticks(self.db, now=now, settings=cron.CronSettings.from_env())
        self.pump()
        return report

    def run_poll(self, workflow_id: str) -> poll.PassReport:
        """One pass of the workflow's poll source (what the poll duty runs once its period
        has passed), then `pump`."""
        with self.db.transaction() as tx:
            (row,) = [r for r in poll.active_sources(tx) if r[0] == workflow_id]
        report = poll.poll_pass(self.db, poll.load_source(*row), budget_seconds=3600.0)
        self.pump()
        return report

    def post_webhook(self, workflow_name: str, body: dict[str, Any], msg_id: str) -> Any:
        """A sender POSTs `body` to the workflow's generic webhook on acme's `standard`
        connection (Standard Webhooks signature), then `pump`; the webhook function's answer."""
        if self.standard_connection_id is None:
            self.standard_connection_id = make_connection(
                self.db, provider="standard", secret_env=STANDARD_SECRET_ENV
            )
        raw = json.dumps(body).encode()
        request = urllib.request.Request(
            f"{self.webhook_url}/standard/{self.standard_connection_id}/{workflow_name}",
            data=raw,
            headers=standard_headers(raw, msg_id=msg_id),
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            result = json.loads(answer.read())
        self.pump()
        return result

    def due_now(self, run_id: str) -> None:
        """Time travel: the run's delays and wait deadlines are due; the sweep wakes them."""
        with self.db.transaction() as tx:
            tx.execute(
                "UPDATE workflow_steps SET wake_at = now() - interval '1 second',"
                " output = CASE WHEN output ? 'delay_until' THEN jsonb_set(output,"
                " '{delay_until}', to_jsonb(CAST(now() - interval '1 second' AS text)))"
                " ELSE output END WHERE run_id = :r AND wake_at IS NOT NULL",
                r=run_id,
            )
        wake_due_steps(self.db, SweepConfig(), self.queue, SweepReport())
        self.queue.drain(self.db, self.lookup, limit=1000)

    def runs(self, workflow_id: str) -> list[dict[str, Any]]:
        with self.db.transaction() as tx:
            return tx.all(
                "SELECT id::text AS id, status FROM workflow_runs"
                " WHERE workflow_id = CAST(:w AS uuid) ORDER BY created_at",
                w=workflow_id,
            )

    def steps(self, run_id: str) -> dict[str, dict[str, Any]]:
        with self.db.transaction() as tx:
            rows = tx.all(
                "SELECT step_key, status, output, error, outcome_code FROM workflow_steps"
                " WHERE run_id = CAST(:r AS uuid)",
                r=run_id,
            )
        return {r["step_key"]: r for r in rows}

    def drops(self) -> list[dict[str, Any]]:
        with self.db.transaction() as tx:
            return tx.all("SELECT * FROM pre_admission_drops")
