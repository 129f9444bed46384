"""`advance_step` entry point: Pub/Sub `step-ready` → advance one step.

Returns normally (ack) for everything recorded — a step that wasn't claimable, a failed step,
a poisoned message; raises only on transient infrastructure errors so Pub/Sub redelivers.
Deployed with a 300 s timeout; the lease (600 s) and heartbeat (60 s) are sized to it, see
`shared/steps/claim.py`.
"""

from __future__ import annotations

from typing import Any

import functions_framework

from shared.core import tracing
from shared.core.db import get_database
from shared.core.logs import labelled
from shared.steps.advance import advance_from_message


@functions_framework.cloud_event
def advance_step(event: Any) -> None:
    with labelled(function="advance_step"), tracing.message_span("advance_step", event.data):
        advance_from_message(get_database(), event.data, message_id=event["id"])
