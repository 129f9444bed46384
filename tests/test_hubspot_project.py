"""Project-based HubSpot apps (issue 26, item 1): `onceflow hubspot project DIR` writes the
app's project files (hsproject.json, src/app/app-hsmeta.json, the webhooks component) from what
ops says the active workflows need — the subscriptions reconcile's own union — and updates them
keeping what a person added; the declaration it read back is recorded, and a subscription an
active workflow needs that the project does not declare is a warning in health, validation
and activation, while the hourly reconcile calls nothing for such an app and succeeds.

The CLI runs against the real ops entry point over HTTP (`ops_server`)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from devstack import seed
from shared.accounts import provider_apps
from shared.core.db import Database
from shared.ops import cli
from shared.port.interface import PortError
from shared.publishing import subscriptions
from tests.ops_support import bearer, mint

APP = "515151"
LEGACY = "525252"
SCOPES = ("crm.objects.contacts.read", "crm.objects.contacts.write")
PUBLIC = "https://hooks.example.com/webhook"
REDIRECT = PUBLIC + "/oauth/hubspot/callback"


def onceflow(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def apps(db: Database, ops_server: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A project app with two tenants' connections (acme watches lifecyclestage and waits for a
    deal's amount; globex starts on contact creation), a legacy app, and a third tenant on no
    app; the CLI pointed at ops with an admin token. Returns the admin token."""
    monkeypatch.setenv("ONCEFLOW_PUBLIC_URL", PUBLIC)
    monkeypatch.setenv("ONCEFLOW_OAUTH_REDIRECT_URL", REDIRECT)
    with db.transaction() as tx:
        for app_id, platform in ((APP, "project"), (LEGACY, "legacy")):
            provider_apps.register_app(
                tx,
                provider="hubspot",
                app_id=app_id,
                client_secret_env="HUBSPOT_APP_SECRET",
                oauth_client_id_env="HUBSPOT_APP_CLIENT_ID",
                oauth_scopes=SCOPES,
                platform=platform,  # type: ignore[arg-type]
            )
        for tenant, portal in (("acme", "1001"), ("globex", "1002"), ("initech", None)):
            seed.tenant(tx, tenant)
            seed.connection(
                tx,
                tenant,
                provider_account_id=portal or "1003",
                provider_app_id=APP if portal else None,
            )
        seed.workflow(
            tx,
            "acme",
            "lifecycle",
            {"events": ["hubspot.contact.property_changed"], "watch": ["lifecyclestage"]},
            [
                {
                    "id": "amount",
                    "type": "wait_for",
                    "config": {
                        "event": "hubspot.deal.property_changed",
                        "watch": ["amount"],
                        "timeout": {"days": 1},
                    },
                },
            ],
        )
        seed.workflow(tx, "globex", "welcome", {"events": ["hubspot.contact.created"]})
        seed.workflow(tx, "initech", "elsewhere", {"events": ["hubspot.company.created"]})
    token = mint(db, None)
    monkeypatch.setenv("ONCEFLOW_OPS_URL", ops_server)
    monkeypatch.setenv("ONCEFLOW_OPS_TOKEN", token)
    return token


def read(path: Path) -> Any:
    return json.loads(path.read_text("utf-8"))


NEEDED = [
    {"subscriptionType": "contact.creation", "active": True},
    {
        "subscriptionType": "contact.propertyChange",
        "propertyName": "lifecyclestage",
        "active": True,
    },
    {"subscriptionType": "deal.propertyChange", "propertyName": "amount", "active": True},
]


def test_the_project_command_writes_the_apps_files_for_its_tenants_active_workflows(
    db: Database, apps: str, tmp_path: Path
) -> None:
    code, out, err = onceflow("hubspot", "project", str(tmp_path / "app"), "--app", APP)
    assert code == cli.EXIT_OK, err
    assert "declares 3 subscriptions (0 still missing)" in out and "hs project upload" in out
    root = tmp_path / "app"
    assert read(root / "hsproject.json") == {
        "name": f"onceflow-{APP}",
        "srcDir": "src",
        "platformVersion": "2026.03",
    }
    app = read(root / "src/app/app-hsmeta.json")
    assert app["type"] == "app" and app["uid"] == f"onceflow_app_{APP}"
    assert app["config"]["auth"] == {
        "type": "oauth",
        # The app's own callback (installs that start at HubSpot) and ops-started installs'.
        "redirectUrls": [f"{REDIRECT}/{APP}", REDIRECT],
        "requiredScopes": list(SCOPES),
        "optionalScopes": [],
        "conditionallyRequiredScopes": [],
    }
    hooks = read(root / "src/app/webhooks/webhooks-hsmeta.json")
    assert hooks["type"] == "webhooks"
    assert hooks["config"]["settings"] == {
        "targetUrl": f"{PUBLIC}/hubspot/app/{APP}",
        "maxConcurrentRequests": 10,
    }
    # The union of acme's trigger and wait and globex's trigger; initech is on no app.
    assert hooks["config"]["subscriptions"] == {
        "crmObjects": [],
        "legacyCrmObjects": NEEDED,
        "hubEvents": [],
    }
    # What the files declare is recorded: no drift, and the same rule as the reconcile's.
    with db.transaction() as tx:
        found = provider_apps.get_app(tx, "hubspot", APP)
    assert found is not None
    assert subscriptions.declared_of(found) == subscriptions.desired_for_app(db, found).keys


