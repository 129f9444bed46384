"""A throwaway PostgreSQL cluster on 127.0.0.1, for `make dev`, the benches and the tests.

initdb and pg_ctl refuse to run as root, so when we are root every server command runs as
the `postgres` user, in folders that user owns.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pg8000.dbapi

from devstack.tools import MissingTool, free_port, pg_bindir
from shared.core.migrate import apply_all, discover


@dataclass(frozen=True)
class Cluster:
    root: Path
    port: int
    user: str = "postgres"

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def socket_dir(self) -> Path:
        return self.root / "sock"

    @property
    def log(self) -> Path:
        return self.root / "postgres.log"

    def url(self, database: str = "onceflow") -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{database}"


def _as_server_user() -> list[str]:
    if os.geteuid() != 0:
        return []
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        raise MissingTool(
            "running as root needs a `postgres` user to own the cluster: "
            "`apt-get install postgresql` creates it"
        ) from None
    runuser = shutil.which("runuser")
    if runuser is None:
        raise MissingTool("runuser not found (util-linux): `apt-get install util-linux`")
    return [runuser, "-u", "postgres", "--"]


def _chown_to_server_user(path: Path) -> None:
    if os.geteuid() == 0:
        pw = pwd.getpwnam("postgres")
        os.chown(path, pw.pw_uid, pw.pw_gid)


def start(root: Path, port: int, *, fast: bool = False) -> Cluster:
    """initdb (once) and start a cluster under `root`; `fast` turns durability off (tests)."""
    cluster = Cluster(root=root, port=port)
    bindir = pg_bindir()
    prefix = _as_server_user()
    root.mkdir(parents=True, exist_ok=True)
    _chown_to_server_user(root)
    if not (cluster.data / "PG_VERSION").exists():
        subprocess.run(
            [
                *prefix,
                str(bindir / "initdb"),
                "-D",
                str(cluster.data),
                "-U",
                "postgres",
                "--auth=trust",
                "--encoding=UTF8",
                "--no-instructions",
            ],
            check=True,
            capture_output=True,
        )
    cluster.socket_dir.mkdir(exist_ok=True)
    _chown_to_server_user(cluster.socket_dir)
    options = (
        f"-p {port} -c listen_addresses=127.0.0.1 -k {cluster.socket_dir} -c max_connections=200"
    )
    if fast:
        options += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
    result = subprocess.run(
        [
            *prefix,
            str(bindir / "pg_ctl"),
            "-D",
            str(cluster.data),
            "-l",
            str(cluster.log),
            "-o",
            options,
            "-w",
            "-t",
            "30",
            "start",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        tail = cluster.log.read_text(errors="replace")[-800:] if cluster.log.exists() else ""
        raise RuntimeError(f"PostgreSQL did not start on port {port}: {result.stderr}\n{tail}")
    wait_ready(cluster)
    return cluster


@contextmanager
def throwaway(prefix: str, *, fast: bool, under: Path | None = None) -> Iterator[Cluster]:
    """A cluster in a new temporary folder (in `under` when given) on a free port, stopped and
    removed afterwards."""
    parent = Path(tempfile.mkdtemp(prefix=prefix, dir=under))
    parent.chmod(0o755)  # as root the server runs as `postgres`, which must reach <parent>/pg
    cluster = start(parent / "pg", free_port(), fast=fast)
    try:
        yield cluster
    finally:
        stop(cluster)
        shutil.rmtree(parent, ignore_errors=True)


def wait_ready(cluster: Cluster, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            pg8000.dbapi.connect(
                user="postgres", host="127.0.0.1", port=cluster.port, database="postgres", timeout=2
            ).close()
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def stop(cluster: Cluster) -> None:
    bindir = pg_bindir()
    subprocess.run(
        [
            *_as_server_user(),
            str(bindir / "pg_ctl"),
            "-D",
            str(cluster.data),
            "-m",
            "fast",
            "-w",
            "stop",
        ],
        capture_output=True,
        check=False,
    )


def create_database(admin_url_port: int, name: str, template: str | None = None) -> None:
    conn = pg8000.dbapi.connect(
        user="postgres", host="127.0.0.1", port=admin_url_port, database="postgres"
    )
    conn.autocommit = True
    try:
        cur = conn.cursor()
        cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
        if cur.fetchone() is None:
            suffix = f' TEMPLATE "{template}"' if template else ""
            cur.execute(f'CREATE DATABASE "{name}"{suffix}')
    finally:
        conn.close()


def create_migrated_database(cluster: Cluster, name: str) -> str:
    """`name` on `cluster` with every migration applied; its URL."""
    create_database(cluster.port, name)
    conn = pg8000.dbapi.connect(user="postgres", host="127.0.0.1", port=cluster.port, database=name)
    try:
        apply_all(conn, discover(), log=False)
    finally:
        conn.close()
    return cluster.url(name)
