"""One click from `make dev` to the ops page: the local `ops` function's /ui URL and a freshly
minted local admin ops token, printed when the stack is up (and at the end of `make demo` when
the stack stays up), and kept in `.local/ops-token` (readable by you only) to find again.

Local only: the stack's database is a throwaway one, nothing but this machine can reach the
function, and there is no IAM in front of it, so the ops token is the one credential.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from shared.core.db import Database, connector_from_env
from shared.ops.auth import mint_token

TOKEN_FILE = "ops-token"  # noqa: S105 - a file name, not a secret


@dataclass(frozen=True)
class LocalAccess:
    ui_url: str
    ops_url: str
    token: str
    token_file: Path

    def lines(self) -> str:
        return (
            f"ops page: {self.ui_url}  (sign in with this local admin token; it is also in "
            f"{self.token_file})\n"
            f"ops token: {self.token}\n"
            f"export ONCEFLOW_OPS_URL={self.ops_url} ONCEFLOW_OPS_TOKEN={self.token}"
            "   # for the onceflow command"
        )


def mint_local_access(root: Path, database_url: str, ops_url: str, label: str) -> LocalAccess:
    db = Database(connector_from_env({"DATABASE_URL": database_url}), pool_size=1)
    try:
        with db.transaction() as tx:
            token, _ = mint_token(tx, tenant_id=None, label=label)
    finally:
        db.close()
    path = root / TOKEN_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    path.chmod(0o600)
    return LocalAccess(ops_url.rstrip("/") + "/ui", ops_url.rstrip("/"), token, path)
