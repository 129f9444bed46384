"""How the `onceflow` command writes for a person and reads what a person types: tables that
fit a terminal (at most `MAX_WIDTH` characters a row), times shown relative and in the local
zone, and times typed as `1h`, `2d`, a bare date or an ISO time without a zone.

Scripts use `--json` instead, which prints the API's UTC ISO times unchanged.
"""

from __future__ import annotations

import re
import shutil
import textwrap
from collections.abc import Sequence
from datetime import UTC, date, datetime, timedelta
from typing import Any, TextIO

# A row of a table is at most this wide, less when the terminal is narrower.
MAX_WIDTH = 100
MIN_WIDTH = 60
# A cut column keeps at least this much (or its header, when that is longer).
MIN_COLUMN = 6
_RECORD_KEY = re.compile(r"^[0-9a-fA-F-]{36}:(?P<object>.+)$")
_AGO = re.compile(r"^\s*(?P<n>\d+)\s*(?P<unit>s|m|min|h|d|w)\s*$")
_UNITS = {"s": "seconds", "m": "minutes", "min": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def width() -> int:
    """The width a row may take: the terminal's, within MIN_WIDTH…MAX_WIDTH (a pipe: MAX)."""
    columns = shutil.get_terminal_size((MAX_WIDTH, 24)).columns
    return max(MIN_WIDTH, min(MAX_WIDTH, columns))


def cell(value: Any) -> str:
    return "" if value is None else str(value).replace("\n", " ")


def cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: max(limit - 1, 0)] + "…"


def table(
    rows: Sequence[Sequence[Any]], headers: Sequence[str], out: TextIO, limit: int | None = None
) -> None:
    """Columns padded to their widest cell. When a row would be wider than `limit` (default:
    `width()`), the widest columns but the first (an id people copy, never cut) are cut
    one character at a time until it fits; a cut cell ends in `…`."""
    limit = width() if limit is None else limit
    cells = [[cell(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    floors = [widths[0]] + [max(MIN_COLUMN, len(h)) for h in headers[1:]]
    while sum(widths) + 2 * (len(widths) - 1) > limit:
        candidates = [i for i in range(1, len(widths)) if widths[i] > floors[i]]
        if not candidates:
            break
        # The widest gives first; of equals the rightmost (the id-like columns come first).
        widest = max(candidates, key=lambda i: (widths[i], i))
        widths[widest] -= 1
    print(
        "  ".join(h.upper().ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip(),
        file=out,
    )
    for row in cells:
        print(
            "  ".join(cut(c, w).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip(),
            file=out,
        )


def wrap(text: str) -> str:
    """A long message (a run's error) folded to `width()`, continuation lines indented."""
    return textwrap.fill(
        text, width(), subsequent_indent="  ", break_long_words=True, break_on_hyphens=False
    )


def short_record(record_key: str | None) -> str:
    """`<connection uuid>:contact:901` as `contact:901`: the connection's id takes 37 of a
    row's characters and is the same on every row of one connection (`--json` keeps it)."""
    if not record_key:
        return ""
    match = _RECORD_KEY.match(record_key)
    return match["object"] if match else record_key


def _parse(value: str | datetime | None) -> datetime | None:
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        return value
    parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def ago(value: str | datetime | None, now: datetime | None = None) -> str:
    """How long ago, in the largest unit that is at least 1: `42s ago`, `5m ago`, `3h ago`,
    `2d ago`; older than a week, the local date. A time in the future: `in 5m`."""
    at = _parse(value)
    if at is None:
        return ""
    now = now or datetime.now(UTC)
    seconds = int((now - at).total_seconds())
    future = seconds < 0
    seconds = abs(seconds)
    if seconds >= 7 * 86400:
        return local(at, seconds=False)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size or unit == "s":
            amount = f"{seconds // size}{unit}"
            return f"in {amount}" if future else f"{amount} ago"
    raise AssertionError("unreachable")


def local(value: str | datetime | None, *, seconds: bool = True) -> str:
    """The time in this machine's zone, with the zone's name: `2026-12-03 14:05:01 CET`."""
    at = _parse(value)
    if at is None:
        return ""
    shown = at.astimezone()
    return shown.strftime("%Y-%m-%d %H:%M:%S %Z" if seconds else "%Y-%m-%d %H:%M %Z")


def when(value: str | datetime | None, now: datetime | None = None) -> str:
    """Local time and how long ago: `2026-12-03 14:05:01 CET (5m ago)`."""
    if _parse(value) is None:
        return ""
    return f"{local(value)} ({ago(value, now)})"


def parse_future(text: str, now: datetime | None = None) -> str:
    """An expiry as a person types it: `30d`, `12h` (from now), or a date or time as
    `parse_moment` reads it."""
    match = _AGO.match(text)
    if match:
        delta = timedelta(**{_UNITS[match["unit"]]: int(match["n"])})
        return ((now or datetime.now(UTC)) + delta).isoformat()
    return parse_moment(text, now)


def parse_moment(text: str, now: datetime | None = None) -> str:
    """A time as a person types it, as the ISO time (with its offset) the API takes:
    `90s`, `15m`, `1h`, `2d`, `1w` (that long ago), `2026-12-01` (local midnight), an ISO time
    (`2026-12-01T09:00`, local when it names no zone; `…Z` or `…+01:00` as given).
    ValueError for anything else."""
    match = _AGO.match(text)
    if match:
        delta = timedelta(**{_UNITS[match["unit"]]: int(match["n"])})
        return ((now or datetime.now(UTC)) - delta).isoformat()
    stripped = text.strip()
    try:
        if re.fullmatch(r"\d{4}-\d{2}-\d{2}", stripped):
            day = date.fromisoformat(stripped)
            return datetime(day.year, day.month, day.day).astimezone().isoformat()
        parsed = datetime.fromisoformat(stripped.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"{text!r} is not a time: try 1h, 30m, 2d, 2026-12-01 or 2026-12-01T09:00Z"
        ) from None
    return (parsed if parsed.tzinfo else parsed.astimezone()).isoformat()
