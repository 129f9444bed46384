"""`advance_step` entry point: Pub/Sub `step-ready` → advance one step.

Returns normally (ack) for everything recorded — a step that wasn't claimable, a failed step,
a poisoned message; raises only on transient infrastructure errors so Pub/Sub redelivers.
Deployed with a 300 s timeout; the lease (600 s) and heartbeat (60 s) are sized to it, see
`shared/steps/claim.py`.

When the step ended its run, the statement that ended it handed the run's keyed-concurrency
slot (if it held one) to the next waiting run of its key; that run is started here, right
after (shared/admission/concurrency.py). A failure here is left to the sweep's repair: the
step is settled and must be acked.
"""

from __future__ import annotations

from typing import Any

import functions_framework

from shared.admission.concurrency_start import after_run_ended
from shared.core import tracing
from shared.core.db import get_database
from shared.core.logs import labelled
from shared.core.pubsub import publish_step_ready
from shared.steps.advance import advance_from_message


@functions_framework.cloud_event
def advance_step(event: Any) -> None:
    with labelled(function="advance_step"), tracing.message_span("advance_step", event.data):
        db = get_database()
        advanced = advance_from_message(db, event.data, message_id=event["id"])
        if advanced is not None and advanced.run_status not in (None, "running"):
            after_run_ended(db, publish_step_ready)
