"""A fake SMTP server for tests and the local stack: it accepts every message (no TLS, no
AUTH) and keeps it (`messages`: sender, recipients, the parsed email). Enough of RFC 5321 for
`smtplib`: EHLO/HELO, MAIL, RCPT, DATA (dot-unstuffed), RSET, NOOP, QUIT. `python -m
devstack.fakesmtp [port]` serves it on its own."""

from __future__ import annotations

import socketserver
import sys
import time
from dataclasses import dataclass, field
from email import message_from_bytes, policy
from email.message import EmailMessage
from typing import Any, cast

from devstack.serving import serve_in_thread


@dataclass(frozen=True)
class Received:
    sender: str
    recipients: tuple[str, ...]
    message: EmailMessage


@dataclass
class FakeSmtp:
    host: str = "127.0.0.1"
    port: int = 0
    messages: list[Received] = field(default_factory=list)
    _server: socketserver.ThreadingTCPServer | None = None

    @property
    def bound_port(self) -> int:
        assert self._server is not None
        return int(self._server.server_address[1])

    def start(self) -> FakeSmtp:
        fake = self

        class Handler(socketserver.StreamRequestHandler):
            def reply(self, line: str) -> None:
                self.wfile.write(line.encode() + b"\r\n")

            def handle(self) -> None:
                self.reply("220 fakesmtp ready")
                sender, recipients = "", []
                while line := self.rfile.readline():
                    verb = line.decode("latin-1").strip().split(" ", 1)[0].upper()
                    arg = line.decode("latin-1").strip()[len(verb) :].strip()
                    if verb == "EHLO":
                        self.reply("250-fakesmtp")
                        self.reply("250 8BITMIME")
                    elif verb == "MAIL":
                        sender, recipients = arg.partition(":")[2].strip("<> "), []
                        self.reply("250 OK")
                    elif verb == "RCPT":
                        recipients.append(arg.partition(":")[2].strip("<> "))
                        self.reply("250 OK")
                    elif verb == "DATA":
                        self.reply("354 end with <CRLF>.<CRLF>")
                        fake.keep(sender, recipients, self._data())
                        self.reply("250 OK: queued")
                    elif verb == "QUIT":
                        self.reply("221 bye")
                        return
                    else:  # HELO, RSET, NOOP and anything else
                        self.reply("250 OK")

            def _data(self) -> bytes:
                lines: list[bytes] = []
                while (line := self.rfile.readline()) not in (b".\r\n", b".\n", b""):
                    lines.append(line[1:] if line.startswith(b"..") else line)
                return b"".join(lines)

        socketserver.ThreadingTCPServer.allow_reuse_address = True
        self._server = socketserver.ThreadingTCPServer((self.host, self.port), Handler)
        self._server.daemon_threads = True
        serve_in_thread(self._server, "fakesmtp")
        return self

    def keep(self, sender: str, recipients: list[str], data: bytes) -> None:
        parsed: Any = message_from_bytes(data, policy=policy.default)
        self.messages.append(Received(sender, tuple(recipients), cast(EmailMessage, parsed)))

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


def main() -> None:
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8025
    fake = FakeSmtp(port=port).start()
    print(f"fake SMTP on 127.0.0.1:{fake.bound_port}", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
