"""The fake Pipedrive's webhook deliveries, as docs/vendors/pipedrive.md §1 gathers them.

- One `POST` per change and per matching webhook (no batches), body
  `{"meta": {...}, "data": ..., "previous": ...}` (Guide for Webhooks v2,
  https://pipedrive.readme.io/docs/guide-for-webhooks-v2, "Webhook format"); ids in `meta` are
  strings, `attempt` an int from 1, `timestamp` ISO 8601 with milliseconds (the migration
  guide's examples, https://pipedrive.readme.io/docs/webhooks-v2-migration-guide).
- The only credential: HTTP Basic with the `http_auth_user`/`http_auth_password` given when
  the webhook was made (W2 body parameters). No signature.
- Any 2xx is a success; anything else, or no answer within 10 s, fails. A failed first
  attempt is tried **3 more times, at 3, 30 and 150 s**, then dropped (W2 "Retry logic");
  `time_factor` scales those waits (and the ban) so tests don't wait minutes.
- Every failed *first* attempt adds one to the webhook's ban counter; at 10 the webhook is
  banned for 30 minutes and events in the ban are **dropped** (W2 "Webhooks policy").
- Deliveries run concurrently, each on its own thread, so retries overtake newer first
  attempts and two webhooks covering one change (`*.person` and `change.person`) both get it.
  No order is documented (§1.3: UNCONFIRMED).
- A webhook with no successful delivery for 3 days is deleted (W2 "Webhooks policy"):
  `gone` says so, and the fake drops it from `/v1/webhooks` (scaled by `time_factor`).
- A lost acknowledgement is imitated with `duplicate_every`: every Nth acknowledged delivery is
  sent once more with `attempt` + 1 (§1.3 inference). Whether `meta.id` stays the same across
  attempts is not confirmed: `same_event_id_on_retry` (default on) decides.
"""

from __future__ import annotations

import base64
import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

RETRY_DELAYS_SECONDS = (3.0, 30.0, 150.0)
TIMEOUT_SECONDS = 10.0
BAN_AFTER_FAILED_FIRST_ATTEMPTS = 10
BAN_SECONDS = 30 * 60.0
# "Webhooks with no successful deliveries on 3 consecutive days are deleted" (W2 policy).
DELETE_AFTER_FAILING_SECONDS = 3 * 24 * 3600.0


@dataclass
class DeliveryPolicy:
    time_factor: float = 1.0  # scales the retry waits and the ban (tests: 0.01)
    timeout_seconds: float = TIMEOUT_SECONDS
    duplicate_every: int = 0  # 0: never; N: every Nth acknowledged delivery comes twice
    same_event_id_on_retry: bool = True
    string_ids: bool = True  # official examples: strings; Pipedream's fixture: ints


