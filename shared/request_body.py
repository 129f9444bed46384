"""What a client sends to a public HTTP function, read on our terms: bounded in size, in time and
in nesting, and every way it can be wrong is a 4xx with a reason, never the generic 500.

The body of a request is the one part of it the client controls after the server started
working for it, so it is read here only:

- **Size.** A declared `Content-Length` over the cap is refused before a byte is read; a body
  without one (chunked) is read until it proves longer than the cap, never further (413).
- **Framing.** Whatever the server's body reader raises on the client's bytes (a chunk size that
  is not hex, a missing chunk terminator, a connection that ends early) is the client's
  malformed body: 400 `malformed_body`.
- **Time.** The whole body must arrive within `BODY_DEADLINE_SECONDS` of the first read. A
  client that stalls or trickles is cut off at the deadline (its socket's read side is shut
  down, so a read blocked inside the server wakes up) and answered 408. A per-read timeout
  alone would not do: the server's reader keeps reading until it has the bytes it asked for,
  and a trickle of one byte a second restarts any per-read clock.
- **Nesting.** JSON deeper than `MAX_JSON_DEPTH` is refused before it is parsed (400), so the
  parser's recursion limit is never what stops it.

`detached` is the other half: functions-framework reads the rest of the request body after a
view returns (so that the connection can be reused), unbounded and without a deadline, unless the
response is streamed. Every answer of the public functions goes out detached, and the server's
own bounded drain (gunicorn: at most a few seconds, then the connection is closed) is all that is
spent on bytes nobody asked for.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any

from flask import Response

READ_CHUNK_BYTES = 64 * 1024
BODY_DEADLINE_SECONDS = 10.0
MAX_JSON_DEPTH = 32


class BodyRefused(Exception):
    """The body can't be taken: `status` (400, 408 or 413), a stable `code`, the `check` that
    failed (`content_length`, `body_read`, `body_framing`, `body_deadline`, `json`), words for
    people."""

    def __init__(self, status: int, code: str, check: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.check = check
        self.message = message


def too_large(cap: int, check: str = "body_read") -> BodyRefused:
    return BodyRefused(413, "body_too_large", check, f"request bodies are limited to {cap} bytes")


def refuse_declared_length(declared_length: int | None, cap: int) -> None:
    """413 for a declared length over the cap, before anything is read or looked up."""
    if declared_length is not None and declared_length > cap:
        raise too_large(cap, "content_length")


@contextmanager
def _deadline(sock: Any, seconds: float) -> Iterator[Callable[[], bool]]:
    """Shut the read side of `sock` down when `seconds` pass; yields "has it fired?".

    Without a socket (an in-process test client) there is nothing to stall on and nothing to
    cut, and the deadline is only checked between reads."""
    fired = threading.Event()
    started = time.monotonic()

    def cut() -> None:
        fired.set()
        # Already closed by the client: the blocked read has returned anyway.
        with suppress(OSError):
            sock.shutdown(socket.SHUT_RD)

    timer = threading.Timer(seconds, cut) if isinstance(sock, socket.socket) else None
    if timer is not None:
        timer.daemon = True
        timer.start()
    try:
        yield lambda: fired.is_set() or time.monotonic() - started > seconds
    finally:
        if timer is not None:
            timer.cancel()


def read_body(
    read: Callable[[int], bytes],
    *,
    declared_length: int | None,
    cap: int,
    sock: Any = None,
    deadline_seconds: float = BODY_DEADLINE_SECONDS,
) -> bytes:
    """The whole body, or `BodyRefused`: 413 over `cap` (declared or read; the rest is never
    read), 408 past the deadline, 400 when the server's reader can't frame the client's bytes.

    `sock` is the connection's socket when the server exposes it (gunicorn's
    `environ["gunicorn.socket"]`); the deadline cuts it."""
    refuse_declared_length(declared_length, cap)
    chunks: list[bytes] = []
    total = 0
    with _deadline(sock, deadline_seconds) as expired:
        while True:
            try:
                chunk = read(min(READ_CHUNK_BYTES, cap + 1 - total))
            except Exception as exc:
                # The reader raises whatever its framing code raises (gunicorn: its own
                # ParseException family for chunk errors, IOError subclasses for an early
                # end); all of them are about bytes the client sent, or failed to.
                if expired():
                    raise _late(deadline_seconds) from exc
                raise BodyRefused(
                    400,
                    "malformed_body",
                    "body_framing",
                    f"the request body could not be read: {_name(exc)}",
                ) from exc
            if expired():
                raise _late(deadline_seconds)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > cap:
                raise too_large(cap)
    if declared_length is not None and total < declared_length:
        # A cut or closed connection reads as an early end of the body.
        raise BodyRefused(
            400, "malformed_body", "body_framing", "the request body ended before its length"
        )
    return b"".join(chunks)


def _late(seconds: float) -> BodyRefused:
    return BodyRefused(
        408,
        "body_timeout",
        "body_deadline",
        f"the request body did not arrive within {seconds:g} seconds",
    )


def _name(exc: Exception) -> str:
    words = str(exc).strip()
    return f"{type(exc).__name__}: {words}"[:200] if words else type(exc).__name__


def json_depth_exceeds(raw: bytes, limit: int) -> bool:
    """Whether the JSON text nests arrays/objects deeper than `limit` (strings are skipped, so
    brackets inside them don't count). Linear and iterative: safe on any input."""
    depth = 0
    in_string = False
    escaped = False
    for byte in raw:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth > limit:
                return True
        elif byte in (0x5D, 0x7D):  # ] }
            depth -= 1
    return False


def parse_json(raw: bytes, *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """The parsed document, or `BodyRefused(400)` for malformed or too deeply nested JSON."""
    if json_depth_exceeds(raw, max_depth):
        raise BodyRefused(
            400,
            "too_deep",
            "json",
            f"the JSON body nests deeper than {max_depth} arrays or objects",
        )
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise BodyRefused(
            400, "malformed_json", "json", "the request body is not valid JSON"
        ) from None


def detached(response: Response) -> Response:
    """`response` streamed, so functions-framework doesn't read what the client is still
    sending (see the module docstring). The length stays declared."""
    if response.is_streamed:
        return response
    payload = response.get_data()
    response.response = iter([payload])
    response.headers["Content-Length"] = str(len(payload))
    return response
