"""The bundle's single source file for functions-framework and the Cloud Run buildpack.

Every function deploys from this one file with its own `entry_point`. The runtime adds only
this file's folder to `sys.path`; because it sits at the source root beside `shared/` and
`functions/`, both import as top-level packages in the cloud exactly as they do locally.
"""

from functions.admit_event import admit_event
from functions.advance_step import advance_step
from functions.drain_inbox import drain_inbox
from functions.ops import ops
from functions.publish_outbox import publish_outbox
from functions.sweep import sweep
from functions.webhook import webhook

__all__ = [
    "admit_event",
    "advance_step",
    "drain_inbox",
    "ops",
    "publish_outbox",
    "sweep",
    "webhook",
]
