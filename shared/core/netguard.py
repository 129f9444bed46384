"""Outbound network guard for user-configured URLs (the `http.request` block): SSRF defence.

A URL typed by a tenant must never reach the metadata server, the VPC, or loopback. Checking the
URL's host and then letting the HTTP client resolve it again is a TOCTOU hole (DNS rebinding),
and rewriting the URL to the IP breaks TLS SNI and certificate checks. So the check lives in an
httpcore *network backend*: `connect_tcp` resolves the name once, refuses unless every address
is allowed, and connects to the checked address itself. httpcore still starts TLS with the
request's hostname, so SNI and certificate verification stay on the name.

The address policy: after unwrapping IPv4-mapped IPv6, only globally routable unicast is
allowed; CGNAT, NAT64, 6to4, Teredo, IPv4-compatible IPv6, multicast, reserved, link-local and
the metadata addresses and names are refused explicitly (Python's `is_global` alone calls
100.64.0.1 non-private and NAT64 global). Loopback can be allowed for local development only by
explicit configuration (`ONCEFLOW_HTTP_ALLOW_LOOPBACK=1`), never by default.
"""

from __future__ import annotations

import functools
import ipaddress
import socket
import ssl
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import httpcore
import httpx

from shared.core.settings import settings

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
# (address, port) pairs, already numeric. Tests swap in a resolver that maps a name to a
# private address; the default asks the system once.
Resolver = Callable[[str, int], Sequence[str]]

ALLOW_LOOPBACK_ENV = "ONCEFLOW_HTTP_ALLOW_LOOPBACK"

METADATA_NAMES = frozenset(
    {
        "metadata",
        "metadata.google.internal",
        "metadata.goog",
        "metadata.azure.internal",
        "instance-data",
        "instance-data.ec2.internal",
    }
)
METADATA_ADDRESSES = frozenset(
    {
        ipaddress.ip_address("169.254.169.254"),
        ipaddress.ip_address("169.254.170.2"),
        ipaddress.ip_address("fd00:ec2::254"),
        ipaddress.ip_address("100.100.100.200"),
    }
)
_REFUSED_V4 = (
    (ipaddress.ip_network("100.64.0.0/10"), "carrier-grade NAT (100.64.0.0/10)"),
    (ipaddress.ip_network("0.0.0.0/8"), "'this network' (0.0.0.0/8)"),
    (ipaddress.ip_network("192.0.0.0/24"), "IETF protocol assignments (192.0.0.0/24)"),
    (ipaddress.ip_network("198.18.0.0/15"), "benchmarking (198.18.0.0/15)"),
)
_REFUSED_V6 = (
    (ipaddress.ip_network("64:ff9b::/96"), "NAT64 (64:ff9b::/96)"),
    (ipaddress.ip_network("64:ff9b:1::/48"), "local-use NAT64 (64:ff9b:1::/48)"),
    (ipaddress.ip_network("2002::/16"), "6to4 (2002::/16)"),
    (ipaddress.ip_network("2001::/32"), "Teredo (2001::/32)"),
    (ipaddress.ip_network("::/96"), "IPv4-compatible IPv6 (::/96)"),
    (ipaddress.ip_network("fc00::/7"), "unique local (fc00::/7, fd00::/8)"),
    (ipaddress.ip_network("fec0::/10"), "site-local (fec0::/10)"),
)


class InvalidDestination(ValueError):
    """The URL can't name a destination this guard would connect to, whatever DNS says."""


@dataclass(frozen=True)
class Destination:
    scheme: str
    host: str  # as the client connects to it: IDNA-encoded, an IPv6 literal without brackets
    port: int


