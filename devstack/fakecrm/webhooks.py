"""Signed webhooks, sent the way HubSpot sends them: a JSON array of events, POSTed with
`X-HubSpot-Signature-v3` = base64(HMAC-SHA256(app secret, method + uri + body + timestamp)) and
`X-HubSpot-Request-Timestamp` in milliseconds, beside the legacy v1 `X-HubSpot-Signature`
(hex SHA-256 of secret + body). Non-2xx answers are retried with `attemptNumber` bumped (and
re-signed, so a retry does not look like a duplicate).

Delivery modes (`DeliveryMode`), switchable at run time through `/_admin/config`:
- `serial` (the default): one batch at a time, in order, each once unless refused.
- `realistic`, what HubSpot documents (https://developers.hubspot.com/docs/api/webhooks,
  "Retries" and "Webhook settings"): up to 10 concurrent requests, no order guarantee (a
  seeded shuffle of what is waiting, plus concurrency), retried up to 10 times, and now and
  then a batch delivered twice as-is or redelivered with `attemptNumber` + 1 although it was
  acknowledged (what a lost acknowledgement looks like from the receiving side). Waiting
  batches are merged into one request (HubSpot sends up to 100 events per request, of every
  portal that installed the app), so one request can mix portals and even repeat an event.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from devstack.fakecrm.store import Store, now_ms

MAX_ATTEMPTS = 4


@dataclass(frozen=True)
class DeliveryMode:
    name: str = "serial"
    concurrency: int = 1  # HubSpot's maxConcurrentRequests defaults to 10
    shuffle: bool = False  # deliver waiting batches in a (seeded) random order
    max_attempts: int = MAX_ATTEMPTS  # HubSpot: up to 10 tries over 24 hours
    duplicate_every: int = 0  # every Nth batch is sent twice, byte-identical (0: never)
    redeliver_every: int = 0  # every Nth acknowledged batch comes again, attemptNumber + 1
    retry_delay_cap: float = 2.0
    merge_up_to: int = 1  # waiting batches merged into one request (events capped at 100)
    seed: int = 13

    @staticmethod
    def named(name: str) -> DeliveryMode:
        if name == "serial":
            return DeliveryMode()
        if name == "realistic":
            return DeliveryMode(
                name="realistic",
                concurrency=10,
                shuffle=True,
                max_attempts=10,
                duplicate_every=3,
                redeliver_every=4,
                retry_delay_cap=1.0,
                merge_up_to=4,
            )
        raise ValueError("delivery mode must be 'serial' or 'realistic'")


DELIVERY_MODES = ("serial", "realistic")


def sign_v3(secret: str, method: str, uri: str, body: bytes, timestamp_ms: int) -> str:
    """HubSpot's v3 signature: base64(HMAC-SHA256(secret, method + uri + body + timestamp))."""
    message = method.encode() + uri.encode() + body + str(timestamp_ms).encode()
    digest = hmac.new(secret.encode(), message, hashlib.sha256).digest()
    return base64.b64encode(digest).decode()


def property_change_body(
    *,
    event_id: int,
    portal_id: int,
    object_id: int,
    value: str,
    property_name: str = "lifecyclestage",
    occurred_ms: int | None = None,
    attempt: int = 0,
    object_type: str = "contact",
) -> bytes:
    """One HubSpot v3 `<object>.propertyChange` delivery (a batch of one), as HubSpot sends
    it: only the changed property, `attemptNumber` counting retries from 0."""
    import json
    import time

    return json.dumps(
        [
            {
                "eventId": event_id,
                "subscriptionId": 1,
                "portalId": portal_id,
                "appId": 1,
                "occurredAt": occurred_ms if occurred_ms is not None else int(time.time() * 1000),
                "subscriptionType": f"{object_type}.propertyChange",
                "attemptNumber": attempt,
                "objectId": object_id,
                "propertyName": property_name,
                "propertyValue": value,
                "changeSource": "CRM_UI",
                "sourceId": "userId:1",
            }
        ],
        separators=(",", ":"),
    ).encode()


def sign_v1(secret: str, body: bytes) -> str:
    """HubSpot's legacy v1 signature: hex SHA-256 of secret + body."""
    return hashlib.sha256(secret.encode() + body).hexdigest()


def signed_headers(secret: str, uri: str, body: bytes) -> dict[str, str]:
    """The headers of a signed webhook POST of `body` to `uri`, stamped now: v3, and the legacy
    v1 header HubSpot still sends beside it (its version header names the legacy one)."""
    ts = now_ms()
    return {
        "Content-Type": "application/json",
        "X-HubSpot-Request-Timestamp": str(ts),
        "X-HubSpot-Signature-v3": sign_v3(secret, "POST", uri, body, ts),
        "X-HubSpot-Signature": sign_v1(secret, body),
        "X-HubSpot-Signature-Version": "v1",
    }


