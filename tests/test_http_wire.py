"""The public HTTP functions as real functions-framework processes, spoken to over raw sockets:
malformed framing is a 4xx, random raw requests (method, path, headers, chunking, body bytes)
never get a 5xx and never store anything unverified, and stalled connections don't stop a
function from answering."""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from devstack.function_process import serve
from shared.core.db import Database
from tests.ingest_support import (
    HUBSPOT_SECRET,
    hubspot_body,
    hubspot_event,
    hubspot_v3_headers,
    inbox_rows,
    make_connection,
)
from tests.ops_support import mint

pytestmark = pytest.mark.e2e
THREADS = 4  # per process; the stall tests open more stalled connections than this
DEADLINE = 2.0


@dataclass(frozen=True)
class Stack:
    webhook: str
    ops: str
    connection: str
    token: str


@pytest.fixture
def stack(db: Database, database_url: str) -> Iterator[Stack]:
    connection = make_connection(db)  # seeds tenant "acme" too
    token = mint(db, "acme")
    env = {
        "DATABASE_URL": database_url,
        "HUBSPOT_SECRET_ACME": HUBSPOT_SECRET,
        "WEBHOOK_NUDGE": "off",
        "WEBHOOK_MAX_BODY_BYTES": "4096",
        "PUBLIC_BASE_URL": "",
        "THREADS": str(THREADS),
        # The head and body deadlines, short so the stall tests wait seconds, not tens.
        "REQUEST_DEADLINE_SECONDS": str(DEADLINE),
    }
    with serve("webhook", env) as webhook, serve("ops", env) as ops:
        yield Stack(webhook, ops, connection, token)


def _address(base: str) -> tuple[str, int]:
    host, port = base.removeprefix("http://").split(":")
    return host, int(port)


def exchange(base: str, request: bytes, *, timeout: float = 20.0) -> bytes:
    """Send `request`, half-close (the client has nothing more to say, so no framing can make
    the server wait for more), and read the answer until the server closes."""
    with socket.create_connection(_address(base), timeout=timeout) as sock:
        sock.sendall(request)
        sock.shutdown(socket.SHUT_WR)
        answer = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            answer += chunk
        return answer


def status_of(answer: bytes) -> int:
    assert answer.startswith(b"HTTP/1."), answer[:200]
    return int(answer.split(b" ", 2)[1])


def head(method: str, path: str, headers: dict[str, str]) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: functions.test", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


MALFORMED_CHUNKED = [
    b"zz\r\nabc\r\n0\r\n\r\n",  # size not hex
    b"3\r\nabcdef\r\n0\r\n\r\n",  # chunk longer than its size: no terminator where due
    b"3;\x01=\r\nabc\r\n0\r\n\r\n",  # a control character in a chunk extension
    b"3\r\nab",  # the connection ends inside a chunk
    b"-1\r\nabc\r\n0\r\n\r\n",
]


def test_malformed_chunked_bodies_are_400_everywhere(stack: Stack, db: Database) -> None:
    chunked = {"Transfer-Encoding": "chunked", "Content-Type": "application/json"}
    form = {"Transfer-Encoding": "chunked", "Content-Type": "application/x-www-form-urlencoded"}
    auth = {"Authorization": f"Bearer {stack.token}"}
    cases = [
        (stack.webhook, f"/hubspot/{stack.connection}", chunked, {400}),
        (stack.ops, "/v1/workflows/validate", {**chunked, **auth}, {400}),
        (stack.ops, "/v1/workflows", {**chunked, **auth}, {400}),
        (stack.ops, "/ui/login", form, {400}),
        # Without a token the answer is 401, and nothing reads the body after it.
        (stack.ops, "/v1/workflows/validate", chunked, {401}),
    ]
    for body in MALFORMED_CHUNKED:
        for base, path, headers, expected in cases:
            answer = exchange(base, head("POST", path, headers) + body)
            assert status_of(answer) in expected, (path, body, answer[:300])
    assert inbox_rows(db) == []


# ---- random raw requests ------------------------------------------------------------------

