"""Pinning the connection to the checked address keeps TLS on the hostname: the server sees
the name in SNI, and certificate verification is against the name, not the IP."""

from __future__ import annotations

import datetime
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from shared.core.netguard import NetPolicy, guarded_client

NAME = "pinned.example.test"


def _cert(tmp: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, NAME)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(NAME)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp / "cert.pem", tmp / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


class _Ok(BaseHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        return

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[int, list[str | None], Path]]:
    cert, key = _cert(tmp_path)
    seen: list[str | None] = []
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    ctx.sni_callback = lambda sock, name, c: seen.append(name)  # type: ignore[assignment,misc]
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    server.daemon_threads = True
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1], seen, cert
    finally:
        server.shutdown()
        server.server_close()


def test_sni_and_certificate_stay_on_the_hostname(
    tls_server: tuple[int, list[str | None], Path],
) -> None:
    port, seen, cert = tls_server
    names = {NAME: ["127.0.0.1"], "other.example.test": ["127.0.0.1"]}
    policy = NetPolicy(allow_loopback=True, resolver=lambda h, p: names[h])
    trust = ssl.create_default_context(cafile=str(cert))
    with guarded_client(policy, timeout=5, ssl_context=trust) as client:
        response = client.get(f"https://{NAME}:{port}/")
        assert response.status_code == 200 and response.text == "ok"
        assert seen[-1] == NAME  # SNI carried the name although we connected to the IP
        backend = client._transport.backend  # type: ignore[attr-defined]
        assert backend.connected_to == ["127.0.0.1"]
        # Same IP, another name: the certificate is checked against the name and fails.
        with pytest.raises(httpx.ConnectError, match=r"CERTIFICATE_VERIFY_FAILED|match"):
            client.get(f"https://other.example.test:{port}/")


def test_a_guarded_client_loads_no_certificate_store_of_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every http.request step and breaker alert opens a guarded client. Loading the system's
    trust store costs ~14 ms of CPU per context and the client used to build two (httpx's
    transport and the guarded pool): with several requests per instance that was most of a
    step's CPU (`make bench-concurrency`). Contexts are built once per process and shared."""
    guarded_client(NetPolicy(), timeout=5).close()  # the process's first client may build it
    loads: list[object] = []
    real = ssl.SSLContext.load_verify_locations

    def counting(self: ssl.SSLContext, *args: Any, **kwargs: Any) -> None:
        loads.append(args or kwargs)
        real(self, *args, **kwargs)

    monkeypatch.setattr(ssl.SSLContext, "load_verify_locations", counting)
    real_default_certs = ssl.SSLContext.load_default_certs

    def counting_default(self: ssl.SSLContext, *args: Any) -> None:
        loads.append("default")
        real_default_certs(self, *args)

    monkeypatch.setattr(ssl.SSLContext, "load_default_certs", counting_default)
    for _ in range(5):
        guarded_client(NetPolicy(), timeout=5).close()
    assert loads == []
