"""Pub/Sub in and out: publishing ids after commit, and reading them from push deliveries.

Messages carry ids, never payloads (a redelivered message always reads the current row):
`trigger-events` carries `{"event_id": <int>}`, `step-ready` carries `{"step_id": "<uuid>"}`.
Locally `PUBSUB_EMULATOR_HOST` points the client at the emulator; the project comes from
`GOOGLE_CLOUD_PROJECT`.
"""

from __future__ import annotations

import base64
import binascii
import json
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from shared.core import tracing
from shared.core.errors import PermanentError, TransientError
from shared.core.settings import settings

TRIGGER_EVENTS = "trigger-events"
STEP_READY = "step-ready"
PUBLISH_TIMEOUT_SECONDS = 30.0
# Pub/Sub's limit per Publish request (and 10 MB; our messages are ids of a few dozen bytes).
MAX_MESSAGES_PER_REQUEST = 1000


class Publisher:
    """A thin wrapper over google-cloud-pubsub's PublisherClient, created on first use."""

    def __init__(self, project: str | None = None) -> None:
        self.project = project or settings().google_cloud_project or "onceflow-local"
        self._client: Any = None
        self._lock = threading.Lock()

    def _get_client(self) -> Any:
        with self._lock:
            if self._client is None:
                from google.cloud import pubsub_v1  # type: ignore[attr-defined]

                self._client = pubsub_v1.PublisherClient()
            return self._client

    def topic_path(self, topic: str) -> str:
        return f"projects/{self.project}/topics/{topic}"

    def publish_many(self, topic: str, messages: Iterable[Mapping[str, Any]]) -> list[str]:
        """Publish every message and wait for the answer; the message ids, in order.

        One synchronous Publish request per `MAX_MESSAGES_PER_REQUEST` messages, not the client
        library's batching publish(): that one holds each message up to its 10 ms batching
        latency, then commits every batch on a thread of its own and resolves a future per
        message. Every caller here already has all its messages in hand and waits for all of
        them, so the batching bought a hop's worth of latency and a thread per batch on every
        dispatch (admission, each step, the outbox) and nothing else.

        Raises TransientError if any publish failed: the caller must not mark anything as
        published in that case (a later attempt publishes again; duplicates are harmless
        downstream, losses are not)."""
        from google.pubsub_v1 import PubsubMessage
        from google.pubsub_v1.services.publisher import PublisherClient as GapicPublisher

        client = self._get_client()
        path = self.topic_path(topic)
        bodies = [json.dumps(dict(m), separators=(",", ":")).encode() for m in messages]
        attributes = tracing.message_attributes()  # {} unless published inside a span
        ids: list[str] = []
        for start in range(0, len(bodies), MAX_MESSAGES_PER_REQUEST):
            chunk = bodies[start : start + MAX_MESSAGES_PER_REQUEST]
            try:
                # The GAPIC method the library's client inherits (its own `publish` is the
                # batching one); its default retry covers UNAVAILABLE and the like.
                answer = GapicPublisher.publish(
                    client,
                    topic=path,
                    messages=[PubsubMessage(data=body, attributes=attributes) for body in chunk],
                    timeout=PUBLISH_TIMEOUT_SECONDS,
                )
            except Exception as exc:
                raise TransientError(
                    f"{len(bodies) - len(ids)} of {len(bodies)} publishes to {topic} failed: "
                    f"{exc!r}"
                ) from exc
            ids += list(answer.message_ids)
        return ids


_publisher: Publisher | None = None
_publisher_lock = threading.Lock()


def get_publisher() -> Publisher:
    """The process-wide publisher (reused across invocations of a warm instance)."""
    global _publisher  # noqa: PLW0603
    with _publisher_lock:
        if _publisher is None:
            _publisher = Publisher()
        return _publisher


def set_publisher(publisher: Publisher | None) -> None:
    """Replace the process-wide publisher (tests point it at a specific emulator project)."""
    global _publisher  # noqa: PLW0603
    with _publisher_lock:
        _publisher = publisher


def publish_step_ready(step_ids: Iterable[str]) -> None:
    """Dispatch steps after their rows committed. A lost publish is repaired by the sweep."""
    ids = list(step_ids)
    if ids:
        get_publisher().publish_many(STEP_READY, [{"step_id": s} for s in ids])


def publish_trigger_events(event_ids: Iterable[int]) -> None:
    ids = list(event_ids)
    if ids:
        get_publisher().publish_many(TRIGGER_EVENTS, [{"event_id": e} for e in ids])


def decode_push_message(cloud_event_data: Any) -> dict[str, Any]:
    """The JSON object inside a Pub/Sub message delivered as a CloudEvent's data.

    functions-framework turns a push body `{"message": {"data": b64, …}, "subscription": …}`
    into a CloudEvent whose data is `{"message": {…}}`. Raises PermanentError for anything
    malformed: such a message can never succeed, so the caller records it and acks."""
    if not isinstance(cloud_event_data, Mapping):
        raise PermanentError("CloudEvent data is not an object")
    message = cloud_event_data.get("message")
    if not isinstance(message, Mapping):
        raise PermanentError("CloudEvent data has no Pub/Sub message")
    raw = message.get("data")
    if not isinstance(raw, str):
        raise PermanentError("Pub/Sub message has no data")
    try:
        decoded = json.loads(base64.b64decode(raw, validate=True))
    except (binascii.Error, ValueError) as exc:
        raise PermanentError(f"Pub/Sub message data is not base64 JSON: {exc}") from exc
    if not isinstance(decoded, dict):
        raise PermanentError("Pub/Sub message data is not a JSON object")
    return decoded
