"""`onceflow` against a running `ops` function (a real functions-framework process, replays
dispatched through the real Pub/Sub emulator): publish and activate an example workflow, list
and show runs, explain a record found by its object id, bulk replay with a preview, the exit
codes, and the two credentials of a deployed function (the IAM identity token in
`X-Serverless-Authorization`, the onceflow token in `Authorization`) through an IAM front
that behaves like Cloud Run's: it refuses a request without the identity token and strips it
before the function sees the request."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from devstack.function_process import serve
from shared import cli
from shared.db import Database
from shared.ops.client import IAM_HEADER
from tests.ops_support import (
    JournalRow,
    mint,
    seed_connection,
    seed_event,
    seed_run,
    seed_tenant,
    seed_workflow,
)
from tests.pubsub_emulator import (  # noqa: F401 - fixtures
    PubsubProject,
    pubsub_emulator_fixture,
    pubsub_fixture,
)

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "workflows" / "enroll-new-lead.yaml"
CHAIN = [{"id": "a", "type": "http.request", "next": "b"}, {"id": "b", "type": "crm.create"}]
ID_TOKEN = "google-identity-token-for-tests"
pytestmark = pytest.mark.e2e


@pytest.fixture(name="ops_process")
def ops_process_fixture(db: Database, database_url: str, pubsub: PubsubProject) -> Iterator[str]:
    env = {"DATABASE_URL": database_url, "GOOGLE_CLOUD_PROJECT": pubsub.project}
    with serve("ops", env) as base:
        yield base


def onceflow(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = cli.main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def _failed_runs(db: Database, n: int) -> dict[str, Any]:
    seed_tenant(db, "acme")
    conn = seed_connection(db, "acme")
    wf, ver = seed_workflow(db, "acme", CHAIN, name="sync-lead")
    runs = []
    for i in range(n):
        event = seed_event(db, "acme", conn, str(700 + i))
        journal = [JournalRow("a", "succeeded"), JournalRow("b", "failed", block_type="crm.create")]
        runs.append(
            seed_run(
                db,
                "acme",
                wf,
                ver,
                journal,
                event_id=event,
                record_key=f"{conn}:contacts:{700 + i}",
            )
        )
    return {"conn": conn, "workflow": wf, "runs": runs}


def test_onceflow_over_a_running_ops_function(
    db: Database, ops_process: str, pubsub: PubsubProject, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = _failed_runs(db, 3)
    token = mint(db, "acme", label="ci")
    monkeypatch.setenv("ONCEFLOW_OPS_URL", ops_process)
    monkeypatch.setenv("ONCEFLOW_OPS_TOKEN", token)

    code, out, _ = onceflow("publish", str(EXAMPLE), "--activate", "--json")
    assert code == cli.EXIT_OK
    published = json.loads(out)
    assert published["number"] == 1 and published["activation"]["active_version_id"]
    code, out, _ = onceflow("deactivate", published["workflow_id"])
    assert code == 0 and "deactivated" in out
    code, out, _ = onceflow("activate", published["workflow_id"], "1")  # by version number
    assert code == 0 and published["version_id"] in out

    code, out, _ = onceflow("runs", "--status", "failed", "--workflow", w["workflow"])
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split()[:3] == ["RUN", "WORKFLOW", "STATUS"]
    assert {line.split()[0] for line in lines[1:]} == set(w["runs"])
    code, out, _ = onceflow("runs", "--json", "--limit", "2")
    page = json.loads(out)
    assert len(page["items"]) == 2 and page["next_cursor"]

    code, out, _ = onceflow("show", w["runs"][0])
    assert code == 0 and "crm.create" in out and "failed" in out
    code, out, _ = onceflow("explain", "701")  # an object id, as people search
    assert code == 0 and f"{w['conn']}:contacts:701" in out

    # Bulk replay: --failed alone previews and changes nothing.
    code, out, _ = onceflow("replay", "--failed", "--workflow", w["workflow"], "--json")
    preview = json.loads(out)
    assert code == 0 and preview["would_apply_to"] == 3
    with db.transaction() as tx:
        assert tx.scalar("SELECT count(*) FROM workflow_runs WHERE replay_of IS NOT NULL") == 0
    code, out, err = onceflow("replay", "--failed", "--workflow", w["workflow"], "--yes")
    assert code == 0, err
    assert "3 of 3 replayed" in out
    with db.transaction() as tx:
        assert tx.scalar("SELECT count(*) FROM workflow_runs WHERE replay_of IS NOT NULL") == 3
    assert len(pubsub.pull_ids("step-ready", count=3, timeout=20)) == 3
    # Again by id: each is refused (already replayed), nothing new starts, exit 1.
    code, out, _ = onceflow("replay", *w["runs"])
    assert code == cli.EXIT_PROBLEMS and "0 of 3 replayed" in out
    with db.transaction() as tx:
        assert tx.scalar("SELECT count(*) FROM workflow_runs WHERE replay_of IS NOT NULL") == 3


def test_exit_codes_mean_something(
    db: Database, ops_process: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed_tenant(db, "acme")
    token = mint(db, "acme")
    monkeypatch.delenv("ONCEFLOW_OPS_URL", raising=False)
    monkeypatch.delenv("ONCEFLOW_OPS_TOKEN", raising=False)
    monkeypatch.delenv("ONCEFLOW_ID_TOKEN", raising=False)
    assert onceflow("runs")[0] == cli.EXIT_USAGE  # no URL named
    url = ["--url", ops_process]
    assert onceflow("runs", *url)[0] == cli.EXIT_AUTH  # no token
    assert onceflow("runs", *url, "--token", "ofo_wrong")[0] == cli.EXIT_AUTH
    ok = [*url, "--token", token]
    assert onceflow("runs", *ok)[0] == cli.EXIT_OK
    assert onceflow("show", "00000000-0000-0000-0000-000000000000", *ok)[0] == cli.EXIT_NOT_FOUND
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ntenant: acme\nsteps: []\n")
    code, _, err = onceflow("publish", str(bad), *ok)
    assert code == cli.EXIT_REFUSED and "definition_invalid" in err
    assert onceflow("publish", str(tmp_path / "missing.yaml"), *ok)[0] == cli.EXIT_USAGE
    assert onceflow("runs", "--url", "http://127.0.0.1:9", "--token", token)[0] == (
        cli.EXIT_UNAVAILABLE
    )
    # The installed command, as CI calls it: the same codes from a real process.
    proc = subprocess.run(
        [sys.executable, "-m", "shared.cli", "show", "not-a-run", "--url", ops_process],
        cwd=ROOT,
        env={**os.environ, "ONCEFLOW_OPS_TOKEN": token},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == cli.EXIT_NOT_FOUND and "not_found" in proc.stderr


class _IamFront(BaseHTTPRequestHandler):
    """Cloud Run's IAM check in front of the function: 403 (an HTML page, not onceflow's JSON)
    without a valid identity token in X-Serverless-Authorization; with one, the header is
    dropped and the request (its Authorization header intact) reaches the function."""

    upstream = ""
    seen: list[dict[str, str]] = []  # noqa: RUF012 - per-test class, reset by the fixture

    def _forward(self) -> None:
        if self.headers.get(IAM_HEADER) != f"Bearer {ID_TOKEN}":
            body = b"<html><body>Error: Forbidden</body></html>"
            self.send_response(403)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        headers = {
            k: v for k, v in self.headers.items() if k.lower() not in (IAM_HEADER.lower(), "host")
        }
        self.seen.append(headers)
        length = int(self.headers.get("Content-Length") or 0)
        answer = httpx.request(
            self.command,
            self.upstream + self.path,
            headers=headers,
            content=self.rfile.read(length) if length else None,
            timeout=30,
        )
        self.send_response(answer.status_code)
        self.send_header("Content-Type", answer.headers.get("content-type", "application/json"))
        self.send_header("Content-Length", str(len(answer.content)))
        self.end_headers()
        self.wfile.write(answer.content)

    do_GET = do_POST = _forward

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(name="iam_front")
def iam_front_fixture(ops_process: str) -> Iterator[str]:
    handler = type("Front", (_IamFront,), {"upstream": ops_process, "seen": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join(10)
        server.server_close()


def test_both_credentials_behind_iam(
    db: Database, iam_front: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed_tenant(db, "acme")
    token = mint(db, "acme")
    monkeypatch.setenv("ONCEFLOW_OPS_URL", iam_front)
    monkeypatch.setenv("ONCEFLOW_OPS_TOKEN", token)
    monkeypatch.delenv("ONCEFLOW_ID_TOKEN", raising=False)
    code, _, err = onceflow("runs")
    assert code == cli.EXIT_AUTH and "ONCEFLOW_ID_TOKEN" in err  # the hint names the fix
    monkeypatch.setenv("ONCEFLOW_ID_TOKEN", ID_TOKEN)
    code, out, err = onceflow("runs", "--json")
    assert code == cli.EXIT_OK, err
    assert json.loads(out)["items"] == []
    # IAM passed, and onceflow still checks its own token.
    monkeypatch.setenv("ONCEFLOW_OPS_TOKEN", "ofo_wrong")
    code, _, err = onceflow("runs")
    assert code == cli.EXIT_AUTH and "unauthenticated" in err