def parse_destination(url: str) -> Destination:
    """The destination of `url` as httpx, the client that sends it, reads it; so what was checked
    is what is called (`urllib.parse` and httpx disagree on some hostile spellings)."""
    try:
        parsed = httpx.URL(url)
        port = parsed.port
    except (httpx.InvalidURL, ValueError) as exc:  # IDNA errors are ValueErrors too
        raise InvalidDestination(f"invalid URL: {exc}") from None
    if parsed.scheme not in ("http", "https"):
        raise InvalidDestination(
            f"only http and https URLs are allowed, not {parsed.scheme or 'none'!r}"
        )
    if not parsed.host:
        raise InvalidDestination("the URL has no host")
    if parsed.userinfo:
        raise InvalidDestination("credentials in the URL are not allowed; use headers")
    if port is None:
        port = 443 if parsed.scheme == "https" else 80
    if not 0 < port < 65536:
        raise InvalidDestination(f"invalid URL: port {port} is out of range")
    return Destination(parsed.scheme, parsed.host, port)


def static_refusal(url: str, *, allow_loopback: bool = False) -> str | None:
    """Why the policy refuses `url` whatever DNS answers (an invalid URL, an address literal in
    any spelling the C resolver accepts, a metadata or localhost name), or None when only the
    resolution at call time can tell. No DNS query is made."""
    try:
        destination = parse_destination(url)
    except InvalidDestination as exc:
        return str(exc)
    address = _parse_literal(destination.host) or _legacy_ipv4(destination.host)
    if address is None:
        reason = name_refusal(destination.host)
        if reason and allow_loopback and reason.startswith("loopback"):
            return None
        return reason
    return refusal_reason(address, allow_loopback=allow_loopback)


def _legacy_ipv4(host: str) -> ipaddress.IPv4Address | None:
    """`127.1`, `0x7f000001`, `2130706433`, `0177.0.0.1`: numeric forms getaddrinfo reads as
    IPv4 addresses without asking DNS."""
    if not host or not all(c in "0123456789abcdefxABCDEFX." for c in host):
        return None
    try:
        return ipaddress.IPv4Address(socket.inet_aton(host))
    except OSError:
        return None


class AddressRefused(Exception):
    """The destination is not allowed. Raised before any connection is attempted."""

    def __init__(self, host: str, reason: str) -> None:
        super().__init__(f"refused to connect to {host}: {reason}")
        self.host = host
        self.reason = reason


