"""The deploy archive serves every entry point, unpacked, in a clean environment.

The archive is built exactly as infra/ selects it (devstack/bundle.py reads the same
`bundle_patterns`), unzipped into a temporary directory, and each entry point is served from
there by a real `functions-framework` process with no PYTHONPATH, the temporary directory as
its working directory, and nothing from the repository on sys.path. That is how the Cloud Run
buildpack runs it: only the source file's folder is importable. A function that needs a file
outside the selection, or imports `devstack`/`tests`, fails here before it fails in the cloud.
"""

from __future__ import annotations

import base64
import json
import re
import socket
import subprocess
import sys
import time
import uuid
import zipfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from devstack.bundle import build_archive
from devstack.function_process import command, signature_type
from devstack.tools import free_port
from shared.core.deployables import DEPLOYABLES, Deployable

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
NOT_DEPLOYED = ("tests/", "devstack/", "infra/", "migrations/", ".venv/", ".local/")
START_TIMEOUT_S = 60.0
REQUEST_TIMEOUT_S = 30.0
IMPORT_FAILURES = ("ModuleNotFoundError", "ImportError", "MissingSourceException")

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@dataclass
class Served:
    deployable: Deployable
    signature: str
    port: int
    process: subprocess.Popen[bytes]
    log: Path

    def stderr(self) -> str:
        return self.log.read_text("utf-8", errors="replace")


def clean_env(database_url: str, home: Path) -> dict[str, str]:
    return {
        "PATH": f"{VENV_BIN}:/usr/bin:/bin",
        "HOME": str(home),
        "NO_GCE_CHECK": "true",
        "DATABASE_URL": database_url,
        # Not import help: the scheduled functions poll until their budget (50 s by default,
        # for a 60 s timeout) is spent; one second is enough to prove they run.
        "DRAIN_BUDGET_SECONDS": "1",
        "PUBLISH_BUDGET_SECONDS": "1",
        "SWEEP_BUDGET_SECONDS": "1",
        "WEBHOOK_NUDGE": "off",
    }


def push_body(payload: dict[str, object]) -> dict[str, object]:
    """What a Pub/Sub push subscription POSTs (no ce-* headers)."""
    return {
        "message": {
            "data": base64.b64encode(json.dumps(payload).encode()).decode(),
            "messageId": "1",
            "attributes": {},
        },
        "subscription": "projects/p/subscriptions/s",
    }


def request_for(served: Served) -> httpx.Request:
    url = f"http://127.0.0.1:{served.port}"
    d = served.deployable
    if d.trigger == "pubsub":
        payload: dict[str, object] = (
            {"event_id": 1} if d.topic == "trigger-events" else {"step_id": str(uuid.uuid4())}
        )
        return httpx.Request("POST", f"{url}/", json=push_body(payload))
    if d.trigger == "schedule":
        return httpx.Request("POST", f"{url}/", json={})  # the Cloud Scheduler job's body
    if d.name == "webhook":
        return httpx.Request("POST", f"{url}/hubspot/archive-test", content=b"[]")
    return httpx.Request("GET", f"{url}/")


@pytest.fixture(scope="module")
def unpacked(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    base = tmp_path_factory.mktemp("archive")
    archive = build_archive(base / "onceflow.zip")
    with zipfile.ZipFile(archive) as zf:
        names = zf.namelist()
        zf.extractall(base / "src")
    return base / "src", names


def test_archive_holds_the_runtime_and_nothing_else(unpacked: tuple[Path, list[str]]) -> None:
    _, names = unpacked
    assert "main.py" in names and "requirements.txt" in names
    for d in DEPLOYABLES:
        assert f"functions/{d.name}.py" in names
    assert any(n.startswith("shared/sql/") for n in names), "named SQL ships with the code"
    leaked = sorted(n for n in names if n.startswith(NOT_DEPLOYED))
    assert not leaked, f"not part of the deployable: {leaked}"
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]


def test_the_repository_is_not_importable_outside_it(tmp_path: Path) -> None:
    """Guards the next test: if .venv could import `shared` from the checkout (an editable
    install, a .pth file), serving the archive would prove nothing."""
    out = subprocess.run(
        [str(VENV_BIN / "python"), "-c", "import shared"],
        cwd=tmp_path,
        env={"PATH": f"{VENV_BIN}:/usr/bin:/bin", "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode != 0 and "No module named 'shared'" in out.stderr


def _wait_serving(served: Served, deadline: float) -> None:
    while time.monotonic() < deadline:
        if served.process.poll() is not None:
            pytest.fail(
                f"{served.deployable.name} exited ({served.process.returncode}) before serving:\n"
                f"{served.stderr()[-3000:]}"
            )
        with socket.socket() as s:
            s.settimeout(0.2)
            if s.connect_ex(("127.0.0.1", served.port)) == 0:
                return
        time.sleep(0.1)
    pytest.fail(f"{served.deployable.name} did not listen within {START_TIMEOUT_S} s")


def _stop(processes: list[subprocess.Popen[bytes]]) -> None:
    for p in processes:
        if p.poll() is None:
            p.terminate()
    for p in processes:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)


@pytest.fixture
def served(
    unpacked: tuple[Path, list[str]], database_url: str, tmp_path: Path
) -> Iterator[list[Served]]:
    src, _ = unpacked
    env = clean_env(database_url, tmp_path)
    started: list[Served] = []
    try:
        # All seven start at once: each import takes a second or two, so in parallel.
        for d in DEPLOYABLES:
            port = free_port()
            log = tmp_path / f"{d.name}.log"
            signature = signature_type(d)
            with log.open("wb") as sink:
                process = subprocess.Popen(
                    command(d.name, port, source=src / "main.py", signature=signature),
                    cwd=src,
                    env=env,
                    stdout=sink,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            started.append(Served(d, signature, port, process, log))
        deadline = time.monotonic() + START_TIMEOUT_S
        for s in started:
            _wait_serving(s, deadline)
        yield started
    finally:
        _stop([s.process for s in started])


def test_every_entry_point_is_served_from_the_unpacked_archive(served: list[Served]) -> None:
    def call(s: Served) -> httpx.Response:
        with httpx.Client(timeout=REQUEST_TIMEOUT_S) as client:
            return client.send(request_for(s))

    with ThreadPoolExecutor(max_workers=len(served)) as pool:
        responses = list(pool.map(call, served))

    for s, response in zip(served, responses, strict=True):
        name, log = s.deployable.name, s.stderr()
        assert not [w for w in IMPORT_FAILURES if w in log], f"{name} failed to import:\n{log}"
        if response.status_code >= 500 and response.headers.get("X-Google-Status") == "crash":
            # A crash is acceptable only from inside the target (placeholders raise
            # NotImplementedError until their issue lands): the traceback must run through
            # the target's module in the unpacked archive.
            assert re.search(rf"functions/{name}\.py", log), (
                f"{name} crashed outside its entry point:\n{log[-3000:]}"
            )
        if s.signature == "cloudevent":
            # 400 would mean functions-framework could not turn the push body into an event.
            assert response.status_code != 400, f"{name}: push body refused: {response.text}"
        assert response.status_code != 404 or name in ("webhook", "ops"), (
            f"{name}: {response.status_code} {response.text[:300]}"
        )
