"""Bulk actions from the page, always in two steps: a preview that lists how many and which
(`GET /ui/bulk`), then a confirmation that acts on exactly the targets it listed
(`POST /ui/bulk`, CSRF-checked), so what runs is what the person saw, not whatever matches
by the time they click.

Each target goes through the API's own route (`OpsApi.run_route`), so each is scoped to the
caller's tenant and audited one by one, refusals included. Repeating a bulk action is
harmless: a run already replayed is refused (a replay lineage has one replay per run), a
retried run is no longer failed, a requeued inbox row is no longer dead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from shared.ops.errors import OpsError
from shared.ops.models import (
    ReplayRequest,
    ReplayResult,
    RetryRequest,
    RunPage,
    RunsQuery,
    StuckInboxList,
    StuckInboxQuery,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from pydantic import BaseModel

# At most this many targets per bulk action (a confirmation form carries their ids).
MAX_TARGETS = 200


@dataclass(frozen=True)
class BulkAction:
    verb: str
    past: str
    what: str
    consequence: str
    route: str


ACTIONS = {
    "replay": BulkAction(
        "replay",
        "replayed",
        "failed run(s)",
        "Each becomes a new run linked to it; its settled steps are copied, charges are not "
        "repeated.",
        "runs.replay",
    ),
    "retry": BulkAction(
        "retry",
        "retried",
        "failed run(s)",
        "Each is retried in place from its failed steps (fix the cause first).",
        "runs.retry",
    ),
    "requeue_inbox": BulkAction(
        "requeue",
        "requeued",
        "dead inbox row(s)",
        "Each goes back to the drain with a fresh attempt budget.",
        "inbox.requeue",
    ),
}


@dataclass(frozen=True)
class Outcome:
    target: str
    ok: bool
    detail: str
    link: str | None = None


def action_named(name: str) -> BulkAction:
    if name not in ACTIONS:
        raise OpsError(404, "not_found", "there is no such bulk action")
    return ACTIONS[name]


def preview(
    call: Callable[..., BaseModel], action: str, query: RunsQuery
) -> tuple[list[Any], bool]:
    """The targets the action would touch now, and whether more match than are listed."""
    if action == "requeue_inbox":
        listed = call("inbox.stuck", query=StuckInboxQuery(limit=MAX_TARGETS))
        assert isinstance(listed, StuckInboxList)
        dead = [r for r in listed.rows if r.status == "dead"]
        return dead, len(listed.rows) == MAX_TARGETS
    failed = query.model_copy(update={"status": "failed", "limit": MAX_TARGETS, "cursor": None})
    page = call("runs.list", query=failed)
    assert isinstance(page, RunPage)
    return page.items, page.next_cursor is not None


def perform(call: Callable[..., BaseModel], action: str, targets: list[str]) -> list[Outcome]:
    spec = action_named(action)
    outcomes = []
    for target in dict.fromkeys(targets[:MAX_TARGETS]):  # each once, in the order listed
        try:
            if action == "requeue_inbox":
                call(spec.route, path={"inbox_id": target})
                outcomes.append(Outcome(target, True, "back in the drain"))
                continue
            body = (
                ReplayRequest(reason="bulk replay from the ops page")
                if action == "replay"
                else RetryRequest(reason="bulk retry from the ops page")
            )
            result = call(spec.route, path={"run_id": target}, body=body)
            if isinstance(result, ReplayResult):
                outcomes.append(
                    Outcome(target, True, f"new run {result.run.id}", f"/ui/runs/{result.run.id}")
                )
            else:
                outcomes.append(Outcome(target, True, "retried", f"/ui/runs/{target}"))
        except OpsError as err:
            outcomes.append(Outcome(target, False, err.message))
    return outcomes
