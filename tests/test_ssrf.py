"""SSRF: hostile destinations for http.request are refused before any connection is made.

A listener on every local address (0.0.0.0 and ::) at one port counts accepted connections;
each hostile URL names that port. Hosts that are not local (10/8, metadata, …) could never reach
it anyway, so those cases also assert the refusal reason, which proves no connect was tried.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from shared.blocks import http as http_block
from shared.blocks.base import BlockFailure
from shared.core.db import Database
from shared.core.netguard import NetPolicy, refusal_reason, system_resolver
from tests.blocks_support import StepRunner, seed_tenant

TEST_NAMES = {
    "internal.example.test": ["127.0.0.1"],
    "private.example.test": ["10.1.2.3"],
    "meta.example.test": ["169.254.169.254"],
    "cgnat.example.test": ["100.64.1.1"],
    "mapped.example.test": ["::ffff:127.0.0.1"],
    "nat64.example.test": ["64:ff9b::7f00:1"],
    "ula.example.test": ["fd00::1"],
    # DNS rebinding: one public answer, one private. All answers must pass.
    "rebind.example.test": ["93.184.216.34", "127.0.0.1"],
    "public.example.test": ["93.184.216.34"],
}


def resolve_test_names(host: str, port: int) -> list[str]:
    if host in TEST_NAMES:
        return TEST_NAMES[host]
    return system_resolver(host, port)


class Listener:
    """Counts connections on one port of every local address."""

    def __init__(self) -> None:
        self.accepted = 0
        self.socks: list[socket.socket] = []
        v4 = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        v4.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        v4.bind(("0.0.0.0", 0))
        self.port = v4.getsockname()[1]
        self.socks.append(v4)
        try:
            v6 = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
            v6.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            v6.bind(("::", self.port))
            self.socks.append(v6)
        except OSError:
            pass  # no IPv6 on this machine: v6 targets can't connect anywhere either
        self._stop = threading.Event()
        for s in self.socks:
            s.listen(16)
            s.settimeout(0.1)
            threading.Thread(target=self._accept, args=(s,), daemon=True).start()

    def _accept(self, s: socket.socket) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = s.accept()
            except (TimeoutError, OSError):
                continue
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        for s in self.socks:
            s.close()


@pytest.fixture
def listener() -> Iterator[Listener]:
    lst = Listener()
    try:
        yield lst
    finally:
        lst.close()


@pytest.fixture
def guarded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ONCEFLOW_HTTP_ALLOW_LOOPBACK", raising=False)
    monkeypatch.setattr(http_block, "net_policy", lambda: NetPolicy(resolver=resolve_test_names))


def hostile_targets(port: int) -> list[str]:
    p = port
    hosts = [
        # loopback in every spelling the C resolver accepts
        "127.0.0.1",
        "127.1",
        "127.0.1",
        "2130706433",
        "0x7f000001",
        "0x7f.0.0.1",
        "0177.0.0.1",
        "017700000001",
        "0177.1",
        "127.255.255.254",
        "0.0.0.0",
        "0",
        "localhost",
        "LOCALHOST.",
        "sub.localhost",
        "[::1]",
        "[::ffff:127.0.0.1]",
        "[::ffff:7f00:1]",
        "[0:0:0:0:0:ffff:7f00:1]",
        "[::127.0.0.1]",
        "[64:ff9b::127.0.0.1]",
        "[2002:7f00:1::1]",
        "[::]",
        # private, CGNAT, link-local, metadata
        "10.0.0.1",
        "172.16.0.1",
        "192.168.1.1",
        "100.64.0.1",
        "100.127.255.254",
        "169.254.169.254",
        "169.254.0.1",
        "0xa9fea9fe",
        "2852039166",
        "[::ffff:169.254.169.254]",
        "[::ffff:a9fe:a9fe]",
        "[64:ff9b::a9fe:a9fe]",
        "[fd00::1]",
        "[fd00:ec2::254]",
        "[fe80::1]",
        "[fc00::1]",
        "[::ffff:10.0.0.1]",
        # multicast, reserved, special purpose
        "224.0.0.1",
        "239.255.255.250",
        "240.0.0.1",
        "255.255.255.255",
        "198.18.0.1",
        "192.0.0.1",
        "[ff02::1]",
        # metadata names
        "metadata.google.internal",
        "metadata.google.internal.",
        "metadata",
        "metadata.goog",
        "anything.internal",
        # names that resolve to private addresses (test resolver)
        "internal.example.test",
        "private.example.test",
        "meta.example.test",
        "cgnat.example.test",
        "mapped.example.test",
        "nat64.example.test",
        "ula.example.test",
        "rebind.example.test",
    ]
    urls = [f"http://{h}:{p}/hook" for h in hosts]
    urls += [
        f"https://127.0.0.1:{p}/",
        f"http://public.example.test@127.0.0.1:{p}/",  # userinfo trick
        "file:///etc/passwd",
        f"gopher://127.0.0.1:{p}/_x",
        f"ftp://127.0.0.1:{p}/",
    ]
    return urls


def test_refuses_at_least_40_hostile_targets_with_zero_connections(
    db: Database, listener: Listener, guarded: None
) -> None:
    seed_tenant(db)
    step = StepRunner(db, "http.request")
    targets = hostile_targets(listener.port)
    assert len(targets) >= 40
    outcomes: dict[str, str] = {}
    for url in targets:
        with pytest.raises(BlockFailure) as err:
            step.run(http_block.REQUEST, {"url": url, "body": {"x": 1}})
        assert err.value.error_class == "permanent", (url, str(err.value))
        outcomes[url] = err.value.outcome_code
    assert listener.accepted == 0
    assert set(outcomes.values()) <= {"SSRF_BLOCKED", "INVALID_URL"}
    blocked = [u for u, code in outcomes.items() if code == "SSRF_BLOCKED"]
    assert len(blocked) >= 40, outcomes
    with db.transaction() as tx:  # a refused destination is never charged
        assert tx.scalar("SELECT count(*) FROM credit_ledger") == 0


class _Redirector(BaseHTTPRequestHandler):
    location = ""

    def log_message(self, *args: Any) -> None:
        return

    def do_POST(self) -> None:
        self.send_response(302)
        self.send_header("Location", self.location)
        self.send_header("Content-Length", "0")
        self.end_headers()


def test_public_looking_url_redirecting_to_private_is_refused(
    db: Database, listener: Listener, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The redirecting server is reachable (loopback explicitly allowed for the test, and its
    name resolves through the test resolver); its Location points at the listener, which the
    policy would allow too, so only the no-redirects rule stands between them."""

    class Handler(_Redirector):
        location = f"http://127.0.0.1:{listener.port}/"

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    names = {"hooks.partner-example.com": ["127.0.0.1"]}
    monkeypatch.setattr(
        http_block,
        "net_policy",
        lambda: NetPolicy(allow_loopback=True, resolver=lambda h, p: names.get(h, [])),
    )
    seed_tenant(db)
    step = StepRunner(db, "http.request")
    try:
        with pytest.raises(BlockFailure) as err:
            step.run(
                http_block.REQUEST,
                {"url": f"http://hooks.partner-example.com:{server.server_address[1]}/in"},
            )
    finally:
        server.shutdown()
        server.server_close()
    assert err.value.outcome_code == "REDIRECT_REFUSED"
    assert listener.accepted == 0