@dataclass
class WebhookSender:
    policy: DeliveryPolicy
    # Each attempt, for tests: webhook id, event id, attempt, status (or error), at.
    journal: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    _acks: int = 0
    _threads: list[threading.Thread] = field(default_factory=list)
    _stopping: threading.Event = field(default_factory=threading.Event)

    def send(self, webhook: dict[str, Any], meta: dict[str, Any], body: dict[str, Any]) -> None:
        """Deliver one event to one webhook on a thread of its own (caller holds no lock)."""
        now = time.monotonic()
        with self.lock:
            if webhook.get("_banned_until", 0.0) > now:
                self.journal.append(
                    {"webhook_id": webhook["id"], "event_id": meta["id"], "dropped": "banned"}
                )
                return
        thread = threading.Thread(
            target=self._deliver, args=(webhook, meta, body), name="fakepd-webhook", daemon=True
        )
        with self.lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
        thread.start()

    def _post(self, webhook: dict[str, Any], meta: dict[str, Any], body: dict[str, Any]) -> bool:
        headers = {"Content-Type": "application/json"}
        if webhook.get("http_auth_user") or webhook.get("http_auth_password"):
            pair = (
                f"{webhook.get('http_auth_user') or ''}:{webhook.get('http_auth_password') or ''}"
            )
            headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
        payload = json.dumps({**body, "meta": meta}).encode()
        entry: dict[str, Any] = {
            "webhook_id": webhook["id"],
            "event_id": meta["id"],
            "attempt": meta["attempt"],
            "at": time.time(),
        }
        try:
            response = httpx.post(
                webhook["subscription_url"],
                content=payload,
                headers=headers,
                timeout=self.policy.timeout_seconds,
                follow_redirects=False,  # the URL must not redirect (W2 subscription_url)
            )
            entry["status"] = response.status_code
            ok = 200 <= response.status_code < 300
        except httpx.HTTPError as exc:
            entry["status"] = type(exc).__name__
            ok = False
        with self.lock:
            self.journal.append(entry)
            webhook["last_http_status"] = entry["status"] if isinstance(entry["status"], int) else 0
            now = time.monotonic()
            webhook.setdefault("_since_success", now)  # the first attempt starts the clock
            if ok:
                webhook["_since_success"] = now
            webhook["_failing"] = not ok
            webhook["last_delivery_time"] = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
        return ok

    def _deliver(self, webhook: dict[str, Any], meta: dict[str, Any], body: dict[str, Any]) -> None:
        attempt_meta = dict(meta, attempt=1)
        if self._post(webhook, attempt_meta, body):
            self._maybe_duplicate(webhook, attempt_meta, body)
            return
        with self.lock:
            failures = int(webhook.get("_failed_first_attempts", 0)) + 1
            webhook["_failed_first_attempts"] = failures
            if failures >= BAN_AFTER_FAILED_FIRST_ATTEMPTS:
                webhook["_banned_until"] = time.monotonic() + BAN_SECONDS * self.policy.time_factor
                webhook["_failed_first_attempts"] = 0  # reset when the ban ends
        for number, delay in enumerate(RETRY_DELAYS_SECONDS, start=2):
            if self._stopping.wait(delay * self.policy.time_factor):
                return
            retry = self._retry_meta(meta, number)
            if self._post(webhook, retry, body):
                self._maybe_duplicate(webhook, retry, body)
                return
        with self.lock:
            self.journal.append(
                {"webhook_id": webhook["id"], "event_id": meta["id"], "dropped": "4 failures"}
            )

    def _retry_meta(self, meta: dict[str, Any], attempt: int) -> dict[str, Any]:
        event_id = meta["id"] if self.policy.same_event_id_on_retry else str(uuid.uuid4())
        return dict(meta, attempt=attempt, id=event_id)

    def _maybe_duplicate(
        self, webhook: dict[str, Any], meta: dict[str, Any], body: dict[str, Any]
    ) -> None:
        every = self.policy.duplicate_every
        if every <= 0:
            return
        with self.lock:
            self._acks += 1
            due = self._acks % every == 0
        if due and int(meta["attempt"]) < 4:
            self._post(webhook, self._retry_meta(meta, int(meta["attempt"]) + 1), body)

    def gone(self, webhook: dict[str, Any]) -> bool:
        """Whether Pipedrive would have deleted the webhook by now: it has been failing, with no
        successful delivery for 3 (scaled) days. Caller holds `lock`."""
        since = webhook.get("_since_success")
        limit = DELETE_AFTER_FAILING_SECONDS * self.policy.time_factor
        return (
            bool(webhook.get("_failing"))
            and since is not None
            and (time.monotonic() - since > limit)
        )

    def wait_idle(self, timeout: float = 10.0, until: Callable[[], bool] | None = None) -> None:
        """Wait until every delivery thread has finished (or `until` holds)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if until is not None and until():
                return
            with self.lock:
                alive = [t for t in self._threads if t.is_alive()]
            if not alive and until is None:
                return
            time.sleep(0.02)

    def stop(self) -> None:
        self._stopping.set()
