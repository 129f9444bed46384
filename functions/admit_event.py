"""`admit_event` entry point (placeholder until its issue lands)."""

from typing import Any

import functions_framework


@functions_framework.cloud_event
def admit_event(event: Any) -> None:
    raise NotImplementedError("admit_event is not built yet")
