"""Opaque pagination cursors: the sort key of the last row of a page, base64url JSON; and
`Keyset`, the one way a list route pages with them."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar
from uuid import UUID

from shared.core.db import Database
from shared.core.queries import Query
from shared.ops.errors import OpsError

Row = TypeVar("Row", bound=Mapping[str, Any])


def encode_cursor(values: dict[str, Any]) -> str:
    raw = json.dumps(values, separators=(",", ":"), default=str).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str | None, keys: dict[str, type]) -> dict[str, Any] | None:
    """The cursor's values, typed; a cursor this API did not hand out is a 400."""
    if cursor is None:
        return None
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        values = json.loads(raw)
        if not isinstance(values, dict) or set(values) != set(keys):
            raise ValueError("unexpected keys")
        out: dict[str, Any] = {}
        for name, kind in keys.items():
            value = values[name]
            if kind is datetime:
                parsed = datetime.fromisoformat(str(value))
                if parsed.tzinfo is None:
                    raise ValueError("naive time")
                out[name] = parsed
            elif kind is UUID:
                out[name] = str(UUID(str(value)))
            elif kind is int:
                if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2**63:
                    raise ValueError("not an id")
                out[name] = value
            else:
                raise ValueError("unknown kind")
        return out
    except (ValueError, binascii.Error, UnicodeDecodeError, OverflowError) as exc:
        raise OpsError(400, "invalid_cursor", "the cursor is not one this API returned") from exc


@dataclass(frozen=True)
class Keyset:
    """How a list pages: its sort key's names and kinds, and how a row yields them. The
    statement takes `cursor_<name>` for each key and a `limit`; it is asked for one row more
    than the page holds, so that a next page is known to exist without counting."""

    keys: dict[str, type]
    of_row: Callable[[Mapping[str, Any]], dict[str, Any]]

    def window(self, cursor: str | None, limit: int) -> dict[str, Any]:
        """The statement's cursor and limit parameters (a cursor not handed out is a 400)."""
        values = decode_cursor(cursor, self.keys)
        return {f"cursor_{k}": values[k] if values else None for k in self.keys} | {
            "limit": limit + 1
        }

    def read(
        self, db: Database, statement: Query, cursor: str | None, limit: int, **params: Any
    ) -> tuple[list[dict[str, Any]], str | None]:
        """One page of the statement's rows, and the next page's cursor (None on the last).
        The cursor is checked before the database is asked."""
        window = self.window(cursor, limit)
        with db.transaction() as tx:
            rows = tx.all(statement, **params, **window)
        return self.page(rows, limit)

    def page(self, rows: Sequence[Row], limit: int) -> tuple[list[Row], str | None]:
        """The page's rows and the cursor of the next page (None on the last)."""
        shown = list(rows[:limit])
        return shown, encode_cursor(self.of_row(shown[-1])) if len(rows) > limit else None


BY_ID = Keyset({"id": int}, lambda row: {"id": row["id"]})
BY_CREATED = Keyset(
    {"at": datetime, "id": UUID},
    lambda row: {"at": row["created_at"].isoformat(), "id": str(row["id"])},
)
