"""The README's "Your first workflow", its exact commands parsed from README.md and run by
bash against the local stack (`make dev` is the session's `stack`, started by the same
`python -m devstack.stack up`): publish an example, make the fake CRM fire it, the run and
its page, replay it (issue 24: the first command answered "tenant 'acme' does not exist")."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from devstack import seed
from devstack.stack import REPO, RunningStack

pytestmark = [pytest.mark.e2e]
SECTION = "### Your first workflow"


def readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text[text.index(SECTION) :]
    block = re.search(r"```sh\n(.*?)```", section, re.DOTALL)
    assert block is not None, "the section has no sh block"
    return [line for line in block[1].splitlines() if line.strip()]


def _onceflow_command(tmp: Path) -> str:
    """`.venv/bin/onceflow` as `make venv` installs it; where this checkout's venv is shared
    and was made before the Makefile installed it, the same entry point through a shim."""
    installed = REPO / ".venv" / "bin" / "onceflow"
    if installed.exists():
        return str(installed)
    shim = tmp / "onceflow"
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} -m shared.ops.cli "$@"\n')
    shim.chmod(0o755)
    return str(shim)


def test_the_readmes_first_workflow_works_as_written(stack: RunningStack, tmp_path: Path) -> None:
    commands = readme_commands()
    assert commands[0] == "make dev"  # the `stack` fixture: `python -m devstack.stack up`
    assert any(c.startswith(".venv/bin/onceflow publish examples/") for c in commands)
    # Other tests of the session re-point the fake CRM; `make dev` leaves it as first_path
    # does, with the token it minted.
    token = (stack.root / "ops-token").read_text().strip()
    seed.first_path(
        stack.root,
        ops_url=stack.url("ops"),
        admin_token=token,
        fakecrm_url=stack.url("fakecrm"),
        webhook_url=stack.url("webhook"),
    )
    onceflow = _onceflow_command(tmp_path)
    script = ["set -euo pipefail", f"cd {REPO}"]
    for written in commands[1:]:
        if written.lstrip().startswith("#"):
            continue
        line = written.replace(". .local/", f". {stack.root}/")
        line = line.replace(".venv/bin/onceflow", onceflow)
        if line.startswith("RUN=$("):
            # Where a person would look again: the run appears seconds after the webhook.
            line = (
                f'for _ in $(seq 60); do {line}; [ -n "$RUN" ] && break; sleep 1; done; '
                '[ -n "$RUN" ]'
            )
        script += [f"echo {shlex.quote('$ ' + written[:60])}", line]
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONCEFLOW_")}
    env.pop("DATABASE_URL", None)
    try:
        done = subprocess.run(
            ["bash", "-c", "\n".join(script)],
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        logs = {n: stack.log(n)[-3000:] for n in ("webhook", "admit_event", "advance_step")}
        pytest.fail(f"the commands did not end: {exc.stdout!r}\n{exc.stderr!r}\n{logs}")
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "does not exist" not in out + done.stderr
    assert "published as version" in out or "already published" in out
    assert "create_task" in out and "crm.create" in out and "failed" in out
    assert "1 of 1 replayed" in out

    # The page the printed URL names shows the run, once signed in with the token.
    page_url = next(line for line in out.splitlines() if line.startswith("http"))
    with httpx.Client(base_url=stack.url("ops"), timeout=10) as browser:
        signed = browser.post("/ui/login", data={"token": token})
        assert signed.status_code == 303
        page = browser.get(page_url)
        assert page.status_code == 200 and "create_task" in page.text

    # The replay created the task the first run could not.
    deadline = time.monotonic() + 90
    tasks: list[object] = []
    while time.monotonic() < deadline:
        state = httpx.get(f"{stack.url('fakecrm')}/_admin/state", timeout=10).json()
        tasks = [
            r
            for r in state.get("records", {}).get("tasks", [])
            if "Ada" in str(r.get("properties", {}).get("hs_task_subject", ""))
        ]
        if tasks:
            break
        time.sleep(1)
    assert len(tasks) == 1, state