def test_updating_the_project_keeps_what_a_person_added(
    db: Database, apps: str, tmp_path: Path
) -> None:
    root = tmp_path / "app"
    (root / "src/app/webhooks").mkdir(parents=True)
    (root / "src/app/cards").mkdir(parents=True)
    (root / "hsproject.json").write_text(
        json.dumps({"name": "ours", "srcDir": "src", "platformVersion": "2026.03"})
    )
    card = {"uid": "card", "type": "card", "config": {"name": "A card"}}
    (root / "src/app/cards/card-hsmeta.json").write_text(json.dumps(card))
    (root / "src/app/app-hsmeta.json").write_text(
        json.dumps(
            {
                "uid": "their_uid",
                "type": "app",
                "config": {
                    "name": "Their name",
                    "distribution": "marketplace",
                    "auth": {
                        "type": "oauth",
                        "redirectUrls": ["https://theirs.example.com/cb"],
                        "requiredScopes": ["crm.objects.deals.read"],
                        "optionalScopes": ["crm.objects.owners.read"],
                    },
                    "support": {"supportEmail": "help@example.com"},
                },
            }
        )
    )
    generic = {
        "subscriptionType": "object.propertyChange",
        "objectType": "company",
        "propertyName": "name",
        "active": True,
    }
    conversation = {"subscriptionType": "conversation.creation", "active": True}
    (root / "src/app/webhooks/my-hooks-hsmeta.json").write_text(
        json.dumps(
            {
                "uid": "their_webhooks",
                "type": "webhooks",
                "config": {
                    "settings": {
                        "targetUrl": "https://old.example.com",
                        "maxConcurrentRequests": 5,
                    },
                    "subscriptions": {
                        "crmObjects": [generic],
                        "legacyCrmObjects": [
                            {"subscriptionType": "ticket.deletion", "active": True}  # unneeded
                        ],
                        "hubEvents": [conversation],
                    },
                },
            }
        )
    )
    code, _, err = onceflow("hubspot", "project", str(root), "--app", APP)
    assert code == cli.EXIT_OK, err
    assert read(root / "hsproject.json")["name"] == "ours"
    assert read(root / "src/app/cards/card-hsmeta.json") == card
    assert not (root / "src/app/webhooks/webhooks-hsmeta.json").exists()  # theirs was updated
    config = read(root / "src/app/app-hsmeta.json")["config"]
    assert config["name"] == "Their name" and config["distribution"] == "marketplace"
    assert config["support"] == {"supportEmail": "help@example.com"}
    assert config["auth"]["redirectUrls"] == [
        f"{REDIRECT}/{APP}",
        REDIRECT,
        "https://theirs.example.com/cb",
    ]
    assert config["auth"]["requiredScopes"] == list(SCOPES)  # what onceflow's installs ask
    assert config["auth"]["optionalScopes"] == ["crm.objects.owners.read"]
    hooks = read(root / "src/app/webhooks/my-hooks-hsmeta.json")
    assert hooks["uid"] == "their_webhooks"
    assert hooks["config"]["settings"] == {
        "targetUrl": f"{PUBLIC}/hubspot/app/{APP}",
        "maxConcurrentRequests": 5,
    }
    assert hooks["config"]["subscriptions"] == {
        "crmObjects": [generic],
        "legacyCrmObjects": NEEDED,  # the unneeded ticket.deletion is gone
        "hubEvents": [conversation],
    }
    # The record is what the files declare, the person's generic entry included.
    r = onceflow("hubspot", "project", str(root), "--app", APP, "--json")
    assert r[0] == cli.EXIT_OK, r[2]
    declared = {(d["object_type"], d["property_name"]) for d in json.loads(r[1])["declared"]}
    assert ("company", "name") in declared and ("contact", "lifecyclestage") in declared


