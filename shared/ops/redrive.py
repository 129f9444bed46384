"""Redrive Pub/Sub dead letters: messages the push subscriptions gave up on (after
`max_delivery_attempts`) wait on the dead-letter topics' hold subscriptions; once the cause is
fixed, an admin publishes them again to the topic they came from.

Messages carry only an event or step id, and every consumer makes a redelivery harmless
(admission claims, conditional step claims), so the order is publish, then acknowledge: a
crash in between only publishes a message twice, never loses one. Repeating a redrive finds
the holds empty. The holds are machinery shared by every tenant, so only an admin token may
look at or redrive them (the health view shows their counts to admins too).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from shared.core.errors import TransientError
from shared.core.pubsub import STEP_READY, TRIGGER_EVENTS, get_publisher

# The hold subscription of each dead-letter topic (infra/pubsub.tf) → the topic to redrive to.
DEAD_LETTER_HOLDS = {
    "trigger-events-dead-letter-hold": TRIGGER_EVENTS,
    "step-ready-dead-letter-hold": STEP_READY,
}
MAX_PER_HOLD = 500
PULL_TIMEOUT_SECONDS = 5.0


@dataclass(frozen=True)
class HoldCount:
    subscription: str
    topic: str
    messages: int
    ids: list[str]


def _subscriber() -> Any:
    from google.cloud import pubsub_v1  # type: ignore[attr-defined]

    return pubsub_v1.SubscriberClient()


def _pull(subscriber: Any, path: str, limit: int) -> list[Any]:
    from google.api_core import exceptions

    try:
        response = subscriber.pull(
            request={"subscription": path, "max_messages": limit}, timeout=PULL_TIMEOUT_SECONDS
        )
    except exceptions.DeadlineExceeded:
        return []
    except exceptions.GoogleAPIError as exc:
        raise TransientError(f"could not read {path}: {exc}") from exc
    return list(response.received_messages)


def _body(data: bytes) -> dict[str, Any] | None:
    try:
        body = json.loads(data)
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def _id_of(data: bytes) -> str:
    body = _body(data) or {}
    return str(body.get("event_id") or body.get("step_id") or "?")


def peek(limit: int = MAX_PER_HOLD) -> list[HoldCount]:
    """What waits on each hold (up to `limit`), left there: pulled, then handed back."""
    subscriber = _subscriber()
    project = get_publisher().project
    out = []
    try:
        for hold, topic in DEAD_LETTER_HOLDS.items():
            path = f"projects/{project}/subscriptions/{hold}"
            received = _pull(subscriber, path, limit)
            if received:
                subscriber.modify_ack_deadline(
                    request={
                        "subscription": path,
                        "ack_ids": [r.ack_id for r in received],
                        "ack_deadline_seconds": 0,
                    }
                )
            out.append(
                HoldCount(hold, topic, len(received), [_id_of(r.message.data) for r in received])
            )
    finally:
        subscriber.close()
    return out


def target_of(hold: str, data: bytes) -> str:
    """How a bulk preview names one held message: its hold and its event or step id."""
    return f"{hold}:{_id_of(data)}"


def redrive(limit: int = MAX_PER_HOLD, only: frozenset[str] | None = None) -> list[HoldCount]:
    """Publish what waits on each hold back to its topic, then acknowledge it there. `only`:
    the messages a bulk preview listed (`target_of`); any other is handed back untouched."""
    subscriber = _subscriber()
    publisher = get_publisher()
    out = []
    try:
        for hold, topic in DEAD_LETTER_HOLDS.items():
            path = f"projects/{publisher.project}/subscriptions/{hold}"
            pulled = _pull(subscriber, path, limit)
            # A message that is not one of ours (not a JSON object) stays on the hold, and so
            # does one the preview did not list.
            received = [
                r
                for r in pulled
                if _body(r.message.data)
                and (only is None or target_of(hold, r.message.data) in only)
            ]
            left = [r for r in pulled if r not in received]
            if left:
                subscriber.modify_ack_deadline(
                    request={
                        "subscription": path,
                        "ack_ids": [r.ack_id for r in left],
                        "ack_deadline_seconds": 0,
                    }
                )
            if received:
                publisher.publish_many(topic, [_body(r.message.data) or {} for r in received])
                subscriber.acknowledge(
                    request={"subscription": path, "ack_ids": [r.ack_id for r in received]}
                )
            out.append(
                HoldCount(hold, topic, len(received), [_id_of(r.message.data) for r in received])
            )
    finally:
        subscriber.close()
    return out
