"""`admit_event` entry point: Pub/Sub `trigger-events` → admit or refuse one run per binding.

Returns normally (ack) for admitted, refused and already-handled events and for poisoned
messages (recorded in poisoned_messages); raises only on transient errors, so Pub/Sub
redelivers exactly what may succeed later. See `shared/admission/admit.py`.
"""

from __future__ import annotations

from typing import Any

import functions_framework

from shared.admission.admit import admit_delivery
from shared.core import tracing
from shared.core.db import get_database
from shared.core.logs import labelled


@functions_framework.cloud_event
def admit_event(event: Any) -> None:
    with labelled(function="admit_event"), tracing.message_span("admit_event", event.data):
        admit_delivery(get_database(), event.data, message_id=event["id"])
