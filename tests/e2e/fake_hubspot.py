"""The stack's fake CRM as the HubSpot of an end-to-end test.

The stack starts `devstack.fakecrm` as one public app (`FAKE_APP_ID`, webhooks signed with the
secret in `SECRET_ENV`). `app_delivery` registers that app, points the fake at the app's one
webhook URL (`/hubspot/app/{appId}`) in its realistic delivery mode (10 concurrent requests,
shuffled, batches of several portals merged, some sent twice, some acknowledged ones sent again
with attemptNumber + 1, refused ones retried up to 10 times; devstack/fakecrm/webhooks.py), and
afterwards waits for the fake to be idle and puts it back as the stack left it, so the next
test of the session starts from the same fake.

Changes are made through the fake's admin API as a person in a portal would make them; the
fake sends the webhooks.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from devstack.seed import hubspot_app
from devstack.stack import RunningStack
from shared.core.db import Database

FAKE_APP_ID = "424242"  # devstack.fakecrm's default app id, which the stack runs it with
SECRET_ENV = "ONCEFLOW_DEMO_HUBSPOT_APP_SECRET"  # the stack hands it to the fake and webhook
FLUSH_SECONDS = 60.0


class FakeHubSpot:
    def __init__(self, stack: RunningStack, app_url: str) -> None:
        self.base = stack.url("fakecrm")
        self.app_url = app_url
        self._client = httpx.Client(base_url=self.base, timeout=10)

    def configure(self, **config: Any) -> dict[str, Any]:
        answer = self._client.post("/_admin/config", json=config)
        answer.raise_for_status()
        return dict(answer.json())

    def silent(self) -> None:
        """Changes from now on send no webhook (setting records up before the test)."""
        self.configure(webhook_url="")

    def deliver(self, *, unique_event_ids: bool = True) -> None:
        """Changes from now on reach the app's URL, realistically."""
        self.configure(
            webhook_url=self.app_url, delivery="realistic", unique_event_ids=unique_event_ids
        )

    def create_contact(self, portal: int, properties: dict[str, str]) -> str:
        made = self._client.post(
            "/_admin/records/contacts", json={"properties": properties, "portal_id": portal}
        )
        assert made.status_code == 201, made.text
        return str(made.json()["id"])

    def update_contact(self, portal: int, contact_id: str, properties: dict[str, str]) -> None:
        changed = self._client.patch(
            f"/_admin/records/contacts/{contact_id}",
            json={"properties": properties, "portal_id": portal},
        )
        assert changed.status_code == 200, changed.text

    def flush(self, timeout: float = FLUSH_SECONDS) -> bool:
        """Wait until every webhook the fake owes was acknowledged or given up on."""
        answer = self._client.post(
            "/_admin/webhooks/flush", json={"timeout": timeout}, timeout=timeout + 5
        )
        return bool(answer.json()["idle"])

    def deliveries(self) -> list[dict[str, Any]]:
        """Every webhook request the fake made this session (url, attempt, events, status)."""
        return list(self._client.get("/_admin/state").json()["webhooks"])

    def close(self) -> None:
        self._client.close()


@contextmanager
def app_delivery(stack: RunningStack, db: Database) -> Iterator[FakeHubSpot]:
    """The fake, registered as a HubSpot app of onceflow, silent until `deliver()`."""
    path = hubspot_app(db, app_id=FAKE_APP_ID, secret_env=SECRET_ENV)
    fake = FakeHubSpot(stack, f"{stack.url('webhook')}/{path}")
    fake.silent()
    try:
        yield fake
    finally:
        fake.flush()
        fake.configure(webhook_url=stack.url("webhook"), delivery="serial", unique_event_ids=True)
        fake.close()
