"""`advance_step` entry point (placeholder until its issue lands)."""

from typing import Any

import functions_framework


@functions_framework.cloud_event
def advance_step(event: Any) -> None:
    raise NotImplementedError("advance_step is not built yet")
