"""Opaque pagination cursors: the sort key of the last row of a page, base64url JSON."""

from __future__ import annotations

import base64
import binascii
import json
from datetime import datetime
from typing import Any
from uuid import UUID

from shared.ops.errors import OpsError


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
