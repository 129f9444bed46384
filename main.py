"""The bundle's single source file for functions-framework and the Cloud Run buildpack.

Every function deploys from this one file with its own `entry_point`. The runtime adds only
this file's folder to `sys.path`; because it sits at the source root beside `shared/` and
`functions/`, both import as top-level packages in the cloud exactly as they do locally.

Each instance imports only its own entry point: functions-framework asks this module for the
target by name (`hasattr`, then `getattr`), and the module-level `__getattr__` (PEP 562)
imports `functions.<name>` then. A `webhook` cold start — the one a CRM's delivery timeout
waits on — no longer imports admission, the step engine and the ops API with it.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

ENTRY_POINTS = (
    "admit_event",
    "advance_step",
    "drain_inbox",
    "ops",
    "publish_outbox",
    "sweep",
    "webhook",
)
__all__ = list(ENTRY_POINTS)


def __getattr__(name: str) -> Any:
    if name in ENTRY_POINTS:
        return getattr(import_module(f"functions.{name}"), name)
    raise AttributeError(f"module 'main' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *ENTRY_POINTS])
