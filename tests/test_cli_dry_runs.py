"""`onceflow explain --would-run` and `onceflow rehearse` against a running `ops` function (a real
functions-framework process) whose connection reads the fake CRM over HTTP: the answer
follows the record as the CRM has it now, and a rehearsal shows each step, the CRM read it
really made and the writes it would have sent, none of which reached the CRM."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from devstack.fakecrm import FakeCrm
from devstack.function_process import serve
from shared.core.db import Database
from shared.ops import cli
from shared.providers import connect
from tests.admission_support import emit_event, make_tenant
from tests.blocks_support import fake_crm, seed_connection
from tests.ops_support import mint
from tests.pubsub_emulator import PubsubProject

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "workflows" / "enroll-new-lead.yaml"
pytestmark = pytest.mark.e2e


def onceflow(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def crm(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeCrm]:
    with fake_crm(monkeypatch) as server:  # sets FAKECRM_TOKEN, which the process inherits
        yield server


@pytest.fixture
def ops_url(db: Database, database_url: str, pubsub: PubsubProject, crm: FakeCrm) -> Iterator[str]:
    env = {"DATABASE_URL": database_url, "GOOGLE_CLOUD_PROJECT": pubsub.project}
    with serve("ops", env) as base:
        yield base


def test_would_run_and_rehearse_from_the_command_line(
    db: Database, crm: FakeCrm, ops_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_tenant(db, "acme")
    conn = seed_connection(db, crm.url)
    port = connect.port_for(db, conn)
    contact = port.create(
        "contact",
        {"firstname": "Ada", "lastname": "Lovelace", "email": "ada@example.com"},
    ).id
    key = f"{conn}:contact:{contact}"
    monkeypatch.setenv("ONCEFLOW_OPS_URL", ops_url)
    monkeypatch.setenv("ONCEFLOW_OPS_TOKEN", mint(db, "acme", label="ci"))
    code, _, err = onceflow("publish", str(EXAMPLE), "--activate")
    assert code == cli.EXIT_OK, err

    # Not a lead yet: no, with admission's reason, and exit 1 for a script.
    code, out, err = onceflow("explain", "--would-run", "enroll-new-lead", key)
    assert code == cli.EXIT_PROBLEMS, err
    assert "no, because rule_not_matched" in out
    port.update("contact", contact, {"lifecyclestage": "lead"})
    code, out, err = onceflow("explain", "--would-run", "enroll-new-lead", key)
    assert code == cli.EXIT_OK, err
    assert "yes, a new run (dedup once_per_record)" in out
    assert "lifecyclestage='lead'" in out
    code, out, _ = onceflow("explain", "--would-run", "enroll-new-lead", key, "--json")
    answer = json.loads(out)
    assert answer["would_run"] is True and answer["reason"] is None
    assert answer["record"]["lifecyclestage"] == "lead"

    # The webhook of that change, stored: the rehearsal runs against it, reading the contact
    # from the CRM for real and sending nothing.
    emit_event(db, connection_id=conn, object_id=contact, changed={"lifecyclestage": "lead"})
    tasks_before = len(crm.records("tasks"))
    code, out, err = onceflow("rehearse", "enroll-new-lead", "--record", key)
    assert code == cli.EXIT_OK, err
    lines = out.splitlines()
    assert lines[0].startswith("rehearsal run ") and lines[0].endswith(": succeeded")
    assert "- load_contact (crm.get): succeeded" in lines
    assert "- create_task (crm.create): succeeded" in lines
    assert "would send crm.create tasks" in out
    assert "hs_task_subject = 'Call Ada Lovelace'" in out  # rendered from the real read
    assert "would send http.request POST https://hooks.example.com/sales/new-lead" in out
    assert "ada@example.com" in out
    assert "2 write(s) would have been sent; none was." in out
    assert len(crm.records("tasks")) == tasks_before
    code, out, _ = onceflow("rehearse", "enroll-new-lead", "--record", key, "--json")
    assert code == cli.EXIT_OK
    assert [s["step_key"] for s in json.loads(out)["steps"]] == [
        "load_contact",
        "create_task",
        "notify",
    ]


def test_rehearse_a_record_with_no_stored_event_uses_its_current_state(
    db: Database, crm: FakeCrm, ops_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_tenant(db, "acme")
    conn = seed_connection(db, crm.url)
    contact = connect.port_for(db, conn).create("contact", {"lifecyclestage": "lead"}).id
    monkeypatch.setenv("ONCEFLOW_OPS_URL", ops_url)
    monkeypatch.setenv("ONCEFLOW_OPS_TOKEN", mint(db, "acme", label="ci"))
    assert onceflow("publish", str(EXAMPLE), "--activate")[0] == cli.EXIT_OK
    code, out, err = onceflow(
        "rehearse", "enroll-new-lead", "--record", f"{conn}:contact:{contact}", "--json"
    )
    assert "no stored event" in err
    result = json.loads(out)
    # A supplied event names no connection, so the example's CRM read says so.
    assert result["steps"][0]["step_key"] == "load_contact"
    assert code in {cli.EXIT_OK, cli.EXIT_PROBLEMS}
