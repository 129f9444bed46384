"""`make dev` / `make demo` hand out the local ops page: its URL and a freshly minted admin
token that signs in (kept in a file only its owner can read)."""

from __future__ import annotations

from pathlib import Path

from devstack.ops_access import mint_local_access
from shared.core.db import Database
from shared.ops.auth import authenticate


def test_local_access_mints_an_admin_token_that_signs_in(
    db: Database, database_url: str, tmp_path: Path
) -> None:
    access = mint_local_access(tmp_path, database_url, "http://127.0.0.1:18416/", "make demo")
    assert access.ui_url == "http://127.0.0.1:18416/ui"
    principal = authenticate(db, access.token)
    assert principal is not None and principal.is_admin and principal.label == "make demo"
    assert access.token_file.read_text().strip() == access.token
    assert access.token_file.stat().st_mode & 0o777 == 0o600
    lines = access.lines()
    assert "ops page: http://127.0.0.1:18416/ui" in lines
    assert f"ONCEFLOW_OPS_TOKEN={access.token}" in lines
    # Each call mints a new token and the file names the newest.
    again = mint_local_access(tmp_path, database_url, "http://127.0.0.1:18416", "make dev")
    assert again.token != access.token and again.token_file.read_text().strip() == again.token
