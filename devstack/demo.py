"""`make demo`: start the local stack (or use the running one), play a scripted scenario, say
what happened in plain words, and stop what it started.

Every chapter reports what the database and the components actually did — it queries the
tables rather than assuming — so a piece that is not built yet shows up as "did not happen",
never as a made-up success. Each run uses a new tenant and new HubSpot event ids, so the demo
can be replayed against the same database as often as you like.

The scenario: a tenant connects HubSpot; HubSpot sends a signed v3 webhook ("contact created");
the event travels webhook → inbox → outbox → Pub/Sub `trigger-events` → admit_event → run →
steps; a forged webhook is refused; HubSpot's retry of the same delivery and a re-announced
event are both recognised as the same event. Then one HubSpot app on two portals
(devstack/demo_app.py; one portal read from HubSpot's webhooks journal, the other by webhook),
and one workflow definition run on both CRMs, HubSpot and Pipedrive (devstack/demo_any_crm.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from devstack import scheduler
from devstack import stack as devstack
from devstack.demo_story import SQL, WAIT_SECONDS, Story, wait_for
from devstack.fakecrm.webhooks import signed_headers
from devstack.serving import serve_in_thread
from devstack.tools import MissingTool
from shared.accounts import connections
from shared.core.db import Database, connector_from_env

SECRET_ENV = "ONCEFLOW_DEMO_HUBSPOT_APP_SECRET"  # noqa: S105 - a variable name, not a secret
TOKEN_ENV = "ONCEFLOW_DEMO_HUBSPOT_TOKEN"  # noqa: S105 - a variable name, not a secret
PORTAL_ID = 62515
APP_ID = 424242
# When the demo starts the stack itself, the scheduler runs 12x faster (every 5 s), so a
# step that waits for a scheduled function does not wait a minute.
DEMO_SCHEDULER_SPEEDUP = "12"


# The example workflow `examples/workflows/enroll-new-lead.yaml`, for the demo's tenant, with its
# notification sent to a receiver the demo runs on 127.0.0.1 (loopback HTTP is allowed in the
# local stack only: ONCEFLOW_HTTP_ALLOW_LOOPBACK).
WORKFLOWS = (
    """\
name: enroll-new-lead
tenant: {tenant}
description: When a contact becomes a lead, create a call task, mark the lead, notify sales.
trigger:
  events: [hubspot.contact.property_changed]
  watch: [lifecyclestage]
  rule: 'has(record.lifecyclestage) && record.lifecyclestage == "lead"'
  dedup: once_per_record
steps:
  - id: create_task
    type: crm.create
    config:
      object_type: tasks
      properties:
        hs_task_subject: "Call new lead ${{{{ record.id }}}}"
        hs_task_priority: HIGH
        hs_timestamp: "${{{{ event.occurred_at }}}}"
      associations:
        - object_type: contacts
          id: "${{{{ record.id }}}}"
    next: mark_contacted
  - id: mark_contacted
    type: crm.update
    config:
      object_type: contacts
      object_id: "${{{{ record.id }}}}"
      properties:
        hs_lead_status: ATTEMPTED_TO_CONTACT
    next: notify
  - id: notify
    type: http.request
    config:
      url: {notify_url}
      body:
        contact_id: "${{{{ record.id }}}}"
        task_id: "${{{{ steps.create_task.output.id }}}}"
""",
    """\
name: lead-status-changed
tenant: {tenant}
description: Tell sales whenever a lead's status changes.
trigger:
  events: [hubspot.contact.property_changed]
  watch: [hs_lead_status]
  rule: has(record.hs_lead_status)
  dedup: every_time
steps:
  - id: notify
    type: http.request
    config:
      url: {notify_url}
      body:
        contact_id: "${{{{ record.id }}}}"
        lead_status: "${{{{ record.hs_lead_status }}}}"