METHODS = st.sampled_from(["POST", "POST", "POST", "GET", "PUT", "DELETE", "HEAD", "OPTIONS"])
HEADER_VALUE = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=60)
BODIES = st.binary(max_size=5000)


@st.composite
def framed(draw: st.DrawFn, body: bytes) -> tuple[dict[str, str], bytes]:
    """A framing of `body`: exact length, a wrong length, chunked (well or badly), or none."""
    how = draw(st.sampled_from(["length", "short", "long", "chunked", "bad_chunks", "none"]))
    if how == "length":
        return {"Content-Length": str(len(body))}, body
    if how == "short":
        return {"Content-Length": str(max(0, len(body) - draw(st.integers(1, 50))))}, body
    if how == "long":  # the client half-closes before the declared end
        return {"Content-Length": str(len(body) + draw(st.integers(1, 10**6)))}, body
    if how == "none":
        return {}, body
    sizes = draw(st.lists(st.integers(1, 1500), max_size=6))
    out, rest = b"", body
    for size in sizes:
        piece, rest = rest[:size], rest[size:]
        if not piece:
            break
        declared = len(piece)
        if how == "bad_chunks" and draw(st.booleans()):
            declared = max(0, declared + draw(st.integers(-5, 5)))
        size_text = draw(st.sampled_from([f"{declared:x}", f"{declared:X}", f"{declared:x};x=y"]))
        if how == "bad_chunks" and draw(st.integers(0, 4)) == 0:
            size_text = draw(HEADER_VALUE)
        out += size_text.encode("latin-1") + b"\r\n" + piece + b"\r\n"
    ending = b"0\r\n\r\n"
    if how == "bad_chunks":
        ending = draw(st.sampled_from([ending, b"", b"0\r\n", b"0\r\nX-Trailer: 1\r\n\r\n"]))
    return {"Transfer-Encoding": "chunked"}, out + ending


def webhook_paths(stack: Stack) -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from(
            [f"/hubspot/{stack.connection}", f"/standard/{stack.connection}", "/", "/hubspot"]
        ),
        st.builds(lambda u: f"/hubspot/{u}", st.uuids()),
        st.text(st.characters(min_codepoint=33, max_codepoint=126), max_size=40).map(
            lambda t: "/" + t.lstrip("/")
        ),
    )


OPS_PATHS = st.one_of(
    st.sampled_from(
        [
            "/v1/workflows/validate",
            "/v1/workflows",
            "/v1/rehearsals",
            f"/v1/runs/{uuid.UUID(int=1)}/replay",
            f"/v1/runs/{uuid.UUID(int=1)}/retry",
            f"/v1/workflows/{uuid.UUID(int=1)}/activate",
            "/v1/runs?limit=5",
            "/v1/refusals?record_key=x",
            "/v1/credits",
            "/openapi.json",
            "/ui",
            "/ui/login",
            "/ui/logout",
            f"/ui/runs/{uuid.UUID(int=1)}/replay",
        ]
    ),
    st.text(st.characters(min_codepoint=33, max_codepoint=126), max_size=40).map(
        lambda t: "/" + t.lstrip("/")
    ),
)
OPS_BODIES = st.one_of(
    BODIES,
    st.sampled_from(
        [
            b'{"source": "' + b"[" * 400 + b'"}',
            b'{"source": "a: &a [1]\\nb: *a\\n"}',
            b"[" * 3000,
            b"token=abc&csrf=x",
            b'{"reason": "x", "workflow_id": 5}',
        ]
    ),
)


