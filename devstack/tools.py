"""Finding the external tools the local stack needs, with one-line advice when one is missing."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path


class MissingTool(RuntimeError):
    """A required program is not installed. The message says what to install."""


def pg_bindir() -> Path:
    explicit = os.environ.get("PG_BINDIR")
    if explicit:
        return Path(explicit)
    pg_config = shutil.which("pg_config")
    if pg_config:
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True, check=False)
        candidate = Path(out.stdout.strip())
        if (candidate / "initdb").exists():
            return candidate
    for guess in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (guess / "initdb").exists():
            return guess
    raise MissingTool(
        "PostgreSQL server binaries (initdb, pg_ctl) not found: "
        "install them with `apt-get install postgresql` or set PG_BINDIR"
    )


def pubsub_emulator() -> list[str]:
    """The command that starts the Pub/Sub emulator (the fast launcher when present)."""
    if shutil.which("java") is None:
        raise MissingTool(
            "Java not found (the Pub/Sub emulator needs it): "
            "`apt-get install openjdk-17-jre-headless`"
        )
    gcloud = shutil.which("gcloud")
    if gcloud is None:
        raise MissingTool(
            "gcloud not found (it carries the Pub/Sub emulator): install the Google Cloud SDK "
            "and `gcloud components install pubsub-emulator`"
        )
    out = subprocess.run(
        [gcloud, "info", "--format=value(installation.sdk_root)"],
        capture_output=True,
        text=True,
        check=False,
    )
    launcher = Path(out.stdout.strip()) / "platform/pubsub-emulator/bin/cloud-pubsub-emulator"
    if launcher.exists():
        return [str(launcher)]
    return [gcloud, "beta", "emulators", "pubsub", "start"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_holder(port: int) -> str | None:
    """Who listens on 127.0.0.1:port, as `pid/name` when it can be found."""
    with socket.socket() as s:
        s.settimeout(0.3)
        if s.connect_ex(("127.0.0.1", port)) != 0:
            return None
    ss = shutil.which("ss")
    if ss:
        out = subprocess.run(
            [ss, "-ltnpH", f"sport = :{port}"], capture_output=True, text=True, check=False
        )
        line = out.stdout.strip()
        if "users:" in line:
            return line.split("users:", 1)[1].strip()
    return "an unknown process"