""",
)


class NotifyReceiver:
    """The "sales channel": an HTTP endpoint on 127.0.0.1 that records what it is sent."""

    def __init__(self) -> None:
        received: list[dict[str, Any]] = []
        self.received = received

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                received.append(
                    {
                        "path": self.path,
                        "headers": {k.lower(): v for k, v in self.headers.items()},
                        "body": self.rfile.read(length).decode(errors="replace"),
                    }
                )
                self.send_response(204)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        serve_in_thread(self.server, "demo-receiver")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/sales/new-lead"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class Scenario:
    stack: devstack.RunningStack
    db: Database
    story: Story
    receiver: NotifyReceiver
    tenant_id: str = ""
    connection_id: str = ""
    started_at: datetime = field(default_factory=lambda: datetime.now(UTC))

    # --- seeding --------------------------------------------------------------------------

    def seed(self) -> None:
        self.story.title("A tenant connects its HubSpot account")
        stamp = datetime.now(UTC).strftime("%Y%m%d%H%M%S%f")
        self.tenant_id = f"demo-{stamp}"
        with self.db.transaction() as tx:
            tx.execute(SQL["demo_tenant_insert"], id=self.tenant_id, name="Demo Co", credits=100)
            self.connection_id = connections.create_connection(
                tx,
                tenant_id=self.tenant_id,
                provider="hubspot",
                webhook_secret_env=SECRET_ENV,
                api_credentials_env=TOKEN_ENV,
                api_base_url=self._fakecrm_url(),
                provider_account_id=str(PORTAL_ID),
                watched_fields={"contact": ["lifecyclestage"]},
            )
        self.story.say(
            f"Tenant {self.tenant_id} (100 credits) has a HubSpot connection "
            f"{self.connection_id} for portal {PORTAL_ID}. The row names the environment "
            f"variable holding the app secret ({SECRET_ENV}), never the secret itself."
        )
        self.publish_workflow()

    def publish_workflow(self) -> None:
        from shared.publishing import versions
        from shared.publishing.validate import DefinitionInvalid

        for template in WORKFLOWS:
            text = template.format(tenant=self.tenant_id, notify_url=self.receiver.url)
            try:
                with self.db.transaction() as tx:
                    published = versions.publish(tx, text, tenant_id=self.tenant_id)
                    versions.activate(
                        tx,
                        tenant_id=self.tenant_id,
                        workflow_id=published.workflow_id,
                        version_id=published.version_id,
                    )
            except DefinitionInvalid as exc:
                self.story.verdict(False, f"a workflow was refused: {_short(str(exc))}")
                return
        self.story.verdict(
            True,
            "two workflows are published and active. enroll-new-lead: when a contact's "
            "lifecycle stage becomes 'lead', create a call task in the CRM, set the contact's "
            "lead status, and notify the sales channel (a receiver this demo runs at "
            f"{self.receiver.url}); once per record. lead-status-changed: notify sales "
            "whenever a lead status changes.",
        )

    def _fakecrm_url(self) -> str | None:
        comp = self.stack.info["components"].get("fakecrm")
        return str(comp["url"]) if comp else None

    # --- webhooks -------------------------------------------------------------------------

    def webhook_uri(self) -> str:
        return f"{self.stack.url('webhook')}/hubspot/{self.connection_id}"

    def post_webhook(self, body: bytes, *, secret: str | None = None) -> httpx.Response:
        uri = self.webhook_uri()
        headers = signed_headers(secret or self.stack.env[SECRET_ENV], uri, body)
        return httpx.post(uri, content=body, headers=headers, timeout=10)

    def stage_changed(self, event_id: int, object_id: int, stage: str, attempt: int = 0) -> bytes:
        return json.dumps(
            [
                {
                    "eventId": event_id,
                    "subscriptionId": 1001,
                    "portalId": PORTAL_ID,
                    "appId": APP_ID,
                    "occurredAt": int(self.started_at.timestamp() * 1000),
                    "subscriptionType": "contact.propertyChange",
                    "attemptNumber": attempt,
                    "objectId": object_id,
                    "propertyName": "lifecyclestage",
                    "propertyValue": stage,
                    "changeSource": "CRM_UI",
                    "sourceId": "userId:7001",
                }
            ],
            separators=(",", ":"),
        ).encode()

    # --- chapters -------------------------------------------------------------------------

    def forged_webhook(self, body: bytes) -> None:
        self.story.title("Someone posts a webhook signed with the wrong secret")
        r = self.post_webhook(body, secret="not-the-app-secret")  # noqa: S106 - deliberately wrong
        with self.db.transaction() as tx:
            stored = tx.all(SQL["demo_inbox_rows"], connection_id=self.connection_id)
        self.story.verdict(
            r.status_code == 401 and not stored,
            f"webhook answered {r.status_code} {_short(r.text)}; "
            f"{'nothing was stored' if not stored else f'{len(stored)} inbox rows exist'}.",
        )

    def first_delivery(self, body: bytes, event_id: int, object_id: int) -> list[int]:
        self.story.title(
            f"HubSpot sends a signed v3 webhook: contact {object_id}'s lifecycle stage is now "
            f"'customer' (eventId {event_id})"
        )
        r = self.post_webhook(body)
        self.story.verdict(
            r.status_code == 200,
            f"webhook verified the X-HubSpot-Signature-v3 and answered {r.status_code} "
            f"{_short(r.text)} at once, before any processing.",
        )

        def inbox() -> list[dict[str, Any]] | None:
            with self.db.transaction() as tx:
                rows = tx.all(SQL["demo_inbox_rows"], connection_id=self.connection_id)
            return rows if rows and rows[0]["status"] != "pending" else None

        rows = inbox()
        if rows is None:
            self.stack_nudge("drain_inbox")
            rows = wait_for(inbox)
        if rows is None:
            self.story.verdict(False, "the inbox row was not drained (is drain_inbox built?).")
            return []
        row = rows[0]
        self.story.verdict(
            row["status"] == "processed",
            f"drain_inbox took inbox row {row['id']}: {row['status']}, outcome "
            f"{row['outcome']}{' error: ' + str(row['last_error']) if row['last_error'] else ''}.",
        )

        def published() -> list[dict[str, Any]] | None:
            with self.db.transaction() as tx:
                evs = tx.all(SQL["demo_trigger_events"], connection_id=self.connection_id)
            return evs if evs and all(e["published"] for e in evs) else None

        events = wait_for(published, 3)
        if events is None:
            self.stack_nudge("publish_outbox")
            events = wait_for(published)
        with self.db.transaction() as tx:
            all_events = tx.all(SQL["demo_trigger_events"], connection_id=self.connection_id)
        for e in all_events:
            self.story.verdict(
                bool(e["published"]),
                f"outbox: trigger event {e['id']} {e['event_type']} for "
                f"{e['record_object_type']} {e['record_object_id']} "
                + (
                    "was published to Pub/Sub trigger-events (the message carries only its id)."
                    if e["published"]
                    else "is still waiting for publish_outbox."
                ),
            )
        if not all_events:
            self.story.verdict(False, "no trigger event reached the outbox.")
        return [int(e["id"]) for e in (events or all_events)]

    def admission(self, event_ids: list[int]) -> list[str]:
        """Report admit_event's decision for each event; the ids of the runs it started."""
        self.story.title("Pub/Sub pushes the event to admit_event")
        if not event_ids:
            self.story.verdict(False, "nothing to admit: no trigger event was published.")
            return []

        def decided() -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | None:
            with self.db.transaction() as tx:
                claims = tx.all(SQL["demo_claims"], event_ids=event_ids)
                refusals = tx.all(SQL["demo_refusals"], event_ids=event_ids)
            return (claims, refusals) if claims or refusals else None

        got = wait_for(decided, min(10.0, WAIT_SECONDS))
        log = self.stack.log("admit_event")
        if got is None:
            with self.db.transaction() as tx:
                bindings = int(tx.scalar(SQL["demo_bindings"], tenant_id=self.tenant_id) or 0)
            if bindings == 0 and "not built yet" not in log:  # nothing listens: nothing to do
                self.story.verdict(
                    True,
                    "admit_event found no workflow bound to this event for the tenant, so "
                    "nothing was claimed and nothing runs (no workflow, no refusal to record).",
                )
            else:
                self.story.verdict(
                    False,
                    f"admit_event made no decision in {min(10.0, WAIT_SECONDS):.0f} s"
                    + (
                        " — it is still a placeholder that fails, so Pub/Sub keeps redelivering "
                        "(up to the dead-letter limit infra/pubsub.tf sets)."
                        if "not built yet" in log
                        else f" (see {self.stack.info['components']['admit_event']['log']})."
                    ),
                )
            return []
        time.sleep(0.5)  # the other workflows' decisions on the same events land together
        claims, refusals = decided() or got
        for c in claims:
            if c["run_id"] is not None:  # a claim without a run is a refusal, told below
                self.story.verdict(
                    True,
                    f"workflow '{c['workflow']}' admitted event {c['event_id']}: "
                    f"run {c['run_id']} started.",
                )
        for r in refusals:
            self.story.verdict(
                True,
                f"workflow '{r['workflow']}' refused event {r['event_id']}: {r['reason']} "
                f"({r['detail']}).",
            )
        run_ids = [str(c["run_id"]) for c in claims if c["run_id"] is not None]
        self.steps(run_ids)
        return run_ids

    def steps(self, run_ids: list[str]) -> None:
        with self.db.transaction() as tx:
            runs = [
                r
                for r in tx.all(SQL["demo_runs"], tenant_id=self.tenant_id)
                if str(r["id"]) in run_ids
            ]
        for run in runs:

            def settled(run_id: Any = run["id"]) -> list[dict[str, Any]] | None:
                with self.db.transaction() as tx:
                    steps = tx.all(SQL["demo_steps"], run_id=run_id)
                done = {"succeeded", "skipped", "failed"}
                return steps if steps and all(s["status"] in done for s in steps) else None

            steps = wait_for(settled)
            with self.db.transaction() as tx:
                steps = steps or tx.all(SQL["demo_steps"], run_id=run["id"])
                status = tx.all(SQL["demo_runs"], tenant_id=self.tenant_id)
            for s in steps:
                self.story.verdict(
                    s["status"] in ("succeeded", "skipped"),
                    f"step {s['step_key']} ({s['block_type']}): {s['status']}"
                    + (f" after {s['attempt']} attempts" if s["attempt"] > 1 else "")
                    + (f" — {s['outcome_code'] or ''} {s['error']}" if s["error"] else "")
                    + ".",
                )
            final = next((r for r in status if r["id"] == run["id"]), run)
            self.story.say(f"run {run['id']} is {final['status']}.")

    def duplicates(self, body: bytes, event_id: int, object_id: int, first_ids: list[int]) -> None:
        self.story.title("HubSpot retries the same delivery, then re-announces the event")
        r = self.post_webhook(body)
        with self.db.transaction() as tx:
            rows = tx.all(SQL["demo_inbox_rows"], connection_id=self.connection_id)
        self.story.verdict(
            r.status_code == 200 and len(rows) == 1 and rows[0]["deliveries"] == 2,
            f"the identical retry answered {r.status_code}; the inbox still has "
            f"{len(rows)} row for it, now counting {rows[0]['deliveries'] if rows else 0} "
            "deliveries — stored once, by its body hash.",
        )
        again = self.stage_changed(event_id, object_id, "customer", attempt=1)
        r = self.post_webhook(again)

        def second_row_done() -> list[dict[str, Any]] | None:
            with self.db.transaction() as tx:
                rows = tx.all(SQL["demo_inbox_rows"], connection_id=self.connection_id)
            return rows if len(rows) >= 2 and rows[-1]["status"] != "pending" else None

        rows = wait_for(second_row_done) or []
        with self.db.transaction() as tx:
            events = tx.all(SQL["demo_trigger_events"], connection_id=self.connection_id)
            claims = tx.all(SQL["demo_claims"], event_ids=first_ids) if first_ids else []
        self.story.verdict(
            r.status_code == 200 and len(rows) >= 2 and len(events) == len(first_ids),
            f"the re-announced event (attemptNumber 1, a different body) answered "
            f"{r.status_code} and was drained with outcome "
            f"{rows[-1]['outcome'] if len(rows) >= 2 else 'unknown (not drained)'}: still "
            f"{len(events)} trigger event(s) for eventId {event_id}, so no second run can "
            f"start ({len(claims)} admission claim(s) in all).",
        )

    def lead_in_the_crm(self) -> None:
        """A person creates a lead in the (fake) CRM; the CRM itself sends the webhooks."""
        fake = self._fakecrm_url()
        self.story.title("A sales rep creates a lead in HubSpot (the fake CRM sends the webhooks)")
        if fake is None:
            self.story.verdict(False, "the fake CRM is not part of this stack.")
            return
        with self.db.transaction() as tx:
            before = len(tx.all(SQL["demo_inbox_rows"], connection_id=self.connection_id))
            events_before = {
                int(e["id"])
                for e in tx.all(SQL["demo_trigger_events"], connection_id=self.connection_id)
            }
        stamp = self.tenant_id.rsplit("-", 1)[-1]
        # Realistic delivery: concurrent, shuffled, some batches sent twice or redelivered
        # after they were acknowledged, as HubSpot does (devstack/fakecrm/webhooks.py).
        httpx.post(
            f"{fake}/_admin/config",
            json={"webhook_url": self.webhook_uri(), "delivery": "realistic"},
            timeout=5,
        )
        created = httpx.post(
            f"{fake}/_admin/records/contacts",
            json={
                "properties": {
                    "email": f"ada+{stamp}@example.com",
                    "firstname": "Ada",
                    "lifecyclestage": "lead",
                }
            },
            timeout=5,
        )
        if created.status_code != 201:
            self.story.verdict(False, f"the fake CRM refused the contact: {_short(created.text)}")
            return
        contact_id = created.json()["id"]
        httpx.post(f"{fake}/_admin/webhooks/flush", json={"timeout": 10}, timeout=15)
        self.story.say(
            f"Contact {contact_id} (Ada, lifecycle stage 'lead') now exists in the CRM, which "
            "signed and sent its webhooks (contact.creation plus one propertyChange per "
            "property) to the webhook function, as HubSpot does."
        )

        def drained() -> list[dict[str, Any]] | None:
            with self.db.transaction() as tx:
                rows = tx.all(SQL["demo_inbox_rows"], connection_id=self.connection_id)[before:]
            return rows if rows and all(r["status"] != "pending" for r in rows) else None

        rows = wait_for(drained)
        if rows is None:
            self.story.verdict(False, "the CRM's webhook was not stored and drained in time.")
            return
        for row in rows:
            self.story.verdict(
                row["status"] == "processed",
                f"inbox row {row['id']} from the CRM: {row['status']}, outcome {row['outcome']}.",
            )
        with self.db.transaction() as tx:
            new = [
                e
                for e in tx.all(SQL["demo_trigger_events"], connection_id=self.connection_id)
                if int(e["id"]) not in events_before
            ]
        for e in new:
            self.story.say(
                f"trigger event {e['id']}: {e['event_type']} for contact {e['record_object_id']}"
                f"{' (published)' if e['published'] else ''}."
            )
        run_ids = self.admission([int(e["id"]) for e in new])
        if not run_ids:
            self.story.say(
                "(The rest of the story — the task in the CRM, the notification, the echo of "
                "onceflow's own write, a Pub/Sub redelivery and a second 'became a lead' refused "
                "as a duplicate — needs this run, so it is skipped.)"
            )
            return
        self.effects_in_the_crm(contact_id)
        self.echo(contact_id, events_before | {int(e["id"]) for e in new})
        self.redelivered(run_ids[0])
        self.lead_again(contact_id)

    def effects_in_the_crm(self, contact_id: str) -> None:
        self.story.title("What the run did outside onceflow")
        fake = self._fakecrm_url()
        tasks = httpx.get(f"{fake}/_admin/records/tasks", timeout=5).json()["results"]
        subject = f"Call new lead {contact_id}"
        mine = [t for t in tasks if str(t["properties"].get("hs_task_subject")) == subject]
        self.story.verdict(
            len(mine) == 1,
            f"the CRM has {len(mine)} task '{subject}'"
            + (f" (task {mine[0]['id']})" if mine else "")
            + " — a create is at most once: the step marks the side effect before calling.",
        )
        linked = [
            str(a["id"])
            for t in mine
            for a in t.get("associations", {}).get("contacts", {}).get("results", [])
        ]
        self.story.verdict(
            linked == [contact_id],
            f"the task is associated with contact {contact_id}, so it shows on the contact "
            "in HubSpot (a task needs an association to appear on a record).",
        )
        contact = httpx.get(f"{fake}/_admin/records/contacts", timeout=5).json()["results"]
        status = next(
            (c["properties"].get("hs_lead_status") for c in contact if c["id"] == contact_id),
            None,
        )
        self.story.verdict(
            status == "ATTEMPTED_TO_CONTACT",
            f"contact {contact_id}'s lead status in the CRM is now {status}.",
        )

        def notified() -> list[dict[str, Any]] | None:
            return [c for c in self.receiver.received if "task_id" in c["body"]] or None

        calls = wait_for(notified, 5) or []
        if calls:
            headers = calls[0]["headers"]
            self.story.verdict(
                len(calls) == 1,
                f"the sales channel received {len(calls)} notification(s): "
                f"{_short(calls[0]['body'])} with Idempotency-Key "
                f"{headers.get('idempotency-key', '(none)')}.",
            )
        else:
            self.story.verdict(False, "the sales channel received no notification.")

    def echo(self, contact_id: str, seen: set[int]) -> None:
        self.story.title("The CRM echoes onceflow's own write back as a webhook")

        def refusals() -> list[dict[str, Any]] | None:
            with self.db.transaction() as tx:
                events = [
                    int(e["id"])
                    for e in tx.all(SQL["demo_trigger_events"], connection_id=self.connection_id)
                    if int(e["id"]) not in seen and "hs_lead_status" in (e["changed"] or "")
                ]
                got = tx.all(SQL["demo_refusals"], event_ids=events) if events else []
                claims = tx.all(SQL["demo_claims"], event_ids=events) if events else []
            return got if events and len(got) >= len(claims) and got else None

        got = wait_for(refusals) or []
        echoed = [r for r in got if r["workflow"] == "lead-status-changed"]
        self.story.verdict(
            any(r["reason"] == "echo_suppressed" for r in echoed),
            "setting the lead status made the CRM send a propertyChange webhook authored by the "
            "integration; "
            + (
                "admission refused it: "
                + "; ".join(f"{r['workflow']}: {r['reason']} ({r['detail']})" for r in got)
                if got
                else "no refusal was recorded for it"
            )
            + ".",
        )

    def redelivered(self, run_id: str) -> None:
        self.story.title("Pub/Sub delivers the same trigger event again")
        with self.db.transaction() as tx:
            runs = tx.all(SQL["demo_runs"], tenant_id=self.tenant_id)
            event_id = next(int(r["event_id"]) for r in runs if str(r["id"]) == run_id)
            claims = tx.all(SQL["demo_claims"], event_ids=[event_id])
        self.stack.publish("trigger-events", {"event_id": event_id})
        time.sleep(min(3.0, WAIT_SECONDS))
        with self.db.transaction() as tx:
            after = tx.all(SQL["demo_runs"], tenant_id=self.tenant_id)
            claims_after = tx.all(SQL["demo_claims"], event_ids=[event_id])
        self.story.verdict(
            len(after) == len(runs) and claims_after == claims,
            f"event {event_id} was pushed to admit_event again: still {len(after)} run(s) for "
            f"the tenant and the same {len(claims_after)} delivery claims (one per workflow) — "
            "each pairing (event, workflow) was already handled.",
        )

    def lead_again(self, contact_id: str) -> None:
        self.story.title("The rep moves the contact back to 'subscriber', then to 'lead' again")
        fake = self._fakecrm_url()
        with self.db.transaction() as tx:
            seen = {
                int(e["id"])
                for e in tx.all(SQL["demo_trigger_events"], connection_id=self.connection_id)
            }
        for stage in ("subscriber", "lead"):
            httpx.patch(
                f"{fake}/_admin/records/contacts/{contact_id}",
                json={"properties": {"lifecyclestage": stage}},
                timeout=5,
            )
            httpx.post(f"{fake}/_admin/webhooks/flush", json={"timeout": 10}, timeout=15)

        def decided() -> list[dict[str, Any]] | None:
            with self.db.transaction() as tx:
                events = [
                    int(e["id"])
                    for e in tx.all(SQL["demo_trigger_events"], connection_id=self.connection_id)
                    if int(e["id"]) not in seen
                ]
                got = tx.all(SQL["demo_refusals"], event_ids=events) if len(events) >= 2 else []
            mine = [r for r in got if r["workflow"] == "enroll-new-lead"]
            return mine if len(mine) >= 2 else None

        got = wait_for(decided) or []
        for r in got:
            self.say_refusal(r)
        self.story.verdict(
            [r["reason"] for r in got] == ["rule_not_matched", "duplicate"],
            "enroll-new-lead started no second run for the contact: "
            + (", then ".join(r["reason"] for r in got) or "no decision was recorded"),
        )

    def say_refusal(self, r: Mapping[str, Any]) -> None:
        self.story.say(
            f"event {r['event_id']} → {r['workflow']} refused: {r['reason']} ({r['detail']})."
        )

    def stack_nudge(self, name: str) -> None:
        """Call a scheduled function now, as Cloud Scheduler would at its next tick (it loops
        until its budget runs out, so we only start it and do not wait)."""
        try:
            self.stack.call(name, json={}, timeout=1.0)
        except httpx.TimeoutException:
            pass
        except httpx.HTTPError as exc:
            self.story.say(f"(calling {name} failed: {exc})")


