"""Mint an ops token: `python -m shared.ops.tokens create --tenant acme [--label support]
[--role manager …]`. The label names the holder (approvals name users by it); each `--role`
is a tenant role they have (approvals may name a role that decides them).

The token is printed once, on stdout, and never stored in clear; `--admin` mints a token that
sees every tenant. The database comes from DATABASE_URL (or the Cloud SQL variables).

This is the database-session way, for a local database or a break-glass session. People use the
ops API instead: `onceflow tokens create|list|revoke`, and `onceflow bootstrap` for the first
admin token of a deployment (no database session; see shared/ops/auth.py).
"""

from __future__ import annotations

import argparse
import sys

from shared.core.db import get_database
from shared.core.errors import OnceflowError
from shared.ops.auth import mint_token
from shared.ops.statements import TENANT_EXISTS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m shared.ops.tokens")
    sub = parser.add_subparsers(dest="command", required=True)
    create = sub.add_parser("create", help="mint a token and print it once")
    scope = create.add_mutually_exclusive_group(required=True)
    scope.add_argument("--tenant", help="the tenant the token is scoped to")
    scope.add_argument("--admin", action="store_true", help="a token that sees every tenant")
    create.add_argument("--label", default="cli", help="who or what the token is for")
    create.add_argument(
        "--role", action="append", default=[], help="a tenant role of its holder (repeatable)"
    )
    args = parser.parse_args(argv)

    db = get_database()
    try:
        with db.transaction() as tx:
            if args.tenant is not None and tx.one(TENANT_EXISTS, tenant_id=args.tenant) is None:
                print(f"no tenant named {args.tenant!r}", file=sys.stderr)
                return 2
            token, token_id = mint_token(
                tx,
                tenant_id=None if args.admin else args.tenant,
                label=args.label,
                roles=tuple(args.role),
            )
    except OnceflowError as exc:
        print(f"could not mint a token: {exc}", file=sys.stderr)
        return 1
    print(token)
    scope_text = "admin" if args.admin else f"tenant {args.tenant}"
    print(f"token {token_id} for {scope_text}; it is shown only this once", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