def refusal_reason(address: IPAddress, *, allow_loopback: bool = False) -> str | None:
    """Why `address` must not be contacted, or None when it may be."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        inner = refusal_reason(address.ipv4_mapped, allow_loopback=allow_loopback)
        return None if inner is None else f"IPv4-mapped {inner}"
    if address in METADATA_ADDRESSES:
        return f"metadata address {address}"
    if address.is_loopback:
        return None if allow_loopback else f"loopback address {address}"
    table = _REFUSED_V4 if isinstance(address, ipaddress.IPv4Address) else _REFUSED_V6
    for network, label in table:
        if address in network:
            return f"{label} address {address}"
    for flag, label in (
        (address.is_unspecified, "unspecified"),
        (address.is_multicast, "multicast"),
        (address.is_link_local, "link-local"),
        (address.is_reserved, "reserved"),
        (address.is_private, "private"),
        (not address.is_global, "non-global"),
    ):
        if flag:
            return f"{label} address {address}"
    return None


def name_refusal(host: str) -> str | None:
    """Names refused before any DNS query (the metadata server has well-known names)."""
    name = host.strip().rstrip(".").lower()
    if name in METADATA_NAMES or name.endswith(".internal"):
        return f"metadata or internal name {name!r}"
    if name == "localhost" or name.endswith(".localhost"):
        return "loopback name 'localhost'"
    return None


def system_resolver(host: str, port: int) -> list[str]:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise httpcore.ConnectError(f"cannot resolve {host}: {exc}") from exc
    return [str(info[4][0]) for info in infos]


@dataclass(frozen=True)
class NetPolicy:
    allow_loopback: bool = False
    resolver: Resolver = field(default=system_resolver)

    @classmethod
    def from_env(cls, resolver: Resolver | None = None) -> NetPolicy:
        return cls(
            allow_loopback=settings().http_allow_loopback, resolver=resolver or system_resolver
        )

    def pinned(self, host: str, addresses: Sequence[IPAddress]) -> NetPolicy:
        """This policy with `host` answering only `addresses` (already checked) and every other
        name refused: the connection goes where the check looked, with no second DNS answer to
        differ from the first (a rebinding name with a short TTL), and a step is never charged
        for a destination that is refused only when it connects."""
        answer = [str(a) for a in addresses]

        def resolve(name: str, port: int) -> Sequence[str]:
            if name != host:
                raise AddressRefused(name, f"not the checked destination {host!r}")
            return answer

        return NetPolicy(allow_loopback=self.allow_loopback, resolver=resolve)

    def checked_addresses(self, host: str, port: int) -> list[IPAddress]:
        """Resolve once; refuse unless *every* address is allowed (a mixed answer is how DNS
        rebinding gets a private address past a check that looks at the first one)."""
        bare = host.strip("[]")
        literal = _parse_literal(bare)
        if literal is None:
            reason = name_refusal(bare)
            if reason and not (self.allow_loopback and reason.startswith("loopback")):
                raise AddressRefused(host, reason)
            answers = [_parse_literal(a.split("%", 1)[0]) for a in self.resolver(bare, port)]
        else:
            answers = [literal]
        if not answers:
            raise AddressRefused(host, "the name resolved to no address")
        checked: list[IPAddress] = []
        for address in answers:
            if address is None:
                raise AddressRefused(host, "the resolver returned a non-numeric address")
            reason = refusal_reason(address, allow_loopback=self.allow_loopback)
            if reason:
                raise AddressRefused(host, reason)
            checked.append(address)
        return checked


def _parse_literal(text: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


class GuardedBackend(httpcore.NetworkBackend):
    """Resolve, check, connect to the checked address. TLS is started later by httpcore with
    the request's hostname, so SNI and certificate checks are unaffected by the pinning."""

    def __init__(self, policy: NetPolicy) -> None:
        self._policy = policy
        self._inner = httpcore.SyncBackend()
        self.connected_to: list[str] = []

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        addresses = self._policy.checked_addresses(host, port)
        last: Exception | None = None
        for address in addresses:
            try:
                stream = self._inner.connect_tcp(
                    str(address), port, timeout, local_address, socket_options
                )
            except httpcore.ConnectError as exc:
                last = exc
                continue
            self.connected_to.append(str(address))
            return stream
        raise httpcore.ConnectError(f"could not connect to {host}: {last}")

    def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        raise AddressRefused(path, "unix sockets are not allowed")

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


@functools.cache
def _default_ssl_context() -> ssl.SSLContext:
    """The system trust store, loaded once per process. Loading it costs ~14 ms of CPU, and a
    guarded client is opened per call (every http.request step): built per client, two of
    them (httpx's and the pool's) were most of a step's CPU, which caps what one instance
    serving several requests at once gets through (`make bench-concurrency`). An SSLContext
    is safe to share between threads once configured, and nothing here changes it after."""
    return ssl.create_default_context()


class GuardedTransport(httpx.HTTPTransport):
    """httpx's own transport, with its connection pool built on the guarded backend."""

    def __init__(self, policy: NetPolicy, *, ssl_context: ssl.SSLContext | None = None) -> None:
        context = ssl_context or _default_ssl_context()
        # `verify=context`: httpx's own pool (replaced below) would otherwise load the trust
        # store again.
        super().__init__(verify=context, trust_env=False)
        self.backend = GuardedBackend(policy)
        self._pool = httpcore.ConnectionPool(
            ssl_context=context,
            max_connections=4,
            max_keepalive_connections=0,
            network_backend=self.backend,
        )


def guarded_client(
    policy: NetPolicy, *, timeout: float, ssl_context: ssl.SSLContext | None = None
) -> httpx.Client:
    """An httpx client that never follows redirects, ignores proxy variables, and connects only
    to addresses the policy allows."""
    return httpx.Client(
        transport=GuardedTransport(policy, ssl_context=ssl_context),
        follow_redirects=False,
        trust_env=False,
        timeout=httpx.Timeout(timeout),
    )
