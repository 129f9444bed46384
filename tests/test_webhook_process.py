"""The `webhook` function as a real functions-framework process over loopback HTTP: the size
cap holds on the wire, and the after-commit nudge carries a signed webhook all the way to an
event id on the emulator's `trigger-events` subscription (drain + publish, no scheduler)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from devstack.demo_story import wait_for
from devstack.function_process import serve
from shared.core.db import Database
from shared.core.pubsub import TRIGGER_EVENTS
from tests.ingest_support import (
    HUBSPOT_SECRET,
    hubspot_body,
    hubspot_event,
    hubspot_v3_headers,
    inbox_rows,
    make_connection,
    trigger_events,
)
from tests.pubsub_emulator import (
    PubsubProject,
)

pytestmark = pytest.mark.e2e


@pytest.fixture
def webhook_process(db: Database, database_url: str, pubsub: PubsubProject) -> Iterator[str]:
    env = {
        "DATABASE_URL": database_url,
        "GOOGLE_CLOUD_PROJECT": pubsub.project,
        "HUBSPOT_SECRET_ACME": HUBSPOT_SECRET,
        "WEBHOOK_MAX_BODY_BYTES": "4096",
        "WEBHOOK_NUDGE": "thread",
        "PUBLIC_BASE_URL": "",  # empty is unset: signatures cover the loopback URL
    }
    with serve("webhook", env) as base:
        yield base


def test_signed_webhook_reaches_trigger_events_through_the_nudge(
    db: Database, webhook_process: str, pubsub: PubsubProject
) -> None:
    connection = make_connection(db, watched_fields={"contact": ["lifecyclestage"]})
    path = f"/hubspot/{connection}"
    body = hubspot_body(hubspot_event(7001, 55, property_value="customer"))
    started = time.monotonic()
    response = httpx.post(
        webhook_process + path,
        content=body,
        headers=hubspot_v3_headers(body, webhook_process + path),
        timeout=10,
    )
    answered = time.monotonic() - started
    assert response.status_code == 200, response.text
    assert answered < 2.0  # the drain happens after the answer, not before it
    (event_id,) = pubsub.pull_ids(TRIGGER_EVENTS, count=1, timeout=20)
    # The publisher marks a row published after Pub/Sub accepted it (a crash in between
    # publishes it again, never loses it), so the message can be pulled before the mark
    # commits: wait for the mark rather than race it.
    event = wait_for(lambda: next((e for e in trigger_events(db) if e["published_at"]), None), 10)
    assert event is not None, "the nudge's publisher never marked the event published"
    assert event_id == event["id"]
    assert event["event_type"] == "hubspot.contact.property_changed"
    assert len(trigger_events(db)) == 1
    assert inbox_rows(db)[0]["status"] == "processed"


def raw_request(base: str, head: bytes, body: bytes, *, timeout: float = 5.0) -> bytes:
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(head + body)
        chunks = []
        while True:
            try:
                chunk = sock.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not chunk:
                break
            chunks.append(chunk)
            if b"\r\n\r\n" in b"".join(chunks):
                break
        return b"".join(chunks)


def test_oversize_is_refused_on_the_wire_without_reading_the_rest(
    db: Database, webhook_process: str
) -> None:
    connection = make_connection(db)
    path = f"/hubspot/{connection}"
    # Announces 50 MiB, sends 10 bytes and waits: the answer must come without the rest.
    head = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {50 * 1024 * 1024}\r\n\r\n"
    ).encode()
    started = time.monotonic()
    answer = raw_request(webhook_process, head, b"[{}, {}, {")
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert time.monotonic() - started < 4
    # The rest of the body was never read, so the connection can't carry another request:
    # the answer must say so, or the client's next request on it fails.
    assert b"\r\nconnection: close\r\n" in answer.lower(), answer[:300]
    # Chunked, no Content-Length: the capped read stops after the cap.
    chunk = b"x" * 3000
    chunked_head = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    ).encode()
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(chunk), chunk) for _ in range(3))  # no end chunk
    answer = raw_request(webhook_process, chunked_head, chunks)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"\r\nconnection: close\r\n" in answer.lower(), answer[:300]
    assert inbox_rows(db) == []
