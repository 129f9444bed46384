"""A fake Slack: the Web API methods an approval message uses, and the interaction callback a
click on its buttons makes, for tests and the local stack.

Web API (https://api.slack.com/methods/chat.postMessage, https://api.slack.com/methods/chat.update):
`POST /api/chat.postMessage` and `POST /api/chat.update`, a JSON body, `Authorization: Bearer
<bot token>`. As Slack does, every answer is HTTP 200 with `ok`; a wrong token is
`{"ok": false, "error": "invalid_auth"}`, an unknown message `message_not_found`. Posted
messages are kept (`messages`, by ts) with each update's history (`updates`).

Posting is rate limited as Slack limits it: chat.postMessage "generally allows posting one
message per second per channel", short bursts tolerated
(https://api.slack.com/docs/rate-limits); past that Slack answers HTTP 429 Too Many Requests
with a `Retry-After` header, the seconds to wait. Here each channel has a bucket of
`post_burst` posts refilled at `posts_per_second`; an empty bucket answers 429, `Retry-After`
and `{"ok": false, "error": "ratelimited"}`, and posts nothing (`rate_limited` counts them).

Interactions (https://api.slack.com/interactivity/handling): `click(...)` posts a
`block_actions` payload for a button of a posted message to `interaction_url`, form-encoded
`payload=<json>`, signed as Slack signs: `X-Slack-Request-Timestamp` and `X-Slack-Signature` =
`v0=` + hex HMAC-SHA256(signing secret, `v0:<timestamp>:<body>`)
(https://api.slack.com/authentication/verifying-requests-from-slack). With `retries`, a
delivery answered with a 5xx or not answered is sent again, the same bytes (a retry of one
click); `duplicate=True` delivers the same click twice; `late_duplicate_after` sends it once
more that many seconds later. The callbacks and their answers are kept (`deliveries`).

`POST /_fake/click` (JSON: ts, user, action, [retries, duplicate]) does the same from outside
the process, for the local stack's demo.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from devstack.serving import serve_in_thread


@dataclass
class Delivery:
    body: bytes
    headers: dict[str, str]
    status: int | None
    answer: Any
    # How long onceflow took to answer (Slack shows the user an error after 3 s).
    seconds: float = 0.0


@dataclass
class FakeSlack:
    bot_token: str
    signing_secret: str
    interaction_url: str | None = None
    host: str = "127.0.0.1"
    port: int = 0
    team_id: str = "T0FAKE"
    post_burst: float = 10.0
    posts_per_second: float = 1.0
    rate_limited: int = 0
    _buckets: dict[str, tuple[float, float]] = field(default_factory=dict)
    messages: dict[str, dict[str, Any]] = field(default_factory=dict)
    updates: list[dict[str, Any]] = field(default_factory=list)
    deliveries: list[Delivery] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None
    _ts: int = 0

    @property
    def base_url(self) -> str:
        assert self._server is not None
        return f"http://{self.host}:{self._server.server_address[1]}"

    @property
    def api_url(self) -> str:
        """What ONCEFLOW_SLACK_API_URL is set to."""
        return f"{self.base_url}/api"

    def start(self) -> FakeSlack:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("content-length") or 0))
                try:
                    body = json.loads(raw or b"{}")
                except ValueError:
                    body = {}
                if self.path == "/_fake/click":
                    answer: Any = [d.status for d in fake.click(**body)]
                    status, wait = 200, None
                else:
                    answer = fake.api(self.path, self.headers.get("authorization", ""), body)
                    wait = fake.retry_after(answer)
                    status = 200 if wait is None else 429
                data = json.dumps(answer).encode()
                self.send_response(status)
                if wait is not None:
                    self.send_header("retry-after", str(wait))
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer((self.host, self.port), Handler)
        serve_in_thread(self._server, "fakeslack")
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def api(self, path: str, authorization: str, body: dict[str, Any]) -> dict[str, Any]:
        if authorization != f"Bearer {self.bot_token}":
            return {"ok": False, "error": "invalid_auth"}
        method = path.removeprefix("/api/")
        with self._lock:
            if method == "chat.postMessage":
                return self._post_message(body)
            if method == "chat.update":
                ts = str(body.get("ts"))
                if ts not in self.messages:
                    return {"ok": False, "error": "message_not_found"}
                self.messages[ts] = {**self.messages[ts], **body}
                self.updates.append(body)
                return {"ok": True, "channel": body.get("channel"), "ts": ts}
        return {"ok": False, "error": "unknown_method"}

    def _post_message(self, body: dict[str, Any]) -> dict[str, Any]:
        """chat.postMessage, under the lock."""
        if not body.get("channel"):
            return {"ok": False, "error": "channel_not_found"}
        wait = self._take_post(str(body["channel"]))
        if wait:
            self.rate_limited += 1
            return {"ok": False, "error": "ratelimited", "retry_after": wait}
        self._ts += 1
        ts = f"{int(time.time())}.{self._ts:06d}"
        self.messages[ts] = {**body, "ts": ts}
        return {"ok": True, "channel": body["channel"], "ts": ts, "message": body}

    def _take_post(self, channel: str) -> int:
        """Take one post from the channel's bucket (under the lock): 0 when there was one,
        else the whole seconds until there is."""
        now = time.monotonic()
        level, since = self._buckets.get(channel, (self.post_burst, now))
        level = min(self.post_burst, level + (now - since) * self.posts_per_second)
        if level >= 1:
            self._buckets[channel] = (level - 1, now)
            return 0
        self._buckets[channel] = (level, now)
        return max(1, math.ceil((1 - level) / self.posts_per_second))

    @staticmethod
    def retry_after(answer: Any) -> int | None:
        """The Retry-After of a rate-limited answer (its HTTP status is 429); None otherwise."""
        if isinstance(answer, dict) and answer.get("error") == "ratelimited":
            return int(answer["retry_after"])
        return None

    def payload(self, ts: str, user: str, action: str) -> dict[str, Any]:
        """The block_actions payload of `user` clicking the `action` button of message `ts`."""
        message = self.messages[ts]
        (button,) = [
            e
            for b in message.get("blocks", [])
            if b.get("type") == "actions"
            for e in b["elements"]
            if e["action_id"] == action
        ]
        return {
            "type": "block_actions",
            "team": {"id": self.team_id},
            "user": {"id": user, "team_id": self.team_id},
            "channel": {"id": message["channel"]},
            "container": {"type": "message", "message_ts": ts, "channel_id": message["channel"]},
            "message": message,
            "actions": [
                {
                    "type": "button",
                    "action_id": action,
                    "block_id": next(
                        b["block_id"] for b in message["blocks"] if b.get("type") == "actions"
                    ),
                    "value": button["value"],
                    "action_ts": f"{time.time():.6f}",
                }
            ],
        }

    def signed(self, body: bytes, timestamp: int | None = None) -> dict[str, str]:
        stamp = str(int(time.time()) if timestamp is None else timestamp)
        base = b"v0:" + stamp.encode() + b":" + body
        digest = hmac.new(self.signing_secret.encode(), base, hashlib.sha256).hexdigest()
        return {
            "Content-Type": "application/x-www-form-urlencoded",
            "X-Slack-Request-Timestamp": stamp,
            "X-Slack-Signature": f"v0={digest}",
        }

    def click(
        self,
        ts: str,
        user: str,
        action: str,
        *,
        retries: int = 0,
        duplicate: bool = False,
        late_duplicate_after: float | None = None,
    ) -> list[Delivery]:
        """Deliver one click (signed), retried on a 5xx or no answer; the deliveries made."""
        body = urllib.parse.urlencode(
            {"payload": json.dumps(self.payload(ts, user, action))}
        ).encode()
        made = [self._deliver(body, retries)]
        if duplicate:
            made.append(self._deliver(body, retries))
        if late_duplicate_after is not None:
            time.sleep(late_duplicate_after)
            made.append(self._deliver(body, retries))
        return made

    def deliver(self, body: bytes, headers: dict[str, str]) -> Delivery:
        """One POST of `body` with `headers` to the interaction URL, as it is."""
        assert self.interaction_url is not None, "set interaction_url to onceflow's callback"
        request = urllib.request.Request(  # noqa: S310 - a test's local URL
            self.interaction_url, data=body, headers=headers, method="POST"
        )
        started = time.monotonic()
        try:
            with urllib.request.urlopen(request, timeout=3) as answer:  # noqa: S310
                delivery = Delivery(body, headers, answer.status, json.loads(answer.read()))
        except urllib.error.HTTPError as exc:
            delivery = Delivery(body, headers, exc.code, json.loads(exc.read() or b"null"))
        except (urllib.error.URLError, TimeoutError):
            delivery = Delivery(body, headers, None, None)
        delivery.seconds = time.monotonic() - started
        with self._lock:
            self.deliveries.append(delivery)
        return delivery

    def _deliver(self, body: bytes, retries: int) -> Delivery:
        for attempt in range(retries + 1):
            delivery = self.deliver(body, self.signed(body))
            if delivery.status is not None and delivery.status < 500:
                return delivery
            if attempt < retries:
                time.sleep(0.05 * (attempt + 1))
        return delivery
