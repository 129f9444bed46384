"""Forward-only migrations: `migrations/NNNN_what_it_does.sql`, applied in order.

`python -m shared.core.migrate` (also `make migrate`, and the Cloud Build step) applies every file
not yet recorded in `schema_migrations`, each in its own transaction, under a session advisory
lock so two deployers can't interleave. Each applied file is recorded with its SHA-256; a file
edited after it was applied is refused, naming the file, because the database no longer says
what the file says. A failing file rolls back completely and the server's message is printed.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from shared.core.db import Connection, connector_from_env, translate
from shared.core.errors import OnceflowError

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"
_FILENAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
# An arbitrary constant: every onceflow deployer takes the same lock.
_LOCK_KEY = 0x0CEF10


class MigrationError(Exception):
    pass


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    path: Path
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode("utf-8")).hexdigest()


def discover(directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    found: list[Migration] = []
    for path in sorted(directory.glob("*.sql")):
        match = _FILENAME.match(path.name)
        if not match:
            raise MigrationError(f"{path.name}: migration files are named NNNN_what_it_does.sql")
        found.append(Migration(int(match[1]), match[2], path, path.read_text("utf-8")))
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise MigrationError("two migration files share a version number")
    return found


_BOOKKEEPING = """
CREATE TABLE IF NOT EXISTS schema_migrations (
    version    integer PRIMARY KEY,
    name       text NOT NULL,
    checksum   text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)
"""


def apply_all(conn: Connection, migrations: list[Migration], log: bool = True) -> list[Migration]:
    """Apply what is missing; the list of migrations applied by this call."""
    conn.autocommit = True
    cur = conn.cursor()
    cur.execute("SELECT pg_advisory_lock(%s)", (_LOCK_KEY,))
    try:
        cur.execute(_BOOKKEEPING)
        cur.execute("SELECT version, name, checksum FROM schema_migrations")
        applied = {int(v): (n, c) for v, n, c in cur.fetchall()}
        known = {m.version for m in migrations}
        for version, (name, _) in sorted(applied.items()):
            if version not in known:
                raise MigrationError(
                    f"the database has migration {version:04d}_{name}.sql applied, "
                    "but no such file exists here: is this checkout older than the database?"
                )
        done: list[Migration] = []
        for m in migrations:
            if m.version in applied:
                if applied[m.version][1] != m.checksum:
                    raise MigrationError(
                        f"{m.path.name} was edited after it was applied (checksum differs). "
                        "Migrations are forward-only: restore the file and add a new one."
                    )
                continue
            try:
                conn.execute_simple("BEGIN")
                conn.execute_simple(m.sql)
                cur.execute(
                    "INSERT INTO schema_migrations (version, name, checksum) VALUES (%s, %s, %s)",
                    (m.version, m.name, m.checksum),
                )
                conn.execute_simple("COMMIT")
            except Exception as exc:
                conn.execute_simple("ROLLBACK")
                raise MigrationError(
                    f"{m.path.name} failed and was rolled back: {translate(exc)}"
                ) from exc
            if log:
                print(f"applied {m.path.name}")
            done.append(m)
        return done
    finally:
        cur.execute("SELECT pg_advisory_unlock(%s)", (_LOCK_KEY,))


def migrate(directory: Path = MIGRATIONS_DIR, log: bool = True) -> list[Migration]:
    conn = connector_from_env()()
    try:
        return apply_all(conn, discover(directory), log=log)
    finally:
        conn.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--dir", type=Path, default=MIGRATIONS_DIR)
    args = parser.parse_args(argv)
    try:
        done = migrate(args.dir)
    except (MigrationError, OnceflowError) as exc:
        print(f"migrate: {exc}", file=sys.stderr)
        return 1
    print(f"migrate: {len(done)} applied, database is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
