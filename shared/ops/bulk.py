"""Bulk actions on the page, worded for people. The work is the API's (shared/ops/api/bulk.py,
`POST /v1/bulk/preview` then `POST /v1/bulk/act`): the page's preview (`GET /ui/bulk`) asks
for a token naming exactly the targets it lists, and its confirmation (`POST /ui/bulk`,
CSRF-checked) acts on that token, so what runs is what the person saw, not whatever matches by
the time they click; a second click on the same confirmation does nothing more.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from shared.ops.errors import OpsError
from shared.ops.models import (
    BulkActRequest,
    BulkActResult,
    BulkPreview,
    BulkPreviewRequest,
    RunsQuery,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from pydantic import BaseModel


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
    "cancel": BulkAction(
        "cancel",
        "cancelled",
        "running run(s)",
        "Each stops: pending and parked steps are skipped, a running step finishes its attempt.",
        "runs.cancel",
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


def preview(call: Callable[..., BaseModel], action: str, query: RunsQuery) -> BulkPreview:
    """The API's preview (`bulk.preview`) for the page's filters: the token and what it names."""
    listed = call(
        "bulk.preview",
        body=BulkPreviewRequest(
            action=action,
            workflow_id=query.workflow_id,
            record_key=query.record_key,
            created_after=query.created_after,
            created_before=query.created_before,
            event_type=query.event_type,
            reason=f"bulk {ACTIONS[action].verb} from the ops page",
        ),
    )
    assert isinstance(listed, BulkPreview)
    return listed


def preview_redrive(call: Callable[..., BaseModel]) -> BulkPreview:
    """The API's preview of the Pub/Sub dead letters (admins only)."""
    listed = call("bulk.preview", body=BulkPreviewRequest(action="redrive"))
    assert isinstance(listed, BulkPreview)
    return listed


def perform_raw(call: Callable[..., BaseModel], token: str) -> BulkActResult:
    """The API's act (`bulk.act`) on a preview's token."""
    try:
        body = BulkActRequest(token=token)
    except ValueError:
        raise OpsError(404, "not_found", "there is no such bulk preview") from None
    result = call("bulk.act", body=body)
    assert isinstance(result, BulkActResult)
    return result


def perform(call: Callable[..., BaseModel], token: str) -> list[Outcome]:
    """The API's act on a preview's token, worded for the page."""
    result = perform_raw(call, token)
    return [
        Outcome(o.target, True, o.message, f"/ui/runs/{o.run_id or o.target}")
        if o.ok and result.action != "requeue_inbox"
        else Outcome(o.target, o.ok, "back in the drain" if o.ok else o.message)
        for o in result.outcomes
    ]
