"""What a client sends to a public HTTP function, read on our terms: bounded in size, in time and
in nesting, and every way it can be wrong is a 4xx with a reason, never the generic 500.

The body of a request is the one part of it the client controls after the server started
working for it, so it is read here only:

- **Size.** A declared `Content-Length` over the cap is refused before a byte is read; a body
  without one (chunked) is read until it proves longer than the cap, never further (413).
- **Framing.** Whatever the server's body reader raises on the client's bytes (a chunk size that
  is not hex, a missing chunk terminator, a connection that ends early) is the client's
  malformed body: 400 `malformed_body`.
- **Time.** The whole body must arrive within `REQUEST_DEADLINE_SECONDS` (a setting, 10 s by
  default) of the first read. A client that stalls or trickles is cut off at the deadline (its
  socket's read side is shut down, so a read blocked inside the server wakes up) and answered
  408. A per-read timeout alone would not do: the server's reader keeps reading until it has
  the bytes it asked for, and a trickle of one byte a second restarts any per-read clock.
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
from collections.abc import Callable, Iterator, MutableMapping
from contextlib import contextmanager, suppress
from typing import Any

from flask import Request, Response

READ_CHUNK_BYTES = 64 * 1024
# gunicorn puts the connection's socket in the environ (functions-framework runs gunicorn, in
# the cloud and locally); the second key is ours.
SOCKET_KEY = "gunicorn.socket"
CONSUMED_KEY = "onceflow.body_consumed"
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


class SocketDeadline:
    """Shuts the read side of `sock` down `seconds` after `start()` unless cancelled first: a
    read blocked on it returns (end of data) instead of waiting for a client that stalls or
    trickles. Without a socket (an in-process test client) nothing can stall and nothing is
    cut; `expired` still tells the time."""

    def __init__(self, sock: Any, seconds: float) -> None:
        self.seconds = seconds
        self._sock = sock if isinstance(sock, socket.socket) else None
        self._fired = threading.Event()
        self._started = time.monotonic()
        self._timer: threading.Timer | None = None

    def start(self) -> SocketDeadline:
        self._started = time.monotonic()
        if self._sock is not None:
            self._timer = threading.Timer(self.seconds, self._cut)
            self._timer.daemon = True
            self._timer.start()
        return self

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    @property
    def expired(self) -> bool:
        return self._fired.is_set() or time.monotonic() - self._started > self.seconds

    def _cut(self) -> None:
        self._fired.set()
        # Already closed by the client: the blocked read has returned anyway.
        with suppress(OSError):
            assert self._sock is not None
            self._sock.shutdown(socket.SHUT_RD)


@contextmanager
def _deadline(sock: Any, seconds: float) -> Iterator[SocketDeadline]:
    deadline = SocketDeadline(sock, seconds).start()
    try:
        yield deadline
    finally:
        deadline.cancel()


def read_body(
    read: Callable[[int], bytes],
    *,
    declared_length: int | None,
    cap: int,
    environ: MutableMapping[str, Any] | None = None,
    deadline_seconds: float,
) -> bytes:
    """The whole body, or `BodyRefused`: 413 over `cap` (declared or read; the rest is never
    read), 408 past the deadline, 400 when the server's reader can't frame the client's bytes.

    `environ` is the request's WSGI environ: the deadline cuts the connection's socket when the
    server exposes it (gunicorn's `gunicorn.socket`), and a body read to its end is noted there
    for `detached`."""
    environ = environ if environ is not None else {}
    sock = environ.get(SOCKET_KEY)
    refuse_declared_length(declared_length, cap)
    chunks: list[bytes] = []
    total = 0
    with _deadline(sock, deadline_seconds) as deadline:
        while True:
            try:
                chunk = read(min(READ_CHUNK_BYTES, cap + 1 - total))
            except Exception as exc:
                # The reader raises whatever its framing code raises (gunicorn: its own
                # ParseException family for chunk errors, IOError subclasses for an early
                # end); all of them are about bytes the client sent, or failed to.
                if deadline.expired:
                    raise _late(deadline_seconds) from exc
                raise BodyRefused(
                    400,
                    "malformed_body",
                    "body_framing",
                    f"the request body could not be read: {_name(exc)}",
                ) from exc
            if deadline.expired:
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
    environ[CONSUMED_KEY] = True
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


def _close_after_answer(environ: MutableMapping[str, Any]) -> None:
    """Make the server answer `Connection: close` and end the connection after this response.

    A WSGI application can't say so itself: `Connection` is hop-by-hop, and gunicorn (which
    functions-framework runs, locally and in the cloud) drops it from the application's headers
    and writes its own from its response's `should_close()`. The one handle on that response
    gunicorn gives a request is the `wsgi.early_hints` callback, which closes over it; its
    `force_close()` is gunicorn's own way to end a keep-alive connection. A server without it
    (an in-process test client) has no connection to keep alive."""
    hints = environ.get("wsgi.early_hints")
    for cell in getattr(hints, "__closure__", None) or ():
        with suppress(ValueError):  # an empty cell
            force_close = getattr(cell.cell_contents, "force_close", None)
            if callable(force_close):
                force_close()
                return


def detached(response: Response, request: Request) -> Response:
    """`response` streamed, so functions-framework doesn't read what the client is still
    sending (see the module docstring). The length stays declared.

    When the request has a body nobody read to its end (refused, or never asked for), the read
    side of the connection is shut down too: the server's own drain and lingering close then
    see the end of the data at once instead of waiting seconds on a client that stalls, and
    the connection is not reused. What the client already sent is still read and discarded
    by the server, so the answer is not lost to a reset."""
    environ = request.environ
    has_body = (
        bool(request.content_length)
        or "chunked" in request.headers.get("Transfer-Encoding", "").lower()
    )
    sock = environ.get(SOCKET_KEY)
    if has_body and not environ.get(CONSUMED_KEY):
        # The client is still sending (or believes it may): it must be told the connection
        # ends with this answer, or it sends its next request on a connection whose read side
        # is already shut, and that request fails.
        _close_after_answer(environ)
        if isinstance(sock, socket.socket):
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RD)
    if response.is_streamed:
        return response
    payload = response.get_data()
    response.response = iter([payload])
    response.headers["Content-Length"] = str(len(payload))
    return response
