"""The demo's any-CRM chapter (issue 28 item 4): ONE workflow definition, the shipped example
`examples/workflows/new-company-any-crm.yaml` (trigger `crm.company.created`, neutral kind
`company`), runs against both CRMs of the local stack — the fake HubSpot (devstack/fakecrm)
and the fake Pipedrive (devstack/fakepipedrive).

A person adds a company in each fake's web app; each fake signs (HubSpot: X-HubSpot-Signature-v3)
or authenticates (Pipedrive: HTTP Basic) its webhook to the tenant's connection; each becomes a
trigger event of its own CRM and one run of the same workflow, whose `crm.get` and `crm.search`
go through that connection's port to that CRM. Every verdict is read from the database, the
fakes or the sales receiver, never assumed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import httpx

from devstack.demo_story import SQL, Story, wait_for
from devstack.stack import FAKEPIPEDRIVE_API_USER, RunningStack
from shared.accounts import connections
from shared.core.db import Database

EXAMPLE = Path(__file__).resolve().parent.parent / "examples/workflows/new-company-any-crm.yaml"
EXAMPLE_TENANT = "tenant: acme\n"
EXAMPLE_SALES_URL = "https://sales.example.com/hooks/new-company"
HUBSPOT_SECRET_ENV = "ONCEFLOW_DEMO_HUBSPOT_APP_SECRET"  # noqa: S105 - a variable name
HUBSPOT_TOKEN_ENV = "ONCEFLOW_DEMO_HUBSPOT_TOKEN"  # noqa: S105 - a variable name
PIPEDRIVE_CREDENTIALS_ENV = "ONCEFLOW_DEMO_PIPEDRIVE_CREDENTIALS"
PIPEDRIVE_TOKEN_ENV = "ONCEFLOW_DEMO_PIPEDRIVE_TOKEN"  # noqa: S105 - a variable name
HUBSPOT_PORTAL = 62515  # the fake HubSpot's default portal


class Receiver(Protocol):
    """The demo's sales channel (devstack/demo.py NotifyReceiver)."""

    received: list[dict[str, Any]]

    @property
    def url(self) -> str: ...


class Scenario(Protocol):
    stack: RunningStack
    db: Database
    story: Story
    receiver: Receiver