def test_a_file_that_is_not_json_is_left_alone(apps: str, tmp_path: Path) -> None:
    root = tmp_path / "app"
    (root / "src/app").mkdir(parents=True)
    (root / "src/app/app-hsmeta.json").write_text("{ not json")
    code, _, err = onceflow("hubspot", "project", str(root), "--app", APP)
    assert code == cli.EXIT_USAGE and "not JSON" in err
    assert (root / "src/app/app-hsmeta.json").read_text() == "{ not json"


def test_a_legacy_app_is_not_written_as_a_project(apps: str, tmp_path: Path) -> None:
    code, _, err = onceflow("hubspot", "project", str(tmp_path / "x"), "--app", LEGACY)
    assert code == cli.EXIT_REFUSED and "legacy app" in err
    assert not (tmp_path / "x").exists()


def test_drift_is_a_warning_in_health_validation_and_activation(
    db: Database, apps: str, client: Any, tmp_path: Path
) -> None:
    admin = bearer(apps)
    # Never written: everything needed is missing, and health says what to run.
    problems = client.get("/v1/health", headers=admin).get_json()["problems"]
    (drift,) = [p for p in problems if f"app {APP}" in p]
    assert "no project files were written" in drift and "contact.creation" in drift
    assert "onceflow hubspot project DIR --app 515151" in drift

    assert onceflow("hubspot", "project", str(tmp_path / "app"), "--app", APP)[0] == cli.EXIT_OK
    assert not [
        p for p in client.get("/v1/health", headers=admin).get_json()["problems"] if APP in p
    ]

    # A definition needing a field the deployed project lacks: valid, with a warning.
    acme = bearer(mint(db, "acme"))
    source = json.dumps(
        {
            "name": "owner",
            "tenant": "acme",
            "trigger": {
                "events": ["hubspot.contact.property_changed"],
                "watch": ["hubspot_owner_id"],
            },
            "steps": [{"id": "done", "type": "end"}],
        }
    )
    checked = client.post("/v1/workflows/validate", json={"source": source}, headers=acme)
    assert checked.status_code == 200, checked.get_json()
    body = checked.get_json()
    assert body["valid"] is True
    (warning,) = [p for p in body["problems"] if p["severity"] == "warning" and APP in p["message"]]
    assert "contact.propertyChange[hubspot_owner_id]" in warning["message"]

    published = client.post("/v1/workflows", json={"source": source}, headers=acme).get_json()
    activated = client.post(
        f"/v1/workflows/{published['workflow_id']}/activate",
        json={"version_id": published["version_id"]},
        headers=acme,
    )
    assert activated.status_code == 200, activated.get_json()
    (warning_text,) = activated.get_json()["warnings"]
    assert "contact.propertyChange[hubspot_owner_id]" in warning_text
    # Another tenant of the app sees nothing of acme's needs; the operator sees the app's.
    globex = bearer(mint(db, "globex"))
    assert not [
        p for p in client.get("/v1/health", headers=globex).get_json()["problems"] if APP in p
    ]
    assert [p for p in client.get("/v1/health", headers=admin).get_json()["problems"] if APP in p]


def test_the_hourly_reconcile_calls_nothing_for_a_project_app_and_records_the_drift(
    db: Database, apps: str
) -> None:
    """The reconcile used to call the legacy subscriptions API for every public app; for a
    project app it can only fail ("can only be used with legacy public apps")."""
    asked: list[str] = []

    def port_for_app(app: provider_apps.ProviderApp) -> Any:
        asked.append(app.app_id)
        raise PortError("no developer credential here", code="unknown", transient=False)

    results = {r.connection_id: r for r in subscriptions.reconcile_apps(db, port_for_app)}
    project = results[f"hubspot-app:{APP}"]
    assert project.ok and project.skipped and "project files" in project.skipped
    assert {subscriptions.describe(k) for k in project.missing} == {
        "contact.creation",
        "contact.propertyChange[lifecyclestage]",
        "deal.propertyChange[amount]",
    }
    assert asked == [LEGACY]  # only the legacy app's port was built
    assert not results[f"hubspot-app:{LEGACY}"].ok
    last = subscriptions.last_app_reconcile(db, "hubspot", APP)
    assert last is not None and last["ok"] is True and len(last["result"]["missing"]) == 3
