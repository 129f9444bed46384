"""The seven functions of the bundle, as one table.

`main.py`, `infra/`, the local stack (`devstack/`) and the tests all read this table, so a
function cannot exist in one place and be missing from another without a test failing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from shared.core.db import pool_size_for

Trigger = Literal["http", "pubsub", "schedule"]

# Requests one instance of a request-fed function serves at once (Cloud Run's
# max_instance_request_concurrency, gunicorn's THREADS). Chosen from `make bench-concurrency`
# (devstack/bench/concurrency.py): see the figures there and in infra/README.md, "Capacity".
REQUEST_CONCURRENCY = 8


@dataclass(frozen=True)
class Deployable:
    name: str  # also the entry point name exported by main.py
    trigger: Trigger
    public: bool = False  # only `webhook` may be invoked without IAM
    topic: str | None = None  # for pubsub-triggered functions
    uses_database: bool = True
    # Requests per instance. The scheduled functions keep 1: the scheduler sends one request
    # a minute and a pass already works through its whole batch, so a second request in the
    # same instance would only compete with the first for the same rows and connections.
    concurrency: int = 1

    @property
    def pool_size(self) -> int:
        """DB_POOL_SIZE of an instance: enough that no request waits for a connection."""
        return pool_size_for(self.concurrency)


DEPLOYABLES: tuple[Deployable, ...] = (
    Deployable("webhook", "http", public=True, concurrency=REQUEST_CONCURRENCY),
    Deployable("drain_inbox", "schedule"),
    Deployable("publish_outbox", "schedule"),
    Deployable("admit_event", "pubsub", topic="trigger-events", concurrency=REQUEST_CONCURRENCY),
    Deployable("advance_step", "pubsub", topic="step-ready", concurrency=REQUEST_CONCURRENCY),
    Deployable("sweep", "schedule"),
    Deployable("ops", "http", concurrency=REQUEST_CONCURRENCY),
)

TOPICS: tuple[str, ...] = ("trigger-events", "step-ready")

# The functions that act on a portal with its connection's CRM token: CRM blocks
# (advance_step), polls and the hourly subscription reconcile (sweep), reconciles on
# activation and search (ops). With an OAuth connection they are also the ones that refresh
# the token (infra/ wires the secrets from these; tests/test_infra.py checks it).
CRM_TOKEN_USERS: tuple[str, ...] = ("advance_step", "sweep", "ops")
# Who uses a public app's OAuth client and the token-encryption key: the token users, which
# refresh grants, and `webhook`, the one public function, which serves HubSpot's redirect back
# from an install (shared/ops/install_callback.py): it exchanges the code and seals the
# grant.
OAUTH_CLIENT_USERS: tuple[str, ...] = ("webhook", *CRM_TOKEN_USERS)


def by_name(name: str) -> Deployable:
    for d in DEPLOYABLES:
        if d.name == name:
            return d
    raise KeyError(name)