def _short(text: str, limit: int = 120) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def run_scenario(running: devstack.RunningStack, story: Story) -> Story:
    db = Database(connector_from_env({"DATABASE_URL": running.database_url}), pool_size=2)
    receiver = NotifyReceiver()
    try:
        scenario = Scenario(running, db, story, receiver)
        scenario.seed()
        event_id = int(time.time() * 1000) % 10**12
        object_id = 9000 + event_id % 1000
        body = scenario.stage_changed(event_id, object_id, "customer")
        scenario.forged_webhook(body)
        first = scenario.first_delivery(body, event_id, object_id)
        scenario.admission(first)
        scenario.duplicates(body, event_id, object_id, first)
        scenario.lead_in_the_crm()
        from devstack.demo_app import AppChapters

        AppChapters(scenario).run()
        from devstack.demo_any_crm import AnyCrmChapter

        AnyCrmChapter(scenario).run()
        from devstack.demo_ai import AiChapter

        AiChapter(scenario).run()
    finally:
        receiver.close()
        db.close()
    return story


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devstack.demo", description=__doc__)
    parser.add_argument("--root", type=Path, default=devstack.DEFAULT_ROOT)
    parser.add_argument("--free-ports", action="store_true", help="any free ports (tests)")
    args = parser.parse_args(argv)
    root: Path = args.root.resolve()
    started_here = False
    running: devstack.RunningStack | None = None
    story = Story()
    try:
        alive = [p for p in devstack.read_pids(root) if p.alive()]
        if alive:
            running = devstack.RunningStack.open(root)
            bad = [h for h in running.healthy() if not h.ok]
            if bad:
                print("the running stack is not healthy: " + ", ".join(h.name for h in bad))
                print(devstack.format_table(running.healthy()))
                return 1
            print(f"using the local stack already running in {root}")
        else:
            print(f"starting the local stack in {root} …", flush=True)
            os.environ.setdefault(scheduler.SPEEDUP_ENV, DEMO_SCHEDULER_SPEEDUP)
            devstack.up(root, free_ports=args.free_ports)
            started_here = True
            running = devstack.RunningStack.open(root)
        story.title("The local stack")
        rows = running.healthy()
        print(devstack.format_table(rows))
        story.verdict(
            all(h.ok for h in rows),
            f"{len(rows)} components answered their health checks "
            f"(stack.json: {devstack.stack_file(root)}).",
        )
        run_scenario(running, story)
    except MissingTool as exc:
        print(f"missing tool: {exc}", file=sys.stderr)
        return 2
    except (RuntimeError, OSError) as exc:
        print(f"demo: {exc}".splitlines()[0], file=sys.stderr)
        return 1
    finally:
        if started_here:
            stopped = devstack.down(root, quiet=True)
            print(f"\nstopped what the demo started ({len(stopped)} components).")
    missed = [text for ok, text in story.verdicts if not ok]
    print(
        f"\n{len(story.verdicts) - len(missed)} of {len(story.verdicts)} outcomes as expected"
        + (":" if missed else ".")
    )
    for text in missed:
        print(
            textwrap.fill(text, 96, initial_indent="  did not happen: ", subsequent_indent="    ")
        )
    if not started_here and running is not None:
        # The stack stays up: one click from what the demo did to the page that shows it.
        from devstack.ops_access import mint_local_access

        access = mint_local_access(root, running.database_url, running.url("ops"), "make demo")
        print("\n" + access.lines())
    return 0


if __name__ == "__main__":
    sys.exit(main())
