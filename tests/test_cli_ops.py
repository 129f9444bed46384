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
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from devstack.function_process import serve
from shared.core.db import Database
from shared.ops import cli
from shared.ops.client import IAM_HEADER
from tests.ops_support import (
    JournalRow,
    mint,
    seed_connection,
    seed_event,
    seed_run,
    seed_tenant,
    seed_workflow,
    serving,
)
from tests.pubsub_emulator import (
    PubsubProject,
)

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "workflows" / "enroll-new-lead.yaml"
CHAIN = [{"id": "a", "type": "http.request", "next": "b"}, {"id": "b", "type": "crm.create"}]
ID_TOKEN = "google-identity-token-for-tests"
pytestmark = pytest.mark.e2e


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
    # The earlier preview's token names the same three; acting on it now replays nothing
    # more (each already replayed: refused), and acting again repeats its recorded outcomes.
    code, out, _ = onceflow("bulk", "replay", "--bulk-token", preview["token"])
    assert code == cli.EXIT_PROBLEMS and "0 of 3 replayed" in out
    code, out, _ = onceflow("bulk", "replay", "--bulk-token", preview["token"])
    assert "acted on before: nothing more done" in out
    with db.transaction() as tx:
        assert tx.scalar("SELECT count(*) FROM workflow_runs WHERE replay_of IS NOT NULL") == 3
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
        [sys.executable, "-m", "shared.ops.cli", "show", "not-a-run", "--url", ops_process],
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
    with serving(ThreadingHTTPServer(("127.0.0.1", 0), handler)) as base:
        yield base


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


BOOTSTRAP_SECRET = "bootstrap-secret-for-the-cli-test-0123456789"


