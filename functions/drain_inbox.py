"""`drain_inbox` entry point (Cloud Scheduler, once a minute): the safety net of the inbox.

It drains until nothing is claimable, publishes what it committed right after (then the
outbox is empty) and ends, so an idle tick lasts two claim queries; stored
webhooks are drained at once by the webhook's nudge, and this tick takes what that missed (a
row whose nudge died, a row whose retry backoff came due). `DRAIN_BUDGET_SECONDS` (default
50, under the 60 s schedule and timeout) bounds a tick that finds a backlog.
"""

from __future__ import annotations

import json
from typing import Any

import functions_framework

from shared.core.db import get_database
from shared.core.errors import TransientError
from shared.core.logs import get_logger, labelled, traced
from shared.core.settings import settings
from shared.ingest.inbox import drain_and_publish

log = get_logger(__name__)


@functions_framework.http
def drain_inbox(request: Any) -> tuple[str, int, dict[str, str]]:
    budget = settings().drain_budget_seconds
    with traced(request.headers), labelled(function="drain_inbox"):
        try:
            report, _ = drain_and_publish(get_database(), budget_seconds=budget)
        except TransientError as exc:
            log.warning("drain_inbox stopped early: %s", exc)
            return json.dumps({"error": "unavailable"}), 503, {"Content-Type": "application/json"}
        log.info("drain_inbox done", extra={"labels": {"report": json.dumps(report.as_dict())}})
    return json.dumps(report.as_dict()), 200, {"Content-Type": "application/json"}