@pytest.mark.parametrize(
    ("address", "allowed"),
    [
        ("8.8.8.8", True),
        ("93.184.216.34", True),
        ("2606:4700:4700::1111", True),
        ("127.0.0.1", False),
        ("100.64.0.1", False),  # not is_private, still refused
        ("64:ff9b::808:808", False),  # NAT64 is is_global in Python, still refused
        ("::ffff:8.8.8.8", True),  # a mapped public address is fine
        ("::ffff:192.168.0.1", False),
        ("2002:c0a8:1::1", False),
        ("2001:0:4136:e378::1", False),  # Teredo
        ("fd00:ec2::254", False),
        ("fec0::1", False),
    ],
)
def test_address_policy(address: str, allowed: bool) -> None:
    assert (refusal_reason(ipaddress.ip_address(address)) is None) is allowed


def test_loopback_allowlist_is_explicit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ONCEFLOW_HTTP_ALLOW_LOOPBACK", raising=False)
    assert NetPolicy.from_env().allow_loopback is False
    monkeypatch.setenv("ONCEFLOW_HTTP_ALLOW_LOOPBACK", "1")
    policy = NetPolicy.from_env()
    assert policy.allow_loopback is True
    # Even then, only loopback: private and metadata stay refused.
    assert refusal_reason(ipaddress.ip_address("10.0.0.1"), allow_loopback=True)
    assert refusal_reason(ipaddress.ip_address("169.254.169.254"), allow_loopback=True)
    assert refusal_reason(ipaddress.ip_address("::ffff:127.0.0.1"), allow_loopback=True) is None


def test_an_invalid_url_fails_permanently_at_once(
    db: Database, listener: Listener, guarded: None
) -> None:
    """`http://127.0.0.1:P:80/` has no port anyone can connect to: it was read as a transient
    connection error (urllib's ValueError on the port) and retried; now it is INVALID_URL."""
    seed_tenant(db)
    step = StepRunner(db, "http.request")
    with pytest.raises(BlockFailure) as err:
        step.run(http_block.REQUEST, {"url": f"http://127.0.0.1:{listener.port}:80/"})
    assert (err.value.error_class, err.value.outcome_code) == ("permanent", "INVALID_URL")
    assert listener.accepted == 0
    with db.transaction() as tx:
        assert tx.scalar("SELECT count(*) FROM credit_ledger") == 0


def test_the_checked_answer_is_the_one_connected_to_and_charged(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A name whose second DNS answer differs from the first (rebinding with a zero TTL): the
    block used to check the first answer, charge, then resolve again at connect time and be
    refused — a charge for a request that never left. Now the name is resolved once and the
    connection goes to the address that was checked."""
    from devstack.fakecrm import FakeCrm

    crm = FakeCrm().start()
    calls: list[str] = []

    def rebinding(host: str, port: int) -> list[str]:
        calls.append(host)
        return ["127.0.0.1"] if len(calls) == 1 else ["10.0.0.1"]

    monkeypatch.setattr(
        http_block, "net_policy", lambda: NetPolicy(allow_loopback=True, resolver=rebinding)
    )
    seed_tenant(db, credits=5)
    port = crm.url.rsplit(":", 1)[1]
    try:
        result = StepRunner(db, "http.request").run(
            http_block.REQUEST, {"url": f"http://hooks.rebind.test:{port}/_sink/in"}
        )
        assert result.output is not None and result.output["status"] == 200
        assert len(crm.sink_requests()) == 1
    finally:
        crm.stop()
    assert calls == ["hooks.rebind.test"]
    with db.transaction() as tx:
        assert tx.scalar("SELECT count(*) FROM credit_ledger") == 1
