"""The local stack: `python -m devstack.stack up|down|status|migrate` (`make dev`, `make dev-down`).

`up` starts, on 127.0.0.1 only, everything the cloud deployment has, as real processes:

- PostgreSQL: a throwaway cluster under `<root>/pg` (kept between runs; `rm -rf .local` resets
  it), or the server in `DATABASE_URL` when that is set; migrations applied either way;
- the Pub/Sub emulator, with the topics and push subscriptions `infra/pubsub.tf` declares;
- one functions-framework process per function in `shared/core/deployables.py`, started through
  `devstack.function_server` (functions-framework's own server plus the head deadline that
  Cloud Run's front end provides in the cloud);
- the fake CRM (`devstack.fakecrm`, HubSpot), the fake Pipedrive (`devstack.fakepipedrive`)
  and the fake Vertex AI endpoint (`devstack.fakevertex`, where the functions' `ai.generate`
  steps are sent: ONCEFLOW_VERTEX_BASE_URL), when those modules are present;
- the local scheduler (`devstack.scheduler`), calling the scheduled functions at the cadence
  `infra/scheduler.tf` declares.

It records what it started in `<root>/stack.json` (component → URL/host/port, the database
URL, the environment the functions run with), one pid file per process under `<root>/pids/`
and logs under `<root>/logs/`. Every process runs in its own process group, so `down` stops
exactly those groups, by pid, and waits until nothing of them is left. A pid file also holds
the process start time, so a pid the kernel reused for something else is never signalled.

A second `up` on a running stack says so and starts nothing. A missing tool or a taken port is
one line saying what to do, never a stack trace.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx
import pg8000.dbapi

from devstack import emulator, function_process, postgres, scheduler
from devstack.tools import MissingTool, free_port, pg_bindir, port_holder, pubsub_emulator
from shared.core.deployables import DEPLOYABLES, by_name
from shared.ops import approval_links
from shared.providers.install import CALLBACK_PATH, REDIRECT_URL_ENV

REPO = Path(__file__).resolve().parent.parent
DEFAULT_ROOT = REPO / ".local"
PROJECT = "onceflow-local"
PORT_BASE_ENV = "ONCEFLOW_PORT_BASE"
DEFAULT_PORT_BASE = 18400
DATABASE_NAME = "onceflow"

# Secrets of the demo tenant's HubSpot connection. The connection row names these variables;
# every function process and the fake CRM get them. Local, throwaway values; set the variables
# to override them.
DEMO_SECRETS = {
    "ONCEFLOW_DEMO_HUBSPOT_APP_SECRET": "local-demo-hubspot-app-secret",
    "ONCEFLOW_DEMO_HUBSPOT_TOKEN": "local-demo-hubspot-token",
    # The demo's public app (issue 13): its OAuth client id (the fake's default; its client
    # secret is the app secret above, as at HubSpot), its developer key, and the key OAuth
    # grants are sealed with (32 bytes, base64).
    "ONCEFLOW_DEMO_HUBSPOT_CLIENT_ID": "fake-client-id",
    "ONCEFLOW_DEMO_HUBSPOT_DEVELOPER_KEY": "local-demo-developer-key",
    "ONCEFLOW_TOKEN_KEK": "bG9jYWwtZGVtby1rZXktZW5jcnlwdGlvbi1rZXktMzI=",
    # The demo tenant's Pipedrive connection (issue 28): the fake Pipedrive's API token, and
    # the `user:password` its webhooks carry as HTTP Basic (the only credential Pipedrive puts
    # on a delivery).
    "ONCEFLOW_DEMO_PIPEDRIVE_TOKEN": "local-demo-pipedrive-token",
    "ONCEFLOW_DEMO_PIPEDRIVE_CREDENTIALS": "onceflow:local-demo-pipedrive-password",
    # The key the demo's email tool signs its reply webhooks with (Standard Webhooks: `whsec_`
    # + base64 of the key; here base64 of "local-demo-email-tool-key").
    "ONCEFLOW_DEMO_EMAIL_TOOL_SECRET": "whsec_bG9jYWwtZGVtby1lbWFpbC10b29sLWtleQ==",
}
# The Pipedrive user the fake's API token acts as: not the web app's user (the fake's
# `ui_user_id`), so a company a person adds is never taken for onceflow's own write.
FAKEPIPEDRIVE_API_USER = 7001
# What every function process gets besides the connection settings: loopback HTTP is allowed
# because the fake CRM and the demo's receivers live on 127.0.0.1.
FUNCTION_ENV = {
    "NO_GCE_CHECK": "true",
    "ONCEFLOW_HTTP_ALLOW_LOOPBACK": "1",
    "PYTHONUNBUFFERED": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
}
# Where the functions' ai.generate steps send Vertex AI calls (shared/core/settings.py).
VERTEX_BASE_URL_ENV = "ONCEFLOW_VERTEX_BASE_URL"
# Settings of the caller's shell that must not leak into the local functions.
_SCRUBBED = ("INSTANCE_CONNECTION_NAME", "DATABASE_URL", "PUBSUB_EMULATOR_HOST", "PGHOST")

STOP_GRACE_SECONDS = 4.0
PG_STOP_GRACE_SECONDS = 20.0
READY_TIMEOUT_SECONDS = 90.0


class StackError(RuntimeError):
    """Something the user must act on; the message is one line saying what."""


class AlreadyRunning(StackError):
    pass


# --- pid files ------------------------------------------------------------------------------


def _start_ticks(pid: int) -> str | None:
    """The process start time in clock ticks (/proc/<pid>/stat field 22), None if gone/zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X"):
        return None
    return fields[19]


