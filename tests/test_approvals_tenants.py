"""A Slack click is one tenant's (issue 31 item 4, self-review): tenant globex's own Slack
app, correctly signed, naming an approval of tenant acme in its button, through globex's
path, decides nothing there — even when globex maps its clicker to a user that has acme's
approver's name; and acme's path refuses globex's signature."""

from __future__ import annotations

import json
import urllib.parse

import httpx
import pytest

from devstack import seed
from devstack.fakeslack.server import FakeSlack
from shared.core.db import Database
from shared.ops.slack_interactions import PATH_PREFIX
from tests.ops_support import mint
from tests.steps_support import TENANT
from tests.test_approvals_slack import _asked, _votes, slack_fixture  # noqa: F401 - fixture

GLOBEX_SECRET = "globex-signing-secret-0123456789"


def test_a_click_signed_by_another_tenants_app_decides_nothing_here(
    db: Database, slack: FakeSlack, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, park_id, ts = _asked(db, slack)
    monkeypatch.setenv("GLOBEX_SLACK_SIGNING", GLOBEX_SECRET)
    with db.transaction() as tx:
        seed.tenant(tx, "globex", existing="keep")
        seed.slack(
            tx, "globex", bot_token_env="TEST_SLACK_BOT", signing_secret_env="GLOBEX_SLACK_SIGNING"
        )
        seed.approver_identity(tx, "globex", channel="slack", external_id="U0EVE", user="ann")
    mint(db, "globex", label="ann")
    payload = {**slack.payload(ts, "U0EVE", "approve")}
    body = urllib.parse.urlencode({"payload": json.dumps(payload)}).encode()
    globex = FakeSlack(bot_token="x", signing_secret=GLOBEX_SECRET)
    assert slack.interaction_url is not None
    base = slack.interaction_url.removesuffix(f"{PATH_PREFIX}{TENANT}")

    through_globex = httpx.post(
        f"{base}{PATH_PREFIX}globex", content=body, headers=globex.signed(body), timeout=10
    )
    assert through_globex.status_code == 404, through_globex.text
    through_acme = httpx.post(
        f"{base}{PATH_PREFIX}{TENANT}", content=body, headers=globex.signed(body), timeout=10
    )
    assert through_acme.status_code == 401, through_acme.text
    assert _votes(db, park_id) == {}