def _headers(draw: st.DrawFn, names: list[str]) -> dict[str, str]:
    return draw(st.dictionaries(st.sampled_from(names), HEADER_VALUE, max_size=4))


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_random_raw_requests_never_5xx_and_never_store_unverified(
    data: st.DataObject, stack: Stack, db: Database
) -> None:
    target = data.draw(st.sampled_from(["webhook", "ops"]))
    method = data.draw(METHODS)
    if target == "webhook":
        base, path = stack.webhook, data.draw(webhook_paths(stack))
        body = data.draw(BODIES)
        headers = data.draw(
            st.builds(
                dict,
                st.dictionaries(
                    st.sampled_from(
                        [
                            "X-HubSpot-Signature-v3",
                            "X-HubSpot-Request-Timestamp",
                            "webhook-signature",
                            "Content-Type",
                            "X-Forwarded-Proto",
                        ]
                    ),
                    HEADER_VALUE,
                    max_size=4,
                ),
            )
        )
    else:
        base, path = stack.ops, data.draw(OPS_PATHS)
        body = data.draw(OPS_BODIES)
        headers = data.draw(
            st.dictionaries(
                st.sampled_from(["Content-Type", "Cookie", "X-Forwarded-Proto"]),
                HEADER_VALUE,
                max_size=3,
            )
        )
        auth = data.draw(st.sampled_from(["none", "valid", "bogus"]))
        if auth != "none":
            token = stack.token if auth == "valid" else data.draw(HEADER_VALUE)
            headers["Authorization"] = f"Bearer {token}"
    framing, wire_body = data.draw(framed(body))
    answer = exchange(base, head(method, path, {**headers, **framing}) + wire_body)
    if answer:  # gunicorn may close a connection whose request it can't even parse
        assert status_of(answer) < 500, answer[:400]
    assert inbox_rows(db) == []  # nothing here is signed: nothing may be stored
    with db.transaction() as tx:
        assert tx.scalar("SELECT count(*) FROM workflow_versions") == 0


# ---- stalled connections --------------------------------------------------------------------


def _stall(base: str, sent: bytes) -> socket.socket:
    sock = socket.create_connection(_address(base), timeout=30)
    if sent:
        sock.sendall(sent)
    return sock


def test_stalled_connections_dont_stop_either_function(stack: Stack, db: Database) -> None:
    """More stalled connections than each process has threads, of every kind a slow client can
    leave: connected and silent, half a request head, a head and part of a declared body (to a
    route that reads it), and an oversize declared body. While they all stay open, each
    function still answers a real request: each stall costs a thread at most the head or body
    deadline (`REQUEST_DEADLINE_SECONDS`), an oversize one none, where before they held every
    thread until the client went away."""
    webhook_path = f"/hubspot/{stack.connection}"
    auth = {"Authorization": f"Bearer {stack.token}", "Content-Type": "application/json"}
    stalls: list[socket.socket] = []
    try:
        for base, path, headers in (
            (stack.webhook, webhook_path, {}),
            (stack.ops, "/v1/workflows/validate", auth),
        ):
            kinds = [
                b"",
                f"POST {path} HTTP/1.1\r\nHost: x\r\n".encode(),
                head("POST", path, {**headers, "Content-Length": "100"}) + b"[{",
            ]
            for i in range(THREADS + 2):
                stalls.append(_stall(base, kinds[i % len(kinds)]))
            for _ in range(THREADS + 2):
                oversize = head("POST", path, {**headers, "Content-Length": "10000000000"})
                stalls.append(_stall(base, oversize))
        # A real delivery and a real ops call, while every stalled connection is still open.
        body = hubspot_body(hubspot_event(4242))
        url = stack.webhook + webhook_path
        delivered = httpx.post(url, content=body, headers=hubspot_v3_headers(body, url), timeout=90)
        assert delivered.status_code == 200, delivered.text
        validated = httpx.post(
            stack.ops + "/v1/workflows/validate",
            json={"source": "name: x\n"},
            headers={"Authorization": f"Bearer {stack.token}"},
            timeout=90,
        )
        assert validated.status_code == 200, validated.text
        assert validated.json()["valid"] is False
    finally:
        for sock in stalls:
            sock.close()
    assert len(inbox_rows(db)) == 1


def test_a_stalled_body_is_answered_408(stack: Stack) -> None:
    """Declared 100 bytes, sent 2, then silence (no half-close): the body deadline answers."""
    path = f"/hubspot/{stack.connection}"
    with _stall(stack.webhook, head("POST", path, {"Content-Length": "100"}) + b"[{") as sock:
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
    assert status_of(answer) == 408, answer[:300]
