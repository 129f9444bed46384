"""Signed v3 webhooks, sent the way HubSpot sends them: a JSON array of events, POSTed with
`X-HubSpot-Signature-v3` = base64(HMAC-SHA256(app secret, method + uri + body + timestamp))
and `X-HubSpot-Request-Timestamp` in milliseconds. Non-2xx answers are retried a few times with
`attemptNumber` bumped (and re-signed, so a retry does not look like a duplicate)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx

from devstack.fakecrm.store import Store, now_ms

MAX_ATTEMPTS = 4


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


def signed_headers(secret: str, uri: str, body: bytes) -> dict[str, str]:
    """The headers of a v3-signed webhook POST of `body` to `uri`, stamped now."""
    ts = now_ms()
    return {
        "Content-Type": "application/json",
        "X-HubSpot-Request-Timestamp": str(ts),
        "X-HubSpot-Signature-v3": sign_v3(secret, "POST", uri, body, ts),
    }


class WebhookSender:
    """One background thread delivering event batches in order, so API calls never wait."""

    def __init__(
        self, store: Store, secret: Callable[[], str], url: Callable[[], str | None]
    ) -> None:
        self._store = store
        self._secret = secret
        self._url = url
        self._queue: queue.Queue[list[dict[str, Any]] | None] = queue.Queue()
        self._idle = threading.Condition()
        self._pending = 0
        self._thread = threading.Thread(target=self._run, name="fakecrm-webhooks", daemon=True)
        self._thread.start()

    def enqueue(self, events: list[dict[str, Any]]) -> None:
        if not events or not self._url():
            return
        with self._idle:
            self._pending += 1
        self._queue.put(events)

    def wait_idle(self, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def stop(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=5)

    def _run(self) -> None:
        with httpx.Client(timeout=5.0) as client:
            while True:
                batch = self._queue.get()
                if batch is None:
                    return
                try:
                    self._deliver(client, batch)
                finally:
                    with self._idle:
                        self._pending -= 1
                        self._idle.notify_all()

    def _deliver(self, client: httpx.Client, batch: list[dict[str, Any]]) -> None:
        for attempt in range(MAX_ATTEMPTS):
            url = self._url()
            if not url:
                return
            events = [dict(e, attemptNumber=attempt) for e in batch]
            body = json.dumps(events, separators=(",", ":")).encode()
            headers = {
                **signed_headers(self._secret(), url, body),
                "X-HubSpot-Signature-Version": "v3",
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
                return
            time.sleep(min(0.2 * (2**attempt), 2.0))
