"""`make demo` end to end (own stack on free ports), and its HubSpot signature."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from devstack import stack
from devstack.fakecrm.webhooks import signed_headers
from shared.providers.hubspot import signature as signatures

REPO = Path(__file__).resolve().parent.parent


def test_the_demos_signed_headers_are_what_the_webhook_verifies() -> None:
    body = b'[{"eventId":1}]'
    uri = "http://127.0.0.1:18410/hubspot/5b0c"
    headers = signed_headers("s3cret", uri, body)
    verdict = signatures.verify_hubspot(
        secret="s3cret",
        method="POST",
        uri=uri,
        body=body,
        headers=headers,
        now=time.time(),
        versions=("v3",),
    )
    assert verdict.ok, verdict.check


@pytest.mark.e2e
@pytest.mark.slow
def test_demo_starts_tells_and_stops_leaving_nothing_behind() -> None:
    root = Path(tempfile.mkdtemp(prefix="onceflow-test-demo-"))
    root.chmod(0o755)
    env = {**os.environ, "NO_GCE_CHECK": "true", "ONCEFLOW_DEMO_WAIT_SECONDS": "8"}
    env.pop("DATABASE_URL", None)
    try:
        result = subprocess.run(
            [sys.executable, "-m", "devstack.demo", "--root", str(root / "local"), "--free-ports"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
        out = result.stdout
        assert result.returncode == 0, out + result.stderr
        assert "Traceback" not in out + result.stderr
        assert "DOWN" not in out
        assert "components answered their health checks" in out
        # The parts that are built are told as having happened.
        assert "answered 401" in out and "nothing was stored" in out
        assert "verified the X-HubSpot-Signature-v3 and answered 200" in out
        assert "stored once, by its body hash" in out
        # The whole story: a run, its effects, the echo, the redelivery and the duplicate.
        assert "started." in out and "task 'Call new lead" in out
        assert "echo_suppressed" in out
        assert "rule_not_matched, then duplicate" in out
        # Issue 13: one app on two portals through OAuth, the union of subscriptions, a
        # refreshed token and an adopted create.
        told = " ".join(out.split())  # the story is wrapped at 96 columns
        assert told.count("which exchanged the code and showed a confirmation code") == 2
        # Nothing is connected until the operator who started the install confirms it.
        assert told.count("the operator confirmed it on ops (200)") == 2
        # The redirect went to the public webhook function (ops is IAM-gated in the cloud).
        assert told.count("redirected to the webhook function's callback") == 2
        assert "contact.propertyChange:jobtitle, contact.propertyChange:lifecyclestage" in out
        assert "the port refreshed it" in out
        assert "with outcome ADOPTED_EXISTING" in out
        # Issue 26 item 6: one portal's events read from the webhooks journal, the other's not.
        assert re.search(
            r"the sweep's journal duty read \d+ entr(y|ies) from the journal \((\d+)\) into the "
            r"inbox, drained as processed; nothing from a journal for portal (?!\2)\d+",
            told,
        )
        assert "trigger event(s), each change once, whichever way it came." in told
        # Issue 28: one definition (new-company-any-crm) on both CRMs — a company added in each
        # fake's web app, one run on each, each run's reads served by its own CRM.
        assert "bound to hubspot.company.created, pipedrive.company.created" in told
        for crm in ("HubSpot", "Pipedrive"):
            assert re.search(rf"new-company-any-crm started run [0-9a-f-]{{36}} on {crm}\.", told)
            # The run's crm.get read the company from this CRM's fake (the name exists there
            # only) and its id is that CRM's.
            assert re.search(
                rf"read company (\d+) from {crm} .*? told sales: "
                rf'{{"company_id":"\1","name":"Northwind \d+ \({crm}\)","sharing_its_name":1}}',
                told,
            ), crm
        assert told.count("new-company-any-crm started run") == 2
        assert "the fake Pipedrive served 1 read(s) of organization" in told
        # The AI chapter: a reply classified by the fake Vertex AI, routed by the answer, and
        # charged at the tokens it used.
        classified = re.search(
            r"lead-reply-classify run [0-9a-f-]{36} succeeded: the model answered "
            r"\{\"intent\": \"interested\", .*call_task.*It used \d+ tokens and was charged "
            r"(\d+) credit\(s\)",
            " ".join(told.split()),
        )
        assert classified is not None, out
        assert 0 < int(classified.group(1)) < 5  # below the 256-token cap's price
        assert "did not happen" not in out, out
        assert "stopped what the demo started" in out
        assert stack.read_pids(root / "local") == []
        leftovers = subprocess.run(
            ["pgrep", "-f", str(root)], capture_output=True, text=True, check=False
        ).stdout.split()
        assert leftovers == []
    finally:
        shutil.rmtree(root, ignore_errors=True)
