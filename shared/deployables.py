"""The seven functions of the bundle, as one table.

`main.py`, `infra/`, the local stack (`devstack/`) and the tests all read this table, so a
function cannot exist in one place and be missing from another without a test failing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Trigger = Literal["http", "pubsub", "schedule"]


@dataclass(frozen=True)
class Deployable:
    name: str  # also the entry point name exported by main.py
    trigger: Trigger
    public: bool = False  # only `webhook` may be invoked without IAM
    topic: str | None = None  # for pubsub-triggered functions
    uses_database: bool = True


DEPLOYABLES: tuple[Deployable, ...] = (
    Deployable("webhook", "http", public=True),
    Deployable("drain_inbox", "schedule"),
    Deployable("publish_outbox", "schedule"),
    Deployable("admit_event", "pubsub", topic="trigger-events"),
    Deployable("advance_step", "pubsub", topic="step-ready"),
    Deployable("sweep", "schedule"),
    Deployable("ops", "http"),
)

TOPICS: tuple[str, ...] = ("trigger-events", "step-ready")

# The functions that act on a portal with its connection's CRM token: CRM blocks
# (advance_step), polls and the hourly subscription reconcile (sweep), reconciles on
# activation and search (ops). With an OAuth connection they are also the ones that refresh
# the token (infra/ wires the secrets from these; tests/test_infra.py checks it).
CRM_TOKEN_USERS: tuple[str, ...] = ("advance_step", "sweep", "ops")
# Who uses a public app's OAuth client and the token-encryption key: the token users, which
# refresh grants, and `webhook`, the one public function, which serves HubSpot's redirect back
# from an install (shared/oauth_install_http.py): it exchanges the code and seals the grant.
OAUTH_CLIENT_USERS: tuple[str, ...] = ("webhook", *CRM_TOKEN_USERS)


def by_name(name: str) -> Deployable:
    for d in DEPLOYABLES:
        if d.name == name:
            return d
    raise KeyError(name)