class WebhookSender:
    """Background threads delivering event batches (see the module docstring for the modes),
    so API calls never wait on a webhook."""

    def __init__(
        self,
        store: Store,
        secret: Callable[[], str],
        url: Callable[[], str | None],
        mode: DeliveryMode | None = None,
    ) -> None:
        self._store = store
        self._secret = secret
        self._url = url
        self._cond = threading.Condition()
        self._waiting: list[tuple[list[dict[str, Any]], int]] = []  # (batch, first attempt)
        self._pending = 0  # waiting + in flight
        self._stopping = False
        self._enqueued = 0
        self._acknowledged = 0
        self.mode = mode or DeliveryMode()
        self._rng = random.Random(self.mode.seed)
        self._threads: list[threading.Thread] = []
        self._ensure_workers()

    def set_mode(self, mode: DeliveryMode) -> None:
        with self._cond:
            self.mode = mode
            self._rng = random.Random(mode.seed)
        self._ensure_workers()

    def _ensure_workers(self) -> None:
        # Workers are only added: a lower concurrency is enforced by `_take`.
        while len(self._threads) < self.mode.concurrency:
            index = len(self._threads)
            thread = threading.Thread(
                target=self._run, args=(index,), name=f"fakecrm-webhooks-{index}", daemon=True
            )
            self._threads.append(thread)
            thread.start()

    def enqueue(self, events: list[dict[str, Any]]) -> None:
        if not events or not self._url():
            return
        with self._cond:
            self._enqueued += 1
            copies = 2 if self._every(self.mode.duplicate_every, self._enqueued) else 1
            for _ in range(copies):
                self._put(events, 0)

    @staticmethod
    def _every(n: int, count: int) -> bool:
        return n > 0 and count % n == 0

    def _put(self, batch: list[dict[str, Any]], attempt: int) -> None:
        # Caller holds the condition.
        self._pending += 1
        self._waiting.append((batch, attempt))
        self._cond.notify_all()

    def wait_idle(self, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        with self._cond:
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        for thread in self._threads:
            thread.join(timeout=5)

    def _take(self, index: int) -> tuple[list[dict[str, Any]], int, int] | None:
        """A request's events, its first attempt number and how many batches it carries."""
        with self._cond:
            while not self._stopping and (not self._waiting or index >= self.mode.concurrency):
                self._cond.wait(0.5)
            if self._stopping:
                return None
            batch, attempt = self._waiting.pop(self._pick())
            events, carried = list(batch), 1
            while carried < self.mode.merge_up_to and self._waiting:
                at = self._pick()
                more, more_attempt = self._waiting[at]
                if more_attempt != attempt or len(events) + len(more) > 100:
                    break
                self._waiting.pop(at)
                events.extend(more)
                carried += 1
            return events, attempt, carried

    def _pick(self) -> int:
        return self._rng.randrange(len(self._waiting)) if self.mode.shuffle else 0

    def _run(self, index: int) -> None:
        with httpx.Client(timeout=5.0) as client:
            while True:
                taken = self._take(index)
                if taken is None:
                    return
                batch, first_attempt, carried = taken
                try:
                    acknowledged_at = self._deliver(client, batch, first_attempt)
                    if acknowledged_at is not None:
                        with self._cond:
                            self._acknowledged += 1
                            again = self._every(self.mode.redeliver_every, self._acknowledged)
                            if again and acknowledged_at + 1 < self.mode.max_attempts:
                                self._put(batch, acknowledged_at + 1)
                finally:
                    with self._cond:
                        self._pending -= carried
                        self._cond.notify_all()

    def _deliver(
        self, client: httpx.Client, batch: list[dict[str, Any]], first_attempt: int
    ) -> int | None:
        """Try until acknowledged or out of attempts; the acknowledged attempt number."""
        for attempt in range(first_attempt, self.mode.max_attempts):
            url = self._url()
            if not url:
                return None
            events = [dict(e, attemptNumber=attempt) for e in batch]
            body = json.dumps(events, separators=(",", ":")).encode()
            headers = {
                **signed_headers(self._secret(), url, body),
                "User-Agent": "HubSpot Connect 2.0 (fakecrm)",
            }
            entry: dict[str, Any] = {
                "url": url,
                "attempt": attempt,
                "events": events,
                "status": None,
                "error": None,
            }
            try:
                status = client.post(url, content=body, headers=headers).status_code
                entry["status"] = status
            except httpx.HTTPError as exc:
                entry["error"] = repr(exc)
                status = 0
            with self._store.lock:
                self._store.webhooks.append(entry)
            if 200 <= status < 300:
                return attempt
            time.sleep(min(0.2 * (2 ** (attempt - first_attempt)), self.mode.retry_delay_cap))
        return None