def test_an_operator_goes_from_nothing_to_a_tenant_token_without_sql(
    db: Database, database_url: str, pubsub: PubsubProject, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 24: the first admin token from the bootstrap secret, then a tenant, a connection,
    a scoped token, the workflow list, budget and breaker, and a revocation: all over the API
    (no DATABASE_URL in the command's environment: budget and breaker reached the database
    directly, defaulted to 127.0.0.1:5432 and crashed)."""
    env = {
        "DATABASE_URL": database_url,
        "GOOGLE_CLOUD_PROJECT": pubsub.project,
        "ONCEFLOW_OPS_BOOTSTRAP_SECRET": BOOTSTRAP_SECRET,
    }
    for name in ("DATABASE_URL", "ONCEFLOW_OPS_TOKEN", "ONCEFLOW_ID_TOKEN", "PGHOST"):
        monkeypatch.delenv(name, raising=False)
    with serve("ops", env) as base:
        monkeypatch.setenv("ONCEFLOW_OPS_URL", base)
        command_env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
        proc = subprocess.run(
            [sys.executable, "-m", "shared.ops.cli", "bootstrap", "--label", "first admin"],
            input=BOOTSTRAP_SECRET + "\n",
            cwd=ROOT,
            env=command_env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        admin = proc.stdout.strip()
        assert admin.startswith("ofo_") and "admin" in proc.stderr
        monkeypatch.setenv("ONCEFLOW_OPS_TOKEN", admin)

        code, out, err = onceflow("tenants", "create", "acme", "--credits", "100")
        assert code == 0, err
        assert "acme" in out and "100 credits" in out
        assert onceflow("tenants", "create", "acme")[0] == cli.EXIT_REFUSED
        code, out, err = onceflow(
            "connections",
            "create",
            "--tenant",
            "acme",
            "--provider",
            "hubspot",
            "--webhook-secret-env",
            "HUBSPOT_APP_SECRET",
            "--account",
            "62515",
            "--watch",
            "contact:lifecyclestage",
            "--api-credentials-env",
            "ACME_SERVICE_KEY",
            "--credential-kind",
            "service_key",
        )
        assert code == 0, err
        assert "(service_key in ACME_SERVICE_KEY)" in out
        code, out, _ = onceflow("connections", "list", "--json")
        [conn] = json.loads(out)["items"]
        assert conn["watched_fields"] == {"contact": ["lifecyclestage"]}
        assert conn["credential_kind"] == "service_key"
        code, out, _ = onceflow("connections", "list")
        assert "CREDENTIAL" in out and "service_key" in out

        code, token, err = onceflow(
            "tokens", "create", "--tenant", "acme", "--label", "ana", "--role", "sales-manager",
            "--expires", "30d",
        )  # fmt: skip
        assert code == 0, err
        token = token.strip()
        assert "tenant acme" in err and "expires" in err
        monkeypatch.setenv("ONCEFLOW_OPS_TOKEN", token)
        code, out, err = onceflow("publish", str(EXAMPLE), "--activate")
        assert code == 0, err
        code, out, _ = onceflow("workflows")
        assert "enroll-new-lead" in out and "yes" in out
        code, out, err = onceflow("budget", "enroll-new-lead")  # by name
        assert code == 0, err
        assert "spent 0" in out
        code, out, err = onceflow("breaker", "enroll-new-lead")
        assert code == 0 and "closed" in out, err
        code, _, err = onceflow("breaker", "enroll-new-lead", "--resume")
        assert code == cli.EXIT_REFUSED and "not_paused" in err
        assert onceflow("tenants", "create", "globex")[0] == cli.EXIT_AUTH  # 403: admin only

        monkeypatch.setenv("ONCEFLOW_OPS_TOKEN", admin)
        code, out, _ = onceflow("tokens", "list")
        assert "ana" in out and "first admin" in out and "sales-manager" in out
        code, out, _ = onceflow("tokens", "list", "--json")
        ana = next(t for t in json.loads(out)["items"] if t["label"] == "ana")
        code, out, err = onceflow("tokens", "revoke", ana["id"])
        assert code == 0 and "revoked" in out, err
        assert onceflow("runs", "--token", token)[0] == cli.EXIT_AUTH
    with db.transaction() as tx:
        actions = tx.all("SELECT action FROM ops_audit ORDER BY id")
    assert [a["action"] for a in actions][:3] == [
        "ops.bootstrap",
        "tenants.create",
        "tenants.create",
    ]
    assert "tokens.revoke" in [a["action"] for a in actions]


def test_runs_read_for_people_narrow_relative_and_since(
    db: Database, ops_process: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 24: rows were 170 characters wide with UTC timestamps; `--since 1h` and a bare
    date were refused."""
    w = _failed_runs(db, 3)
    with db.transaction() as tx:
        tx.execute("UPDATE workflow_runs SET error = :e", e="HTTP 400 from the CRM: " + "x" * 300)
        tx.execute(
            "UPDATE workflow_runs SET created_at = now() - interval '3 days' WHERE id = :id",
            id=w["runs"][0],
        )
    monkeypatch.setenv("ONCEFLOW_OPS_URL", ops_process)
    monkeypatch.setenv("ONCEFLOW_OPS_TOKEN", mint(db, "acme"))
    code, out, err = onceflow("runs")
    assert code == 0, err
    lines = out.splitlines()
    assert len(lines) == 4 and all(len(line) <= 100 for line in lines), lines
    assert all(" ago " in line for line in lines[1:])
    assert sum("3d ago" in line for line in lines) == 1
    assert "contacts:701" in out and w["conn"] not in out  # the record, not its connection
    code, out, _ = onceflow("runs", "--since", "1h", "--json")
    assert code == 0 and len(json.loads(out)["items"]) == 2
    code, out, _ = onceflow("runs", "--since", "2000-01-01", "--json")
    assert code == 0 and len(json.loads(out)["items"]) == 3
    with pytest.raises(SystemExit) as refused:
        onceflow("runs", "--since", "last tuesday")
    assert refused.value.code == cli.EXIT_USAGE
    code, out, _ = onceflow("show", w["runs"][1])
    assert code == 0 and "ago)" in out and all(len(line) <= 100 for line in out.splitlines())


def test_a_closed_pipe_ends_the_command_quietly(
    db: Database, ops_process: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`onceflow runs | head`: the reader goes away; no traceback, exit 141 like cat's."""
    _failed_runs(db, 3)
    env = {**os.environ, "ONCEFLOW_OPS_URL": ops_process, "ONCEFLOW_OPS_TOKEN": mint(db, "acme")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "shared.ops.cli", "runs"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before a byte is written
    with proc.stderr:
        stderr = proc.stderr.read().decode()
    assert proc.wait(60) == cli.EXIT_CLOSED_PIPE, stderr
    assert stderr == ""
