"""`publish_outbox` entry point (Cloud Scheduler, once a minute): the safety net of the outbox.

It publishes until nothing is claimable and ends, so an idle tick lasts one claim query.
Whoever commits events publishes them right after the commit; this tick sends what a crash
between that commit and its publish left behind (and events the sweep put back).
`PUBLISH_BUDGET_SECONDS` (default 50, under the 60 s schedule and timeout) bounds a tick
that finds a backlog.
"""

from __future__ import annotations

import json
from typing import Any

import functions_framework

from shared.core.db import get_database
from shared.core.errors import TransientError
from shared.core.logs import get_logger, labelled, traced
from shared.core.settings import settings
from shared.ingest.outbox import publish_outbox as publish

log = get_logger(__name__)


@functions_framework.http
def publish_outbox(request: Any) -> tuple[str, int, dict[str, str]]:
    budget = settings().publish_budget_seconds
    with traced(request.headers), labelled(function="publish_outbox"):
        try:
            report = publish(get_database(), budget_seconds=budget, until_empty=True)
        except TransientError as exc:
            log.warning("publish_outbox stopped early: %s", exc)
            return json.dumps({"error": "unavailable"}), 503, {"Content-Type": "application/json"}
        log.info("publish_outbox done", extra={"labels": {"report": json.dumps(report.as_dict())}})
    status = 503 if report.failed_batches and not report.published else 200
    return json.dumps(report.as_dict()), status, {"Content-Type": "application/json"}
