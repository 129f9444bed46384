"""The real Pub/Sub emulator for tests: one process per test session, one project per test.

tests/conftest.py registers this module as a plugin, so any test asks for the fixtures by
name (`pubsub_emulator`, `pubsub`) without importing them:

    def test_something(pubsub):
        ...publish through shared.core.pubsub.get_publisher()...
        assert pubsub.pull_ids("trigger-events", count=3) == [...]

`pubsub_emulator` (session) starts `cloud-pubsub-emulator --host=127.0.0.1 --port=<free>`,
sets `PUBSUB_EMULATOR_HOST` for the session and stops the emulator (its whole process group)
at the end. `pubsub` (per test) makes a fresh project — the emulator keeps state in memory
per project, so tests can't see each other's messages — creates every topic in
`shared.core.deployables.TOPICS` with a pull subscription `<topic>-test`, and points
`shared.core.pubsub.get_publisher()` at that project for the test.
"""

from __future__ import annotations

import base64
import json
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from google.api_core.exceptions import DeadlineExceeded

from devstack import emulator
from shared.core import pubsub as pubsub_mod
from shared.core.deployables import TOPICS


@dataclass(frozen=True)
class Emulator:
    host: str
    log_path: Path


@dataclass
class PubsubProject:
    """One emulator project with every topic and a pull subscription `<topic>-test` each."""

    project: str
    _clients: dict[str, Any] = field(default_factory=dict)

    def _publisher(self) -> Any:
        if "publisher" not in self._clients:
            from google.cloud import pubsub_v1

            self._clients["publisher"] = pubsub_v1.PublisherClient()
        return self._clients["publisher"]

    def _subscriber(self) -> Any:
        if "subscriber" not in self._clients:
            from google.cloud import pubsub_v1

            self._clients["subscriber"] = pubsub_v1.SubscriberClient()
        return self._clients["subscriber"]

    def topic_path(self, topic: str) -> str:
        return f"projects/{self.project}/topics/{topic}"

    def subscription_path(self, subscription: str) -> str:
        return f"projects/{self.project}/subscriptions/{subscription}"

    def create_topic(self, topic: str) -> None:
        self._publisher().create_topic(name=self.topic_path(topic))

    def create_subscription(self, subscription: str, topic: str, **extra: Any) -> None:
        self._subscriber().create_subscription(
            request={
                "name": self.subscription_path(subscription),
                "topic": self.topic_path(topic),
                **extra,
            }
        )

    def pull(
        self, topic: str, *, count: int, timeout: float = 10.0, subscription: str | None = None
    ) -> list[dict[str, Any]]:
        """Pull and ack until `count` messages arrived or `timeout` passed; decoded JSON."""
        path = self.subscription_path(subscription or f"{topic}-test")
        subscriber = self._subscriber()
        out: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout
        while len(out) < count and (left := deadline - time.monotonic()) > 0:
            # The emulator holds a pull that finds nothing open for ~4 s whatever is asked
            # for; the call's own deadline is what keeps `timeout` (and `drain`'s quiet
            # seconds) the caller's.
            try:
                response = subscriber.pull(
                    request={"subscription": path, "max_messages": 1000},
                    timeout=min(left, 5.0),
                    retry=None,
                )
            except DeadlineExceeded:
                continue
            acks = []
            for received in response.received_messages:
                out.append(json.loads(received.message.data))
                acks.append(received.ack_id)
            if acks:
                subscriber.acknowledge(request={"subscription": path, "ack_ids": acks})
            else:
                time.sleep(0.05)
        return out

    def drain(self, topic: str, *, quiet_seconds: float = 0.5) -> list[dict[str, Any]]:
        """Every message until none arrives for `quiet_seconds` (to assert on duplicates)."""
        out: list[dict[str, Any]] = []
        while True:
            got = self.pull(topic, count=1, timeout=quiet_seconds)
            if not got:
                return out
            out.extend(got)

    def pull_ids(self, topic: str, *, count: int, timeout: float = 10.0) -> list[Any]:
        key = "event_id" if topic == "trigger-events" else "step_id"
        return [m.get(key) for m in self.pull(topic, count=count, timeout=timeout)]

    def close(self) -> None:
        for client in self._clients.values():
            transport = getattr(client, "transport", None) or getattr(client, "api", None)
            close = getattr(client, "close", None) or getattr(transport, "close", None)
            if callable(close):
                close()


def decode_data(b64: str) -> Any:
    return json.loads(base64.b64decode(b64))


@pytest.fixture(scope="session", name="pubsub_emulator")
def pubsub_emulator_fixture() -> Iterator[Emulator]:
    log_path = Path(tempfile.mkstemp(prefix="onceflow-pubsub-", suffix=".log")[1])
    try:
        with emulator.running(log_path) as host, pytest.MonkeyPatch.context() as mp:
            mp.setenv("PUBSUB_EMULATOR_HOST", host)
            yield Emulator(host, log_path)
    finally:
        log_path.unlink(missing_ok=True)


@pytest.fixture(name="pubsub")
def pubsub_fixture(
    pubsub_emulator: Emulator, monkeypatch: pytest.MonkeyPatch
) -> Iterator[PubsubProject]:
    project = PubsubProject(f"test-{uuid.uuid4().hex[:12]}")
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", project.project)
    for topic in TOPICS:
        project.create_topic(topic)
        project.create_subscription(f"{topic}-test", topic)
    publisher = pubsub_mod.Publisher(project.project)
    pubsub_mod.set_publisher(publisher)
    try:
        yield project
    finally:
        pubsub_mod.set_publisher(None)
        project.close()