def _pgid_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in process group `pgid`."""
    members: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] not in ("Z", "X") and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


@dataclass(frozen=True)
class PidFile:
    name: str
    path: Path
    pid: int
    ticks: str
    # True: the pid leads its own process group and the whole group belongs to the stack.
    group: bool

    def alive(self) -> bool:
        return _start_ticks(self.pid) == self.ticks

    def cpu_seconds(self) -> float:
        """CPU time (user + system) used so far by this component's live processes and their
        children (PostgreSQL's backends leave the postmaster's group: each calls setsid)."""
        members = set(self.leftovers())
        stats: dict[int, list[str]] = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    stats[int(entry.name)] = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        members |= {pid for pid, fields in stats.items() if int(fields[1]) in members}
        # utime and stime are stat fields 14 and 15 (11 and 12 after the command name).
        ticks = sum(int(stats[pid][11]) + int(stats[pid][12]) for pid in members if pid in stats)
        return ticks / os.sysconf("SC_CLK_TCK")

    def leftovers(self) -> list[int]:
        """Processes of this component still running (the group's, when it owns one)."""
        if self.group:
            return _pgid_members(self.pid)
        return [self.pid] if self.alive() else []


def _pid_dir(root: Path) -> Path:
    return root / "pids"


def write_pid(root: Path, name: str, pid: int, *, group: bool = True) -> PidFile:
    ticks = _start_ticks(pid) or "0"
    path = _pid_dir(root) / f"{name}.pid"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{pid}\n{ticks}\n{'group' if group else 'single'}\n")
    return PidFile(name, path, pid, ticks, group)


def read_pids(root: Path) -> list[PidFile]:
    found: list[PidFile] = []
    directory = _pid_dir(root)
    if not directory.is_dir():
        return found
    for path in sorted(directory.glob("*.pid")):
        try:
            pid_text, ticks, kind = [*path.read_text().split(), "", "", ""][:3]
            found.append(PidFile(path.stem, path, int(pid_text), ticks, kind == "group"))
        except ValueError:
            path.unlink(missing_ok=True)
    return found


# --- the plan -------------------------------------------------------------------------------


def fakecrm_available() -> bool:
    return (REPO / "devstack" / "fakecrm" / "__main__.py").exists()


def fakepipedrive_available() -> bool:
    return (REPO / "devstack" / "fakepipedrive" / "__main__.py").exists()


def fakevertex_available() -> bool:
    return (REPO / "devstack" / "fakevertex" / "__main__.py").exists()


def plan_ports(*, free: bool, with_postgres: bool, with_fakecrm: bool) -> dict[str, int]:
    names = ["pubsub"]
    if with_postgres:
        names.append("postgres")
    if with_fakecrm:
        names.append("fakecrm")
        if fakepipedrive_available():
            names.append("fakepipedrive")
        if fakevertex_available():
            names.append("fakevertex")
    names += [d.name for d in DEPLOYABLES]
    if free:
        return {n: free_port() for n in names}
    raw = os.environ.get(PORT_BASE_ENV, str(DEFAULT_PORT_BASE))
    try:
        base = int(raw)
    except ValueError:
        raise StackError(f"{PORT_BASE_ENV}={raw!r} is not a port number") from None
    fixed = {
        "pubsub": base,
        "postgres": base + 1,
        "fakecrm": base + 2,
        "fakepipedrive": base + 3,
        "fakevertex": base + 4,
    }
    ports = {n: fixed[n] for n in names if n in fixed}
    for i, d in enumerate(DEPLOYABLES):
        ports[d.name] = base + 10 + i
    for name, port in ports.items():
        holder = port_holder(port)
        if holder is not None:
            raise StackError(
                f"port {port} (for {name}) is already taken by {holder}: stop that process "
                f"or choose other ports with {PORT_BASE_ENV}=<base> "
                f"(the stack uses base..base+{10 + len(DEPLOYABLES) - 1})"
            )
    return ports


def preflight(*, own_postgres: bool) -> list[str]:
    """Every external tool is there, or MissingTool names the first one missing."""
    if own_postgres:
        bindir = pg_bindir()
        for tool in ("initdb", "pg_ctl", "postgres"):
            if not (bindir / tool).exists():
                raise MissingTool(
                    f"PostgreSQL server binaries ({tool}) not found in {bindir}: "
                    "install them with `apt-get install postgresql` or set PG_BINDIR"
                )
    function_process.functions_framework_bin()
    return pubsub_emulator()


# --- up -------------------------------------------------------------------------------------


def stack_file(root: Path) -> Path:
    return root / "stack.json"


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _log_file(root: Path, name: str) -> Any:
    path = root / "logs" / f"{name}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = path.open("ab")
    handle.write(f"--- {_now()} started by devstack.stack\n".encode())
    handle.flush()
    return handle


def _spawn(
    root: Path, name: str, args: list[str], env: Mapping[str, str]
) -> subprocess.Popen[bytes]:
    with _log_file(root, name) as log:
        proc = subprocess.Popen(
            args,
            cwd=REPO,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(env),
            start_new_session=True,
        )
    write_pid(root, name, proc.pid)
    # The process outlives this handle on purpose (its own session, found again through its
    # pid file); keeping the handle stops Popen's destructor from warning that it still runs
    # when a caller such as `restart_function` drops it.
    _detached.append(proc)
    return proc


_detached: list[subprocess.Popen[bytes]] = []


def function_env(
    database_url: str, emulator_host: str, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment every function process runs with (besides the caller's PATH etc.)."""
    env = {k: os.environ.get(k, v) for k, v in DEMO_SECRETS.items()}
    env.update(FUNCTION_ENV)
    env.update(
        DATABASE_URL=database_url,
        PUBSUB_EMULATOR_HOST=emulator_host,
        GOOGLE_CLOUD_PROJECT=PROJECT,
    )
    env.update(extra or {})
    return env


def _base_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in _SCRUBBED}


def up(
    root: Path = DEFAULT_ROOT,
    *,
    database_url: str | None = None,
    free_ports: bool = False,
    extra_env: Mapping[str, str] | None = None,
    with_scheduler: bool = True,
    with_fakecrm: bool = True,
    echo: bool = False,
) -> dict[str, Any]:
    """Start the whole stack under `root`; the stack.json content. See the module docstring."""
    root = root.resolve()
    running = [p for p in read_pids(root) if p.alive()]
    if running:
        raise AlreadyRunning(
            f"the local stack in {root} is already running ({len(running)} processes, "
            "`python -m devstack.stack status` shows them): `make dev-down` stops it"
        )
    for stale in read_pids(root):  # left by a stack that died with the machine
        stale.path.unlink(missing_ok=True)
    own_postgres = database_url is None
    emulator_cmd = preflight(own_postgres=own_postgres)
    layout = emulator.declared_layout()
    jobs = scheduler.declared_jobs() if with_scheduler else ()
    with_fakecrm = with_fakecrm and fakecrm_available()
    ports = plan_ports(free=free_ports, with_postgres=own_postgres, with_fakecrm=with_fakecrm)
    root.mkdir(parents=True, exist_ok=True)
    pg_dir = cluster_dir(root)
    if not own_postgres:
        assert database_url is not None
        # A server we don't start: find out it is unreachable before starting anything.
        applied_early = apply_migrations(database_url)

    def say(text: str) -> None:
        if echo:
            print(text, flush=True)

    started = time.monotonic()
    try:
        # Slow starters first (Java, seven Python interpreters); Postgres and the migrations
        # run while they boot. Functions don't connect before their first request.
        emulator_host = f"127.0.0.1:{ports['pubsub']}"
        emulator_url = f"http://{emulator_host}"
        with _log_file(root, "pubsub") as log:
            cloudsdk = root / "gcloud"
            cloudsdk.mkdir(exist_ok=True)
            emu_env = {
                **_base_env(),
                "CLOUDSDK_CONFIG": str(cloudsdk),
                "CLOUDSDK_CORE_CHECK_GCE_METADATA": "false",
                "CLOUDSDK_CORE_PROJECT": PROJECT,
            }
            emu = emulator.start(emulator_cmd, ports["pubsub"], log, emu_env)
        write_pid(root, "pubsub", emu.pid)

        if own_postgres:
            database_url = postgres.Cluster(pg_dir, ports["postgres"]).url(DATABASE_NAME)
        assert database_url is not None
        # Installs send HubSpot's redirect, and approval links send approvers, to the local
        # webhook process, where those pages live (as in the cloud: ops is not public there).
        # The caller's --env may override them.
        extra_env = {
            REDIRECT_URL_ENV: f"http://127.0.0.1:{ports['webhook']}{CALLBACK_PATH}",
            approval_links.PUBLIC_URL_ENV: f"http://127.0.0.1:{ports['webhook']}",
            # ai.generate steps ask the fake Vertex AI endpoint, never Google.
            **(
                {VERTEX_BASE_URL_ENV: f"http://127.0.0.1:{ports['fakevertex']}"}
                if "fakevertex" in ports
                else {}
            ),
            **(extra_env or {}),
        }
        fn_env = {**_base_env(), **function_env(database_url, emulator_host, extra_env)}
        components: dict[str, dict[str, Any]] = {}
        for d in DEPLOYABLES:
            port = ports[d.name]
            sig = function_process.signature_type(d)
            _spawn(
                root,
                d.name,
                function_process.command(d.name, port, signature=sig, front=True),
                # Requests at once and pool as deployed, unless the caller's --env says else.
                {**fn_env, **function_process.concurrency_env(d), **(extra_env or {})},
            )
            components[d.name] = {
                "kind": "function",
                "trigger": d.trigger,
                "signature_type": sig,
                "host": "127.0.0.1",
                "port": port,
                "url": f"http://127.0.0.1:{port}",
                "log": str(root / "logs" / f"{d.name}.log"),
            }
        webhook_url = components["webhook"]["url"]
        if with_fakecrm:
            port = ports["fakecrm"]
            _spawn(
                root,
                "fakecrm",
                [
                    sys.executable,
                    "-m",
                    "devstack.fakecrm",
                    "--port",
                    str(port),
                    "--webhook-url",
                    webhook_url,
                    "--app-secret-env",
                    "ONCEFLOW_DEMO_HUBSPOT_APP_SECRET",
                    "--token-env",
                    "ONCEFLOW_DEMO_HUBSPOT_TOKEN",
                ],
                fn_env,
            )
            components["fakecrm"] = {
                "kind": "fakecrm",
                "host": "127.0.0.1",
                "port": port,
                "url": f"http://127.0.0.1:{port}",
                "health": "/_admin/health",
                "log": str(root / "logs" / "fakecrm.log"),
            }
        if "fakepipedrive" in ports:
            port = ports["fakepipedrive"]
            _spawn(
                root,
                "fakepipedrive",
                [
                    sys.executable,
                    "-m",
                    "devstack.fakepipedrive",
                    "--port",
                    str(port),
                    "--api-token-env",
                    "ONCEFLOW_DEMO_PIPEDRIVE_TOKEN",
                    "--user-id",
                    str(FAKEPIPEDRIVE_API_USER),
                ],
                fn_env,
            )
            components["fakepipedrive"] = {
                "kind": "fakecrm",  # checked the same way: its admin route answers 200
                "host": "127.0.0.1",
                "port": port,
                "url": f"http://127.0.0.1:{port}",
                "health": "/_admin/state",
                "log": str(root / "logs" / "fakepipedrive.log"),
            }

        if "fakevertex" in ports:
            port = ports["fakevertex"]
            command = [sys.executable, "-m", "devstack.fakevertex", str(port)]
            _spawn(root, "fakevertex", command, fn_env)
            components["fakevertex"] = {
                "kind": "fakecrm",  # checked the same way: its admin route answers 200
                "host": "127.0.0.1",
                "port": port,
                "url": f"http://127.0.0.1:{port}",
                "health": "/_admin/health",
                "log": str(root / "logs" / "fakevertex.log"),
            }

        if own_postgres:
            say(f"starting PostgreSQL under {pg_dir} …")
            cluster = postgres.start(pg_dir, ports["postgres"])
            postmaster = _postmaster_pid(cluster)
            # pg_ctl starts the postmaster in its own session: its group holds every backend.
            write_pid(root, "postgres", postmaster, group=os.getpgid(postmaster) == postmaster)
            postgres.create_database(cluster.port, DATABASE_NAME)
        applied = apply_migrations(database_url) if own_postgres else applied_early
        pg = urlparse(database_url)
        components["postgres"] = {
            "kind": "postgres",
            "managed": own_postgres,
            "host": pg.hostname,
            "port": pg.port or 5432,
            "url": database_url,
            "data": str(pg_dir) if own_postgres else None,
            "log": str(pg_dir / "postgres.log") if own_postgres else None,
            "migrations_applied_now": applied,
        }

        emulator.wait_ready(emulator_url, emu)
        function_urls = {d.name: components[d.name]["url"] for d in DEPLOYABLES}
        emulator.create_layout(emulator_url, PROJECT, layout, function_urls)
        components["pubsub"] = {
            "kind": "pubsub",
            "host": "127.0.0.1",
            "port": ports["pubsub"],
            "url": emulator_url,
            "emulator_host": emulator_host,
            "topics": list(layout.topics),
            "subscriptions": [
                {
                    "name": s.name,
                    "topic": s.topic,
                    "push_endpoint": (
                        emulator.push_endpoint(function_urls[s.function], PROJECT, s.topic)
                        if s.function
                        else None
                    ),
                    "dead_letter_topic": s.dead_letter_topic,
                    "max_delivery_attempts": s.max_delivery_attempts,
                }
                for s in layout.subscriptions
            ],
            "log": str(root / "logs" / "pubsub.log"),
        }
        info: dict[str, Any] = {
            "root": str(root),
            "started_at": _now(),
            "project": PROJECT,
            "database_url": database_url,
            "pubsub_emulator_host": emulator_host,
            "env": {k: v for k, v in fn_env.items() if k in function_env("", "", extra_env)},
            "components": components,
        }
        _write_json(stack_file(root), info)

        if with_scheduler:
            speedup = scheduler.speedup_from_env()
            sched_env = {**_base_env(), "PYTHONUNBUFFERED": "1"}
            _spawn(
                root,
                "scheduler",
                [sys.executable, "-m", "devstack.scheduler", "--stack", str(stack_file(root))],
                sched_env,
            )
            components["scheduler"] = {
                "kind": "scheduler",
                "speedup": speedup,
                "jobs": [{"function": j.function, "schedule": j.cron.text} for j in jobs],
                "log": str(root / "logs" / "scheduler.log"),
            }
            _write_json(stack_file(root), info)

        wait_healthy(root, info)
        info["startup_seconds"] = round(time.monotonic() - started, 2)
        _write_json(stack_file(root), info)
        return info
    except BaseException:
        down(root, quiet=True)
        raise


def _reachable_by_others(folder: Path) -> bool:
    return all(f.stat().st_mode & 0o001 for f in [folder, *folder.parents])


def cluster_dir(root: Path) -> Path:
    """Where the stack's PostgreSQL cluster lives: `<root>/pg`, unless the `postgres` user the
    server runs as (we are root) can't walk down to it, as in any clone under /root (mode
    0700). Then a folder of its own in the system's temporary directory, named after `root`
    so every `make dev` of this clone finds the same cluster again (as the tests' throwaway
    clusters do, devstack/postgres.py)."""
    root.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        return root / "pg"
    root.chmod(0o755)
    if _reachable_by_others(root):
        return root / "pg"
    digest = hashlib.sha256(str(root).encode()).hexdigest()[:12]
    parent = Path(tempfile.gettempdir()) / f"onceflow-pg-{digest}"
    parent.mkdir(mode=0o755, exist_ok=True)
    parent.chmod(0o755)
    if not _reachable_by_others(parent):
        raise StackError(
            f"the postgres user can reach neither {root} nor {parent}: "
            f"`chmod o+x` the folders above {root}"
        )
    return parent / "pg"


def _postmaster_pid(cluster: postgres.Cluster) -> int:
    return int((cluster.data / "postmaster.pid").read_text().split()[0])


def _write_json(path: Path, content: Mapping[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(content, indent=2) + "\n")
    tmp.replace(path)


def apply_migrations(database_url: str) -> list[str]:
    from shared.core.db import connector_from_env
    from shared.core.errors import OnceflowError
    from shared.core.migrate import MigrationError, apply_all, discover

    try:
        conn = connector_from_env({"DATABASE_URL": database_url})()
    except Exception as exc:  # any driver or socket error: say where we tried, in one line
        where = urlparse(database_url)
        raise StackError(
            f"cannot connect to PostgreSQL at {where.hostname}:{where.port or 5432}"
            f"{where.path}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
        ) from None
    try:
        return [m.path.name for m in apply_all(conn, discover(), log=False)]
    except (MigrationError, OnceflowError) as exc:
        raise StackError(f"migrations: {exc}") from None
    finally:
        conn.close()


# --- health ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Health:
    name: str
    ok: bool
    address: str
    detail: str


def check(name: str, comp: Mapping[str, Any], root: Path) -> Health:  # noqa: PLR0911 - one per kind
    kind = comp.get("kind")
    address = str(comp.get("url") or comp.get("host") or "")
    try:
        if kind == "postgres":
            url = urlparse(str(comp["url"]))
            conn = pg8000.dbapi.connect(
                user=url.username or "postgres",
                password=url.password,
                host=url.hostname,
                port=url.port or 5432,
                database=url.path.lstrip("/"),
                timeout=3,
            )
            try:
                cur = conn.cursor()
                cur.execute("SELECT 1")
                cur.fetchone()
                cur.execute("SELECT count(*) FROM schema_migrations")
                (count,) = cur.fetchone()
            finally:
                conn.close()
            where = "own cluster" if comp.get("managed") else "DATABASE_URL"
            return Health(
                name,
                True,
                f"{url.hostname}:{url.port}",
                f"select 1 ok, {count} migrations ({where})",
            )
        if kind == "pubsub":
            ok = emulator.is_ready(address)
            subs = comp.get("subscriptions", [])
            return Health(
                name,
                ok,
                address,
                f"GET / Ok, {len(comp.get('topics', []))} topics, {len(subs)} subscriptions"
                if ok
                else "does not answer GET /",
            )
        if kind == "function":
            # /robots.txt is answered by functions-framework itself (404 for http functions,
            # 405 for CloudEvent ones) without running onceflow code: a probe with no effects.
            try:
                r = httpx.get(address + "/robots.txt", timeout=3)
            except httpx.ReadTimeout:
                # It took the connection but every thread is serving a request: a scheduled
                # function has one (THREADS = its deployed concurrency, 1), and a pass can
                # last most of a minute. Busy, not down, while its process lives.
                pids = {p.name: p for p in read_pids(root)}
                if name in pids and pids[name].alive():
                    return Health(name, True, address, "busy: every thread serving a request")
                raise
            return Health(
                name,
                True,
                address,
                f"{comp.get('signature_type')} function, answers HTTP ({r.status_code})",
            )
        if kind == "fakecrm":
            r = httpx.get(address + str(comp.get("health", "/")), timeout=3)
            return Health(name, r.status_code == 200, address, f"health {r.status_code}")
        if kind == "scheduler":
            pids = {p.name: p for p in read_pids(root)}
            alive = "scheduler" in pids and pids["scheduler"].alive()
            jobs = ", ".join(f"{j['function']} '{j['schedule']}'" for j in comp.get("jobs", []))
            return Health(
                name,
                alive,
                "-",
                f"speedup {comp.get('speedup')}: {jobs}" if alive else "process is not running",
            )
    except (httpx.HTTPError, OSError, pg8000.dbapi.Error, TypeError, ValueError) as exc:
        return Health(name, False, address, f"{type(exc).__name__}: {exc}"[:120])
    return Health(name, False, address, f"unknown component kind {kind}")


def health(root: Path, info: Mapping[str, Any]) -> list[Health]:
    """Every component checked, in the order data flows through them."""
    order = [
        "postgres",
        "pubsub",
        *(d.name for d in DEPLOYABLES),
        "fakecrm",
        "fakepipedrive",
        "fakevertex",
        "scheduler",
    ]
    comps = info["components"]
    names = sorted(comps, key=lambda n: order.index(n) if n in order else len(order))
    return [check(n, comps[n], root) for n in names]


def wait_healthy(
    root: Path, info: Mapping[str, Any], timeout: float = READY_TIMEOUT_SECONDS
) -> None:
    deadline = time.monotonic() + timeout
    pids = {p.name: p for p in read_pids(root)}
    while True:
        bad = [h for h in health(root, info) if not h.ok]
        if not bad:
            return
        for h in bad:
            pid = pids.get(h.name)
            if pid is not None and not pid.alive():
                log = info["components"][h.name].get("log")
                raise StackError(f"{h.name} exited while starting: see {log}")
        if time.monotonic() > deadline:
            raise StackError(
                "not healthy after "
                f"{timeout:.0f} s: " + "; ".join(f"{h.name} ({h.detail})" for h in bad)
            )
        time.sleep(0.2)


def format_table(rows: list[Health]) -> str:
    lines = [f"{'component':<16}{'state':<10}{'address':<28}detail"]
    for h in rows:
        lines.append(f"{h.name:<16}{'healthy' if h.ok else 'DOWN':<10}{h.address:<28}{h.detail}")
    return "\n".join(lines)


def load(root: Path = DEFAULT_ROOT) -> dict[str, Any] | None:
    try:
        return dict(json.loads(stack_file(root.resolve()).read_text()))
    except (OSError, ValueError):
        return None


# --- down -----------------------------------------------------------------------------------


def down(root: Path = DEFAULT_ROOT, *, quiet: bool = False) -> list[str]:
    """Stop every process `up` started under `root`, by pid; the names of those stopped."""
    root = root.resolve()
    pids = read_pids(root)
    # Signal everything first, then wait once: stopping seven processes costs one grace period.
    for p in pids:
        if not p.alive():
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if p.name == "postgres":
                os.kill(p.pid, signal.SIGINT)  # PostgreSQL's "fast" shutdown
            elif p.name in {d.name for d in DEPLOYABLES}:
                # gunicorn (functions-framework) treats SIGTERM as "finish in-flight requests",
                # and drain_inbox/publish_outbox/sweep loop for most of a minute: SIGINT is its
                # quick shutdown. Only the master gets it; it stops its worker itself (a
                # worker signalled at the same moment sometimes leaves the master waiting).
                os.kill(p.pid, signal.SIGINT)
            elif p.group:
                os.killpg(p.pid, signal.SIGTERM)
            else:
                os.kill(p.pid, signal.SIGTERM)
    # A gunicorn master sometimes waits out its whole graceful timeout for a worker that got
    # the signal mid-request; nothing here holds state worth that wait except PostgreSQL,
    # which gets a longer grace before it too is killed.
    started = time.monotonic()
    pending = list(pids)
    while pending:
        elapsed = time.monotonic() - started
        for p in list(pending):
            if not p.leftovers():
                pending.remove(p)
            elif elapsed > (PG_STOP_GRACE_SECONDS if p.name == "postgres" else STOP_GRACE_SECONDS):
                for pid in p.leftovers():
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGKILL)
        if elapsed > PG_STOP_GRACE_SECONDS + 5:
            break
        time.sleep(0.05)
    stopped = [p.name for p in pids]
    left = [f"{p.name} ({p.leftovers()})" for p in pids if p.leftovers()]
    if left:
        raise StackError("could not stop: " + ", ".join(left))
    for p in pids:
        p.path.unlink(missing_ok=True)
    info = load(root)
    if info is not None:
        info["stopped_at"] = _now()
        _write_json(stack_file(root), info)
    if not quiet:
        print(f"stopped {', '.join(stopped)}" if stopped else f"nothing is running in {root}")
    return stopped


# --- CLI ------------------------------------------------------------------------------------


def migrate_command(root: Path) -> str:
    url = os.environ.get("DATABASE_URL")
    if not url:
        info = load(root)
        if info is None or not [p for p in read_pids(root) if p.alive()]:
            raise StackError("no DATABASE_URL set and no local stack running: `make dev` first")
        url = str(info["database_url"])
    applied = apply_migrations(url)
    return f"migrate: {len(applied)} applied ({', '.join(applied) or 'already up to date'})"


def print_status(root: Path) -> bool:
    info = load(root)
    alive = [p for p in read_pids(root) if p.alive()]
    if info is None or not alive:
        print(f"the local stack is not running ({root}): `make dev` starts it")
        return False
    rows = health(root, info)
    print(format_table(rows))
    return all(h.ok for h in rows)


def _pairs(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--env takes KEY=VALUE, not {item!r}")
        out[key] = value
    return out


def main(argv: list[str] | None = None) -> int:  # noqa: PLR0911 - one exit per outcome
    parser = argparse.ArgumentParser(
        prog="python -m devstack.stack", description=__doc__.splitlines()[0]
    )
    parser.add_argument("command", choices=("up", "down", "status", "migrate"))
    parser.add_argument("--root", type=Path, default=DEFAULT_ROOT, help="state folder (.local)")
    parser.add_argument("--free-ports", action="store_true", help="any free ports (tests)")
    parser.add_argument("--no-scheduler", action="store_true")
    parser.add_argument("--no-fakecrm", action="store_true")
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an extra environment variable for every function process (repeatable)",
    )
    args = parser.parse_args(argv)
    root: Path = args.root.resolve()
    try:
        if args.command == "up":
            print(f"starting the local stack in {root} …", flush=True)
            info = up(
                root,
                database_url=os.environ.get("DATABASE_URL") or None,
                free_ports=args.free_ports,
                with_scheduler=not args.no_scheduler,
                with_fakecrm=not args.no_fakecrm,
                extra_env=_pairs(args.env),
                echo=True,
            )
            print(format_table(health(root, info)))
            from devstack.ops_access import mint_local_access

            access = mint_local_access(
                root, info["database_url"], info["components"]["ops"]["url"], "make dev"
            )
            from devstack.seed import first_path

            fake = info["components"].get("fakecrm")
            seeded = first_path(
                root,
                ops_url=info["components"]["ops"]["url"],
                admin_token=access.token,
                fakecrm_url=fake["url"] if fake else None,
                webhook_url=info["components"]["webhook"]["url"],
            )
            print(
                f"\nready in {info['startup_seconds']} s. stack.json: {stack_file(root)}  "
                f"logs: {root / 'logs'}/<component>.log\n"
                f"export DATABASE_URL={info['database_url']} "
                f"PUBSUB_EMULATOR_HOST={info['pubsub_emulator_host']} "
                f"GOOGLE_CLOUD_PROJECT={info['project']}\n"
                "stop it with `make dev-down`\n\n"
                + access.lines()
                + "\n\nseeded: "
                + "\n        ".join(seeded)
            )
            return 0
        if args.command == "down":
            down(root)
            return 0
        if args.command == "status":
            return 0 if print_status(root) else 1
        print(migrate_command(root))
        return 0
    except AlreadyRunning as exc:
        print(f"dev: {exc}", file=sys.stderr)
        print_status(root)
        return 3
    except MissingTool as exc:
        print(f"missing tool: {exc}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as exc:
        detail = (exc.stderr or b"").decode(errors="replace").strip().splitlines()
        print(
            f"dev: {Path(str(exc.cmd[0])).name} failed: {detail[-1] if detail else exc}",
            file=sys.stderr,
        )
        return 1
    except (RuntimeError, ValueError, OSError) as exc:
        # StackError, InfraUnreadable, CronError, a server that would not start: one line.
        print(f"dev: {exc}".splitlines()[0], file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def restart_function(
    root: Path, name: str, extra_env: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Stop one function process and start it again on its port, with `extra_env` added (how
    an end-to-end test arms a crash point in one function); returns its stack.json entry."""
    root = root.resolve()
    info = load(root)
    if info is None or info["components"].get(name, {}).get("kind") != "function":
        raise StackError(f"{name} is not a function of the stack in {root}")
    comp = info["components"][name]
    for p in read_pids(root):
        if p.name == name:
            _stop_one(p)
    env = {
        **_base_env(),
        **function_process.concurrency_env(by_name(name)),
        **info["env"],
        **(extra_env or {}),
    }
    args = function_process.command(
        name, comp["port"], signature=str(comp["signature_type"]), front=True
    )
    _spawn(root, name, args, env)
    comp["extra_env"] = dict(extra_env or {})
    _write_json(stack_file(root), info)
    wait_healthy(root, {"components": {name: comp}})
    return dict(comp)


def _stop_one(p: PidFile) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(p.pid, signal.SIGKILL) if p.group else os.kill(p.pid, signal.SIGKILL)
    deadline = time.monotonic() + 5
    while p.leftovers() and time.monotonic() < deadline:
        time.sleep(0.02)
    p.path.unlink(missing_ok=True)


@dataclass(frozen=True)
class RunningStack:
    """A handle on a running stack, read from its stack.json (tests and the demo use it)."""

    root: Path
    info: Mapping[str, Any]

    @classmethod
    def open(cls, root: Path = DEFAULT_ROOT) -> RunningStack:
        info = load(root)
        if info is None:
            raise StackError(f"no stack.json in {root}: `make dev` first")
        return cls(root.resolve(), info)

    @property
    def database_url(self) -> str:
        return str(self.info["database_url"])

    @property
    def project(self) -> str:
        return str(self.info["project"])

    @property
    def emulator_host(self) -> str:
        return str(self.info["pubsub_emulator_host"])

    @property
    def env(self) -> dict[str, str]:
        """The environment the function processes run with."""
        return dict(self.info["env"])

    def url(self, name: str) -> str:
        return str(self.info["components"][name]["url"])

    def call(
        self,
        name: str,
        *,
        method: str = "POST",
        path: str = "/",
        timeout: float = 120.0,
        **kwargs: Any,
    ) -> httpx.Response:
        """One HTTP request to a component (a function, the fake CRM) and its response."""
        return httpx.request(method, self.url(name) + path, timeout=timeout, **kwargs)

    def publish(self, topic: str, message: Mapping[str, Any]) -> str:
        """Publish a JSON message to the emulator (as shared.core.pubsub does); the message id."""
        import base64

        data = base64.b64encode(json.dumps(dict(message)).encode()).decode()
        response = httpx.post(
            f"http://{self.emulator_host}/v1/projects/{self.project}/topics/{topic}:publish",
            json={"messages": [{"data": data}]},
            timeout=10,
        )
        response.raise_for_status()
        return str(response.json()["messageIds"][0])

    def log(self, name: str) -> str:
        """Everything the component wrote to its log so far."""
        path = self.info["components"][name].get("log")
        return Path(path).read_text(errors="replace") if path else ""

    def restart(self, name: str, extra_env: Mapping[str, str] | None = None) -> None:
        restart_function(self.root, name, extra_env)

    def kill(self, name: str) -> None:
        """SIGKILL one component's processes (a crash); `restart` brings it back."""
        for p in read_pids(self.root):
            if p.name == name:
                _stop_one(p)

    def healthy(self) -> list[Health]:
        return health(self.root, self.info)


if __name__ == "__main__":
    sys.exit(main())
