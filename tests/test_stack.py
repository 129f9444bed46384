"""`make dev` / `make dev-down`, run as the Makefile runs them, and their failure messages."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from devstack import emulator, function_process, scheduler, stack
from shared.core.deployables import DEPLOYABLES, by_name

REPO = Path(__file__).resolve().parent.parent


def run_stack(
    *args: str, env: Mapping[str, str] | None = None, timeout: float = 150
) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "NO_GCE_CHECK": "true", **(env or {})}
    full_env.pop("DATABASE_URL", None)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "devstack.stack", *args],
        cwd=REPO,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture
def reachable_tmp() -> Iterator[Path]:
    """A folder the `postgres` user can enter (pytest's tmp_path is 0700 under root)."""
    path = Path(tempfile.mkdtemp(prefix="onceflow-test-stack-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_a_root_the_postgres_user_cannot_enter_gets_its_cluster_where_it_can(
    tmp_path: Path,
) -> None:
    """Issue 24: `make demo` in a clone under /root (0700) failed; the tests' clusters live in
    the temporary directory, and so does the stack's when its root can't be reached."""
    if os.geteuid() != 0:
        pytest.skip("only root runs the cluster as another user")
    tmp_path.chmod(0o700)
    root = tmp_path / "clone" / ".local"
    placed = stack.cluster_dir(root)
    assert not placed.is_relative_to(tmp_path)
    assert all(f.stat().st_mode & 0o001 for f in placed.parent.resolve().parents)
    assert placed.parent.stat().st_mode & 0o777 == 0o755
    assert stack.cluster_dir(root) == placed  # the same cluster for every `make dev`
    assert stack.cluster_dir(tmp_path / "other" / ".local") != placed
    reachable = Path(tempfile.mkdtemp(prefix="onceflow-test-stack-"))
    try:
        reachable.chmod(0o755)
        assert stack.cluster_dir(reachable / "local") == reachable / "local" / "pg"
    finally:
        shutil.rmtree(reachable, ignore_errors=True)
        shutil.rmtree(placed.parent, ignore_errors=True)


@pytest.mark.e2e
@pytest.mark.slow
def test_up_status_second_up_and_down_leave_nothing_behind(reachable_tmp: Path) -> None:
    root = reachable_tmp / "local"
    env = {"ONCEFLOW_SCHEDULER_SPEEDUP": "60", "DRAIN_BUDGET_SECONDS": "1"}
    up = run_stack("up", "--root", str(root), "--free-ports", env=env)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        info = json.loads((root / "stack.json").read_text())
        comps = info["components"]
        # Its own throwaway cluster, migrated, recorded with every other component.
        assert comps["postgres"]["managed"] is True
        assert info["database_url"] == comps["postgres"]["url"]
        assert comps["pubsub"]["emulator_host"] == info["pubsub_emulator_host"]
        for d in DEPLOYABLES:
            assert comps[d.name]["url"].startswith("http://127.0.0.1:"), d.name
        assert {j["function"] for j in comps["scheduler"]["jobs"]} == {
            j.function for j in scheduler.declared_jobs()
        }
        assert "healthy" in up.stdout and "DOWN" not in up.stdout
        # One click from the page: its URL and a local admin token that signs in.
        ops_url = comps["ops"]["url"]
        assert f"ops page: {ops_url}/ui" in up.stdout
        token = re.search(r"^ops token: (ofo_\S+)$", up.stdout, re.MULTILINE)
        assert token is not None
        assert (root / "ops-token").read_text().strip() == token[1]
        assert (root / "ops-token").stat().st_mode & 0o777 == 0o600
        signed_in = httpx.post(
            f"{ops_url}/ui/login", data={"token": token[1]}, timeout=10, follow_redirects=False
        )
        assert signed_in.status_code == 303 and signed_in.headers["location"] == "/ui"
        health = httpx.get(
            f"{ops_url}/v1/health", headers={"Authorization": f"Bearer {token[1]}"}, timeout=10
        )
        assert health.status_code == 200 and health.json()["machinery"] is not None  # admin

        status = run_stack("status", "--root", str(root))
        assert status.returncode == 0, status.stdout + status.stderr
        assert status.stdout.count("healthy") == len(comps)

        pids = stack.read_pids(root)
        # Both fake CRMs (HubSpot's and Pipedrive's) and the fake Vertex AI endpoint run beside
        # the functions, answering.
        assert {p.name for p in pids} >= {"postgres", "pubsub", "scheduler", "fakecrm"} | {
            "fakepipedrive",
            "fakevertex",
        } | {d.name for d in DEPLOYABLES}
        assert all(p.alive() for p in pids)
        # Each function serves as many requests at once, with the same pool, as deployed.
        for p in pids:
            if p.name in {d.name for d in DEPLOYABLES}:
                environ = dict(
                    item.split("=", 1)
                    for item in Path(f"/proc/{p.pid}/environ").read_text().split("\0")
                    if "=" in item
                )
                wanted = function_process.concurrency_env(by_name(p.name))
                assert {k: environ.get(k) for k in wanted} == wanted, p.name
                # Their ai.generate steps ask the fake, never Google.
                assert environ.get("ONCEFLOW_VERTEX_BASE_URL") == comps["fakevertex"]["url"]

        again = run_stack("up", "--root", str(root), "--free-ports", env=env)
        assert again.returncode == 3
        assert "already running" in again.stderr
        assert [p.pid for p in stack.read_pids(root)] == [p.pid for p in pids]  # no twins

        # The scheduler really calls the scheduled functions (60x: every second).
        deadline = time.monotonic() + 20
        log = root / "logs" / "scheduler.log"
        while time.monotonic() < deadline and '"calling"' not in log.read_text():
            time.sleep(0.2)
        assert '"calling"' in log.read_text()
    finally:
        down = run_stack("down", "--root", str(root))
    assert down.returncode == 0, down.stdout + down.stderr
    for p in pids:
        assert not p.alive(), f"{p.name} (pid {p.pid}) is still running"
        assert p.leftovers() == [], f"{p.name}'s process group still has {p.leftovers()}"
    assert stack.read_pids(root) == []
    assert "stopped" in down.stdout


def test_missing_postgres_binaries_is_one_line(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    result = run_stack("up", "--root", str(tmp_path / "local"), env={"PG_BINDIR": str(empty)})
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "PostgreSQL server binaries" in lines[0]
    assert "apt-get install postgresql" in lines[0]
    assert not (tmp_path / "local" / "pids").exists()


def test_missing_java_is_one_line(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    result = run_stack("up", "--root", str(tmp_path / "local"), env={"PATH": str(empty)})
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "Java not found" in lines[0] and "apt-get install" in lines[0]


def test_taken_port_names_the_port_and_its_holder(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        # The port base is the emulator's port: make it the one we hold.
        result = run_stack(
            "up", "--root", str(tmp_path / "local"), env={"ONCEFLOW_PORT_BASE": str(port)}
        )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert f"port {port} (for pubsub) is already taken by" in result.stderr
    assert f"pid={os.getpid()}" in result.stderr
    assert not (tmp_path / "local" / "pids").exists()


def test_status_and_down_on_a_stopped_stack(tmp_path: Path) -> None:
    status = run_stack("status", "--root", str(tmp_path))
    assert status.returncode == 1
    assert "not running" in status.stdout
    down = run_stack("down", "--root", str(tmp_path))
    assert down.returncode == 0
    assert "nothing is running" in down.stdout


# --- what infra/ declares ----------------------------------------------------------------------


def test_layout_is_read_from_infra() -> None:
    layout = emulator.declared_layout()
    assert set(layout.topics) >= {
        "trigger-events",
        "step-ready",
        "trigger-events-dead-letter",
        "step-ready-dead-letter",
    }
    push = {s.name: s for s in layout.subscriptions if s.function is not None}
    assert push["admit-event-push"].topic == "trigger-events"
    assert push["admit-event-push"].function == "admit_event"
    assert push["admit-event-push"].dead_letter_topic == "trigger-events-dead-letter"
    assert push["advance-step-push"].topic == "step-ready"
    assert push["advance-step-push"].function == "advance_step"
    assert push["advance-step-push"].dead_letter_topic == "step-ready-dead-letter"
    for sub in push.values():
        assert sub.max_delivery_attempts and sub.minimum_backoff


def test_every_scheduled_function_has_a_job() -> None:
    jobs = scheduler.declared_jobs()
    assert {j.function for j in jobs} == {d.name for d in DEPLOYABLES if d.trigger == "schedule"}
    assert all(j.method == "POST" for j in jobs)


def test_signature_types_follow_the_entry_points() -> None:
    for d in DEPLOYABLES:
        expected = "cloudevent" if d.trigger == "pubsub" else "http"
        assert function_process.signature_type(d) == expected, d.name


# --- the scheduler's cron ----------------------------------------------------------------------


def _at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def test_cron_every_minute_and_every_n_minutes() -> None:
    every = scheduler.Cron.parse("* * * * *")
    assert every.next_after(_at("2026-01-01T10:00:30")) == _at("2026-01-01T10:01:00")
    five = scheduler.Cron.parse("*/5 * * * *")
    assert five.next_after(_at("2026-01-01T10:00:00")) == _at("2026-01-01T10:05:00")
    assert five.next_after(_at("2026-01-01T10:57:10")) == _at("2026-01-01T11:00:00")


def test_cron_lists_ranges_and_days() -> None:
    cron = scheduler.Cron.parse("0,30 9-17 * * 1-5")
    # 2026-01-03 is a Saturday: the next match is Monday 09:00.
    assert cron.next_after(_at("2026-01-02T17:30:00")) == _at("2026-01-05T09:00:00")
    assert cron.next_after(_at("2026-01-05T09:10:00")) == _at("2026-01-05T09:30:00")


@pytest.mark.parametrize("bad", ["* * * *", "*/0 * * * *", "61 * * * *", "x * * * *"])
def test_cron_refuses_what_it_cannot_read(bad: str) -> None:
    with pytest.raises(scheduler.CronError):
        scheduler.Cron.parse(bad)


def test_speedup_knob() -> None:
    assert scheduler.speedup_from_env({}) == 1
    assert scheduler.speedup_from_env({scheduler.SPEEDUP_ENV: "12"}) == 12
    assert scheduler.speedup_from_env({scheduler.SPEEDUP_ENV: "0"}) == 0
    with pytest.raises(scheduler.CronError):
        scheduler.speedup_from_env({scheduler.SPEEDUP_ENV: "fast"})


def test_sped_up_clock_fires_each_job_once_per_virtual_minute() -> None:
    jobs = (
        scheduler.Job("a", "drain_inbox", scheduler.Cron.parse("* * * * *")),
        scheduler.Job("b", "sweep", scheduler.Cron.parse("*/2 * * * *")),
    )
    fired: list[str] = []
    sched = scheduler.LocalScheduler(jobs, {}, speedup=600)  # a virtual minute = 0.1 s
    sched.fire = lambda job: fired.append(job.function)  # type: ignore[method-assign]
    start = time.monotonic()
    import threading

    threading.Timer(1.25, sched.stopping.set).start()
    sched.run()
    elapsed_minutes = (time.monotonic() - start) * 600 / 60
    assert abs(fired.count("drain_inbox") - elapsed_minutes) <= 2
    assert abs(fired.count("sweep") - elapsed_minutes / 2) <= 2


def test_unreachable_database_url_is_one_line_and_starts_nothing(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = run_stack(
        "up",
        "--root",
        str(tmp_path / "local"),
        "--free-ports",
        env={"DATABASE_URL": f"postgresql://postgres@127.0.0.1:{port}/nowhere"},
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert result.stderr.strip() == result.stderr.strip().splitlines()[0]
    assert f"cannot connect to PostgreSQL at 127.0.0.1:{port}/nowhere" in result.stderr
    assert stack.read_pids(tmp_path / "local") == []


def _make_python(path_dir: Path) -> subprocess.CompletedProcess[str]:
    """The Python `make venv` would create .venv with, with PATH holding only `path_dir`."""
    return subprocess.run(
        ["make", "-s", "--no-print-directory", "--eval", "which-python: ; @echo '[$(PYTHON)]'",
         "which-python"],
        cwd=REPO,
        env={"PATH": f"{path_dir}:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root")},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )  # fmt: skip


def _fake_python(folder: Path, name: str, version: tuple[int, int] | None) -> None:
    """`name` on PATH: a Python of `version`, or (None) a pyenv-style shim that can't start."""
    script = folder / name
    if version is None:
        script.write_text("#!/bin/sh\necho 'pyenv: python not installed' >&2\nexit 127\n")
    else:
        script.write_text(
            "#!/bin/sh\n"
            f"exec {sys.executable} -c 'import sys; sys.exit({list(version)} < [3, 11])'\n"
        )
    script.chmod(0o755)


def test_make_venv_takes_python_3_11_or_newer_and_installs_the_command(tmp_path: Path) -> None:
    """Issue 24: `make` accepted only `python3.11`, and `.venv/bin/onceflow` was never
    installed although the README said it was."""
    only_newer = tmp_path / "newer"
    only_newer.mkdir()
    _fake_python(only_newer, "python3.11", None)  # a shim for a version that isn't there
    _fake_python(only_newer, "python3.13", (3, 13))
    assert _make_python(only_newer).stdout.strip() == "[python3.13]"
    too_old = tmp_path / "old"
    too_old.mkdir()
    _fake_python(too_old, "python3", (3, 10))
    if subprocess.run(["sh", "-c", "command -v python3.11"], env={"PATH": "/usr/bin:/bin"},
                      capture_output=True, check=False).returncode != 0:  # fmt: skip
        assert _make_python(too_old).stdout.strip() == "[]"
    pyproject = (REPO / "pyproject.toml").read_text()
    assert 'requires-python = ">=3.11"' in pyproject

    # The recipe gives the venv its `onceflow` command, without making the checkout
    # importable in it (tests/test_archive.py needs a venv that can't import `shared`).
    recipe = subprocess.run(
        ["make", "-n", "-B", "venv", "PY=/nonexistent/python"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    ).stdout
    assert "devstack.install_command .venv" in recipe
    assert " -e ." not in recipe
    from devstack.install_command import install

    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    install(venv, python=Path(sys.executable))  # this venv's interpreter, with the dependencies
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    helped = subprocess.run(
        [str(venv / "bin" / "onceflow"), "--help"],
        cwd=elsewhere, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert helped.returncode == 0 and "usage: onceflow" in helped.stdout, helped.stderr
    plain = subprocess.run(
        [sys.executable, "-c", "import shared"],
        cwd=elsewhere, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert plain.returncode != 0
