"""`sweep` entry point (Cloud Scheduler, once a minute).

It passes while work is due and ends when nothing is due before `SWEEP_BUDGET_SECONDS`
(default 50, under the 60 s schedule and timeout) runs out (shared/sweep/loop.py). After each
pass it publishes the trigger events the pass committed (cron ticks, poll hits, re-queued
undecided events) instead of leaving them to the next `publish_outbox` tick.
"""

from __future__ import annotations

import json
from typing import Any

import functions_framework

from shared.core.db import get_database
from shared.core.logs import labelled, traced
from shared.core.settings import settings
from shared.sweep.loop import publish_committed_events, run_sweep


@functions_framework.http
def sweep(request: Any) -> tuple[str, int, dict[str, str]]:
    budget = settings().sweep_budget_seconds
    with traced(request.headers), labelled(function="sweep"):
        report = run_sweep(
            get_database(), budget_seconds=budget, publish_events=publish_committed_events
        )
    return json.dumps(report.as_dict(), default=str), 200, {"Content-Type": "application/json"}
