"""Limits: `/v1/limits` — what each limit is holding back now (issue 29, item 7).

For every connection, workflow and host rate limit and every run-start throttle key with a
live window or something waiting behind it, every keyed-concurrency key with runs waiting for
a slot, and every debounce burst or batch not yet fired: its window (limit and period; a
concurrency key's limit and its running runs; a batch's max_size and max_wait), what the window
admitted, what waits (steps parked THROTTLED, events in `run_start_queue`, events held in the
burst or batch) and since when the oldest has waited. One read
statement per kind (shared/sql/ops.sql `ops_limits_*`), each from an index and bounded; a
tenant token sees its own tenant's limits, an admin every tenant's (or one it names).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from shared.ops.api.http import Call
from shared.ops.errors import not_found
from shared.ops.models import LimitsQuery, LimitsReport, LimitView
from shared.ops.statements import (
    LIMITS_DEBOUNCE_BURSTS,
    LIMITS_PARKED_STEPS,
    LIMITS_RUN_START_QUEUE,
    LIMITS_WINDOWS,
)
from shared.port import budget


def get_limits(call: Call) -> LimitsReport:
    q: LimitsQuery = call.query
    if call.scope is not None and q.tenant_id not in (None, call.scope):
        raise not_found("tenant")
    tenant_id = call.scope or q.tenant_id
    bound = {"tenant_id": tenant_id, "limit": q.limit + 1}
    with call.db.transaction() as tx:
        windows = tx.all(LIMITS_WINDOWS, **bound)
        parked = tx.all(LIMITS_PARKED_STEPS, **bound)
        queued = tx.all(LIMITS_RUN_START_QUEUE, **bound)
        bursts = tx.all(LIMITS_DEBOUNCE_BURSTS, **bound)
        narrowed = tx.all(budget.NARROWED, **bound)
    truncated = any(len(rows) > q.limit for rows in (windows, parked, queued, bursts, narrowed))
    now = datetime.now(UTC)
    views: dict[tuple[str, str], dict[str, Any]] = {}

    def view(kind: str, subject: str, tenant: str, what: str) -> dict[str, Any]:
        return views.setdefault(
            (kind, subject),
            {
                "kind": kind,
                "tenant_id": tenant,
                "subject": subject,
                "limit": None,
                "period_seconds": None,
                "admitted": 0,
                "waiting": 0,
                "waiting_what": what,
                "oldest_wait_since": None,
                "next_at": None,
                "reason": None,
            },
        )

    for w in windows[: q.limit]:
        what = "events" if w["scope"] == "run_start" else "steps"
        v = view(w["scope"], w["subject"], w["tenant_id"], what)
        v.update(
            limit=w["limit_max"],
            period_seconds=float(w["window_seconds"]),
            window_start=w["window_start"],
            window_end=w["window_end"],
            admitted=int(w["used"]),
        )
    for n in narrowed[: q.limit]:
        # The portal's budget narrows the connection now: say why (shared/port/budget.py).
        v = view("connection", n["connection_id"], n["tenant_id"], "steps")
        v["reason"] = budget.narrowed_reason(n)
        if v["limit"] is None:
            v["limit"] = int(n["shrunk_max"] if n["kind"] == "shrunk" else n["configured_max"])
            v["period_seconds"] = float(n["window_seconds"])
        if v["next_at"] is None:
            v["next_at"] = n["until"]
    for p in parked[: q.limit]:
        v = view(p["scope"], p["subject"], p["tenant_id"], "steps")
        _waits(v, p, next_at=p["next_wake_at"])
    for r in queued[: q.limit]:
        kind = "run_start" if r["gate"] == "throttle" else "concurrency"
        v = view(kind, f"{r['workflow_id']}|{r['throttle_key']}", r["tenant_id"], "events")
        _waits(v, r, next_at=r["next_at"])
        if kind == "concurrency":
            v["admitted"] = int(r["running"])  # running runs holding a slot of the key
    for b in bursts[: q.limit]:
        kind = "debounce" if b["max_size"] is None else "batch"
        v = view(kind, f"{b['workflow_id']}|{b['burst_key']}|{b['burst_id']}", "", "events")
        v.update(tenant_id=b["tenant_id"], subject=f"{b['workflow_id']}|{b['burst_key']}")
        _waits(v, b, next_at=b["next_at"])
        v["period_seconds"] = float(b["period_seconds"])
        if b["max_size"] is not None:
            v["limit"] = int(b["max_size"])  # a batch fires when it holds this many
    items = [
        LimitView(
            **v,
            oldest_wait_seconds=(
                None
                if v["oldest_wait_since"] is None
                else max((now - v["oldest_wait_since"]).total_seconds(), 0.0)
            ),
        )
        for v in views.values()
    ]
    items.sort(key=lambda i: (i.tenant_id, i.kind, i.subject))
    return LimitsReport(items=items, truncated=truncated)


def _waits(v: dict[str, Any], row: Mapping[str, Any], *, next_at: datetime | None) -> None:
    """What waits behind the limit; the limit and period as the waiters saw them when the
    window row is gone (ended, not yet re-claimed)."""
    v["waiting"] += int(row["waiting"])
    since = row["oldest_wait_since"]
    if v["oldest_wait_since"] is None or (since is not None and since < v["oldest_wait_since"]):
        v["oldest_wait_since"] = since
    if v["limit"] is None and row.get("limit_max") is not None:
        v["limit"] = int(row["limit_max"])
    if v["period_seconds"] is None and row.get("window_seconds") is not None:
        v["period_seconds"] = float(row["window_seconds"])
    # A live window lets its waiters through when it ends; otherwise the waiters' own time.
    v["next_at"] = v.get("window_end") or next_at
