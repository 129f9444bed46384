"""`publish_outbox` entry point (Cloud Scheduler, once a minute; loops inside its invocation).

`PUBLISH_BUDGET_SECONDS` (default 50, for a 60 s schedule and timeout) bounds the loop.
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
            report = publish(get_database(), budget_seconds=budget)
        except TransientError as exc:
            log.warning("publish_outbox stopped early: %s", exc)
            return json.dumps({"error": "unavailable"}), 503, {"Content-Type": "application/json"}
        log.info("publish_outbox done", extra={"labels": {"report": json.dumps(report.as_dict())}})
    status = 503 if report.failed_batches and not report.published else 200
    return json.dumps(report.as_dict()), status, {"Content-Type": "application/json"}
