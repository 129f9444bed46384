"""A property-based run over /openapi.json (schemathesis): no request the document allows,
and none of the malformed ones it derives, gets a 5xx. Bounded to a few examples per
operation so the suite stays fast."""

from __future__ import annotations

from typing import Any

import functions_framework
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from shared.core.db import Database
from shared.ops.api import app as ops_api
from tests.ops_support import (
    ROOT_MAIN,
    Dispatched,
    JournalRow,
    mint,
    seed_run,
    seed_scene,
)

APP = functions_framework.create_app("ops", ROOT_MAIN, "http")
# Operations that still answer 501 (not built in this bundle yet) are left out; each one is
# included as soon as its route stops declaring 501.
NOT_BUILT = [r.name for r in ops_api.ROUTES if 501 in r.errors]
SCHEMA = schemathesis.openapi.from_wsgi("/openapi.json", APP)
if NOT_BUILT:
    SCHEMA = SCHEMA.exclude(operation_id=NOT_BUILT)
MAX_EXAMPLES = 12


@pytest.fixture(name="ops_token")
def ops_token_fixture(db: Database, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(ops_api, "_default_api", ops_api.OpsApi(db, dispatch=Dispatched()))
    conn, wf, ver, event, _ = seed_scene(db, "acme", [{"id": "a", "type": "http.request"}], "1")
    seed_run(
        db,
        "acme",
        wf,
        ver,
        [JournalRow("a", "failed")],
        event_id=event,
        record_key=f"{conn}:contacts:1",
    )
    return mint(db, "acme")


@SCHEMA.parametrize()
@settings(max_examples=MAX_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_request_gets_a_server_error(case: Any, ops_token: str) -> None:
    case.call_and_validate(
        headers={"Authorization": f"Bearer {ops_token}"}, checks=[not_a_server_error]
    )
