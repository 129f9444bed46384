"""Shared fixtures: a real PostgreSQL server for the whole test session, and a fresh database
per test cloned from a migrated template (CREATE DATABASE … TEMPLATE takes milliseconds on the
RAM disk the cluster lives on when the machine has one)."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pg8000.dbapi
import pytest

from devstack import postgres
from shared.core import db as dbmod
from shared.core.db import Database, connector_from_env
from shared.core.settings import settings

os.environ.setdefault("NO_GCE_CHECK", "true")

# Fixtures that live next to the helpers they serve, registered once for every test here and
# in e2e/: the ops app (`dispatched`, `client`, `ops_server`), the Pub/Sub emulator
# (`pubsub_emulator`, `pubsub`), the examples' webhook (`webhook_url`), the check that no
# test's fake HubSpot was called on a numbered API path (`no_numbered_hubspot_paths`) and one
# CRM under test per provider with a fake (`crm_under_test`).
pytest_plugins = (
    "tests.ops_support",
    "tests.pubsub_emulator",
    "tests.examples_support",
    "tests.fakecrm_support",
    "tests.crm_providers_support",
)

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = "onceflow_template"


@pytest.fixture(autouse=True)
def _settings_follow_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The process's settings are parsed once (`shared.core.settings.settings`, cached): each
    test starts from the environment as it is, and every MonkeyPatch's `setenv`, `delenv` and
    `undo` (the `monkeypatch` fixture's and `MonkeyPatch.context()`'s alike) clears the cache,
    so the next `settings()` reads the changed environment."""
    settings.cache_clear()
    for name in ("setenv", "delenv", "undo"):
        change = getattr(pytest.MonkeyPatch, name)

        def change_and_forget(self: Any, *args: Any, _change: Any = change, **kwargs: Any) -> None:
            _change(self, *args, **kwargs)
            settings.cache_clear()

        monkeypatch.setattr(pytest.MonkeyPatch, name, change_and_forget)


# The cluster's files go to a RAM disk when there is one with room: on a virtual disk every
# CREATE DATABASE … TEMPLATE (one per test) copies ~560 files and took 0.1-0.6 s, on tmpfs
# 0.02 s. The suite's peak is the template, a few live test databases and the WAL (fsync off).
RAM_DISK = Path("/dev/shm")
RAM_DISK_ROOM = 2 * 1024**3


def _ram_disk() -> Path | None:
    try:
        room = shutil.disk_usage(RAM_DISK).free
    except OSError:
        return None
    return RAM_DISK if room >= RAM_DISK_ROOM and os.access(RAM_DISK, os.W_OK) else None


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[postgres.Cluster]:
    with postgres.throwaway("onceflow-test-pg-", fast=True, under=_ram_disk()) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def template_database(pg_cluster: postgres.Cluster) -> str:
    postgres.create_migrated_database(pg_cluster, TEMPLATE)
    return TEMPLATE


def _admin(cluster: postgres.Cluster) -> pg8000.dbapi.Connection:
    conn = pg8000.dbapi.connect(
        user="postgres", host="127.0.0.1", port=cluster.port, database="postgres"
    )
    conn.autocommit = True
    return conn


@contextmanager
def _fresh_database(cluster: postgres.Cluster, template: str | None = None) -> Iterator[str]:
    """A new database (a copy of `template` when given) for one test, dropped after it."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    admin = _admin(cluster)
    copy = f' TEMPLATE "{template}"' if template else ""
    admin.cursor().execute(f'CREATE DATABASE "{name}"{copy}')
    try:
        yield cluster.url(name)
    finally:
        admin.cursor().execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


@pytest.fixture
def empty_database_url(pg_cluster: postgres.Cluster) -> Iterator[str]:
    """A database with no migrations applied."""
    with _fresh_database(pg_cluster) as url:
        yield url


@pytest.fixture
def database_url(pg_cluster: postgres.Cluster, template_database: str) -> Iterator[str]:
    """A fresh, fully migrated database for one test."""
    with _fresh_database(pg_cluster, template_database) as url:
        yield url


@pytest.fixture
def db(database_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Database]:
    """A pool on the test's database; `shared.core.db.get_database()` returns it too."""
    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.delenv("INSTANCE_CONNECTION_NAME", raising=False)
    dbmod.reset_database()
    database = Database(connector_from_env({"DATABASE_URL": database_url}), pool_size=16)
    monkeypatch.setattr(dbmod, "_database", database)
    try:
        yield database
    finally:
        database.close()
        monkeypatch.setattr(dbmod, "_database", None)
