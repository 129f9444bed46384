"""How approvals reach people, set up without SQL (issue 31 item 4): a tenant's Slack app and
SMTP server (`/v1/messaging`, `onceflow messaging`) and who is who (`/v1/approver-identities`,
`onceflow approvers`), against a real `ops` process: what the sweep and the Slack route then
read is what was set, only names of variables are ever stored, each change is audited, a
tenant token reaches only its own tenant, and bad input is refused with its reason."""

from __future__ import annotations

import io
import json
from typing import Any

import httpx
import pytest

from shared.core.db import Database
from shared.ops import cli
from tests.ops_support import bearer, mint, seed_tenant

pytestmark = pytest.mark.e2e


def onceflow(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def _tenant_row(db: Database, tenant: str) -> dict[str, Any]:
    with db.transaction() as tx:
        row = tx.one(
            "SELECT slack_bot_token_env, slack_signing_secret_env, smtp_host, smtp_port,"
            " smtp_from, smtp_username, smtp_password_env, smtp_starttls FROM tenants"
            " WHERE id = :t",
            t=tenant,
        )
    assert row is not None
    return dict(row)


def test_an_operator_sets_slack_smtp_and_people_with_the_cli(
    db: Database, ops_process: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed_tenant(db, "acme")
    token = mint(db, "acme", label="ann")
    mint(db, "acme", label="bob", roles=("sales_manager",))
    monkeypatch.setenv("ONCEFLOW_OPS_URL", ops_process)
    monkeypatch.setenv("ONCEFLOW_OPS_TOKEN", token)

    code, out, err = onceflow("messaging", "show")
    assert code == 0, err
    assert "slack: (none)" in out and "smtp: (none)" in out
    code, out, err = onceflow(
        "messaging", "slack", "--bot-token-env", "ACME_SLACK_BOT",
        "--signing-secret-env", "ACME_SLACK_SIGNING",
    )  # fmt: skip
    assert code == 0, err
    assert "$ACME_SLACK_BOT (not set in ops)" in out and "$ACME_SLACK_SIGNING" in out
    code, out, err = onceflow(
        "messaging", "smtp", "--host", "smtp.example.com", "--from", "approvals@acme.test",
        "--username", "mailer", "--password-env", "ACME_SMTP_PASSWORD",
    )  # fmt: skip
    assert code == 0, err
    assert "smtp.example.com:587 from approvals@acme.test, STARTTLS" in out
    # What the sweep and the Slack route read (migrations 0510, 0511): the names, as set.
    assert _tenant_row(db, "acme") == {
        "slack_bot_token_env": "ACME_SLACK_BOT",
        "slack_signing_secret_env": "ACME_SLACK_SIGNING",
        "smtp_host": "smtp.example.com",
        "smtp_port": 587,
        "smtp_from": "approvals@acme.test",
        "smtp_username": "mailer",
        "smtp_password_env": "ACME_SMTP_PASSWORD",
        "smtp_starttls": True,
    }
    code, out, err = onceflow("messaging", "show", "--json")
    assert code == 0, err
    assert json.loads(out)["slack"] == {
        "bot_token_env": "ACME_SLACK_BOT",
        "signing_secret_env": "ACME_SLACK_SIGNING",
        "bot_token_set": False,  # the ops process has neither variable
        "signing_secret_set": False,
    }
    assert json.loads(out)["smtp"]["password_set"] is False

    code, out, err = onceflow("approvers", "add", "--slack", "U024BE7LH", "--user", "bob")
    assert code == 0 and "slack U024BE7LH is bob in acme" in out, err
    code, _, err = onceflow("approvers", "add", "--email", "bob@acme.test", "--user", "bob")
    assert code == 0, err
    # The Slack route's own lookup (ops_approver_identity) now finds bob and his roles.
    from shared.ops.slack_interactions import IDENTITY

    with db.transaction() as tx:
        who = tx.one(IDENTITY, tenant_id="acme", channel="slack", external_id="U024BE7LH")
    assert who is not None and who["onceflow_user"] == "bob"
    assert list(who["roles"]) == ["sales_manager"]
    code, out, err = onceflow("approvers", "list")
    assert code == 0, err
    assert "U024BE7LH" in out and "bob@acme.test" in out
    code, out, err = onceflow("approvers", "remove", "--slack", "U024BE7LH")
    assert code == 0 and "removed" in out, err
    code, out, _ = onceflow("approvers", "list", "--json")
    assert [i["external_id"] for i in json.loads(out)["items"]] == ["bob@acme.test"]
    code, _, err = onceflow("approvers", "remove", "--slack", "U024BE7LH")
    assert code == cli.EXIT_NOT_FOUND, err

    code, out, err = onceflow("messaging", "slack", "--clear")
    assert code == 0 and "slack: (none)" in out, err
    code, out, err = onceflow("messaging", "smtp", "--clear")
    assert code == 0 and "smtp: (none)" in out, err
    assert _tenant_row(db, "acme")["smtp_host"] is None

    with db.transaction() as tx:
        actions = tx.all("SELECT action, tenant_id FROM ops_audit ORDER BY id")
    assert [a["action"] for a in actions] == [
        "messaging.slack",
        "messaging.smtp",
        "approver_identities.add",
        "approver_identities.add",
        "approver_identities.remove",
        "approver_identities.remove",  # the refused one (404) is audited too
        "messaging.slack",
        "messaging.smtp",
    ]
    assert {a["tenant_id"] for a in actions} == {"acme"}


def test_bad_input_is_refused_with_its_reason_and_tenants_stay_apart(
    db: Database, ops_process: str
) -> None:
    seed_tenant(db, "acme")
    seed_tenant(db, "globex")
    acme = bearer(mint(db, "acme", label="ann"))
    globex = bearer(mint(db, "globex", label="gus"))
    admin = bearer(mint(db, None, label="root"))

    def post(path: str, body: dict[str, Any], headers: dict[str, str]) -> httpx.Response:
        return httpx.post(f"{ops_process}{path}", json=body, headers=headers, timeout=10)

    def refused(r: httpx.Response, status: int, code: str) -> str:
        assert (r.status_code, r.json()["code"]) == (status, code), r.text
        return str(r.json()["message"])

    add = "/v1/approver-identities"
    why = refused(post(add, {"slack_user_id": "bob", "user": "ann"}, acme), 422,
                  "slack_user_id_malformed")  # fmt: skip
    assert "starts with U" in why
    for bad in ("bob@acme.test\r\nBcc: all@acme.test", "Bob <bob@acme.test>", "a@b, c@d.e",
                "bob@acme.test\n", "not-an-address"):  # fmt: skip
        refused(post(add, {"email": bad, "user": "ann"}, acme), 422, "email_malformed")
    why = refused(post(add, {"email": "x@acme.test", "user": "nobody"}, acme), 422, "unknown_user")
    assert "'nobody'" in why
    refused(post(add, {"user": "ann"}, acme), 422, "identity_required")
    # A user of another tenant is no user here; another tenant is not found for a tenant token.
    refused(post(add, {"email": "x@acme.test", "user": "gus"}, acme), 422, "unknown_user")
    refused(
        post(add, {"tenant_id": "globex", "email": "x@acme.test", "user": "gus"}, acme),
        404,
        "not_found",
    )
    refused(post(add, {"tenant_id": "nope", "email": "x@a.test", "user": "a"}, admin), 404,
            "not_found")  # fmt: skip
    assert post(add, {"slack_user_id": "W0ANN1", "user": "ann"}, acme).status_code == 201
    why = refused(post(add, {"slack_user_id": "W0ANN1", "user": "ann"}, acme), 409,
                  "identity_mapped")  # fmt: skip
    assert "'ann'" in why
    # globex sees none of acme's people, and cannot remove them.
    listed = httpx.get(f"{ops_process}{add}", headers=globex, timeout=10).json()
    assert listed["items"] == []
    refused(post(f"{add}/remove", {"slack_user_id": "W0ANN1"}, globex), 404, "not_found")

    slack = "/v1/messaging/slack"
    refused(post(slack, {"bot_token_env": "A_BOT", "signing_secret_env": None}, acme), 422,
            "slack_incomplete")  # fmt: skip
    # A secret given where its variable's name belongs is refused, never stored.
    r = post(slack, {"bot_token_env": "xoxb-123-secret", "signing_secret_env": "S"}, acme)
    refused(r, 422, "invalid_body")
    assert "xoxb" not in json.dumps(_tenant_row(db, "acme"))
    refused(post(slack, {"bot_token_env": "B", "signing_secret_env": "S"}, admin), 422,
            "tenant_required")  # fmt: skip
    refused(post(slack, {"tenant_id": "nope", "bot_token_env": "B", "signing_secret_env": "S"},
                 admin), 404, "not_found")  # fmt: skip
    refused(post(slack, {"tenant_id": "globex", "bot_token_env": "B", "signing_secret_env": "S"},
                 acme), 404, "not_found")  # fmt: skip
    smtp = "/v1/messaging/smtp"
    refused(post(smtp, {"host": "smtp.acme.test\r\nX: y", "sender": "a@acme.test"}, acme), 422,
            "smtp_host_malformed")  # fmt: skip
    refused(post(smtp, {"host": "smtp.acme.test"}, acme), 422, "smtp_sender_required")
    refused(post(smtp, {"host": "smtp.acme.test", "sender": "a@b.c\r\nBcc: x@y.z"}, acme), 422,
            "smtp_sender_malformed")  # fmt: skip
    refused(post(smtp, {"host": "smtp.acme.test", "sender": "a@acme.test", "port": 0}, acme),
            422, "invalid_body")  # fmt: skip
    refused(post(smtp, {"host": "h.test", "sender": "a@acme.test", "username": "u"}, acme), 422,
            "smtp_login_incomplete")  # fmt: skip
    assert _tenant_row(db, "globex")["slack_bot_token_env"] is None
    # The OpenAPI document describes the new routes.
    paths = httpx.get(f"{ops_process}/openapi.json", timeout=10).json()["paths"]
    assert {"/v1/messaging", "/v1/messaging/slack", "/v1/messaging/smtp",
            "/v1/approver-identities", "/v1/approver-identities/remove"} <= set(paths)  # fmt: skip


def test_show_says_whether_each_named_variable_is_set_never_its_value(
    db: Database, client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed_tenant(db, "acme")
    acme = bearer(mint(db, "acme", label="ann"))
    monkeypatch.setenv("ACME_SLACK_BOT", "xoxb-the-real-token")
    body = {"bot_token_env": "ACME_SLACK_BOT", "signing_secret_env": "ACME_SLACK_SIGNING"}
    answer = client.post("/v1/messaging/slack", json=body, headers=acme)
    assert answer.status_code == 200, answer.get_json()
    slack = answer.get_json()["slack"]
    assert (slack["bot_token_set"], slack["signing_secret_set"]) == (True, False)
    shown = client.get("/v1/messaging", headers=acme).get_data(as_text=True)
    assert "xoxb-the-real-token" not in shown and '"bot_token_set":true' in shown.replace(" ", "")