@dataclass
class AnyCrmChapter:
    s: Scenario
    tenant_id: str = ""
    connections: dict[str, str] = field(default_factory=dict)  # CRM -> connection id
    names: dict[str, str] = field(default_factory=dict)  # CRM -> the company's name
    record_ids: dict[str, str] = field(default_factory=dict)  # CRM -> the company's id there

    def fake(self, name: str) -> str | None:
        comp = self.s.stack.info["components"].get(name)
        return str(comp["url"]) if comp else None

    def run(self) -> None:
        story = self.s.story
        story.title("One workflow, two CRMs: a tenant connects HubSpot and Pipedrive")
        hubspot, pipedrive = self.fake("fakecrm"), self.fake("fakepipedrive")
        if hubspot is None or pipedrive is None:
            story.verdict(False, "the stack lacks the fake HubSpot or the fake Pipedrive.")
            return
        if not self.seed(hubspot, pipedrive):
            return
        story.title("A company is added in each CRM's web app")
        self.add_companies(hubspot, pipedrive)
        self.runs_on_both(pipedrive)

    # --- seeding --------------------------------------------------------------------------

    def seed(self, hubspot: str, pipedrive: str) -> bool:
        from shared.publishing import versions
        from shared.publishing.validate import DefinitionInvalid

        stamp = datetime.now(UTC).strftime("%Y%m%d%H%M%S%f")
        self.tenant_id = f"demo-anycrm-{stamp}"
        sales_url = self.s.receiver.url.rsplit("/sales/", 1)[0] + "/hooks/new-company"
        text = EXAMPLE.read_text("utf-8")
        # The example as shipped, for this tenant and with its notification sent to the demo's
        # receiver: nothing about a CRM is changed.
        text = text.replace(EXAMPLE_TENANT, f"tenant: {self.tenant_id}\n").replace(
            EXAMPLE_SALES_URL, sales_url
        )
        try:
            with self.s.db.transaction() as tx:
                tx.execute(SQL["demo_tenant_insert"], id=self.tenant_id, name="Any Co", credits=100)
                self.connections["HubSpot"] = connections.create_connection(
                    tx,
                    tenant_id=self.tenant_id,
                    provider="hubspot",
                    webhook_secret_env=HUBSPOT_SECRET_ENV,
                    api_credentials_env=HUBSPOT_TOKEN_ENV,
                    api_base_url=hubspot,
                    provider_account_id=str(HUBSPOT_PORTAL),
                )
                self.connections["Pipedrive"] = connections.create_connection(
                    tx,
                    tenant_id=self.tenant_id,
                    provider="pipedrive",
                    webhook_secret_env=PIPEDRIVE_CREDENTIALS_ENV,
                    api_credentials_env=PIPEDRIVE_TOKEN_ENV,
                    api_base_url=pipedrive,
                    provider_user_id=str(FAKEPIPEDRIVE_API_USER),
                )
                published = versions.publish(tx, text, tenant_id=self.tenant_id)
                versions.activate(
                    tx,
                    tenant_id=self.tenant_id,
                    workflow_id=published.workflow_id,
                    version_id=published.version_id,
                )
                bound = sorted(
                    str(r["event_type"])
                    for r in tx.all(SQL["demo_binding_events"], tenant_id=self.tenant_id)
                )
        except DefinitionInvalid as exc:
            self.s.story.verdict(False, f"new-company-any-crm was refused: {exc}")
            return False
        self.s.story.verdict(
            bound == ["hubspot.company.created", "pipedrive.company.created"],
            f"tenant {self.tenant_id} has a HubSpot connection {self.connections['HubSpot']} "
            f"(portal {HUBSPOT_PORTAL}) and a Pipedrive connection "
            f"{self.connections['Pipedrive']} (API token, webhooks authenticated with HTTP "
            f"Basic, acting as Pipedrive user {FAKEPIPEDRIVE_API_USER}). One definition, "
            f"{EXAMPLE.name}, is active unchanged (its tenant and sales URL aside): its "
            f"`crm.company.created` is bound to {', '.join(bound) or 'nothing'}.",
        )
        # The webhook subscription reconcile creates on activation (one per object and action,
        # to the connection's own URL, its `user:password` as HTTP Basic), made here directly:
        # the local stack has no public base URL for it to name.
        user, _, password = self.s.stack.env[PIPEDRIVE_CREDENTIALS_ENV].partition(":")
        made = httpx.post(
            f"{pipedrive}/v1/webhooks",
            json={
                "subscription_url": self.webhook_uri("pipedrive"),
                "event_action": "create",
                "event_object": "organization",
                "version": "2.0",
                "http_auth_user": user,
                "http_auth_password": password,
            },
            headers={"x-api-token": self.s.stack.env[PIPEDRIVE_TOKEN_ENV]},
            timeout=5,
        )
        self.s.story.verdict(
            made.status_code == 201,
            f"Pipedrive has a webhook (v2) for added organizations to "
            f"{self.webhook_uri('pipedrive')} ({made.status_code}); "
            "HubSpot's fake sends every change to the connection's URL.",
        )
        return made.status_code == 201

    def webhook_uri(self, provider: str) -> str:
        connection = self.connections["HubSpot" if provider == "hubspot" else "Pipedrive"]
        return f"{self.s.stack.url('webhook')}/{provider}/{connection}"

    # --- the companies --------------------------------------------------------------------

    def add_companies(self, hubspot: str, pipedrive: str) -> None:
        stamp = self.tenant_id.rsplit("-", 1)[-1][-6:]
        self.names = {crm: f"Northwind {stamp} ({crm})" for crm in ("HubSpot", "Pipedrive")}
        httpx.post(
            f"{hubspot}/_admin/config", json={"webhook_url": self.webhook_uri("hubspot")}, timeout=5
        )
        made = httpx.post(
            f"{hubspot}/_admin/records/companies",
            json={"properties": {"name": self.names["HubSpot"]}},
            timeout=5,
        )
        if made.status_code == 201:
            self.record_ids["HubSpot"] = str(made.json()["id"])
        httpx.post(f"{hubspot}/_admin/webhooks/flush", json={"timeout": 10}, timeout=15)
        added = httpx.post(
            f"{pipedrive}/_admin/ui/organization", json={"name": self.names["Pipedrive"]}, timeout=5
        )
        if added.status_code == 201:
            self.record_ids["Pipedrive"] = str(added.json()["id"])
        self.s.story.verdict(
            len(self.record_ids) == 2,
            f"HubSpot company {self.record_ids.get('HubSpot', '(refused)')} "
            f"'{self.names['HubSpot']}' and Pipedrive organization "
            f"{self.record_ids.get('Pipedrive', '(refused)')} '{self.names['Pipedrive']}' were "
            "added by a person; each CRM sent its webhook (HubSpot signed with the app secret, "
            "Pipedrive with HTTP Basic).",
        )

    def runs_on_both(self, pipedrive: str) -> None:
        story = self.s.story
        events: dict[str, list[dict[str, Any]]] = {}

        def admitted() -> dict[str, list[dict[str, Any]]] | None:
            with self.s.db.transaction() as tx:
                for crm, connection_id in self.connections.items():
                    found = tx.all(SQL["demo_trigger_events"], connection_id=connection_id)
                    events[crm] = [e for e in found if e["event_type"].endswith(".created")]
                ids = [int(e["id"]) for got in events.values() for e in got]
                claims = tx.all(SQL["demo_claims"], event_ids=ids) if ids else []
            started = [c for c in claims if c["run_id"] is not None]
            return {"claims": started} if len(started) >= 2 else None

        got = wait_for(admitted)
        claims = got["claims"] if got else []
        for crm, found in events.items():
            ids = {int(e["id"]) for e in found}
            runs = [c for c in claims if int(c["event_id"]) in ids]
            kinds = ", ".join(
                f"{e['event_type']} for {e['record_object_type']} {e['record_object_id']}"
                for e in found
            )
            story.verdict(
                len(runs) == 1,
                f"{crm}: trigger event {kinds or '(none)'}; "
                + (
                    f"new-company-any-crm started run {runs[0]['run_id']} on {crm}."
                    if len(runs) == 1
                    else f"{len(runs)} run(s) started."
                ),
            )

        def notified() -> list[dict[str, Any]] | None:
            bodies = [
                c["body"] for c in self.s.receiver.received if c["path"] == "/hooks/new-company"
            ]
            return bodies if len(bodies) >= 2 else None

        bodies = wait_for(notified) or []
        for crm, name in self.names.items():
            mine = [b for b in bodies if name in b]
            story.verdict(
                len(mine) == 1 and self.record_ids.get(crm, "?") in mine[0],
                f"the run on {crm} read company {self.record_ids.get(crm)} from {crm} "
                f"(crm.get, crm.search through its connection's port) and told sales: "
                + (mine[0] if mine else "no notification arrived")
                + ".",
            )
        state = httpx.get(f"{pipedrive}/_admin/state", timeout=5).json()
        read = [
            r
            for r in state["requests"]
            if r["path"] == f"/api/v2/organizations/{self.record_ids.get('Pipedrive')}"
            and r["method"] == "GET"
            and r["user_id"] == FAKEPIPEDRIVE_API_USER
        ]
        story.verdict(
            bool(read) and all(r["status"] == 200 for r in read),
            f"the fake Pipedrive served {len(read)} read(s) of organization "
            f"{self.record_ids.get('Pipedrive')} with the connection's API token (user "
            f"{FAKEPIPEDRIVE_API_USER}): the neutral `company` became Pipedrive's organization.",
        )
