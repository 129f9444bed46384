"""One CRM under test, whichever provider it is: its fake over real HTTP, a connection of
TENANT to it, a create the provider accepts, and its faults by what they do. Tests that hold for
every CRM (at most once, a refusal's mark withdrawn, a lost answer) take `crm_under_test`,
parametrised over the providers with a fake: HubSpot (devstack/fakecrm) and Pipedrive
(devstack/fakepipedrive)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from devstack import seed
from devstack.fakecrm import FakeCrmConfig
from devstack.fakepipedrive import DeliveryPolicy, FakePipedrive, FakePipedriveConfig
from shared.core.db import Database
from shared.providers import connect
from shared.providers.hubspot import versions
from tests.blocks_support import fake_crm, seed_connection, seed_tenant
from tests.steps_support import TENANT

PROVIDERS = ("hubspot", "pipedrive")


@dataclass
class CrmUnderTest:
    provider: str
    connection_id: str
    create: dict[str, Any]  # a crm.create config the provider accepts
    records: Callable[[], list[dict[str, Any]]]  # the records of the create's object type
    creates_sent: Callable[[], int]  # create requests the fake received
    drop_next_create: Callable[[], None]  # applied, then the answer is lost
    rate_limit_next: Callable[[], None]  # a 429
    rate_limit_wait: float  # what that 429's headers say to wait
    fail_next: Callable[[], None]  # a 500


def _hubspot(monkeypatch: pytest.MonkeyPatch, db: Database) -> Iterator[CrmUnderTest]:
    with fake_crm(monkeypatch, FakeCrmConfig(token="tok")) as fake:
        seed_tenant(db, credits=100)

        def drop_next_create() -> None:
            fake.add_fault(
                action="drop_after_commit", method="POST", path=versions.crm_objects("tasks") + "$"
            )

        def rate_limit_next() -> None:
            fake.add_fault(action="rate_limit", retry_after=3)

        def fail_next() -> None:
            fake.add_fault(action="error_500")

        yield CrmUnderTest(
            provider="hubspot",
            connection_id=seed_connection(db, fake.url),
            # HubSpot refuses a task without hs_timestamp
            # (https://developers.hubspot.com/docs/api/crm/tasks).
            create={
                "object_type": "tasks",
                "properties": {
                    "hs_task_subject": "Call Ada",
                    "hs_timestamp": "2026-12-03T10:00:00Z",
                },
            },
            records=lambda: fake.records("tasks"),
            creates_sent=lambda: len(
                [r for r in fake.state()["requests"] if r["method"] == "POST"]
            ),
            drop_next_create=drop_next_create,
            rate_limit_next=rate_limit_next,
            rate_limit_wait=3,
            fail_next=fail_next,
        )


def _pipedrive(monkeypatch: pytest.MonkeyPatch, db: Database) -> Iterator[CrmUnderTest]:
    monkeypatch.setenv("PIPEDRIVE_TOKEN", "pd-api-token")
    connect.forget_ports()
    fake = FakePipedrive(FakePipedriveConfig(delivery=DeliveryPolicy(time_factor=0.01))).start()
    try:
        seed_tenant(db, credits=100)
        with db.transaction() as tx:
            connection_id = seed.connection(
                tx,
                TENANT,
                provider="pipedrive",
                webhook_secret_env="PIPEDRIVE_CREDENTIALS",
                api_credentials_env="PIPEDRIVE_TOKEN",
                api_base_url=fake.url,
            )

        def drop_next_create() -> None:
            fake.add_fault("drop_after_commit", method="POST", path="/api/v2/deals$")

        def rate_limit_next() -> None:
            fake.add_fault("rate_limit")

        def fail_next() -> None:
            fake.add_fault("error_500")

        yield CrmUnderTest(
            provider="pipedrive",
            connection_id=connection_id,
            create={"object_type": "deals", "properties": {"title": "Call Ada"}},
            records=lambda: fake.stored("deal"),
            creates_sent=lambda: len([r for r in fake.requests if r["method"] == "POST"]),
            drop_next_create=drop_next_create,
            # The fake's 429 carries its burst window's x-ratelimit-reset: 2 s (no Retry-After).
            rate_limit_next=rate_limit_next,
            rate_limit_wait=2,
            fail_next=fail_next,
        )
    finally:
        fake.stop()
        connect.forget_ports()


@pytest.fixture(params=PROVIDERS)
def crm_under_test(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, db: Database
) -> Iterator[CrmUnderTest]:
    make = {"hubspot": _hubspot, "pipedrive": _pipedrive}[request.param]
    yield from make(monkeypatch, db)
