"""The demo's AI chapter (issue 33): the shipped example
`examples/workflows/lead-reply-classify.yaml` runs on the demo tenant. The email tool (the
demo) POSTs a lead's reply, signed as Standard Webhooks are, to the webhook function; the
`ai.generate` step asks the fake Vertex AI endpoint the stack runs (devstack/fakevertex,
through Google's SDK, ONCEFLOW_VERTEX_BASE_URL) for a JSON answer the schema checks; the
answer routes the run, and its charge, taken at the token cap before the call, is settled at
the tokens used. Every verdict is read from the database."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx

from devstack import seed
from devstack.demo_story import SQL, Story, wait_for
from devstack.stack import RunningStack
from shared.core.db import Database

EXAMPLE = Path(__file__).resolve().parent.parent / "examples/workflows/lead-reply-classify.yaml"
EXAMPLE_TENANT = "tenant: acme\n"
# The HubSpot connection the example names (put yours here, it says): the demo tenant's.
EXAMPLE_CONNECTION = "0c0ffee0-5a1e-4000-8000-00000000a11c"
SECRET_ENV = "ONCEFLOW_DEMO_EMAIL_TOOL_SECRET"  # noqa: S105 - a variable name
VERTEX_PROJECT = "onceflow-demo"


class Scenario(Protocol):
    stack: RunningStack
    db: Database
    story: Story
    tenant_id: str
    connection_id: str


@dataclass
class AiChapter:
    s: Scenario

    def run(self) -> None:
        story = self.s.story
        story.title("A lead's email reply is classified by a model (the fake Vertex AI)")
        fakes = self.s.stack.info["components"]
        if "fakevertex" not in fakes or "fakecrm" not in fakes:
            story.verdict(False, "the stack lacks the fake Vertex AI endpoint or the fake CRM.")
            return
        standard = self.seed()
        if standard is None:
            return
        contact = httpx.post(
            f"{fakes['fakecrm']['url']}/_admin/records/contacts",
            json={"properties": {"firstname": "Grace", "email": "grace@example.com"}},
            timeout=5,
        )
        if contact.status_code != 201:
            story.verdict(False, f"the fake CRM refused the contact: {contact.text[:120]}")
            return
        body = {
            "message_id": f"reply-{time.time_ns()}",
            "contact_id": contact.json()["id"],
            "reply_text": "Sounds great, call me Monday.",
        }
        answer = self.post(standard, body)
        story.say(
            f"The email tool POSTed Grace's reply {body['reply_text']!r} to the webhook "
            f"function, signed with its Standard Webhooks key; it answered {answer}."
        )
        rows = wait_for(
            lambda: self.s.db.run(lambda tx: tx.all(SQL["demo_ai_run"], tenant_id=self.s.tenant_id))
        )
        if not rows:
            story.verdict(False, "the reply's run did not end: the AI step did not happen.")
            return
        run = rows[0]
        story.verdict(
            run["status"] == "succeeded" and run["answer"] is not None,
            f"lead-reply-classify run {run['run_id']} {run['status']}: the model answered "
            f"{json.dumps(run['answer'], sort_keys=True)} (checked against the step's schema), "
            f"which routed it through {run['steps']}. It used {run['tokens']} tokens and was "
            f"charged {run['charged']} credit(s): reserved at the token cap before the call, "
            "settled at what it used.",
        )

    def seed(self) -> str | None:
        """The tenant's Vertex AI project, the email tool's connection, and the example
        published and active; the connection's id (None when something was refused)."""
        from shared.publishing import versions
        from shared.publishing.validate import DefinitionInvalid

        tenant = self.s.tenant_id
        text = EXAMPLE.read_text("utf-8")
        text = text.replace(EXAMPLE_TENANT, f"tenant: {tenant}\n").replace(
            EXAMPLE_CONNECTION, self.s.connection_id
        )
        try:
            with self.s.db.transaction() as tx:
                seed.vertex(tx, tenant, project=VERTEX_PROJECT)
                standard = seed.connection(
                    tx, tenant, provider="standard", webhook_secret_env=SECRET_ENV
                )
                published = versions.publish(tx, text, tenant_id=tenant)
                versions.activate(
                    tx,
                    tenant_id=tenant,
                    workflow_id=published.workflow_id,
                    version_id=published.version_id,
                )
        except DefinitionInvalid as exc:
            self.s.story.verdict(False, f"lead-reply-classify was refused: {str(exc)[:120]}")
            return None
        self.s.story.say(
            f"Tenant {tenant}'s model calls go to Vertex AI project {VERTEX_PROJECT} — here the "
            "fake endpoint the stack runs, so nothing reaches Google. lead-reply-classify is "
            f"active, its replies arriving on the email tool's connection {standard}."
        )
        return standard

    def post(self, connection_id: str, body: dict[str, Any]) -> int:
        """Sign and POST as a Standard Webhooks sender: base64 HMAC-SHA256 of
        `id.timestamp.body` with the key `whsec_` + base64 names."""
        secret = self.s.stack.env[SECRET_ENV]
        key = base64.b64decode(secret.removeprefix("whsec_"))
        raw = json.dumps(body).encode()
        msg_id, stamp = str(body["message_id"]), str(int(time.time()))
        mac = hmac.new(key, f"{msg_id}.{stamp}.".encode() + raw, hashlib.sha256)
        url = f"{self.s.stack.url('webhook')}/standard/{connection_id}/lead-reply-classify"
        answer = httpx.post(
            url,
            content=raw,
            headers={
                "Content-Type": "application/json",
                "webhook-id": msg_id,
                "webhook-timestamp": stamp,
                "webhook-signature": "v1," + base64.b64encode(mac.digest()).decode(),
            },
            timeout=10,
        )
        return answer.status_code
